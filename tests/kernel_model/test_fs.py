"""Tests for kernel_model/fs.py: char devices, struct file references, the fd table."""

from __future__ import annotations

import pytest

from kernel_model.current import current, running
from kernel_model.emu.machine import Machine
from kernel_model.errno import EBADF, EEXIST, EMFILE, ENODEV, ENOENT, KernelError
from kernel_model.fs import (
    FMODE_READ,
    FMODE_WRITE,
    O_RDONLY,
    O_RDWR,
    O_WRONLY,
    cdev,
    cdev_add,
    cdev_del,
    do_filp_open,
    file_operations,
    files_struct,
    fput,
    get_file,
)
from kernel_model.mm import MAP_SHARED, PROT_READ, PROT_WRITE


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def log() -> list:
    return []


def add_dev(m: Machine, path: str, log: list, **ops) -> cdev:
    """Register a char device logging open and release; `ops` add or replace entries."""
    fops = file_operations(open=lambda inode, f: log.append(("open", f.f_path)),
                           release=lambda inode, f: log.append(("release", f.f_path)),
                           mmap=lambda f, vma: None)
    for name, fn in ops.items():
        setattr(fops, name, fn)
    cd = cdev(fops)
    with running(m.init_task):
        cdev_add(cd, path)
    return cd


def test_open_finds_the_cdev_and_calls_open(m, log):
    add_dev(m, "/dev/t", log)
    p = m.spawn()
    fd = p.open("/dev/t")
    f = p.task.files.fdt[fd]
    assert log == [("open", "/dev/t")]
    assert (f.f_path, f.f_count, f.f_mode) == ("/dev/t", 1, FMODE_READ | FMODE_WRITE)
    assert f.f_inode.i_cdev is m.chrdevs["/dev/t"]
    assert repr(f) == "file /dev/t count=1"
    assert p.close(fd) == 0
    assert log == [("open", "/dev/t"), ("release", "/dev/t")]
    assert f.f_count == 0


@pytest.mark.parametrize("flags, mode", [(O_RDONLY, FMODE_READ), (O_WRONLY, FMODE_WRITE),
                                         (O_RDWR, FMODE_READ | FMODE_WRITE)])
def test_open_mode(m, log, flags, mode):
    add_dev(m, "/dev/t", log)
    with running(m.init_task):
        f = do_filp_open("/dev/t", flags)
        assert f.f_mode == mode and f.f_flags == flags
        fput(f)


def test_unknown_path_is_enoent(m):
    with running(m.init_task), pytest.raises(KernelError) as ei:
        do_filp_open("/dev/nothing", O_RDWR)
    assert ei.value.errno == ENOENT


def test_cdev_add_twice_is_eexist(m, log):
    add_dev(m, "/dev/t", log)
    with pytest.raises(KernelError) as ei:
        add_dev(m, "/dev/t", log)
    assert ei.value.errno == EEXIST


def test_cdev_del_stops_new_opens_not_open_files(m, log):
    cd = add_dev(m, "/dev/t", log)
    p = m.spawn()
    fd = p.open("/dev/t")
    with running(m.init_task):
        cdev_del(cd)
    assert p.open("/dev/t") == -ENOENT
    assert p.close(fd) == 0
    assert log == [("open", "/dev/t"), ("release", "/dev/t")]


def test_failing_open_installs_nothing(m, log):
    def bad_open(inode, f):
        raise KernelError(ENODEV, "bad_open: no hardware")

    add_dev(m, "/dev/bad", log, open=bad_open)
    add_dev(m, "/dev/t", log)
    p = m.spawn()
    assert p.open("/dev/bad") == -ENODEV
    assert p.task.last_error.function == "bad_open"
    assert p.open("/dev/t") == 0  # the fd the failed open reserved is free again
    assert log == [("open", "/dev/t")]


def test_file_references_and_release(m, log):
    add_dev(m, "/dev/t", log)
    with running(m.init_task):
        f = do_filp_open("/dev/t", O_RDWR)
        assert get_file(f) is f and f.f_count == 2
        fput(f)
        assert log == [("open", "/dev/t")]
        fput(f)
        assert log[-1] == ("release", "/dev/t")
        fput(f)
    assert m.bugs == ["WARNING: fput: file /dev/t count=0 put below zero"]
    m.bugs.clear()


def test_fd_table_gives_the_lowest_free_fd(m, log):
    add_dev(m, "/dev/t", log)
    fds = files_struct(max_fds=3)
    with running(m.init_task):
        for want in range(3):
            fd = fds.alloc_fd()
            assert fd == want
            fds.fd_install(fd, do_filp_open("/dev/t", O_RDWR))
        with pytest.raises(KernelError) as ei:
            fds.alloc_fd()
        assert ei.value.errno == EMFILE
        fds.close_fd(1)
        assert fds.open_fds() == [0, 2]
        assert fds.alloc_fd() == 1
        fds.fd_install(1, do_filp_open("/dev/t", O_RDWR))
        f = fds.fget(2)
        assert f.f_count == 2
        fput(f)
        for bad in (-1, 3, 7):
            with pytest.raises(KernelError) as ei:
                fds.fget(bad)
            assert ei.value.errno == EBADF
        fds.close_all()
        assert fds.open_fds() == []
        with pytest.raises(KernelError) as ei:
            fds.close_fd(0)
        assert ei.value.errno == EBADF
    assert [e for e in log if e[0] == "release"] == [("release", "/dev/t")] * 4


def test_a_mapping_keeps_the_file_after_close(m, log):
    def dev_mmap(f, vma):
        log.append(("mmap", current().pid))

    add_dev(m, "/dev/t", log, mmap=dev_mmap)
    p = m.spawn()
    ps = m.page_size
    fd = p.open("/dev/t")
    f = p.task.files.fdt[fd]
    a = p.mmap(0, 2 * ps, PROT_READ | PROT_WRITE, MAP_SHARED, fd)
    assert f.f_count == 2 and p.mm.vma_lookup(a).vm_file is f
    assert p.close(fd) == 0
    assert f.f_count == 1 and ("release", "/dev/t") not in log
    assert p.munmap(a, ps) == 0  # half of it: the other half still holds the file
    assert ("release", "/dev/t") not in log
    assert p.munmap(a + ps, ps) == 0
    assert log == [("open", "/dev/t"), ("mmap", p.pid), ("release", "/dev/t")]
    assert f.f_count == 0
