"""The stateful fuzzer's short profile: hypothesis drives peermem_testing.fuzz's operations.

Each example is a fresh pair of hosts and a sequence of operations over the
whole syscall and verbs surface (see the fuzz module); after every step the
world checks that the call succeeded or failed with an errno, that no WARN
was recorded and no kernel task died, and the teardown runs check_leaks() on
both hosts.  Hypothesis shrinks a failing sequence and prints it as
`state.<op>(...)` calls on FuzzMachine; `peermem fuzz --seconds N` runs the
same operations as a long random campaign.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from peermem_testing.fuzz import OPS, FuzzFailure, FuzzWorld, draw_sequence, run_sequence


def _make_rule(name: str):
    def step(self, **kw) -> None:
        self.world.apply(name, kw)
    step.__name__ = name
    return rule(**{k: d.strategy() for k, d in OPS[name].items()})(step)


class FuzzMachine(RuleBasedStateMachine):
    """Every fuzz operation as a hypothesis rule on one FuzzWorld."""

    def __init__(self) -> None:
        super().__init__()
        self.world = FuzzWorld()

    @initialize()
    def programs_start(self) -> None:
        """Three resource ladders on both hosts, their RC QPs connected (the fixed prefix
        of every campaign sequence)."""
        for name, kw in draw_sequence(random.Random(0), 0):
            self.world.apply(name, kw)

    def teardown(self) -> None:
        try:
            self.world.finish()
        except BaseException:
            self.world.close()
            raise


for _name in OPS:
    setattr(FuzzMachine, _name, _make_rule(_name))

FuzzMachine.TestCase.settings = settings(
    max_examples=12, stateful_step_count=60, deadline=None, derandomize=True, database=None,
    suppress_health_check=list(HealthCheck))
TestFuzz = FuzzMachine.TestCase


def test_a_hostile_sequence_is_reported_with_its_step():
    """The invariants can fail: a step that leaves a WARN behind is a FuzzFailure naming
    the operation, and the world still tears down."""
    w = FuzzWorld()
    w.apply("spawn", {"host": 0})
    w.hosts[0].report_bug("fuzz_selftest", "planted")
    with pytest.raises(FuzzFailure, match="spawn: host-a: WARNING: fuzz_selftest: planted"):
        w.check("spawn")
    w.close()


def test_an_operation_reaches_the_kernel_and_the_leak_check_sees_its_pins():
    """Operations really act: reg_mr over an mmap pins its pages until exit."""
    w = FuzzWorld()
    for name, kw in [("spawn", {"host": 0}), ("open_device", {"proc": 0}),
                     ("alloc_pd", {"ctx": 0}),
                     ("mmap", {"proc": 0, "length": 8192, "where": 0, "off": 0, "fixed": 0,
                               "prot": 3})]:
        w.apply(name, kw)
    anon = [r for r in w.objs["region"] if r.proc is w.objs["proc"][0].ref].index(
        next(r for r in w.objs["region"] if r.extra["what"] == "anon"))
    pinned = w.hosts[0].vmstat["nr_foll_pin_acquired"]
    w.apply("reg_mr", {"pd": 0, "region": anon, "off": 0, "length": 8192, "access": 7,
                       "foreign": 1})
    assert [o.live for o in w.objs["mr"]] == [True]
    assert w.hosts[0].vmstat["nr_foll_pin_acquired"] - pinned == 2
    w.apply("exit", {"proc": 0})
    assert w.hosts[0].vmstat["nr_foll_pin_released"] >= 2
    w.finish()


def test_run_sequence_returns_the_failure_of_a_sequence():
    """run_sequence (the shrinker's oracle) replays a sequence on a fresh world and
    returns its failure: a clean one gives None, an unknown operation a failure."""
    ops = [("spawn", {"host": 1}), ("open_device", {"proc": 0}), ("exit", {"proc": 0})]
    assert run_sequence(ops) is None
    failure = run_sequence(ops + [("spawn", {"host": 5, "bogus": 1})])
    assert isinstance(failure, FuzzFailure) and "spawn" in str(failure)


def test_the_victim_notices_a_change_no_operation_made():
    """Isolation is an invariant: a byte of the victim's memory changed or one of its QPs
    moved out of RTS is a failure, though no operation names the victim."""
    w = FuzzWorld()
    w.check("start")
    w.victim.p.store(w.victim.mr.buf + 100, b"\x00")
    with pytest.raises(FuzzFailure, match="the victim, which no operation names, had its "
                                          "memory changed"):
        w.check("store")
    w.victim.mr.write(w.victim.pattern)
    w.check("repaired")
    qp = w.victim.ends[1].qp
    from userspace.libibverbs import verbs as v
    qp.modify(v.ibv_qp_attr(qp_state=v.IBV_QPS_ERR), v.IBV_QP_STATE)
    with pytest.raises(FuzzFailure, match=f"had its QP {qp.qp_num:#x} moved to state 6"):
        w.check("modify_qp")
    w.close()


def test_a_sequence_runs_on_the_hosts_its_config_names():
    """dyn_uar and the page size reach both hosts, and the reproducer rebuilds them."""
    from peermem_testing.fuzz import reproducer
    w = FuzzWorld(dyn_uar=1, page_size=65536)
    assert [m.page_size for m in w.hosts] == [65536, 65536]
    w.apply("ladder", {"host": 1, "qp_type": 2})
    assert [o.live for o in w.objs["qp"]] == [True]
    assert w.objs["ctx"][0].ref.uar == []     # dyn_uar=1: no static UAR pages mapped at open
    w.finish()
    script = reproducer([("spawn", {"host": 0})], w.config)
    assert "w = FuzzWorld(dyn_uar=1, page_size=65536)" in script


def test_rereg_onto_another_contexts_pd_leaves_the_mr_in_its_own_file():
    """Seed 9502's sequence: ibv_rereg_mr(CHANGE_PD) with a PD of the process's other
    device context sends that PD's handle, which the kernel looks up in the MR's own
    file.  The world must keep the MR in its own file (the owner is the PD the handle
    names there), so that a later DEREG_MR of that handle through the same file is the
    MR's own, not a foreign destroy that "succeeded"."""
    w = FuzzWorld(dyn_uar=0, page_size=4096)
    for op, kw in [("ladder", dict(host=0, qp_type=2)), ("open_device", dict(proc=27)),
                   ("open_device", dict(proc=51)), ("ladder", dict(host=1, qp_type=2)),
                   ("ladder", dict(host=0, qp_type=3)), ("alloc_pd", dict(ctx=52)),
                   ("ladder", dict(host=1, qp_type=3)), ("ladder", dict(host=0, qp_type=2)),
                   ("open_device", dict(proc=63)), ("open_device", dict(proc=2)),
                   ("ladder", dict(host=1, qp_type=2))]:
        w.apply(op, kw)
    mrs = [o for o in w.objs["mr"] if o.live]
    mr = mrs[6 % len(mrs)]
    ctx = w._ctx_of(mr)
    w.apply("rereg_mr", dict(mr=6, flags=2, pd=21, region=30, off=13149, length=1048576,
                             access=31))
    assert w._ctx_of(mr) is ctx and mr.ref.context is ctx.ref
    w.apply("foreign_destroy", dict(ctx=20, cmd=1, handle_of=6, kind=1))
    w.finish()
