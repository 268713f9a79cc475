"""The `create-qp` scenario: one RC QP, from libmlx5's sizing to the firmware.

A process ("app") opens mlx5_0, allocates a PD and a CQ, and creates one RC
QP with 64 send and 64 receive work requests of one SGE each:

  mlx5_create_qp        libmlx5 sizes the queues (mlx5_calc_wq_size: RQ 64 x
                        16 B first, SQ 256 x 64 B after it = 17408 bytes,
                        rounded up to 5 pages), allocates the buffer and a
                        doorbell record (mlx5_alloc_dbrec), and sends
                        CREATE_QP with both addresses in mlx5_ib_create_qp
  mlx5_ib_create_qp     the kernel: create_user_qp -> alloc_bfreg (the QP's
                        BlueFlame register) -> ib_umem_get (pin and DMA-map the
                        buffer) -> mlx5_ib_populate_pas (its page list for the
                        firmware) -> mlx5_ib_db_map_user (pin the doorbell
                        page) -> the CREATE_QP firmware command
  map_uuar              back in libmlx5: the QP rings bfs[resp.bfreg_index]

Then everything is torn down in reverse (QP, CQ, PD, context), the process
exits and the machine must pass the leak check.
"""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from kernel_model.trace import traced
from scenarios import scenario
from userspace.libibverbs import verbs as v

#: the QP's capabilities: send WRs, receive WRs, send SGEs, receive SGEs
QP_CAP = (64, 64, 1, 1)


@traced(layer="userspace")
def create_resources(proc) -> tuple:
    """The user program's setup: open, PD, CQ, one RC QP."""
    ctx = v.ibv_open_device(proc, v.ibv_get_device_list(proc)[0])
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    qp = v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                cap=v.ibv_qp_cap(*QP_CAP)))
    return ctx, pd, cq, qp


@traced(layer="userspace")
def destroy_resources(ctx, pd, cq, qp) -> int:
    """The user program's teardown, children first; 0 when every verb succeeded."""
    return (v.ibv_destroy_qp(qp) | v.ibv_destroy_cq(cq) | v.ibv_dealloc_pd(pd)
            | v.ibv_close_device(ctx))


@scenario("create-qp", "a process opens mlx5_0 and creates a PD, a CQ and one RC QP "
          "(buffer and doorbell pinned, CREATE_QP), then destroys them")
def create_qp() -> None:
    m = rdma_host(name="host0")
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    res = p.run(create_resources, p)
    assert p.run(destroy_resources, *res) == 0
    p.exit(0)
    m.check_leaks()
