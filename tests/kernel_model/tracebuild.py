"""TraceBuilder: synthetic Trace objects for the trace filter and output tests.

Records enter/exit/point/switch as a recorder would and builds a consistent
Trace (parents, depths, children, roots, timeline).  The clock is virtual:
each event happens at the current time and moves it 100 ns on; wait() adds
more, to get durations past ftrace's overhead markers.  check_consistent()
is the model's invariants, so every filter result can be checked whole.
"""

from __future__ import annotations

from kernel_model.tracedata import ENTER, EXIT, POINT, SWITCH, Call, Point, Switch, Trace

STEP = 100   # ns per recorded event


class TraceBuilder:
    def __init__(self, machine: str = "") -> None:
        self.now = 0
        self.trace = Trace(clock="virtual", machine=machine)
        self.stacks: list[list[Call]] = []

    def _tick(self) -> int:
        ts, self.now = self.now, self.now + STEP
        return ts

    def track(self, task: str) -> int:
        if task not in self.trace.tracks:
            self.trace.tracks.append(task)
            self.trace.roots.append([])
            self.stacks.append([])
        return self.trace.tracks.index(task)

    def _attach(self, t: int, node: Call | Point) -> None:
        stack = self.stacks[t]
        node.parent = stack[-1] if stack else None
        node.depth = len(stack)
        (stack[-1].children if stack else self.trace.roots[t]).append(node)

    def enter(self, task: str, func: str, layer: str, args: str = "") -> Call:
        t = self.track(task)
        call = Call(func, layer, t, self._tick(), args=args)
        self._attach(t, call)
        self.stacks[t].append(call)
        self.trace.timeline.append((ENTER, call))
        return call

    def exit(self, task: str, ret: str | None = None) -> Call:
        call = self.stacks[self.track(task)].pop()
        call.end, call.ret = self._tick(), ret
        self.trace.timeline.append((EXIT, call))
        return call

    def call(self, task: str, func: str, layer: str, args: str = "",
             ret: str | None = None) -> Call:
        """A leaf: entry and exit back to back."""
        self.enter(task, func, layer, args)
        return self.exit(task, ret)

    def point(self, task: str, name: str, layer: str, fields: dict | None = None) -> Point:
        t = self.track(task)
        p = Point(name, layer, t, self._tick(), dict(fields or {}))
        self._attach(t, p)
        self.trace.timeline.append((POINT, p))
        return p

    def switch(self, prev: str, next: str, reason: str = "") -> Switch:
        s = Switch(self._tick(), self.track(prev), self.track(next), reason)
        self.trace.timeline.append((SWITCH, s))
        return s

    def wait(self, ns: int) -> None:
        self.now += ns

    def build(self) -> Trace:
        return self.trace


def check_consistent(trace: Trace) -> None:
    """Assert the model's invariants: trees, depths, timeline order, switches."""
    assert len(trace.roots) == len(trace.tracks)
    in_trees: list = []
    for t, nodes in enumerate(trace.roots):
        for n in nodes:
            _check_node(n, None, t, in_trees)
    enters = [e for k, e in trace.timeline if k in (ENTER, POINT)]
    assert {id(n) for n in enters} == {id(n) for n in in_trees}
    assert len(enters) == len(in_trees)
    exits = [e for k, e in trace.timeline if k == EXIT]
    assert {id(c) for c in exits} == {id(c) for c in in_trees
                                      if isinstance(c, Call) and c.end is not None}
    pos = {(k, id(e)): i for i, (k, e) in enumerate(trace.timeline)}
    for c in exits:
        assert pos[(ENTER, id(c))] < pos[(EXIT, id(c))]
    used = {t for t, nodes in enumerate(trace.roots) if nodes}
    for k, e in trace.timeline:
        if k == SWITCH:
            assert e.prev in used and e.next in used and e.prev != e.next


def _check_node(n, parent, track, acc) -> None:
    acc.append(n)
    assert n.parent is parent and n.track == track
    assert n.depth == (0 if parent is None else parent.depth + 1)
    if isinstance(n, Call):
        for c in n.children:
            _check_node(c, n, track, acc)
