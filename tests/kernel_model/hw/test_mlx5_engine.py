"""Tests for kernel_model/hw/mlx5_engine.py and fabric.py: the ConnectX data-path engine.

Unit-level: what the engine does with doorbells it must ignore (a QP bound to
another UAR page, a QP that is not ready to send), the Fabric's ports and
routing, the engine task's life (started by the first doorbell, ended at
machine shutdown) and the per-QP state it forgets when a QP is destroyed or
reset.  The flows that move bytes are in tests/flows/test_data_path.py.
"""

from __future__ import annotations

import struct
from types import SimpleNamespace

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric, route
from kernel_model.hw.mlx5_engine import OP_RDMA_WRITE, engine_of
from kernel_model.sched import SCHED
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.tools.write_bw import Endpoint, connect

ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


@pytest.fixture
def host():
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    return m


def _objects(p, n_qps: int = 1):
    ctx = Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    mr = MR(pd, 4096, ACCESS)
    qps = [QP(pd, QPInitAttr(cq, cq, cap=QPCap(4, 4, 1, 1, 0))) for _ in range(n_qps)]
    return ctx, pd, cq, mr, qps


def _engine_tasks() -> list:
    return [t for t in SCHED.alive.values() if t.name.startswith("mlx5_hca")]


def _ctrl(counter: int, opcode: int, qpn: int, ds: int, signaled: bool = True) -> bytes:
    """A WQE control segment: opmod_idx_opcode, qpn_ds, signature, fm_ce_se, imm."""
    return struct.pack(">IIBHBI", counter << 8 | opcode, qpn << 8 | ds, 0, 0,
                       8 if signaled else 0, 0)


def _write_wqe(p, qp, mr, counter: int, raddr: int) -> bytes:
    """An RDMA WRITE WQE of 8 bytes from the MR to raddr (ctrl, raddr, data segments),
    stored in the SQ ring at its slot, as mlx5_post_send would."""
    wqe = _ctrl(counter, OP_RDMA_WRITE, qp.qp_num, 3) + \
        struct.pack(">QII", raddr, mr.rkey, 0) + struct.pack(">IIQ", 8, mr.lkey, mr.buf)
    wqe += bytes(64 - len(wqe))
    q = qp.qp
    p.store(q.buf + q.sq.offset + (counter & (q.sq.wqe_cnt - 1)) * 64, wqe)
    return wqe


def _ring(p, qp, counter: int) -> None:
    """The doorbell record's send counter."""
    p.store(qp.qp.db + 4, struct.pack(">I", counter))


# -- doorbells the engine must ignore -----------------------------------------------------
def test_doorbell_for_a_qp_on_another_uar_is_ignored_and_reported(host):
    p = host.spawn("app")
    ctx, _pd, cq, mr, (qp,) = _objects(p)
    hca = host.hcas[0]
    eng = engine_of(hca)
    own = qp.qp.bf
    other = ctx.ctx.bfs[1]                       # bfreg 1: UAR page 0, not the QP's page 6
    assert own.reg // 4096 != other.reg // 4096
    my_uar = hca.fw.qps[qp.qp_num].ctx["uar_page"]
    _write_wqe(p, qp, mr, 0, mr.buf + 64)
    _ring(p, qp, 1)
    mark = len(hca.uar_log)
    p.store(other.reg, _ctrl(0, OP_RDMA_WRITE, qp.qp_num, 3)[:8])      # 64-bit doorbell
    p.store(other.reg, _write_wqe(p, qp, mr, 0, mr.buf + 64))          # BlueFlame copy
    recs = list(hca.uar_log)[mark:]
    assert [r.kind for r in recs] == ["db", "bf"]
    wrong_uar = recs[0].uar
    assert wrong_uar != my_uar
    assert hca.async_events == [("bad_doorbell", qp.qp_num, wrong_uar)] * 2
    # a doorbell naming a QP that does not exist, on the QP's own page
    p.store(own.reg, _ctrl(0, OP_RDMA_WRITE, 0xABCDE, 3)[:8])
    assert hca.async_events[-1] == ("bad_doorbell", 0xABCDE, my_uar)
    # nothing was started, fetched or completed
    assert _engine_tasks() == [] and not eng.work
    assert eng.stats["wqes"] == 0 and eng.qps == {}
    assert cq.poll(4) == []
    assert hca.device_errors == []


def test_doorbell_for_a_qp_in_reset_or_init_does_nothing(host):
    p = host.spawn("app")
    ctx, _pd, cq, mr, (qp,) = _objects(p)
    hca = host.hcas[0]
    eng = engine_of(hca)
    mr.write(b"payload!")
    _write_wqe(p, qp, mr, 0, mr.buf + 64)
    _ring(p, qp, 1)
    p.store(qp.qp.bf.reg, _ctrl(0, OP_RDMA_WRITE, qp.qp_num, 3)[:8])
    (task,) = _engine_tasks()                     # the doorbell woke the engine
    for _ in range(5):
        p.sched_yield()
    assert task.state == "blocked"                # it ran, found RESET, and went to sleep
    assert eng.stats["wqes"] == 0 and qp.qp_num not in eng.qps
    assert cq.poll(4) == [] and mr.read(8, 64) == bytes(8)
    assert hca.async_events == []
    # INIT: the send queue does not run either
    ret = v.ibv_modify_qp(qp.qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, port_num=1,
                                               qp_access_flags=v.IBV_ACCESS_REMOTE_WRITE),
                          v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT
                          | v.IBV_QP_ACCESS_FLAGS)
    assert ret == 0
    assert hca.fw.qps[qp.qp_num].state == 1
    p.store(qp.qp.bf.reg, _ctrl(0, OP_RDMA_WRITE, qp.qp_num, 3)[:8])
    for _ in range(5):
        p.sched_yield()
    assert eng.stats["wqes"] == 0 and eng.stats["frames_tx"] == 0
    assert cq.poll(4) == [] and mr.read(8, 64) == bytes(8)


# -- the fabric --------------------------------------------------------------------------------
def _fake_port(mac: int):
    return SimpleNamespace(fw=SimpleNamespace(vport=SimpleNamespace(mac=mac)), fabric=None,
                           machine=SimpleNamespace(name="fake"))


def test_fabric_attach_detach_and_duplicate_mac():
    f = Fabric("sw0")
    a, b = _fake_port(0x0C42A1000001), _fake_port(0x0C42A1000002)
    f.attach(a)
    f.attach(b)
    f.attach(a)                                   # the same port again: harmless
    assert f.ports == {a.fw.vport.mac: a, b.fw.vport.mac: b}
    assert a.fabric is f and b.fabric is f
    clash = _fake_port(a.fw.vport.mac)
    with pytest.raises(ValueError, match="already on sw0"):
        f.attach(clash)
    assert clash.fabric is None and f.ports[a.fw.vport.mac] is a
    # routing: to a port, to itself (loopback, not counted), to nobody
    assert f.route(a, b.fw.vport.mac) is b
    assert f.route(a, a.fw.vport.mac) is a
    assert f.route(a, 0x0C42A1FFFFFF) is None
    assert f.frames == 1
    f.detach(b)
    assert b.fabric is None and b.fw.vport.mac not in f.ports
    assert f.route(a, b.fw.vport.mac) is None
    # an HCA on no fabric reaches only itself
    assert route(b, b.fw.vport.mac) is b and route(b, a.fw.vport.mac) is None
    assert "sw0" in repr(f) and "fake" in repr(f)


def test_real_hcas_get_distinct_macs_and_detach_at_shutdown():
    f = Fabric()
    ms = [rdma_host(ram_size=64 << 20, name=n, fabric=f) for n in ("x", "y")]
    macs = {m.hcas[0].fw.vport.mac for m in ms}
    assert len(macs) == 2 and set(f.ports) == macs
    ms[0].check_leaks()
    assert set(f.ports) == {ms[1].hcas[0].fw.vport.mac}
    assert ms[0].hcas[0].fabric is None


def _connected_pair(fabric: Fabric):
    ms = [rdma_host(ram_size=64 << 20, name=n, fabric=fabric) for n in ("a", "b")]
    eps = []
    for i, m in enumerate(ms):
        m.load_module("mlx5_ib")
        p = m.spawn(f"p{i}")
        ctx, pd, cq, mr, (qp,) = _objects(p)
        eps.append((m, p, Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), 0x10 + i)))
    connect(eps[1][2], eps[0][2].dest())
    connect(eps[0][2], eps[1][2].dest())
    return eps


def test_a_frame_to_an_unknown_mac_ends_in_retry_exceeded():
    fabric = Fabric()
    (ma, _pa, a), (mb, _pb, b) = _connected_pair(fabric)
    b.mr.write(b"\x77" * 16)
    fabric.detach(mb.hcas[0])                     # pull b's cable
    a.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(a.mr.buf, 16, a.mr.lkey)],
                          opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                          remote_addr=b.mr.buf, rkey=b.mr.rkey))
    (wc,) = a.cq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (1, "RETRY_EXC_ERR")
    assert ma.hcas[0].fw.qps[a.qp.qp_num].state == 6
    assert engine_of(mb.hcas[0]).stats["frames_rx"] == 0
    assert b.mr.read(16) == b"\x77" * 16
    errs = [e for e in ma.hcas[0].async_events if e[0] == "qp_error"]
    assert errs and "no port with MAC" in errs[0][2]


# -- the engine task's life, and what it forgets ---------------------------------------------------
def test_engine_task_stops_at_machine_shutdown():
    fabric = Fabric()
    (ma, _pa, a), (mb, _pb, b) = _connected_pair(fabric)
    a.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(a.mr.buf, 8, a.mr.lkey)],
                          opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                          remote_addr=b.mr.buf, rkey=b.mr.rkey))
    assert len(a.cq.poll_until(1)) == 1
    names = sorted(t.name for t in _engine_tasks())
    assert names == sorted(f"mlx5_hca {m.hcas[0].name}" for m in (ma, mb))
    ma.check_leaks()
    mb.check_leaks()
    assert SCHED.alive == {}
    for m in (ma, mb):
        eng = engine_of(m.hcas[0])
        assert eng.stopping and eng.task is None
        eng.kick()                                 # a powered-off engine stays off
        assert eng.task is None


def test_engine_forgets_a_destroyed_or_reset_qp(host):
    p = host.spawn("app")
    ctx, pd, cq, mr, qps = _objects(p, 2)
    eps = [Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), 0) for qp in qps]
    connect(eps[0], eps[1].dest())
    connect(eps[1], eps[0].dest())
    eng = engine_of(host.hcas[0])
    for i, qp in enumerate(qps):
        qp.post_send(SendWR(wr_id=i, sg_list=[v.ibv_sge(mr.buf, 8, mr.lkey)],
                            opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                            remote_addr=mr.buf + 64, rkey=mr.rkey))
    assert len(cq.poll_until(2)) == 2
    n0, n1 = qps[0].qp_num, qps[1].qp_num
    assert eng.qps[n0].sq_ci == 1 and eng.qps[n1].sq_ci == 1
    assert eng.cq_pi[cq.cq.cqn] == 2
    qps[0].close()
    assert n0 not in eng.qps and n1 in eng.qps
    ret = v.ibv_modify_qp(qps[1].qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE)
    assert ret == 0
    assert n1 not in eng.qps
    cqn = cq.cq.cqn
    qps[1].close()
    cq.close()
    assert cqn not in eng.cq_pi


def test_a_blueflame_copy_to_a_qp_not_ready_is_dropped(host):
    p = host.spawn("app")
    ctx, pd, cq, mr, qps = _objects(p, 2)
    eng = engine_of(host.hcas[0])
    qp = qps[0]
    mr.write(b"STALE!!!REAL!!!!")
    # a stray BlueFlame copy of WQE 0 (a WRITE of the first 8 bytes to +1024) in RESET
    p.store(qp.qp.bf.reg, _write_wqe(p, qp, mr, 0, mr.buf + 1024))
    for _ in range(5):
        p.sched_yield()
    assert eng.stats["wqes"] == 0
    assert [e[0] for e in host.hcas[0].async_events] == ["bf_qp_not_ready"]
    eps = [Endpoint(ctx, pd, cq, mr, q, ctx.query_gid(1, 0), 0) for q in qps]
    connect(eps[1], eps[0].dest())
    connect(eps[0], eps[1].dest())
    # the real WQE 0, by a 64-bit doorbell: two WRs in one post
    second = SendWR(wr_id=2, sg_list=[v.ibv_sge(mr.buf + 8, 8, mr.lkey)],
                    opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                    remote_addr=mr.buf + 2056, rkey=mr.rkey)
    qp.post_send(SendWR(wr_id=1, next=second, sg_list=[v.ibv_sge(mr.buf + 8, 8, mr.lkey)],
                        opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                        remote_addr=mr.buf + 2048, rkey=mr.rkey))
    assert [(wc.wr_id, wc.status) for wc in cq.poll_until(2)] == [(1, 0), (2, 0)]
    assert mr.read(16, 2048) == b"REAL!!!!REAL!!!!"
    assert mr.read(8, 1024) == bytes(8)           # the stray copy never ran


def test_a_revoke_waits_only_while_a_dma_on_the_mkey_is_in_flight(host, monkeypatch):
    """The firmware's revoke (mkey_revoked) answers at once when no DMA holds the
    mkey - the device's own wait, no kernel scheduling point - and otherwise sleeps
    until the DMA step that holds it is over."""
    from kernel_model.kthread import kthread_run
    engine = host.hcas[0].engine
    reasons: list[str] = []
    point = type(SCHED).point

    def spy(self, reason):
        reasons.append(reason)
        return point(self, reason)
    monkeypatch.setattr(type(SCHED), "point", spy)
    with host.kernel():
        engine.mkey_revoked(9)
    assert "wait_event" not in reasons and 9 not in engine.draining
    engine.mkey_busy[9] = 1                # a DMA step passed its checks on mkey 9
    engine._held.append(9)
    with host.kernel():
        t = kthread_run(engine.mkey_revoked, 9, name="revoke")
    SCHED.yield_("test")
    assert "wait_event" in reasons and not t.done and 9 in engine.draining
    engine._release_held()                 # its bytes have moved
    t.join()
    assert t.done and not engine.draining and not engine.mkey_busy


@pytest.mark.parametrize("backend", ["c", "python"])
@pytest.mark.parametrize("npieces", [1, 3, 16, 17, 40])
def test_dma_gather_and_scatter_over_scattered_pieces(backend, npieces):
    """hca_dma_gather reads the pieces in order into one payload and hca_dma_scatter
    writes a payload back over them, whatever their count: up to FEW_PIECES as slice
    copies, beyond as one ops.dma_copy - on both backends; the bytes between the
    pieces are never touched."""
    from kernel_model.hw.mlx5_engine import FEW_PIECES
    from kernel_model.page_alloc import GFP_KERNEL
    assert 3 <= FEW_PIECES < 17
    m = rdma_host(ram_size=64 << 20, backend=backend)
    m.load_module("mlx5_ib")
    eng = engine_of(m.hcas[0])
    block = m.zone.alloc(GFP_KERNEL, 7, "test pieces")         # 128 pages, one block
    base = block.pfn << m.page_shift
    assert eng._phys(base, 16, False) == [(base, 16)]          # no IOMMU: DMA is phys
    ps = m.page_size
    # piece i: 100 + 37 * i bytes from offset 13 * i of every other page, last first
    pieces = [(base + (2 * i) * ps + 13 * i, 100 + 37 * i) for i in range(npieces)][::-1]
    ram = m.mem.ram
    ram[base:base + 128 * ps] = bytes((7 * k + 3) & 0xFF for k in range(128 * ps))
    want = b"".join(bytes(ram[p:p + n]) for p, n in pieces)
    length = len(want)
    got = eng.hca_dma_gather(pieces, length)
    assert type(got) is bytearray and got == want
    payload = bytes((5 * k + 11) & 0xFF for k in range(length))
    before = bytes(ram[base:base + 128 * ps])
    eng.hca_dma_scatter(pieces, payload)
    after = bytes(ram[base:base + 128 * ps])
    off, changed = 0, set()
    for p, n in pieces:
        assert after[p - base:p - base + n] == payload[off:off + n]
        changed.update(range(p - base, p - base + n))
        off += n
    assert all(after[k] == before[k] for k in range(0, 128 * ps, 7) if k not in changed)
    m.zone.free(block.pfn, 7)
    m.check_leaks()


@pytest.mark.parametrize("extra", [-40, 0, 40])
def test_one_piece_of_ram_moves_as_many_pieces_do_and_is_recorded(extra):
    """One piece of RAM - most DMA - takes hca_dma_gather's and hca_dma_scatter's
    short way: the same bytes as the general one (a payload of another size than the
    piece moves min(both) bytes, as ops.dma_copy does), and a recorded step still
    names every page it read or wrote (touch_ram), for partial-order reduction."""
    from kernel_model.emu.explore import Step
    from kernel_model.page_alloc import GFP_KERNEL
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    eng = engine_of(m.hcas[0])
    block = m.zone.alloc(GFP_KERNEL, 2, "test piece")          # 4 pages
    base, ps = block.pfn << m.page_shift, m.page_size
    ram = m.mem.ram
    ram[base:base + 4 * ps] = bytes((3 * k + 1) & 0xFF for k in range(4 * ps))
    piece = (base + ps - 100, 2 * ps)                           # pages 0..2 of the block
    st = Step(0, None, set(), set())
    kept = []
    SCHED.fp_step, SCHED.fp_keep = st, lambda obj, made: kept.append(obj)
    try:
        got = eng.hca_dma_gather([piece], piece[1])
        payload = bytes((9 * k + 5) & 0xFF for k in range(piece[1] + extra))
        before = bytes(ram[base:base + 4 * ps])
        eng.hca_dma_scatter([piece], payload)
    finally:
        SCHED.fp_step = SCHED.fp_keep = None
    p, n = piece
    assert got == before[p - base:p - base + n]
    moved = min(n, len(payload))
    after = bytes(ram[base:base + 4 * ps])
    assert after[p - base:p - base + moved] == payload[:moved]
    assert after[:p - base] == before[:p - base]
    assert after[p - base + moved:] == before[p - base + moved:]
    pfns = {(id(m.mem), pfn) for pfn in range(p >> m.page_shift, ((p + n - 1) >> m.page_shift) + 1)}
    assert len(pfns) == 3 and st.reads >= pfns and st.writes >= pfns and m.mem in kept
    m.zone.free(block.pfn, 2)
    m.check_leaks()
