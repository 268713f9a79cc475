"""`peermem trace gpudirect`: the story by default, the whole graph behind --full.

The story's outcome lines and summary are read from the recorded trace (the
mlx5_cqe tracepoints, the responder's DMA), so a run that goes differently -
no cudaFree - must print a different summary.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.tracefilter import filter_trace
from kernel_model.emu.traceout import format_ftrace
from kernel_model.trace import Tracer
from peermem.cli import main
from scenarios import get, run_traced
from scenarios.gpudirect import GPUDIRECT_STORY, run_gpudirect
from scenarios.story import COLUMNS, completions, format_story, step_calls
from userspace.libibverbs.verbs import ibv_wc_status_str

SUMMARY = ("gpudirect: WRITE before cudaFree SUCCESS (bytes arrived), "
           "after cudaFree REM_ACCESS_ERR (no bytes arrived: MR invalidated)")


def cli(capsys, *args: str) -> str:
    assert main(["trace", "gpudirect", *args]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


@pytest.fixture
def trace():
    return run_traced("gpudirect")


def test_default_is_the_story_short_and_narrow(capsys):
    lines = cli(capsys).splitlines()
    assert len(lines) < 300
    graph = [ln for ln in lines if not ln.startswith("#") and ln != lines[-1]]
    assert graph and max(map(len, graph)) <= COLUMNS
    # every step, in order, each with its outcome right after its graph
    heads = [ln.split(":")[0] for ln in lines if ln.startswith("# ") and ". " in ln[:6]]
    assert heads == ["# 1. gpu_register", "# 2. write_to_gpu", "# 3. gpu_readback",
                     "# 4. gpu_free", "# 5. write_after_free"]
    outcomes = [ln for ln in lines if ln.startswith("#    => ")]
    assert len(outcomes) == 5
    assert outcomes[1].startswith("#    => completion SUCCESS; bytes arrived: yes, 65,536")
    assert outcomes[3].startswith("#    => MR invalidated: free callback on "
                                  "host-b:kworker/nv_queue-1")
    assert outcomes[4] == "#    => completion REM_ACCESS_ERR; bytes arrived: no, nothing DMA'd"
    assert lines[-1] == SUMMARY


def test_the_failing_write_is_on_screen(capsys):
    """The result the issue found at line 3,356 of 4,978: the responder's NAK, the CQE."""
    out = cli(capsys)
    assert 'hca_mkey_translate(key=0x902' in out and "/* = !WqeError */" in out
    assert "mlx5_cqe: qpn=0x100 wqe_counter=1 cqe_opcode=13 status=10 wr_id=2" in out


def test_summary_statuses_are_the_recorded_completions(trace):
    writes = [c for c in step_calls(trace, GPUDIRECT_STORY)
              if c.func in ("write_to_gpu", "write_after_free")]
    cqes = [ibv_wc_status_str(int(p.fields["status"])) for p in trace.points("mlx5_cqe")]
    assert [s for w in writes for s in completions(w)] == cqes == ["SUCCESS", "REM_ACCESS_ERR"]
    assert GPUDIRECT_STORY.summary(trace) == SUMMARY


def test_without_cudafree_the_story_says_both_writes_succeed():
    with Tracer() as t:
        run_gpudirect(cuda_free=False)
    text = format_story("gpudirect", t.trace, GPUDIRECT_STORY, 0)
    assert "# 4. gpu_free" not in text and "# 4. write_after_free" in text
    assert text.splitlines()[-1] == ("gpudirect: WRITE first SUCCESS (bytes arrived), "
                                     "second SUCCESS (bytes arrived)")
    assert text.count("completion SUCCESS; bytes arrived: yes, 65,536") == 2


def test_full_is_the_whole_graph(capsys, trace):
    out = cli(capsys, "--full")
    assert out == format_ftrace(filter_trace(trace))     # what plain `trace` printed before
    assert out.count("\n") > 3000          # the issue counted 4,978 lines
    assert f"the whole graph ({out.count(chr(10)):,} lines)" in cli(capsys)


def test_a_filter_prints_the_graph_not_the_story(capsys):
    out = cli(capsys, "--depth", "1")
    assert out.startswith("# tracer: function_graph")
    assert SUMMARY not in out


def test_full_with_a_filter_is_refused(capsys):
    assert main(["trace", "gpudirect", "--full", "--depth", "2"]) == 2
    assert "--full" in capsys.readouterr().err


def test_mermaid_starts_at_the_story_and_reaches_the_gpu_and_the_failure(capsys):
    out = cli(capsys, "--format", "mermaid")
    notes = [ln.strip() for ln in out.splitlines() if "Note over" in ln and ": task " in ln]
    assert notes[0] == "Note over userspace: task host-b:server-2"     # no boot, no probe
    for boot in ("load_module", "mlx5_init_one", "probe_one", "mlx5_uninit_one"):
        assert boot not in out
    assert "nvidia_p2p_get_pages" in out and "ib_invalidate_peer_memory" in out
    assert "Note over nvidia: task host-b:kworker/nv_queue-1" in out   # the free callback
    assert "status=10" in out                   # the failing WRITE's CQE
    assert "more crossings not shown" not in out


def test_other_scenarios_keep_the_whole_graph(capsys):
    assert get("pin").story is None
    assert main(["trace", "pin"]) == 0
    assert capsys.readouterr().out.startswith("# tracer: function_graph")


def test_stats_follow_the_story(capsys):
    out = cli(capsys, "--stats")
    assert SUMMARY in out
    assert out.rstrip().endswith("num_free_callbacks   1")
