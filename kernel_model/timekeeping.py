"""Mirrors the parts of kernel/time/timekeeping.c the drivers read: the real-time clock.

# EMU: there is no RTC and no NTP: CLOCK_REALTIME is a fixed boot instant
# (BOOT_REALTIME_NS, 2024-01-01T00:00:00Z) plus the scheduler's virtual time
# (jiffies at HZ = 1000), so runs are reproducible.
"""

from __future__ import annotations

from kernel_model.sched import HZ, SCHED

NSEC_PER_SEC = 1_000_000_000
NSEC_PER_MSEC = 1_000_000
BOOT_REALTIME_NS = 1_704_067_200 * NSEC_PER_SEC


def ktime_get_real_ns() -> int:
    """Mirrors ktime_get_real_ns(): nanoseconds since the epoch (CLOCK_REALTIME)."""
    return BOOT_REALTIME_NS + SCHED.jiffies * (NSEC_PER_SEC // HZ)
