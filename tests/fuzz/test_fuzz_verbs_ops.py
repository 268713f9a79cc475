"""The fuzzer's operations for the verbs added for rdma-core's suite (address handles and
UD, SRQs, XRC, memory windows, device memory, ODP, completion channels, resize_cq,
rereg_mr, the extended QP's ibv_wr_* posting) really act: driven by hand, as a
campaign would, they move bytes - so a campaign that finds nothing has exercised them."""

from __future__ import annotations

import pytest

from peermem_testing.fuzz import (
    _NEW_OPS,
    _WEIGHTED,
    OPS,
    QKEY,
    U64,
    FuzzFailure,
    FuzzWorld,
    run_sequence,
)
from userspace.libibverbs import verbs as v


def _poll(w: FuzzWorld, cq: int, want: int = 1) -> list:
    o = w.objs["cq"][cq]
    got: list = []
    for _ in range(200):
        got += v.ibv_poll_cq(o.ref, 16)
        if len(got) >= want:
            break
        o.proc.sched_yield()
    return got


def _reaped(w: FuzzWorld, before: dict) -> dict:
    """The completions the operations reaped since `before`: {(opcode, status name): n}."""
    return {(op, v.ibv_wc_status_str(st)): n - before.get((op, st), 0)
            for (op, st), n in w.completions.items() if n != before.get((op, st), 0)}


def _mr_bytes(w: FuzzWorld, mr: int, off: int, n: int) -> bytes:
    o = w.objs["mr"][mr]
    return o.proc.load(o.ref.addr + off, n)


def test_every_new_operation_is_registered_and_drawn():
    assert set(_NEW_OPS) <= set(OPS)
    assert all(n in _WEIGHTED for n in _NEW_OPS)


def test_a_ud_send_through_an_address_handle_arrives_with_its_grh():
    w = FuzzWorld()
    w.apply("ladder", {"host": 0, "qp_type": 4})
    w.apply("ladder", {"host": 1, "qp_type": 4})
    for a, b in ((0, 1), (1, 0)):
        w.apply("connect_any", dict(qp=a, peer=b, psn=0, mtu=3, access=7, port=1, qkey=QKEY))
    w.apply("create_ah", dict(pd=0, peer=1, sgid=0, is_global=1, port=1, hop=64, fl=0,
                              tclass=0, sl=0, dlid=0, gid=0))
    assert [o.live for o in w.objs["ah"]] == [True]
    w.apply("post_recv", dict(qp=1, mr=0, off=0, length=4096, nsge=1))
    w.objs["proc"][0].ref.store(w.objs["mr"][0].ref.addr + 512, b"datagram!" * 10)
    w.apply("ud_send", dict(qp=0, ah=0, dst=1, qkey=QKEY, lmr=0, loff=512, length=90,
                            opcode=v.IBV_WR_SEND, flags=v.IBV_SEND_SIGNALED, stale=1))
    # the op reaps both sides: the SEND's completion and the receive's
    assert _reaped(w, {}) == {(v.IBV_WC_SEND, "SUCCESS"): 1, (v.IBV_WC_RECV, "SUCCESS"): 1}
    assert _mr_bytes(w, 1, 40, 90) == b"datagram!" * 10       # after the 40-byte GRH
    w.apply("destroy_ah", {"ah": 0})
    w.finish()


def test_an_xrc_send_lands_in_the_xrc_srq_it_names():
    w = FuzzWorld()
    w.apply("ladder", {"host": 0, "qp_type": 2})        # proc 0: the initiator's side
    w.apply("ladder", {"host": 1, "qp_type": 2})        # proc 1: the target's side
    w.apply("open_xrcd", dict(ctx=1, file=0, oflags=0o100, mask=3))
    w.apply("create_xrc_srq", dict(xrcd=0, pd=0, cq=0, max_wr=8, max_sge=1, mask=15))
    w.apply("create_xrc_qp", dict(xrcd=0, pd=0, cq=0, role=0, swr=0, ssge=0))      # qp 2
    w.apply("open_xrcd", dict(ctx=0, file=0, oflags=0o100, mask=3))
    w.apply("create_xrc_qp", dict(xrcd=1, pd=0, cq=0, role=1, swr=8, ssge=1))      # qp 3
    assert [o.live for o in w.objs["qp"]] == [True] * 4
    for a, b in ((3, 2), (2, 3)):
        w.apply("connect_any", dict(qp=a, peer=b, psn=0, mtu=3, access=7, port=1, qkey=0))
    w.apply("post_srq_recv", dict(srq=0, mr=0, off=64, length=1024, nsge=1, count=1))
    w.objs["proc"][0].ref.store(w.objs["mr"][0].ref.addr, b"xrc-bytes")
    w.apply("xrc_send", dict(qp=3, srq=0, opcode=v.IBV_WR_SEND, lmr=0, loff=0, length=9,
                             rmr=0, roff=0, flags=v.IBV_SEND_SIGNALED, any_srq=0))
    [wc] = _poll(w, 1)
    assert (wc.status, wc.opcode, wc.byte_len) == (0, v.IBV_WC_RECV, 9)
    assert _mr_bytes(w, 1, 64, 9) == b"xrc-bytes"
    w.finish()


def test_a_write_through_a_type2_window_lands_and_stops_after_invalidation():
    w = FuzzWorld()
    w.apply("ladder", {"host": 0, "qp_type": 2})
    w.apply("ladder", {"host": 1, "qp_type": 2})
    for a, b in ((0, 1), (1, 0)):
        w.apply("connect", dict(qp=a, peer=b, psn=0, mtu=3, access=7, port=1))
    w.apply("alloc_mw", dict(pd=1, mw_type=2))
    w.apply("bind_mw", dict(qp=1, mw=0, mr=0, off=4096, length=4096, access=2, how=1,
                            stale=1))
    assert _reaped(w, {}) == {(v.IBV_WC_BIND_MW, "SUCCESS"): 1}
    w.objs["proc"][0].ref.store(w.objs["mr"][0].ref.addr, b"through the window")
    before = dict(w.completions)
    w.apply("mw_access", dict(qp=0, mw=0, opcode=v.IBV_WR_RDMA_WRITE, lmr=0, off=0,
                              length=18, roff=100))
    assert _reaped(w, before) == {(v.IBV_WC_RDMA_WRITE, "SUCCESS"): 1}
    assert _mr_bytes(w, 1, 4096 + 100, 18) == b"through the window"
    before = dict(w.completions)
    w.apply("invalidate_mw", dict(qp=1, mw=0, how=0, rkey=0))
    assert _reaped(w, before) == {(v.IBV_WC_LOCAL_INV, "SUCCESS"): 1}
    before = dict(w.completions)
    w.apply("mw_access", dict(qp=0, mw=0, opcode=v.IBV_WR_RDMA_WRITE, lmr=0, off=0,
                              length=18, roff=200))
    assert set(_reaped(w, before)) == {(0, "REM_ACCESS_ERR")}   # and flushes after it
    assert _mr_bytes(w, 1, 4096 + 200, 18) == bytes(18)
    w.finish()


def test_exit_with_everything_live_tears_down_clean():
    w = FuzzWorld()
    w.apply("spawn", {"host": 0})
    w.apply("exit_everything", {"proc": 0, "how": 0})
    kinds = ("srq", "xrcd", "mw", "dm", "chan")
    assert all(w.objs[k] for k in kinds), {k: len(w.objs[k]) for k in kinds}
    assert not w.objs["proc"][0].ref.alive
    w.finish()


def test_rereg_mr_to_another_processs_pd_hands_over_only_its_handle():
    """Found by `peermem fuzz --seed 41`: rereg_mr's hostile PD (another process's) was
    that process's library object, and the MR kept it - the next verb ran in a process
    that had exited.  The op now passes only the handle, as bytes this process holds."""
    ops = [("ladder", dict(host=0, qp_type=2)), ("ladder", dict(host=1, qp_type=2)),
           ("ladder", dict(host=0, qp_type=2)), ("exit", dict(proc=21)),
           ("rereg_mr", dict(mr=31, flags=2, pd=24, region=10, off=2304, length=U64,
                             access=67)),
           ("rereg_mr", dict(mr=13, flags=1, pd=22, region=17, off=1 << 30, length=13402,
                             access=1))]
    assert run_sequence(ops, config={"dyn_uar": 0, "page_size": 65536}) is None


def test_xrc_srq_and_rereg_mr_never_pass_a_null_object():
    """Found by `peermem fuzz --seed 32 / 42`: create_xrc_srq without a CQ and rereg_mr
    with CHANGE_PD but no PD made the library dereference None (in C, the process's own
    NULL dereference); those ops now skip such a call."""
    ops = [("ladder", dict(host=0, qp_type=2)), ("ladder", dict(host=1, qp_type=2)),
           ("ladder", dict(host=0, qp_type=2)),
           ("rereg_mr", dict(mr=49, flags=2, pd=56, region=6, off=2688, length=1 << 31,
                             access=23)),
           ("close_device", dict(ctx=1)), ("ladder", dict(host=1, qp_type=2)),
           ("rereg_mr", dict(mr=9, flags=2, pd=39, region=10, off=64, length=55336,
                             access=11)),
           ("spawn", dict(host=0)), ("open_device", dict(proc=4)),
           ("open_xrcd", dict(ctx=4, file=1, oflags=64, mask=3)),
           ("create_xrc_srq", dict(xrcd=0, pd=12, cq=54, max_wr=1, max_sge=1, mask=15))]
    assert run_sequence(ops, config={"dyn_uar": 0, "page_size": 16384}) is None


def test_a_stalled_data_path_is_a_failure_at_finish():
    """finish() lets the HCAs run and then wants no RC work request still waiting for its
    answer on a QP in RTS (the go-back-N stall the fuzzer found in the engine would have
    been one): a planted request nobody answers is reported."""
    from kernel_model.hw.mlx5_engine import Sent, engine_of
    w = FuzzWorld()
    w.apply("ladder", {"host": 0, "qp_type": 2})
    w.apply("ladder", {"host": 1, "qp_type": 2})
    for a, b in ((0, 1), (1, 0)):
        w.apply("connect", dict(qp=a, peer=b, psn=0, mtu=3, access=7, port=1))
    qpn = w.objs["qp"][0].ref.qp_num
    eng = engine_of(w.hosts[0].hcas[0])
    eng._qphw(qpn).outstanding.append(
        Sent(wqe_index=0, opcode=0, signaled=True, length=0, frame=None, local=[]))
    with pytest.raises(FuzzFailure, match=f"the data path stalled: host-a QP {qpn:#x}: 1 WQEs"):
        w.finish()
    w.close()


def test_an_xrc_srq_is_counted_in_its_domains_file():
    """Found by `peermem fuzz --seed 91`: an XRC SRQ made in one file with a PD of the
    same process's other file was booked under the PD's file, so foreign_destroy2 took
    the SRQ's own file's DESTROY_SRQ for a foreign one that succeeded."""
    ops = [("ladder", dict(host=0, qp_type=2)), ("exit_everything", dict(proc=33, how=3)),
           ("create_xrc_srq", dict(xrcd=28, pd=5, cq=8, max_wr=16, max_sge=1, mask=23)),
           ("create_xrc_srq", dict(xrcd=22, pd=62, cq=35, max_wr=18, max_sge=5, mask=15)),
           ("foreign_destroy2", dict(ctx=27, kind=0, handle_of=7))]
    assert run_sequence(ops, config={"dyn_uar": 0, "page_size": 4096}) is None


def test_a_qp_is_given_cqs_and_srqs_of_its_own_context():
    """Found by `peermem fuzz --seed 93`: create_qp_srq gave a QP the CQ object of its
    process's other context (the kernel bound the CQ of that number in the QP's own
    file), so destroying the QP cleaned the wrong CQ and its stale CQE later named a
    new QP that reused the user index.  The newer ops stay within one context."""
    w = FuzzWorld()
    w.apply("ladder", {"host": 0, "qp_type": 2})          # ctx 0: pd 0, cq 0
    w.apply("open_device", {"proc": 0})                   # ctx 1
    w.apply("alloc_pd", {"ctx": 1})                       # pd 1
    w.apply("create_srq", dict(pd=1, max_wr=16, max_sge=1, limit=0))
    w.apply("create_qp_srq", dict(pd=1, cq=0, srq=0, qp_type=2, swr=4, ssge=1, rwr=0))
    assert len(w.objs["qp"]) == 1                         # ctx 1 has no CQ: no QP
    w.apply("create_cq", {"ctx": 1, "cqe": 16})
    w.apply("create_qp_srq", dict(pd=1, cq=0, srq=0, qp_type=2, swr=4, ssge=1, rwr=0))
    qp = w.objs["qp"][-1].ref
    assert qp.recv_cq.context is qp.context and qp.srq.context is qp.context
    w.finish()


#: `peermem fuzz` seed 92: a CQ ring the process scribbled on ends up holding a requester
#: CQE that names an XRC SRQ; libmlx5's poll raised UnboundLocalError on it
SEED92 = [
    ('ladder', dict(host=0, qp_type=2)),
    ('ladder', dict(host=1, qp_type=2)),
    ('ladder', dict(host=0, qp_type=2)),
    ('fi_close', dict(fid=57, kind=0)),
    ('ladder', dict(host=1, qp_type=2)),
    ('raw_ioctl', dict(ctx=60, cmd=4207739918, arg=0)),
    ('open_device', dict(proc=26)),
    ('req_notify', dict(cq=24, solicited=1)),
    ('mmap', dict(proc=9, length=52842, where=54, off=64, fixed=1, prot=2)),
    ('exit_everything', dict(proc=20, how=2)),
    ('destroy_cq', dict(cq=9)),
    ('destroy_qp', dict(qp=2)),
    ('poll_cq', dict(cq=26, n=1)),
    ('dealloc_pd', dict(pd=36)),
    ('spawn', dict(host=1)),
    ('mw_access', dict(qp=4, mw=31, opcode=5, lmr=21, off=2048, length=4388, roff=8)),
    ('create_cq', dict(ctx=15, cqe=1)),
    ('store', dict(region=53, off=1, data=b'\xff' * 45)),
    ('invalidate_mw', dict(qp=52, mw=2, how=0, rkey=0)),
    ('ladder', dict(host=1, qp_type=2)),
    ('reg_mr', dict(pd=62, region=7, off=18446744073709551615, length=4095, access=113, foreign=5)),
    ('spawn', dict(host=1)),
    ('create_qp', dict(pd=45, scq=57, rcq=30, qp_type=3, swr=255, rwr=37, ssge=62, rsge=36,
                   inline=33, sig_all=1)),
    ('open_xrcd', dict(ctx=58, file=0, oflags=109, mask=3)),
    ('open_device', dict(proc=26)),
    ('create_xrc_srq', dict(xrcd=1, pd=10, cq=22, max_wr=22, max_sge=1, mask=15)),
    ('xrc_send', dict(qp=57, srq=41, opcode=2, lmr=58, loff=1897, length=4096, rmr=59,
                   roff=3951, flags=8, any_srq=2)),
    ('mmap', dict(proc=23, length=1048576, where=35, off=13188, fixed=1, prot=3)),
    ('ladder', dict(host=1, qp_type=2)),
    ('dealloc_pd', dict(pd=61)),
    ('advise_mr', dict(pd=15, mr=57, advice=1, flags=2, off=4095, length=32992)),
    ('ladder', dict(host=1, qp_type=2)),
    ('cuda_free', dict(gpu=43)),
    ('poll_cq', dict(cq=56, n=16)),
]


def test_a_requester_cqe_naming_an_xrc_srq_fails_the_poll_not_the_library():
    assert run_sequence(SEED92, config=dict(dyn_uar=0, page_size=4096)) is None
