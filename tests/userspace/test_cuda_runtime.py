"""Tests for userspace/cuda/runtime.py: the CUDA calls a GPUDirect program makes, over
the emulated nvidia driver.

What is asserted is what a CUDA programmer sees: cudaMalloc's 64 KiB-aligned
unified address that the CPU cannot touch and gup cannot pin, the bytes
cudaMemcpy moves (also across GPU pages that are not adjacent in vidmem),
the pointer attributes a third party needs (buffer ID, P2P tokens, range),
and the errno of every failing call.
"""

from __future__ import annotations

import errno

import pytest

from c_ext import U64Array
from kernel_model.emu.process import SegmentationFault
from kernel_model.errno import KernelError
from kernel_model.gup import FOLL_WRITE, pin_user_pages_fast
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE, GpuConfig
from kernel_model.mm import VM_IO, VM_PFNMAP
from tests.nvidia_host import gpu_host, nvdev
from userspace.cuda.runtime import (
    CU_MEMORYTYPE_DEVICE,
    CU_POINTER_ATTRIBUTE_BUFFER_ID,
    CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    CU_POINTER_ATTRIBUTE_P2P_TOKENS,
    CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    CU_POINTER_ATTRIBUTE_SYNC_MEMOPS,
    CudaError,
    cudaMemcpyDeviceToHost,
    cudaMemcpyHostToDevice,
    cudart,
)
from userspace.libc import SysError

MiB = 1 << 20
P = GPU_PAGE_SIZE


@pytest.fixture
def m():
    return gpu_host()


@pytest.fixture
def p(m):
    p = m.spawn("app")
    yield p
    if p.alive:
        p.exit(0)


@pytest.fixture
def cuda(p):
    return cudart(p)


def host_buf(p, n: int, fill: bytes = b"") -> int:
    """An anonymous host buffer of n bytes (optionally filled)."""
    a = p.mmap(0, -(-n // 4096) * 4096)
    assert a > 0
    if fill:
        p.store(a, fill)
    return a


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


# -- cudart / cudaMalloc -------------------------------------------------------------------------
def test_cudart_is_one_runtime_per_process_and_device(p, cuda):
    assert cudart(p) is cuda and cuda.fd >= 0
    assert cuda.proc is p and cuda.device == 0


def test_cudart_on_a_missing_device_fails_with_enoent(p):
    with pytest.raises(CudaError) as e:
        cudart(p, device=1)
    assert e.value.errno == errno.ENOENT and "cuInit" in str(e.value)


def test_cudart_after_close_opens_a_new_context(p, cuda):
    cuda.close()
    assert cuda.fd == -1
    again = cudart(p)
    assert again is not cuda and again.fd >= 0


def test_cudamalloc_returns_64k_aligned_non_overlapping_addresses(p, cuda):
    sizes = [1, P, P + 1, 3 * MiB + 5]
    vas = [cuda.cudaMalloc(n) for n in sizes]
    spans = sorted((va, va + -(-n // P) * P) for va, n in zip(vas, sizes, strict=True))
    assert all(va % P == 0 for va in vas)
    assert all(a_end <= b for (_, a_end), (b, _) in zip(spans, spans[1:], strict=False))
    for va in vas:
        cuda.cudaFree(va)


def test_cudamalloc_maps_a_vm_io_pfnmap_vma_of_whole_gpu_pages(p, cuda):
    va = cuda.cudaMalloc(P + 1)
    vma = p.mm.find_vma(va)
    assert (vma.vm_start, vma.vm_end) == (va, va + 2 * P)
    assert vma.vm_flags & VM_IO and vma.vm_flags & VM_PFNMAP
    assert cuda.allocations == {va: 2 * P}
    cuda.cudaFree(va)
    assert p.mm.find_vma(va) is None or p.mm.find_vma(va).vm_start > va
    assert cuda.allocations == {}


def test_cpu_load_and_store_to_device_memory_fault(p, cuda):
    va = cuda.cudaMalloc(P)
    with pytest.raises(SegmentationFault):
        p.load(va, 1)
    with pytest.raises(SegmentationFault):
        p.store(va + 100, b"x")
    cuda.cudaFree(va)


def test_gup_cannot_pin_device_memory(p, cuda):
    """pin_user_pages_fast refuses the VM_IO|VM_PFNMAP VMA: EFAULT, nothing pinned."""
    va = cuda.cudaMalloc(P)
    pfns = U64Array(1)
    with p.kernel(), pytest.raises(KernelError) as e:
        pin_user_pages_fast(va, 1, FOLL_WRITE, pfns)
    assert e.value.errno == errno.EFAULT and "VM_IO|VM_PFNMAP" in str(e.value)
    cuda.cudaFree(va)


def test_cudamalloc_zero_bytes_is_einval(p, cuda):
    with pytest.raises(CudaError) as e:
        cuda.cudaMalloc(0)
    assert e.value.errno == errno.EINVAL and cuda.allocations == {}


def test_cudamalloc_when_the_gpu_is_full_is_enomem_and_works_after_a_free():
    m = gpu_host(gpu=GpuConfig(mem_size=MiB))        # 16 GPU pages
    p = m.spawn("app")
    cuda = cudart(p)
    va = cuda.cudaMalloc(MiB)
    assert len(nvdev(m).free_pages) == 0
    with pytest.raises(CudaError) as e:
        cuda.cudaMalloc(1)
    assert e.value.errno == errno.ENOMEM and "cudaMalloc" in str(e.value)
    cuda.cudaFree(va)
    with pytest.raises(CudaError) as e:
        cuda.cudaMalloc(MiB + 1)                    # more than the whole GPU
    assert e.value.errno == errno.ENOMEM
    va = cuda.cudaMalloc(MiB)
    cuda.cudaFree(va)
    assert len(nvdev(m).free_pages) == 16
    p.exit(0)


# -- cudaFree ----------------------------------------------------------------------------------
def test_cudafree_returns_the_pages(m, p, cuda):
    dev = nvdev(m)
    total = len(dev.free_pages)
    va = cuda.cudaMalloc(5 * P - 1)
    assert len(dev.free_pages) == total - 5
    cuda.cudaFree(va)
    assert len(dev.free_pages) == total


def test_cudafree_of_a_pointer_not_from_cudamalloc_is_einval(p, cuda):
    va = cuda.cudaMalloc(2 * P)
    for bad in (va + P, va + 1, 0x1000):
        with pytest.raises(CudaError) as e:
            cuda.cudaFree(bad)
        assert e.value.errno == errno.EINVAL
    cuda.cudaFree(va)


def test_cudafree_twice_is_einval(p, cuda):
    va = cuda.cudaMalloc(P)
    cuda.cudaFree(va)
    with pytest.raises(CudaError) as e:
        cuda.cudaFree(va)
    assert e.value.errno == errno.EINVAL


def test_process_exit_returns_the_pages_of_what_it_did_not_free(m, p, cuda):
    dev = nvdev(m)
    total = len(dev.free_pages)
    cuda.cudaMalloc(MiB)
    cuda.cudaMalloc(P)
    assert len(dev.free_pages) == total - 17 and len(dev.clients) == 1
    p.exit(0)
    assert len(dev.free_pages) == total and dev.clients == []


def test_close_frees_what_is_left_and_unmaps_the_addresses(m, p, cuda):
    dev = nvdev(m)
    total = len(dev.free_pages)
    va = cuda.cudaMalloc(MiB)
    cuda.close()
    assert len(dev.free_pages) == total and dev.clients == []
    assert p.mm.find_vma(va) is None or p.mm.find_vma(va).vm_start >= va + MiB


# -- cudaMemcpy -------------------------------------------------------------------------------
def test_memcpy_round_trip(p, cuda):
    va = cuda.cudaMalloc(P)
    data = pattern(5000)
    src, dst = host_buf(p, 5000, data), host_buf(p, 5000)
    cuda.cudaMemcpy(va, src, 5000, cudaMemcpyHostToDevice)
    cuda.cudaMemcpy(dst, va, 5000, cudaMemcpyDeviceToHost)
    assert p.load(dst, 5000) == data
    cuda.cudaFree(va)


def test_memcpy_lands_at_the_gpu_physical_address_of_each_page(m, p, cuda):
    """A copy across GPU pages that are not adjacent in vidmem: each piece goes to its
    own page (the allocation below reuses a freed page, then takes fresh ones)."""
    dev = nvdev(m)
    a = cuda.cudaMalloc(P)
    b = cuda.cudaMalloc(P)
    c = cuda.cudaMalloc(P)
    cuda.cudaFree(b)
    va = cuda.cudaMalloc(3 * P)
    mem = dev.clients[0].lookup(va)
    assert mem.pages[1] != mem.pages[0] + 1          # not contiguous in vidmem
    n = P + 100                                      # 50 + P + 50 bytes
    data = pattern(n, 3)
    src, dst = host_buf(p, n, data), host_buf(p, n)
    cuda.cudaMemcpy(va + P - 50, src, n, cudaMemcpyHostToDevice)
    gpu = dev.gpu
    assert gpu.vidmem_read(mem.pages[0] * P + P - 50, 50) == data[:50]
    assert gpu.vidmem_read(mem.pages[1] * P, P) == data[50:50 + P]
    assert gpu.vidmem_read(mem.pages[2] * P, 50) == data[50 + P:]
    cuda.cudaMemcpy(dst, va + P - 50, n, cudaMemcpyDeviceToHost)
    assert p.load(dst, n) == data
    for v in (a, c, va):
        cuda.cudaFree(v)


def test_new_allocations_read_back_zeros(p, cuda):
    """RM scrubs vidmem before handing it out: no data from the previous owner."""
    va = cuda.cudaMalloc(P)
    src = host_buf(p, P, b"\xaa" * P)
    cuda.cudaMemcpy(va, src, P, cudaMemcpyHostToDevice)
    cuda.cudaFree(va)
    va2 = cuda.cudaMalloc(P)
    dst = host_buf(p, P)
    cuda.cudaMemcpy(dst, va2, P, cudaMemcpyDeviceToHost)
    assert p.load(dst, P) == bytes(P)
    cuda.cudaFree(va2)


def test_memcpy_of_zero_bytes_is_allowed(p, cuda):
    va = cuda.cudaMalloc(P)
    buf = host_buf(p, 8, b"unchanged")
    cuda.cudaMemcpy(buf, va, 0, cudaMemcpyDeviceToHost)
    assert p.load(buf, 9) == b"unchanged"
    cuda.cudaFree(va)


@pytest.mark.parametrize("kind", [cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost])
def test_memcpy_beyond_the_allocation_is_einval(p, cuda, kind):
    va = cuda.cudaMalloc(2 * P)
    buf = host_buf(p, 2 * P + 4096)
    args = (va + P, buf) if kind == cudaMemcpyHostToDevice else (buf, va + P)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(*args, P + 1, kind)
    assert e.value.errno == errno.EINVAL
    assert p.task.last_error.message.startswith("nvidia_ioctl: MEMCPY")
    cuda.cudaFree(va)


def test_memcpy_spanning_two_allocations_is_einval(p, cuda):
    a = cuda.cudaMalloc(P)
    b = cuda.cudaMalloc(P)
    lo = min(a, b)
    buf = host_buf(p, 2 * P)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(lo + P - 8, buf, 16, cudaMemcpyHostToDevice)
    assert e.value.errno == errno.EINVAL
    cuda.cudaFree(a)
    cuda.cudaFree(b)


def test_memcpy_with_a_host_pointer_as_device_is_einval(p, cuda):
    buf = host_buf(p, 4096)
    other = host_buf(p, 4096)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(buf, other, 16, cudaMemcpyHostToDevice)
    assert e.value.errno == errno.EINVAL


def test_memcpy_to_freed_memory_is_einval(p, cuda):
    va = cuda.cudaMalloc(P)
    buf = host_buf(p, 16)
    cuda.cudaFree(va)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(va, buf, 16, cudaMemcpyHostToDevice)
    assert e.value.errno == errno.EINVAL


@pytest.mark.parametrize("kind", [cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost])
def test_memcpy_with_a_bad_host_pointer_is_efault(p, cuda, kind):
    va = cuda.cudaMalloc(P)
    bad = 0x1000                                     # nothing mapped there
    args = (va, bad) if kind == cudaMemcpyHostToDevice else (bad, va)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(*args, 64, kind)
    assert e.value.errno == errno.EFAULT
    assert "bad host" in p.task.last_error.message
    cuda.cudaFree(va)


def test_memcpy_device_to_host_into_device_memory_is_efault(p, cuda):
    """The 'host' side is copy_to_user: another allocation's VA is not host memory."""
    a = cuda.cudaMalloc(P)
    b = cuda.cudaMalloc(P)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(b, a, 64, cudaMemcpyDeviceToHost)
    assert e.value.errno == errno.EFAULT
    cuda.cudaFree(a)
    cuda.cudaFree(b)


@pytest.mark.parametrize("kind", [0, 3, 4])
def test_memcpy_with_an_unknown_kind_is_einval(p, cuda, kind):
    va = cuda.cudaMalloc(P)
    buf = host_buf(p, 64)
    with pytest.raises(CudaError) as e:
        cuda.cudaMemcpy(va, buf, 64, kind)
    assert e.value.errno == errno.EINVAL
    assert f"kind {kind}" in p.task.last_error.message
    cuda.cudaFree(va)


# -- pointer attributes ------------------------------------------------------------------------
def test_memory_type_is_device(p, cuda):
    va = cuda.cudaMalloc(P)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, va + 5) == \
        CU_MEMORYTYPE_DEVICE
    cuda.cudaFree(va)


def test_buffer_ids_are_unique_and_never_reused(m, p, cuda):
    """A freed allocation's ID is not handed out again, even at the same address."""
    q = m.spawn("other")
    cq = cudart(q)
    seen = []
    for _ in range(3):
        va = cuda.cudaMalloc(P)
        seen.append(cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, va))
        vq = cq.cudaMalloc(P)
        seen.append(cq.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, vq))
        cuda.cudaFree(va)
        cq.cudaFree(vq)
    assert len(set(seen)) == len(seen) and all(i > 0 for i in seen)
    assert seen == sorted(seen)
    q.exit(0)


def test_buffer_id_is_the_same_anywhere_in_the_allocation(p, cuda):
    va = cuda.cudaMalloc(3 * P)
    ids = {cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, a)
           for a in (va, va + P + 7, va + 3 * P - 1)}
    assert len(ids) == 1
    cuda.cudaFree(va)


def test_p2p_tokens_are_per_context(m, p, cuda):
    """Every allocation of one context shows its tokens; another process's differ."""
    a = cuda.cudaMalloc(P)
    b = cuda.cudaMalloc(P)
    ta = cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, a)
    tb = cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, b)
    assert ta == tb and ta[0] != 0 and ta[1] != 0
    q = m.spawn("other")
    cq = cudart(q)
    c = cq.cudaMalloc(P)
    tc = cq.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, c)
    assert tc[0] != ta[0] and tc[1] != ta[1]
    q.exit(0)
    cuda.cudaFree(a)
    cuda.cudaFree(b)


def test_address_range_is_the_allocation_start_and_requested_size(p, cuda):
    va = cuda.cudaMalloc(100000)
    for inside in (va, va + 99999, va + 50000):
        assert cuda.cuMemGetAddressRange(inside) == (va, 100000)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, va + 7) == va
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_RANGE_SIZE, va + 7) == 100000
    cuda.cudaFree(va)


def test_sync_memops_defaults_off_and_can_be_set_per_allocation(p, cuda):
    a = cuda.cudaMalloc(P)
    b = cuda.cudaMalloc(P)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a) == 0
    cuda.cuPointerSetAttribute(1, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a + 100)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a) == 1
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, b) == 0
    cuda.cuPointerSetAttribute(0, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, a) == 0
    cuda.cudaFree(a)
    cuda.cudaFree(b)


@pytest.mark.parametrize("attr", [0, 1, 3, 99])
def test_get_of_an_unknown_attribute_is_einval(p, cuda, attr):
    va = cuda.cudaMalloc(P)
    with pytest.raises(CudaError) as e:
        cuda.cuPointerGetAttribute(attr, va)
    assert e.value.errno == errno.EINVAL and "cuPointerGetAttribute" in str(e.value)
    cuda.cudaFree(va)


@pytest.mark.parametrize("attr", [CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                  CU_POINTER_ATTRIBUTE_P2P_TOKENS,
                                  CU_POINTER_ATTRIBUTE_MEMORY_TYPE, 99])
def test_set_of_anything_but_sync_memops_is_einval(p, cuda, attr):
    va = cuda.cudaMalloc(P)
    with pytest.raises(CudaError) as e:
        cuda.cuPointerSetAttribute(1, attr, va)
    assert e.value.errno == errno.EINVAL
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, va) == 0
    cuda.cudaFree(va)


def test_attributes_of_a_host_pointer_are_einval(p, cuda):
    buf = host_buf(p, 64)
    for attr in (CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_P2P_TOKENS):
        with pytest.raises(CudaError) as e:
            cuda.cuPointerGetAttribute(attr, buf)
        assert e.value.errno == errno.EINVAL
    with pytest.raises(CudaError) as e:
        cuda.cuPointerSetAttribute(1, CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, buf)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(CudaError) as e:
        cuda.cuMemGetAddressRange(buf)
    assert e.value.errno == errno.EINVAL


def test_attributes_of_freed_memory_are_einval(p, cuda):
    va = cuda.cudaMalloc(P)
    cuda.cudaFree(va)
    with pytest.raises(CudaError) as e:
        cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, va)
    assert e.value.errno == errno.EINVAL


def test_attributes_of_another_contexts_memory_are_einval(m, p, cuda):
    """A unified address is looked up in the caller's own context only."""
    q = m.spawn("other")
    cq = cudart(q)
    vq = cq.cudaMalloc(P)
    with pytest.raises(CudaError) as e:
        cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, vq)
    assert e.value.errno == errno.EINVAL
    q.exit(0)


def test_cuda_error_is_a_syserror_with_the_call_named(p, cuda):
    with pytest.raises(SysError) as e:
        cuda.cudaFree(0x10000)
    assert isinstance(e.value, CudaError) and isinstance(e.value, OSError)
    assert "cudaFree" in str(e.value)
