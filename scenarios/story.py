"""A scenario's story: what `peermem trace NAME` prints when no filter is given.

The whole function graph of a scenario is for reading with filters (the
gpudirect one is 5,000 lines, most of them the HCA's probe and the
teardown).  A scenario may declare a Story instead: its user-visible steps
(traced userspace functions such as gpu_register or write_after_free, each
with a caption), a shallow depth, what to say about each step's outcome and
a closing summary line.  The story view prints, for each step, the step's
own call and what every task (the HCA, the other machine, a kernel thread)
did while it ran, all cut at `depth`, narrow enough to read; then the step's
outcome line; then the summary.

Outcomes are read from the recorded Trace, never from what the scenario
meant to happen: a completion status is the `mlx5_cqe` tracepoint the
provider hit while polling (the CQE the HCA wrote), bytes arrived is the
responder HCA's DMA scatter.  So a variant of the run that goes differently
prints a different story.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernel_model.emu.tracefilter import windows
from kernel_model.emu.traceout import format_ftrace
from kernel_model.tracedata import Call, Trace
from userspace.libibverbs.verbs import ibv_wc_status_str

COLUMNS = 120
#: Mermaid's message limit for a story: its steps' crossings fit (gpudirect: 238)
MERMAID_MESSAGES = 300


@dataclass(frozen=True)
class StoryStep:
    """One user-visible step: a traced function, what it does, what came of it."""

    func: str
    caption: str
    #: the outcome line for one call of func, read from the whole trace
    outcome: Callable[[Trace, Call], str] | None = None


@dataclass(frozen=True)
class Story:
    steps: tuple[StoryStep, ...]
    #: the closing line, read from the whole trace
    summary: Callable[[Trace], str]
    depth: int = 3


def step_calls(trace: Trace, story: Story) -> list[Call]:
    """The outermost calls of the story's steps, in the order they ran."""
    steps = {s.func for s in story.steps}
    return [c for c in trace.calls() if c.func in steps and not _inside(c, steps)]


def story_trace(trace: Trace, story: Story, depth: int | None = None) -> Trace:
    """Every task, only while the story's steps ran (the boot, the HCA probe, the
    connection setup and the teardown left out): what the Mermaid picture draws."""
    return windows(trace, [_span(trace, c) for c in step_calls(trace, story)], depth=depth)


def format_story(name: str, trace: Trace, story: Story, full_lines: int) -> str:
    """The story view of `trace`: one section per step call, outcomes, the summary."""
    steps = {s.func: s for s in story.steps}
    calls = step_calls(trace, story)
    lines = [f"# {name}: the story - {len(calls)} user-visible steps, {story.depth} calls "
             "deep, with what every task did meanwhile",
             f"# the whole graph ({full_lines:,} lines): peermem trace {name} --full; "
             "one step: --during STEP",
             "#"]
    for i, call in enumerate(calls, 1):
        step = steps[call.func]
        lines.append(f"# {i}. {step.func}: {step.caption}")
        part = windows(trace, [_span(trace, call)], depth=story.depth)
        lines += format_ftrace(part, header=False, cpu=False, duration=False,
                               columns=COLUMNS).splitlines()
        if step.outcome is not None:
            lines.append(f"#    => {step.outcome(trace, call)}")
        lines.append("#")
    lines.append(story.summary(trace))
    return "\n".join(lines) + "\n"


def _span(trace: Trace, call: Call) -> tuple[int, int]:
    return call.start, call.end if call.end is not None else trace.calls()[-1].start


def _inside(call: Call, steps: dict[str, StoryStep] | set[str]) -> bool:
    p = call.parent
    while p is not None:
        if p.func in steps:
            return True
        p = p.parent
    return False


# -- readers for outcome lines ---------------------------------------------------------

def completions(call: Call) -> list[str]:
    """The completion statuses the provider polled under `call` (its mlx5_cqe tracepoints)."""
    return [ibv_wc_status_str(int(n.fields["status"])) for n in call.walk()
            if not isinstance(n, Call) and n.name == "mlx5_cqe"]


def during(trace: Trace, call: Call, func: str) -> list[Call]:
    """The calls of `func`, on any task, that started while `call` ran."""
    end = call.end if call.end is not None else float("inf")
    return [c for c in trace.calls() if c.func == func and call.start <= c.start <= end]


def calls_of(trace: Trace, func: str) -> list[Call]:
    return [c for c in trace.calls() if c.func == func]
