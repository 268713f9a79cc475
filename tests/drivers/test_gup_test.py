"""drivers/gup_test.py (mm/gup_test.c) through its userspace half, and module loading."""

from __future__ import annotations

import struct

import pytest

from kernel_model.emu.machine import Machine
from kernel_model.errno import EBUSY, EEXIST, EFAULT, EINVAL, ENOENT, KernelError
from kernel_model.uapi.gup_test import (
    GUP_TEST_FMT,
    GUP_TEST_PATH,
    GUP_TEST_SIZE,
    PIN_FAST_BENCHMARK,
)
from userspace.tools import gup_test


@pytest.fixture
def machine(backend):
    m = Machine(ram_size=64 << 20, backend=backend)
    m.load_module("gup_test")
    return m


@pytest.mark.parametrize("longterm", [False, True])
def test_benchmark_pins_and_unpins_every_page(machine, longterm):
    p = machine.spawn("selftest")
    r = gup_test.run(p, 1 << 20, 0, write=True, longterm=longterm)
    assert r["nr_pages"] == 256 and r["size"] == 1 << 20
    assert machine.vmstat["nr_foll_pin_acquired"] == 256
    assert machine.vmstat["nr_foll_pin_released"] == 256
    assert not machine.bugs  # verify_dma_pinned found every page pinned


def test_chunked_calls_cover_the_range(machine):
    p = machine.spawn("selftest")
    r = gup_test.run(p, 1 << 20, 7, write=False)  # 256 pages in calls of 7
    assert r["nr_pages"] == 256
    assert machine.vmstat["nr_foll_pin_acquired"] == 256


def _ioctl_with(machine, p, size: int, per_call: int, addr: int | None = None):
    arg = p.mmap(0, machine.page_size)
    base = p.mmap(0, 1 << 20) if addr is None else addr
    p.store(arg, struct.pack(GUP_TEST_FMT, 0, 0, base, size, per_call, 0, 0, *([0] * 8)))
    fd = p.open(GUP_TEST_PATH)
    ret = p.ioctl(fd, PIN_FAST_BENCHMARK, arg)
    out = struct.unpack(GUP_TEST_FMT, p.load(arg, GUP_TEST_SIZE))
    p.close(fd)
    return ret, out


def test_hole_stops_the_pinning_and_reports_how_far(machine):
    p = machine.spawn("selftest")
    base = p.mmap(0, 4 * machine.page_size)
    p.munmap(base + 2 * machine.page_size, 2 * machine.page_size)  # pages 2-3 gone
    ret, out = _ioctl_with(machine, p, 4 * machine.page_size, 4, base)
    assert ret == 0
    assert machine.vmstat["nr_foll_pin_acquired"] == 2  # pinned up to the hole
    assert machine.vmstat["nr_foll_pin_released"] == 2


def test_nr_pages_per_call_zero_is_einval(machine):
    p = machine.spawn("selftest")
    ret, _ = _ioctl_with(machine, p, 1 << 20, 0)
    assert ret == -EINVAL
    assert "nr_pages_per_call" in p.task.last_error.message


def test_bad_user_pointer_is_efault_and_unknown_command_einval(machine):
    p = machine.spawn("selftest")
    fd = p.open(GUP_TEST_PATH)
    assert p.ioctl(fd, PIN_FAST_BENCHMARK, 0x1000) == -EFAULT  # nothing mapped there
    assert p.ioctl(fd, 0x1234, 0) == -EINVAL
    assert p.task.last_error.function == "gup_test_ioctl"
    assert machine.vmstat["nr_foll_pin_acquired"] == 0


def test_module_load_unload_rules(machine):
    with pytest.raises(KernelError) as e:
        machine.load_module("gup_test")
    assert e.value.errno == EEXIST
    with pytest.raises(KernelError) as e:
        machine.load_module("no_such_module")
    assert e.value.errno == ENOENT
    p = machine.spawn("selftest")
    fd = p.open(GUP_TEST_PATH)
    with pytest.raises(KernelError) as e:  # an open file holds the module
        machine.unload_module("gup_test")
    assert e.value.errno == EBUSY
    p.close(fd)
    machine.unload_module("gup_test")
    assert p.open(GUP_TEST_PATH) == -ENOENT
    with pytest.raises(KernelError) as e:
        machine.unload_module("gup_test")
    assert e.value.errno == ENOENT
