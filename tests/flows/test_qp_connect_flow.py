"""End-to-end: two RC QPs of one process connected to each other through the port's own
GID (loopback), RESET -> INIT -> RTR -> RTS with pyverbs' to_rts, as perftest connects
a QP pair: ibv_modify_qp -> MODIFY_QP write() -> ib_core (GID entry, destination MAC)
-> mlx5_ib (QPC, opcode) -> firmware.  Then torn down by closing the context, which
moves each live QP to RESET before destroying it."""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.hw.mlx5_ifc import MLX5_ADDR_OF
from kernel_model.trace import Tracer
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, PD, QP, Context, QPCap, QPInitAttr


@pytest.fixture
def host():
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    return m


def _pair(ctx):
    pd, cq = PD(ctx), CQ(ctx, 32)
    cap = QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)
    return QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=cap)), QP(pd, QPInitAttr(scq=cq, rcq=cq,
                                                                         cap=cap))


@pytest.mark.parametrize("sgid_index", [0, 1], ids=["roce_v1", "roce_v2"])
def test_two_rc_qps_connect_through_the_ports_own_gid(host, sgid_index):
    p = host.spawn("app")
    fw = host.hcas[0].fw
    with Context(p) as ctx:
        gid = ctx.query_gid(1, sgid_index)
        a, b = _pair(ctx)
        with Tracer() as t:
            p.run(lambda: a.to_rts(gid, b.qp_num, sgid_index=sgid_index, sq_psn=0x100,
                                   rq_psn=0x200))
        b.to_rts(gid, a.qp_num, sgid_index=sgid_index, sq_psn=0x200, rq_psn=0x100)
        assert_call_flow(t.trace, [
            "ibv_modify_qp", "mlx5_modify_qp", "ibv_cmd_modify_qp", "sys_write",
            "ib_uverbs_write", "ib_uverbs_modify_qp", "modify_qp", "_ib_modify_qp",
            "mlx5_ib_modify_qp", "__mlx5_ib_modify_qp", "mlx5_core_qp_modify",   # RST2INIT
            "_ib_modify_qp", "rdma_get_gid_attr", "ib_resolve_eth_dmac",         # INIT2RTR
            "mlx5_ib_modify_qp", "mlx5_set_path", "mlx5_core_qp_modify", "mlx5_cmd_exec",
            "mlx5_ib_modify_qp", "mlx5_core_qp_modify"])                         # RTR2RTS
        for me, peer, psn in ((a, b, 0x100), (b, a, 0x200)):
            qpc = fw.qps[me.qp_num].qpc
            path = MLX5_ADDR_OF("qpc", qpc, "primary_address_path")
            assert (qpc["state"], qpc["remote_qpn"], qpc["next_send_psn"]) == \
                (v.IBV_QPS_RTS, peer.qp_num, psn)
            assert bytes(MLX5_ADDR_OF("ads", path, "rgid_rip")) == gid
            assert path["rmac_47_32"] << 32 | path["rmac_31_0"] == fw.vport.mac
            assert path["src_addr_index"] == sgid_index
            assert (path["udp_sport"] != 0) == (sgid_index == 1)   # RoCE v2 rides UDP
            attr, _ = me.query(v.IBV_QP_STATE)
            assert (attr.qp_state, attr.dest_qp_num) == (v.IBV_QPS_RTS, peer.qp_num)
        n = len(fw.cmd_log)
    # closing the context destroyed both live QPs, each moved to RESET first
    names = [e[0] for e in fw.cmd_log[n:]]
    assert [x for x in names if x.endswith("_QP")] == ["2RST_QP", "DESTROY_QP"] * 2
    assert fw.qps == {}
    p.exit(0)
