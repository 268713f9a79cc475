"""userspace/pyverbs CQEX, CompChannel and CQ.resize: the extended poll API over the
CQEs an RC send writes, completion events after req_notify, resize keeping the
completions not yet polled - and each errno on the way."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ, CQEX, CompChannel, CqInitAttrEx, PollCqAttr
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR

MSG = b"completions, the extended way"


def fw():
    return host.host().machine.hcas[0].fw


def rc_pair(ctx: d.Context, pd: PD, cq) -> tuple[QP, QP]:
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 8)),
              QPAttr()) for _ in range(2)]
    gid = ctx.query_gid(1, 0)
    for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
        attr = QPAttr()
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)
    return qps[0], qps[1]


def send_imm(pd: PD, a: QP, b: QP, imm: int, wr_id: int = 9) -> MR:
    src, dst = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE), MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
    src.write(MSG, len(MSG))
    b.post_recv(RecvWR(wr_id=wr_id + 1, num_sge=1, sg=[SGE(dst.buf, 64, dst.lkey)]))
    a.post_send(SendWR(wr_id=wr_id, opcode=e.IBV_WR_SEND_WITH_IMM, imm_data=imm, num_sge=1,
                       sg=[SGE(src.buf, len(MSG), src.lkey)], send_flags=e.IBV_SEND_SIGNALED))
    return dst


def start(cq: CQEX, tries: int = 10_000) -> int:
    ret = errno.ENOENT
    for _ in range(tries):
        ret = cq.start_poll(PollCqAttr())
        if ret != errno.ENOENT:
            break
    return ret


def test_the_extended_reader_sees_the_fields_of_both_cqes():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQEX(ctx, CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS))
        assert cq.start_poll(PollCqAttr()) == errno.ENOENT      # empty: nothing held
        a, b = rc_pair(ctx, pd, cq)
        dst = send_imm(pd, a, b, 0x12345678)
        assert start(cq) == 0
        seen = {}
        while True:
            assert cq.status == e.IBV_WC_SUCCESS
            seen[cq.wr_id] = (cq.read_opcode(), cq.read_byte_len(), cq.read_qp_num(),
                              cq.read_src_qp(), cq.read_wc_flags(), cq.read_imm_data(),
                              cq.read_vendor_err(), cq.read_sl(), cq.read_dlid_path_bits())
            ret = 0
            for _ in range(10_000):
                ret = cq.poll_next()
                if ret != errno.ENOENT or len(seen) == 2:
                    break
            if ret == errno.ENOENT:
                break
        cq.end_poll()
        assert (seen[9][0], seen[9][2]) == (e.IBV_WC_SEND, a.qp_num)
        opcode, byte_len, qpn, src_qp, flags, imm, verr, _sl, _dlid = seen[10]
        assert (opcode, byte_len, qpn, src_qp) == (e.IBV_WC_RECV, len(MSG), b.qp_num, a.qp_num)
        assert flags & e.IBV_WC_WITH_IMM and imm == 0x12345678 and verr == 0
        assert dst.read(len(MSG), 0) == MSG
        assert cq.start_poll(PollCqAttr()) == errno.ENOENT
        # the consumer index went to the doorbell record: the device sees room again
        assert fw().hca.engine.cq_pi[cq.cq.cqn] == cq.cq.cons_index == 2


@pytest.mark.parametrize("kw, err", [
    (dict(cqe=0), errno.EINVAL),
    (dict(comp_mask=4), errno.EINVAL),                                   # libibverbs
    (dict(comp_mask=e.IBV_CQ_INIT_ATTR_MASK_FLAGS, flags=4), errno.EINVAL),
    (dict(comp_mask=e.IBV_CQ_INIT_ATTR_MASK_PD), errno.EINVAL),          # no parent domain
    (dict(wc_flags=1 << 12), errno.EOPNOTSUPP),                          # libibverbs
])
def test_create_cq_ex_refusals(kw, err):
    with d.Context(name="mlx5_0") as ctx:
        kw.setdefault("cqe", 10)
        with pytest.raises(PyverbsRDMAError, match="Failed to create extended CQ") as ei:
            CQEX(ctx, CqInitAttrEx(**kw))
        assert ei.value.error_code == err and not fw().cqs


def test_timestamps_and_overrun_ignore_take_the_extended_command():
    with d.Context(name="mlx5_0") as ctx:
        ts = CQEX(ctx, CqInitAttrEx(cqe=10, wc_flags=e.IBV_WC_EX_WITH_COMPLETION_TIMESTAMP))
        oi = CQEX(ctx, CqInitAttrEx(cqe=10, comp_mask=e.IBV_CQ_INIT_ATTR_MASK_FLAGS,
                                    flags=e.IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN))
        assert fw().cqs[oi.cq.cqn].cqc["oi"] == 1 and fw().cqs[ts.cq.cqn].cqc["oi"] == 0
        assert ts.cq.read_completion_ts is not None and oi.cq.read_completion_ts is None
        # a reader the CQ was not created with: EOPNOTSUPP (a NULL pointer in C)
        with pytest.raises(PyverbsRDMAError) as ei:
            oi.read_timestamp()
        assert ei.value.error_code == errno.EOPNOTSUPP


def test_an_event_arrives_after_req_notify_and_is_acked_at_close():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        ch = CompChannel(ctx)
        cq = CQ(ctx, 16, None, ch, 0)
        a, b = rc_pair(ctx, pd, cq)
        cq.req_notify()
        send_imm(pd, a, b, 7)
        ch.get_cq_event(cq)                 # blocks until the HCA's interrupt queued it
        assert cq.num_events == 1
        cq.req_notify()                     # CQEs already past the armed index: at once
        ch.get_cq_event(cq)
        cq.ack_events(1)
        assert cq.num_events == 1 and cq.cq.comp_events_completed == 1
        n, wcs = cq.poll(4)
        assert n == 2 and sorted(w.wr_id for w in wcs) == [9, 10]
        a.close()
        b.close()
        cq.close()                          # acks the second event, then destroys
        assert cq.cq.comp_events_completed == 2 and not fw().cqs
        ch.close()


def test_no_armed_cq_means_get_cq_event_gives_up_with_eintr():
    with d.Context(name="mlx5_0") as ctx:
        ch = CompChannel(ctx)
        cq = CQ(ctx, 4, None, ch, 0)
        with pytest.raises(PyverbsRDMAError, match="Failed to get CQ event") as ei:
            ch.get_cq_event(cq)
        assert ei.value.error_code == errno.EINTR


def test_a_channel_closes_its_cqs_first_and_refuses_while_one_is_open():
    with d.Context(name="mlx5_0") as ctx:
        ch = CompChannel(ctx)
        cq = CQ(ctx, 4, None, ch, 0)
        assert ch.cc.refcnt == 1
        from userspace.libibverbs import verbs_cq as vcq
        assert vcq.ibv_destroy_comp_channel(ch.cc) == errno.EBUSY
        ch.close()
        assert cq._closed and not fw().cqs


def test_resize_keeps_unpolled_completions_and_refuses_too_small():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 3, None, None, 0)
        assert cq.cqe == 3
        a, b = rc_pair(ctx, pd, cq)
        send_imm(pd, a, b, 5)
        for _ in range(10_000):                       # both CQEs written, none polled
            if fw().hca.engine.cq_pi.get(cq.cq.cqn, 0) == 2:
                break
            host.current_process().sched_yield()
        with pytest.raises(PyverbsRDMAError, match="Failed to resize CQ") as ei:
            cq.resize(1)                              # 2 entries < 2 CQEs + the RESIZE CQE
        assert ei.value.error_code == errno.EINVAL and cq.cqe == 3
        cq.resize(7)
        assert cq.cqe == 7 and fw().cqs[cq.cq.cqn].cqc["log_cq_size"] == 3
        n, wcs = cq.poll(4)
        assert n == 2 and sorted(w.wr_id for w in wcs) == [9, 10]
        send_imm(pd, a, b, 6, wr_id=20)               # the device goes on in the new ring
        got = []
        for _ in range(10_000):
            got += cq.poll(4)[1]
            if len(got) == 2:
                break
        assert sorted(w.wr_id for w in got) == [20, 21]
        cq.resize(7)                                  # the same size: nothing to do
        with pytest.raises(PyverbsRDMAError) as ei:
            cq.resize(ctx.query_device().max_cqe + 1)
        assert ei.value.error_code == errno.EINVAL


def test_mlx5_cqe_size_128_rings_carry_the_same_completions(monkeypatch):
    monkeypatch.setenv("MLX5_CQE_SIZE", "128")
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQEX(ctx, CqInitAttrEx(cqe=16, wc_flags=e.IBV_WC_STANDARD_FLAGS))
        assert cq.cq.cqe_sz == 128 and fw().cqs[cq.cq.cqn].cqc["cqe_sz"] == 1
        a, b = rc_pair(ctx, pd, cq)
        send_imm(pd, a, b, 3)
        assert start(cq) == 0
        ids = {cq.wr_id}
        for _ in range(10_000):
            if cq.poll_next() == 0:
                ids.add(cq.wr_id)
                break
        cq.end_poll()
        assert ids == {9, 10}


def test_an_mlx5_cqe_size_of_100_is_einval(monkeypatch):
    monkeypatch.setenv("MLX5_CQE_SIZE", "100")
    with d.Context(name="mlx5_0") as ctx:
        with pytest.raises(PyverbsRDMAError) as ei:
            CQ(ctx, 8, None, None, 0)
        assert ei.value.error_code == errno.EINVAL and not fw().cqs


def test_the_providers_dv_create_takes_the_cqe_size():
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.cmd import VerbsError
    from userspace.libibverbs.verbs_types import ibv_cq_init_attr_ex
    from userspace.providers.mlx5.verbs import mlx5dv_create_cq
    with d.Context(name="mlx5_0") as ctx:
        cq = mlx5dv_create_cq(ctx.ctx, ibv_cq_init_attr_ex(cqe=8), 128)
        assert cq.cqe_sz == 128 and fw().cqs[cq.cqn].cqc["cqe_sz"] == 1
        assert v.ibv_destroy_cq(cq) == 0
        with pytest.raises(VerbsError) as ei:
            mlx5dv_create_cq(ctx.ctx, ibv_cq_init_attr_ex(cqe=8), 100)
        assert ei.value.errno == errno.EINVAL and not fw().cqs
