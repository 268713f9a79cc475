"""Mirrors include/uapi/asm-generic/resource.h and include/uapi/linux/resource.h: the
rlimit numbers a program passes to setrlimit, RLIM_INFINITY, and the default
RLIMIT_MEMLOCK (MLOCK_LIMIT)."""

from __future__ import annotations

RLIMIT_NOFILE = 7
RLIMIT_MEMLOCK = 8
RLIM_INFINITY = (1 << 64) - 1      # ~0UL
MLOCK_LIMIT = 8 << 20              # the default since 5.16
