"""Tests for drivers/mlx5_ib/qp.py: bfreg classes and numbering, create_user_qp, destroy.

Vectors from kernel_facts §5 and §13: the allocation order of 17 QPs, ver-0 and
16/15 contexts, adjust_bfregn, bfregn_to_uar_index, the quantized buffer
offset, the RC 64/64 QPC.  Every errno of mlx5_ib_create_qp is checked to
leave the context as it found it (`state`: pins, bfreg counts, doorbell pages,
firmware objects).
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import ib_qp_init_attr, ib_udata
from drivers.mlx5_ib.main import calc_total_bfregs
from drivers.mlx5_ib.mlx5_ib import MLX5_IB_INVALID_BFREG, MLX5_IB_INVALID_UAR_INDEX, mlx5_ib_qp
from drivers.mlx5_ib.mmap import (
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
    mlx5_ib_uar_obj_alloc,
    mlx5_ib_uar_obj_destroy,
)
from drivers.mlx5_ib.qp import (
    adjust_bfregn,
    alloc_bfreg,
    bfregn_to_uar_index,
    first_hi_bfreg,
    first_med_bfreg,
    max_bfregs,
    mlx5_ib_create_qp,
    mlx5_ib_free_bfreg,
    num_med_bfreg,
)
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import ENOMEM, KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_CREATE_QP, MLX5_CMD_STAT_LIM_ERR
from kernel_model.trace import Tracer
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi import mlx5_abi as abi
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
    MLX5_LIB_CAP_DYN_UAR,
    MLX5_QP_FLAG_BFREG_INDEX,
    MLX5_QP_FLAG_SIGNATURE,
    MLX5_QP_FLAG_TYPE_DCT,
    MLX5_QP_FLAG_UAR_PAGE_INDEX,
    mlx5_ib_alloc_ucontext_req,
    mlx5_ib_create_qp_resp,
)
from tests.drivers.mlx5_ib.ladder import (
    DEFAULT_UIDX,
    RawBytes,
    cmds,
    create_qp_raw,
    errno_of,
    fw,
    get_context,
    hole,
    host,
    ib_dev,
    last_error,
    open_ctx,
    qp_cmd,
    qp_ucmd,
    raw_cq,
    raw_pd,
    rc_qp,
    response_at_edge,
    state,
    ucontext,
    ucontext_req,
    user_pages,
    write_raw,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.tools.write_bw import Endpoint, connect

IBV_QPT_GSI = 1


# -- bfregs on hand-built contexts ------------------------------------------------------------
@pytest.fixture(scope="module")
def m4k():
    return host()


def bfregi_of(m, total=16, low=4, ver=2, lib_4k=True):
    """A context's bfreg info as alloc_ucontext leaves it (no UARs: pure bookkeeping)."""
    from drivers.mlx5_ib.mlx5_ib import mlx5_bfreg_info
    bfregi = mlx5_bfreg_info()
    with m.kernel():
        calc_total_bfregs(ib_dev(m), lib_4k, ucontext_req(total, low), bfregi)
    bfregi.lib_uar_4k = lib_4k
    bfregi.count = [0] * bfregi.total_num_bfregs
    bfregi.sys_pages = [100 + i for i in range(bfregi.num_static_sys_pages)] + \
        [MLX5_IB_INVALID_UAR_INDEX] * (bfregi.num_sys_pages - bfregi.num_static_sys_pages)
    bfregi.ver, bfregi.num_low_latency_bfregs = ver, low
    return bfregi


def alloc_n(m, bfregi, n):
    with m.kernel():
        return [alloc_bfreg(ib_dev(m), bfregi) for _ in range(n)]


def test_bfreg_classes_for_16_with_4_low_latency(m4k):
    b = bfregi_of(m4k)
    dev = ib_dev(m4k)
    with m4k.kernel():
        assert (max_bfregs(dev, b), num_med_bfreg(dev, b), first_med_bfreg(dev, b),
                first_hi_bfreg(dev, b)) == (16, 11, 1, 12)
        assert first_med_bfreg(dev, bfregi_of(m4k, 16, 15)) == -ENOMEM


def test_seventeen_allocations_take_high_then_least_used_medium(m4k):
    b = bfregi_of(m4k)
    assert alloc_n(m4k, b, 17) == [12, 13, 14, 15] + list(range(1, 12)) + [1, 2]
    assert b.count[:16] == [0, 2, 2] + [1] * 13
    assert sum(b.count) == 17  # nothing counted on the dynamic slots


def test_a_freed_high_bfreg_is_handed_out_again(m4k):
    b = bfregi_of(m4k)
    alloc_n(m4k, b, 17)
    with m4k.kernel():
        mlx5_ib_free_bfreg(ib_dev(m4k), b, 13)
    assert b.count[13] == 0
    assert alloc_n(m4k, b, 1) == [13]


def test_medium_search_takes_the_least_used(m4k):
    b = bfregi_of(m4k)
    alloc_n(m4k, b, 17)  # 1 and 2 have two users, 3..11 one
    with m4k.kernel():
        mlx5_ib_free_bfreg(ib_dev(m4k), b, 7)
    assert alloc_n(m4k, b, 2) == [7, 3]


def test_v0_context_always_gets_bfreg_0(m4k):
    b = bfregi_of(m4k, ver=0)
    assert alloc_n(m4k, b, 3) == [0, 0, 0] and b.count[0] == 3


def test_all_but_one_low_latency_then_bfreg_0(m4k):
    b = bfregi_of(m4k, 16, 15)
    assert alloc_n(m4k, b, 17) == list(range(1, 16)) + [0, 0]


def test_dyn_uar_context_has_no_bfreg_to_allocate(m4k):
    b = bfregi_of(m4k)
    b.lib_uar_dyn = True
    with m4k.kernel(), pytest.raises(KernelError) as e:
        alloc_bfreg(ib_dev(m4k), b)
    assert e.value.errno == errno.EINVAL and sum(b.count) == 0


@pytest.mark.parametrize("bfregn,user", [(0, 0), (1, 1), (2, 4), (3, 5), (12, 24), (15, 29)])
def test_adjust_bfregn(m4k, bfregn, user):
    assert adjust_bfregn(ib_dev(m4k), bfregi_of(m4k), bfregn) == user


def test_bfregn_to_uar_index_vectors(m4k):
    b = bfregi_of(m4k)
    dev = ib_dev(m4k)
    with m4k.kernel():
        assert bfregn_to_uar_index(dev, b, 13, False) == 106
        assert bfregn_to_uar_index(dev, b, 0, False) == 100
        b.sys_pages[8] = 999  # the first dynamic page, mapped with ALLOC_WC
        assert bfregn_to_uar_index(dev, b, 1, True) == 999
        for bfregn in (2, 1022):  # dynamic pages 9 and 519: not mapped yet
            with pytest.raises(KernelError) as e:
                bfregn_to_uar_index(dev, b, bfregn, True)
            assert e.value.errno == errno.EINVAL
        with pytest.raises(KernelError) as e:  # page 8 + 512 = 520: out of range
            bfregn_to_uar_index(dev, b, 1024, True)
        assert e.value.errno == errno.EINVAL and "out of range" in str(e.value)
        b.lib_uar_dyn = True
        with pytest.raises(KernelError) as e:
            bfregn_to_uar_index(dev, b, 13, False)
        assert e.value.errno == errno.EINVAL


def test_bfregn_to_uar_index_on_64k_pages_with_4k_uars():
    m = host(page_size=65536)
    b = bfregi_of(m)  # 16 requested: 32 bfregs in one system page of 16 UARs
    assert b.num_static_sys_pages == 1
    with m.kernel():
        assert max_bfregs(ib_dev(m), b) == 32
        assert bfregn_to_uar_index(ib_dev(m), b, 5, False) == b.sys_pages[0] + 2


# -- end to end: the QPC the driver writes ---------------------------------------------------
@pytest.fixture
def rig(app):
    """A process with a context, a PD and a CQ: (p, ctx, pd, cq)."""
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)


def mqp_of(m, qpn):
    return next(q for q in ib_dev(m).qp_list if q.qp_num == qpn)


def cq_of(m, cq):
    """The kernel's mlx5_ib_cq of a CQ some QP uses."""
    return next(q.send_cq for q in ib_dev(m).qp_list if q.send_cq.mcq.cqn == cq.cqn)


def test_rc_64_64_qpc_matches_the_reference(m, rig):
    p, ctx, pd, cq = rig
    uctx = ucontext(p, ctx)
    ucmd = qp_ucmd(p)
    core, resp = create_qp_raw(ctx, qp_cmd(pd, cq), ucmd)
    qpc = fw(m).qps[core.qpn].qpc
    assert (qpc["log_sq_size"], qpc["log_rq_size"], qpc["log_rq_stride"]) == (8, 6, 0)
    assert (qpc["st"], qpc["pm_state"], qpc["rq_type"], qpc["no_sq"]) == (0, 3, 0, 0)
    assert (qpc["pd"], qpc["cqn_snd"], qpc["cqn_rcv"]) == (pd.pdn, cq.cqn, cq.cqn)
    assert qpc["user_index"] == 0  # cqe_version 1: the library's uidx
    # the first QP takes low-latency bfreg 12: UAR of system page 6, user number 24
    assert resp.bfreg_index == 24 and qpc["uar_page"] == uctx.bfregi.sys_pages[6]
    assert uctx.bfregi.count[12] == 1
    mqp = mqp_of(m, core.qpn)
    assert (mqp.buf_size, mqp.rq.offset, mqp.sq.offset, mqp.bfregn) == (17408, 0, 1024, 12)
    assert qpc["dbr_addr"] == mqp.db.dma and mqp in cq_of(m, cq).list_send_qp
    assert fw(m).qps[core.qpn].uid == uctx.devx_uid


@pytest.mark.parametrize("qp_type,st", [(v.IBV_QPT_UC, 1), (v.IBV_QPT_UD, 2)])
def test_uc_and_ud_service_types(m, rig, qp_type, st):
    p, ctx, pd, cq = rig
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq, qp_type=qp_type), qp_ucmd(p))
    assert fw(m).qps[core.qpn].qpc["st"] == st


def test_qp_without_rq_is_a_zero_length_rq(m, rig):
    p, ctx, pd, cq = rig
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq, recv_wr=0), qp_ucmd(p, rq=0, rq_shift=0))
    qpc = fw(m).qps[core.qpn].qpc
    assert (qpc["rq_type"], qpc["log_rq_size"], qpc["log_rq_stride"]) == (3, 0, 0)
    assert mqp_of(m, core.qpn).buf_size == 256 * 64


def test_buffer_at_offset_0x40_over_two_pages_is_4k_pages_offset_1(m, rig):
    p, ctx, pd, cq = rig
    buf = user_pages(p, 2)
    ucmd = qp_ucmd(p, sq=64, rq=0, rq_shift=0, buf_addr=buf + 0x40)  # 0x1000 bytes
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq, recv_wr=0), ucmd)
    q = fw(m).qps[core.qpn]
    assert (q.qpc["log_page_size"], q.qpc["page_offset"], len(q.pas)) == (0, 1, 2)
    assert p.mm.pinned_vm >= 2


def test_sixteenth_qp_shares_and_destroy_gives_the_bfreg_back(m, rig):
    p, ctx, pd, cq = rig
    uctx = ucontext(p, ctx)
    qps = [v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                  cap=v.ibv_qp_cap(1, 1, 1, 1)))
           for _ in range(16)]
    assert [mqp_of(m, q.qp_num).bfregn for q in qps] == [12, 13, 14, 15] + list(range(1, 12)) \
        + [1]
    assert uctx.bfregi.count[1] == 2
    victim = qps[1]
    pinned = p.mm.pinned_vm
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        assert v.ibv_destroy_qp(victim) == 0
    assert_call_flow(t.trace, ["mlx5_ib_destroy_qp", "mlx5_core_destroy_qp", "destroy_qp_user",
                               "mlx5_ib_db_unmap_user", "mlx5_ib_free_bfreg"])
    assert cmds(m, n) == ["DESTROY_QP"] and victim.qp_num not in fw(m).qps
    assert uctx.bfregi.count[13] == 0 and p.mm.pinned_vm < pinned
    nxt = v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                 cap=v.ibv_qp_cap(1, 1, 1, 1)))
    assert mqp_of(m, nxt.qp_num).bfregn == 13
    for q in qps[:1] + qps[2:] + [nxt]:
        assert v.ibv_destroy_qp(q) == 0
    assert sum(uctx.bfregi.count) == 0 and ib_dev(m).qp_list == []


def test_create_qp_call_flow(m, rig):
    p, ctx, pd, cq = rig
    with Tracer() as t:
        p.run(create_qp_raw, ctx, qp_cmd(pd, cq), qp_ucmd(p))
    assert_call_flow(t.trace, ["mlx5_ib_create_qp", "process_vendor_flags", "get_qp_uidx",
                               "create_user_qp", "set_rq_size", "_create_user_qp",
                               "alloc_bfreg", "bfregn_to_uar_index", "set_user_buf_size",
                               "ib_umem_get", "mlx5_ib_populate_pas", "mlx5_ib_db_map_user",
                               "mlx5_qpc_create_qp"])


def test_uar_page_index_uses_the_named_uar_and_counts_no_bfreg(m, rig):
    p, ctx, pd, cq = rig
    uctx = ucontext(p, ctx)
    uar = uctx.bfregi.sys_pages[2]
    core, resp = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(
        p, flags=MLX5_QP_FLAG_UAR_PAGE_INDEX, bfreg_index=uar))
    assert fw(m).qps[core.qpn].qpc["uar_page"] == uar
    assert resp.bfreg_index == MLX5_IB_INVALID_BFREG and sum(uctx.bfregi.count) == 0
    assert mqp_of(m, core.qpn).bfregn == MLX5_IB_INVALID_BFREG
    c.ibv_cmd_destroy_qp(ctx, core.qp_handle)
    assert sum(uctx.bfregi.count) == 0 and core.qpn not in fw(m).qps


def test_signature_flag_sets_wq_signature(m, rig):
    p, ctx, pd, cq = rig
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(p, flags=MLX5_QP_FLAG_SIGNATURE))
    assert fw(m).qps[core.qpn].qpc["wq_signature"] == 1


def test_rq_geometry_is_the_librarys_when_there_is_an_rq(m, rig):
    # the kernel only checks the RQ sizes against the caps when there is no RQ
    p, ctx, pd, cq = rig
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(p, rq=32, rq_shift=5))
    qpc = fw(m).qps[core.qpn].qpc
    assert (qpc["log_rq_size"], qpc["log_rq_stride"]) == (5, 1)


def test_trailing_zero_bytes_and_a_request_without_ece_are_accepted(m, rig):
    p, ctx, pd, cq = rig
    full = qp_ucmd(p).pack()
    create_qp_raw(ctx, qp_cmd(pd, cq), RawBytes(full + bytes(8)))
    ece = abi.mlx5_ib_create_qp.offsetof("ece_options")
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq), RawBytes(qp_ucmd(p).pack()[:ece]))
    assert core.qpn in fw(m).qps


# -- every errno of create, and nothing left behind ----------------------------------------
def _with(ucmd, **fields):
    """ucmd with fields replaced (after its buffers exist, so a hole stays a hole)."""
    for k, val in fields.items():
        setattr(ucmd, k, val)
    return ucmd


def _bad_ucmd(p, case):
    ece = abi.mlx5_ib_create_qp.offsetof("ece_options")
    return {
        "short": lambda: RawBytes(qp_ucmd(p).pack()[:ece - 4]),
        "dirty tail": lambda: RawBytes(qp_ucmd(p).pack() + b"\x01\0\0\0"),
        "reserved": lambda: qp_ucmd(p, reserved=1),
        "unknown flag": lambda: qp_ucmd(p, flags=1 << 12),
        "dct flag": lambda: qp_ucmd(p, flags=MLX5_QP_FLAG_TYPE_DCT),
        "default uidx on v1": lambda: qp_ucmd(p, uidx=DEFAULT_UIDX),
        "uidx over 24 bits": lambda: qp_ucmd(p, uidx=1 << 24),
        "rq shift 33": lambda: qp_ucmd(p, rq_shift=33, buf_addr=user_pages(p)),
        "signature in 8-byte rq wqe": lambda: qp_ucmd(p, rq_shift=3,
                                                      flags=MLX5_QP_FLAG_SIGNATURE),
        "sq not power of 2": lambda: qp_ucmd(p, sq=100),
        "sq too large": lambda: qp_ucmd(p, sq=65536, buf_addr=user_pages(p)),
        "both uar flags": lambda: qp_ucmd(p, flags=MLX5_QP_FLAG_UAR_PAGE_INDEX
                                          | MLX5_QP_FLAG_BFREG_INDEX),
        "dyn bfreg not mapped": lambda: qp_ucmd(p, flags=MLX5_QP_FLAG_BFREG_INDEX,
                                                bfreg_index=1),
        "foreign uar": lambda: qp_ucmd(p, flags=MLX5_QP_FLAG_UAR_PAGE_INDEX, bfreg_index=3),
        "buffer unmapped": lambda: _with(qp_ucmd(p), buf_addr=hole(p)),
        "buffer at 0x20": lambda: qp_ucmd(p, buf_addr=user_pages(p, 6) + 0x20),
        "doorbell unmapped": lambda: _with(qp_ucmd(p), db_addr=hole(p)),
    }[case]()


@pytest.mark.parametrize("case,err,msg", [
    ("short", errno.EINVAL, "process_udata_size"),
    ("dirty tail", errno.EINVAL, "unknown trailing request bytes"),
    ("reserved", errno.EINVAL, "reserved field set"),
    ("unknown flag", errno.EINVAL, "unknown flags 0x1000"),
    ("dct flag", errno.EINVAL, "a DCT needs an SRQ"),   # the flag makes it a DCT
    ("default uidx on v1", errno.EINVAL, "uidx 0xffffff"),
    ("uidx over 24 bits", errno.EINVAL, "uidx 0x1000000"),
    ("rq shift 33", errno.EINVAL, "rq_wqe_shift 33"),
    ("signature in 8-byte rq wqe", errno.EINVAL, "no room for the WQ signature"),
    ("sq not power of 2", errno.EINVAL, "sq_wqe_count 100 is not a power of two"),
    ("sq too large", errno.EINVAL, "sq_wqe_count 65536 > max"),
    ("both uar flags", errno.EINVAL, "both UAR_PAGE_INDEX and BFREG_INDEX"),
    ("dyn bfreg not mapped", errno.EINVAL, "dynamic bfreg 1 is not mapped"),
    ("foreign uar", errno.EINVAL, "CREATE_QP"),
    ("buffer unmapped", errno.EFAULT, ""),
    ("buffer at 0x20", errno.EINVAL, "no page size fits"),
    ("doorbell unmapped", errno.EFAULT, ""),
])
def test_create_qp_errors_leave_nothing_behind(m, rig, case, err, msg):
    p, ctx, pd, cq = rig
    ucmd = _bad_ucmd(p, case)
    before = state(p, ctx)
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq), ucmd) == err
    assert msg in last_error(p)
    assert state(p, ctx) == before


@pytest.mark.parametrize("req_kw,err,msg", [
    (dict(qp_type=IBV_QPT_GSI), errno.EOPNOTSUPP, "check_qp_type"),
    (dict(recv_wr=32769), errno.EINVAL, "max_recv_wr 32769 too large"),
    (dict(recv_wr=0), errno.EINVAL, "do not match"),  # no RQ, but the library sized one
])
def test_create_qp_errors_of_the_core_request(m, rig, req_kw, err, msg):
    p, ctx, pd, cq = rig
    ucmd = qp_ucmd(p)
    before = state(p, ctx)
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq, **req_kw), ucmd) == err
    assert msg in last_error(p) and state(p, ctx) == before


def test_firmware_failure_unwinds_bfreg_umem_and_doorbell(m, rig):
    p, ctx, pd, cq = rig
    ucmd = qp_ucmd(p)
    before = state(p, ctx)
    fw(m).inject(MLX5_CMD_OP_CREATE_QP, MLX5_CMD_STAT_LIM_ERR)
    with Tracer() as t:
        assert p.run(errno_of, create_qp_raw, ctx, qp_cmd(pd, cq), ucmd) == errno.ENOMEM
    assert_call_flow(t.trace, ["mlx5_qpc_create_qp", "mlx5_ib_db_unmap_user",
                               "ib_umem_release", "mlx5_ib_free_bfreg"])
    assert state(p, ctx) == before


def test_response_fault_destroys_the_new_qp(m, rig):
    p, ctx, pd, cq = rig
    ucmd = qp_ucmd(p)
    before = state(p, ctx)
    core = uv.ib_uverbs_create_qp_resp.SIZE
    n = len(fw(m).cmd_log)
    ret = write_raw(ctx, uv.IB_USER_VERBS_CMD_CREATE_QP, qp_cmd(pd, cq), core, ucmd.pack(),
                    mlx5_ib_create_qp_resp.SIZE, response_at_edge(p, core))
    assert ret == errno.EFAULT
    assert cmds(m, n) == ["CREATE_QP", "DESTROY_QP"]
    assert state(p, ctx)[1:] == before[1:] and p.mm.pinned_vm == before[0]


def test_v0_cqe_context_requires_the_default_uidx(m):
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req(max_cqe_version=0))
    pd = raw_pd(ctx)
    cq = raw_cq(p, ctx)
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq), qp_ucmd(p, uidx=0)) == errno.EINVAL
    assert "on a v0 context" in last_error(p)
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(p, uidx=DEFAULT_UIDX))
    assert fw(m).qps[core.qpn].qpc["user_index"] == 0  # not written for CQE v0
    p.exit(0)


def test_v0_abi_context_qps_all_ring_bfreg_0(m):
    p = m.spawn("app")
    ctx, _ = get_context(p, mlx5_ib_alloc_ucontext_req(total_num_bfregs=16,
                                                       num_low_latency_bfregs=4))
    pd = raw_pd(ctx)
    cq = raw_cq(p, ctx)
    uctx = ucontext(p, ctx)
    for _ in range(3):
        core, resp = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(p, uidx=DEFAULT_UIDX))
        assert resp.bfreg_index == 0
        assert fw(m).qps[core.qpn].qpc["uar_page"] == uctx.bfregi.sys_pages[0]
    assert uctx.bfregi.count[0] == 3
    p.exit(0)


def test_signature_without_device_support_is_eopnotsupp():
    m = host(hca=Mlx5Config(caps={"wq_signature": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    before = state(p, ctx)
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq),
                    qp_ucmd(p, flags=MLX5_QP_FLAG_SIGNATURE)) == errno.EOPNOTSUPP
    assert "no WQ signature support" in last_error(p) and state(p, ctx) == before
    p.exit(0)


def test_dyn_uar_context_must_name_its_uar():
    m = host(dyn_uar=True)
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req(lib_caps=1 | MLX5_LIB_CAP_DYN_UAR))
    uctx = ucontext(p, ctx)
    pd = raw_pd(ctx)
    with p.kernel():  # a UAR object, as MLX5_IB_METHOD_UAR_OBJ_ALLOC makes it
        offset, uar, _len = mlx5_ib_uar_obj_alloc(uctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC)
    cq = raw_cq(p, ctx, flags=MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX, uar_page_index=uar)
    before = state(p, ctx)
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq), qp_ucmd(p)) == errno.EINVAL
    assert "alloc_bfreg: dynamic-UAR context" in last_error(p) and state(p, ctx) == before
    assert errno_of(create_qp_raw, ctx, qp_cmd(pd, cq),
                    qp_ucmd(p, flags=MLX5_QP_FLAG_BFREG_INDEX)) == errno.EINVAL
    assert "bfregn_to_uar_index: dynamic-UAR context" in last_error(p)
    core, _ = create_qp_raw(ctx, qp_cmd(pd, cq),
                            qp_ucmd(p, flags=MLX5_QP_FLAG_UAR_PAGE_INDEX, bfreg_index=uar))
    assert fw(m).qps[core.qpn].qpc["uar_page"] == uar
    c.ibv_cmd_destroy_qp(ctx, core.qp_handle)
    c.ibv_cmd_destroy_cq(ctx, cq.handle)
    with p.kernel():
        mlx5_ib_uar_obj_destroy(uctx, offset)
    assert uar not in fw(m).uars
    p.exit(0)


def test_create_flags_are_eopnotsupp_before_anything_is_allocated(m, rig):
    p, ctx, pd, cq = rig
    uctx = ucontext(p, ctx)
    addr = user_pages(p)
    p.store(addr, qp_ucmd(p).pack())
    qp = mlx5_ib_qp(ib_dev(m))
    qp.uobject = type("uobj", (), {"context": uctx})()
    before = state(p, ctx)
    with p.kernel(), pytest.raises(KernelError) as e:
        mlx5_ib_create_qp(qp, ib_qp_init_attr(create_flags=1 << 8),  # RC: no SCATTER_FCS
                          ib_udata(addr, 0, abi.mlx5_ib_create_qp.SIZE, 0))
    assert e.value.errno == errno.EOPNOTSUPP and state(p, ctx) == before


# -- hosts with pages larger than 4 KiB: one ALLOC_UAR is a system page of 4 KiB UARs ----------
# rdma-core asks for max(16, 2 * UARs per page) bfregs, max(4, total - 12) of them low latency,
# and the first QP gets the first high-class bfreg, first_hi_bfreg = total - low = 12:
#   16 KiB: 16 bfregs in 2 system pages of 8 -> page 12 // 8 = 1, UAR 12 % 8 // 2 = 2
#   64 KiB: 32 bfregs in 1 system page of 32 -> page 0, UAR 12 // 2 = 6
@pytest.mark.parametrize("page_size,page,uar", [(16384, 1, 2), (65536, 0, 6)])
def test_first_qp_on_big_pages_names_its_uar_in_a_static_system_page(page_size, page, uar):
    m = host(page_size=page_size)
    p = m.spawn("app")
    ctx = open_ctx(p)
    b, per = ucontext(p, ctx).bfregi, page_size // 4096
    qp = rc_qp(ctx)
    with m.kernel():
        assert mqp_of(m, qp.qp_num).bfregn == 12 == first_hi_bfreg(ib_dev(m), b)
    assert fw(m).qps[qp.qp_num].qpc["uar_page"] == b.sys_pages[page] + uar
    # each static page is one ALLOC_UAR of the context: aligned, all its UARs the context's
    static = b.sys_pages[:b.num_static_sys_pages]
    assert len(static) == {16384: 2, 65536: 1}[page_size]
    assert all(u % per == 0 and fw(m).uars[u].span == per for u in static)
    p.exit(0)
    assert list(fw(m).uars) == [ib_dev(m).mdev.priv.uar.index]  # the context's pages freed


@pytest.mark.parametrize("page_size", [16384, 65536])
def test_dyn_uar_qps_on_big_pages_name_the_uars_of_their_bf_page(page_size):
    m = host(page_size=page_size, dyn_uar=True)
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
    qps = [rc_qp(ctx, pd, cq) for _ in range(3)]
    page_id = qps[0].bf.page_id  # the BF UAR object: two registers per 4 KiB UAR of it
    assert page_id % (page_size // 4096) == 0 and fw(m).uars[page_id].uid == \
        ucontext(p, ctx).devx_uid
    assert [fw(m).qps[q.qp_num].qpc["uar_page"] for q in qps] == \
        [page_id, page_id, page_id + 1]
    assert [v.ibv_destroy_qp(q) for q in qps] == [0, 0, 0]
    assert (v.ibv_destroy_cq(cq), v.ibv_dealloc_pd(pd), v.ibv_close_device(ctx)) == (0, 0, 0)
    assert list(fw(m).uars) == [ib_dev(m).mdev.priv.uar.index]  # NC and BF pages freed
    p.exit(0)


def _endpoint(p: object, psn: int) -> Endpoint:
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, 16384, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
    qp = QP(pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=8, max_recv_wr=8, max_send_sge=1,
                                             max_recv_sge=1, max_inline_data=64)))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn)


@pytest.mark.parametrize("page_size", [16384, 65536])
@pytest.mark.parametrize("dyn_uar", [False, True], ids=["static", "dyn_uar"])
def test_rdma_write_on_big_pages_moves_the_bytes(page_size, dyn_uar):
    m = host(page_size=page_size, dyn_uar=dyn_uar)
    pa, pb = m.spawn("requester"), m.spawn("responder")
    a, b = _endpoint(pa, 0x111), _endpoint(pb, 0x222)
    connect(b, a.dest())
    connect(a, b.dest())
    src = bytes(i * 7 & 0xFF for i in range(16384))
    a.mr.write(src)
    b.mr.write(b"\xee" * 16384)
    hca, since = m.hcas[0], len(m.hcas[0].uar_log)
    for wr_id, (off, n) in enumerate([(0, 8), (100, 5000)]):   # BlueFlame, then a doorbell
        a.qp.post_send(SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(a.mr.buf + off, n, a.mr.lkey)],
                              opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                              remote_addr=b.mr.buf + off, rkey=b.mr.rkey))
        [wc] = a.cq.poll_until(1)
        assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (wr_id, "SUCCESS")
    got = b.mr.read(16384)
    assert got[:8] == src[:8] and got[100:5100] == src[100:5100]
    assert got[8:100] == b"\xee" * 92 and got[5100:] == b"\xee" * (16384 - 5100)
    # the send doorbells landed in the QP's own 4 KiB UAR, one the firmware gave out
    rings = [r for r in list(hca.uar_log)[since:] if r.kind in ("db", "bf")]
    assert rings and {r.uar for r in rings} == {fw(m).qps[a.qp.qp_num].qpc["uar_page"]}
    assert all(r.valid for r in rings) and hca.device_errors == []
    for p in (pa, pb):
        p.exit(0)
