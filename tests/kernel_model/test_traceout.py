"""Tests for kernel_model/emu/traceout.py: ftrace text, Perfetto JSON and Mermaid output.

The traces are synthetic (tests/kernel_model/tracebuild.py), so each format
is checked against a trace whose every timestamp is known.
"""

from __future__ import annotations

import json
import re

import pytest

from kernel_model.emu.tracefilter import filter_trace
from kernel_model.emu.traceout import format_ftrace, format_mermaid, format_perfetto, to_perfetto
from kernel_model.tracedata import LAYERS
from tests.kernel_model.tracebuild import TraceBuilder


def two_tasks():
    """app-1 registers an MR; the command completes on kworker-3; ibv_reg_mr never returns."""
    b = TraceBuilder(machine="host0")
    b.enter("app-1", "ibv_reg_mr", "userspace", "len=4096")
    b.enter("app-1", "ib_umem_get", "ib_core", "addr=0x7f8000000000, size=4096")
    b.enter("app-1", "pin_user_pages_fast", "kernel_model", "start=0x7f8000000000, nr_pages=1")
    b.point("app-1", "gup_pin_pages", "kernel_model", {"nr": 1, "start": 0x7f8000000000})
    b.wait(11_000)
    b.exit("app-1", ret="1")
    b.call("app-1", "mlx5_ib_populate_pas", "mlx5_ib", "npages=1", ret="0")
    b.exit("app-1", ret="0")
    b.enter("app-1", "mlx5_cmd_exec", "mlx5_core", "opcode=CREATE_MKEY")
    b.switch("app-1", "kworker-3")
    b.enter("kworker-3", "mlx5_cmd_comp_handler", "mlx5_core", "vec=0x1")
    b.wait(150_000)
    b.call("kworker-3", "complete", "kernel_model")
    b.exit("kworker-3")
    b.exit("app-1", ret="0")      # no sched_switch recorded: the block comes anyway
    b.point("app-1", "mlx5_cmd", "hw", {"op": "CREATE_MKEY", "status": 0})
    return b.build()


# -- ftrace ---------------------------------------------------------------------

TWO_TASKS_FTRACE = """\
# tracer: function_graph
# EMU: one emulated CPU, so CPU is always 0; virtual clock
#
# CPU  TASK/PID         DURATION                  FUNCTION CALLS
# |     |    |           |   |                     |   |   |   |
 0)  app-1        |               |  ibv_reg_mr(len=4096) {
 0)  app-1        |               |    ib_umem_get(addr=0x7f8000000000, size=4096) {
 0)  app-1        |               |      pin_user_pages_fast(start=0x7f8000000000, nr_pages=1) {
 0)  app-1        |               |        /* gup_pin_pages: nr=1 start=0x7f8000000000 */
 0)  app-1        |+ 11.200 us    |      } /* pin_user_pages_fast = 1 */
 0)  app-1        |   0.100 us    |      mlx5_ib_populate_pas(npages=1); /* = 0 */
 0)  app-1        |+ 11.600 us    |    } /* ib_umem_get = 0 */
 0)  app-1        |               |    mlx5_cmd_exec(opcode=CREATE_MKEY) {
 ------------------------------------------
 0)   app-1        =>  kworker-3
 ------------------------------------------
 0)  kworker-3    |               |  mlx5_cmd_comp_handler(vec=0x1) {
 0)  kworker-3    |   0.100 us    |    complete();
 0)  kworker-3    |! 150.300 us   |  } /* mlx5_cmd_comp_handler */
 ------------------------------------------
 0)   kworker-3    =>  app-1
 ------------------------------------------
 0)  app-1        |! 150.600 us   |    } /* mlx5_cmd_exec = 0 */
 0)  app-1        |               |    /* mlx5_cmd: op=CREATE_MKEY status=0 */
"""


def test_ftrace_two_tasks_exact() -> None:
    assert format_ftrace(two_tasks()) == TWO_TASKS_FTRACE


def test_ftrace_is_deterministic() -> None:
    t = two_tasks()
    assert format_ftrace(t) == format_ftrace(t) == format_ftrace(two_tasks())


@pytest.mark.parametrize("wait,marker", [
    (0, " "), (9_900, " "), (10_000, "+"), (100_000, "!"), (1_000_000, "#"),
    (10_000_000, "*"), (100_000_000, "@"), (1_000_000_000, "$"),
])
def test_ftrace_duration_markers(wait: int, marker: str) -> None:
    """The marker is for durations strictly above each threshold (the leaf lasts wait+100)."""
    b = TraceBuilder()
    b.enter("app-1", "f", "userspace")
    b.wait(wait)
    b.exit("app-1")
    line = format_ftrace(b.build()).splitlines()[-1]
    us = f"{(wait + 100) // 1000}.{(wait + 100) % 1000:03d}"
    assert line == f" 0)  app-1        |{f'{marker} {us:>6} us':<15}|  f();"


def test_ftrace_childless_call_split_by_switch_is_not_a_leaf() -> None:
    b = TraceBuilder()
    b.enter("app-1", "schedule", "kernel_model")
    b.switch("app-1", "idle-0", "sleep")
    b.call("idle-0", "do_idle", "kernel_model")
    b.switch("idle-0", "app-1")
    b.exit("app-1", ret="0")
    body = format_ftrace(b.build()).splitlines()[5:]
    assert body[0].endswith("|  schedule() {")
    assert body[-1].endswith("|  } /* schedule = 0 */")
    assert body.count(" 0)   app-1        =>  idle-0") == 1
    assert body.count(" 0)   idle-0       =>  app-1") == 1


def test_ftrace_long_task_name_widens_column() -> None:
    b = TraceBuilder()
    b.call("kworker/u8:0-123", "f", "kernel_model")
    line = format_ftrace(b.build()).splitlines()[-1]
    assert line.startswith(" 0)  kworker/u8:0-123 |   0.100 us")


def test_ftrace_empty_trace_is_header_only() -> None:
    text = format_ftrace(TraceBuilder().build())
    assert text.splitlines()[0] == "# tracer: function_graph"
    assert all(line.startswith("#") for line in text.splitlines())


# -- Perfetto -------------------------------------------------------------------

def _events(trace):
    return json.loads(format_perfetto(trace))["traceEvents"]


def test_perfetto_is_json_and_deterministic() -> None:
    t = two_tasks()
    text = format_perfetto(t)
    assert text == format_perfetto(t) == format_perfetto(two_tasks())
    data = json.loads(text)
    assert data["displayTimeUnit"] == "ns"
    assert data["otherData"]["machine"] == "host0"
    assert data == to_perfetto(t)


def test_perfetto_every_event_has_required_keys() -> None:
    for ev in _events(two_tasks()):
        assert {"ph", "pid", "tid", "name"} <= ev.keys(), ev
        assert ev["pid"] == 1
        if ev["ph"] != "M":
            assert isinstance(ev["ts"], float), ev


def test_perfetto_metadata_names_process_and_threads() -> None:
    meta = [e for e in _events(two_tasks()) if e["ph"] == "M"]
    assert {"name": "process_name", "ph": "M", "pid": 1, "tid": 0,
            "args": {"name": "host0"}} in meta
    names = {e["tid"]: e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert names == {1: "app-1", 2: "kworker-3"}
    sort = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert sort == {1: 0, 2: 1}
    b = TraceBuilder()
    b.call("a-1", "f", "userspace")
    assert _events(b.build())[0]["args"] == {"name": "peermem"}


def test_perfetto_slices() -> None:
    xs = {e["name"]: e for e in _events(two_tasks()) if e["ph"] == "X"}
    assert len(xs) == 7
    assert xs["pin_user_pages_fast"] == {
        "name": "pin_user_pages_fast", "cat": "kernel_model", "ph": "X", "ts": 0.2,
        "dur": 11.2, "pid": 1, "tid": 1,
        "args": {"args": "start=0x7f8000000000, nr_pages=1", "ret": "1"}}
    assert "args" not in xs["complete"]                          # nothing to say
    assert xs["mlx5_cmd_comp_handler"]["args"] == {"args": "vec=0x1"}
    # still running at the end: lasts to the last timestamp (the final tracepoint)
    assert xs["ibv_reg_mr"]["ts"] == 0.0 and xs["ibv_reg_mr"]["dur"] == 162.5
    assert {e["cat"] for e in xs.values()} <= set(LAYERS)


def _ns(us: float) -> int:
    return round(us * 1000)


def test_perfetto_slices_nest_per_track() -> None:
    """In emission order, each slice lies within the innermost open one on its thread."""
    stacks: dict[int, list[tuple[int, int]]] = {}
    for ev in _events(two_tasks()):
        if ev["ph"] != "X":
            continue
        start, end = _ns(ev["ts"]), _ns(ev["ts"]) + _ns(ev["dur"])
        stack = stacks.setdefault(ev["tid"], [])
        while stack and stack[-1][1] <= start:
            stack.pop()
        if stack:
            assert stack[-1][0] <= start and end <= stack[-1][1], ev
        stack.append((start, end))
    assert len(stacks) == 2


def test_perfetto_slices_sorted_outer_first_on_equal_start() -> None:
    b = TraceBuilder()
    b.enter("a-1", "outer", "userspace")
    b.now -= 100                        # the child starts at the same instant
    b.call("a-1", "inner", "syscall")
    b.exit("a-1")
    names = [e["name"] for e in _events(b.build()) if e["ph"] == "X"]
    assert names == ["outer", "inner"]


def test_perfetto_instants_points_and_switches() -> None:
    b = TraceBuilder()
    b.enter("a-1", "f", "kernel_model")
    b.point("a-1", "tp", "kernel_model",
            {"n": 3, "addr": 0xffff888000000000, "ok": True, "s": "x", "l": [1, 2]})
    b.switch("a-1", "k-2", "wait")
    b.call("k-2", "g", "hw")
    inst = [e for e in _events(b.build()) if e["ph"] == "i"]
    assert inst[0] == {"name": "tp", "cat": "kernel_model", "ph": "i", "s": "t", "ts": 0.1,
                       "pid": 1, "tid": 1, "args": {"n": 3, "addr": "0xffff888000000000",
                                                    "ok": True, "s": "x", "l": "[1, 2]"}}
    assert inst[1] == {"name": "sched_switch", "cat": "sched", "ph": "i", "s": "t", "ts": 0.2,
                       "pid": 1, "tid": 1,
                       "args": {"prev": "a-1", "next": "k-2", "reason": "wait"}}


def test_perfetto_flows_from_userspace_to_device_end() -> None:
    evs = _events(two_tasks())
    starts = {e["id"]: e for e in evs if e["ph"] == "s"}
    ends = {e["id"]: e for e in evs if e["ph"] == "f"}
    assert starts.keys() == ends.keys() == {1, 2, 3}
    for e in starts.values():
        assert (e["ts"], e["tid"], e["cat"], e["name"]) == (0.0, 1, "flow", "causes")
    # gup_pin_pages tracepoint, mlx5_cmd_exec (mlx5_core), mlx5_cmd tracepoint
    assert [(ends[i]["ts"], ends[i]["bp"]) for i in (1, 2, 3)] == \
        [(0.3, "e"), (11.8, "e"), (162.5, "e")]


def test_perfetto_flows_fall_back_to_syscall_and_skip_inner_sources() -> None:
    b = TraceBuilder()
    b.enter("a-1", "sys_ioctl", "syscall")
    b.enter("a-1", "sys_nested", "syscall")      # not outermost: no flows of its own
    b.call("a-1", "mlx5_cmd_exec", "mlx5_core")
    b.call("a-1", "ib_thing", "ib_core")         # not a device end
    b.call("a-1", "doorbell", "hw")
    b.exit("a-1")
    b.exit("a-1")
    flows = [e for e in _events(b.build()) if e["ph"] in "sf"]
    assert [(e["ph"], e["id"], e["ts"]) for e in flows] == [
        ("s", 1, 0.0), ("f", 1, 0.2), ("s", 2, 0.0), ("f", 2, 0.6)]
    b = TraceBuilder()
    b.call("a-1", "mlx5_cmd_exec", "mlx5_core")
    assert not [e for e in _events(b.build()) if e["ph"] in "sf"]


def test_perfetto_filtered_trace_lists_only_used_threads() -> None:
    evs = _events(filter_trace(two_tasks(), task="kworker"))
    assert [e["tid"] for e in evs if e["name"] == "thread_name"] == [2]
    assert {e["tid"] for e in evs if e["ph"] != "M"} == {2}


# -- Mermaid --------------------------------------------------------------------

_PARTICIPANT = re.compile(r"participant (\w+)$")
_MESSAGE = re.compile(r"(\w+)(->>|-->>)(\w+): (.+)$")
_NOTE = re.compile(r"Note over (\w+): (.+)$")


def parse_mermaid(text: str) -> tuple[list[str], list[tuple]]:
    """(participants, items): each item ("msg", a, arrow, b, text) or ("note", x, text).

    Fails on a line of any other shape, on a participant used before it is
    declared, and on a participant declared after the first message.
    """
    lines = text.splitlines()
    assert lines[0] == "sequenceDiagram"
    participants: list[str] = []
    items: list[tuple] = []
    for raw in lines[1:]:
        line = raw.strip()
        if not line:
            continue
        if m := _PARTICIPANT.match(line):
            assert not items, f"participant declared late: {line}"
            participants.append(m[1])
        elif m := _MESSAGE.match(line):
            assert m[1] in participants and m[3] in participants, line
            items.append(("msg", m[1], m[2], m[3], m[4]))
        elif m := _NOTE.match(line):
            assert m[1] in participants, line
            items.append(("note", m[1], m[2]))
        else:
            raise AssertionError(f"not a Mermaid line: {raw!r}")
        assert ";" not in line and "#" not in line
    return participants, items


def test_mermaid_structure_and_crossings() -> None:
    participants, items = parse_mermaid(format_mermaid(two_tasks()))
    assert participants == ["userspace", "ib_core", "mlx5_ib", "mlx5_core", "kernel_model", "hw"]
    assert items == [
        ("note", "userspace", "task app-1"),
        ("msg", "userspace", "->>", "ib_core", "ib_umem_get(addr=0x7f8000000000, size=4096)"),
        ("msg", "ib_core", "->>", "kernel_model",
         "pin_user_pages_fast(start=0x7f8000000000, nr_pages=1)"),
        ("note", "kernel_model", "gup_pin_pages nr=1 start=0x7f8000000000"),
        ("msg", "kernel_model", "-->>", "ib_core", "1"),
        ("msg", "ib_core", "->>", "mlx5_ib", "mlx5_ib_populate_pas(npages=1)"),
        ("msg", "mlx5_ib", "-->>", "ib_core", "0"),
        ("msg", "ib_core", "-->>", "userspace", "0"),
        ("msg", "userspace", "->>", "mlx5_core", "mlx5_cmd_exec(opcode=CREATE_MKEY)"),
        ("note", "mlx5_core", "task kworker-3"),
        ("msg", "mlx5_core", "->>", "kernel_model", "complete()"),   # returns None: no reply
        ("msg", "mlx5_core", "-->>", "userspace", "0"),
        ("note", "hw", "mlx5_cmd op=CREATE_MKEY status=0"),
    ]


def test_mermaid_same_layer_calls_are_not_drawn_and_text_is_escaped() -> None:
    b = TraceBuilder()
    b.enter("a-1", "ib_reg", "ib_core", "x")
    b.call("a-1", "ib_helper", "ib_core", "y")                       # same layer
    b.call("a-1", "mlx5_ib_reg", "mlx5_ib", "a" * 50, ret="fd#3; ok\nyes")
    b.exit("a-1")
    _, items = parse_mermaid(format_mermaid(b.build()))
    assert items == [("note", "ib_core", "task a-1"),
                     ("msg", "ib_core", "->>", "mlx5_ib", "mlx5_ib_reg(" + "a" * 37 + "...)"),
                     ("msg", "mlx5_ib", "-->>", "ib_core", "fdno.3, ok yes")]


def test_mermaid_cuts_at_max_messages() -> None:
    b = TraceBuilder()
    b.enter("a-1", "main", "userspace")
    for _ in range(10):
        b.call("a-1", "sys_getpid", "syscall", ret="1")
    b.exit("a-1")
    full = parse_mermaid(format_mermaid(b.build()))[1]
    assert len(full) == 21
    participants, items = parse_mermaid(format_mermaid(b.build(), max_messages=5))
    assert items[:5] == full[:5]
    assert items[5:] == [("note", "userspace", "... 16 more crossings not shown")]
    assert len(parse_mermaid(format_mermaid(b.build(), max_messages=21))[1]) == 21
    with pytest.raises(ValueError, match="max_messages must be >= 0"):
        format_mermaid(b.build(), max_messages=-1)


def test_mermaid_is_deterministic_and_empty_trace_ok() -> None:
    assert format_mermaid(two_tasks()) == format_mermaid(two_tasks())
    assert format_mermaid(TraceBuilder().build()) == "sequenceDiagram\n"
