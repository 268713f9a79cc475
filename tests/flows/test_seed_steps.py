"""Every step the seeds name is a traced function, called in the seed's order.

The seeds (../shared/reference/seeds/) describe flows step by step, naming
the rdma-core and kernel functions each step is; a reader greps those names
in a `peermem trace` and must find them.  Each test runs one scenario of
`peermem scenarios` under the tracer and checks the seed's names with
assert_call_flow (a set where the seed gives no order).

Names a seed uses that are deliberately not checked, and why:

  * seed 000's `mlx5_cmd_alloc_uar` under allocate_uars is the older kernel's
    call; since the uid-carrying variant (drivers/infiniband/hw/mlx5/cmd.c)
    allocate_uars calls `mlx5_cmd_uar_alloc`, which is what is checked.
    (mlx5_cmd_alloc_uar is mlx5_core's own and is traced at probe.)
  * seed 004's `mlx5_create_qp_ex` is only the verbs_context_ops entry
    (ibv_create_qp_ex); ibv_create_qp goes mlx5_create_qp -> create_qp and
    never through it, and the model has no ibv_create_qp_ex.
  * `kmalloc`, `kcalloc`, `sg_dma_address`, `MLX5_SET64`, `get_command`:
    allocators, accessors and macros quoted from inside a step, not steps.
  * seed 004's list of the user-space interface (ibv_poll_cq,
    ibv_post_recv, ...) is an API list, not a flow; its post-send flow is.
"""

from __future__ import annotations

from kernel_model.emu.tracefilter import assert_call_flow, filter_trace
from kernel_model.tracedata import Trace
from scenarios import run_traced

#: seed 004 "User-space Implementation" / "Kernel-space Implementation": the
#: steps of ibv_create_qp, in rdma-core's and the kernel's call order
SEED_004_CREATE_QP = [
    "ibv_create_qp", "mlx5_create_qp", "create_qp",
    "mlx5_calc_wq_size", "mlx5_calc_sq_size", "mlx5_calc_send_wqe",
    "mlx5_calc_rq_size", "mlx5_calc_rcv_wqe",
    "mlx5_alloc_qp_buf", "mlx5_alloc_dbrec", "ibv_cmd_create_qp_ex",
    "mlx5_ib_create_qp", "create_user_qp", "ib_umem_get", "mlx5_ib_populate_pas",
    "mlx5_ib_db_map_user", "mlx5_qpc_create_qp",
]

#: seed 000 "Doorbell Record Mapping" and "ibv_create_qp UAR QP Association"
SEED_000_CREATE_QP = [
    "ibv_create_qp", "mlx5_create_qp", "mlx5_alloc_dbrec", "ibv_cmd_create_qp_ex",
    "mlx5_ib_create_qp", "create_user_qp", "alloc_bfreg", "bfregn_to_uar_index",
    "mlx5_ib_db_map_user", "map_uuar",
]

#: seed 000 "ibv_open_device UAR Mapping", user (1), kernel (1), user (2), kernel (2)
SEED_000_OPEN_DEVICE = [
    "ibv_open_device", "mlx5_alloc_context", "mlx5_cmd_get_context",
    "mlx5_ib_alloc_ucontext", "calc_total_bfregs", "allocate_uars", "mlx5_cmd_uar_alloc",
    "mlx5_set_context", "mlx5_mmap", "mlx5_ib_mmap", "uar_mmap",
]

#: seed 004 "Posting a Send Request"
SEED_004_POST_SEND = ["ibv_post_send", "mlx5_post_send", "post_send_db"]


def _trace(scenario: str) -> Trace:
    return run_traced(scenario)


def test_seed_004_create_qp_steps_are_traced_in_order() -> None:
    """mlx5_calc_sq_size & co. were inline in the trace (only mlx5_calc_wq_size
    showed), the buffer allocation was inline in mlx5_create_qp, and the
    command was ibv_cmd_create_qp where rdma-core's create_qp calls
    ibv_cmd_create_qp_ex."""
    qp = filter_trace(_trace("create-qp"), function="ibv_create_qp")
    assert_call_flow(qp, SEED_004_CREATE_QP)


def test_seed_004_sizing_nests_as_in_verbs_c() -> None:
    """mlx5_calc_wq_size calls sq then rq; each calls its per-WQE function."""
    sizing = filter_trace(_trace("create-qp"), function="mlx5_calc_wq_size")
    (root,) = sizing.roots[sizing.track_of("app")]
    assert [c.func for c in root.children] == ["mlx5_calc_sq_size", "mlx5_calc_rq_size"]
    assert [[g.func for g in c.children] for c in root.children] == \
        [["mlx5_calc_send_wqe"], ["mlx5_calc_rcv_wqe"]]


def test_seed_000_create_qp_steps_are_traced_in_order() -> None:
    trace = _trace("create-qp")
    assert_call_flow(filter_trace(trace, function="ibv_create_qp"), SEED_000_CREATE_QP)
    # The seed's mlx5_ib_db_map_user kmallocs the page and ib_umem_get()s it:
    # that happens for the first record on a page - here the CQ's, which the
    # QP's record then shares (one user page of records, one pin).
    first = filter_trace(trace, function="mlx5_ib_db_map_user")
    assert_call_flow(first, ["mlx5_ib_db_map_user", "ib_umem_get", "mlx5_ib_db_map_user"])


def test_seed_000_open_device_steps_are_traced_in_order() -> None:
    trace = filter_trace(_trace("open-device"), function="ibv_open_device")
    assert_call_flow(trace, SEED_000_OPEN_DEVICE)


def test_seed_004_post_send_steps_are_traced_in_order() -> None:
    assert_call_flow(_trace("rdma-write"), SEED_004_POST_SEND)


#: seed 003: a peer MR's registration (acquire, get_pages, dma_map, then
#: get_page_size) and deregistration (dma_unmap, put_pages, release), as
#: nv_peer_mem's callbacks; reg-cache evicts a GPU MR that was not invalidated
SEED_003_PEER_MR = [
    "ib_peer_umem_get", "nv_mem_acquire", "nv_mem_get_pages", "nv_dma_map",
    "nv_mem_get_page_size", "nv_dma_unmap", "nv_mem_put_pages", "nv_mem_release",
]

#: seeds 002 and 003: the free callback invalidates the MR (cudaFree), the
#: client frees its mapping and page table; release still comes at dereg
SEED_002_003_INVALIDATE = [
    "ib_register_peer_memory_client", "cudaMalloc", "nv_mem_acquire",
    "nvidia_p2p_get_pages", "nv_dma_map", "nvidia_p2p_dma_map_pages", "cudaFree",
    "ib_invalidate_peer_memory", "nvidia_p2p_free_dma_mapping",
    "nvidia_p2p_free_page_table", "ibv_dereg_mr", "nv_mem_release",
]


def test_seed_003_peer_mr_callbacks_are_traced_in_order() -> None:
    trace = _trace("reg-cache")
    assert_call_flow(trace, ["fi_mr_reg", "fi_close"])     # seed 001's pair
    assert_call_flow(trace, SEED_003_PEER_MR)


def test_seed_002_003_invalidation_steps_are_traced_in_order() -> None:
    assert_call_flow(_trace("gpudirect"), SEED_002_003_INVALIDATE)
