"""userspace/libc.reserve_aligned and the GPU runtimes' use of it: the aligned range
stays reserved until the runtime maps over it, so another thread's mmap cannot land
there in between (found by the explorer; tests below replay that search)."""

from __future__ import annotations

import pytest

from kernel_model.emu.explore import explore
from kernel_model.emu.platform import rdma_host
from userspace.cuda.runtime import cudart
from userspace.hip.runtime import HipError, hiprt
from userspace.libc import (
    MAP_ANONYMOUS,
    MAP_PRIVATE,
    PROT_READ,
    PROT_WRITE,
    heap_arenas,
    reserve_aligned,
)

MiB = 1 << 20
K64 = 1 << 16


def test_reserve_aligned_holds_exactly_the_aligned_range():
    m = rdma_host(ram_size=64 * MiB, modules=())
    p = m.spawn("app")
    va = reserve_aligned(p, 3 * K64, K64, "test")
    assert va % K64 == 0
    (vma,) = [v for v in p.mm.vmas if v.vm_start <= va < v.vm_end]
    assert (vma.vm_start, vma.vm_end) == (va, va + 3 * K64)
    assert not [v for v in p.mm.vmas if v is not vma and
                va - K64 <= v.vm_start < va + 4 * K64 and v.vm_file is None]
    p.munmap(va, 3 * K64)
    p.exit(0)


@pytest.mark.parametrize("runtime", ["hip", "cuda"])
def test_no_other_mmap_lands_in_a_gpu_allocation_under_any_single_preemption(runtime):
    def program() -> None:
        m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=int(runtime == "hip"),
                      nr_gpus=int(runtime == "cuda"), modules=())
        m.load_module("amdgpu" if runtime == "hip" else "nvidia")
        p = m.spawn("app")
        alloc = hiprt(p).hipMalloc if runtime == "hip" else cudart(p).cudaMalloc

        def other() -> int:
            return p.mmap(0, 2 * K64, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
        t = p.thread(other, name="other")
        d = p.run(alloc, K64)
        a = t.join()
        assert a + 2 * K64 <= d or d + K64 <= a, f"{a:#x} overlaps the allocation {d:#x}"
        p.exit(0)
    ex = explore(program, "dfs", bound=1)
    assert ex.failure is None, ex.failure
    assert ex.runs > 1


def test_hipmalloc_that_kfd_refuses_gives_its_reservation_back():
    m = rdma_host(ram_size=64 * MiB, nr_amd_gpus=1, modules=())
    m.load_module("amdgpu")
    p = m.spawn("app")
    hip = hiprt(p)
    before = {(v.vm_start, v.vm_end) for v in p.mm.vmas}
    with pytest.raises(HipError):
        hip.hipMalloc(1 << 30)                   # more than the board's VRAM: ENOMEM
    # nothing new is mapped but the heap the runtime's ioctl arguments came from
    new = {(v.vm_start, v.vm_end) for v in p.mm.vmas} - before
    assert {start for start, _ in new} <= set(heap_arenas(p)) and hip.allocations == {}
    p.exit(0)
