"""Tests for drivers/amdgpu (/dev/kfd's memory ioctls) and kfd_rdma.py (amd_rdma_interface).

Asserted: every errno of the two ioctls and of mmap, what a buffer is (its
pages cleared, its BAR0 windows mapped while it lives), the third-party
calls' results and errno, and run_rdma_free_callback's order - every free
callback first, then every pin still linked released - under the process's
mutex.
"""

from __future__ import annotations

import errno
import struct

import pytest

from drivers.amdgpu.kfd_rdma import (
    amdkfd_query_rdma_interface,
    get_page_size,
    get_pages,
    is_gpu_address,
    put_pages,
)
from kernel_model.current import current
from kernel_model.emu.platform import rdma_host
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE
from kernel_model.locking import mutex_is_locked
from kernel_model.uapi import kfd as uapi
from userspace.hip.runtime import FIRST_GPU_ID, HipError, hiprt

MiB = 1 << 20


@pytest.fixture
def m():
    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("amdgpu")
    return m


def test_hipmalloc_gives_cleared_vram_behind_mapped_bar0_windows(m):
    p = m.spawn("app")
    hip = hiprt(p)
    d = hip.hipMalloc(100 << 10)                      # two 64 KiB pages
    assert d % GPU_PAGE_SIZE == 0
    gpu = m.gpus[0]
    assert gpu.pdev.vendor == 0x1002 and gpu.windows_mapped() == 2
    (vma,) = [v for v in p.mm.vmas if v.vm_start == d]
    assert vma.vm_end - d == 2 * GPU_PAGE_SIZE
    hip.hipFree(d)
    assert gpu.windows_mapped() == 0
    p.exit(0)


def _alloc(p, hip, va: int, size: int, gpu_id: int = FIRST_GPU_ID,
           flags: int = uapi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM) -> int:
    try:
        hip._ioctl(uapi.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU, uapi.KFD_ALLOC_FMT,
                   [va, size, 0, 0, gpu_id, flags], "alloc")
    except HipError as e:
        return e.errno
    return 0


def test_alloc_memory_of_gpu_errors(m):
    p = m.spawn("app")
    hip = hiprt(p)
    va = 0x7F0000000000
    assert _alloc(p, hip, va, GPU_PAGE_SIZE, gpu_id=0x42) == errno.EINVAL   # no such GPU
    assert _alloc(p, hip, va, GPU_PAGE_SIZE, flags=1 << 2) == errno.EINVAL  # not VRAM
    assert _alloc(p, hip, va, 0) == errno.EINVAL
    assert _alloc(p, hip, va, 4096) == errno.EINVAL                      # not 64 KiB pages
    assert _alloc(p, hip, va + 4096, GPU_PAGE_SIZE) == errno.EINVAL
    assert _alloc(p, hip, va, 512 * MiB) == errno.ENOMEM                 # more than VRAM
    assert _alloc(p, hip, va, GPU_PAGE_SIZE) == 0
    assert _alloc(p, hip, va, GPU_PAGE_SIZE) == errno.EINVAL             # the VA is taken
    assert m.gpus[0].windows_mapped() == 1
    p.exit(0)                            # the process's file closes: its buffer goes
    assert m.gpus[0].windows_mapped() == 0


def test_free_of_an_unknown_handle_is_einval_and_bad_ioctls_fail(m):
    p = m.spawn("app")
    hip = hiprt(p)
    with pytest.raises(HipError) as ei:
        hip._ioctl(uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU, uapi.KFD_FREE_FMT, [99], "free")
    assert ei.value.errno == errno.EINVAL
    assert p.ioctl(hip.fd, 0xDEAD, 0) == -errno.ENOTTY
    assert p.ioctl(hip.fd, uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU, 0x10) == -errno.EFAULT
    with pytest.raises(HipError) as ei:
        hip.hipFree(0x1234)
    assert ei.value.errno == errno.EINVAL
    p.exit(0)


def test_mmap_binds_only_the_buffer_exactly(m):
    p = m.spawn("app")
    hip = hiprt(p)
    d = hip.hipMalloc(GPU_PAGE_SIZE)
    handle = hip.allocations[d][1]
    off = handle << m.page_shift
    # already bound, another address, an unknown offset: EINVAL
    assert p.mmap(d + 16 * GPU_PAGE_SIZE, GPU_PAGE_SIZE, 3, 0x01, hip.fd, off) == -errno.EINVAL
    assert p.mmap(0, GPU_PAGE_SIZE, 3, 0x01, hip.fd, 77 << m.page_shift) == -errno.EINVAL
    hip.hipFree(d)
    p.exit(0)


def test_rdma_interface_lookups_and_their_errors(m):
    p = m.spawn("app")
    hip = hiprt(p)
    d = hip.hipMalloc(2 * GPU_PAGE_SIZE)
    other = m.spawn("other")
    with p.kernel():
        me = current()
        assert is_gpu_address(d, me) == 1 and is_gpu_address(d + 2 * GPU_PAGE_SIZE, me) == 0
        ps = [0]
        assert get_page_size(d, GPU_PAGE_SIZE, me, ps) == 0 and ps[0] == m.page_size
        out: list = [None]
        assert get_pages(d, 0, me, out, None, None) == -errno.EINVAL          # length 0
        assert get_pages(d, 3 * GPU_PAGE_SIZE, me, out, None, None) == -errno.EINVAL
        assert put_pages([None]) == -errno.EINVAL
        assert out == [None]
    with other.kernel():                 # a process with no kfd_process
        assert is_gpu_address(d, current()) == 0
        assert get_pages(d, 4096, current(), [None], None, None) == -errno.EINVAL
    with p.kernel():
        assert get_pages(d + 4096, 8192, me, out, None, None) == 0
        info = out[0]
        assert info.va == d + 4096 and info.pages.nents == 2
        bo = info.priv
        assert [info.pages.dma_addr.view[i] for i in range(2)] == \
            [bo.bus_address(d + 4096), bo.bus_address(d + 8192)]
        assert put_pages(out) == 0 and out == [None]
        assert bo.cb_data_head == []
    hip.hipFree(d)
    other.exit(0)
    p.exit(0)


def test_free_runs_every_callback_then_releases_the_pins_left(m):
    p = m.spawn("app")
    hip = hiprt(p)
    d = hip.hipMalloc(GPU_PAGE_SIZE)
    seen = []
    pins: list = [[None], [None]]

    def callback(which):
        kp = m.modules["amdgpu"].state.processes[0]
        seen.append((which, mutex_is_locked(kp.mutex), len(kp.bos[1].cb_data_head)))
        if which == 0:
            assert put_pages(pins[0]) == 0   # the first client unpins from its callback
    with p.kernel():
        for i in range(2):
            assert get_pages(d, 4096, current(), pins[i], callback, i) == 0
    hip.hipFree(d)
    # both callbacks, in order, with the mutex held; the second still saw its pin
    assert seen == [(0, True, 2), (1, True, 1)]
    assert m.gpus[0].windows_mapped() == 0
    p.exit(0)


def test_query_rdma_interface_without_amdgpu_is_einval():
    m = rdma_host(ram_size=64 * MiB, modules=())
    with m.kernel():
        out: list = [None]
        assert amdkfd_query_rdma_interface(out) == -errno.EINVAL and out == [None]


def test_ioctl_struct_sizes_are_the_uapi_ones():
    assert struct.calcsize(uapi.KFD_ALLOC_FMT) == 40
    assert uapi.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU == 0xC0284B16
    assert uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU == 0x40084B17


def test_a_buffer_mapping_cannot_be_split(m):
    p = m.spawn("app")
    hip = hiprt(p)
    d = hip.hipMalloc(2 * GPU_PAGE_SIZE)
    assert p.munmap(d, GPU_PAGE_SIZE) == -errno.EINVAL        # half of it
    (bo,) = m.modules["amdgpu"].state.processes[0].bos.values()
    assert bo.bound
    hip.hipFree(d)
    assert not bo.bound
    p.exit(0)
