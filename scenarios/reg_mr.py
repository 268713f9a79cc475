"""The `reg-mr` scenario: registering and deregistering a user buffer.

A process ("app") opens mlx5_0, allocates a PD, maps eight pages of
anonymous memory and writes them (eight page faults), then registers them:

  ibv_reg_mr            REG_MR: ib_uverbs_reg_mr -> mlx5_ib_reg_user_mr
  ib_umem_get           charge pinned_vm, pin_user_pages_fast(FOLL_WRITE |
                        FOLL_LONGTERM), build the scatterlist, DMA-map it
  CREATE_MKEY           the firmware command giving the HCA the page list
                        (the MTT) and the access rights; lkey = rkey = the mkey
  ibv_dereg_mr          DESTROY_MKEY, ib_umem_release: unmap, unpin, uncharge

Then the buffer is unmapped, the PD freed and the device closed; the
process exits and the machine must pass the leak check.
"""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from kernel_model.trace import traced
from scenarios import scenario
from userspace.libc import check
from userspace.libibverbs import verbs as v

NPAGES = 8
ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


@traced(layer="userspace")
def alloc_and_touch(proc, size: int) -> int:
    """mmap anonymous memory and write every page (the buffer the MR will cover)."""
    addr = check(proc.mmap(0, size), "mmap")
    proc.store(addr, bytes(range(256)) * (size // 256))
    return addr


@traced(layer="userspace")
def register_buffer(proc) -> tuple:
    """The user program's setup: open, PD, a touched buffer, ibv_reg_mr."""
    ctx = v.ibv_open_device(proc, v.ibv_get_device_list(proc)[0])
    pd = v.ibv_alloc_pd(ctx)
    size = NPAGES * proc.machine.page_size
    addr = alloc_and_touch(proc, size)
    mr = v.ibv_reg_mr(pd, addr, size, ACCESS)
    return ctx, pd, mr


@traced(layer="userspace")
def deregister_buffer(ctx, pd, mr) -> int:
    """The user program's teardown: ibv_dereg_mr, munmap, PD, close; 0 on success."""
    rc = v.ibv_dereg_mr(mr)
    check(ctx.proc.munmap(mr.addr, mr.length), "munmap")
    return rc | v.ibv_dealloc_pd(pd) | v.ibv_close_device(ctx)


@scenario("reg-mr", "a process registers 8 touched pages (ib_umem_get pins and DMA-maps "
          "them, CREATE_MKEY), then deregisters them")
def reg_mr() -> None:
    m = rdma_host(name="host0")
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    ctx, pd, mr = p.run(register_buffer, p)
    assert p.mm.pinned_vm == NPAGES, p.mm.pinned_vm
    assert p.run(deregister_buffer, ctx, pd, mr) == 0
    assert p.mm.pinned_vm == 0, p.mm.pinned_vm
    p.exit(0)
    m.check_leaks()
