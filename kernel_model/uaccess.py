"""Mirrors include/linux/uaccess.h: the only way kernel code touches user memory.

copy_from_user()/copy_to_user() return the number of bytes NOT copied, as the
kernel's do; callers turn a non-zero result into -EFAULT.  Pages not yet
present are faulted in (the exception-table path of the real copy), and a
copy stops at the first page that has no VMA or forbids the access.
"""

from __future__ import annotations

import struct

from kernel_model.current import current
from kernel_model.errno import EFAULT, ENOTTY, KernelError
from kernel_model.memory import access_vm, page_at
from kernel_model.sched import touch_ram
from kernel_model.trace import traced


def access_ok(addr: int, size: int) -> bool:
    """Mirrors access_ok(): the range lies below TASK_SIZE."""
    mm = current().mm
    limit = mm.task_size if mm is not None else 0
    return addr >= 0 and size >= 0 and addr + size <= limit


@traced
def copy_from_user(to: bytearray | memoryview, from_: int, n: int) -> int:
    """Mirrors copy_from_user(): user bytes into a kernel buffer; returns bytes left."""
    if n == 0:
        return 0
    if not access_ok(from_, n):
        return n
    t = current()
    m = t.machine
    dst = memoryview(to)
    read = m.phys_read

    def chunk(phys: int, off: int, k: int) -> None:
        if phys + k <= m.ram_size:
            touch_ram(m.mem, phys, k, False)
            dst[off:off + k] = m.mem.ram[phys:phys + k]
        else:
            dst[off:off + k] = read(phys, k)

    phys = page_at(t.mm, from_, n, False)      # one page already mapped: no walk
    if phys >= 0:
        chunk(phys, 0, n)
        return 0
    return n - access_vm(t.mm, from_, n, False, chunk)


@traced
def copy_to_user(to: int, from_: bytes | bytearray | memoryview, n: int) -> int:
    """Mirrors copy_to_user(): kernel bytes into user memory; returns bytes left."""
    if n == 0:
        return 0
    if not access_ok(to, n):
        return n
    t = current()
    m = t.machine
    src = memoryview(from_)

    def chunk(phys: int, off: int, k: int) -> None:
        if phys + k <= m.ram_size:
            touch_ram(m.mem, phys, k, True)
            m.mem.ram[phys:phys + k] = src[off:off + k]
        else:
            m.phys_write(phys, bytes(src[off:off + k]))

    phys = page_at(t.mm, to, n, True)
    if phys >= 0:
        chunk(phys, 0, n)
        return 0
    return n - access_vm(t.mm, to, n, True, chunk)


def get_user_u64(addr: int) -> int:
    """get_user() of a u64; KernelError(EFAULT) on failure."""
    buf = bytearray(8)
    if copy_from_user(buf, addr, 8):
        raise KernelError(EFAULT, f"get_user: fault at {addr:#x}")
    return struct.unpack("<Q", buf)[0]


def put_user_u64(value: int, addr: int) -> None:
    """put_user() of a u64; KernelError(EFAULT) on failure."""
    if copy_to_user(addr, struct.pack("<Q", value), 8):
        raise KernelError(EFAULT, f"put_user: fault at {addr:#x}")


def ioctl_copy_struct(handlers: dict, private: object, cmd: int, arg: int, who: str) -> int:
    """The body of a driver's unlocked_ioctl whose commands each carry one fixed struct
    (`handlers`: cmd -> (struct format, fn(private, fields) -> fields to copy back, or
    None)): ENOTTY for an unknown command, the struct copied in, the handler run, the
    result copied back; EFAULT when either copy faults.  0."""
    entry = handlers.get(cmd)
    if entry is None:
        raise KernelError(ENOTTY, f"{who}: unknown command {cmd:#x}")
    fmt, fn = entry
    size = struct.calcsize(fmt)
    buf = bytearray(size)
    if copy_from_user(buf, arg, size):
        raise KernelError(EFAULT, f"{who}: copy_from_user")
    out = fn(private, list(struct.unpack(fmt, buf)))
    if out is not None and copy_to_user(arg, struct.pack(fmt, *out), size):
        raise KernelError(EFAULT, f"{who}: copy_to_user")
    return 0
