"""Mirrors tools/testing/selftests/mm/gup_test.c: the userspace half of the gup benchmark.

Maps anonymous memory, touches every page so it is present (the selftest's
`p[0] = 0` loop), opens /sys/kernel/debug/gup_test, puts a struct gup_test
in its own memory, and issues PIN_FAST_BENCHMARK or PIN_LONGTERM_BENCHMARK.
Everything goes through system calls and the process's own loads and stores.
"""

from __future__ import annotations

import struct

from kernel_model.uapi.gup_test import (
    GUP_TEST_FMT,
    GUP_TEST_PATH,
    GUP_TEST_SIZE,
    PIN_FAST_BENCHMARK,
    PIN_LONGTERM_BENCHMARK,
)

PROT_RW = 0x1 | 0x2
MAP_PRIVATE_ANON = 0x02 | 0x20
O_RDWR = 2
FOLL_WRITE = 0x01


class GupTestError(OSError):
    """A failing system call, with its errno (like the selftest's perror + exit)."""


def run(proc, size: int, nr_pages_per_call: int = 0, write: bool = True,
        longterm: bool = False, page_size: int = 4096) -> dict[str, int]:
    """Run one benchmark in `proc`; returns the struct gup_test the kernel filled in."""
    def check(ret: int, what: str) -> int:
        if ret < 0:
            raise GupTestError(-ret, f"{what} failed")
        return ret

    nr_pages = size // page_size
    per_call = nr_pages_per_call or nr_pages
    addr = check(proc.mmap(0, size, PROT_RW, MAP_PRIVATE_ANON), "mmap")
    for off in range(0, size, page_size):  # fault every page in, like the selftest
        proc.store(addr + off, b"\0")
    fd = check(proc.open(GUP_TEST_PATH, O_RDWR), f"open {GUP_TEST_PATH}")
    arg = check(proc.mmap(0, page_size, PROT_RW, MAP_PRIVATE_ANON), "mmap")
    proc.store(arg, struct.pack(GUP_TEST_FMT, 0, 0, addr, size, per_call,
                                FOLL_WRITE if write else 0, 0, *([0] * 8)))
    cmd = PIN_LONGTERM_BENCHMARK if longterm else PIN_FAST_BENCHMARK
    check(proc.ioctl(fd, cmd, arg), "ioctl")
    got = struct.unpack(GUP_TEST_FMT, proc.load(arg, GUP_TEST_SIZE))
    check(proc.close(fd), "close")
    check(proc.munmap(arg, page_size), "munmap")
    check(proc.munmap(addr, size), "munmap")
    return {"get_delta_usec": got[0], "put_delta_usec": got[1], "size": got[3],
            "nr_pages": got[3] // page_size}
