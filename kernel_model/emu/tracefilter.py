"""Mirrors ftrace's set_graph_function and max_graph_depth, applied to a recorded Trace.

Emulator-level.  ftrace filters while it records; here the whole run is
recorded once and every view is cut from the model afterwards, so one run
can be looked at many ways (kernel_model.emu.traceout prints any of them):

  * function - like set_graph_function: only the subtrees under calls to
    one function, each match becoming a root at depth 0;
  * layer    - only the calls and tracepoints of some layers; a kept node
    whose parent was dropped hangs from its nearest kept ancestor, so
    `layer=("ib_core", "mlx5_ib")` reads as a driver-only call graph;
  * depth    - like max_graph_depth: nothing at depth N or below;
  * task     - one track only;
  * during   - every task, but only while calls to one function ran (from
    the first entry to the last exit of each outermost call): what the HCA,
    the other machine and the kernel threads did meanwhile.  ftrace has no
    such filter; trace-cmd's time windows on a per-CPU buffer come closest;
  * windows() - every task, but only within some stretches of time (what
    during keeps of some calls): a scenario's story and each of its
    sections (scenarios.story).

Every filter returns a new Trace of new Call/Point nodes (parents, depths,
children, roots and timeline rebuilt together) and never touches its input,
so a test may filter the same trace twice.  Track numbers and names stay
as they were (Call.track keeps meaning the same task); a track that lost
everything keeps its name and gets no roots.

A Point's depth is one more than its parent Call's (0 at the top of a
track): it sits where a call made at that moment would.

assert_call_flow() is the test-side reader: it checks that calls happened
in an order, and when they did not, shows what happened instead.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable, Iterable, Sequence

from kernel_model.tracedata import LAYERS, SWITCH, Call, Point, Switch, Trace

Node = Call | Point
Step = str | set[str] | frozenset[str]

MAX_ACTUAL_LINES = 40     # lines of the actual call sequence in a flow mismatch


def filter_trace(trace: Trace, *, function: str | None = None, depth: int | None = None,
                 layer: str | Iterable[str] | None = None, task: str | None = None,
                 during: str | None = None) -> Trace:
    """A new Trace cut down by the filters given, applied during, function, layer,
    depth, task.

    Every argument is checked before any work so a typo fails at once with
    the choices available; with no filter the result is a plain copy.
    """
    layers = None if layer is None else _layer_set(layer)
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be >= 1 (like max_graph_depth), not {depth!r}")
    track = None if task is None else _task_track(trace, task)
    out = trace
    if during is not None:
        out = _during(out, during)
    if function is not None:
        out = _by_function(out, function)
    if layers is not None:
        out = _rebuild(out, lambda n: n.layer in layers)
    if depth is not None:
        out = _rebuild(out, lambda n: n.depth < depth)
    if track is not None:
        out = _rebuild(out, lambda n: n.track == track)
    return _rebuild(out, lambda n: True) if out is trace else out


def _layer_set(layer: str | Iterable[str]) -> frozenset[str]:
    layers = frozenset([layer] if isinstance(layer, str) else layer)
    unknown = sorted(layers - set(LAYERS))
    if unknown or not layers:
        what = f"unknown layer {', '.join(map(repr, unknown))}" if unknown else "no layer given"
        raise ValueError(f"{what}; layers are: {', '.join(LAYERS)}")
    return layers


def _task_track(trace: Trace, task: str) -> int:
    try:
        return trace.track_of(task)
    except KeyError as e:
        raise ValueError(e.args[0]) from None


def _by_function(trace: Trace, name: str) -> Trace:
    """Keep the subtrees of the outermost calls to `name` (a nested call is inside one)."""
    kept: set[int] = set()
    for call in trace.calls():
        if call.func == name and id(call) not in kept:
            kept.update(id(n) for n in call.walk())
    if not kept:
        raise ValueError(_no_function_message(trace, name))
    return _rebuild(trace, lambda n: id(n) in kept)


def _during(trace: Trace, name: str) -> Trace:
    """Keep every node, on any track, that started while an outermost call to `name` ran."""
    windows: list[tuple[int, int]] = []
    inside: set[int] = set()
    for call in trace.calls():
        if call.func == name and id(call) not in inside:
            inside.update(id(n) for n in call.walk())
            end = call.end if call.end is not None else max(
                (n.start if isinstance(n, Call) else n.ts) for n in call.walk())
            windows.append((call.start, end))
    if not windows:
        raise ValueError(_no_function_message(trace, name))

    def keep(n: Node) -> bool:
        t = n.start if isinstance(n, Call) else n.ts
        return any(lo <= t <= hi for lo, hi in windows)
    return _rebuild(trace, keep)


def windows(trace: Trace, spans: Sequence[tuple[int, int]], *,
            depth: int | None = None) -> Trace:
    """Every task's nodes that started within one of `spans` ([start, end] in ns),
    nothing at `depth` or below.

    A kept node whose caller started before its span becomes a root, so the
    HCA's work during one user call reads from its own top.
    """
    if depth is not None and depth < 1:
        raise ValueError(f"depth must be >= 1 (like max_graph_depth), not {depth!r}")
    out = _rebuild(trace, lambda n: any(lo <= _start(n) <= hi for lo, hi in spans))
    return out if depth is None else _rebuild(out, lambda n: n.depth < depth)


def _start(n: Node) -> int:
    return n.start if isinstance(n, Call) else n.ts


def _no_function_message(trace: Trace, name: str) -> str:
    names = sorted({c.func for c in trace.calls()})
    if not names:
        return f"no call to {name!r}: the trace has no calls"
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    shown = ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")
    return f"no call to {name!r} in the trace{hint}; functions traced: {shown}"


# -- rebuilding ----------------------------------------------------------------

def _rebuild(trace: Trace, keep: Callable[[Node], bool]) -> Trace:
    """A new Trace of copies of the nodes `keep` accepts; children of dropped nodes move up."""
    copies: dict[int, Node] = {}
    roots: list[list[Node]] = [[] for _ in trace.tracks]
    for track, nodes in enumerate(trace.roots):
        for node in nodes:
            _copy_tree(node, None, keep, copies, roots[track])
    timeline = [(kind, dataclasses.replace(e) if kind == SWITCH else copies[id(e)])
                for kind, e in trace.timeline if kind == SWITCH or id(e) in copies]
    remaining = {t for t, nodes in enumerate(roots) if nodes}
    return Trace(clock=trace.clock, tracks=list(trace.tracks), roots=roots,
                 timeline=_fix_switches(timeline, remaining), machine=trace.machine)


def _copy_tree(node: Node, parent: Call | None, keep: Callable[[Node], bool],
               copies: dict[int, Node], sink: list[Node]) -> None:
    """Copy `node` (if kept) under `parent` into `sink`, then its children likewise."""
    if keep(node):
        depth = 0 if parent is None else parent.depth + 1
        if isinstance(node, Point):
            copy = dataclasses.replace(node, fields=dict(node.fields), depth=depth, parent=parent)
        else:
            copy = dataclasses.replace(node, children=[], depth=depth, parent=parent)
        copies[id(node)] = copy
        sink.append(copy)
        parent = copy if isinstance(copy, Call) else parent
        sink = copy.children if isinstance(copy, Call) else sink
    if isinstance(node, Call):
        for child in node.children:
            _copy_tree(child, parent, keep, copies, sink)


def _fix_switches(timeline: list, remaining: set[int]) -> list:
    """Merge runs of switches left with nothing between them; keep those between remaining tracks.

    Dropping a stretch of one task's events leaves `A => B, B => A` back to
    back; that run says nothing and goes, and `A => B, B => C` becomes A => C.
    """
    out: list = []
    run: list[Switch] = []
    for kind, e in timeline:
        if kind == SWITCH:
            run.append(e)
            continue
        out += _merged(run, remaining)
        run = []
        out.append((kind, e))
    return out + _merged(run, remaining)


def _merged(run: list[Switch], remaining: set[int]) -> list:
    if not run:
        return []
    first, last = run[0], run[-1]
    if first.prev == last.next or first.prev not in remaining or last.next not in remaining:
        return []
    return [(SWITCH, last if len(run) == 1 else dataclasses.replace(last, prev=first.prev))]


# -- assert_call_flow ----------------------------------------------------------

def assert_call_flow(trace: Trace, steps: Sequence[Step]) -> list[Call]:
    """Check the calls happened in this order; return the matched Calls, one per name.

    A step is a function name, or a set of names that must all be called,
    in any order, after the previous step and before the next one starts
    (a set finishes at its last member).  Calls in between are ignored and
    every track counts, in entry order.  The earliest match is taken, which
    finds a match whenever one exists.
    """
    calls = trace.calls()
    matched: list[Call] = []
    pos = 0
    for i, step in enumerate(steps):
        names = _step_names(step)
        found = {n: _find(calls, n, pos) for n in names}
        if None in found.values():
            raise AssertionError(_flow_message(calls, steps, i, pos, found))
        at = sorted(found.values())
        matched += [calls[j] for j in at]
        pos = at[-1] + 1 if at else pos
    return matched


def _step_names(step: Step) -> list[str]:
    if isinstance(step, str):
        return [step]
    if isinstance(step, set | frozenset) and all(isinstance(n, str) for n in step):
        return sorted(step)
    raise TypeError(f"a call-flow step is a function name or a set of them, not {step!r}")


def _find(calls: list[Call], name: str, start: int) -> int | None:
    return next((j for j in range(start, len(calls)) if calls[j].func == name), None)


def _flow_message(calls: list[Call], steps: Sequence[Step], failed: int, pos: int,
                  found: dict[str, int | None]) -> str:
    lines = [f"call flow: step {failed + 1} of {len(steps)} not found", "expected:"]
    for i, step in enumerate(steps):
        mark = "ok" if i < failed else "MISSING" if i == failed else "-"
        note = "   " + _why_missing(calls, found, pos) if i == failed else ""
        lines.append(f"  {i + 1:>2} {mark:<7} {_step_text(step)}{note}")
    where = f"after step {failed} (from call #{pos + 1})" if failed else "from the start"
    lines.append(f"actual calls {where}, {len(calls) - pos} of {len(calls)}:")
    return "\n".join(lines + _collapsed([c.func for c in calls[pos:]]))


def _step_text(step: Step) -> str:
    return step if isinstance(step, str) else "{" + ", ".join(sorted(step)) + "}"


def _why_missing(calls: list[Call], found: dict[str, int | None], pos: int) -> str:
    why = []
    for name, at in found.items():
        if at is not None:
            continue
        earlier = sum(c.func == name for c in calls[:pos])
        why.append(f"{name}: " + (f"called {earlier}x, all before this step" if earlier
                                  else "never called"))
    return "(" + "; ".join(why) + ")"


def _collapsed(names: list[str]) -> list[str]:
    """The names one per line, a repeated name as `name xN`, cut at MAX_ACTUAL_LINES."""
    runs: list[list] = []
    for n in names:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    lines = [f"  {n} x{k}" if k > 1 else f"  {n}" for n, k in runs]
    if not lines:
        return ["  (none)"]
    return lines[:MAX_ACTUAL_LINES] + (["  ..."] if len(lines) > MAX_ACTUAL_LINES else [])
