"""drivers/ib_core/uverbs_cmd.py and verbs.py: MODIFY_QP and QUERY_QP as the uverbs file
takes them - every errno of ib_uverbs_modify_qp / modify_qp / _ib_modify_qp and
ib_uverbs_query_qp, each leaving the QP where it was (the firmware's state, the
driver's and libibverbs'), the destination MAC resolution, the response."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.cache import make_default_gid
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.uapi import ib_user_verbs as uv
from tests.drivers.mlx5_ib.ladder import (
    RC_INIT_MASK,
    RC_RTR_MASK,
    errno_of,
    fw,
    host,
    ib_dev,
    modify_raw,
    qp_states,
    rc_qp,
    to_state,
)
from userspace.libc import read_sysfs
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v

GIDS = "/sys/class/infiniband/mlx5_0/ports/1/gids/"
RESET, INIT, RTR, RTS = (v.IBV_QPS_RESET,) * 3, (v.IBV_QPS_INIT,) * 3, (v.IBV_QPS_RTR,) * 3, \
    (v.IBV_QPS_RTS,) * 3


@pytest.fixture
def env():
    """(p, ctx, qp, the port's default GID) with the QP in RESET."""
    m = host()
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    qp = rc_qp(ctx)
    yield p, ctx, qp, make_default_gid(fw(m).vport.mac.to_bytes(6, "big"))
    p.exit(0)


def init_cmd(qp, **kw) -> uv.ib_uverbs_modify_qp:
    fields = dict(qp_handle=qp.handle, attr_mask=RC_INIT_MASK, qp_state=v.IBV_QPS_INIT,
                  port_num=1, qp_access_flags=1)
    fields.update(kw)
    return uv.ib_uverbs_modify_qp(**fields)


def rtr_cmd(qp, gid: bytes, dest: dict | None = None, **kw) -> uv.ib_uverbs_modify_qp:
    fields = dict(qp_handle=qp.handle, attr_mask=RC_RTR_MASK, qp_state=v.IBV_QPS_RTR,
                  path_mtu=v.IBV_MTU_1024, dest_qp_num=qp.qp_num, rq_psn=1,
                  max_dest_rd_atomic=1, min_rnr_timer=12)
    fields.update(kw)
    cmd = uv.ib_uverbs_modify_qp(**fields)
    cmd.dest = uv.ib_uverbs_qp_dest(**{**dict(dgid=gid, sgid_index=0, hop_limit=1,
                                              is_global=1, port_num=1), **(dest or {})})
    return cmd


# -- ib_uverbs_modify_qp / modify_qp ------------------------------------------------------
@pytest.mark.parametrize("kw, err", [
    (dict(attr_mask=RC_INIT_MASK | 1 << 21), errno.EOPNOTSUPP),   # past IB_QP_DEST_QPN
    (dict(attr_mask=RC_INIT_MASK | v.IBV_QP_RATE_LIMIT), errno.EOPNOTSUPP),
    (dict(qp_handle=99), errno.EINVAL),                            # no such QP
    (dict(port_num=2), errno.EINVAL),
    (dict(port_num=0), errno.EINVAL),
    (dict(qp_state=7), errno.EINVAL),                              # past IB_QPS_ERR
    (dict(attr_mask=RC_INIT_MASK | v.IBV_QP_CUR_STATE, cur_qp_state=9), errno.EINVAL),
    (dict(attr_mask=RC_INIT_MASK & ~v.IBV_QP_ACCESS_FLAGS), errno.EINVAL),  # the driver's
    (dict(qp_state=v.IBV_QPS_RTS), errno.EINVAL),                  # RESET -> RTS
])
def test_modify_errors_leave_the_qp_in_reset(env, kw, err):
    p, ctx, qp, _ = env
    assert modify_raw(ctx, init_cmd(qp, **kw)) == err
    assert qp_states(p, ctx, qp) == RESET


@pytest.mark.parametrize("dest, kw, err", [
    (dict(port_num=2), {}, errno.EINVAL),               # the AV's port
    (dict(is_global=0), {}, errno.EINVAL),              # RoCE needs a GRH
    (dict(sgid_index=5), {}, errno.ENODATA),            # an empty GID slot
    (dict(dgid=bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])), {}, errno.EINVAL),  # no ARP
    ({}, dict(path_mtu=7), errno.EINVAL),               # the driver's mtu check
    ({}, dict(attr_mask=RC_RTR_MASK | v.IBV_QP_SQ_PSN), errno.EINVAL),  # not optional here
    ({}, dict(dest_qp_num=0), errno.EINVAL),            # the firmware: no remote QP
])
def test_rtr_errors_leave_the_qp_in_init(env, dest, kw, err):
    p, ctx, qp, gid = env
    to_state(qp, v.IBV_QPS_INIT)
    sgid = ib_dev(p.machine).gid_tables[1].data_vec[0]
    assert modify_raw(ctx, rtr_cmd(qp, gid, dest, **kw)) == err
    assert qp_states(p, ctx, qp) == INIT
    assert sgid.refcnt == 1                    # no reference left behind


def test_a_gid_index_past_a_small_table_is_einval():
    m = host(Mlx5Config(caps={"roce.roce_address_table_size": 8}))
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    qp = rc_qp(ctx)
    to_state(qp, v.IBV_QPS_INIT)
    assert ib_dev(m).gid_tables[1].sz == 8 and read_sysfs(p, GIDS + "8") is None
    assert modify_raw(ctx, rtr_cmd(qp, bytes(16), dict(sgid_index=8))) == errno.EINVAL
    assert qp_states(p, ctx, qp) == INIT
    p.exit(0)


def test_rtr_from_reset_with_an_av_is_not_the_qps_port(env):
    p, ctx, qp, gid = env                       # the QP has no port before INIT
    assert modify_raw(ctx, rtr_cmd(qp, gid)) == errno.EINVAL
    assert qp_states(p, ctx, qp) == RESET


def test_alternate_paths(env):
    p, ctx, qp, gid = env
    to_state(qp, v.IBV_QPS_INIT)
    cmd = rtr_cmd(qp, gid, attr_mask=RC_RTR_MASK | v.IBV_QP_ALT_PATH, alt_port_num=1)
    cmd.alt_dest = uv.ib_uverbs_qp_dest(dgid=gid, is_global=1, port_num=2)
    assert modify_raw(ctx, cmd) == errno.EINVAL        # ports differ (uverbs)
    cmd.alt_dest.port_num = 1
    assert modify_raw(ctx, cmd) == errno.EINVAL        # RoCE has no APM (the core)
    assert qp_states(p, ctx, qp) == INIT


def test_psns_are_kept_to_24_bits(env):
    p, ctx, qp, gid = env
    to_state(qp, v.IBV_QPS_INIT)
    assert modify_raw(ctx, rtr_cmd(qp, gid, rq_psn=0x1000077)) == 0
    assert fw(p.machine).qps[qp.qp_num].qpc["next_rcv_psn"] == 0x77
    assert "_ib_modify_qp rq_psn overflow, masking to 24 bits" in ib_dev(p.machine).log


def test_a_link_local_destination_gives_its_mac(env):
    p, ctx, qp, _ = env
    to_state(qp, v.IBV_QPS_INIT)
    peer = bytes.fromhex("fe80000000000000021122fffe334455")   # MAC 00:11:22:33:44:55
    assert modify_raw(ctx, rtr_cmd(qp, peer)) == 0
    path = fw(p.machine).qps[qp.qp_num].qpc.subs["primary_address_path"]
    assert (path["rmac_47_32"], path["rmac_31_0"]) == (0x0011, 0x22334455)
    assert bytes(path.vals["rgid_rip"]) == peer


def test_a_multicast_destination_gives_a_multicast_mac(env):
    p, ctx, qp, _ = env
    to_state(qp, v.IBV_QPS_INIT)
    group = bytes.fromhex("ff0e0000000000000000000001020304")
    assert modify_raw(ctx, rtr_cmd(qp, group)) == 0
    path = fw(p.machine).qps[qp.qp_num].qpc.subs["primary_address_path"]
    assert (path["rmac_47_32"], path["rmac_31_0"]) == (0x3333, 0x01020304)


def test_the_library_refuses_mask_bits_it_cannot_send(env):
    p, ctx, qp, _ = env
    n = len(fw(p.machine).cmd_log)
    assert v.ibv_modify_qp(qp, v.ibv_qp_attr(), v.IBV_QP_STATE | v.IBV_QP_RATE_LIMIT) == \
        errno.EOPNOTSUPP
    assert errno_of(v.ibv_query_qp, qp, v.IBV_QP_RATE_LIMIT) == errno.EOPNOTSUPP
    assert len(fw(p.machine).cmd_log) == n and qp_states(p, ctx, qp) == RESET


# -- QUERY_QP ------------------------------------------------------------------------------
def query_raw(ctx, handle: int, resp_cls=uv.ib_uverbs_query_qp_resp) -> int:
    return errno_of(c.execute_write, ctx, uv.IB_USER_VERBS_CMD_QUERY_QP,
                    uv.ib_uverbs_query_qp(qp_handle=handle, attr_mask=v.IBV_QP_STATE), resp_cls)


def test_query_errors(env):
    p, ctx, qp, _ = env
    assert query_raw(ctx, 99) == errno.EINVAL
    assert query_raw(ctx, qp.handle, uv.ib_uverbs_query_qp) == errno.ENOSPC  # short response
    ops = ib_dev(p.machine).ops
    saved, ops.query_qp = ops.query_qp, None
    try:
        assert query_raw(ctx, qp.handle) == errno.EOPNOTSUPP
    finally:
        ops.query_qp = saved


def test_query_answers_what_was_set(env):
    p, ctx, qp, gid = env
    to_state(qp, v.IBV_QPS_RTS, gid, qp.qp_num)
    attr, init = v.ibv_query_qp(qp, v.IBV_QP_STATE)
    assert (attr.qp_state, attr.cur_qp_state, attr.path_mtu, attr.dest_qp_num) == \
        (v.IBV_QPS_RTS, v.IBV_QPS_RTS, v.IBV_MTU_1024, qp.qp_num)
    assert (attr.rq_psn, attr.sq_psn, attr.timeout, attr.retry_cnt, attr.rnr_retry) == \
        (0x77, 0x55, 14, 7, 7)
    assert (attr.max_rd_atomic, attr.max_dest_rd_atomic, attr.min_rnr_timer) == (1, 1, 12)
    assert attr.qp_access_flags == v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ
    assert (attr.port_num, attr.pkey_index) == (1, 0)
    ah = attr.ah_attr
    assert (ah.is_global, ah.port_num, ah.grh.dgid, ah.grh.sgid_index, ah.grh.hop_limit,
            ah.dlid) == (1, 1, gid, 0, 1, 0)
    assert attr.alt_ah_attr.port_num == 0      # no alternate path
    # the send queue's sizes come from the library, the receive queue's from the kernel
    assert (init.cap.max_send_wr, init.cap.max_recv_wr) == (qp.sq.max_post, qp.rq.wqe_cnt)
    assert attr.cap == init.cap and init.qp_type == v.IBV_QPT_RC and init.send_cq is qp.send_cq
