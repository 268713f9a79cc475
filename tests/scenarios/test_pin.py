"""The `pin` scenario (scenarios/pin.py): its tasks, tracepoints and replay."""

from __future__ import annotations

import pytest

from kernel_model.emu.machine import Machine, live_machines
from kernel_model.emu.traceout import format_ftrace
from kernel_model.sched import SCHED
from kernel_model.tracedata import Call
from scenarios import run_traced


@pytest.fixture(scope="module")
def trace():
    return run_traced("pin")


def _ancestors(node) -> list[str]:
    out, p = [], node.parent
    while p is not None:
        out.append(p.func)
        p = p.parent
    return out


def test_passes_its_leak_check():
    first = Machine.next_serial
    run_traced("pin")  # the scenario ends with check_leaks(), which raises on a leak
    built = [m for m in live_machines if m.serial >= first]
    assert [m.name for m in built] == ["host0"]
    built[0].check_leaks()


def test_tracks(trace):
    busy = [name for name, roots in zip(trace.tracks, trace.roots, strict=True) if roots]
    assert busy == ["swapper-0", "app-1", "pin_worker-2"]


def test_pages_pinned_under_pin_user_pages_remote(trace):
    [p] = trace.points("pages_pinned")
    assert p.fields["pinned"] == 4 and p.fields["nr_pages"] == 4
    assert p.parent.func == "pin_user_pages_remote"
    assert trace.tracks[p.track] == "pin_worker-2"
    [u] = trace.points("pages_unpinned")
    assert u.fields["nr_pages"] == 4 and u.parent.func == "unpin_user_pages"


def test_four_user_faults_under_map_and_touch(trace):
    faults = trace.points("page_fault_user")
    assert len(faults) == 4
    assert all("map_and_touch" in _ancestors(f) for f in faults)
    addrs = [f.fields["address"] for f in faults]
    assert addrs == [addrs[0] + i * 4096 for i in range(4)]


def test_dma_map_coalesces_to_one_entry(trace):
    [m] = trace.points("dma_map_sg")
    assert (m.fields["ents"], m.fields["nents"]) == (1, 1)
    assert m.parent.func == "dma_map_sgtable"


def test_every_call_returned(trace):
    calls = trace.calls()
    assert calls and all(isinstance(c, Call) and c.end is not None for c in calls)


def test_replaying_the_recorded_schedule_gives_the_same_trace():
    first = run_traced("pin")
    schedule = SCHED.schedule  # the decisions of that run, still held after it
    assert schedule
    assert format_ftrace(run_traced("pin", schedule=schedule)) == format_ftrace(first)


def test_another_schedule_gives_another_valid_trace():
    default = format_ftrace(run_traced("pin"))
    # the kernel thread runs as soon as it is woken, before main leaves its kernel section
    other = format_ftrace(run_traced("pin", schedule="0,2"))
    assert other != default
    assert " 0)   pin_worker-2 =>  swapper-0\n" in other
