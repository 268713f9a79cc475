"""Mirrors kernel/trace/trace_functions_graph.c's output format, plus Perfetto JSON and Mermaid.

Emulator-level.  Three ways to write one recorded Trace, each a pure
function of it (same Trace, same text, byte for byte, so outputs can be
diffed and pinned in tests):

  * format_ftrace   - the function_graph tracer's text with funcgraph-proc,
    funcgraph-args and funcgraph-retval on: what `cat trace` shows;
  * to_perfetto / format_perfetto - Chrome trace-event JSON for
    ui.perfetto.dev: one thread per task, a category per layer, flow
    arrows from the userspace call to the firmware and device work it
    caused;
  * format_mermaid  - a sequence diagram of the layer crossings only, the
    picture of who calls whom across the stack.

EMU: there is one emulated CPU, so ftrace's CPU column is always 0 and a
change of task is always a context switch on that CPU.
"""

from __future__ import annotations

import json
import math

from kernel_model.tracedata import ENTER, EXIT, LAYERS, POINT, SWITCH, Call, Point, Trace

# -- ftrace function_graph text -------------------------------------------------

_FTRACE_HEADER = (
    "# tracer: function_graph",
    "#",
    "# CPU  TASK/PID         DURATION                  FUNCTION CALLS",
    "# |     |    |           |   |                     |   |   |   |",
)
# the overhead marker in front of a duration: the first threshold exceeded wins
_MARKERS = ((1_000_000_000, "$"), (100_000_000, "@"), (10_000_000, "*"),
            (1_000_000, "#"), (100_000, "!"), (10_000, "+"))
_DURATION_WIDTH = 15
_RULE = " " + "-" * 42


def format_ftrace(trace: Trace, *, header: bool = True, cpu: bool = True,
                  duration: bool = True, columns: int | None = None) -> str:
    """The trace as function_graph text: one line per entry, exit and tracepoint.

    A call with no children whose exit comes right after its entry prints
    as one leaf line; a call still running when tracing stopped has no
    closing brace.  A change of task prints ftrace's switch block, whether
    the recorder saw the sched_switch or not.

    The keywords are ftrace's trace_options for a narrower view: cpu and
    duration are funcgraph-cpu and funcgraph-duration (the columns go);
    header=False leaves out the `# tracer` lines.
    EMU: `columns` has no ftrace twin (ftrace never cuts a line): it sizes
    the task column to the tasks shown and cuts arguments and tracepoint
    fields to `...` so a line fits in that many columns, where it can.
    """
    shown = _used_tracks(trace) if columns is not None else range(len(trace.tracks))
    width = max([13] + [len(trace.tracks[t]) + 1 for t in shown])
    lines = [_FTRACE_HEADER[0],
             f"# EMU: one emulated CPU, so CPU is always 0; {trace.clock} clock",
             *_FTRACE_HEADER[1:]] if header else []
    fmt = _LineFormat(trace, width, cpu, duration, columns)
    running: int | None = None
    leaves: set[int] = set()
    for i, (kind, e) in enumerate(trace.timeline):
        if kind == SWITCH:
            lines += _switch_block(trace, e.prev, e.next, width, cpu)
            running = e.next
            continue
        if kind == EXIT and id(e) in leaves:
            continue
        if running is not None and e.track != running:
            lines += _switch_block(trace, running, e.track, width, cpu)
        running = e.track
        if kind == ENTER and _is_leaf(trace.timeline, i):
            leaves.add(id(e))
        lines.append(fmt.line(kind, e, id(e) in leaves))
    return "\n".join(lines) + ("\n" if lines else "")


def _is_leaf(timeline: list, i: int) -> bool:
    call = timeline[i][1]
    return (not call.children and i + 1 < len(timeline)
            and timeline[i + 1][0] == EXIT and timeline[i + 1][1] is call)


class _LineFormat:
    """One function_graph line, with the columns format_ftrace was asked for."""

    def __init__(self, trace: Trace, width: int, cpu: bool, duration: bool,
                 columns: int | None):
        self.trace, self.width, self.cpu, self.duration = trace, width, cpu, duration
        self.columns = columns

    def line(self, kind: str, e: Call | Point, leaf: bool) -> str:
        ns, head, inner, tail = None, "", "", ""
        if kind == POINT:
            head, inner, tail = f"/* {e.name}", e.fields_text(), " */"
            head += ": " if inner else ""
        elif kind == ENTER and not leaf:
            head, inner, tail = f"{e.func}(", e.args, ") {"
        elif kind == ENTER:
            head, inner, tail = f"{e.func}(", e.args, ");" + _ret_comment("", e.ret)
            ns = e.duration
        else:
            tail, ns = "}" + _ret_comment(e.func, e.ret), e.duration
        prefix = (" 0) " if self.cpu else "") + f" {self.trace.tracks[e.track]:<{self.width}}|"
        if self.duration:
            prefix += f"{_duration(ns)}|"
        prefix += "  " + "  " * e.depth
        if self.columns is not None:
            room = self.columns - len(prefix) - len(head) - len(tail)
            inner = _cut(inner, room)
        return prefix + head + inner + tail


def _cut(text: str, room: int) -> str:
    """text, or as much of it as fits in `room` columns ending in `...` (at least that)."""
    return text if len(text) <= room else text[:max(room - 3, 0)] + "..."


def _ret_comment(func: str, ret: str | None) -> str:
    """funcgraph-retval's comment: `/* = ret */` on a leaf, `/* func = ret */` on a brace."""
    if ret is None:
        return f" /* {func} */" if func else ""
    return f" /* {func} = {ret} */" if func else f" /* = {ret} */"


def _duration(ns: int | None) -> str:
    if ns is None:
        return " " * _DURATION_WIDTH
    marker = next((m for limit, m in _MARKERS if ns > limit), " ")
    us = f"{ns // 1000}.{ns % 1000:03d}"
    return f"{marker} {us:>6} us".ljust(_DURATION_WIDTH)


def _switch_block(trace: Trace, prev: int, nxt: int, width: int,
                  cpu: bool = True) -> list[str]:
    text = f"  {trace.tracks[prev]:<{width - 1}} =>  {trace.tracks[nxt]}"
    return [_RULE, (" 0) " if cpu else "") + text, _RULE]


# -- Perfetto / Chrome trace-event JSON -----------------------------------------

_PID = 1
_FLOW_TARGET_LAYERS = ("mlx5_core", "hw")
_JS_SAFE_INT = 2 ** 53


def format_perfetto(trace: Trace) -> str:
    """to_perfetto() as one line of JSON, ready for ui.perfetto.dev."""
    return json.dumps(to_perfetto(trace))


def to_perfetto(trace: Trace) -> dict:
    """The trace as Chrome trace-event JSON: X slices, instants, flows, thread names.

    Times are microseconds (the format's unit) from the trace's nanoseconds.
    A call still running when tracing stopped lasts to the trace's last
    timestamp.  Slices are sorted per thread, outer before inner, so the
    viewer nests them as the call graph does.
    """
    events = _perfetto_metadata(trace)
    events += _perfetto_slices(trace, _last_ts(trace))
    events += _perfetto_instants(trace)
    events += _perfetto_flows(trace)
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"machine": trace.machine or "peermem", "clock": trace.clock}}


def _us(ns: int) -> float:
    return ns / 1000


def _tid(track: int) -> int:
    return track + 1


def _used_tracks(trace: Trace) -> list[int]:
    """Tracks with anything on them: a filtered trace keeps the others' names only."""
    used = {t for t, nodes in enumerate(trace.roots) if nodes}
    for kind, e in trace.timeline:
        used |= {e.prev, e.next} if kind == SWITCH else {e.track}
    return sorted(used)


def _perfetto_metadata(trace: Trace) -> list[dict]:
    out = [{"name": "process_name", "ph": "M", "pid": _PID, "tid": 0,
            "args": {"name": trace.machine or "peermem"}}]
    for t in _used_tracks(trace):
        out.append({"name": "thread_name", "ph": "M", "pid": _PID, "tid": _tid(t),
                    "args": {"name": trace.tracks[t]}})
        out.append({"name": "thread_sort_index", "ph": "M", "pid": _PID, "tid": _tid(t),
                    "args": {"sort_index": t}})
    return out


def _last_ts(trace: Trace) -> int:
    last = 0
    for kind, e in trace.timeline:
        ts = e.ts if kind in (POINT, SWITCH) else e.start if kind == ENTER else e.end
        last = max(last, ts)
    return last


def _all_calls(trace: Trace) -> list[Call]:
    return [n for nodes in trace.roots for root in nodes if isinstance(root, Call)
            for n in root.walk() if isinstance(n, Call)]


def _perfetto_slices(trace: Trace, last: int) -> list[dict]:
    def key(c: Call) -> tuple:
        return (c.track, c.start, -_dur(c), c.depth)

    def _dur(c: Call) -> int:
        return (last if c.end is None else c.end) - c.start

    out = []
    for c in sorted(_all_calls(trace), key=key):
        ev = {"name": c.func, "cat": c.layer, "ph": "X", "ts": _us(c.start),
              "dur": _us(_dur(c)), "pid": _PID, "tid": _tid(c.track)}
        args = {k: v for k, v in (("args", c.args), ("ret", c.ret)) if v not in ("", None)}
        if args:
            ev["args"] = args
        out.append(ev)
    return out


def _jsonable(v: object) -> object:
    """A field value as JSON: scalars stay, big ints become hex (JavaScript loses them)."""
    if isinstance(v, bool) or v is None or isinstance(v, str):
        return v
    if isinstance(v, int):
        return v if abs(v) < _JS_SAFE_INT else hex(v)
    if isinstance(v, float) and math.isfinite(v):
        return v
    return str(v)


def _perfetto_instants(trace: Trace) -> list[dict]:
    out = []
    for kind, e in trace.timeline:
        if kind == POINT:
            out.append({"name": e.name, "cat": e.layer, "ph": "i", "s": "t", "ts": _us(e.ts),
                        "pid": _PID, "tid": _tid(e.track),
                        "args": {k: _jsonable(v) for k, v in e.fields.items()}})
        elif kind == SWITCH:
            args = {"prev": trace.tracks[e.prev], "next": trace.tracks[e.next]}
            if e.reason:
                args["reason"] = e.reason
            out.append({"name": "sched_switch", "cat": "sched", "ph": "i", "s": "t",
                        "ts": _us(e.ts), "pid": _PID, "tid": _tid(e.prev), "args": args})
    return out


def _flow_sources(trace: Trace) -> list[Call]:
    """The outermost userspace calls; without any, the outermost system calls."""
    calls = trace.calls()
    for layer in ("userspace", "syscall"):
        found = [c for c in calls if c.layer == layer and not _has_ancestor(c, layer)]
        if found:
            return found
    return []


def _has_ancestor(call: Call, layer: str) -> bool:
    p = call.parent
    while p is not None:
        if p.layer == layer:
            return True
        p = p.parent
    return False


def _is_flow_target(n: Call | Point) -> bool:
    return isinstance(n, Point) or n.layer in _FLOW_TARGET_LAYERS


def _perfetto_flows(trace: Trace) -> list[dict]:
    """One `causes` arrow from each outermost userspace call to every tracepoint and
    firmware/device call under it."""
    out = []
    flow_id = 0
    for src in _flow_sources(trace):
        for target in list(src.walk())[1:]:
            if not _is_flow_target(target):
                continue
            flow_id += 1
            ts = target.ts if isinstance(target, Point) else target.start
            common = {"name": "causes", "cat": "flow", "id": flow_id, "pid": _PID}
            out.append({**common, "ph": "s", "ts": _us(src.start), "tid": _tid(src.track)})
            out.append({**common, "ph": "f", "bp": "e", "ts": _us(ts), "tid": _tid(target.track)})
    return out


# -- Mermaid sequence diagram ------------------------------------------------------

_MERMAID_ARGS = 40


def format_mermaid(trace: Trace, max_messages: int = 200) -> str:
    """The layer crossings as a Mermaid sequenceDiagram, one participant per layer.

    Only a call into a different layer is drawn (with its return when it
    returned a value); calls within a layer are the layer's own business.
    Tracepoints are notes; a note marks where each task first runs.  After
    max_messages lines the rest is counted, not drawn, because Mermaid
    renders thousands of arrows unreadably slowly.
    """
    if max_messages < 0:
        raise ValueError(f"max_messages must be >= 0, not {max_messages}")
    messages = _mermaid_messages(trace)
    participants = _mermaid_participants(trace)
    lines = ["sequenceDiagram"] + [f"    participant {p}" for p in participants]
    lines += [f"    {m}" for m in messages[:max_messages]]
    if len(messages) > max_messages:
        more = len(messages) - max_messages
        lines.append(f"    Note over {participants[0]}: ... {more} more crossings not shown")
    return "\n".join(lines) + "\n"


def _mermaid_participants(trace: Trace) -> list[str]:
    seen = {e.layer for kind, e in trace.timeline if kind in (ENTER, POINT)}
    return [la for la in LAYERS if la in seen] + sorted(seen - set(LAYERS))


def _mermaid_messages(trace: Trace) -> list[str]:
    out: list[str] = []
    started: set[int] = set()
    for kind, e in trace.timeline:
        if kind == SWITCH:
            continue
        if e.track not in started:
            started.add(e.track)
            out.append(f"Note over {e.layer}: task {_mermaid_text(trace.tracks[e.track])}")
        if kind == POINT:
            out.append(f"Note over {e.layer}: {_mermaid_text(e.name + ' ' + e.fields_text())}")
        elif e.parent is not None and e.parent.layer != e.layer:
            out += _mermaid_crossing(kind, e)
    return out


def _mermaid_crossing(kind: str, call: Call) -> list[str]:
    caller, callee = call.parent.layer, call.layer
    if kind == ENTER:
        args = call.args if len(call.args) <= _MERMAID_ARGS else \
            call.args[:_MERMAID_ARGS - 3] + "..."
        return [f"{caller}->>{callee}: {_mermaid_text(f'{call.func}({args})')}"]
    if call.ret is None:
        return []
    return [f"{callee}-->>{caller}: {_mermaid_text(call.ret)}"]


def _mermaid_text(text: str) -> str:
    """Message text Mermaid accepts: `;` ends a statement, `#` starts an entity code."""
    return (text.replace(";", ",").replace("#", "no.")
            .replace("\r", " ").replace("\n", " ").strip())
