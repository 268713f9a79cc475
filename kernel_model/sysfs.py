"""Mirrors fs/sysfs (file.c, dir.c) for the attributes drivers publish: text files.

A driver publishes an attribute with sysfs_create_file(path, show); reading
the file calls show() and returns its text, as a DEVICE_ATTR_RO's show
method does.  libibverbs finds devices this way: it lists
/sys/class/infiniband_verbs and reads each uverbsN's `ibdev` and
`abi_version`, then /sys/class/infiniband/<ibdev>/... for the rest.

EMU: sysfs files are nodes in the machine's device table (kernel_model.fs
chrdev_table) with a read operation, and a directory is the set of paths
under a prefix; kobjects, attribute groups and uevents are folded away.  A
group of numbered attributes (a table's rows: gids/0 ... gids/255) is one
entry of the machine's node_groups, its files made when opened
(sysfs_create_group).  Each read returns the whole attribute from offset 0
(no f_pos).
"""

from __future__ import annotations

from collections.abc import Callable

from kernel_model.current import current
from kernel_model.errno import EACCES, EEXIST, EFAULT, KernelError
from kernel_model.fs import O_ACCMODE, O_RDONLY, cdev, chrdev_lookup, file_operations
from kernel_model.uaccess import copy_to_user

SYSFS_PREFIX = "/sys/"


def _sysfs_read(f, buf: int, count: int) -> int:
    """sysfs_kf_read(): format the attribute, copy what fits."""
    text = f.f_inode.i_cdev.private().encode()
    n = min(count, len(text))
    if n and copy_to_user(buf, text[:n], n):
        raise KernelError(EFAULT, "sysfs_kf_read: copy_to_user")
    return n


def _sysfs_open(inode, f) -> None:
    """kernfs_fop_open(): attributes here are read-only."""
    if f.f_flags & O_ACCMODE != O_RDONLY:
        raise KernelError(EACCES, f"kernfs_fop_open: {f.f_path} is read-only")


_SYSFS_FOPS = file_operations(open=_sysfs_open, read=_sysfs_read)


def sysfs_create_file(path: str, show: Callable[[], str]) -> None:
    """Mirrors sysfs_create_file(): publish a read-only attribute at `path`."""
    m = current().machine
    if chrdev_lookup(m, path) is not None:
        raise KernelError(EEXIST, f"sysfs_create_file: {path} exists")
    cd = cdev(_SYSFS_FOPS, path=path)
    cd.private = show
    m.chrdevs[path] = cd


def sysfs_create_group(path: str, count: int, show: Callable[[int], str]) -> None:
    """Mirrors sysfs_create_group() for a group of numbered read-only attributes, a
    table's rows (ib core's port tables: gids/0 ... gids/<count-1>): reading
    `path`/i calls show(i).

    # EMU: the group is one entry of the machine's node_groups, not `count` cdevs;
    # each file gets its cdev when opened (kernel_model.fs.chrdev_lookup).  Opening,
    # reading, listing and removal see the same files; an HCA's two 256-row GID
    # tables made 512 cdevs at every registration, a fifth of building the machine.
    """
    m = current().machine
    if path in m.node_groups or chrdev_lookup(m, path) is not None:
        raise KernelError(EEXIST, f"sysfs_create_group: {path} exists")
    m.node_groups[path] = (count, _SYSFS_FOPS, show)


def sysfs_remove_dir(prefix: str) -> None:
    """Mirrors sysfs_remove_dir(): remove every attribute under `prefix`/."""
    m = current().machine
    base = prefix.rstrip("/") + "/"
    for table in (m.chrdevs, m.node_groups):
        for path in [p for p in table if p.startswith(base) or p == base[:-1]]:
            del table[path]


def list_dir(machine, path: str) -> list[str]:
    """The entries directly under `path` in the device tree (getdents64)."""
    base = path.rstrip("/") + "/"
    names = {p[len(base):].split("/", 1)[0] for p in machine.chrdevs if p.startswith(base)}
    for d, (count, _, _) in machine.node_groups.items():
        if d.startswith(base):                  # the group's directory, or one above it
            names.add(d[len(base):].split("/", 1)[0])
        elif d == base[:-1]:                    # the group itself: its numbered files
            names.update(map(str, range(count)))
    return sorted(names)
