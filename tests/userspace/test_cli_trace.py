"""`peermem scenarios` and `peermem trace`: formats, filters, determinism, errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kernel_model.emu.machine import Machine, live_machines
from kernel_model.emu.tracefilter import assert_call_flow, filter_trace
from kernel_model.sched import SCHED
from kernel_model.tracedata import LAYERS
from peermem.cli import main
from scenarios import get, run_traced

#: the pin scenario's story, in order (every task counts)
PIN_FLOW = ["map_and_touch", "sys_mmap", "do_mmap", "handle_mm_fault", "demo_pin_and_map",
            "pin_user_pages_remote", "sg_alloc_append_table_from_pages", "dma_map_sgtable",
            "demo_unmap_and_unpin", "dma_unmap_sgtable", "sg_free_append_table",
            "unpin_user_pages", "sys_exit"]


def trace(capsys, *args: str) -> str:
    """stdout of `peermem trace pin ARGS`, which must succeed."""
    assert main(["trace", "pin", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def graph(out: str) -> list[tuple[str, int, str]]:
    """(task, depth, text) of each function-graph line of ftrace text; headers,
    switch blocks and tracepoint comments left out."""
    rows = []
    for line in out.splitlines():
        if line.startswith("#") or not line.startswith(" 0)  ") or "|" not in line:
            continue
        task, _, text = line[5:].split("|", 2)
        body = text[2:]
        depth = (len(body) - len(body.lstrip(" "))) // 2
        if not body.lstrip().startswith("/*"):
            rows.append((task.strip(), depth, body.strip()))
    return rows


def funcs(out: str) -> list[str]:
    """The functions entered, in order (a closing brace is not an entry)."""
    return [text.split("(", 1)[0] for _, _, text in graph(out) if not text.startswith("}")]


# -- scenarios ------------------------------------------------------------------------

def test_scenarios_lists_pin_with_its_summary(capsys):
    assert main(["scenarios"]) == 0
    lines = capsys.readouterr().out.splitlines()
    pin = [ln for ln in lines if ln.split()[0] == "pin"]
    assert pin and pin[0].endswith(get("pin").summary)


# -- ftrace text ----------------------------------------------------------------------

def test_trace_pin_prints_the_function_graph_in_order(capsys):
    out = trace(capsys)
    assert out.startswith("# tracer: function_graph\n")
    assert "# EMU: one emulated CPU, so CPU is always 0; virtual clock\n" in out
    assert_call_flow(run_traced("pin"), PIN_FLOW)
    entered = funcs(out)
    pos = 0
    for name in PIN_FLOW:
        assert name in entered[pos:], f"{name} missing or out of order in:\n{out}"
        pos = entered.index(name, pos) + 1


def test_trace_shows_tracepoints_retvals_and_switches(capsys):
    out = trace(capsys)
    assert "/* pages_pinned: start=0x7f7fffffc000 nr_pages=4 pinned=4 " in out
    assert out.count("/* page_fault_user: ") == 4
    assert "} /* pin_user_pages_remote = 4 */" in out
    assert " 0)   swapper-0    =>  pin_worker-2\n" in out


def test_two_runs_print_the_same_bytes(capsys):
    first = trace(capsys)
    assert trace(capsys) == first
    # and a fresh process agrees: nothing in this one leaks into the output
    r = subprocess.run([sys.executable, "-m", "peermem", "trace", "pin"],
                       capture_output=True, text=True, check=True)
    assert r.stdout == first


# -- the other formats -----------------------------------------------------------------

def test_perfetto_to_a_file(capsys, tmp_path):
    path = tmp_path / "pin.json"
    assert main(["trace", "pin", "--format", "perfetto", "-o", str(path)]) == 0
    assert capsys.readouterr().out == ""
    events = json.loads(path.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert slices and all(e["cat"] in LAYERS for e in slices)
    assert {"map_and_touch", "pin_user_pages_remote", "dma_map_sgtable"} <= \
        {e["name"] for e in slices}
    threads = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"swapper-0", "app-1", "pin_worker-2"} <= threads
    starts = {e["id"] for e in events if e["ph"] == "s"}
    ends = {e["id"] for e in events if e["ph"] == "f"}
    assert starts and starts == ends  # map_and_touch -> its page faults


def test_mermaid(capsys):
    out = trace(capsys, "--format", "mermaid")
    assert out.startswith("sequenceDiagram\n")
    participants = [ln.split()[1] for ln in out.splitlines() if ln.startswith("    participant")]
    assert participants == [la for la in LAYERS if la in participants]
    assert "driver->>kernel_model: pin_user_pages_remote(" in out


# -- filters -----------------------------------------------------------------------------

def test_function_keeps_only_its_subtree(capsys):
    rows = graph(trace(capsys, "--function", "pin_user_pages_remote"))
    assert rows[0] == ("pin_worker-2", 0, rows[0][2])
    assert rows[0][2].startswith("pin_user_pages_remote(")
    assert [r[2] for r in rows[1:]] == ["} /* pin_user_pages_remote = 4 */"]


def test_depth_1_shows_only_roots(capsys):
    rows = graph(trace(capsys, "--depth", "1"))
    assert {d for _, d, _ in rows} == {0}
    assert [t.split("(")[0] for _, _, t in rows] == [
        "dma_set_mask_and_coherent", "map_and_touch", "kthread_create", "demo_pin_and_map",
        "demo_unmap_and_unpin", "sys_exit"]


def test_layer_driver_shows_only_the_demo_calls(capsys):
    out = trace(capsys, "--layer", "driver")
    assert funcs(out) == ["demo_pin_and_map", "demo_unmap_and_unpin"]
    assert "pages_pinned" not in out and "dma_map_sg:" not in out  # kernel_model's


def test_layer_repeats(capsys):
    out = trace(capsys, "--layer", "driver", "--layer", "userspace")
    assert funcs(out) == ["map_and_touch", "demo_pin_and_map", "demo_unmap_and_unpin"]


def test_task_shows_only_that_task(capsys):
    out = trace(capsys, "--task", "pin_worker")
    rows = graph(out)
    assert rows and {t for t, _, _ in rows} == {"pin_worker-2"}
    assert "=>" not in out


def test_filters_combine(capsys):
    rows = graph(trace(capsys, "--task", "app-1", "--depth", "2"))
    assert [t.split("(")[0].split()[0] for _, _, t in rows] == [
        "map_and_touch", "sys_mmap", "handle_mm_fault", "handle_mm_fault", "handle_mm_fault",
        "handle_mm_fault", "}", "sys_exit", "mmput", "}"]


# -- errors --------------------------------------------------------------------------------

def test_unknown_scenario(capsys):
    assert main(["trace", "nosuch"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == ("peermem trace: error: no scenario 'nosuch'; known: create-qp, "
                   "cuda-free-invalidate, gpudirect, gpudirect-dmabuf, io-peer, open-device, "
                   "pin, rdma-write, reg-cache, reg-mr\n")


@pytest.mark.parametrize("args, kw", [
    (["--function", "nosuch"], {"function": "nosuch"}),
    (["--layer", "bogus"], {"layer": ["bogus"]}),
    (["--task", "nobody"], {"task": "nobody"}),
])
def test_bad_filter_exits_2_with_the_reason(capsys, args, kw):
    with pytest.raises(ValueError) as e:
        filter_trace(run_traced("pin"), **kw)
    assert main(["trace", "pin", *args]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"peermem trace: error: {e.value}\n"


def test_depth_0_is_refused_before_the_run(capsys):
    """filter_trace refuses it too; the CLI's parser does not run the scenario to find out."""
    with pytest.raises(ValueError, match="depth must be >= 1"):
        filter_trace(run_traced("pin"), depth=0)
    first = Machine.next_serial
    with pytest.raises(SystemExit) as e:
        main(["trace", "pin", "--depth", "0"])
    assert e.value.code == 2 and Machine.next_serial == first
    assert capsys.readouterr() == ("", "peermem trace: error: argument --depth: "
                                       "must be at least 1, not 0\n")


def _diverge() -> int:
    """`peermem trace pin --schedule 5`: the replay's first decision names no such task."""
    first = Machine.next_serial
    rc = main(["trace", "pin", "--schedule", "5"])
    # the scenario stopped half-way: its machine is left as it was, not torn down
    for m in live_machines:
        if m.serial >= first:
            m.leak_check_expected = False
    return rc


def test_schedule_that_diverges_exits_1(capsys):
    rc = _diverge()
    SCHED.abandon()  # see test_diverged_replay_leaves_no_task_behind
    SCHED.failed.clear()
    assert rc == 1
    err = capsys.readouterr().err
    assert err.startswith("peermem trace: pin: ReplayDivergence: replay: decision 0 wants task 5")


def test_diverged_replay_leaves_no_task_behind():
    try:
        _diverge()
        assert not SCHED.alive
    finally:
        SCHED.abandon()
        SCHED.failed.clear()


def test_malformed_schedule_is_a_clean_error(capsys):
    with pytest.raises(SystemExit) as e:
        main(["trace", "pin", "--schedule", "x,y"])
    assert e.value.code == 2
    assert capsys.readouterr().err == ("peermem trace: error: argument --schedule: "
                                       "bad step 'x' in 'x,y'\n")


def test_wall_clock_runs():
    r = subprocess.run([sys.executable, "-m", "peermem", "trace", "pin",
                        "--clock", "wall"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# tracer: function_graph\n")
    assert "wall clock" in r.stdout


def test_full_on_a_scenario_without_a_story_changes_nothing(capsys):
    assert trace(capsys, "--full") == trace(capsys)


def test_full_with_a_filter_exits_2(capsys):
    assert main(["trace", "pin", "--full", "--task", "app"]) == 2
    assert "--full" in capsys.readouterr().err
