"""Tests for kernel_model/emu/tracefilter.py: filter_trace and assert_call_flow.

Every filtered trace is checked whole with check_consistent() (trees,
depths, timeline, switches) and the input is checked untouched.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.tracefilter import assert_call_flow, filter_trace
from kernel_model.emu.traceout import format_ftrace
from kernel_model.tracedata import ENTER, EXIT, LAYERS, POINT, SWITCH, Call, Point
from tests.kernel_model.tracebuild import TraceBuilder, check_consistent


def reg_mr_trace():
    """app-1: ibv_reg_mr -> ib_uverbs_reg_mr -> ib_umem_get (pins, recursion), mlx5 command
    completed on kworker-3; then a second ib_umem_get; ibv_close never returns."""
    b = TraceBuilder()
    b.enter("app-1", "ibv_reg_mr", "userspace", "len=8192")
    b.enter("app-1", "ib_uverbs_reg_mr", "syscall")
    b.enter("app-1", "ib_umem_get", "ib_core", "size=8192")
    b.enter("app-1", "pin_user_pages_fast", "kernel_model", "nr_pages=2")
    b.point("app-1", "gup_pin_pages", "kernel_model", {"nr": 2})
    b.call("app-1", "pin_user_pages_fast", "kernel_model", "nr_pages=0", ret="0")  # nested
    b.exit("app-1", ret="2")
    b.exit("app-1", ret="0")
    b.enter("app-1", "mlx5_ib_reg_user_mr", "mlx5_ib")
    b.enter("app-1", "mlx5_cmd_exec", "mlx5_core", "opcode=CREATE_MKEY")
    b.switch("app-1", "kworker-3")
    b.enter("kworker-3", "mlx5_cmd_comp_handler", "mlx5_core")
    b.point("kworker-3", "mlx5_cmd_done", "hw", {"status": 0})
    b.call("kworker-3", "complete", "kernel_model")
    b.exit("kworker-3")
    b.switch("kworker-3", "app-1")
    b.exit("app-1", ret="0")
    b.exit("app-1", ret="0")
    b.exit("app-1", ret="0")
    b.exit("app-1", ret="0x1")
    b.call("app-1", "ib_umem_get", "ib_core", "size=4096", ret="-EFAULT")
    b.enter("app-1", "ibv_close", "userspace")
    return b.build()


def shape(trace):
    """Per track, the tree as nested (name, depth, children) tuples."""
    def node(n):
        if isinstance(n, Point):
            return (n.name, n.depth)
        return (n.func, n.depth, [node(c) for c in n.children])
    return [[node(n) for n in nodes] for nodes in trace.roots]


def kinds(trace):
    return [(k, e.prev if k == SWITCH else getattr(e, "func", getattr(e, "name", None)))
            for k, e in trace.timeline]


def filtered(trace, **kw):
    before = format_ftrace(trace)
    out = filter_trace(trace, **kw)
    check_consistent(out)
    assert format_ftrace(trace) == before                  # input untouched
    old = {id(e) for _, e in trace.timeline}
    assert not old & {id(e) for _, e in out.timeline}     # new nodes only
    assert out.tracks == trace.tracks and out.clock == trace.clock
    return out


def test_builder_trace_is_consistent() -> None:
    check_consistent(reg_mr_trace())


def test_no_filter_is_an_equal_copy() -> None:
    t = reg_mr_trace()
    out = filtered(t)
    assert format_ftrace(out) == format_ftrace(t)
    assert out.roots is not t.roots and out.timeline is not t.timeline


# -- function -------------------------------------------------------------------

def test_function_keeps_subtrees_with_relative_depth() -> None:
    t = filtered(reg_mr_trace(), function="ib_umem_get")
    assert shape(t) == [
        [("ib_umem_get", 0, [("pin_user_pages_fast", 1, [
            ("gup_pin_pages", 2), ("pin_user_pages_fast", 2, [])])]),
         ("ib_umem_get", 0, [])],
        [],
    ]
    assert all(c.parent is None for c in t.roots[0])
    assert [c.ret for c in t.calls()][-1] == "-EFAULT"
    assert not [k for k, _ in t.timeline if k == SWITCH]   # kworker-3 has nothing left


def test_function_nested_match_is_not_a_second_root() -> None:
    t = filtered(reg_mr_trace(), function="pin_user_pages_fast")
    assert [r.func for r in t.roots[0]] == ["pin_user_pages_fast"]
    assert [c.depth for c in t.calls()] == [0, 1]


def test_function_keeps_switches_between_tracks_that_remain() -> None:
    b = TraceBuilder()
    b.enter("a-1", "work", "kernel_model")
    b.switch("a-1", "b-2")
    b.call("b-2", "work", "kernel_model")
    b.call("b-2", "other", "kernel_model")
    b.switch("b-2", "a-1")
    b.exit("a-1")
    b.call("a-1", "other", "kernel_model")
    b.switch("a-1", "b-2")
    b.call("b-2", "other", "kernel_model")
    b.switch("b-2", "a-1")
    t = filtered(b.build(), function="work")
    assert kinds(t) == [(ENTER, "work"), (SWITCH, 0), (ENTER, "work"), (EXIT, "work"),
                        (SWITCH, 1), (EXIT, "work")]


def test_switch_runs_merge_when_a_track_in_between_is_emptied() -> None:
    b = TraceBuilder()
    b.call("a-1", "keep", "ib_core")
    b.switch("a-1", "b-2")
    b.call("b-2", "drop", "hw")
    b.switch("b-2", "c-3")
    b.call("c-3", "keep", "ib_core")
    t = filtered(b.build(), layer="ib_core")
    sw = [e for k, e in t.timeline if k == SWITCH]
    assert [(s.prev, s.next) for s in sw] == [(0, 2)]


def test_function_unknown_lists_names() -> None:
    with pytest.raises(ValueError, match=r"no call to 'ib_umem_gte'.*did you mean "
                                         r"ib_umem_get\?.*functions traced: complete, "
                                         r"ib_umem_get, ib_uverbs_reg_mr"):
        filter_trace(reg_mr_trace(), function="ib_umem_gte")
    with pytest.raises(ValueError, match=r"^no call to 'zzz' in the trace; functions traced: "
                                         r"complete, .*, pin_user_pages_fast$"):
        filter_trace(reg_mr_trace(), function="zzz")
    with pytest.raises(ValueError, match="the trace has no calls"):
        filter_trace(TraceBuilder().build(), function="f")


# -- depth ----------------------------------------------------------------------

def test_depth_one_keeps_roots_only() -> None:
    t = filtered(reg_mr_trace(), depth=1)
    assert shape(t) == [[("ibv_reg_mr", 0, []), ("ib_umem_get", 0, []), ("ibv_close", 0, [])],
                        [("mlx5_cmd_comp_handler", 0, [])]]
    assert [k for k, _ in t.timeline].count(SWITCH) == 2


def test_depth_counts_points_like_calls() -> None:
    t = filtered(reg_mr_trace(), depth=2)
    assert shape(t)[1] == [("mlx5_cmd_comp_handler", 0, [("mlx5_cmd_done", 1),
                                                         ("complete", 1, [])])]
    assert max(c.depth for c in t.calls()) == 1
    deep = filtered(reg_mr_trace(), depth=4)
    assert [p.name for p in deep.points()] == ["mlx5_cmd_done"]
    assert [p.name for p in filtered(reg_mr_trace(), depth=5).points()] == \
        ["gup_pin_pages", "mlx5_cmd_done"]


@pytest.mark.parametrize("bad", [0, -1])
def test_depth_below_one_is_refused(bad: int) -> None:
    with pytest.raises(ValueError, match=r"depth must be >= 1"):
        filter_trace(reg_mr_trace(), depth=bad)


# -- layer ----------------------------------------------------------------------

def test_layer_promotes_children_of_dropped_calls() -> None:
    t = filtered(reg_mr_trace(), layer=("ib_core", "mlx5_core"))
    assert shape(t) == [
        [("ib_umem_get", 0, []), ("mlx5_cmd_exec", 0, []), ("ib_umem_get", 0, [])],
        [("mlx5_cmd_comp_handler", 0, [])],
    ]
    assert kinds(t)[:3] == [(ENTER, "ib_umem_get"), (EXIT, "ib_umem_get"),
                            (ENTER, "mlx5_cmd_exec")]


def test_layer_single_name_and_points() -> None:
    t = filtered(reg_mr_trace(), layer="kernel_model")
    assert shape(t)[0] == [("pin_user_pages_fast", 0, [("gup_pin_pages", 1),
                                                       ("pin_user_pages_fast", 1, [])])]
    assert shape(t)[1] == [("complete", 0, [])]
    hw = filtered(reg_mr_trace(), layer=["hw"])
    assert shape(hw) == [[], [("mlx5_cmd_done", 0)]]
    assert [k for k, _ in hw.timeline] == [POINT]


@pytest.mark.parametrize("bad,msg", [("mlx6_core", "unknown layer 'mlx6_core'"),
                                     (["hw", "fw"], "unknown layer 'fw'"),
                                     ([], "no layer given")])
def test_layer_unknown_lists_layers(bad, msg: str) -> None:
    with pytest.raises(ValueError) as e:
        filter_trace(reg_mr_trace(), layer=bad)
    assert msg in str(e.value)
    assert "layers are: " + ", ".join(LAYERS) in str(e.value)


# -- task -----------------------------------------------------------------------

@pytest.mark.parametrize("task", ["kworker-3", "kworker"])
def test_task_keeps_one_track(task: str) -> None:
    t = filtered(reg_mr_trace(), task=task)
    assert t.roots[0] == [] and [c.func for c in t.calls()] == ["mlx5_cmd_comp_handler",
                                                                  "complete"]
    assert all(c.track == 1 for c in t.calls())
    assert SWITCH not in [k for k, _ in t.timeline]


def test_task_unknown_lists_tasks() -> None:
    with pytest.raises(ValueError, match=r"no task 'idle'.*tasks: app-1, kworker-3"):
        filter_trace(reg_mr_trace(), task="idle")


# -- during ---------------------------------------------------------------------

def test_during_keeps_every_task_inside_the_window_only() -> None:
    t = filtered(reg_mr_trace(), during="mlx5_ib_reg_user_mr")
    # the other task's work inside the window stays; what app-1 did before or
    # after it goes, and mlx5_ib_reg_user_mr becomes a root at depth 0
    assert shape(t) == [[("mlx5_ib_reg_user_mr", 0, [("mlx5_cmd_exec", 1, [])])],
                        [("mlx5_cmd_comp_handler", 0, [("mlx5_cmd_done", 1),
                                                       ("complete", 1, [])])]]
    assert [k for k, _ in t.timeline].count(SWITCH) == 2


def test_during_several_calls_make_several_windows() -> None:
    t = filtered(reg_mr_trace(), during="ib_umem_get")
    assert [c.func for c in t.calls()] == ["ib_umem_get", "pin_user_pages_fast",
                                           "pin_user_pages_fast", "ib_umem_get"]
    assert [c.ret for c in t.roots[0]] == ["0", "-EFAULT"]


def test_during_a_call_still_running_reaches_the_end() -> None:
    t = filtered(reg_mr_trace(), during="ibv_close")
    assert [c.func for c in t.calls()] == ["ibv_close"]


def test_during_unknown_function_lists_names() -> None:
    with pytest.raises(ValueError, match=r"no call to 'mlx5_ib_reg_mr'.*did you mean"):
        filter_trace(reg_mr_trace(), during="mlx5_ib_reg_mr")


def test_during_then_task_is_one_task_in_the_window() -> None:
    t = filtered(reg_mr_trace(), during="mlx5_cmd_exec", task="kworker-3")
    assert [c.func for c in t.calls()] == ["mlx5_cmd_comp_handler", "complete"]


# -- combined -------------------------------------------------------------------

def test_filters_combine_function_layer_depth_task() -> None:
    t = filtered(reg_mr_trace(), function="ib_uverbs_reg_mr",
                 layer=("syscall", "mlx5_ib", "mlx5_core", "kernel_model"), depth=2, task="app")
    # layer promotes pin_user_pages_fast to depth 1 under ib_uverbs_reg_mr; depth=2 then
    # drops its nested call and tracepoint, and mlx5_cmd_exec under mlx5_ib_reg_user_mr
    assert shape(t) == [[("ib_uverbs_reg_mr", 0, [("pin_user_pages_fast", 1, []),
                                                  ("mlx5_ib_reg_user_mr", 1, [])])], []]


def test_bad_argument_fails_before_filtering() -> None:
    with pytest.raises(ValueError, match="no task"):
        filter_trace(reg_mr_trace(), function="nope", task="nobody")


# -- assert_call_flow -----------------------------------------------------------

def test_call_flow_in_order_returns_matched_calls() -> None:
    got = assert_call_flow(reg_mr_trace(), ["ibv_reg_mr", "ib_umem_get", "complete",
                                            "ib_umem_get"])
    assert [c.func for c in got] == ["ibv_reg_mr", "ib_umem_get", "complete", "ib_umem_get"]
    assert all(isinstance(c, Call) for c in got)
    assert got[1].args == "size=8192" and got[3].ret == "-EFAULT"
    assert assert_call_flow(reg_mr_trace(), []) == []


def test_call_flow_sets_match_in_any_order() -> None:
    t = reg_mr_trace()
    got = assert_call_flow(t, [{"mlx5_cmd_exec", "pin_user_pages_fast"}, "complete"])
    assert [c.func for c in got] == ["pin_user_pages_fast", "mlx5_cmd_exec", "complete"]
    assert assert_call_flow(t, ["ib_uverbs_reg_mr", frozenset({"complete", "ib_umem_get"}),
                                "ibv_close"])[-1].func == "ibv_close"


def test_call_flow_set_finishes_at_its_last_member() -> None:
    t = reg_mr_trace()
    with pytest.raises(AssertionError, match="step 2 of 2 not found"):
        assert_call_flow(t, [{"ibv_reg_mr", "complete"}, "mlx5_cmd_comp_handler"])


def test_call_flow_missing_step_message() -> None:
    with pytest.raises(AssertionError) as e:
        assert_call_flow(reg_mr_trace(), ["ibv_reg_mr", "mlx5_ib_reg_user_mr",
                                          "calc_total_bfregs", "complete"])
    lines = str(e.value).splitlines()
    assert lines[0] == "call flow: step 3 of 4 not found"
    assert lines[1:6] == [
        "expected:",
        "   1 ok      ibv_reg_mr",
        "   2 ok      mlx5_ib_reg_user_mr",
        "   3 MISSING calc_total_bfregs   (calc_total_bfregs: never called)",
        "   4 -       complete",
    ]
    assert lines[6] == "actual calls after step 2 (from call #7), 5 of 11:"
    assert lines[7:] == ["  mlx5_cmd_exec", "  mlx5_cmd_comp_handler", "  complete",
                         "  ib_umem_get", "  ibv_close"]


def test_call_flow_wrong_order_message() -> None:
    with pytest.raises(AssertionError) as e:
        assert_call_flow(reg_mr_trace(), ["complete", "ib_uverbs_reg_mr"])
    msg = str(e.value)
    assert "   1 ok      complete" in msg
    assert ("   2 MISSING ib_uverbs_reg_mr   (ib_uverbs_reg_mr: called 1x, all before "
            "this step)") in msg


def test_call_flow_set_message_and_from_start() -> None:
    with pytest.raises(AssertionError) as e:
        assert_call_flow(reg_mr_trace(), [{"complete", "nope"}, "ibv_close"])
    lines = str(e.value).splitlines()
    assert lines[2] == "   1 MISSING {complete, nope}   (nope: never called)"
    assert lines[3] == "   2 -       ibv_close"
    assert lines[4] == "actual calls from the start, 11 of 11:"
    assert lines[5] == "  ibv_reg_mr"


def test_call_flow_actual_collapses_repeats_and_cuts() -> None:
    b = TraceBuilder()
    b.call("a-1", "start", "userspace")
    for _ in range(3):
        b.call("a-1", "pin_user_pages_fast", "kernel_model")
    for i in range(50):
        b.call("a-1", f"f{i}", "kernel_model")
    with pytest.raises(AssertionError) as e:
        assert_call_flow(b.build(), ["start", "end"])
    lines = str(e.value).splitlines()
    after = lines[lines.index("actual calls after step 1 (from call #2), 53 of 54:") + 1:]
    assert after[0] == "  pin_user_pages_fast x3"
    assert after[1:3] == ["  f0", "  f1"]
    assert len(after) == 41 and after[-1] == "  ..." and after[-2] == "  f38"


def test_call_flow_nothing_after_last_match() -> None:
    b = TraceBuilder()
    b.call("a-1", "only", "userspace")
    with pytest.raises(AssertionError) as e:
        assert_call_flow(b.build(), ["only", "more"])
    assert str(e.value).splitlines()[-1] == "  (none)"


@pytest.mark.parametrize("bad", [["ok", 3], [["a", "b"]], [{"a", 1}]])
def test_call_flow_bad_step_type(bad) -> None:
    b = TraceBuilder()
    b.call("a-1", "ok", "userspace")
    with pytest.raises(TypeError, match="a call-flow step is a function name"):
        assert_call_flow(b.build(), bad)
