"""Tests for drivers/nvidia/__init__.py, nv.py and rm.py: the nvidia module, its
/dev/nvidiaN (open, the ioctl escapes, mmap of an allocation) and RM's video
memory allocations.

Driven through the raw system calls where the CUDA runtime would hide the
errno (mmap of a wrong length, an unaligned address, an unknown handle, an
unknown escape), and through userspace/cuda where the runtime is the natural
caller.  The nv-p2p API has its own file (test_nv_p2p.py).
"""

from __future__ import annotations

import errno
import struct

import pytest

from drivers.nvidia import DEFAULT_RELEASE, parse_release
from drivers.nvidia.rm import rm_free_memory
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE, GpuConfig
from kernel_model.mm import MAP_FIXED, MAP_SHARED, PROT_NONE, PROT_READ, PROT_WRITE
from kernel_model.trace import Tracer
from kernel_model.uapi import nvidia as uapi
from tests.nvidia_host import gpu_host, nvdev
from userspace.cuda.runtime import (
    CU_POINTER_ATTRIBUTE_BUFFER_ID,
    CudaError,
    cudaMemcpyDeviceToHost,
    cudaMemcpyHostToDevice,
    cudart,
)
from userspace.libc import O_RDWR

MiB = 1 << 20
P = GPU_PAGE_SIZE
RW = PROT_READ | PROT_WRITE


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
def fd(p):
    fd = p.open("/dev/nvidia0", O_RDWR)
    assert fd >= 0
    return fd


def scratch(p, n: int = 4096) -> int:
    a = p.mmap(0, n)
    assert a > 0
    return a


def escape(p, fd: int, cmd: int, fmt: str, *fields: int):
    """One ioctl escape: (return value, the struct as the driver left it)."""
    buf = scratch(p)
    p.store(buf, struct.pack(fmt, *fields))
    ret = p.ioctl(fd, cmd, buf)
    out = struct.unpack(fmt, p.load(buf, struct.calcsize(fmt)))
    p.munmap(buf, 4096)
    return ret, out


def alloc(p, fd: int, size: int) -> int:
    """ALLOC_MEMORY: the mmap offset of a new, unbound allocation."""
    ret, (_size, offset) = escape(p, fd, uapi.NV_ESC_ALLOC_MEMORY, uapi.NV_ALLOC_FMT, size, 0)
    assert ret == 0
    return offset


def aligned_hole(p, length: int) -> int:
    """A free, 64 KiB-aligned address with `length` bytes of room (as cudaMalloc finds)."""
    hole = p.mmap(0, length + P, PROT_NONE)
    assert hole > 0
    assert p.munmap(hole, length + P) == 0
    return -(-hole // P) * P


def bind(p, fd: int, offset: int, length: int, addr: int | None = None) -> int:
    """mmap the allocation at `offset` (MAP_FIXED at `addr`, aligned by default)."""
    addr = aligned_hole(p, length) if addr is None else addr
    return p.mmap(addr, length, RW, MAP_SHARED | MAP_FIXED, fd, offset)


# -- the module ---------------------------------------------------------------------------------
def test_load_probes_every_gpu_and_creates_its_device_file():
    m = gpu_host(nr_gpus=2)
    state = m.modules["nvidia"].state
    assert [d.minor for d in state.devices] == [0, 1]
    assert [d.gpu for d in state.devices] == m.gpus
    assert "/dev/nvidia0" in m.chrdevs and "/dev/nvidia1" in m.chrdevs
    assert all(d.pdev.dev.driver_data is d for d in state.devices)
    assert state.nv_queue.name == "nv_queue"


def test_load_without_gpus_registers_no_device():
    m = gpu_host(nr_gpus=0)
    assert m.modules["nvidia"].state.devices == []
    assert not any(path.startswith("/dev/nvidia") for path in m.chrdevs)


def test_default_release_and_the_release_parameter():
    assert DEFAULT_RELEASE == "580.65.06"
    assert nvdev(gpu_host()).release == (580, 65, 6)
    assert nvdev(gpu_host(release="525.60.13")).release == (525, 60, 13)
    assert parse_release("535.104.05") == (535, 104, 5)
    assert parse_release("550.54") == (550, 54, 0)


@pytest.mark.parametrize("release", ["580", "abc.def", "", "r535.104"])
def test_a_malformed_release_fails_the_load_with_einval(release):
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, modules=())
    with pytest.raises(KernelError) as e:
        m.load_module("nvidia", release=release)
    assert e.value.errno == errno.EINVAL and "BRANCH.BUILD" in str(e.value)
    assert "nvidia" not in m.modules and "/dev/nvidia0" not in m.chrdevs


def test_an_unknown_module_parameter_fails_the_load():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, modules=())
    with pytest.raises(KernelError) as e:
        m.load_module("nvidia", relase="580.65.06")
    assert e.value.errno == errno.ENOENT and "nvidia" not in m.modules


def test_unload_is_ebusy_while_the_device_file_is_open(m, p, fd):
    with pytest.raises(KernelError) as e:
        m.unload_module("nvidia")
    assert e.value.errno == errno.EBUSY
    assert p.close(fd) == 0
    m.unload_module("nvidia")
    assert "nvidia" not in m.modules and "/dev/nvidia0" not in m.chrdevs


def test_load_traces_probe_per_gpu():
    m = rdma_host(ram_size=64 << 20, nr_gpus=2, modules=())
    with Tracer() as t:
        m.load_module("nvidia")
    funcs = [c.func for c in t.trace.calls()]
    assert funcs.count("probe") == 2 and funcs.count("cdev_add") == 2
    assert funcs.index("pci_register_driver") < funcs.index("probe")


# -- open: one client per open ----------------------------------------------------------------
def test_each_open_is_a_client_with_its_own_va_space_and_token(m, p):
    dev = nvdev(m)
    q = m.spawn("other")
    fds = [p.open("/dev/nvidia0", O_RDWR), p.open("/dev/nvidia0", O_RDWR),
           q.open("/dev/nvidia0", O_RDWR)]
    assert all(f >= 0 for f in fds)
    assert len(dev.clients) == 3
    assert len({c.va_space for c in dev.clients}) == 3
    assert len({c.p2p_token for c in dev.clients}) == 3
    assert all(c.p2p_token & 1 for c in dev.clients)        # never 0
    assert [c.mm for c in dev.clients] == [p.mm, p.mm, q.mm]
    p.close(fds[0])
    assert len(dev.clients) == 2
    q.exit(0)
    assert len(dev.clients) == 1


# -- ioctl ------------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd", [0, 0xDEAD, uapi.NV_ESC_ALLOC_MEMORY + 0x100])
def test_unknown_escape_is_enotty(p, fd, cmd):
    buf = scratch(p)
    assert p.ioctl(fd, cmd, buf) == -errno.ENOTTY
    assert p.task.last_error.function == "nvidia_ioctl"


def test_escape_with_a_bad_argument_pointer_is_efault(m, p, fd):
    assert p.ioctl(fd, uapi.NV_ESC_ALLOC_MEMORY, 0x1000) == -errno.EFAULT
    assert nvdev(m).clients[0].memory == {}


def test_alloc_returns_a_page_aligned_mmap_offset_per_allocation(m, p, fd):
    a, b = alloc(p, fd, P), alloc(p, fd, 3 * P)
    assert a % m.page_size == 0 and b % m.page_size == 0 and a != b
    client = nvdev(m).clients[0]
    mems = {h << m.page_shift: mem for h, mem in client.memory.items()}
    assert mems[a].size == P and mems[b].size == 3 * P
    assert mems[a].va == 0 and mems[b].va == 0             # unbound until mmap


def test_alloc_of_zero_bytes_is_einval(m, p, fd):
    ret, _ = escape(p, fd, uapi.NV_ESC_ALLOC_MEMORY, uapi.NV_ALLOC_FMT, 0, 0)
    assert ret == -errno.EINVAL
    assert nvdev(m).clients[0].memory == {}


def test_alloc_places_whole_pages_lowest_free_first(m, p, fd):
    dev = nvdev(m)
    alloc(p, fd, 2 * P + 1)
    alloc(p, fd, 1)
    mems = list(dev.clients[0].memory.values())
    assert mems[0].pages == [0, 1, 2] and mems[1].pages == [3]
    assert mems[0].size == 3 * P


def test_alloc_beyond_the_free_pages_is_enomem_with_nothing_taken(p):
    m = p.machine
    dev = nvdev(m)
    free = len(dev.free_pages)
    fd = p.open("/dev/nvidia0", O_RDWR)
    ret, _ = escape(p, fd, uapi.NV_ESC_ALLOC_MEMORY, uapi.NV_ALLOC_FMT, (free + 1) * P, 0)
    assert ret == -errno.ENOMEM
    assert len(dev.free_pages) == free and dev.clients[0].memory == {}


def test_free_escape_needs_the_start_of_a_bound_allocation(m, p, fd):
    off = alloc(p, fd, 2 * P)
    va = bind(p, fd, off, 2 * P)
    for bad in (va + P, va + 8, 0):
        ret, _ = escape(p, fd, uapi.NV_ESC_FREE_MEMORY, uapi.NV_FREE_FMT, bad)
        assert ret == -errno.EINVAL
    assert "not the start of an allocation" in p.task.last_error.message
    ret, _ = escape(p, fd, uapi.NV_ESC_FREE_MEMORY, uapi.NV_FREE_FMT, va)
    assert ret == 0
    ret, _ = escape(p, fd, uapi.NV_ESC_FREE_MEMORY, uapi.NV_FREE_FMT, va)
    assert ret == -errno.EINVAL                               # twice


def test_free_escape_of_another_clients_allocation_is_einval(m, p):
    """Allocations belong to the open file: another open of the same GPU cannot free them."""
    cuda = cudart(p)
    va = cuda.cudaMalloc(P)
    fd2 = p.open("/dev/nvidia0", O_RDWR)
    ret, _ = escape(p, fd2, uapi.NV_ESC_FREE_MEMORY, uapi.NV_FREE_FMT, va)
    assert ret == -errno.EINVAL
    cuda.cudaFree(va)
    p.close(fd2)


def test_rm_free_memory_twice_is_einval(m, p):
    cuda = cudart(p)
    va = cuda.cudaMalloc(P)
    mem = nvdev(m).clients[0].lookup(va)
    cuda.cudaFree(va)
    with p.kernel(), pytest.raises(KernelError) as e:
        rm_free_memory(mem)
    assert e.value.errno == errno.EINVAL and "already freed" in str(e.value)


# -- mmap ------------------------------------------------------------------------------------
def test_mmap_binds_the_unified_address(m, p, fd):
    off = alloc(p, fd, 2 * P)
    va = bind(p, fd, off, 2 * P)
    assert va > 0 and va % P == 0
    mem = nvdev(m).clients[0].lookup(va)
    assert mem is not None and mem.va == va
    assert nvdev(m).clients[0].lookup(va + 2 * P - 1) is mem
    assert nvdev(m).clients[0].lookup(va + 2 * P) is None


@pytest.mark.parametrize("length", [P // 2, P, 3 * P])
def test_mmap_of_a_length_other_than_the_allocations_is_einval(m, p, fd, length):
    off = alloc(p, fd, 2 * P)
    assert bind(p, fd, off, length) == -errno.EINVAL
    assert "length" in p.task.last_error.message
    assert all(mem.va == 0 for mem in nvdev(m).clients[0].memory.values())


def test_mmap_at_an_address_not_64k_aligned_is_einval(m, p, fd):
    off = alloc(p, fd, P)
    addr = aligned_hole(p, 2 * P) + 4096
    assert bind(p, fd, off, P, addr) == -errno.EINVAL
    assert "not 64 KiB aligned" in p.task.last_error.message


def test_mmap_of_an_unknown_handle_is_einval(m, p, fd):
    alloc(p, fd, P)
    assert bind(p, fd, 77 << m.page_shift, P) == -errno.EINVAL
    assert bind(p, fd, 0, P) == -errno.EINVAL
    assert "not an unbound allocation" in p.task.last_error.message


def test_mmap_of_an_already_bound_handle_is_einval(m, p, fd):
    off = alloc(p, fd, P)
    va = bind(p, fd, off, P)
    assert va > 0
    assert bind(p, fd, off, P) == -errno.EINVAL
    assert nvdev(m).clients[0].lookup(va).va == va


def test_mmap_through_another_open_of_the_gpu_is_einval(m, p, fd):
    """The handle is the client's: another file of the same GPU does not know it."""
    off = alloc(p, fd, P)
    fd2 = p.open("/dev/nvidia0", O_RDWR)
    assert bind(p, fd2, off, P) == -errno.EINVAL
    p.close(fd2)


def test_partial_munmap_of_a_gpu_mapping_is_refused(m, p):
    cuda = cudart(p)
    va = cuda.cudaMalloc(3 * P)
    assert p.munmap(va, P) == -errno.EINVAL                   # head
    assert p.munmap(va + P, P) == -errno.EINVAL               # middle
    assert p.munmap(va + 2 * P, P) == -errno.EINVAL           # tail
    assert "cannot be split" in p.task.last_error.message
    vma = p.mm.find_vma(va)
    assert (vma.vm_start, vma.vm_end) == (va, va + 3 * P)
    assert cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, va + 2 * P) > 0
    cuda.cudaFree(va)


def test_munmap_unbinds_the_address_but_the_pages_stay_until_close(m, p):
    dev = nvdev(m)
    cuda = cudart(p)
    total = len(dev.free_pages)
    va = cuda.cudaMalloc(2 * P)
    assert p.munmap(va, 2 * P) == 0
    mem = next(iter(dev.clients[0].memory.values()))
    assert mem.va == 0 and len(dev.free_pages) == total - 2
    with pytest.raises(CudaError) as e:
        cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, va)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(CudaError) as e:
        cuda.cudaFree(va)                                     # FREE by an unbound address
    assert e.value.errno == errno.EINVAL
    cuda.close()
    assert len(dev.free_pages) == total and dev.clients == []


def test_an_unbound_allocation_can_be_bound_again_with_its_data(m, p, fd):
    off = alloc(p, fd, P)
    va = bind(p, fd, off, P)
    cuda = cudart(p)
    buf = scratch(p)
    p.store(buf, b"kept across munmap")
    ret, _ = escape(p, fd, uapi.NV_ESC_MEMCPY, uapi.NV_MEMCPY_FMT, va, buf, 18,
                    cudaMemcpyHostToDevice, 0)
    assert ret == 0
    assert p.munmap(va, P) == 0
    va2 = bind(p, fd, off, P)
    assert va2 > 0
    ret, _ = escape(p, fd, uapi.NV_ESC_MEMCPY, uapi.NV_MEMCPY_FMT, buf + 100, va2, 18,
                    cudaMemcpyDeviceToHost, 0)
    assert ret == 0 and p.load(buf + 100, 18) == b"kept across munmap"
    cuda.close()


def test_mmap_keeps_the_file_and_the_module_pinned(m, p, fd):
    """A bound allocation's VMA holds the file: close(fd) does not free the memory."""
    dev = nvdev(m)
    off = alloc(p, fd, P)
    va = bind(p, fd, off, P)
    assert p.close(fd) == 0
    assert len(dev.clients) == 1 and dev.clients[0].lookup(va) is not None
    with pytest.raises(KernelError):
        m.unload_module("nvidia")
    assert p.munmap(va, P) == 0                               # the last reference: release
    assert dev.clients == []


# -- memory accounting ------------------------------------------------------------------------
def test_pages_come_back_on_free_close_and_exit_per_process(m):
    dev = nvdev(m)
    total = len(dev.free_pages)
    a, b = m.spawn("a"), m.spawn("b")
    ca, cb = cudart(a), cudart(b)
    ca.cudaMalloc(MiB)
    vb = cb.cudaMalloc(2 * MiB)
    assert len(dev.free_pages) == total - 48
    a.exit(0)
    assert len(dev.free_pages) == total - 32
    assert cb.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, vb) > 0
    cb.cudaFree(vb)
    assert len(dev.free_pages) == total
    b.exit(0)


def test_two_gpus_have_separate_memory_and_files():
    m = gpu_host(nr_gpus=2, gpu=GpuConfig(mem_size=MiB))
    p = m.spawn("app")
    c0, c1 = cudart(p, 0), cudart(p, 1)
    v0 = c0.cudaMalloc(MiB)
    v1 = c1.cudaMalloc(MiB)                                   # GPU 0 is full, GPU 1 is not
    assert len(nvdev(m, 0).free_pages) == len(nvdev(m, 1).free_pages) == 0
    with pytest.raises(CudaError) as e:
        c0.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_BUFFER_ID, v1)
    assert e.value.errno == errno.EINVAL
    c0.cudaFree(v0)
    assert len(nvdev(m, 0).free_pages) == 16 and len(nvdev(m, 1).free_pages) == 0
    p.exit(0)
    assert len(nvdev(m, 1).free_pages) == 16


# -- unbind (nv_pci_remove) -----------------------------------------------------------------------
def test_unload_after_everything_is_freed_reports_nothing(m, p):
    cuda = cudart(p)
    cuda.cudaFree(cuda.cudaMalloc(MiB))
    cuda.close()
    m.unload_module("nvidia")
    assert m.bugs == [] and "nvidia" not in m.modules


def test_unload_with_a_persistent_pin_left_warns_in_nv_pci_remove(m, p):
    """A third party that never put its persistent mapping: the GPU's pages and the
    mapping outlive every client, and unbinding the driver WARNs about them."""
    from drivers.nvidia.nv_p2p import nvidia_p2p_get_pages_persistent
    from kernel_model.slab import kfree

    dev = nvdev(m)
    cuda = cudart(p)
    va = cuda.cudaMalloc(2 * P)
    with p.kernel():
        pt = nvidia_p2p_get_pages_persistent(va, 2 * P)
    info = dev.p2p_infos[id(pt)]
    p.exit(0)
    m.unload_module("nvidia")
    assert len(m.bugs) == 1
    assert m.bugs[0].startswith("WARNING: nv_pci_remove:")
    assert "0 clients, 2 GPU pages not freed, 1 P2P mappings left" in m.bugs[0]
    m.bugs.clear()
    # what the leaked pin still holds, released by hand so the leak check passes
    gpu = dev.gpu
    assert len(gpu.bar1_ptes) == 2
    for w in list(gpu.bar1_ptes):
        gpu.bar1_unmap(w)
    with m.kernel():
        kfree(pt)
        kfree(info)
