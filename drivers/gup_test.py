"""Mirrors mm/gup_test.c: the kernel half of the gup selftest (tools/testing/selftests/mm).

A debugfs file, /sys/kernel/debug/gup_test, whose ioctls pin a user range
with pin_user_pages_fast() (PIN_FAST_BENCHMARK) or pin_user_pages() with
FOLL_LONGTERM (PIN_LONGTERM_BENCHMARK) in chunks of nr_pages_per_call, time
the pinning and the unpinning separately, check every page is really
DMA-pinned, and report the times and the size actually pinned back to the
caller through the same struct gup_test.

EMU: the times are wall-clock microseconds of the emulator - what this
benchmark exists to measure.  GUP_FAST_BENCHMARK and the FOLL_GET tests are
not modelled (this model pins; it does not hand out plain references).
"""

from __future__ import annotations

import struct
import time

from c_ext import U64Array
from kernel_model.current import current
from kernel_model.errno import EFAULT, EINVAL, ENOMEM, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations
from kernel_model.gup import FOLL_LONGTERM, pin_user_pages, pin_user_pages_fast, unpin_user_pages
from kernel_model.page_alloc import page, page_maybe_dma_pinned
from kernel_model.uaccess import copy_from_user, copy_to_user
from kernel_model.uapi.gup_test import (
    GUP_TEST_FMT,
    GUP_TEST_PATH,
    GUP_TEST_SIZE,
    PIN_FAST_BENCHMARK,
    PIN_LONGTERM_BENCHMARK,
)


def _pin_range(cmd: int, gup: list, pages: U64Array, page_shift: int) -> int:
    """The timed loop: pin in chunks until the range is done or a call comes up short."""
    base, size, per_call, flags = gup[2], gup[3], gup[4], gup[5]
    end = base + size
    i, nr, addr = 0, per_call, base
    while addr < end:
        if nr != per_call:
            break  # the previous call pinned less than asked: stop there
        nxt = addr + (nr << page_shift)
        if nxt > end:
            nxt = end
            nr = (nxt - addr) >> page_shift
        try:
            if cmd == PIN_FAST_BENCHMARK:
                nr = pin_user_pages_fast(addr, nr, flags, pages, i)
            else:
                nr = pin_user_pages(addr, nr, flags | FOLL_LONGTERM, pages, i)
        except KernelError:
            nr = 0
        if nr <= 0:
            break
        i += nr
        addr = nxt
    gup[3] = addr - base  # size: how far the pinning got
    return i


def gup_test_ioctl(filep, cmd: int, arg: int) -> int:
    """Mirrors gup_test_ioctl() + __gup_test_ioctl()."""
    if cmd not in (PIN_FAST_BENCHMARK, PIN_LONGTERM_BENCHMARK):
        raise KernelError(EINVAL, f"gup_test_ioctl: unknown command {cmd:#x}")
    raw = bytearray(GUP_TEST_SIZE)
    if copy_from_user(raw, arg, GUP_TEST_SIZE):
        raise KernelError(EFAULT, "gup_test_ioctl: copy_from_user of struct gup_test")
    gup = list(struct.unpack(GUP_TEST_FMT, raw))
    machine = filep.private_data
    shift = machine.page_shift
    if gup[3] >= 1 << 63 or gup[4] == 0:
        raise KernelError(EINVAL, "__gup_test_ioctl: size too large or nr_pages_per_call 0")
    nr_pages = gup[3] >> shift
    if nr_pages > machine.nr_pages * 4:
        raise KernelError(ENOMEM, "__gup_test_ioctl: kvcalloc of the pages array failed")
    pages = U64Array(nr_pages)
    t0 = time.perf_counter_ns()
    pinned = _pin_range(cmd, gup, pages, shift)
    t1 = time.perf_counter_ns()
    gup[0] = (t1 - t0) // 1000
    for k in range(pinned):  # verify_dma_pinned(), outside the timed part
        pg = page(machine.zone, pages.view[k])
        if not page_maybe_dma_pinned(pg):
            machine.report_bug("verify_dma_pinned", f"pfn {pg.pfn:#x} not dma-pinned")
            break
    t0 = time.perf_counter_ns()
    unpin_user_pages(pages, pinned)  # put_back_pages()
    gup[1] = (time.perf_counter_ns() - t0) // 1000
    if copy_to_user(arg, struct.pack(GUP_TEST_FMT, *gup), GUP_TEST_SIZE):
        raise KernelError(EFAULT, "gup_test_ioctl: copy_to_user of struct gup_test")
    return 0


def gup_test_open(inode, filep) -> None:
    filep.private_data = inode.i_cdev.private


def module_init(mod) -> cdev:
    """debugfs_create_file_unsafe("gup_test", ...)."""
    cd = cdev(file_operations(owner=mod, open=gup_test_open, unlocked_ioctl=gup_test_ioctl))
    cd.private = current().machine
    cdev_add(cd, GUP_TEST_PATH)
    return cd


def module_exit(mod) -> None:
    cdev_del(mod.state)
