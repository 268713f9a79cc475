"""Tests for kernel_model/hw/nvgpu.py: the GPU device model with no driver bound.

What is checked is what the silicon does: GpuConfig's validation, the PCI
function and its BAR1, copy-engine access to vidmem, BAR1 windows that reach
the GPU page they map (also across windows pointing at non-adjacent pages),
and the fault an access to an unmapped window is - recorded, WARNed, a
MachineCheck for a read and a dropped write.
"""

from __future__ import annotations

import sys

import pytest

import c_ext
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.machine import Machine
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE, GpuConfig, NvGpu
from kernel_model.ioport import MachineCheck
from kernel_model.pci import IORESOURCE_MEM_64, IORESOURCE_PREFETCH

MiB = 1 << 20
P = GPU_PAGE_SIZE


@pytest.fixture
def gpu(m: Machine) -> NvGpu:
    """A 4 MiB GPU with a 64 MiB BAR1 on the small machine `m`; the windows a test maps
    by hand are cleared after it (the machine's leak check would report them)."""
    gpu = NvGpu(m, GpuConfig(mem_size=4 * MiB, bar1_size=64 * MiB))
    yield gpu
    for w in list(gpu.bar1_ptes):
        gpu.bar1_unmap(w)


def take_bugs(m: Machine) -> list[str]:
    """The WARNs recorded so far, cleared (so the leak check passes)."""
    bugs = list(m.bugs)
    m.bugs.clear()
    return bugs


# -- GpuConfig ---------------------------------------------------------------------------
def test_gpu_config_defaults_are_an_a100_with_a_256_mib_bar1():
    cfg = GpuConfig()
    assert (cfg.vendor, cfg.device) == (0x10DE, 0x20B0)
    assert cfg.mem_size == 16 << 30 and cfg.bar1_size == 256 * MiB
    assert "A100" in cfg.name


@pytest.mark.parametrize("mem_size", [0, P - 1, P + 4096, -P])
def test_gpu_config_rejects_a_mem_size_not_a_multiple_of_64k(mem_size):
    with pytest.raises(ValueError, match="mem_size must be a multiple of 64 KiB"):
        GpuConfig(mem_size=mem_size)


@pytest.mark.parametrize("bar1_size", [0, 32 * MiB, 96 * MiB, 64 * MiB + P])
def test_gpu_config_rejects_a_bar1_not_a_power_of_two_of_at_least_64m(bar1_size):
    with pytest.raises(ValueError, match="bar1_size must be a power of two >= 64 MiB"):
        GpuConfig(bar1_size=bar1_size)


def test_gpu_config_accepts_the_smallest_legal_sizes():
    cfg = GpuConfig(mem_size=P, bar1_size=64 * MiB)
    assert (cfg.mem_size, cfg.bar1_size) == (P, 64 * MiB)


def test_gpu_config_is_frozen():
    """A config is a value: it cannot be changed after the GPU is built from it."""
    cfg = GpuConfig()
    with pytest.raises(AttributeError):
        cfg.mem_size = P


# -- the PCI function ---------------------------------------------------------------------
def test_gpu_is_a_pci_function_with_a_prefetchable_64bit_bar1(m, gpu):
    pdev = gpu.pdev
    assert (pdev.vendor, pdev.device) == (0x10DE, 0x20B0)
    assert pdev.model is gpu and m.gpus == [gpu] and gpu.name == pdev.name
    res = pdev.resource[1]
    assert res.end - res.start + 1 == 64 * MiB
    assert res.flags & IORESOURCE_MEM_64 and res.flags & IORESOURCE_PREFETCH
    assert gpu.nr_pages == (4 * MiB) >> GPU_PAGE_SHIFT == 64
    assert gpu.bar1_windows == (64 * MiB) >> GPU_PAGE_SHIFT == 1024
    assert gpu.bar1_ptes == {} and gpu.bar1_faults == []


def test_bar1_bus_addresses_are_64k_windows_inside_the_bar(m, gpu):
    start = gpu.pdev.resource[1].start
    assert gpu.bar1_bus_address(0) == start
    assert gpu.bar1_bus_address(5) == start + 5 * P
    region = m.find_mmio(gpu.bar1_bus_address(1023))
    assert region is not None and region.start == start and region.size == 64 * MiB


def test_two_gpus_have_their_own_bar1_and_uuid(m, gpu):
    other = NvGpu(m, GpuConfig(mem_size=4 * MiB, bar1_size=64 * MiB))
    assert m.gpus == [gpu, other]
    assert len(gpu.uuid) == len(other.uuid) == 16 and gpu.uuid != other.uuid
    a, b = gpu.pdev.resource[1], other.pdev.resource[1]
    assert a.end < b.start or b.end < a.start


def test_repr_counts_the_mapped_windows(gpu):
    gpu.bar1_map(0, 0)
    gpu.bar1_map(1, 7)
    assert "BAR1 64 MiB, 2 windows mapped" in repr(gpu)


# -- vidmem (copy engines) ----------------------------------------------------------------
def test_vidmem_starts_zeroed_and_round_trips(gpu):
    assert gpu.vidmem_read(3 * P, 16) == bytes(16)
    gpu.vidmem_write(3 * P - 4, b"across a page")
    assert gpu.vidmem_read(3 * P - 4, 13) == b"across a page"
    assert gpu.vidmem_read(4 * MiB - 1, 1) == b"\0"


@pytest.mark.parametrize("addr,n", [(-1, 1), (4 * MiB, 1), (4 * MiB - 4, 5), (0, -1)])
def test_vidmem_access_out_of_range_is_refused(gpu, addr, n):
    with pytest.raises(ValueError, match="out of range"):
        gpu.vidmem_read(addr, n)
    if n >= 0:
        with pytest.raises(ValueError, match="out of range"):
            gpu.vidmem_write(addr, b"x" * n)


# -- BAR1 -----------------------------------------------------------------------------------
def test_bar1_read_through_a_mapped_window_reaches_its_gpu_page(m, gpu):
    gpu.vidmem_write(9 * P + 100, b"gpu data")
    gpu.bar1_map(2, 9)
    assert gpu.bar1_ptes == {2: 9}
    assert m.phys_read(gpu.bar1_bus_address(2) + 100, 8) == b"gpu data"
    assert gpu.bar1_faults == [] and m.bugs == []


def test_bar1_write_through_a_mapped_window_lands_in_vidmem(m, gpu):
    gpu.bar1_map(0, 33)
    m.phys_write(gpu.bar1_bus_address(0) + P - 3, b"abc")
    assert gpu.vidmem_read(33 * P + P - 3, 3) == b"abc"
    assert gpu.vidmem_read(0, 3) == bytes(3)  # window 0 is not GPU page 0


def test_bar1_access_across_windows_follows_each_windows_page(m, gpu):
    """Adjacent windows mapping non-adjacent GPU pages: the access is cut per window."""
    gpu.bar1_map(10, 40)
    gpu.bar1_map(11, 2)
    bus = gpu.bar1_bus_address(10)
    m.phys_write(bus + P - 4, b"01234567")
    assert gpu.vidmem_read(40 * P + P - 4, 4) == b"0123"
    assert gpu.vidmem_read(2 * P, 4) == b"4567"
    assert m.phys_read(bus + P - 4, 8) == b"01234567"


def test_bar1_read_of_an_unmapped_window_is_a_machine_check_recorded_and_warned(m, gpu):
    bus = gpu.bar1_bus_address(7)
    with pytest.raises(MachineCheck, match="unmapped window"):
        m.phys_read(bus + 16, 32)
    assert gpu.bar1_faults == [("read", 7 * P + 16, 32)]
    bugs = take_bugs(m)
    assert len(bugs) == 1
    assert bugs[0].startswith("WARNING: nvgpu:") and "window 7 maps no GPU page" in bugs[0]


def test_bar1_read_that_runs_into_an_unmapped_window_faults_there(m, gpu):
    gpu.bar1_map(3, 1)
    with pytest.raises(MachineCheck):
        m.phys_read(gpu.bar1_bus_address(3) + P - 8, 16)
    assert gpu.bar1_faults == [("read", 4 * P, 8)]
    assert len(take_bugs(m)) == 1


def test_bar1_write_to_an_unmapped_window_is_dropped_recorded_and_warned(m, gpu):
    before = bytes(gpu.vidmem[:])
    m.phys_write(gpu.bar1_bus_address(12), b"lost write")     # no exception: posted
    assert bytes(gpu.vidmem[:]) == before
    assert gpu.bar1_faults == [("write", 12 * P, 10)]
    bugs = take_bugs(m)
    assert len(bugs) == 1 and "BAR1 write of 10 bytes" in bugs[0]


def test_bar1_unmap_makes_the_window_fault_again(m, gpu):
    gpu.bar1_map(4, 4)
    bus = gpu.bar1_bus_address(4)
    m.phys_write(bus, b"mapped")
    gpu.bar1_unmap(4)
    assert gpu.bar1_ptes == {}
    with pytest.raises(MachineCheck):
        m.phys_read(bus, 6)
    assert gpu.vidmem_read(4 * P, 6) == b"mapped"     # the page itself is untouched
    assert gpu.bar1_faults == [("read", 4 * P, 6)]
    assert len(take_bugs(m)) == 1


def test_bar1_remap_points_the_window_at_the_new_page(m, gpu):
    gpu.vidmem_write(5 * P, b"five")
    gpu.vidmem_write(6 * P, b"six!")
    gpu.bar1_map(0, 5)
    gpu.bar1_map(0, 6)
    assert m.phys_read(gpu.bar1_bus_address(0), 4) == b"six!"


@pytest.mark.parametrize("window,page", [(-1, 0), (1024, 0), (0, -1), (0, 64)])
def test_bar1_map_out_of_range_is_refused(gpu, window, page):
    with pytest.raises(ValueError, match="out of range"):
        gpu.bar1_map(window, page)
    assert gpu.bar1_ptes == {}


def test_vidmem_is_committed_lazily_and_large_gpus_are_cheap(m):
    """A 16 GiB GPU costs nothing until its memory is touched."""
    big = NvGpu(m)
    assert big._vidmem is None
    big.vidmem_write(big.config.mem_size - 4, b"last")
    assert big.vidmem_read(big.config.mem_size - 4, 4) == b"last"


# -- the leak check ---------------------------------------------------------------------------
def test_a_window_still_mapped_is_a_leak(m, gpu):
    gpu.bar1_map(0, 1)
    gpu.bar1_map(1, 2)
    leaks = find_leaks(m)
    assert any("2 BAR1 window(s) still mapped" in line and gpu.name in line for line in leaks)
    gpu.bar1_unmap(0)
    gpu.bar1_unmap(1)
    assert not any("BAR1" in line for line in find_leaks(m))


def test_the_leak_check_is_registered_once_per_machine(m, gpu):
    NvGpu(m, GpuConfig(mem_size=P, bar1_size=64 * MiB))
    assert sum(getattr(c, "__module__", "") == "kernel_model.hw.nvgpu"
               for c in m.leak_checks) == 1


def _accounted(addr: int) -> bool | None:
    """Does the host count the mapping at addr against its commit limit (smaps' VmFlags
    "ac")?  None when the mapping is not found."""
    cur = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                cur = lo <= addr < hi
            elif line.startswith("VmFlags") and cur:
                return " ac" in line
    return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_vidmem_and_ram_commit_nothing_until_touched(m: Machine):
    """A 16 GiB VRAM and the machine's RAM are MAP_NORESERVE mappings (c_ext.anon_map):
    a process holding a few GPU machines can still fork (the explorer's workers).
    Python 3.11's mmap module has no MAP_NORESERVE; without the value passed by hand
    each GPU committed its whole VRAM."""
    assert c_ext.MAP_NORESERVE == 0x4000
    gpu = NvGpu(m, GpuConfig())                         # the default board: 16 GiB
    vid = gpu.vidmem
    assert len(vid) == gpu.config.mem_size == 16 << 30
    vid[5 << 30] = 7                                    # one page of it, touched
    addr = c_ext.ffi.cast("uintptr_t", c_ext.ffi.from_buffer(vid))
    assert _accounted(int(addr)) is False
    ram = c_ext.ffi.cast("uintptr_t", c_ext.ffi.from_buffer(m.mem.ram))
    assert _accounted(int(ram)) is False
