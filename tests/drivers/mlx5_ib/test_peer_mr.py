"""Tests for peer-memory MRs in mlx5_ib (drivers/mlx5_ib/mr.py, umr.py) over the PeerDirect
core (drivers/ib_core/peer_mem.py).

A fake peer client (tests/drivers/ib_core/fake_peer.py) backs cudaMalloc'd
addresses with host RAM of its own; an RC QP pair on the machine's loopback moves
real bytes into and out of that RAM through the peer MR.  Checked: the mkey is
created before the invalidation notifier is activated; an invalidation revokes the
mkey (EMU_UMR_REVOKE_MKEY: free=1, UMR PD, DMA drained) so later RDMA through it
completes in error; an invalidation that arrives while the MR is being registered
waits for the activation; deregistration revokes, stops the notifier, destroys the
mkey and releases the umem, without unmapping twice (peermem_facts.md §2.7-2.8).
"""

from __future__ import annotations

import errno

import attrs
import pytest

from drivers.ib_core.peer_mem import (
    PEER_MEM_INVALIDATE_UNMAPS,
    STATS,
    UMEM_PEER_INVALIDATED,
    UMEM_PEER_MAPPED,
    UMEM_PEER_UNMAPPED,
)
from drivers.mlx5_ib.mr import mlx5_invalidate_umem
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_CREATE_MKEY,
    MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY,
    MLX5_CMD_STAT_INT_ERR,
)
from kernel_model.kthread import kthread_run
from kernel_model.locking import mutex_is_locked, mutex_unlock
from kernel_model.sched import SCHED, Strategy
from kernel_model.trace import Tracer
from tests.drivers.ib_core.fake_peer import ALL_ACCESS, K64, PeerEnv
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import CQ, MR, QP, QPCap, QPInitAttr, SendWR
from userspace.tools.write_bw import Endpoint, connect, setup

SIG = v.IBV_SEND_SIGNALED
HOST_BUF = 4 * K64
KINDS = {"plain": {}, "ex_size0": {"ex": True, "ex_size": 0,
                                   "ex_flags": PEER_MEM_INVALIDATE_UNMAPS},
         "unmaps": {"unmaps": True}}


@pytest.fixture
def env():
    e = PeerEnv()
    yield e
    e.close()


@attrs.define(eq=False)
class Pair:
    """The requester `a` (host memory, its own process) and the responder `b` (env's
    process: a QP and, once made, a peer MR)."""

    env: PeerEnv
    pa: object
    a: Endpoint
    cq: object
    qp: object
    mr: object = None

    def dest_b(self, psn: int = 0x222) -> dict:
        return {"qpn": self.qp.qp_num, "psn": psn, "rkey": self.mr.rkey if self.mr else 0,
                "vaddr": self.mr.buf if self.mr else 0,
                "gid": self.env.ctx.query_gid(1, 0)}

    def write(self, wr_id: int, src_off: int, dst: int, length: int, rkey: int | None = None):
        """RDMA WRITE from a's host buffer to b's address dst (rkey: the peer MR's)."""
        wr = SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(self.a.mr.buf + src_off, length,
                                                    self.a.mr.lkey)],
                    opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG, remote_addr=dst,
                    rkey=self.mr.rkey if rkey is None else rkey)
        self.a.qp.post_send(wr)

    def read(self, wr_id: int, dst_off: int, src: int, length: int):
        """RDMA READ of b's [src, +length) into a's host buffer."""
        wr = SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(self.a.mr.buf + dst_off, length,
                                                    self.a.mr.lkey)],
                    opcode=v.IBV_WR_RDMA_READ, send_flags=SIG, remote_addr=src,
                    rkey=self.mr.rkey)
        self.a.qp.post_send(wr)


def make_pair(env: PeerEnv, mr: MR) -> Pair:
    """Connect a host-memory requester to env's process, whose MR is the peer MR."""
    pa = env.m.spawn("requester")
    a = pa.run(setup, pa, HOST_BUF, 16, 0x111)
    cq = env.p.run(CQ, env.ctx, 16)
    qp = env.p.run(QP, env.pd, QPInitAttr(cq, cq, cap=QPCap(max_send_wr=16, max_recv_wr=16,
                                                             max_send_sge=1, max_recv_sge=1)))
    pair = Pair(env, pa, a, cq, qp, mr)
    b_ep = Endpoint(env.ctx, env.pd, cq, mr, qp, env.ctx.query_gid(1, 0), 0x222)
    env.p.run(connect, b_ep, a.dest())
    pa.run(connect, a, b_ep.dest())
    return pair


def status(wcs) -> list[tuple[int, str]]:
    return [(wc.wr_id, v.ibv_wc_status_str(wc.status)) for wc in wcs]


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 7 + seed * 31) & 0xFF for i in range(n))


def mkey_of(env: PeerEnv, key: int):
    return env.hca.fw.mkeys.get(key >> 8)


def umem_of(fp, i: int = 0):
    return fp.reg.umem_xa.entries[i]


def cmds_since(env: PeerEnv, n: int) -> list[str]:
    return [c[0] for c in env.hca.fw.cmd_log[n:] if c[0].endswith("MKEY")]


def balanced(stats: dict) -> bool:
    return (stats["num_alloc_mrs"] == stats["num_dealloc_mrs"]
            and stats["num_reg_pages"] == stats["num_dereg_pages"]
            and stats["num_reg_bytes"] == stats["num_dereg_bytes"])


# -- registration -----------------------------------------------------------------------------
def test_peer_mr_activates_the_notifier_after_create_mkey(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    with Tracer() as t:
        mr = env.reg_mr(va + 0x1000, K64)
    assert_call_flow(t.trace, [
        "mlx5_ib_reg_user_mr", "ib_umem_get_peer", "pin_user_pages_fast", "ib_peer_umem_get",
        "ib_get_peer_client", "create_real_mr", "reg_create", "mlx5_ib_create_mkey",
        "ib_umem_activate_invalidation_notifier"])
    umem = umem_of(fp)
    assert umem.invalidation_func is mlx5_invalidate_umem
    kmr = umem.invalidation_private
    assert (kmr.lkey, kmr.rkey, kmr.umem) == (mr.lkey, mr.rkey, umem)
    assert umem.mapped_state == UMEM_PEER_MAPPED and not mutex_is_locked(umem.mapping_lock)
    mk = mkey_of(env, mr.lkey)
    assert mk.mkc["free"] == 0 and mk.mkc["start_addr"] == va + 0x1000
    assert mk.mkc["len"] == K64
    assert fp.names() == ["acquire", "get_pages", "dma_map", "get_page_size"]
    env.dereg(mr)
    assert mkey_of(env, mr.lkey) is None


def test_rdma_lands_at_exactly_the_right_bytes_of_an_unaligned_peer_mr(env):
    fp = env.peer()
    va = env.gpu(4 * K64, fp)
    fp.write(va, b"\xee" * 4 * K64)
    start, length = va + 0x3000, 2 * K64 + 0x1800      # ends mid-page in the third page
    mr = env.reg_mr(start, length)
    pair = make_pair(env, mr)
    data = pattern(length)
    pair.pa.run(pair.a.mr.write, data)
    pair.write(1, 0, start, length)
    assert pair.a.cq.poll_until(1)[0].status == v.IBV_WC_SUCCESS
    got = fp.read(va, 4 * K64)
    assert got[0x3000:0x3000 + length] == data
    assert got[:0x3000] == b"\xee" * 0x3000
    assert got[0x3000 + length:] == b"\xee" * (4 * K64 - 0x3000 - length)
    # a WRITE at an offset, crossing a client page boundary
    pair.write(2, 100, start + K64 - 0x3000 - 50, 100)
    assert pair.a.cq.poll_until(1)[0].status == v.IBV_WC_SUCCESS
    assert fp.read(va + K64 - 50, 100) == data[100:200]
    # and an RDMA READ back out of the peer MR
    pair.pa.run(pair.a.mr.write, b"\0" * HOST_BUF)
    pair.read(3, 0, start, length)
    (wc,) = pair.a.cq.poll_until(1)
    assert wc.status == v.IBV_WC_SUCCESS and wc.byte_len == length
    assert pair.pa.run(pair.a.mr.read, length) == fp.read(start, length)
    env.dereg(mr)
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]


def test_non_invalidating_peer_mr_moves_bytes(env):
    nc = env.peer("nc", invalidating=False)
    va = env.gpu(K64, nc)
    mr = env.reg_mr(va, K64)
    pair = make_pair(env, mr)
    pair.pa.run(pair.a.mr.write, pattern(K64, 3))
    pair.write(1, 0, va, K64)
    assert pair.a.cq.poll_until(1)[0].status == v.IBV_WC_SUCCESS
    assert nc.read(va, K64) == pattern(K64, 3)
    n = len(env.hca.fw.cmd_log)
    env.dereg(mr)
    assert cmds_since(env, n) == ["EMU_UMR_REVOKE_MKEY", "DESTROY_MKEY"]
    assert nc.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    assert env.m.bugs == []


# -- invalidation ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_invalidation_revokes_the_mkey(env, kind):
    fp = env.peer(**KINDS[kind])
    unmaps = kind == "unmaps"
    va = env.gpu(2 * K64, fp)
    mr = env.reg_mr(va, 2 * K64)
    pair = make_pair(env, mr)
    pair.pa.run(pair.a.mr.write, pattern(2 * K64))
    pair.write(1, 0, va, K64)                          # works before
    assert pair.a.cq.poll_until(1)[0].status == v.IBV_WC_SUCCESS
    umem = umem_of(fp)
    kmr = umem.invalidation_private
    idx = mr.lkey >> 8
    n_cmd, n_calls = len(env.hca.fw.cmd_log), len(fp.calls)
    assert fp.invalidate(fp.live_ctx[0]) == 0
    assert cmds_since(env, n_cmd) == ["EMU_UMR_REVOKE_MKEY"]
    mk = mkey_of(env, mr.lkey)
    assert mk is not None                              # the mkey stays until dereg
    assert (mk.mkc["free"], mk.mkc["pd"]) == (1, 0) and kmr.revoked
    assert idx not in env.hca.engine.mkey_busy
    during = fp.names()[n_calls:]
    if unmaps:
        assert umem.mapped_state == UMEM_PEER_INVALIDATED and during == []
    else:
        assert umem.mapped_state == UMEM_PEER_UNMAPPED
        assert during == ["dma_unmap", "put_pages"]
    # a WRITE to the revoked rkey completes in error and moves no byte
    fp.write(va + K64, b"\x55" * K64)
    pair.write(2, 0, va + K64, 256)
    (wc,) = pair.a.cq.poll_until(1)
    assert wc.wr_id == 2 and wc.status == v.IBV_WC_REM_ACCESS_ERR
    assert fp.read(va + K64, K64) == b"\x55" * K64
    # deregistration: revoke again, destroy; the client is not unmapped twice
    n_cmd, n_calls = len(env.hca.fw.cmd_log), len(fp.calls)
    pinned = env.p.mm.pinned_vm
    env.dereg(mr)
    assert pinned - env.p.mm.pinned_vm == 2 * K64 // 4096     # the peer umem's charge
    assert cmds_since(env, n_cmd) == ["EMU_UMR_REVOKE_MKEY", "DESTROY_MKEY"]
    assert fp.names()[n_calls:] == ["release"]
    assert fp.names().count("dma_unmap") == (0 if unmaps else 1)
    assert balanced(fp.reg.stats) and fp.reg.stats["num_alloc_mrs"] == 1
    assert fp.reg.umem_xa.entries == {}


def test_invalidated_mr_as_a_local_key_fails_locally(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    pair = make_pair(env, mr)
    fp.write(va, pattern(512, 9))
    # b WRITEs from its peer MR into a's buffer: fine before the invalidation
    a_buf, a_rkey = pair.a.mr.buf, pair.a.mr.rkey

    def post(wr_id):
        wr = SendWR(wr_id=wr_id, sg_list=[v.ibv_sge(va, 512, mr.lkey)],
                    opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG, remote_addr=a_buf, rkey=a_rkey)
        pair.qp.post_send(wr)
        return pair.cq.poll_until(1)[0]
    assert env.p.run(post, 1).status == v.IBV_WC_SUCCESS
    assert pair.pa.run(pair.a.mr.read, 512) == pattern(512, 9)
    fp.invalidate(fp.live_ctx[0])
    wc = env.p.run(post, 2)
    assert wc.wr_id == 2 and wc.status == v.IBV_WC_LOC_PROT_ERR
    env.dereg(mr)


def test_invalidating_one_mr_leaves_the_others(env):
    fp = env.peer()
    va = env.gpu(2 * K64, fp)
    mr0 = env.reg_mr(va, K64)
    mr1 = env.reg_mr(va + K64, K64)
    pair = make_pair(env, mr1)
    fp.invalidate(fp.live_ctx[0])                     # mr0's registration
    assert mkey_of(env, mr0.lkey).mkc["free"] == 1
    assert mkey_of(env, mr1.lkey).mkc["free"] == 0
    pair.pa.run(pair.a.mr.write, pattern(K64))
    pair.write(1, 0, va + K64, K64)
    assert pair.a.cq.poll_until(1)[0].status == v.IBV_WC_SUCCESS
    assert fp.read(va + K64, K64) == pattern(K64)
    env.dereg(mr0)
    env.dereg(mr1)
    assert balanced(fp.reg.stats)


class PreemptEngineAtDmaWrite(Strategy):
    """Default order, except once: when the HCA task reaches the point just before it
    DMA-writes through mkey `index`, hand the CPU to `victim`."""

    def __init__(self, engine, index: int):
        self.engine, self.index = engine, index
        self.victim = None
        self.fired = False

    def choose(self, sched, candidates, reason):
        if (not self.fired and self.victim is not None and reason == "dma_write"
                and sched.current is self.engine.task and self.index in self.engine.mkey_busy
                and self.victim in candidates):
            self.fired = True
            return self.victim
        return candidates[0]


@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_revoke_waits_for_dma_in_flight(env, kind):
    fp = env.peer(**KINDS[kind])
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    pair = make_pair(env, mr)
    data = pattern(K64, 5)
    pair.pa.run(pair.a.mr.write, data)
    engine = env.hca.engine
    idx = mr.rkey >> 8
    seen: dict = {}

    def gpu_free(ctx):
        # the HCA is between translating the rkey and writing the bytes
        seen["busy_at_start"] = engine.mkey_busy.get(idx, 0)
        seen["landed_at_start"] = fp.read(va, K64) == data
        fp.invalidate(ctx)
        seen["busy_at_end"] = idx in engine.mkey_busy
        seen["landed_at_end"] = fp.read(va, K64) == data

    strat = PreemptEngineAtDmaWrite(engine, idx)
    SCHED.use(strat)
    try:
        pair.write(1, 0, va, K64)
        with env.m.kernel():
            strat.victim = kthread_run(gpu_free, fp.live_ctx[0], name="gpu_free")
        (wc,) = pair.a.cq.poll_until(1)
        strat.victim.join()
    finally:
        SCHED.use(None)
    assert strat.fired
    assert seen == {"busy_at_start": 1, "landed_at_start": False, "busy_at_end": False,
                    "landed_at_end": True}
    assert wc.status == v.IBV_WC_SUCCESS               # it passed its checks before the revoke
    assert mkey_of(env, mr.rkey).mkc["free"] == 1
    env.dereg(mr)
    assert balanced(fp.reg.stats)


@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_invalidation_during_registration_waits_for_activate(env, kind):
    fp = env.peer(**KINDS[kind])
    va = env.gpu(K64, fp)
    events: list = []
    threads: list = []
    n_cmd = len(env.hca.fw.cmd_log)

    def gpu_free(ctx):
        lock = ctx.umem.mapping_lock
        events.append(("inval-start", lock.owner.label, cmds_since(env, n_cmd)))
        fp.invalidate(ctx)
        events.append(("inval-done", cmds_since(env, n_cmd)))

    def in_dma_map(ctx):
        del fp.hooks["dma_map"]
        threads.append(kthread_run(gpu_free, ctx, name="gpu_free"))
        SCHED.yield_("test")               # it looks the id up and blocks on mapping_lock
        events.append(("dma_map", threads[0].done))

    fp.hooks["dma_map"] = in_dma_map

    def owner():
        mr = MR(env.pd, K64, ALL_ACCESS, va)
        events.append(("reg-done",))
        threads[0].join()
        return mr
    mr = env.p.run(owner)
    label = f"{env.p.task.comm}-{env.p.pid}"
    assert events[0] == ("inval-start", label, [])
    assert events[1] == ("dma_map", False)
    assert events[-1] == ("inval-done", ["CREATE_MKEY", "EMU_UMR_REVOKE_MKEY"])
    assert mkey_of(env, mr.lkey).mkc["free"] == 1
    umem = umem_of(fp)
    unmaps = kind == "unmaps"
    assert umem.mapped_state == (UMEM_PEER_INVALIDATED if unmaps else UMEM_PEER_UNMAPPED)
    if not unmaps:       # the core unmapped on the invalidating task, under mapping_lock
        assert [(c.task, c.lock_mine) for c in fp.calls if c.name in ("dma_unmap",
                                                                       "put_pages")] == [
            (threads[0].label, True)] * 2
    env.dereg(mr)
    assert fp.names().count("put_pages") == (0 if unmaps else 1)
    assert balanced(fp.reg.stats)


@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_invalidation_racing_dereg_unmaps_once(env, kind, monkeypatch):
    """The client invalidates while dereg is between its revoke and the stop: the
    invalidation revokes again and (old-style) unmaps; stop then finds nothing to do."""
    fp = env.peer(**KINDS[kind])
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    engine = env.hca.engine
    orig = engine.mkey_revoked
    n_cmd = len(env.hca.fw.cmd_log)
    victim: list = []

    def gpu_free(ctx):
        fp.invalidate(ctx)

    def slow_umr(index):                   # the UMR completes late: another CPU gets in
        orig(index)
        if not victim and SCHED.current.label.startswith("app"):
            victim.append(kthread_run(gpu_free, fp.live_ctx[0], name="gpu_free"))
            SCHED.yield_("test")
    monkeypatch.setattr(engine, "mkey_revoked", slow_umr)

    def owner():
        mr.close()
        victim[0].join()
    env.p.run(owner)
    assert cmds_since(env, n_cmd) == ["EMU_UMR_REVOKE_MKEY", "EMU_UMR_REVOKE_MKEY",
                                      "DESTROY_MKEY"]
    unmaps = kind == "unmaps"
    calls = [(c.name, c.task) for c in fp.calls[4:]]
    if unmaps:
        assert calls == [("release", env.p.task.comm + f"-{env.p.pid}")]
    else:
        assert calls == [("dma_unmap", victim[0].label), ("put_pages", victim[0].label),
                         ("release", env.p.task.comm + f"-{env.p.pid}")]
    st = fp.reg.stats
    assert balanced(st) and st["num_alloc_mrs"] == 1 and st["num_free_callbacks"] == 1


# -- deregistration ----------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["plain", "unmaps"])
def test_dereg_revokes_stops_destroys_releases(env, kind):
    fp = env.peer(**KINDS[kind])
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    n_cmd = len(env.hca.fw.cmd_log)
    at: dict = {}
    fp.hooks["dma_unmap"] = lambda ctx: at.setdefault("dma_unmap", cmds_since(env, n_cmd))
    fp.hooks["release"] = lambda ctx: at.setdefault("release", cmds_since(env, n_cmd))
    with Tracer() as t:
        env.dereg(mr)
    assert_call_flow(t.trace, ["mlx5_ib_dereg_mr", "mlx5r_umr_revoke_mr",
                               "ib_umem_stop_invalidation_notifier", "mlx5_core_destroy_mkey",
                               "ib_umem_release", "ib_peer_umem_release"])
    # the client unmaps after the DMA is fenced, and before the mkey is destroyed
    assert at == {"dma_unmap": ["EMU_UMR_REVOKE_MKEY"],
                  "release": ["EMU_UMR_REVOKE_MKEY", "DESTROY_MKEY"]}
    unmap, put = fp.called("dma_unmap")[0], fp.called("put_pages")[0]
    if kind == "unmaps":
        assert not unmap.lock_held and not put.lock_held
    else:
        assert unmap.lock_mine and put.lock_mine
    assert balanced(fp.reg.stats)
    assert env.p.mm.pinned_vm == 0


@pytest.mark.parametrize("fix", [0, 1], ids=["as-released", "late_invalidate_fix"])
def test_create_mkey_failure_stops_without_activate(env, fix):
    env.m.modules["ib_core"].state.peer.late_invalidate_fix = bool(fix)
    fp = env.peer()
    va = env.gpu(K64, fp)
    events: list = []
    fw = env.hca.fw
    # the errno a host-memory MR gets for the same firmware failure
    fw.inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_INT_ERR)
    with pytest.raises(VerbsError) as host_err:
        env.p.run(MR, env.pd, K64, ALL_ACCESS)
    n_cmd = len(fw.cmd_log)

    def gpu_free(ctx):
        fp.invalidate(ctx)
        events.append("inval-done")

    def in_get_pages(ctx):
        del fp.hooks["get_pages"]
        events.append(kthread_run(gpu_free, ctx, name="gpu_free"))
        SCHED.yield_("test")

    fp.hooks["get_pages"] = in_get_pages
    fw.inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_INT_ERR)

    def owner():
        try:
            MR(env.pd, K64, ALL_ACCESS, va)
        finally:
            # the waiting invalidation runs after release cleared ib_peer_client: in
            # the core as released the NULL dereference of peermem_facts B15; with
            # the proposed fix (the default) it finds the umem UNMAPPED and returns
            if fix:
                events[0].join()
            else:
                with pytest.raises(AttributeError, match="peer_mem"):
                    events[0].join()
    with pytest.raises(VerbsError) as ei:
        env.p.run(owner)
    assert ei.value.errno == host_err.value.errno != 0
    assert events[1:] == ["inval-done"] * fix
    assert cmds_since(env, n_cmd) == ["CREATE_MKEY"]      # nothing to revoke
    assert fp.names() == ["acquire", "get_pages", "dma_map", "get_page_size", "dma_unmap",
                          "put_pages", "release"]
    st = fp.reg.stats
    assert balanced(st) and st["num_alloc_mrs"] == 1 and st["num_free_callbacks"] == 1
    assert fp.reg.umem_xa.entries == {} and env.p.mm.pinned_vm == 0
    assert env.m.bugs == []


def test_failed_revoke_fails_the_dereg_and_keeps_the_mr(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    env.hca.fw.inject(MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY, MLX5_CMD_STAT_INT_ERR)
    with pytest.raises(VerbsError) as ei:
        env.dereg(mr)                  # mlx5r_handle_mkey_cleanup: "if (err) goto out"
    assert ei.value.errno == errno.EIO
    assert fp.names() == ["acquire", "get_pages", "dma_map", "get_page_size"]
    umem = umem_of(fp)
    assert umem.invalidation_func is mlx5_invalidate_umem       # not stopped
    assert mkey_of(env, mr.lkey).mkc["free"] == 0
    env.dereg(mr)                      # and it can be retried
    assert fp.names()[-3:] == ["dma_unmap", "put_pages", "release"]
    assert balanced(fp.reg.stats)


def test_failed_revoke_in_an_invalidation_does_not_escape(env):
    fp = env.peer()
    va = env.gpu(K64, fp)
    mr = env.reg_mr(va, K64)
    umem = umem_of(fp)
    env.hca.fw.inject(MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY, MLX5_CMD_STAT_INT_ERR)
    try:
        ret, err = fp.invalidate(fp.live_ctx[0]), None
    except KernelError as e:
        ret, err = None, e
    held = mutex_is_locked(umem.mapping_lock)
    if held and umem.mapping_lock.owner is SCHED.current:
        mutex_unlock(umem.mapping_lock)          # undo, so that the teardown can run
    env.dereg(mr)
    assert (ret, err, held) == (0, None, False)


def test_process_exit_deregisters_peer_mrs(env):
    fp = env.peer(unmaps=True)
    va = env.gpu(2 * K64, fp)
    keys = [env.reg_mr(va + i * K64, K64).lkey for i in range(2)]
    fp.invalidate(fp.live_ctx[0])
    env.p.exit(0)
    assert all(mkey_of(env, k) is None for k in keys)
    assert fp.live_ctx == []
    assert fp.names().count("dma_unmap") == 1           # only the one still mapped
    assert balanced(fp.reg.stats) and fp.reg.stats["num_alloc_mrs"] == 2
    assert set(fp.reg.stats) == set(STATS)
    fp.unregister()
