"""docs/tour.md shows real output: every excerpt is rerun and compared.

The tour walks the flows (open-device, create-qp, reg-mr, rdma-write, gpudirect) through
excerpts of `peermem trace ...` and `peermem devinfo ...`, plus a few
`example: NAME` programs below for what the CLI does not print on its own:
a section of `devinfo -v`, the library's queue sizing, and which BlueFlame
register each of 17 QPs gets.  The marker format and the checking live in
tests/docs/docblocks.py.  After a deliberate change to a driver, the tracer
or a scenario, rewrite the blocks with

    python -m tests.docs.test_tour_doc --regen

(from the repository root) and read the diff before committing it.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

import pytest

from tests.docs.docblocks import ROOT, DocBlocks, Example, fresh_process, run_cli

DOC = ROOT / "docs" / "tour.md"
REGEN = "python -m tests.docs.test_tour_doc --regen"

# -- the examples that are not CLI commands ---------------------------------------


def _resp_section(command: str) -> list[str]:
    """The alloc_ucontext response lines of a `peermem devinfo -v` run."""
    lines = run_cli(command).splitlines()
    start = next(i for i, s in enumerate(lines) if "alloc_ucontext response" in s)
    end = next(i for i in range(start + 1, len(lines)) if lines[i].startswith("\t\tport:"))
    return lines[start:end]


def _devinfo_resp() -> str:
    return "\n".join(_resp_section("peermem devinfo -v")) + "\n"


def _devinfo_resp_dyn_uar() -> str:
    """Only the lines that differ from the legacy response."""
    legacy = set(_resp_section("peermem devinfo -v"))
    return "".join(f"{s}\n" for s in _resp_section("peermem devinfo -v --dyn-uar")
                   if s not in legacy)


def _uar_env() -> str:
    from userspace.providers.mlx5.env import get_uar_info
    out = []
    for env in ({}, {"MLX5_TOTAL_UUARS": "20"}, {"MLX5_TOTAL_UUARS": "7"},
                {"MLX5_NUM_LOW_LAT_UUARS": "16"}):
        try:
            tot, low = get_uar_info(env, 4096)
            got = f"total_num_bfregs={tot} num_low_latency_bfregs={low}"
        except OSError as e:
            got = f"errno {e.errno} ({e})"
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "(defaults)"
        out.append(f"{shown:28} -> {got}\n")
    return "".join(out)


def _qp_sizing() -> str:
    """libmlx5's sizing of the create-qp scenario's RC QP, function by function."""
    from scenarios.create_qp import QP_CAP
    from userspace.libibverbs import verbs as v
    from userspace.providers.mlx5 import wqsize as w
    from userspace.providers.mlx5.verbs import _InitAttrEx, mlx5_qp
    limits = _Limits()
    cap = v.ibv_qp_cap(*QP_CAP)
    attr, qp = _InitAttrEx(w.IBV_QPT_RC, cap), mlx5_qp(None, None, None, None, 0, 0, w.IBV_QPT_RC)
    wqe = w.mlx5_calc_send_wqe(limits, attr, qp)
    total = w.mlx5_calc_wq_size(limits, attr, qp)
    return (f"cap: max_send_wr={cap.max_send_wr} max_recv_wr={cap.max_recv_wr} "
            f"max_send_sge={cap.max_send_sge} max_recv_sge={cap.max_recv_sge}\n"
            f"sq_overhead (RC default ops)   = {w.sq_overhead(qp, attr)}\n"
            f"mlx5_calc_send_wqe             = {wqe}\n"
            f"mlx5_calc_rcv_wqe              = {w.mlx5_calc_rcv_wqe(limits, attr, qp)}\n"
            f"sq: {qp.sq!r}\n"
            f"rq: {qp.rq!r}\n"
            f"max_inline_data (written back) = {cap.max_inline_data}\n"
            f"mlx5_calc_wq_size              = {total} ({total:#x})\n"
            f"mlx5_alloc_qp_buf              = {w.align(total, 4096)} (whole pages)\n")


class _Limits:
    """The mlx5_context limits copied from the alloc_ucontext response (the seed's)."""

    max_sq_desc_sz, max_rq_desc_sz, max_send_wqebb, max_recv_wr = 1024, 512, 32768, 32768


def _qp_bfregs(dyn_uar: bool) -> str:
    """Create 17 small RC QPs in one context; where each one rings its doorbell."""
    from kernel_model.emu.platform import rdma_host
    from kernel_model.trace import Tracer
    from userspace.libibverbs import verbs as v

    def program(p) -> list[str]:
        ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
        pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 16)
        with Tracer() as t:
            qps = [v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                          cap=v.ibv_qp_cap(1, 1, 1, 1)))
                   for _ in range(17)]
        bfregn = iter(c.ret for c in t.trace.calls() if c.func == "alloc_bfreg")
        uar = iter(c.ret for c in t.trace.calls() if c.func == "bfregn_to_uar_index")
        rows = ["QP  kernel bfreg  uar_page  library register                lock"]
        for i, qp in enumerate(qps, 1):
            bf = qp.bf
            page = bf.reg & ~0xFFF
            if dyn_uar:
                kind = "dedicated" if bf.qp_dedicated else "shared"
                row = f"{i:2}  {'-':>12}  {bf.page_id:8}  {kind}, its page + {bf.reg - page:#x}"
            else:
                n = next(j for j, u in enumerate(ctx.uar) if u.reg == page)
                row = (f"{i:2}  {next(bfregn):>12}  {next(uar):>8}  "
                       f"bfs[{bf.uuarn}] = uar[{n}] + {bf.reg - page:#x}")
            rows.append(f"{row:58}{'yes' if bf.need_lock else 'no'}")
        for qp in qps:
            v.ibv_destroy_qp(qp)
        v.ibv_destroy_cq(cq)
        v.ibv_dealloc_pd(pd)
        v.ibv_close_device(ctx)
        return rows

    with fresh_process():
        m = rdma_host(name="host0")
        m.load_module("mlx5_ib", dyn_uar=dyn_uar)
        p = m.spawn("app")
        rows = p.run(program, p)
        p.exit(0)
        m.check_leaks()
    return "".join(f"{r.rstrip()}\n" for r in rows)


def _qp_state_rc() -> str:
    """qp_state_table's RC rows for the connect path: required and optional attributes."""
    import drivers.ib_core.ib_verbs as iv
    from drivers.ib_core.verbs import qp_state_table
    bits = sorted((val, name.removeprefix("IB_QP_")) for name, val in vars(iv).items()
                  if name.startswith("IB_QP_") and isinstance(val, int)
                  and val & (val - 1) == 0 and val)
    state = {val: name.removeprefix("IB_QPS_") for name, val in vars(iv).items()
             if name.startswith("IB_QPS_")}

    def names(mask: int) -> str:
        return " | ".join(n for b, n in bits if mask & b) or "-"
    rows = []
    for cur, nxt in ((iv.IB_QPS_RESET, iv.IB_QPS_INIT), (iv.IB_QPS_INIT, iv.IB_QPS_RTR),
                     (iv.IB_QPS_RTR, iv.IB_QPS_RTS), (iv.IB_QPS_RTS, iv.IB_QPS_ERR),
                     (iv.IB_QPS_ERR, iv.IB_QPS_RESET)):
        req, opt = qp_state_table[(cur, nxt)]
        rows.append(f"{state[cur]:>5} -> {state[nxt]:<5} required: "
                    f"{names(req.get(iv.IB_QPT_RC, 0))}\n"
                    f"{'':15}optional: {names(opt.get(iv.IB_QPT_RC, 0))}\n")
    return "".join(rows)


def _data_path_errors() -> str:
    """Each bad post or bad key on a fresh loopback link: what the poster gets back."""
    from tests.flows.test_data_path import SIG, make_link
    from userspace.libibverbs import verbs as v
    from userspace.libibverbs.cmd import VerbsError
    from userspace.libibverbs.pyverbs import SendWR
    states = {0: "RESET", 1: "INIT", 2: "RTR", 3: "RTS", 6: "ERR"}

    def chain(link):  # one WR more than the send queue's max_post
        wrs = [link.write(i, 0, 0, 8, flags=0) for i in range(link.a.qp.qp.sq.max_post + 1)]
        for w, nxt in zip(wrs, wrs[1:], strict=False):
            w.next = nxt
        return wrs[0]

    def bad_lkey(link):
        wr = link.write(1, 0, 0, 8)
        wr.sg_list[0].lkey ^= 0x100
        return wr

    def bad_rkey(link):
        wr = link.write(1, 0, 0, 8)
        wr.rkey ^= 0x100
        return wr

    def beyond(link):
        return link.write(1, 0, link.b.mr.length - 4, 8)

    def sges(link):  # one SGE more than max_gs
        return SendWR(wr_id=1, sg_list=[link.a.sge(8 * i, 8)
                                        for i in range(link.a.qp.qp.sq.max_gs + 1)],
                      opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                      remote_addr=link.b.mr.buf, rkey=link.b.mr.rkey)

    cases = [
        ("post_send on a QP in RESET", {"connected": False}, lambda k: k.write(1, 0, 0, 8)),
        ("max_post + 1 WRs in one post", {}, chain),
        ("max_gs + 1 SGEs in one WR", {}, sges),
        ("lkey not an MR of this PD", {}, bad_lkey),
        ("rkey nobody registered", {}, bad_rkey),
        ("remote range past the MR's end", {}, beyond),
        ("remote MR without REMOTE_WRITE", {"b_kw": {"mr_access": v.IBV_ACCESS_LOCAL_WRITE}},
         lambda k: k.write(1, 0, 0, 8)),
        ("responder QP destroyed", {}, None),
    ]
    rows = [f"{'what':34}{'the poster gets':40}requester  responder"]
    for what, kw, make in cases:
        with fresh_process():
            link = make_link("loopback", **kw)
            if make is None:
                link.b.qp.close()
                make = lambda k: k.write(1, 0, 0, 8)  # noqa: E731
            try:
                link.a.qp.post_send(make(link))
                wcs = link.a.cq.poll_until(1)
                got = f"completion {v.ibv_wc_status_str(wcs[0].status)}"
            except VerbsError as e:
                got = f"errno {errno.errorcode[e.errno]} at once"
                if e.bad_wr is not None and e.bad_wr.wr_id:
                    got += f" (bad_wr: WR {e.bad_wr.wr_id})"
            a = states[link.a.fw_state()]
            b = states[link.b.fw_state()] if link.b.qp.qp_num in link.b.hca.fw.qps else "-"
            rows.append(f"{what:34}{got:40}{a:11}{b}")
            for side in (link.a, link.b):
                side.ep.ctx.close()
                side.p.exit(0)
            link.machines[0].check_leaks()
    return "".join(f"{r.rstrip()}\n" for r in rows)


def _reg_cache_counters() -> str:
    """The reg-cache scenario's cache statistics (what the scenario returns)."""
    from scenarios import get
    with fresh_process():
        return get("reg-cache").run()


EXAMPLES: dict[str, Callable[[], str]] = {
    "devinfo_resp": _devinfo_resp,
    "devinfo_resp_dyn_uar": _devinfo_resp_dyn_uar,
    "uar_env": _uar_env,
    "qp_sizing": _qp_sizing,
    "qp_bfregs": lambda: _qp_bfregs(dyn_uar=False),
    "qp_bfregs_dyn_uar": lambda: _qp_bfregs(dyn_uar=True),
    "qp_state_rc": _qp_state_rc,
    "data_path_errors": _data_path_errors,
    "reg_cache_counters": _reg_cache_counters,
}

BLOCKS = DocBlocks(DOC, EXAMPLES, REGEN)
_ALL = BLOCKS.blocks


# -- the tests ----------------------------------------------------------------------

def test_the_doc_has_examples():
    BLOCKS.check_nonempty(min_cli=15)


def test_every_example_program_is_used():
    used = {ex.command.removeprefix("example: ") for ex in _ALL
            if ex.command.startswith("example: ")}
    assert used == set(EXAMPLES)


@pytest.mark.parametrize("ex", _ALL, ids=BLOCKS.ids)
def test_example_is_current(ex: Example):
    BLOCKS.check(ex)


if __name__ == "__main__":
    BLOCKS.regen_main()
