"""The machine's leak check: after shutdown, every page, pin and mm is accounted.

Emulator-level debug check (the kernel's nearest kin are page_owner, kmemleak
and the nr_foll_pin_* vmstat pair).  After every process has exited, nothing
may remain: no page with a pin, no page still allocated (the allocator names
who allocated it and where), no pin acquired and never released, no mm
kept alive (an mmgrab without mmdrop, with its pinned_vm), no WARN recorded,
and nothing any subsystem's own check (machine.leak_checks) reports.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from c_ext import U64Array

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

MAX_LINES = 20
#: the innermost frames a WARN's call trace shows
MAX_FRAMES = 16
#: the packages whose frames a call trace shows: the emulated kernel, its drivers and
#: the programs on it (not the test harness around them)
_TRACED = ("kernel_model/", "drivers/", "peermem_clients/", "userspace/", "scenarios/")
_TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/"


class LeakError(AssertionError):
    """Something was left behind; the message lists what and who allocated it."""


def call_trace(skip: int = 1) -> str:
    """The running task's call trace, innermost first, as the kernel prints one after a
    WARN: "Call Trace:" then a line per frame of the emulated kernel, drivers and
    programs (`skip` frames above the caller left out); "" when there is none."""
    f = sys._getframe(skip + 1)
    lines: list[str] = []
    while f is not None and len(lines) < MAX_FRAMES:
        path = f.f_code.co_filename.replace("\\", "/")
        path = path[len(_TOP):] if path.startswith(_TOP) else path
        if path.startswith(_TRACED) and path != "kernel_model/emu/machine.py":
            name = getattr(f.f_code, "co_qualname", f.f_code.co_name)
            lines.append(f" {name}() at {path}:{f.f_lineno}")
        f = f.f_back
    return "\n".join(["Call Trace:", *lines]) if lines else ""


def _bug(text: str, trace: str) -> str:
    """A WARN as one entry of the report: its first line, then the rest of its text and
    its call trace indented under it."""
    first, *rest = f"kernel bug: {text}".splitlines()
    return "\n    ".join([first, *rest, *trace.splitlines()])


def find_leaks(m: Machine) -> list[str]:
    """Every leak on the machine, one line each (empty when clean); a WARN with the
    call trace it was reported from on the lines after it."""
    traces = getattr(m, "bug_traces", {})
    out: list[str] = [_bug(b, traces.get(b, "")) for b in m.bugs]
    for t in m.tasks.values():
        out.append(f"task {t.pid} ({t.comm}) still running")
    for t in list(m.sched.alive.values()):
        if t.machine is m:
            out.append(f"sched task {t.tid} {t.label} still {t.state}")
    for t in list(m.sched.failed):
        if t.machine is m:
            out.append(f"sched task {t.tid} {t.label} died and nobody joined it: {t.exc!r}")
    out += _page_leaks(m)
    acq = m.vmstat["nr_foll_pin_acquired"]
    rel = m.vmstat["nr_foll_pin_released"]
    if acq != rel:
        out.append(f"pins: nr_foll_pin_acquired {acq} != nr_foll_pin_released {rel}")
    for mm in list(m.mms):
        out.append(f"mm of pid {mm.owner_pid} still referenced: mm_count={mm.mm_count} "
                   f"mm_users={mm.mm_users} pinned_vm={mm.pinned_vm}")
    for check in m.leak_checks:
        out += check(m)
    return out


def _page_leaks(m: Machine) -> list[str]:
    out: list[str] = []
    scratch = U64Array(4096)
    pfn = 1  # pfn 0 is reserved at boot
    pages = m.mem.pages
    while True:
        k = m.ops.scan_pages(m.mem, pfn, scratch)
        for i in range(k):
            p = scratch.view[i]
            ref, pin, mapc = pages[p * 4 + 1], pages[p * 4 + 2], pages[p * 4 + 3]
            owner = m.zone.owner_of(p)
            who = f"{owner[1]} at {owner[2]}" if owner else "no allocation record"
            out.append(f"pfn {p:#x}: refcount {ref} pincount {pin} mapcount {mapc} ({who})")
        if k < scratch.n:
            break
        pfn = scratch.view[k - 1] + 1
    for head, (order, owner, where) in m.zone.allocated.items():
        if m.mem.pages[head * 4 + 1] == 0:  # allocated but refcount 0: not seen above
            out.append(f"pfn {head:#x} order {order}: allocated by {owner} at {where} "
                       "with refcount 0")
    return out


def check_leaks(m: Machine, shutdown: bool = True, max_lines: int | None = MAX_LINES) -> None:
    """Shut the machine down (unless told not to) and raise LeakError on any leak, the
    first `max_lines` listed (None: every one)."""
    if shutdown:
        m.shutdown()
    leaks = find_leaks(m)
    if leaks:
        cut = len(leaks) if max_lines is None else max_lines
        shown = leaks[:cut]
        more = f"\n... and {len(leaks) - cut} more" if len(leaks) > cut else ""
        raise LeakError(f"{m.name}: {len(leaks)} leak(s):\n  " + "\n  ".join(shown) + more)
