"""Tests for kernel_model/uaccess.py: copy_{to,from}_user and their byte counts."""

from __future__ import annotations

import pytest

from kernel_model.current import running
from kernel_model.emu.machine import Machine
from kernel_model.errno import EFAULT, KernelError
from kernel_model.mm import PROT_READ, TASK_SIZE
from kernel_model.uaccess import (
    access_ok,
    copy_from_user,
    copy_to_user,
    get_user_u64,
    put_user_u64,
)


@pytest.fixture
def m(backend: str) -> Machine:
    return Machine(ram_size=32 << 20, backend=backend)


@pytest.fixture
def p(m):
    return m.spawn("uaccess")


def test_round_trip_across_page_boundaries(p, m):
    ps = m.page_size
    a = p.mmap(0, 3 * ps)
    data = bytes(range(256)) * (ps // 128)  # two pages' worth
    start = a + ps // 2
    with p.kernel():
        assert copy_to_user(start, data, len(data)) == 0
        back = bytearray(len(data))
        assert copy_from_user(back, start, len(data)) == 0
    assert back == data
    assert p.load(start, len(data)) == data  # what the CPU sees
    assert p.load(a, ps // 2) == bytes(ps // 2)
    assert p.mm.rss == 3


def test_copy_from_user_sees_user_stores(p, m):
    a = p.mmap(0, m.page_size)
    p.store(a + 10, b"user wrote this")
    buf = bytearray(15)
    with p.kernel():
        assert copy_from_user(buf, a + 10, 15) == 0
    assert buf == b"user wrote this"


def test_copy_stops_at_a_hole_and_returns_bytes_not_copied(p, m):
    ps = m.page_size
    a = p.mmap(0, 2 * ps)
    p.munmap(a + ps, ps)
    with p.kernel():
        assert copy_to_user(a + ps - 6, b"0123456789", 10) == 4
        buf = bytearray(b"." * 10)
        assert copy_from_user(buf, a + ps - 6, 10) == 4
    assert buf == b"012345...."
    assert p.load(a + ps - 6, 6) == b"012345"


def test_copy_to_read_only_memory_copies_nothing(p, m):
    a = p.mmap(0, m.page_size, PROT_READ)
    with p.kernel():
        assert copy_to_user(a, b"abc", 3) == 3
        buf = bytearray(3)
        assert copy_from_user(buf, a, 3) == 0  # reading it is fine (a zero page)
    assert buf == bytes(3)


@pytest.mark.parametrize("addr", [TASK_SIZE, TASK_SIZE - 4, -8])
def test_beyond_task_size_returns_n(p, addr):
    with p.kernel():
        assert not access_ok(addr, 8)
        assert copy_to_user(addr, b"12345678", 8) == 8
        assert copy_from_user(bytearray(8), addr, 8) == 8
    assert p.mm.rss == 0


def test_zero_length_copies_are_free(p):
    with p.kernel():
        assert copy_to_user(TASK_SIZE, b"", 0) == 0
        assert copy_from_user(bytearray(), 0, 0) == 0


def test_kernel_thread_has_no_user_memory(m):
    with running(m.init_task):
        assert not access_ok(0x10000, 1)
        assert copy_from_user(bytearray(4), 0x10000, 4) == 4


def test_get_put_user(p, m):
    a = p.mmap(0, m.page_size)
    with p.kernel():
        put_user_u64(0x1122334455667788, a + m.page_size - 8)
        assert get_user_u64(a + m.page_size - 8) == 0x1122334455667788
        with pytest.raises(KernelError) as ei:
            get_user_u64(a + m.page_size - 4)  # runs off the mapping
        assert ei.value.errno == EFAULT
        with pytest.raises(KernelError) as ei:
            put_user_u64(1, a - 8)
        assert ei.value.errno == EFAULT
    assert p.load(a + m.page_size - 8, 8) == (0x1122334455667788).to_bytes(8, "little")
