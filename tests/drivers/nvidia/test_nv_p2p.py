"""Tests for drivers/nvidia/nv_p2p.py (and the RM side in rm.py): the GPUDirect RDMA
kernel API a third-party driver calls.

The kernel-side calls are made as the process that owns the memory (`with
p.kernel()`), as nv_peer_mem does from ibv_reg_mr, unless the test is about
another context (a kthread, a second process, a second thread).  What is
asserted is what a third-party driver writer relies on (peermem_facts.md §4):
the errno of every refused call, the page table and DMA addresses (BAR1 bus
addresses, IOMMU-translated when the IOMMU translates), BAR1 window
accounting (the 36 MiB reserve, window reuse), who runs the free callback
and when (the nv_queue kworker, before the pages go), persistent mappings,
the `release` module parameter, and the put_pages / free-callback race that
the fixed releases close and the legacy ones do not.
"""

from __future__ import annotations

import errno

import pytest

from drivers.nvidia.nv_p2p import (
    NVIDIA_P2P_DMA_MAPPING_VERSION,
    NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING,
    NVIDIA_P2P_PAGE_SIZE_64KB,
    NVIDIA_P2P_PAGE_TABLE_VERSION,
    NVIDIA_P2P_VERSION_COMPATIBLE,
    nvidia_p2p_dma_map_pages,
    nvidia_p2p_dma_unmap_pages,
    nvidia_p2p_free_dma_mapping,
    nvidia_p2p_free_page_table,
    nvidia_p2p_get_pages,
    nvidia_p2p_get_pages_persistent,
    nvidia_p2p_put_pages,
    nvidia_p2p_put_pages_persistent,
)
from drivers.nvidia.rm import CLI_THIRD_PARTY_P2P_BAR1_RESERVE
from kernel_model.current import current
from kernel_model.dma import DMA_BIT_MASK, dma_set_mask
from kernel_model.emu.explore import explore_dpor, replay
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.hw.nvgpu import GPU_PAGE_SIZE, GpuConfig
from kernel_model.iommu import IommuFault, dma_to_phys
from kernel_model.ioport import MachineCheck
from kernel_model.kthread import kthread_run
from kernel_model.locking import complete, complete_all, init_completion, wait_for_completion
from kernel_model.sched import BLOCKED, DONE, SCHED
from kernel_model.slab import DoubleFree, UseAfterFree, kmem_is_freed
from kernel_model.trace import Tracer
from tests.nvidia_host import gpu_host, nvdev
from userspace.cuda.runtime import (
    CU_POINTER_ATTRIBUTE_P2P_TOKENS,
    cudaMemcpyDeviceToHost,
    cudaMemcpyHostToDevice,
    cudart,
)

MiB = 1 << 20
P = GPU_PAGE_SIZE
LEGACY = "525.60.13"
KWORKER = "kworker/nv_queue"


# -- building blocks ------------------------------------------------------------------------------
class Env:
    """A machine, a process with a CUDA context, and the GPU's NvDevice."""

    def __init__(self, m):
        self.m = m
        self.p = m.spawn("app")
        self.cuda = cudart(self.p)
        self.dev = nvdev(m)
        self.gpu = self.dev.gpu

    def peer(self):
        """The HCA's PCI function, with the 64-bit DMA mask its driver would set."""
        pdev = self.m.hcas[0].pdev
        with self.m.kernel():
            dma_set_mask(pdev.dev, DMA_BIT_MASK(64))
        return pdev

    def get(self, va: int, length: int, cb=..., data="data", token=0, va_space=0):
        """nvidia_p2p_get_pages as the owning process (a Recorder callback by default;
        cb=None is a NULL callback)."""
        with self.p.kernel():
            return nvidia_p2p_get_pages(token, va_space, va, length,
                                        Recorder() if cb is ... else cb, data)

    def put(self, va: int, pt) -> int:
        with self.p.kernel():
            return nvidia_p2p_put_pages(0, 0, va, pt)

    def persistent(self, va: int, length: int, flags: int = 0):
        with self.p.kernel():
            return nvidia_p2p_get_pages_persistent(va, length, flags)

    def mem(self, va: int):
        return self.dev.clients[0].lookup(va)

    def memcpy_in(self, va: int, data: bytes) -> None:
        buf = self.p.mmap(0, -(-len(data) // 4096) * 4096)
        self.p.store(buf, data)
        self.cuda.cudaMemcpy(va, buf, len(data), cudaMemcpyHostToDevice)
        self.p.munmap(buf, -(-len(data) // 4096) * 4096)

    def memcpy_out(self, va: int, n: int) -> bytes:
        buf = self.p.mmap(0, -(-n // 4096) * 4096)
        self.cuda.cudaMemcpy(buf, va, n, cudaMemcpyDeviceToHost)
        out = self.p.load(buf, n)
        self.p.munmap(buf, -(-n // 4096) * 4096)
        return out


class Recorder:
    """A free callback that records (data, comm, pid) of each call."""

    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, data) -> None:
        self.calls.append((data, current().comm, current().pid))


@pytest.fixture
def env():
    e = Env(gpu_host())
    yield e
    if e.p.alive:
        e.p.exit(0)


@pytest.fixture
def legacy():
    e = Env(gpu_host(LEGACY))
    yield e
    if e.p.alive:
        e.p.exit(0)


def kerr(fn, *args) -> KernelError:
    with pytest.raises(KernelError) as e:
        fn(*args)
    return e.value


# -- argument checks ------------------------------------------------------------------------------
@pytest.mark.parametrize("off,length", [(4096, P), (0, P + 8), (0, 0x10008), (1, 2 * P)])
def test_get_pages_of_an_unaligned_address_or_length_is_einval(env, off, length):
    va = env.cuda.cudaMalloc(4 * P)
    e = kerr(env.get, va + off, length)
    assert e.errno == errno.EINVAL
    assert e.message.startswith("nvidia_p2p_get_pages:")
    assert "Invalid argument in nv_p2p_get_pages, address or length are not aligned" in e.message
    assert env.dev.bar1_refs == {} and env.gpu.bar1_ptes == {}


def test_get_pages_persistent_unaligned_names_the_persistent_call(env):
    va = env.cuda.cudaMalloc(P)
    e = kerr(env.persistent, va, 100)
    assert e.errno == errno.EINVAL
    assert e.message.startswith("nvidia_p2p_get_pages_persistent:") and "not aligned" in e.message


def test_get_pages_of_length_zero_is_einval(env):
    va = env.cuda.cudaMalloc(P)
    e = kerr(env.get, va, 0)
    assert e.errno == errno.EINVAL and "length 0" in e.message
    assert kerr(env.persistent, va, 0).errno == errno.EINVAL


def test_get_pages_across_two_allocations_is_einval(env):
    a = env.cuda.cudaMalloc(2 * P)
    b = env.cuda.cudaMalloc(2 * P)
    lo, hi = min(a, b), max(a, b)
    assert env.mem(lo + P) is not env.mem(hi) and env.mem(hi) is not None
    e = kerr(env.get, lo + P, hi - lo)                # from inside one into the other
    assert e.errno == errno.EINVAL and "is not one allocation" in e.message
    assert env.gpu.bar1_ptes == {}


def test_get_pages_beyond_the_allocation_end_is_einval(env):
    va = env.cuda.cudaMalloc(2 * P)
    assert kerr(env.get, va + P, 2 * P).errno == errno.EINVAL


def test_get_pages_of_host_memory_is_einval(env):
    buf = env.p.mmap(0, 2 * P + P)
    va = -(-buf // P) * P
    assert kerr(env.get, va, P).errno == errno.EINVAL


def test_get_pages_of_freed_memory_is_einval(env):
    va = env.cuda.cudaMalloc(P)
    env.cuda.cudaFree(va)
    assert kerr(env.get, va, P).errno == errno.EINVAL


def test_get_pages_of_unbound_memory_is_einval(env):
    """After munmap of its VA the allocation has no address a third party can name."""
    va = env.cuda.cudaMalloc(P)
    assert env.p.munmap(va, P) == 0
    assert kerr(env.get, va, P).errno == errno.EINVAL


def test_get_pages_with_a_null_callback_is_einval_on_a_fixed_release(env):
    va = env.cuda.cudaMalloc(P)
    e = kerr(env.get, va, P, None)
    assert e.errno == errno.EINVAL and "NULL free_callback" in e.message
    assert "nvidia_p2p_get_pages_persistent" in e.message


def test_get_pages_with_no_gpu_is_einval():
    m = gpu_host(nr_gpus=0)
    with m.kernel():
        e = kerr(nvidia_p2p_get_pages, 0, 0, 0x7F0000000000, P, Recorder(), "d")
    assert e.errno == errno.EINVAL and "no GPU" in e.message


# -- whose memory ---------------------------------------------------------------------------------
def test_get_pages_of_another_processes_memory_without_tokens_is_einval(env):
    va = env.cuda.cudaMalloc(P)
    q = env.m.spawn("thief")
    with q.kernel():
        e = kerr(nvidia_p2p_get_pages, 0, 0, va, P, Recorder(), "d")
    assert e.errno == errno.EINVAL and "the calling process" in e.message
    assert env.gpu.bar1_ptes == {}
    q.exit(0)


def test_get_pages_from_a_kthread_without_tokens_is_einval(env):
    va = env.cuda.cudaMalloc(P)

    def body():
        return kerr(nvidia_p2p_get_pages, 0, 0, va, P, Recorder(), "d").errno

    with env.m.kernel():
        t = kthread_run(body, name="p2p-pinner")
    assert t.join() == errno.EINVAL


def test_get_pages_with_the_owners_tokens_works_from_another_context(env):
    """The tokens from cuPointerGetAttribute(P2P_TOKENS) name the owner's VA space."""
    va = env.cuda.cudaMalloc(2 * P)
    token, va_space = env.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, va)
    rec = Recorder()

    def body():
        pt = nvidia_p2p_get_pages(token, va_space, va, 2 * P, rec, "kt")
        entries = pt.entries
        assert nvidia_p2p_put_pages(token, va_space, va, pt) == 0
        return entries

    with env.m.kernel():
        t = kthread_run(body, name="p2p-pinner")
    assert t.join() == 2
    assert env.gpu.bar1_ptes == {} and rec.calls == []


def test_get_pages_with_tokens_from_another_process(env):
    va = env.cuda.cudaMalloc(P)
    token, va_space = env.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, va)
    q = env.m.spawn("peer-app")
    with q.kernel():
        pt = nvidia_p2p_get_pages(token, va_space, va, P, Recorder(), "q")
        assert pt.entries == 1
        assert nvidia_p2p_put_pages(token, va_space, va, pt) == 0
    q.exit(0)


@pytest.mark.parametrize("which", ["token", "va_space", "both", "token only"])
def test_get_pages_with_wrong_tokens_is_einval(env, which):
    va = env.cuda.cudaMalloc(P)
    token, va_space = env.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, va)
    bad = {"token": (token ^ 2, va_space), "va_space": (token, va_space + 1),
           "both": (token ^ 2, va_space + 1), "token only": (0, va_space)}[which]
    with env.p.kernel():
        e = kerr(nvidia_p2p_get_pages, bad[0], bad[1], va, P, Recorder(), "d")
    assert e.errno == errno.EINVAL and "those tokens" in e.message


def test_tokens_of_one_context_do_not_reach_another_contexts_memory(env):
    """Right tokens, wrong address: the tokens name a VA space, not every allocation."""
    va = env.cuda.cudaMalloc(P)
    q = env.m.spawn("other")
    cq = cudart(q)
    cq.cudaMalloc(P)
    vq = cq.cudaMalloc(P)                 # an address only the other process uses
    assert env.mem(vq) is None and vq != va
    token, va_space = env.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, va)
    with env.p.kernel():
        e = kerr(nvidia_p2p_get_pages, token, va_space, vq, P, Recorder(), "d")
    assert e.errno == errno.EINVAL
    q.exit(0)


def test_get_pages_from_a_second_thread_of_the_owner_needs_no_tokens(env):
    va = env.cuda.cudaMalloc(P)
    rec = Recorder()

    def body():
        pt = nvidia_p2p_get_pages(0, 0, va, P, rec, "thread")
        return nvidia_p2p_put_pages(0, 0, va, pt)

    assert env.p.thread(body, name="worker").join() == 0


# -- the page table and BAR1 ----------------------------------------------------------------------
def test_page_table_describes_64k_pages_at_their_bar1_bus_addresses(env):
    va = env.cuda.cudaMalloc(4 * P)
    pt = env.get(va, 4 * P)
    mem = env.mem(va)
    assert pt.entries == len(pt.pages) == 4
    assert pt.page_size == NVIDIA_P2P_PAGE_SIZE_64KB
    assert pt.version == NVIDIA_P2P_PAGE_TABLE_VERSION and pt.flags == 0
    assert NVIDIA_P2P_VERSION_COMPATIBLE(pt, NVIDIA_P2P_PAGE_TABLE_VERSION)
    assert not NVIDIA_P2P_VERSION_COMPATIBLE(pt, 0x00010002)   # another major
    assert pt.gpu_uuid == env.gpu.uuid
    windows = [env.dev.bar1_refs[g][0] for g in mem.pages]
    assert [pg.physical_address for pg in pt.pages] == \
        [env.gpu.bar1_bus_address(w) for w in windows]
    assert {w: g for w, g in zip(windows, mem.pages, strict=True)} == env.gpu.bar1_ptes
    assert env.put(va, pt) == 0


def test_page_table_of_a_subrange_covers_only_its_pages(env):
    va = env.cuda.cudaMalloc(4 * P)
    pt = env.get(va + P, 2 * P)
    mem = env.mem(va)
    assert pt.entries == 2
    assert sorted(env.gpu.bar1_ptes.values()) == mem.pages[1:3]
    assert env.put(va + P, pt) == 0


def test_bar1_addresses_reach_the_bytes_cudamemcpy_moved(env):
    """What a peer reads at physical_address is the GPU memory, and what it writes there
    cudaMemcpy reads back: BAR1 reaches the allocation's vidmem page by page."""
    va = env.cuda.cudaMalloc(2 * P)
    data = bytes(range(256)) * (2 * P // 256)
    env.memcpy_in(va, data)
    pt = env.get(va, 2 * P)
    m = env.m
    assert m.phys_read(pt.pages[1].physical_address + 10, 6) == data[P + 10:P + 16]
    m.phys_write(pt.pages[0].physical_address + P - 2, b"HI")
    m.phys_write(pt.pages[1].physical_address, b"THERE")
    assert env.memcpy_out(va + P - 2, 7) == b"HITHERE"
    assert env.put(va, pt) == 0


def test_put_pages_unmaps_the_windows_and_a_later_peer_read_faults(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    bus = pt.pages[0].physical_address
    assert env.put(va, pt) == 0
    assert env.gpu.bar1_ptes == {} and env.dev.bar1_refs == {}
    assert kmem_is_freed(pt)
    with pytest.raises(MachineCheck):
        env.m.phys_read(bus, 8)
    assert env.gpu.bar1_faults == [("read", bus - env.gpu.bar1.start, 8)]
    assert len(env.m.bugs) == 1 and "maps no GPU page" in env.m.bugs[0]
    env.m.bugs.clear()


def test_overlapping_mappings_reuse_bar1_windows(env):
    """Windows are per GPU page and refcounted: the overlap is mapped once, and freed
    only with the last mapping that uses it."""
    va = env.cuda.cudaMalloc(6 * P)
    a = env.get(va, 4 * P)
    b = env.get(va + 2 * P, 4 * P)
    assert env.dev.bar1_mapped_bytes() == 6 * P and len(env.gpu.bar1_ptes) == 6
    assert [pg.physical_address for pg in a.pages[2:]] == \
        [pg.physical_address for pg in b.pages[:2]]
    assert env.put(va, a) == 0
    mem = env.mem(va)
    assert sorted(env.gpu.bar1_ptes.values()) == mem.pages[2:]
    assert [env.dev.bar1_refs[g][1] for g in mem.pages[2:]] == [1, 1, 1, 1]
    assert env.m.phys_read(b.pages[0].physical_address, 1) == b"\0"
    assert env.put(va + 2 * P, b) == 0
    assert env.gpu.bar1_ptes == {} and env.dev.bar1_mapped_bytes() == 0
    assert len(env.dev.bar1_free) == env.gpu.bar1_windows


def test_the_same_range_twice_is_two_page_tables_on_the_same_windows(env):
    va = env.cuda.cudaMalloc(2 * P)
    a, b = env.get(va, 2 * P), env.get(va, 2 * P)
    assert a is not b
    assert [pg.physical_address for pg in a.pages] == [pg.physical_address for pg in b.pages]
    assert env.dev.bar1_mapped_bytes() == 2 * P
    assert env.put(va, b) == 0 and len(env.gpu.bar1_ptes) == 2
    assert env.put(va, a) == 0 and env.gpu.bar1_ptes == {}


def test_bar1_exhaustion_is_enomem_beyond_the_36m_reserve():
    """A 64 MiB BAR1 leaves 28 MiB for third parties: exactly 28 MiB fits, one more
    64 KiB page does not (nothing new mapped), an already-mapped range still does."""
    env = Env(gpu_host(gpu=GpuConfig(bar1_size=64 * MiB)))
    room = 64 * MiB - CLI_THIRD_PARTY_P2P_BAR1_RESERVE
    assert room == 28 * MiB
    va = env.cuda.cudaMalloc(room + P)
    big = env.get(va, room)
    assert env.dev.bar1_mapped_bytes() == room
    e = kerr(env.get, va + room, P)
    assert e.errno == errno.ENOMEM and "no space for BAR1 mappings" in e.message
    assert e.message.startswith("nvidia_p2p_get_pages:")
    assert env.dev.bar1_mapped_bytes() == room and len(env.gpu.bar1_ptes) == room // P
    again = env.get(va + P, 2 * P)                         # reuses windows: no new space
    assert env.dev.bar1_mapped_bytes() == room
    assert env.put(va, again) == 0 and env.put(va, big) == 0
    last = env.get(va + room, P)                           # room again after the put
    assert env.put(va + room, last) == 0
    env.p.exit(0)


def test_one_request_larger_than_bar1_allows_maps_nothing():
    env = Env(gpu_host(gpu=GpuConfig(bar1_size=64 * MiB)))
    va = env.cuda.cudaMalloc(28 * MiB + P)
    e = kerr(env.get, va, 28 * MiB + P)
    assert e.errno == errno.ENOMEM
    assert env.gpu.bar1_ptes == {} and env.dev.bar1_refs == {}
    assert len(env.dev.bar1_free) == env.gpu.bar1_windows
    assert env.mem(va).mem_infos == []
    env.p.exit(0)


def test_persistent_mappings_count_against_bar1_too():
    env = Env(gpu_host(gpu=GpuConfig(bar1_size=64 * MiB)))
    va = env.cuda.cudaMalloc(28 * MiB + P)
    pt = env.persistent(va, 28 * MiB)
    assert kerr(env.persistent, va + 28 * MiB, P).errno == errno.ENOMEM
    with env.p.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0
    env.p.exit(0)


# -- put_pages ------------------------------------------------------------------------------------
def test_put_pages_of_null_is_zero(env):
    with env.p.kernel():
        assert nvidia_p2p_put_pages(0, 0, 0, None) == 0
        assert nvidia_p2p_put_pages_persistent(0, None) == 0


def test_put_pages_twice_is_a_noop_the_second_time(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    assert env.put(va, pt) == 0
    assert env.put(va, pt) == 0                 # looked up by identity: not found, 0
    assert env.gpu.bar1_ptes == {}


def test_put_pages_persistent_with_flags_is_einval(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.persistent(va, P)
    with env.p.kernel():
        e = kerr(nvidia_p2p_put_pages_persistent, va, pt, 1)
        assert e.errno == errno.EINVAL and "flags" in e.message
        assert env.gpu.bar1_ptes != {}          # still mapped
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0
    assert env.gpu.bar1_ptes == {}


def test_free_page_table_and_free_dma_mapping_are_noops(env):
    """The open driver's compatibility stubs: 0, and nothing is freed."""
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert nvidia_p2p_free_dma_mapping(mapping) == 0
        assert nvidia_p2p_free_page_table(pt) == 0
        assert not kmem_is_freed(pt) and not kmem_is_freed(mapping)
        assert pt.entries == 1 and len(env.gpu.bar1_ptes) == 1
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
        assert kmem_is_freed(mapping)
    assert env.put(va, pt) == 0


# -- the free callback ----------------------------------------------------------------------------
def test_cudafree_runs_the_callback_on_the_nv_queue_kworker(env):
    va = env.cuda.cudaMalloc(2 * P)
    rec = Recorder()
    pt = env.get(va, 2 * P, rec, "my data")
    total = len(env.dev.free_pages)
    env.cuda.cudaFree(va)
    assert len(rec.calls) == 1
    data, comm, pid = rec.calls[0]
    assert data == "my data" and comm == KWORKER and pid != env.p.pid
    # after the callback: the windows unmapped, the table freed, the pages back
    assert env.gpu.bar1_ptes == {} and env.dev.p2p_infos == {}
    assert kmem_is_freed(pt)
    assert len(env.dev.free_pages) == total + 2
    assert env.put(va, pt) == 0                 # a no-op now, nothing freed twice


def test_cudafree_waits_for_the_callback_and_the_trace_shows_who_ran_it(env):
    va = env.cuda.cudaMalloc(P)
    env.get(va, P)
    with Tracer() as t:
        env.cuda.cudaFree(va)
    tr = t.trace
    calls = tr.calls()
    cb = [c for c in calls if c.func == "nv_p2p_mem_info_free_callback"]
    free = [c for c in calls if c.func == "rm_free_memory"]
    assert len(cb) == 1 and len(free) == 1
    assert tr.tracks[cb[0].track].startswith(KWORKER)
    assert tr.tracks[free[0].track].startswith("app")
    names = [c.func for c in calls]
    # the callback before its platform data goes, both before the pages return
    assert names.index("nv_p2p_mem_info_free_callback") < names.index(
        "nv_p2p_free_platform_data") < names.index("rm_p2p_put_pages")


def test_the_callback_sees_the_mapping_still_live(env):
    """While the callback runs the third party can still reach the pages (to quiesce its
    device): the windows are mapped and the page table readable."""
    va = env.cuda.cudaMalloc(P)
    env.memcpy_in(va, b"still here")
    seen = []

    def cb(data):
        pt = data["pt"]
        seen.append((pt.entries, env.m.phys_read(pt.pages[0].physical_address, 10),
                     len(env.gpu.bar1_ptes)))

    box = {}
    box["pt"] = env.get(va, P, cb, box)
    env.cuda.cudaFree(va)
    assert seen == [(1, b"still here", 1)]


def test_each_mapping_gets_its_own_callback(env):
    va = env.cuda.cudaMalloc(4 * P)
    rec = Recorder()
    env.get(va, 2 * P, rec, "first")
    env.get(va + P, 3 * P, rec, "second")
    other = env.cuda.cudaMalloc(P)
    env.get(other, P, rec, "other allocation")
    env.cuda.cudaFree(va)
    assert sorted(d for d, _, _ in rec.calls) == ["first", "second"]
    assert len(env.gpu.bar1_ptes) == 1
    env.cuda.cudaFree(other)
    assert [d for d, _, _ in rec.calls][-1] == "other allocation"
    assert all(c == KWORKER for _, c, _ in rec.calls)


def test_process_exit_runs_the_callbacks_on_the_kworker(env):
    va = env.cuda.cudaMalloc(MiB)
    rec = Recorder()
    pt = env.get(va, MiB, rec, "exit")
    total = len(env.dev.free_pages)
    env.p.exit(0)
    assert rec.calls == [("exit", KWORKER, rec.calls[0][2])]
    assert rec.calls[0][2] != env.p.pid
    assert len(env.dev.free_pages) == total + 16 and env.dev.clients == []
    assert env.gpu.bar1_ptes == {}
    with env.m.kernel():
        assert nvidia_p2p_put_pages(0, 0, va, pt) == 0


def test_closing_the_gpu_file_runs_the_callbacks(env):
    va = env.cuda.cudaMalloc(P)
    rec = Recorder()
    env.get(va, P, rec, "close")
    env.cuda.close()
    assert [(d, c) for d, c, _ in rec.calls] == [("close", KWORKER)]
    assert env.gpu.bar1_ptes == {} and env.dev.clients == []


def test_put_pages_after_the_callback_ran_frees_nothing_twice(env):
    """The third party's usual order: callback (it marks its MR dead), then put_pages from
    its own teardown - a no-op returning 0."""
    va = env.cuda.cudaMalloc(P)
    other = env.cuda.cudaMalloc(P)
    keep = env.get(other, P)                 # another mapping, to see its window survive
    pt = env.get(va, P)
    env.cuda.cudaFree(va)
    assert env.put(va, pt) == 0
    assert len(env.gpu.bar1_ptes) == 1 and not kmem_is_freed(keep)
    assert env.put(other, keep) == 0


# -- persistent mappings --------------------------------------------------------------------------
def test_persistent_mapping_survives_cudafree_without_a_callback(env):
    va = env.cuda.cudaMalloc(2 * P)
    env.memcpy_in(va, b"pinned")
    pt = env.persistent(va, 2 * P)
    total = len(env.dev.free_pages)
    env.cuda.cudaFree(va)
    # the allocation is gone for CUDA, but its pages and windows stay
    assert len(env.dev.free_pages) == total and len(env.gpu.bar1_ptes) == 2
    assert env.m.phys_read(pt.pages[0].physical_address, 6) == b"pinned"
    with env.p.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0
    assert len(env.dev.free_pages) == total + 2 and env.gpu.bar1_ptes == {}


def test_persistent_mapping_survives_process_exit_until_put(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.persistent(va, P)
    total = len(env.dev.free_pages)
    env.p.exit(0)
    assert len(env.dev.free_pages) == total and len(env.gpu.bar1_ptes) == 1
    with env.m.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0
    assert len(env.dev.free_pages) == total + 1 and env.gpu.bar1_ptes == {}


def test_persistent_and_callback_mappings_of_one_allocation(env):
    """cudaFree calls back the non-persistent one at once; the pages wait for the
    persistent put."""
    va = env.cuda.cudaMalloc(P)
    rec = Recorder()
    pt = env.get(va, P, rec, "cb")
    ppt = env.persistent(va, P)
    total = len(env.dev.free_pages)
    env.cuda.cudaFree(va)
    assert [d for d, _, _ in rec.calls] == ["cb"] and kmem_is_freed(pt)
    assert len(env.gpu.bar1_ptes) == 1 and len(env.dev.free_pages) == total
    with env.p.kernel():
        assert nvidia_p2p_put_pages_persistent(va, ppt) == 0
    assert len(env.dev.free_pages) == total + 1


def test_persistent_with_force_bar1_flag_is_accepted(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.persistent(va, P, NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING)
    assert pt.entries == 1
    with env.p.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0


@pytest.mark.parametrize("flags", [2, 0x100])
def test_persistent_ignores_flags_other_than_force_bar1(env, flags):
    """nv-p2p.c only tests flags & FORCE_BAR1_MAPPING; other bits are ignored."""
    va = env.cuda.cudaMalloc(P)
    pt = env.persistent(va, P, flags)
    assert pt.entries == 1 and not getattr(pt, "force_bar1", False)
    with env.p.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt, 0) == 0


def test_a_force_bar1_persistent_mapping_cannot_be_dma_mapped(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.persistent(va, P, 3)
    with env.p.kernel():
        assert kerr(nvidia_p2p_dma_map_pages, env.peer(), pt).errno == errno.EOPNOTSUPP
        assert nvidia_p2p_put_pages_persistent(va, pt, 0) == 0


# -- the release parameter ------------------------------------------------------------------------
def test_legacy_release_accepts_a_null_callback_as_persistent(legacy):
    va = legacy.cuda.cudaMalloc(P)
    pt = legacy.get(va, P, None, None)
    total = len(legacy.dev.free_pages)
    legacy.cuda.cudaFree(va)                     # no callback to run
    assert len(legacy.dev.free_pages) == total and len(legacy.gpu.bar1_ptes) == 1
    assert legacy.put(va, pt) == 0
    assert len(legacy.dev.free_pages) == total + 1 and legacy.gpu.bar1_ptes == {}


def test_legacy_null_callback_with_tokens_is_einval(legacy):
    va = legacy.cuda.cudaMalloc(P)
    token, va_space = legacy.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_P2P_TOKENS, va)
    with legacy.p.kernel():
        e = kerr(nvidia_p2p_get_pages, token, va_space, va, P, None, None)
    assert e.errno == errno.EINVAL and "persistent mappings take no tokens" in e.message


def test_legacy_release_has_no_get_pages_persistent(legacy):
    va = legacy.cuda.cudaMalloc(P)
    e = kerr(legacy.persistent, va, P)
    assert e.errno == EOPNOTSUPP and "not in this release" in e.message
    assert legacy.gpu.bar1_ptes == {}


@pytest.mark.parametrize("release,is_legacy", [
    ("515.65.01", True), ("520.61.05", True), ("525.60.13", True), ("525.105.17", False),
    ("525.147.05", False), ("530.30.02", True), ("535.13.00", True), ("535.14", False),
    ("535.104.05", False), ("550.54.15", False), ("580.65.06", False)])
def test_which_releases_behave_as_legacy(release, is_legacy):
    """Legacy = a NULL callback accepted and no persistent API (R515 up to 535.14,
    R525 before 525.105.17)."""
    env = Env(gpu_host(release))
    va = env.cuda.cudaMalloc(P)
    if is_legacy:
        assert kerr(env.persistent, va, P).errno == EOPNOTSUPP
        pt = env.get(va, P, None, None)
        assert env.put(va, pt) == 0
    else:
        assert kerr(env.get, va, P, None, None).errno == errno.EINVAL
        pt = env.persistent(va, P)
        with env.p.kernel():
            assert nvidia_p2p_put_pages_persistent(va, pt) == 0
    env.p.exit(0)


def test_legacy_release_runs_callbacks_the_same_way(legacy):
    va = legacy.cuda.cudaMalloc(P)
    rec = Recorder()
    pt = legacy.get(va, P, rec, "legacy")
    legacy.cuda.cudaFree(va)
    assert [(d, c) for d, c, _ in rec.calls] == [("legacy", KWORKER)]
    assert legacy.put(va, pt) == 0              # after the callback: not found, 0


# -- DMA mappings ---------------------------------------------------------------------------------
def test_dma_map_on_the_identity_iommu_gives_the_bar1_bus_addresses(env):
    va = env.cuda.cudaMalloc(3 * P)
    pt = env.get(va, 3 * P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert mapping.version == NVIDIA_P2P_DMA_MAPPING_VERSION
        assert NVIDIA_P2P_VERSION_COMPATIBLE(mapping, NVIDIA_P2P_DMA_MAPPING_VERSION)
        assert mapping.page_size_type == NVIDIA_P2P_PAGE_SIZE_64KB
        assert mapping.entries == 3 and mapping.pci_dev is peer
        assert mapping.dma_addresses == [pg.physical_address for pg in pt.pages]
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
    assert env.put(va, pt) == 0


def test_dma_map_through_a_translating_iommu_gives_iovas_that_reach_the_bar():
    env = Env(gpu_host(iommu="translating"))
    va = env.cuda.cudaMalloc(2 * P)
    pt = env.get(va, 2 * P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
    for addr, pg in zip(mapping.dma_addresses, pt.pages, strict=True):
        assert addr != pg.physical_address
        assert dma_to_phys(peer.dev, addr, P) == [(pg.physical_address, P)]
    first = mapping.dma_addresses[0]
    with env.p.kernel():
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
    with pytest.raises(IommuFault):
        dma_to_phys(peer.dev, first, P)
    assert env.put(va, pt) == 0
    env.p.exit(0)


def test_teardown_unmaps_dma_mappings_the_callback_left(env):
    """The owner frees the memory; the third party's callback does not unmap: RM does.
    A later dma_unmap_pages goes through the freed table (container_of): a
    use-after-free, as in nv-p2p.c; a later put_pages finds nothing and returns 0."""
    env2 = Env(gpu_host(iommu="translating"))
    va = env2.cuda.cudaMalloc(P)
    pt = env2.get(va, P)
    peer = env2.peer()
    with env2.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
    iova = mapping.dma_addresses[0]
    env2.cuda.cudaFree(va)
    assert kmem_is_freed(mapping)
    with pytest.raises(IommuFault):
        dma_to_phys(peer.dev, iova, P)
    with env2.p.kernel():
        with pytest.raises(UseAfterFree, match="page_table"):
            nvidia_p2p_dma_unmap_pages(peer, pt, mapping)
        assert nvidia_p2p_put_pages(0, 0, va, pt) == 0
    env2.p.exit(0)


def test_dma_unmap_after_put_pages_is_a_use_after_free(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert nvidia_p2p_put_pages(0, 0, va, pt) == 0      # put unmaps what is left
        assert kmem_is_freed(mapping) and kmem_is_freed(pt)
        with pytest.raises(UseAfterFree):
            nvidia_p2p_dma_unmap_pages(peer, pt, mapping)
    assert env.m.bugs == []


def test_dma_unmap_twice_is_zero_and_unmaps_once(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
    assert env.m.bugs == []
    assert env.put(va, pt) == 0


def test_dma_map_and_unmap_with_null_arguments_are_einval(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    with env.p.kernel():
        assert kerr(nvidia_p2p_dma_map_pages, None, pt).errno == errno.EINVAL
        assert kerr(nvidia_p2p_dma_map_pages, peer, None).errno == errno.EINVAL
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        for args in ((None, pt, mapping), (peer, None, mapping), (peer, pt, None)):
            e = kerr(nvidia_p2p_dma_unmap_pages, *args)
            assert e.errno == errno.EINVAL and "NULL argument" in e.message
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
    assert env.put(va, pt) == 0


def test_dma_map_of_a_page_table_already_put_is_a_use_after_free(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    assert env.put(va, pt) == 0
    with env.p.kernel(), pytest.raises(UseAfterFree):
        nvidia_p2p_dma_map_pages(peer, pt)


def test_dma_map_when_the_peer_cannot_reach_bar1_is_eio_with_nothing_mapped(env):
    """A peer left with a 32-bit DMA mask cannot reach a BAR1 above 4 GiB."""
    va = env.cuda.cudaMalloc(2 * P)
    pt = env.get(va, 2 * P)
    peer = env.m.hcas[0].pdev                    # no driver: the 32-bit default mask
    assert pt.pages[0].physical_address > DMA_BIT_MASK(32)
    with env.p.kernel():
        e = kerr(nvidia_p2p_dma_map_pages, peer, pt)
    assert e.errno == errno.EIO and peer.name in e.message
    assert env.dev.p2p_infos[id(pt)].dma_mappings == []
    assert env.put(va, pt) == 0


def test_dma_map_failing_on_a_later_page_undoes_the_earlier_ones(env):
    va = env.cuda.cudaMalloc(2 * P)
    pt = env.get(va, 2 * P)
    peer = env.m.hcas[0].pdev
    first, second = (pg.physical_address for pg in pt.pages)
    assert second == first + P
    peer.dev.dma_mask = first + P - 1            # reaches page 0 only
    try:
        with env.p.kernel():
            assert kerr(nvidia_p2p_dma_map_pages, peer, pt).errno == errno.EIO
    finally:
        peer.dev.dma_mask = DMA_BIT_MASK(32)
    assert env.dev.p2p_infos[id(pt)].dma_mappings == []
    assert env.put(va, pt) == 0                  # the leak check finds no DMA left mapped


def test_dma_unmap_with_another_peer_warns_and_still_unmaps(env):
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert nvidia_p2p_dma_unmap_pages(env.gpu.pdev, pt, mapping) == 0
    assert len(env.m.bugs) == 1 and "nvidia_p2p_dma_unmap_pages" in env.m.bugs[0]
    env.m.bugs.clear()
    assert kmem_is_freed(mapping)
    assert env.put(va, pt) == 0


def test_inside_the_callback_dma_map_and_unmap_still_work(env):
    """While the callback runs the mem_info is alive: a new mapping is made (the teardown
    unmaps it after), and an unmap from the callback is honoured and not repeated."""
    va = env.cuda.cudaMalloc(P)
    peer = env.peer()
    box = {}

    def cb(data):
        box["map"] = "made" if nvidia_p2p_dma_map_pages(peer, box["pt"]) else "none"
        box["unmap"] = nvidia_p2p_dma_unmap_pages(peer, box["pt"], box["mapping"])

    box["pt"] = env.get(va, P, cb, box)
    with env.p.kernel():
        box["mapping"] = nvidia_p2p_dma_map_pages(peer, box["pt"])
    env.cuda.cudaFree(va)
    assert box["map"] == "made" and box["unmap"] == 0
    assert env.m.bugs == []


# -- two GPUs -------------------------------------------------------------------------------------
def test_get_pages_finds_the_gpu_that_holds_the_memory():
    m = gpu_host(nr_gpus=2, gpu=GpuConfig(mem_size=64 * MiB, bar1_size=64 * MiB))
    p = m.spawn("app")
    c1 = cudart(p, 1)
    va = c1.cudaMalloc(2 * P)
    gpu1 = nvdev(m, 1).gpu
    with p.kernel():
        pt = nvidia_p2p_get_pages(0, 0, va, 2 * P, Recorder(), "d")
        assert pt.gpu_uuid == gpu1.uuid != nvdev(m, 0).gpu.uuid
        bar = gpu1.pdev.resource[1]
        assert all(bar.start <= pg.physical_address <= bar.end for pg in pt.pages)
        assert nvidia_p2p_put_pages(0, 0, va, pt) == 0
    p.exit(0)


def test_enomem_on_the_owning_gpu_is_not_masked_by_another_gpus_einval():
    m = gpu_host(nr_gpus=2, gpu=GpuConfig(mem_size=64 * MiB, bar1_size=64 * MiB))
    p = m.spawn("app")
    c1 = cudart(p, 1)
    va = c1.cudaMalloc(28 * MiB + P)
    with p.kernel():
        e = kerr(nvidia_p2p_get_pages, 0, 0, va, 28 * MiB + P, Recorder(), "d")
    assert e.errno == errno.ENOMEM
    p.exit(0)


# -- the put_pages / free-callback race -----------------------------------------------------------
class Race:
    """cudaFree's free callback held in flight on a gate while another task calls
    put_pages on the same page table.

    Interleaving (default strategy, deterministic): main starts the freer (the process's
    main thread) and waits for `started`; the freer runs cudaFree until flush_work
    blocks; the nv_queue kworker runs the callback up to the gate; main starts the putter
    and yields, so the putter runs until it blocks (fixed) or returns (legacy); then
    main opens the gate.
    """

    def __init__(self, env: Env, putter: str = "thread"):
        self.env = env
        self.log: list[tuple] = []
        self.started = init_completion("callback started")
        self.gate = init_completion("callback gate")
        self.va = env.cuda.cudaMalloc(2 * P)
        self.total = len(env.dev.free_pages)
        self.pt = env.get(self.va, 2 * P, self.callback, "race")
        self.freer = env.p.start(env.cuda.cudaFree, self.va)
        wait_for_completion(self.started)
        if putter == "thread":
            self.putter = env.p.thread(self.put, name="putter")
        else:
            with env.m.kernel():
                self.putter = kthread_run(self.put, name="putter")
        SCHED.yield_("test: let the putter run")
        self.putter_state = self.putter.state

    def callback(self, data) -> None:
        self.log.append(("callback", current().comm))
        complete(self.started)
        wait_for_completion(self.gate)
        self.log.append(("callback returns",))

    def put(self) -> int:
        ret = nvidia_p2p_put_pages(0, 0, self.va, self.pt)
        self.log.append(("put_pages returned", ret, current().comm))
        return ret

    def open_gate(self) -> None:
        complete_all(self.gate)


@pytest.mark.parametrize("putter", ["thread", "kthread"])
def test_put_pages_racing_the_callback_waits_for_it_on_a_fixed_release(env, putter):
    race = Race(env, putter)
    assert race.putter_state == BLOCKED           # waiting for the in-flight callback
    assert race.log == [("callback", KWORKER)]
    assert len(env.gpu.bar1_ptes) == 2            # nothing torn down yet
    race.open_gate()
    assert race.putter.join() == 0
    race.freer.join()
    assert race.log == [("callback", KWORKER), ("callback returns",),
                        ("put_pages returned", 0, "putter")]
    assert env.gpu.bar1_ptes == {} and env.dev.bar1_refs == {}
    assert len(env.dev.free_pages) == race.total + 2
    assert env.m.bugs == []


def test_put_pages_racing_the_callback_on_a_legacy_release_frees_twice(legacy):
    """Legacy: put_pages does not wait, frees the mapping under the running callback,
    and the teardown then frees it again - a KASAN report in the cudaFree caller."""
    race = Race(legacy)
    assert race.putter_state == DONE              # did not wait
    assert race.log == [("callback", KWORKER), ("put_pages returned", 0, "putter")]
    assert kmem_is_freed(race.pt)
    race.open_gate()
    assert race.putter.join() == 0
    with pytest.raises((DoubleFree, UseAfterFree)) as e:
        race.freer.join()
    assert "nv_p2p_free_platform_data" in str(e.value)
    assert "putter" in str(e.value)               # names who freed it first
    assert race.log[-1] == ("callback returns",)


# -- regressions: bugs these tests found ---------------------------------------------------------
def test_pages_stay_allocated_until_every_callback_has_run(env):
    va = env.cuda.cudaMalloc(P)
    held = len(env.dev.free_pages)
    seen = []

    def cb(data):
        seen.append((data, len(env.dev.free_pages), len(env.gpu.bar1_ptes)))

    env.get(va, P, cb, "first")
    env.get(va, P, cb, "second")
    env.cuda.cudaFree(va)
    assert len(env.dev.free_pages) == held + 1
    assert seen == [("first", held, 1), ("second", held, 1)]


def test_close_after_cudafree_of_persistently_mapped_memory_frees_the_rest(env):
    from drivers.nvidia.rm import rm_free_client
    from kernel_model.module import module_put

    m, p, cuda, dev = env.m, env.p, env.cuda, env.dev
    total = len(dev.free_pages)
    va = cuda.cudaMalloc(P)
    other = cuda.cudaMalloc(2 * P)
    pt = env.persistent(va, P)
    cuda.cudaFree(va)
    assert p.munmap(other, 2 * P) == 0
    client = dev.clients[0]
    ret = p.close(cuda.fd)
    cuda.fd = -1
    ok = ret == 0 and dev.clients == [] and len(dev.free_pages) == total - 1
    report = f"close returned {ret}, clients left {dev.clients}, " \
             f"{total - len(dev.free_pages)} pages held"
    with m.kernel():
        assert nvidia_p2p_put_pages_persistent(va, pt) == 0
        if not ok:       # undo what the failed close left, so the leak check still runs
            rm_free_client(client)
            module_put(m.modules["nvidia"])
    assert ok, report
    assert len(dev.free_pages) == total


def test_page_table_version_follows_the_release():
    env = Env(gpu_host("535.104.05"))
    va = env.cuda.cudaMalloc(P)
    pt = env.get(va, P)
    version = pt.version
    assert env.put(va, pt) == 0
    env.p.exit(0)
    assert version == 0x00010002


# -- the modelled RM latency (module parameter p2p_latency_us) -----------------------------------
def test_p2p_latency_is_accounted_per_rm_call_not_spent():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, modules=())
    m.load_module("nvidia", p2p_latency_us=7)
    env = Env(m)
    va = env.cuda.cudaMalloc(2 * P)
    t0 = m.sched.jiffies
    pt = env.get(va, 2 * P)
    peer = env.peer()
    with env.p.kernel():
        mapping = nvidia_p2p_dma_map_pages(peer, pt)
        assert nvidia_p2p_dma_unmap_pages(peer, pt, mapping) == 0
    assert env.put(va, pt) == 0
    assert env.dev.p2p_latency_us == 4 * 7          # get, dma_map, dma_unmap, put
    assert m.sched.jiffies == t0                     # nothing slept or spun
    assert env.put(va, None) == 0 and env.dev.p2p_latency_us == 28   # NULL: no RM call


def test_a_negative_p2p_latency_is_einval():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, modules=())
    with pytest.raises(KernelError) as e:
        m.load_module("nvidia", p2p_latency_us=-1)
    assert e.value.errno == errno.EINVAL and "nvidia" not in m.modules


# -- get_pages racing a free: the register-callback error path (PR #557) --------------------
def _pin_while_freed(release: str, outcome: list) -> None:
    """Pin a range on one task while another cudaFrees it; the pin must succeed (so
    that the explorer reports - and hands back - a schedule where it does not)."""
    m = gpu_host(release)
    p = m.spawn("app")
    cu = cudart(p)
    va = p.run(cu.cudaMalloc, 1 << 20)

    def pin() -> object:
        try:
            return nvidia_p2p_get_pages(0, 0, va, 1 << 20, lambda d: None, "dev")
        except KernelError as e:
            outcome.append((e.errno, str(e)))
            return None

    t = p.start(pin)
    p.thread(cu.cudaFree, va, name="free").join()
    pt = t.join()
    if pt is not None:
        p.run(nvidia_p2p_put_pages, 0, 0, va, pt)
    p.exit(0)
    assert pt is not None, "get_pages failed"


def test_get_pages_racing_a_free_fails_einval_after_register_and_leaks_nothing():
    runs = explore_dpor(lambda: _pin_while_freed("580.65.06", []), bound=1)
    fails = [r.failure for r in runs if r.failure is not None]
    # the pin fails cleanly whenever it fails (the machine's leak check passed: the
    # check is the assertion) - when the free came first, or when it got in between
    # rm_p2p_get_pages and rm_p2p_register_callback
    assert fails and all(f.check == "assertion" and "get_pages failed" in f.detail
                         for f in fails)
    for f in fails:
        outcome: list = []
        assert replay(lambda o=outcome: _pin_while_freed("580.65.06", o),
                      f.schedule).failure.check == "assertion"
        if "rm_p2p_register_callback" in outcome[0][1]:
            break
    else:
        raise AssertionError("no schedule frees between get_pages and register_callback")
    assert outcome[0][0] == EINVAL and "rm_p2p_register_callback" in outcome[0][1]
    assert "NV_ERR_OBJECT_NOT_FOUND" in outcome[0][1]
    # the same interleaving on the release PR #557 was filed against: a double free
    legacy = replay(lambda: _pin_while_freed("535.104.05", []), f.schedule).failure
    assert legacy.check == "DoubleFree" and "nv_p2p_scratch" in legacy.detail
