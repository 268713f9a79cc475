"""userspace/pyverbs: on-demand-paging MRs through the face - MR(..., ON_DEMAND) is
registered (no pin, an mkey whose pages the HCA faults in), query_device_ex reports
the RC ODP caps rdma-core's test_odp.py asks for, and a send between ODP MRs lands."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from tests.userspace.pyverbs_face.test_pyverbs_face import _rc_pair
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.wr import SGE, RecvWR, SendWR

LW = e.IBV_ACCESS_LOCAL_WRITE
ODP = LW | e.IBV_ACCESS_ON_DEMAND


def fw():
    return host.host().machine.hcas[0].fw


def test_the_device_reports_rc_odp():
    with d.Context(name="mlx5_0") as ctx:
        odp = ctx.query_device_ex().odp_caps
        assert odp.general_caps == e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT
        want = (e.IBV_ODP_SUPPORT_SEND | e.IBV_ODP_SUPPORT_WRITE | e.IBV_ODP_SUPPORT_READ
                | e.IBV_ODP_SUPPORT_ATOMIC | e.IBV_ODP_SUPPORT_SRQ_RECV)
        assert odp.rc_odp_caps == want | e.IBV_ODP_SUPPORT_RECV
        assert odp.xrc_odp_caps == want and odp.ud_odp_caps == e.IBV_ODP_SUPPORT_SEND


def test_an_odp_mr_pins_nothing_and_its_mkey_faults():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        proc = ctx.proc
        pinned = proc.mm.pinned_vm
        mr = MR(pd, 3 * 4096, ODP)
        assert proc.mm.pinned_vm == pinned and mr.lkey == mr.rkey
        mk = fw().mkeys[mr.lkey >> 8]
        assert mk.pg_access and not mk.mkc["free"]
        mr.write(b"odp", 3)                                    # the CPU's own access
        assert mr.read(3, 0) == b"odp"
        with pytest.raises(PyverbsRDMAError) as ei:            # no access-only rereg
            mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, access=LW)
        assert ei.value.error_code == errno.EOPNOTSUPP
        mr.close()
        assert mr.lkey >> 8 not in fw().mkeys


def test_implicit_mr_without_on_demand_is_einval():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        with pytest.raises(PyverbsRDMAError) as ei:
            MR(pd, 0, LW, implicit=True)
        assert ei.value.error_code == errno.EINVAL


def test_an_implicit_mr_sends_from_any_buffer_and_prefetches():
    """MR(pd, n, ODP, address=a, implicit=True): ibv_reg_mr(pd, NULL, SIZE_MAX) - one key
    for the whole address space (buf is only a); sync and async prefetch make the slice's
    child ahead of the HCA; a send then lands with no page fault."""
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16, None, None, 0)
        a, b = _rc_pair(ctx, pd, cq)
        plain = MR(pd, 3 * 4096, LW)
        imr = MR(pd, 4096, ODP, address=plain.buf, implicit=True)
        assert imr.buf == plain.buf and imr.length == 4096
        mk = fw().mkeys[imr.lkey >> 8]
        assert mk.mkc["access_mode_1_0"] == 3 and mk.mkc["length64"]      # KSM, whole space
        sg = [SGE(plain.buf, 64, imr.lkey)]
        assert pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                            e._IBV_ADVISE_MR_FLAG_FLUSH, sg) == 0
        assert pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0,     # asynchronous
                            [SGE(plain.buf + 4096, 64, imr.lkey)]) == 0
        for _ in range(50):                                  # the async prefetch's work runs
            cq.poll(1)
        plain.write(b"one key, any buffer", 19)
        n = [c[0] for c in fw().cmd_log].count("PAGE_FAULT_RESUME")
        b.post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(plain.buf + 4096, 64, imr.lkey)]))
        a.post_send(SendWR(wr_id=2, num_sge=1, sg=[SGE(plain.buf, 19, imr.lkey)],
                           send_flags=e.IBV_SEND_SIGNALED))
        wcs = []
        for _ in range(10_000):
            wcs += cq.poll(2)[1]
            if len(wcs) == 2:
                break
        assert sorted((w.wr_id, w.status) for w in wcs) == [(1, e.IBV_WC_SUCCESS),
                                                            (2, e.IBV_WC_SUCCESS)]
        assert plain.read(19, 4096) == b"one key, any buffer"
        assert [c[0] for c in fw().cmd_log].count("PAGE_FAULT_RESUME") == n
        imr.close()
        assert imr.lkey >> 8 not in fw().mkeys


def test_a_send_between_odp_mrs_faults_and_lands():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16, None, None, 0)
        a, b = _rc_pair(ctx, pd, cq)
        src, dst = MR(pd, 8192, ODP), MR(pd, 8192, ODP)
        n = len(fw().cmd_log)
        src.write(b"faulted in on demand", 20)
        b.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(dst.buf + 4096, 64, dst.lkey)]))
        a.post_send(SendWR(wr_id=9, num_sge=1, sg=[SGE(src.buf, 20, src.lkey)],
                           send_flags=e.IBV_SEND_SIGNALED))
        wcs = []
        for _ in range(10_000):
            wcs += cq.poll(2)[1]
            if len(wcs) == 2:
                break
        assert sorted((w.wr_id, w.status) for w in wcs) == [(7, e.IBV_WC_SUCCESS),
                                                            (9, e.IBV_WC_SUCCESS)]
        assert dst.read(20, 4096) == b"faulted in on demand"
        assert "PAGE_FAULT_RESUME" in [c[0] for c in fw().cmd_log[n:]]


def test_pd_advise_mr_prefetches_and_reports_errors():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        mr = MR(pd, 8192, ODP)
        sg = [SGE(mr.buf, 8192, mr.lkey)]
        assert pd.advise_mr(e._IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                            e._IBV_ADVISE_MR_FLAG_FLUSH, sg) == 0
        assert not fw().mkeys[mr.lkey >> 8].pf_absent          # every entry present now
        with pytest.raises(PyverbsRDMAError) as ei:
            pd.advise_mr(7, e._IBV_ADVISE_MR_FLAG_FLUSH, sg)
        assert ei.value.error_code == errno.EOPNOTSUPP
        assert str(ei.value).startswith("Failed to advise MR")


def test_srq_receives_into_odp_pages_keep_the_posted_order():
    """A faulting SRQ receive gives its WQE back: the retry takes the same WQE."""
    from kernel_model.hw.mlx5_engine import engine_of
    from userspace.pyverbs.addr import AHAttr, GlobalRoute
    from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
    from userspace.pyverbs.srq import SRQ, SrqAttr, SrqInitAttr
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 64, None, None, 0)
        srq = SRQ(pd, SrqInitAttr(SrqAttr(max_wr=8, max_sge=1)))
        recv = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, srq=srq,
                                 cap=QPCap(1, 0)), QPAttr())
        send = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(8, 1)),
                  QPAttr())
        gid = ctx.query_gid(1, 0)
        for me, peer in ((send, recv), (recv, send)):
            attr = QPAttr()
            attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
            attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
            attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
            me.to_rts(attr)
        dst, src = MR(pd, 3 * 4096, ODP), MR(pd, 4096, ODP)
        for i in range(2):
            srq.post_recv(RecvWR(wr_id=100 + i, num_sge=1,
                                 sg=[SGE(dst.buf + 4096 * (i + 1), 64, dst.lkey)]))
        got, n = [], len(fw().cmd_log)
        for i in range(2):
            text = f"srq message {i}".encode()
            src.write(text, len(text))
            send.post_send(SendWR(wr_id=i, num_sge=1, sg=[SGE(src.buf, len(text), src.lkey)],
                                  send_flags=e.IBV_SEND_SIGNALED))
            wcs = []
            for _ in range(20_000):
                wcs += cq.poll(2 - len(wcs))[1]
                if len(wcs) == 2:
                    break
            rwc = next(w for w in wcs if w.opcode == e.IBV_WC_RECV)
            assert rwc.status == e.IBV_WC_SUCCESS
            got.append(rwc.wr_id)
            assert dst.read(len(text), 4096 * (i + 1)) == text
        assert got == [100, 101]
        assert [c[0] for c in fw().cmd_log[n:]].count("PAGE_FAULT_RESUME") >= 2
        srqn = srq.get_srq_num()
        assert engine_of(host.host().machine.hcas[0]).srq_hw[srqn][1] == 2   # no WQE lost
