"""The recorded trace: a function graph per task, tracepoints and context switches.

Emulator-level (the kernel's nearest kin is the ftrace ring buffer once read
out).  kernel_model.trace records raw events while the run goes on; when it
stops it builds one Trace from them, and everything downstream - the filters,
assert_call_flow, and the three output formats in kernel_model.emu.traceout -
reads only this model, so a new format or filter never touches the recorder.

The model:
  * a *track* is one task as the trace shows it (`comm-pid`, like ftrace's
    funcgraph-proc column): tracks[i] is its name, in order of first
    appearance;
  * a Call is one traced function: entry and exit time, its arguments and
    return value already summarised to text, its layer, and its children
    (Calls and Points, in order) - a tree per track, `Trace.roots[track]`;
  * a Point is a tracepoint (firmware command, pages pinned, ...): a name,
    a timestamp and its fields;
  * a Switch is a context switch between tracks (sched_switch);
  * `Trace.timeline` is every entry, exit, point and switch in the order
    they happened, which is what the text format prints.

Times are integer nanoseconds: virtual by default (a fixed cost per
recorded event, so two runs produce identical traces) or wall-clock when
the tracer was asked for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: the layers a traced function belongs to, top of the stack first ("driver": any
#: other device driver, e.g. gup_test; "hw": the emulated silicon, not kernel code)
LAYERS = ("userspace", "syscall", "ib_core", "mlx5_ib", "mlx5_core", "peer_client",
          "nvidia", "driver", "kernel_model", "hw")


@dataclass(slots=True, eq=False)
class Call:
    """One traced function call on one track."""

    func: str
    layer: str
    track: int
    start: int                      # ns
    end: int | None = None          # ns; None when still running as tracing stopped
    args: str = ""                  # "start=0x7f8000000000, nr_pages=1"
    ret: str | None = None          # "1", "-EFAULT", "!ValueError"; None: returned None
    depth: int = 0                  # 0 for a root of its track
    children: list[Call | Point] = field(default_factory=list)
    parent: Call | None = None

    @property
    def duration(self) -> int | None:
        return None if self.end is None else self.end - self.start

    def walk(self):
        """This call and every call and point below it, in pre-order."""
        yield self
        for c in self.children:
            if isinstance(c, Call):
                yield from c.walk()
            else:
                yield c


@dataclass(slots=True, eq=False)
class Point:
    """A tracepoint hit: `name` with its fields, at `ts`."""

    name: str
    layer: str
    track: int
    ts: int
    fields: dict[str, object]
    depth: int = 0
    parent: Call | None = None

    def fields_text(self) -> str:
        return " ".join(f"{k}={_field(v)}" for k, v in self.fields.items())


@dataclass(slots=True, eq=False)
class Switch:
    """The CPU moved from one track to another at `ts` (sched_switch)."""

    ts: int
    prev: int                       # track numbers
    next: int
    reason: str = ""


# timeline entry kinds
ENTER, EXIT, POINT, SWITCH = "enter", "exit", "point", "switch"


@dataclass(slots=True, eq=False)
class Trace:
    """One recorded run.  See the module docstring."""

    clock: str                                        # "virtual" or "wall"
    tracks: list[str] = field(default_factory=list)   # track number -> "comm-pid"
    roots: list[list[Call | Point]] = field(default_factory=list)   # per track
    timeline: list[tuple[str, Call | Point | Switch]] = field(default_factory=list)
    machine: str = ""                                 # the traced machine(s), for titles

    def calls(self):
        """Every Call in the order they were entered (all tracks)."""
        return [e for kind, e in self.timeline if kind == ENTER]

    def points(self, name: str | None = None):
        """Every Point, or those named `name`, in time order."""
        return [e for kind, e in self.timeline
                if kind == POINT and (name is None or e.name == name)]

    def track_of(self, name: str) -> int:
        """The track number of a task shown as `name` ("comm-pid" or "comm")."""
        for i, t in enumerate(self.tracks):
            if t == name or t.rsplit("-", 1)[0] == name:
                return i
        raise KeyError(f"no task {name!r} in the trace (tasks: {', '.join(self.tracks)})")


def _field(v: object) -> str:
    if isinstance(v, bool) or v is None:
        return str(v)
    if isinstance(v, int):
        return hex(v) if v >= 4096 or v < -4096 else str(v)
    return str(v)
