"""Runnable scenarios: small, complete programs that `peermem trace` records.

Each scenario boots its own Machine, runs a story (a process mapping
memory, a kernel caller pinning it, two threads racing for locks, ...),
tears everything down and passes the leak check.  They are the demos of
the docs and the CLI, so they must be deterministic: the same trace,
byte for byte, on every run under the default schedule.

Register one with the decorator, in a module listed in _MODULES:

    @scenario("pin", "a process maps memory; a kernel caller pins and DMA-maps it")
    def pin() -> None: ...

A scenario may also tell its story (scenarios.story): the user-visible
steps and their outcomes, what `peermem trace NAME` prints by default:

    @scenario("gpudirect", "...", story=GPUDIRECT_STORY)

Scenarios sit above every layer (like tests) and may import anything.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kernel_model.sched import SCHED, ReplayDivergence, ReplayStrategy
from kernel_model.trace import Tracer
from kernel_model.tracedata import Trace

if TYPE_CHECKING:
    from scenarios.story import Story

#: the modules that define scenarios, imported on first use
_MODULES = ("scenarios.pin", "scenarios.open_device", "scenarios.create_qp",
            "scenarios.reg_mr", "scenarios.rdma_write", "scenarios.gpudirect", "scenarios.io_peer",
            "scenarios.reg_cache", "scenarios.dmabuf")


@dataclass(frozen=True)
class Scenario:
    name: str
    summary: str
    run: Callable[[], object]
    story: Story | None = None    # the default view of `peermem trace NAME`


_SCENARIOS: dict[str, Scenario] = {}


def scenario(name: str, summary: str, story: Story | None = None
             ) -> Callable[[Callable[[], object]], Callable[[], object]]:
    """Register fn as the scenario `name` with a one-line summary (and its story)."""

    def reg(fn: Callable[[], object]) -> Callable[[], object]:
        if name in _SCENARIOS:
            raise ValueError(f"scenario: {name!r} registered twice")
        _SCENARIOS[name] = Scenario(name, summary, fn, story)
        return fn

    return reg


def scenarios() -> dict[str, Scenario]:
    """Every registered scenario by name, in name order."""
    for mod in _MODULES:
        importlib.import_module(mod)
    return dict(sorted(_SCENARIOS.items()))


def get(name: str) -> Scenario:
    """The scenario `name`; KeyError listing the known ones otherwise."""
    all_ = scenarios()
    if name not in all_:
        raise KeyError(f"no scenario {name!r}; known: {', '.join(all_)}")
    return all_[name]


def run_traced(name: str, *, clock: str = "virtual", schedule: str | None = None,
               report: list | None = None) -> Trace:
    """Run scenario `name` under a Tracer and return its Trace.

    A scenario may return a report (text it wants shown after the trace, such
    as statistics); it is appended to `report` when one is given.

    `schedule` replays a recorded schedule string instead of the default
    order (see kernel_model.sched): ValueError if it is malformed,
    ReplayDivergence if the run does not make exactly those decisions.
    """
    sc = get(name)
    replay = ReplayStrategy(schedule) if schedule else None  # ValueError if malformed
    SCHED.use(replay)
    try:
        with Tracer(clock=clock) as t:
            result = sc.run()
        if report is not None and result is not None:
            report.append(result)
        if replay is not None and replay.i < len(replay.steps):
            raise ReplayDivergence(f"replay: the run made {replay.i} decisions but the "
                                   f"schedule lists {len(replay.steps)}")
    except BaseException:
        SCHED.abandon()  # a failed run leaves no task behind for the next one
        raise
    finally:
        SCHED.use(None)
    return t.trace
