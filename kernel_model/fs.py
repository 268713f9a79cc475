"""Mirrors fs/char_dev.c, fs/file_table.c, fs/file.c and fs/open.c.

Drivers register character devices by path (`cdev_add`); open() finds the
cdev, creates a struct file holding the driver's file_operations and calls
->open.  Files are reference counted: the fd table holds one reference and
every VMA mapping the file holds another (get_file in do_mmap), so ->release
runs only when the last of them goes - closing a uverbs fd while its UAR is
still mapped does not tear the context down, exactly as in the kernel.

EMU: a cdev is named by its /dev path; the dev_t, the device class and udev
creating the node are folded into that one step.  A path that names no device
is a regular file of one flat in-memory table (path -> inode, ramfs_table):
open() with O_CREAT makes it, every later open of the path gets the same
inode.  Such files have no content, directories, permissions or unlink - they
are there for an inode's identity (ibv_open_xrcd shares an XRC domain by the
inode of a file the processes open).
"""

from __future__ import annotations

from typing import Any

import attrs

from kernel_model.current import current
from kernel_model.errno import EBADF, EEXIST, EMFILE, ENOENT, KernelBug, KernelError
from kernel_model.module import module_put, try_module_get
from kernel_model.sched import touch_key
from kernel_model.trace import traced
from kernel_model.uapi.stat import S_IFCHR, S_IFREG

FMODE_READ = 0x1
FMODE_WRITE = 0x2
O_ACCMODE = 0o3
O_RDONLY, O_WRONLY, O_RDWR = 0, 1, 2
O_CREAT, O_EXCL = 0o100, 0o200
O_NONBLOCK = 0o4000
O_CLOEXEC = 0o2000000
MINORBITS = 20


def MKDEV(major: int, minor: int) -> int:
    """Mirrors MKDEV(): the kernel's dev_t of (major, minor)."""
    return (major << MINORBITS) | minor


def MAJOR(dev: int) -> int:
    return dev >> MINORBITS


def MINOR(dev: int) -> int:
    return dev & ((1 << MINORBITS) - 1)


@attrs.define(eq=False)
class file_operations:
    """Mirrors struct file_operations: a driver's entry points for its files."""

    owner: Any = None
    open: Any = None
    release: Any = None
    read: Any = None
    write: Any = None
    unlocked_ioctl: Any = None
    mmap: Any = None
    poll: Any = None


@attrs.define(eq=False)
class cdev:
    """Mirrors struct cdev: a character device's ops and (here) its path."""

    ops: file_operations
    owner: Any = None
    path: str | None = None
    private: Any = None
    dev: int = 0        # the dev_t (MKDEV); 0 when the driver gave the node none


@attrs.define(eq=False)
class inode:
    """Mirrors struct inode for a device node: the cdev it opens, its type and
    permission bits (i_mode) and, for a character device, its dev_t (i_rdev).  An
    anonymous inode (eventfd-like files) has no file type bits."""

    i_cdev: cdev
    i_private: Any = None
    i_mode: int = 0
    i_rdev: int = 0


@attrs.define(eq=False, repr=False)
class file:
    """Mirrors struct file."""

    f_op: file_operations
    f_path: str
    f_inode: inode
    f_flags: int
    f_mode: int
    private_data: Any = None
    f_count: int = 1

    @property
    def trace_name(self) -> str:
        return self.f_path

    def __repr__(self) -> str:
        return f"file {self.f_path} count={self.f_count}"


def chrdev_table() -> dict[str, cdev]:
    """The machine's /dev: path -> cdev."""
    return {}


def node_groups() -> dict[str, tuple[int, file_operations, Any]]:
    """The machine's numbered node groups: directory -> (count, fops, show), the
    nodes `directory`/0 ... `directory`/count-1 (kernel_model.sysfs.sysfs_create_group)."""
    return {}


def chrdev_lookup(machine: Any, path: str) -> cdev | None:
    """The node at `path`: a registered cdev, or a file of a numbered group - made
    when it is looked up, its private() calling the group's show with its index
    (the canonical decimal name only: "07" and "+7" are no files)."""
    cd = machine.chrdevs.get(path)
    if cd is not None or not machine.node_groups:
        return cd
    d, _, name = path.rpartition("/")
    g = machine.node_groups.get(d)
    if g is None or not (name.isascii() and name.isdigit()) or str(int(name)) != name or \
            int(name) >= g[0]:
        return None
    cd = cdev(g[1], path=path)
    index, show = int(name), g[2]
    cd.private = lambda: show(index)
    return cd


def ramfs_table() -> dict[str, inode]:
    """The machine's regular files: path -> inode (see the module docstring)."""
    return {}


#: a regular file's operations: none (open, close and fstat-like identity only)
ramfs_file_operations = file_operations()


def _open_regular(path: str, flags: int) -> inode:
    """The inode of regular file `path`: created with O_CREAT, else ENOENT."""
    table = current().machine.ramfs
    ino = table.get(path)
    if ino is None:
        if not flags & O_CREAT:
            raise KernelError(ENOENT, f"do_filp_open: no such device {path}")
        ino = table[path] = inode(None)
    elif flags & O_CREAT and flags & O_EXCL:
        raise KernelError(EEXIST, f"do_filp_open: {path} exists")
    return ino


def cdev_init(cd: cdev, fops: file_operations) -> None:
    """Mirrors cdev_init()."""
    cd.ops = fops


@traced
def cdev_add(cd: cdev, path: str) -> None:
    """Mirrors cdev_add() + device_create(): make `path` open this cdev."""
    table = current().machine.chrdevs
    if path in table:
        raise KernelError(EEXIST, f"cdev_add: {path} already registered")
    cd.path = path
    table[path] = cd


@traced
def cdev_del(cd: cdev) -> None:
    """Mirrors cdev_del(): new opens fail; open files keep working."""
    current().machine.chrdevs.pop(cd.path, None)


def get_file(f: file) -> file:
    """Mirrors get_file(): take a reference."""
    f.f_count += 1
    return f


@traced
def fput(f: file) -> None:
    """Mirrors fput(): drop a reference; the last one calls ->release (__fput).

    __fput ignores what ->release returns, so nothing fails a close, a munmap
    or an exit: a release that raises a kernel error is recorded as a WARN
    (a driver bug), and the module reference goes either way.
    """
    if f.f_count <= 0:
        current().machine.report_bug("fput", f"{f} put below zero")
        return
    f.f_count -= 1
    if f.f_count == 0:  # __fput()
        try:
            if f.f_op.release is not None:
                f.f_op.release(f.f_inode, f)
        except KernelBug:
            raise
        except Exception as e:  # noqa: BLE001 - the result of ->release is not looked at
            current().machine.report_bug("__fput", f"{f.f_path}: ->release failed: {e!r}")
        finally:
            module_put(f.f_op.owner)


@traced
def do_filp_open(path: str, flags: int) -> file:
    """Mirrors do_filp_open() for a device node: find the cdev, ->open."""
    cd = chrdev_lookup(current().machine, path)
    acc = flags & O_ACCMODE
    mode = (FMODE_READ if acc in (O_RDONLY, O_RDWR) else 0) | (
        FMODE_WRITE if acc in (O_WRONLY, O_RDWR) else 0)
    if cd is None:
        ino = _open_regular(path, flags)
        ino.i_mode = S_IFREG | 0o644
        return file(ramfs_file_operations, path, ino, flags, mode)
    # EMU: sysfs attributes live in the device table too (kernel_model/sysfs.py); they
    # are regular files, every other node is a character device
    ino = inode(cd, i_mode=S_IFREG | 0o444 if path.startswith("/sys/") else S_IFCHR | 0o600,
                i_rdev=cd.dev)
    f = file(cd.ops, path, ino, flags, mode)
    try_module_get(cd.ops.owner)  # fops_get(): the driver stays loaded while open
    if cd.ops.open is not None:
        try:
            cd.ops.open(ino, f)
        except KernelError:
            module_put(cd.ops.owner)  # f was never installed: nothing else to undo
            raise
    return f


class files_struct:
    """Mirrors struct files_struct: the fd table (lowest free fd first).

    For partial-order reduction the table reports its own changes fd by fd
    (touch_key): an fget of one fd and a close of another do not conflict; whoever
    reads `fdt` itself reads the whole table, which every change adds to."""

    POR_REPORTED = ("fdt",)

    def __init__(self, max_fds: int):
        self.fdt: list[file | None] = []
        self.max_fds = max_fds

    def _table(self) -> list[file | None]:
        return object.__getattribute__(self, "fdt")

    def _slot(self, fd: int, how: bool | str) -> None:
        touch_key((id(self), "fd", fd), how)
        if how is not False:
            touch_key((id(self), "fdt"), "add")

    def alloc_fd(self) -> int:
        """Mirrors alloc_fd(): the lowest unused descriptor."""
        fdt = self._table()
        for fd, f in enumerate(fdt):
            touch_key((id(self), "fd", fd), False)
            if f is None:
                return fd
        if len(fdt) >= self.max_fds:
            raise KernelError(EMFILE, "alloc_fd: too many open files")
        fdt.append(None)
        self._slot(len(fdt) - 1, True)
        return len(fdt) - 1

    def fd_install(self, fd: int, f: file) -> None:
        self._table()[fd] = f
        self._slot(fd, True)

    def fget(self, fd: int) -> file:
        """Mirrors fget(): the file behind fd, with a reference taken."""
        fdt = self._table()
        touch_key((id(self), "fd", fd), False)
        if not 0 <= fd < len(fdt) or fdt[fd] is None:
            raise KernelError(EBADF, f"fget: bad file descriptor {fd}")
        return get_file(fdt[fd])

    def close_fd(self, fd: int) -> None:
        """Mirrors close_fd(): remove from the table, then filp_close (fput)."""
        fdt = self._table()
        touch_key((id(self), "fd", fd), False)
        if not 0 <= fd < len(fdt) or fdt[fd] is None:
            raise KernelError(EBADF, f"close_fd: bad file descriptor {fd}")
        f, fdt[fd] = fdt[fd], None
        self._slot(fd, True)
        fput(f)

    def close_all(self) -> None:
        """Mirrors close_files(): every open fd, in fd order.

        Every file is put even if an earlier release failed: a failure is a
        WARN on the machine (release is void in the kernel); a KernelBug (a
        debug check's oops) is raised again once every fd is closed.
        """
        oops: list[KernelBug] = []
        fdt = self._table()
        for fd, f in enumerate(fdt):
            touch_key((id(self), "fd", fd), False)
            if f is None:
                continue
            fdt[fd] = None
            self._slot(fd, True)
            try:
                fput(f)
            except KernelBug as e:
                oops.append(e)
            except Exception as e:  # noqa: BLE001 - close_files goes on regardless
                current().machine.report_bug("close_files", f"fd {fd} {f!r}: {e!r}")
        if oops:
            raise oops[0]

    def open_fds(self) -> list[int]:
        return [fd for fd, f in enumerate(self.fdt) if f is not None]
