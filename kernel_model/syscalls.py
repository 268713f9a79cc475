"""Mirrors the system-call entry points (fs/open.c, fs/read_write.c, fs/ioctl.c,
mm/mmap.c, kernel/exit.c): the one door from userspace into the kernel.

Each sys_* runs in the calling task's context (current), calls into the
kernel, and turns a KernelError into -errno, as the syscall return path
does.  Userspace (userspace/) never imports drivers: everything it does to
the kernel goes through here.  Buffers are user addresses; the kernel side
reads and writes them with copy_from_user / copy_to_user.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from kernel_model.current import current
from kernel_model.errno import EBADF, EFAULT, EINVAL, ENOENT, ENOTTY, KernelError
from kernel_model.fs import MAJOR, MINOR, do_filp_open, fput
from kernel_model.madvise import do_madvise
from kernel_model.mm import MAP_ANONYMOUS, do_mmap, do_munmap
from kernel_model.sched import SCHED
from kernel_model.sysfs import list_dir
from kernel_model.trace import traced
from kernel_model.uaccess import copy_to_user
from kernel_model.uapi.stat import new_encode_dev, stat
from kernel_model.userfaultfd import new_userfaultfd


def syscall(fn: Callable[..., int]) -> Callable[..., int]:
    """Run fn; a KernelError becomes -errno (the syscall exit path)."""

    @wraps(fn)
    def entry(*args: object) -> int:
        try:
            return fn(*args)
        except KernelError as e:
            current().last_error = e  # what the last failing call said, for diagnostics
            return -e.errno

    return entry


@traced
@syscall
def sys_open(path: str, flags: int) -> int:
    """open(2) of a device node: a new fd or -errno."""
    files = current().files
    fd = files.alloc_fd()
    f = do_filp_open(path, flags)
    files.fd_install(fd, f)
    return fd


@traced
@syscall
def sys_close(fd: int) -> int:
    """close(2)."""
    current().files.close_fd(fd)
    return 0


@traced
@syscall
def sys_dup(oldfd: int) -> int:
    """Mirrors dup(2) (ksys_dup): the lowest free fd, naming the same open file (one
    more reference on it); EBADF for a closed fd."""
    files = current().files
    f = files.fget(oldfd)
    try:
        fd = files.alloc_fd()
    except KernelError:
        fput(f)
        raise
    files.fd_install(fd, f)
    return fd


@traced
@syscall
def sys_fstat(fd: int, statbuf: int) -> int:
    """Mirrors fstat(2) (vfs_fstat -> cp_new_stat): the file's struct stat at user
    address statbuf; EBADF for a closed fd, EFAULT for a bad buffer.

    EMU: only st_mode and st_rdev carry the inode's values (the model keeps no
    owners, sizes or times); the other fields are 0."""
    def body(f) -> int:
        ino = f.f_inode
        st = stat(st_mode=ino.i_mode, st_rdev=new_encode_dev(MAJOR(ino.i_rdev),
                                                              MINOR(ino.i_rdev)), st_nlink=1)
        if copy_to_user(statbuf, st.pack(), stat.SIZE):
            raise KernelError(EFAULT, "cp_new_stat: copy_to_user")
        return 0
    return _with_file(fd, body)


def _with_file(fd: int, body: Callable[[object], int]) -> int:
    f = current().files.fget(fd)
    try:
        return body(f)
    finally:
        fput(f)


@traced
@syscall
def sys_write(fd: int, buf: int, count: int) -> int:
    """write(2): the driver's ->write reads `count` bytes at user address buf."""
    def body(f) -> int:
        if f.f_op.write is None:
            raise KernelError(EINVAL, "vfs_write: file has no write operation")
        return f.f_op.write(f, buf, count)
    return _with_file(fd, body)


@traced
@syscall
def sys_read(fd: int, buf: int, count: int) -> int:
    """read(2): the driver's ->read fills user address buf."""
    def body(f) -> int:
        if f.f_op.read is None:
            raise KernelError(EINVAL, "vfs_read: file has no read operation")
        return f.f_op.read(f, buf, count)
    return _with_file(fd, body)


@traced
@syscall
def sys_ioctl(fd: int, cmd: int, arg: int) -> int:
    """ioctl(2): ->unlocked_ioctl, ENOTTY when the file has none."""
    def body(f) -> int:
        if f.f_op.unlocked_ioctl is None:
            raise KernelError(ENOTTY, "vfs_ioctl: file has no ioctl operation")
        return f.f_op.unlocked_ioctl(f, cmd, arg)
    return _with_file(fd, body)


@traced
@syscall
def sys_mmap(addr: int, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    """mmap(2): the new mapping's address, or -errno."""
    t = current()
    if offset % t.machine.page_size:
        raise KernelError(EINVAL, "ksys_mmap_pgoff: offset not page aligned")
    pgoff = offset >> t.machine.page_shift
    if flags & MAP_ANONYMOUS:
        return do_mmap(t.mm, None, addr, length, prot, flags, pgoff)
    if fd < 0:
        raise KernelError(EBADF, "ksys_mmap_pgoff: bad file descriptor")
    return _with_file(fd, lambda f: do_mmap(t.mm, f, addr, length, prot, flags, pgoff))


@traced
@syscall
def sys_munmap(addr: int, length: int) -> int:
    """munmap(2)."""
    do_munmap(current().mm, addr, length)
    return 0


@traced
@syscall
def sys_madvise(addr: int, length: int, behavior: int) -> int:
    """madvise(2) (MADV_DONTNEED: kernel_model/madvise.py)."""
    do_madvise(current().mm, addr, length, behavior)
    return 0


@traced
@syscall
def sys_userfaultfd(flags: int) -> int:
    """userfaultfd(2): a file that reports what happens to the memory registered with
    it (kernel_model/userfaultfd.py)."""
    return new_userfaultfd(flags)


def sys_getdents(path: str) -> list[str] | int:
    """getdents64(2) of a directory in the device tree: entry names, or -ENOENT.

    EMU: returns the names instead of filling a linux_dirent64 buffer; open +
    getdents + close of a directory fold into this one call.
    """
    names = list_dir(current().machine, path)
    return names if names else -ENOENT


def sys_sched_yield() -> int:
    """Mirrors sys_sched_yield(): go to the back of the run queue.

    Not traced: a busy-polling loop calls it once per empty poll.
    """
    SCHED.yield_("sched_yield")
    return 0


@traced
def sys_exit(code: int) -> None:
    """exit(2): never fails, never returns to the caller's program."""
    current().do_exit(code)
