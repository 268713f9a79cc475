"""userspace/pyverbs: the pyverbs-compatible face - its shapes, errors, object lifetime,
the implicit host, and bytes moved through it end to end."""

from __future__ import annotations

import errno
import gc
import os

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host, mem_alloc
from userspace.pyverbs.addr import GID, AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.flow import Flow, FlowAttr
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.wr import SGE, RecvWR, SendWR


def fw():
    return host.host().machine.hcas[0].fw


def open_fds() -> set[int]:
    return {fd for fd, f in enumerate(host.current_process().task.files.fdt) if f is not None}


def counts() -> tuple[int, int, int, int]:
    """The firmware's PDs, CQs, mkeys and user contexts."""
    f = fw()
    return len(f.pds), len(f.cqs), len(f.mkeys), len(f.uctxs)


def test_the_device_list_names_the_hca_in_bytes():
    devs = d.get_device_list()
    assert [x.name for x in devs] == [b"mlx5_0"]
    assert devs[0].node_type == e.IBV_NODE_CA and devs[0].guid != 0


def test_a_context_opens_the_uverbs_file_and_closing_it_twice_is_harmless():
    fds = open_fds()
    ctx = d.Context(name="mlx5_0")
    assert ctx.ctx.cmd_fd not in fds and ctx.ctx.cmd_fd in open_fds()
    token = ctx.cmd_fd  # a real descriptor standing for the emulated one
    os.close(os.dup(token))
    attr = ctx.query_device()
    assert attr.vendor_id == 0x02C9 and attr.phys_port_cnt == 1
    assert attr.fw_version.count(".") == 2
    ctx.close()
    ctx.close()
    assert open_fds() == fds
    with pytest.raises(OSError):
        os.fstat(token)


def test_a_context_needs_a_name_and_an_existing_device():
    with pytest.raises(PyverbsUserError, match="Device name must be provided"):
        d.Context()
    with pytest.raises(PyverbsRDMAError) as ei:
        d.Context(name="mlx5_9")
    assert ei.value.error_code == errno.ENODEV


def test_a_failed_query_carries_pyverbs_message_and_the_errno():
    with d.Context(name="mlx5_0") as ctx:
        with pytest.raises(PyverbsRDMAError) as ei:
            ctx.query_port(7)
    assert ei.value.error_code == errno.EINVAL
    assert "Failed to query port" in ei.value.args[0]
    assert "Invalid argument" in ei.value.args[0]
    assert isinstance(ei.value, PyverbsError)


def test_port_and_gid_queries():
    with d.Context(name="mlx5_0") as ctx:
        port = ctx.query_port(1)
        assert port.state == e.IBV_PORT_ACTIVE and port.link_layer == e.IBV_LINK_LAYER_ETHERNET
        assert port.gid_tbl_len > 0 and "Invalid" not in d.translate_mtu(port.active_mtu)
        gid = ctx.query_gid(1, 0)
        assert gid.gid.startswith("fe80:0000:0000:0000:")
        assert ctx.query_gid_type(1, 0) in (e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1,
                                            e.IBV_GID_TYPE_SYSFS_ROCE_V2)


def test_closing_a_context_closes_its_children_first():
    before = counts()
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    mr = MR(pd, 4096, e.IBV_ACCESS_LOCAL_WRITE)
    cq = CQ(ctx, 16, None, None, 0)
    assert counts()[:3] == (before[0] + 1, before[1] + 1, before[2] + 1)
    ctx.close()
    assert counts() == before
    assert mr._closed and pd._closed and cq._closed


def test_an_object_collected_unclosed_is_freed_by_the_next_verb():
    ctx = d.Context(name="mlx5_0")
    pds = counts()[0]
    PD(ctx)  # dropped at once: pyverbs frees it when it is collected
    gc.collect()
    assert counts()[0] == pds + 1  # not from inside the collector...
    PD(ctx).close()  # ...but by the next verb
    assert counts()[0] == pds
    ctx.close()


def test_mr_write_and_read_go_through_the_process_memory():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        mr = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        mr.write("hello", 5, 3)
        assert mr.read(8, 0) == b"\0\0\0hello"
        assert host.current_process().load(mr.buf + 3, 5) == b"hello"
        assert mr.lkey and mr.length == 64
        with pytest.raises(PyverbsUserError):
            mr.read(1, -1)
    with pytest.raises(PyverbsUserError, match="closed"):
        mr.read(1, 0)


def test_a_failed_registration_frees_the_buffer_it_allocated():
    proc = host.current_process()
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        vmas = len(proc.mm.vmas)
        with pytest.raises(PyverbsRDMAError) as ei:
            MR(pd, 4096, e.IBV_ACCESS_REMOTE_WRITE)  # remote write needs local write
        assert ei.value.error_code == errno.EINVAL
        assert len(proc.mm.vmas) == vmas


def _rc_pair(ctx: d.Context, pd: PD, cq: CQ) -> tuple[QP, QP]:
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)),
              QPAttr()) for _ in range(2)]
    gid = ctx.query_gid(1, 0)
    for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
        attr = QPAttr()
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)
    return qps[0], qps[1]


def test_an_rc_send_arrives_and_completes_on_both_sides():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16, None, None, 0)
        a, b = _rc_pair(ctx, pd, cq)
        assert a.qp_state == e.IBV_QPS_RTS
        src = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        dst = MR(pd, 64, e.IBV_ACCESS_LOCAL_WRITE)
        src.write(b"pyverbs over the emulator", 25)
        b.post_recv(RecvWR(wr_id=7, num_sge=1, sg=[SGE(dst.buf, 64, dst.lkey)]))
        a.post_send(SendWR(wr_id=9, num_sge=1, sg=[SGE(src.buf, 25, src.lkey)],
                           send_flags=e.IBV_SEND_SIGNALED))
        wcs = []
        for _ in range(10_000):
            n, got = cq.poll(2)
            wcs += got
            if len(wcs) == 2:
                break
        assert sorted(w.wr_id for w in wcs) == [7, 9]
        assert all(w.status == e.IBV_WC_SUCCESS for w in wcs)
        recv = next(w for w in wcs if w.wr_id == 7)
        assert recv.byte_len == 25 and recv.opcode == e.IBV_WC_RECV and recv.qp_num == b.qp_num
        assert dst.read(25, 0) == b"pyverbs over the emulator"
        assert cq.poll(1) == (0, [])


def test_a_modify_with_a_bad_mask_fails_with_the_errno():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 4, None, None, 0)
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq))
        attr = QPAttr(qp_state=e.IBV_QPS_RTR)
        with pytest.raises(PyverbsRDMAError) as ei:
            qp.modify(attr, e.IBV_QP_STATE)  # RESET -> RTR skips INIT
        assert ei.value.error_code == errno.EINVAL and qp.qp_state == e.IBV_QPS_RESET
        with pytest.raises(PyverbsUserError):
            QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq), QPAttr()).to_init(attr)


def test_a_feature_not_emulated_fails_with_eopnotsupp_but_its_attrs_build():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        attr = FlowAttr(num_of_specs=1, port=1)
        assert attr.port == 1 and attr.num_of_specs == 1 and attr.flags == 0
        with pytest.raises(PyverbsRDMAError) as ei:
            Flow(pd, attr)
    assert ei.value.error_code == errno.EOPNOTSUPP


def test_gid_text_and_bytes_round_trip():
    g = GID("fe80:0000:0000:0000:0202:c9ff:fe00:0001")
    assert g.raw[:2] == b"\xfe\x80" and str(g) == "fe80:0000:0000:0000:0202:c9ff:fe00:0001"
    with pytest.raises(PyverbsUserError):
        GID("fe80::1")


def test_mem_alloc_is_memory_of_the_emulated_process():
    addr = mem_alloc.posix_memalign(100, 4096)
    mem_alloc.write(addr, "abc", 3, 10)
    assert mem_alloc.read(addr, 3, 10) == b"abc"
    mem_alloc.writebe32(addr, 0x01020304)
    assert mem_alloc.read(addr, 4) == b"\x01\x02\x03\x04" and mem_alloc.read32(addr) == 0x04030201
    mem_alloc.free(addr)
    with pytest.raises(PyverbsUserError):
        mem_alloc.free(addr)


def test_the_host_reads_the_environment_live_and_maps_identity():
    proc = host.current_process()
    assert proc.task.cred.uid == os.getuid()
    os.environ["PEERMEM_PYVERBS_TEST_VAR"] = "1"
    try:
        assert proc.environ["PEERMEM_PYVERBS_TEST_VAR"] == "1"
    finally:
        del os.environ["PEERMEM_PYVERBS_TEST_VAR"]


def test_the_host_is_configured_by_environment_and_configure(monkeypatch):
    host.shutdown()
    monkeypatch.setenv("PEERMEM_PYVERBS_HCAS", "2")
    monkeypatch.setenv("PEERMEM_PYVERBS_PARAMS", "mlx5_ib.dyn_uar=1")
    assert host.config()["params"] == {"mlx5_ib": {"dyn_uar": 1}}
    assert [x.name for x in d.get_device_list()] == [b"mlx5_0", b"mlx5_1"]
    with pytest.raises(RuntimeError, match="already built"):
        host.configure(nr_hcas=1)
    host.shutdown()
    monkeypatch.setenv("PEERMEM_PYVERBS_PARAMS", "dyn_uar=1")
    with pytest.raises(ValueError, match="module.name=value"):
        host.config()
    with pytest.raises(TypeError, match="unknown settings"):
        host.configure(hcas=2)
