"""Tests for kernel_model/emu/process.py, syscalls.py and task.py's do_exit().

A small test char device stands in for a driver: read/write move bytes
through a kernel buffer with copy_{to,from}_user, ioctl doubles its argument,
mmap either leaves an ordinary file mapping or maps an MMIO register page.
"""

from __future__ import annotations

import pytest

from kernel_model.current import current, running
from kernel_model.emu.machine import Machine
from kernel_model.emu.process import SegmentationFault
from kernel_model.errno import EBADF, EFAULT, EINVAL, ENOENT, ENOTTY, KernelBug, KernelError
from kernel_model.fs import cdev, cdev_add, file_operations
from kernel_model.ioport import MachineCheck, MmioRegion
from kernel_model.madvise import MADV_DONTNEED
from kernel_model.memory import remap_pfn_range
from kernel_model.mm import MAP_SHARED, PROT_READ, PROT_WRITE, TASK_SIZE, vm_operations_struct
from kernel_model.pgtable import cache_mode, pgprot_noncached, pte_addr
from kernel_model.task import PF_EXITING
from kernel_model.trace import Tracer
from kernel_model.uaccess import copy_from_user, copy_to_user

RW = PROT_READ | PROT_WRITE
IOCTL_DOUBLE = 0x4008_0001


class TestDev:
    """A char device; every callback appends to `log`."""

    __test__ = False  # not a pytest class

    def __init__(self, m: Machine, path: str, log: list, *, ioctl: bool = True,
                 rw: bool = True, mmio: int | None = None):
        self.m, self.path, self.log, self.mmio = m, path, log, mmio
        self.buf = bytearray()
        self.fops = file_operations(open=self.open, release=self.release, mmap=self.mmap,
                                    read=self.read if rw else None,
                                    write=self.write if rw else None,
                                    unlocked_ioctl=self.ioctl if ioctl else None)
        with running(m.init_task):
            cdev_add(cdev(self.fops), path)

    def open(self, inode, f):
        self.log.append(("open", self.path))

    def release(self, inode, f):
        self.log.append(("release", self.path, current().mm is None))

    def write(self, f, buf: int, count: int) -> int:
        data = bytearray(count)
        if copy_from_user(data, buf, count):
            raise KernelError(EFAULT, "testdev_write: bad user buffer")
        self.buf += data
        return count

    def read(self, f, buf: int, count: int) -> int:
        n = min(count, len(self.buf))
        if copy_to_user(buf, self.buf[:n], n):
            raise KernelError(EFAULT, "testdev_read: bad user buffer")
        del self.buf[:n]
        return n

    def ioctl(self, f, cmd: int, arg: int) -> int:
        if cmd != IOCTL_DOUBLE:
            raise KernelError(ENOTTY, f"testdev_ioctl: unknown cmd {cmd:#x}")
        return 2 * arg

    def mmap(self, f, vma):
        path = self.path
        vma.vm_ops = vm_operations_struct(close=lambda vma: self.log.append(("vma_close", path)))
        if self.mmio is not None:
            remap_pfn_range(vma, vma.vm_start, self.mmio >> self.m.page_shift,
                            vma.vm_end - vma.vm_start, pgprot_noncached(vma.vm_page_prot))


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def log() -> list:
    return []


@pytest.fixture
def p(m):
    return m.spawn("proctest")


# -- open / close --------------------------------------------------------------
def test_open_gives_the_lowest_free_fd(m, log, p):
    TestDev(m, "/dev/t", log)
    assert [p.open("/dev/t") for _ in range(3)] == [0, 1, 2]
    assert p.close(1) == 0
    assert p.open("/dev/t") == 1
    assert p.open("/dev/t") == 3
    assert p.task.files.open_fds() == [0, 1, 2, 3]


def test_close_bad_fd_is_ebadf(m, log, p):
    TestDev(m, "/dev/t", log)
    fd = p.open("/dev/t")
    assert p.close(fd) == 0
    assert p.close(fd) == -EBADF
    assert p.close(-1) == -EBADF
    assert p.close(99) == -EBADF
    assert log == [("open", "/dev/t"), ("release", "/dev/t", False)]


def test_unknown_path_is_enoent(p):
    assert p.open("/dev/none") == -ENOENT
    assert p.task.last_error.errno == ENOENT
    assert p.task.files.open_fds() == []


# -- read / write / ioctl ---------------------------------------------------------
def test_write_then_read_through_the_driver(m, log, p):
    dev = TestDev(m, "/dev/t", log)
    fd = p.open("/dev/t")
    a = p.mmap(0, 2 * m.page_size)
    msg = b"across a page boundary"
    p.store(a + m.page_size - 5, msg)
    assert p.write(fd, a + m.page_size - 5, len(msg)) == len(msg)
    assert dev.buf == msg
    assert p.read(fd, a, 100) == len(msg)
    assert p.load(a, len(msg)) == msg
    assert p.task.files.fdt[fd].f_count == 1  # the syscalls' fget was put back


def test_read_write_fault_and_missing_ops(m, log, p):
    TestDev(m, "/dev/t", log)
    TestDev(m, "/dev/noio", log, rw=False)
    fd = p.open("/dev/t")
    assert p.write(fd, TASK_SIZE, 8) == -EFAULT
    assert p.write(fd, 0x10000, 8) == -EFAULT  # nothing mapped there
    assert p.task.last_error.function == "testdev_write"
    nfd = p.open("/dev/noio")
    assert p.read(nfd, 0, 1) == -EINVAL
    assert p.write(nfd, 0, 1) == -EINVAL
    assert p.read(7, 0, 1) == -EBADF
    assert p.write(7, 0, 1) == -EBADF


def test_ioctl(m, log, p):
    TestDev(m, "/dev/t", log)
    TestDev(m, "/dev/noioctl", log, ioctl=False)
    fd = p.open("/dev/t")
    assert p.ioctl(fd, IOCTL_DOUBLE, 21) == 42
    assert p.ioctl(fd, 0x1234) == -ENOTTY  # the driver's own ENOTTY
    nfd = p.open("/dev/noioctl")
    assert p.ioctl(nfd, IOCTL_DOUBLE, 1) == -ENOTTY
    assert p.task.last_error.function == "vfs_ioctl"
    assert p.ioctl(nfd + 1, IOCTL_DOUBLE, 1) == -EBADF
    assert p.task.files.fdt[fd].f_count == 1


# -- mmap lifetime ----------------------------------------------------------------
def test_mmapped_file_outlives_close_until_munmap(m, log, p):
    TestDev(m, "/dev/t", log)
    fd = p.open("/dev/t")
    a = p.mmap(0, m.page_size, RW, MAP_SHARED, fd)
    assert p.close(fd) == 0
    assert log == [("open", "/dev/t")]
    p.store(a, b"still mapped")  # an ordinary file mapping: faults in a page
    assert p.munmap(a, m.page_size) == 0
    assert log == [("open", "/dev/t"), ("vma_close", "/dev/t"), ("release", "/dev/t", False)]


# -- exit --------------------------------------------------------------------------
@pytest.mark.parametrize("order", [("/dev/a", "/dev/b"), ("/dev/b", "/dev/a")])
def test_exit_runs_exit_mm_then_closes_fds_in_fd_order(m, log, p, order):
    for path in ("/dev/filler", "/dev/a", "/dev/b"):
        TestDev(m, path, log)
    for _ in range(3):
        p.open("/dev/filler")
    fds = {path: p.open(path) for path in order}
    assert sorted(fds.values()) == [3, 4]
    a = p.mmap(0, m.page_size, RW, MAP_SHARED, fds["/dev/a"])
    p.store(a, b"x")
    assert p.close(1) == 0  # a gap in the table
    del log[:]
    task = p.task
    p.exit(3)
    assert log == [
        ("vma_close", "/dev/a"),   # exit_mm first, while /dev/a's fd is still open
        ("release", "/dev/filler", True),
        ("release", "/dev/filler", True),
        ("release", order[0], True),  # fd 3
        ("release", order[1], True),  # fd 4
    ]
    assert task.exit_code == 3 and task.flags & PF_EXITING
    assert p.pid not in m.tasks and not p.alive
    assert p.mm is None and task.files is None


def test_exit_frees_everything(m, log, p):
    TestDev(m, "/dev/t", log)
    free = m.zone.nr_free
    p.open("/dev/t")
    a = p.mmap(0, 16 * m.page_size)
    p.store(a, bytes(16 * m.page_size))
    p.exit()
    assert m.zone.nr_free == free + 1  # and the pgd spawn() allocated
    assert all(mm.owner_pid != p.pid for mm in m.mms)  # the mm struct is gone too


def test_exit_goes_on_past_a_failing_release_and_vma_close(m, log, p):
    """do_exit never raises and never stops half-way: a ->close and a ->release that
    fail (driver bugs: both are void in the kernel) are WARNs, and every other
    mapping and fd is still torn down."""
    def fail(what):
        def cb(*args):
            log.append(("fail", what))
            raise KernelError(EBADF, f"{what}: a driver bug")
        return cb

    for path in ("/dev/a", "/dev/b"):
        TestDev(m, path, log)
    fa, fb = p.open("/dev/a"), p.open("/dev/b")
    p.task.files.fdt[fa].f_op = file_operations(release=fail("release_a"))
    va = p.mmap(0, m.page_size, RW, MAP_SHARED, fb)
    p.mm.vma_lookup(va).vm_ops = vm_operations_struct(close=fail("close_b"))
    anon = p.mmap(0, 4 * m.page_size)
    p.store(anon, b"x" * 4 * m.page_size)
    del log[:]
    p.exit(0)
    assert log == [("fail", "close_b"), ("fail", "release_a"), ("release", "/dev/b", True)]
    assert not p.alive and all(mm.owner_pid != p.pid for mm in m.mms)
    assert [b.split(":")[1].strip() for b in m.bugs] == ["remove_vma", "__fput"]
    m.bugs.clear()


def test_exit_finishes_before_a_debug_check_s_oops_is_raised(m, log, p):
    """A KernelBug (here a UAF report from a ->release) is the model's oops: the
    remaining fds are still closed, then it is raised."""
    def oops(inode, f):
        raise KernelBug("BUG: KASAN: slab-use-after-free in oops_release")

    for path in ("/dev/a", "/dev/b"):
        TestDev(m, path, log)
    fa, _ = p.open("/dev/a"), p.open("/dev/b")
    p.task.files.fdt[fa].f_op = file_operations(release=oops)
    del log[:]
    with pytest.raises(KernelBug, match="use-after-free"):
        p.exit(0)
    assert log == [("release", "/dev/b", True)] and not p.alive


def test_syscalls_after_exit_raise(p):
    p.exit()
    with pytest.raises(RuntimeError, match="has exited"):
        p.open("/dev/t")
    with pytest.raises(RuntimeError, match="has exited"):
        p.load(0x10000, 1)


def test_shutdown_exits_every_process(m, log):
    TestDev(m, "/dev/t", log)
    procs = [m.spawn(f"p{i}") for i in range(3)]
    for q in procs:
        q.open("/dev/t")
    m.shutdown()
    assert not m.tasks and not any(q.alive for q in procs)
    assert [e[0] for e in log].count("release") == 3


# -- the CPU: loads, stores, MMIO, SIGSEGV --------------------------------------------
def test_load_store_round_trip(p, m):
    a = p.mmap(0, 2 * m.page_size)
    p.store(a + m.page_size - 2, b"abcd")
    assert p.load(a + m.page_size - 2, 4) == b"abcd"
    assert p.load(a, 2) == b"\x00\x00"


def test_load_store_reach_a_registered_mmio_region(m, log, p):
    ps = m.page_size
    regs = bytearray(ps)
    accesses, writers = [], []

    def read(off: int, n: int) -> bytes:
        accesses.append(("r", off, n))
        return bytes(regs[off:off + n])

    def write(off: int, data: bytes) -> None:
        accesses.append(("w", off, data))
        regs[off:off + len(data)] = data
        writers.append(current())          # the device's code runs as the storing process

    base = m.alloc_mmio_window(ps)
    assert base >= m.ram_size and base % ps == 0
    region = m.register_mmio(MmioRegion("testdev regs", base, ps, read, write))
    assert m.find_mmio(base + 5) is region and m.find_mmio(base + ps) is None
    TestDev(m, "/dev/regs", log, mmio=base)
    fd = p.open("/dev/regs")
    a = p.mmap(0, ps, RW, MAP_SHARED, fd)
    assert cache_mode(p.mm.pgtable.get(a)) == "UC-"
    p.store(a + 8, b"\x01\x02\x03\x04")
    assert accesses == [("w", 8, b"\x01\x02\x03\x04")]
    p.store(a + 12, b"\x05")                 # the PTE present now: no fault, same device
    assert accesses[-1] == ("w", 12, b"\x05") and writers == [p.task, p.task]
    del accesses[1:]
    assert p.load(a + 8, 4) == b"\x01\x02\x03\x04"
    assert accesses[1] == ("r", 8, 4)
    assert p.mm.rss == 0
    with p.kernel():  # copy_to_user into an MMIO mapping reaches the device too
        assert copy_to_user(a + 16, b"zz", 2) == 0
    assert regs[16:18] == b"zz"
    m.unregister_mmio(region)
    with pytest.raises(MachineCheck, match="unmapped physical"):
        p.load(a, 4)  # the BAR is gone: nothing decodes the address
    assert p.close(fd) == 0


def test_register_mmio_refuses_overlaps(m):
    base = m.alloc_mmio_window(0x2000)
    nop_r, nop_w = (lambda off, n: bytes(n)), (lambda off, data: None)
    m.register_mmio(MmioRegion("one", base, 0x2000, nop_r, nop_w))
    for start, size in ((base + 0x1000, 0x1000), (base - 0x1000, 0x2000), (0, 0x1000)):
        with pytest.raises(KernelError):
            m.register_mmio(MmioRegion("two", start, size, nop_r, nop_w))
    with pytest.raises(KernelError):
        m.alloc_mmio_window(0x3000)


def test_segfault_on_unmapped_address(p, m):
    a = p.mmap(0, m.page_size)
    with pytest.raises(SegmentationFault, match=f"read at {a + m.page_size:#x}"):
        p.load(a + m.page_size - 2, 4)  # runs off the end of the mapping
    with pytest.raises(SegmentationFault):
        p.store(0x10000, b"x")
    with pytest.raises(SegmentationFault, match="beyond TASK_SIZE"):
        p.load(TASK_SIZE - 2, 4)
    with pytest.raises(SegmentationFault, match="beyond TASK_SIZE"):
        p.load(-4096, 1)


def test_segfault_on_write_to_read_only(p, m):
    a = p.mmap(0, m.page_size, PROT_READ)
    assert p.load(a, 4) == bytes(4)
    with pytest.raises(SegmentationFault, match=f"write at {a:#x}"):
        p.store(a, b"nope")
    assert p.load(a, 4) == bytes(4)


def test_segfault_on_prot_none(p, m):
    a = p.mmap(0, m.page_size, 0)
    with pytest.raises(SegmentationFault):
        p.load(a, 1)
    assert p.mm.rss == 0


def test_a_mapped_page_is_read_through_its_current_pte(p, m):
    """A load or store of a page whose PTE allows it goes straight to RAM (no fault,
    no walk of the VMAs) - but always through the PTE as it is now: zapped by
    MADV_DONTNEED the page reads as a fresh zero page; unmapped, the access faults."""
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    with Tracer() as t:
        p.store(a + 8, b"first")            # not present: the fault path
        p.store(a + 13, b"-second")         # present and writable: straight to RAM
        got = p.load(a + 8, 12)
    assert got == b"first-second"
    assert [pt.fields["address"] for pt in t.trace.points("page_fault_user")] == [a + 8]
    pte = p.mm.pgtable.get(a)
    assert bytes(m.mem.ram[pte_addr(pte) + 8:pte_addr(pte) + 20]) == b"first-second"
    assert p.madvise(a, ps, MADV_DONTNEED) == 0
    assert p.load(a + 8, 12) == bytes(12)
    assert p.munmap(a, ps) == 0
    with pytest.raises(SegmentationFault, match=f"read at {a + 8:#x}"):
        p.load(a + 8, 4)
    with pytest.raises(SegmentationFault, match=f"write at {a:#x}"):
        p.store(a, b"x")
