"""The machine's leak check: after shutdown, every page, pin and mm is accounted.

Emulator-level debug check (the kernel's nearest kin are page_owner, kmemleak
and the nr_foll_pin_* vmstat pair).  After every process has exited, nothing
may remain: no page with a pin, no page still allocated (the allocator names
who allocated it and where), no pin acquired and never released, no mm
kept alive (an mmgrab without mmdrop, with its pinned_vm), no WARN recorded,
and nothing any subsystem's own check (machine.leak_checks) reports.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from c_ext import U64Array

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

MAX_LINES = 20


class LeakError(AssertionError):
    """Something was left behind; the message lists what and who allocated it."""


def find_leaks(m: Machine) -> list[str]:
    """Every leak on the machine, one line each (empty when clean)."""
    out: list[str] = [f"kernel bug: {b}" for b in m.bugs]
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


def check_leaks(m: Machine, shutdown: bool = True) -> None:
    """Shut the machine down (unless told not to) and raise LeakError on any leak."""
    if shutdown:
        m.shutdown()
    leaks = find_leaks(m)
    if leaks:
        shown = leaks[:MAX_LINES]
        more = f"\n... and {len(leaks) - MAX_LINES} more" if len(leaks) > MAX_LINES else ""
        raise LeakError(f"{m.name}: {len(leaks)} leak(s):\n  " + "\n  ".join(shown) + more)
