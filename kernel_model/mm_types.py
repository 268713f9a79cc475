"""Mirrors include/linux/mm_types.h (and the vm_flags of include/linux/mm.h): the
structs of an address space - mm_struct, vm_area_struct, vm_operations_struct - and
the flags and limits they carry, with no mm function behind them.

This is the header of the memory-management floor: kernel_model.pgtable,
kernel_model.memory (faults, zapping) and kernel_model.mm (mmap/munmap, lifetime)
all include it, so none of them has to import another to name a VMA.
kernel_model.mm re-exports every name here, so callers keep `from kernel_model.mm
import ...`.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import TYPE_CHECKING, Any

import attrs

from kernel_model.pgtable import PageTable

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.fs import file

# vm_flags (include/linux/mm.h)
VM_READ = 0x00000001
VM_WRITE = 0x00000002
VM_EXEC = 0x00000004
VM_SHARED = 0x00000008
VM_MAYREAD = 0x00000010
VM_MAYWRITE = 0x00000020
VM_MAYEXEC = 0x00000040
VM_MAYSHARE = 0x00000080
VM_PFNMAP = 0x00000400
VM_LOCKED = 0x00002000
VM_IO = 0x00004000
VM_DONTCOPY = 0x00020000
VM_DONTEXPAND = 0x00040000
VM_ACCOUNT = 0x00100000
VM_NORESERVE = 0x00200000
VM_MIXEDMAP = 0x10000000
VM_DONTDUMP = 0x04000000

# mmap(2)
PROT_NONE, PROT_READ, PROT_WRITE, PROT_EXEC = 0, 1, 2, 4
MAP_SHARED = 0x01
MAP_PRIVATE = 0x02
MAP_FIXED = 0x10
MAP_ANONYMOUS = 0x20
MAP_POPULATE = 0x8000

TASK_SIZE = (1 << 47) - 4096  # x86-64 TASK_SIZE_MAX with 4-level paging
MMAP_BASE = 0x7F80_0000_0000  # EMU: fixed, no ASLR, so traces repeat
DEFAULT_MAX_MAP_COUNT = 65530


@attrs.define(eq=False)
class vm_operations_struct:
    """Mirrors struct vm_operations_struct (the callbacks a driver's VMA may have)."""

    open: Any = None
    close: Any = None
    fault: Any = None
    may_split: Any = None
    name: Any = None


@attrs.define(eq=False, repr=False)
class vm_area_struct:
    """Mirrors struct vm_area_struct."""

    vm_mm: mm_struct
    vm_start: int
    vm_end: int
    vm_flags: int
    vm_page_prot: int = 0
    vm_pgoff: int = 0
    vm_file: file | None = None
    vm_ops: vm_operations_struct | None = None
    vm_private_data: Any = None
    vm_userfaultfd_ctx: Any = None       # the userfaultfd this range is registered with

    def __repr__(self) -> str:
        f = self.vm_flags
        perms = "".join(c if f & b else "-" for c, b in (("r", VM_READ), ("w", VM_WRITE),
                                                          ("x", VM_EXEC)))
        perms += "s" if f & VM_SHARED else "p"
        name = self.vm_file.f_path if self.vm_file else "[anon]"
        return f"{self.vm_start:012x}-{self.vm_end:012x} {perms} {self.vm_pgoff:08x} {name}"


class mm_struct:
    """Mirrors struct mm_struct: the VMAs, page tables and pin counters."""

    @property
    def trace_name(self) -> str:
        return f"mm(pid {self.owner_pid})"

    def __init__(self, machine: Machine, owner_pid: int):
        self.machine = machine
        self.owner_pid = owner_pid
        self.mm_users = 1
        self.mm_count = 1
        self.pgtables_bytes = 0
        self.pgtable = PageTable(self)
        self.vmas: list[vm_area_struct] = []
        self._starts: list[int] = []
        self.pinned_vm = 0  # atomic64_t: pages pinned long-term (ib_umem_get)
        self.locked_vm = 0
        self.total_vm = 0
        self.rss = 0
        self.mmap_base = MMAP_BASE
        self.task_size = TASK_SIZE
        machine.mms.add(self)

    def __repr__(self) -> str:
        return (f"mm pid {self.owner_pid} users={self.mm_users} count={self.mm_count} "
                f"vmas={len(self.vmas)} rss={self.rss} pinned_vm={self.pinned_vm}")

    @property
    def pgd(self) -> int:
        return self.pgtable.pgd

    # -- the VMA tree ------------------------------------------------------
    def find_vma(self, addr: int) -> vm_area_struct | None:
        """Mirrors find_vma(): the first VMA ending above addr."""
        i = bisect_right(self._starts, addr)
        if i and self.vmas[i - 1].vm_end > addr:
            return self.vmas[i - 1]
        return self.vmas[i] if i < len(self.vmas) else None

    def vma_lookup(self, addr: int) -> vm_area_struct | None:
        """Mirrors vma_lookup(): the VMA containing addr, if any."""
        v = self.find_vma(addr)
        return v if v is not None and v.vm_start <= addr else None

    def link(self, vma: vm_area_struct) -> None:
        i = bisect_right(self._starts, vma.vm_start)
        self.vmas.insert(i, vma)
        self._starts.insert(i, vma.vm_start)
        self.total_vm += (vma.vm_end - vma.vm_start) >> self.machine.page_shift

    def unlink(self, vma: vm_area_struct) -> None:
        i = self.vmas.index(vma)
        del self.vmas[i]
        del self._starts[i]
        self.total_vm -= (vma.vm_end - vma.vm_start) >> self.machine.page_shift

    def overlapping(self, start: int, end: int) -> list[vm_area_struct]:
        out = []
        v = self.find_vma(start)
        i = self.vmas.index(v) if v is not None else len(self.vmas)
        while i < len(self.vmas) and self.vmas[i].vm_start < end:
            out.append(self.vmas[i])
            i += 1
        return out
