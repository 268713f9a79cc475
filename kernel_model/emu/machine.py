"""Machine: one emulated host - RAM, mem_map, page allocator, PCI bus, tasks.

Emulator-level (not kernel code): it builds what firmware and early boot
would (memblock, the mem_map, the physical address map) and owns the
per-machine state the kernel's globals hold.

    m = Machine(ram_size=64 << 20)          # 64 MiB, 4 KiB pages, C loops
    p = m.spawn("app")                      # a process with an empty mm
    ...
    m.shutdown(); m.check_leaks()           # every page, pin and mm accounted

RAM is a lazily committed anonymous mapping, so a 4 GiB machine costs nothing
until its pages are touched.  PAGE_SIZE is a machine parameter; nothing may
hard-code 4096 for it (MLX5_ADAPTER_PAGE_SIZE is a different, fixed thing).
"""

from __future__ import annotations

import itertools
import weakref
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable

import c_ext
from kernel_model.current import (
    live_machines,  # noqa: F401 - explore.py and tests read it here
    running,
)
from kernel_model.emu.leakcheck import MAX_LINES, call_trace, check_leaks
from kernel_model.emu.process import Process
from kernel_model.errno import EINVAL, KernelBug, KernelError
from kernel_model.fs import chrdev_table, node_groups, ramfs_table
from kernel_model.iommu import make_iommu
from kernel_model.ioport import PCI_MMIO_BASE, MachineCheck, MmioRegion
from kernel_model.lockdep import lockdep_graph
from kernel_model.module import delete_module, load_module, unload_all
from kernel_model.page_alloc import PG_reserved, zone
from kernel_model.sched import SCHED, touch, touch_ram
from kernel_model.task import init_task

GiB = 1 << 30
MiB = 1 << 20
VA_BITS = 48
PAGE_SIZES = (4096, 16384, 65536)


def pgtable_levels(page_shift: int) -> int:
    """Page-table levels for a 48-bit VA: 4 with 4 KiB pages, 3 with 64 KiB."""
    bits = page_shift - 3
    return -(-(VA_BITS - page_shift) // bits)


#: serial -> the live Machine with it (the newest, when tests/docs restarted the count)
_by_serial: weakref.WeakValueDictionary[int, Machine] = weakref.WeakValueDictionary()


class Machine:
    """One host.  See the module docstring."""

    next_serial = 0  # the serial the next Machine gets (the leak fixture reads it)

    @staticmethod
    def made_since(first: int) -> list[Machine]:
        """The live machines built since serial `first` (Machine.next_serial read
        before), oldest first - what a leak check after a run or a test looks at.
        A lookup per serial handed out since: however many machines earlier runs
        left alive (until the cycle collector takes them), this costs nothing for
        them."""
        return [m for m in map(_by_serial.get, range(first, Machine.next_serial))
                if m is not None]

    def __init__(self, ram_size: int = 4 * GiB, page_size: int = 4096,
                 backend: str | None = None, iommu: str = "identity", name: str | None = None,
                 panic_on_warn: bool = False):
        if page_size not in PAGE_SIZES:
            raise ValueError(f"Machine: page_size must be one of {PAGE_SIZES}")
        if ram_size < 16 * page_size or ram_size % page_size:
            raise ValueError("Machine: ram_size must be a multiple of page_size, >= 16 pages")
        if iommu not in ("identity", "translating"):
            raise ValueError("Machine: iommu must be 'identity' or 'translating'")
        self.serial = Machine.next_serial
        Machine.next_serial += 1
        self.name = name or f"host{self.serial}"
        self.page_size = page_size
        self.page_shift = page_size.bit_length() - 1
        self.ram_size = ram_size
        self.nr_pages = ram_size >> self.page_shift
        self.levels = pgtable_levels(self.page_shift)
        self.panic_on_warn = panic_on_warn
        self._ram = c_ext.anon_map(ram_size)
        self._mem_map = c_ext.anon_map(self.nr_pages * 16)
        self.mem = c_ext.MemCtx(self._ram, self._mem_map, self.nr_pages, self.page_shift,
                                self.levels)
        if SCHED.fp_keep is not None:   # named when made, as a struct is (Footprint)
            SCHED.fp_keep(self.mem, True)
        self.ops = c_ext.backend(backend)
        self.zone = zone(self)
        # pfn 0 stays reserved, as on x86: a zero physical address never names a page
        self.mem.pages[0] = PG_reserved
        self.mem.pages[1] = 1
        self.zone.free_boot_range(1, self.nr_pages)
        self.vmstat: Counter[str] = Counter()
        self.bugs: list[str] = []
        self.bug_traces: dict[str, str] = {}   # a WARN's text -> its first call trace
        self.dmesg: list[str] = []  # the kernel log: pr_err/pr_info lines, oldest first
        self.iomem: list[MmioRegion] = []  # sorted by start: the physical address map
        self._iomem_starts: list[int] = []
        self._mmio_next = max(PCI_MMIO_BASE, -(-ram_size // (256 * GiB)) * 256 * GiB)
        self.leak_checks: list[Callable[[Machine], list[str]]] = []
        self.shutdown_hooks: list[Callable[[Machine], None]] = []  # run newest first
        self.chrdevs = chrdev_table()
        self.node_groups = node_groups()
        self.ramfs = ramfs_table()
        self.iommu = make_iommu(self, iommu)
        self.tasks: dict[int, object] = {}
        self.kthreads: dict[int, object] = {}  # pid -> sched Task, while it runs
        self._pids = itertools.count(1)
        self.mms: weakref.WeakSet = weakref.WeakSet()
        self.init_task = init_task(self)
        self.modules: dict = {}  # name -> kernel_model.module.module, load order
        self.sched = SCHED
        SCHED.new_epoch()
        self.lockdep = lockdep_graph(self)
        live_machines.add(self)
        _by_serial[self.serial] = self

    @property
    def ops(self) -> c_ext._Backend:
        """The C loops or their Python twins (c_ext.backend)."""
        return self._ops

    @ops.setter
    def ops(self, ops: c_ext._Backend) -> None:
        self._ops = ops
        # the TLB hit of a process's loads and stores (memory.page_at), on this RAM
        self.page_at_fn = ops.page_at_fn(self.mem)

    def __repr__(self) -> str:
        return (f"Machine {self.name} {self.ram_size >> 20} MiB page {self.page_size} "
                f"backend {self.ops.name} free {self.zone.nr_free}/{self.nr_pages}")

    # -- processes -------------------------------------------------------
    def spawn(self, comm: str = "proc", *, rlimit_memlock: int | None = None,
              cap_ipc_lock: bool = False, uid: int = 1000,
              environ: dict[str, str] | None = None):
        """Start a user process with an empty address space (fork+exec, in short)."""
        return Process(self, comm, rlimit_memlock=rlimit_memlock, cap_ipc_lock=cap_ipc_lock,
                       uid=uid, environ=environ)

    def alloc_pid(self) -> int:
        return next(self._pids)

    def kernel(self):
        """Run the body as kernel code in init_task's context (module init, tests)."""
        return running(self.init_task)

    # -- physical address map --------------------------------------------
    def alloc_mmio_window(self, size: int) -> int:
        """Place a BAR: the next naturally aligned window above RAM (pci_assign_resource)."""
        if size <= 0 or size & (size - 1):
            raise KernelError(EINVAL, f"pci_assign_resource: BAR size {size:#x} not a power of 2")
        start = -(-self._mmio_next // size) * size
        self._mmio_next = start + size
        return start

    def register_mmio(self, region: MmioRegion) -> MmioRegion:
        """request_mem_region + ioremap target: make `region` decode its addresses."""
        i = bisect_right(self._iomem_starts, region.start)
        if (i and self.iomem[i - 1].end > region.start) or (
                i < len(self.iomem) and self.iomem[i].start < region.end) or (
                region.start < self.ram_size):
            raise KernelError(EINVAL, f"request_mem_region: {region} overlaps")
        self.iomem.insert(i, region)
        self._iomem_starts.insert(i, region.start)
        return region

    def unregister_mmio(self, region: MmioRegion) -> None:
        i = self.iomem.index(region)
        del self.iomem[i]
        del self._iomem_starts[i]

    def find_mmio(self, addr: int) -> MmioRegion | None:
        i = bisect_right(self._iomem_starts, addr)
        if i and addr < self.iomem[i - 1].end:
            return self.iomem[i - 1]
        return None

    def phys_read(self, addr: int, n: int) -> bytes:
        """A load of n bytes at a physical address: RAM or a device's MMIO."""
        if 0 <= addr and addr + n <= self.ram_size:
            touch_ram(self.mem, addr, n, False)
            return bytes(self.mem.ram[addr:addr + n])
        r = self.find_mmio(addr)
        if r is None or addr + n > r.end:
            raise MachineCheck(f"{self.name}: read of {n} bytes at unmapped physical {addr:#x}")
        self.sched.point("mmio_read")
        touch(r)
        return r.read(addr - r.start, n)

    def phys_write(self, addr: int, data: bytes, *, point: bool = True) -> None:
        """A store to a physical address: RAM or a device's MMIO.  With point False, an
        MMIO store that is no scheduling point and whose effects the device reports
        itself (partial-order reduction's touches), not as a write of the region -
        see mlx5_cmd_invoke."""
        n = len(data)
        if 0 <= addr and addr + n <= self.ram_size:
            touch_ram(self.mem, addr, n, True)
            self.mem.ram[addr:addr + n] = data
            return
        r = self.find_mmio(addr)
        if r is None or addr + n > r.end:
            raise MachineCheck(f"{self.name}: write of {n} bytes at unmapped physical {addr:#x}")
        if point:
            self.sched.point("mmio_write")
            touch(r)
        r.write(addr - r.start, bytes(data))

    # -- debug -----------------------------------------------------------
    def report_bug(self, function: str, message: str) -> None:
        """WARN(): record a kernel bug, with the call trace the kernel prints after it
        (bug_traces, shown by the leak check); raise KernelBug when panic_on_warn is set."""
        text = f"WARNING: {function}: {message}"
        self.bugs.append(text)
        self.bug_traces.setdefault(text, call_trace())
        if self.panic_on_warn:
            raise KernelBug(text)

    def shutdown(self) -> None:
        """Tear the machine down in the kernel's order.

        A run that deadlocked is unwound first (Scheduler.abandon).  Then
        every process exits (as do_exit does), modules unload newest first,
        the shutdown hooks run (system workqueues are destroyed), and every
        task still alive on this machine is joined.
        """
        if self.sched.dead is not None:
            self.sched.abandon()
        for task in list(self.tasks.values()):
            task.do_exit(0)
        unload_all(self)
        while self.shutdown_hooks:
            self.shutdown_hooks.pop()(self)
        self.sched.run_all(self)

    def load_module(self, name: str, **params):
        """insmod: run the named module's module_init (see kernel_model.module)."""
        return load_module(self, name, **params)

    def unload_module(self, name: str, force: bool = False) -> None:
        """rmmod: EBUSY while in use; `force=True` is `rmmod -f` (see delete_module)."""
        delete_module(self, name, force)

    def check_leaks(self, shutdown: bool = True,
                    max_lines: int | None = MAX_LINES) -> None:
        """Shut down, then raise LeakError naming every page, pin, mm or object still held
        (the first `max_lines` of them; None: all)."""
        check_leaks(self, shutdown, max_lines)
