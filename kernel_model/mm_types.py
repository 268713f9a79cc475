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
from kernel_model.sched import SCHED, touch_key
from kernel_model.slab import counter_add

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


#: partial-order reduction records VMA changes and lookups page by page, or by 2 MiB
#: stretch for a VMA of more than VA_KEYS_MAX pages (mm_struct._stretches): an munmap
#: of one range and a lookup or munmap of another do not conflict
VA_BIG_SHIFT = 21
VA_KEYS_MAX = 512


class mm_struct:
    """Mirrors struct mm_struct: the VMAs, page tables and pin counters.

    For partial-order reduction the VMA list reports its own changes, page by page
    (touch_key, _stretches): link and unlink write the stretches the VMA covers and add to the
    list (adds commute - the VMAs of two disjoint munmaps end the same in either
    order); a lookup reads the stretches its answer depends on, and whoever reads
    `vmas` itself (a walk, the map count) reads the whole list, which conflicts with
    every link and unlink.  total_vm is an add."""

    POR_REPORTED = ("vmas", "_starts")

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
        #: get_unmapped_area's (mmap_base, end, hole): every gap between end and
        #: mmap_base is at most hole bytes; None: unknown (unlink forgets it).  An
        #: emulator cache: read and written past partial-order reduction's recorder
        object.__setattr__(self, "gap_cache", None)
        machine.mms.add(self)

    def __repr__(self) -> str:
        return (f"mm pid {self.owner_pid} users={self.mm_users} count={self.mm_count} "
                f"vmas={len(self.vmas)} rss={self.rss} pinned_vm={self.pinned_vm}")

    @property
    def pgd(self) -> int:
        return self.pgtable.pgd

    # -- the VMA tree ------------------------------------------------------
    def _find(self, addr: int) -> vm_area_struct | None:
        starts = object.__getattribute__(self, "_starts")
        vmas = object.__getattribute__(self, "vmas")
        i = bisect_right(starts, addr)
        if i and vmas[i - 1].vm_end > addr:
            return vmas[i - 1]
        return vmas[i] if i < len(vmas) else None

    def _stretches(self, start: int, end: int, how: bool | str) -> None:
        """Record (touch_key) what [start, end] of the address space is to partial-order
        reduction: a change writes its pages, or its 2 MiB stretches when it has more
        than VA_KEYS_MAX pages; a lookup reads both (so it meets either kind of change),
        or the whole VMA list when it spans more than VA_KEYS_MAX pages."""
        ps = self.machine.page_shift
        first, last = start >> ps, end >> ps
        me = id(self)
        if how is False:
            if last - first >= VA_KEYS_MAX:
                touch_key((me, "vmas"), False)
                return
            for b in range(start >> VA_BIG_SHIFT, (end >> VA_BIG_SHIFT) + 1):
                touch_key((me, "va2m", b), False)
        elif last - first >= VA_KEYS_MAX:
            for b in range(start >> VA_BIG_SHIFT, (end >> VA_BIG_SHIFT) + 1):
                touch_key((me, "va2m", b), how)
            return
        for pfn in range(first, last + 1):
            touch_key((me, "va", pfn), how)

    def find_vma(self, addr: int) -> vm_area_struct | None:
        """Mirrors find_vma(): the first VMA ending above addr."""
        v = self._find(addr)
        if SCHED.fp_step is not None:       # what the answer depends on
            if v is None:
                touch_key((id(self), "vmas"), False)
            else:
                self._stretches(addr, max(addr, v.vm_start), False)
        return v

    def vma_lookup(self, addr: int) -> vm_area_struct | None:
        """Mirrors vma_lookup(): the VMA containing addr, if any."""
        v = self._find(addr)
        if SCHED.fp_step is not None:       # the answer: whatever covers addr
            self._stretches(addr, addr, False)
        return v if v is not None and v.vm_start <= addr else None

    def link(self, vma: vm_area_struct) -> None:
        starts = object.__getattribute__(self, "_starts")
        i = bisect_right(starts, vma.vm_start)
        object.__getattribute__(self, "vmas").insert(i, vma)
        starts.insert(i, vma.vm_start)
        self._changed(vma, +1)

    def unlink(self, vma: vm_area_struct) -> None:
        cache = object.__getattribute__(self, "gap_cache")
        if cache is not None and vma.vm_end > cache[1]:
            object.__setattr__(self, "gap_cache", None)   # a gap above it may grow
        vmas = object.__getattribute__(self, "vmas")
        i = vmas.index(vma)
        del vmas[i]
        del object.__getattribute__(self, "_starts")[i]
        self._changed(vma, -1)

    def _changed(self, vma: vm_area_struct, sign: int) -> None:
        counter_add(self, "total_vm", sign * ((vma.vm_end - vma.vm_start)
                                              >> self.machine.page_shift))
        if SCHED.fp_step is not None:
            self._stretches(vma.vm_start, vma.vm_end - 1, True)
            touch_key((id(self), "vmas"), "add")

    def overlapping(self, start: int, end: int) -> list[vm_area_struct]:
        out = []
        vmas = object.__getattribute__(self, "vmas")
        v = self._find(start)
        i = vmas.index(v) if v is not None else len(vmas)
        while i < len(vmas) and vmas[i].vm_start < end:
            out.append(vmas[i])
            i += 1
        if SCHED.fp_step is not None:       # the answer: the VMAs meeting [start, end)
            self._stretches(start, max(start, end - 1), False)
        return out
