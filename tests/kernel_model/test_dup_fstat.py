"""kernel_model/syscalls.py: dup(2) and fstat(2) - a dup names the same open file (its
release waits for the last descriptor), fstat reports the inode's type and dev_t."""

from __future__ import annotations

import pytest

from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.errno import EBADF, EFAULT
from kernel_model.fs import MAJOR, MINOR, MKDEV, O_CREAT, O_RDWR, cdev, cdev_add, file_operations
from kernel_model.uapi.stat import S_IFCHR, S_IFMT, S_IFREG, S_ISCHR, makedev, stat
from userspace.libc import posix_memalign


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


def add_dev(m: Machine, path: str, log: list, dev: int = 0) -> cdev:
    cd = cdev(file_operations(release=lambda inode, f: log.append(("release", f.f_path))),
              dev=dev)
    with running(m.init_task):
        cdev_add(cd, path)
    return cd


def fstat(p, fd: int) -> stat | int:
    buf = posix_memalign(p, 8, stat.SIZE)
    ret = p.fstat(fd, buf)
    return stat.unpack(p.load(buf, stat.SIZE)) if ret == 0 else ret


def test_dup_shares_the_file_until_the_last_fd_closes(m):
    log: list = []
    add_dev(m, "/dev/x", log)
    p = m.spawn()
    fd = p.open("/dev/x", O_RDWR)
    fd2 = p.dup(fd)
    assert fd2 == fd + 1 and p.task.files.fdt[fd2] is p.task.files.fdt[fd]
    assert p.task.files.fdt[fd].f_count == 2
    assert p.close(fd) == 0 and log == []          # the dup keeps the file open
    assert p.close(fd2) == 0 and log == [("release", "/dev/x")]


def test_dup_of_a_closed_fd_is_ebadf(m):
    p = m.spawn()
    assert p.dup(5) == -EBADF
    assert p.task.files.open_fds() == []


def test_fstat_of_a_char_device_gives_its_dev_t(m):
    add_dev(m, "/dev/x", [], dev=MKDEV(231, 193))
    p = m.spawn()
    fd = p.open("/dev/x", O_RDWR)
    st = fstat(p, fd)
    assert st.st_mode & S_IFMT == S_IFCHR and S_ISCHR(st.st_mode)
    assert st.st_rdev == makedev(231, 193)          # what glibc's makedev() gives
    assert (MAJOR(MKDEV(231, 193)), MINOR(MKDEV(231, 193))) == (231, 193)
    assert st.st_rdev == fstat(p, p.dup(fd)).st_rdev


def test_fstat_of_a_regular_file(m):
    p = m.spawn()
    fd = p.open("/tmp/f", O_RDWR | O_CREAT)
    st = fstat(p, fd)
    assert st.st_mode & S_IFMT == S_IFREG and st.st_rdev == 0


def test_fstat_errors(m):
    add_dev(m, "/dev/x", [])
    p = m.spawn()
    fd = p.open("/dev/x", O_RDWR)
    assert fstat(p, 9) == -EBADF
    assert p.fstat(fd, 0) == -EFAULT                # an unmapped buffer
    assert p.task.files.fdt[fd].f_count == 1        # the file reference was dropped
