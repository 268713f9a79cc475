"""Mirrors rdma-core providers/mlx5/mlx5.c: the environment knobs of libmlx5.

At ibv_open_device the provider reads how many bfregs ("uuars", BlueFlame
registers) to ask the kernel for and how many of them are low-latency
(dedicated to one QP, no lock); later paths read the BlueFlame, signature and
scatter-to-CQE switches.  Each function takes the environment as a Mapping
(os.environ, or a test's dict) instead of calling getenv().

    MLX5_TOTAL_UUARS        bfregs requested (default 16)       get_total_uuars
    MLX5_NUM_LOW_LAT_UUARS  low-latency bfregs (default 4)      get_num_low_lat_uuars
    MLX5_SINGLE_THREADED    "1": no bfreg locks                 single_threaded_app
    MLX5_SHUT_UP_BF         not "0": never BlueFlame, NC pages  get_shut_up_bf
    MLX5_POST_SEND_PREFER_BF "0": BlueFlame only for inline     get_always_bf
    MLX5_QP_SIGNATURE       set (any value): WQE signatures     qp_sig_enabled
    MLX5_SRQ_SIGNATURE      set (any value): SRQ signatures     srq_sig_enabled
    MLX5_SCATTER_TO_CQE     "0": no scatter-to-CQE              use_scatter_to_cqe

Numbers go through C atoi() semantics (_atoi), so "12abc" is 12 and "abc" 0,
as in the real library.  Failures raise ProviderError with the errno the
context allocation fails with.
"""

from __future__ import annotations

import errno
from collections.abc import Mapping
from typing import Protocol

from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import (
    MLX5_ADAPTER_PAGE_SIZE,
    MLX5_DEF_TOT_UUARS,
    MLX5_MAX_BFREGS,
    MLX5_MED_BFREGS_TSHOLD,
    MLX5_NUM_NON_FP_BFREGS_PER_UAR,
)

DEFAULT_LOW_LAT_UUARS = 4

_WS = " \t\n\v\f\r"


class UuarContext(Protocol):
    """The mlx5_context fields need_uuar_lock reads."""

    tot_uuars: int
    low_lat_uuars: int
    single_threaded: bool   # rdma-core: the process-wide mlx5_single_threaded


def _atoi(s: str) -> int:
    """C atoi(): leading blanks, an optional sign, then digits; garbage ends it.

    glibc's atoi is (int)strtol(s, NULL, 10): the long is truncated to 32 bits.
    """
    s = s.lstrip(_WS)
    sign, i = 1, 0
    if s[:1] in ("+", "-"):
        sign, i = (-1 if s[0] == "-" else 1), 1
    j = i
    while j < len(s) and s[j].isascii() and s[j].isdigit():
        j += 1
    v = sign * int(s[i:j]) if j > i else 0
    v = max(-(1 << 63), min(v, (1 << 63) - 1))    # strtol clamps to LONG_MIN/MAX
    v &= 0xFFFFFFFF                                # (int) keeps the low 32 bits
    return v - (1 << 32) if v & 0x80000000 else v


def get_total_uuars(env: Mapping[str, str], page_size: int) -> int:
    """Mirrors get_total_uuars(): the bfregs requested in alloc_ucontext.

    At least the non-fast-path bfregs of one system page (2 per 4 KiB UAR, so
    32 on 64 KiB pages), rounded up to a whole UAR (a multiple of 2).
    """
    size = MLX5_DEF_TOT_UUARS
    if "MLX5_TOTAL_UUARS" in env:
        size = _atoi(env["MLX5_TOTAL_UUARS"])
    if size < 1:
        raise ProviderError(errno.EINVAL, f"get_total_uuars: MLX5_TOTAL_UUARS={size} < 1")
    uuars_in_page = page_size // MLX5_ADAPTER_PAGE_SIZE * MLX5_NUM_NON_FP_BFREGS_PER_UAR
    size = max(uuars_in_page, size)
    size = -(-size // MLX5_NUM_NON_FP_BFREGS_PER_UAR) * MLX5_NUM_NON_FP_BFREGS_PER_UAR
    if size > MLX5_MAX_BFREGS:
        raise ProviderError(errno.ENOMEM,
                            f"get_total_uuars: {size} bfregs > MLX5_MAX_BFREGS {MLX5_MAX_BFREGS}")
    return size


def get_num_low_lat_uuars(env: Mapping[str, str], tot_uuars: int) -> int:
    """Mirrors get_num_low_lat_uuars(): the low-latency (dedicated) bfregs.

    Silently raised to tot_uuars - MLX5_MED_BFREGS_TSHOLD: the kernel shares at
    most 12 medium-class bfregs, the rest must be low-latency.
    """
    num = DEFAULT_LOW_LAT_UUARS
    if "MLX5_NUM_LOW_LAT_UUARS" in env:
        num = _atoi(env["MLX5_NUM_LOW_LAT_UUARS"])
    if num < 0:
        raise ProviderError(errno.EINVAL,
                            f"get_num_low_lat_uuars: MLX5_NUM_LOW_LAT_UUARS={num} < 0")
    return max(num, tot_uuars - MLX5_MED_BFREGS_TSHOLD)


def get_uar_info(env: Mapping[str, str], page_size: int) -> tuple[int, int]:
    """Mirrors get_uar_info(): (tot_uuars, low_lat_uuars) for mlx5_init_context.

    At least one bfreg must stay out of the low-latency class (bfreg 0 is the
    shared non-BlueFlame one), else ENOMEM.
    """
    tot = get_total_uuars(env, page_size)
    low = get_num_low_lat_uuars(env, tot)
    if low > tot - 1:
        raise ProviderError(errno.ENOMEM,
                            f"get_uar_info: {low} low-latency bfregs > {tot} total - 1")
    return tot, low


def get_cqe_size(env: Mapping[str, str]) -> int:
    """Mirrors get_cqe_size() without mlx5dv attributes: MLX5_CQE_SIZE (atoi), else 64;
    only 64 and 128 are sizes - anything else is -EINVAL."""
    size = _atoi(env["MLX5_CQE_SIZE"]) if "MLX5_CQE_SIZE" in env else 64
    return size if size in (64, 128) else -errno.EINVAL


def single_threaded_app(env: Mapping[str, str]) -> bool:
    """Mirrors single_threaded_app(): exactly "1" turns the bfreg locks off."""
    return env.get("MLX5_SINGLE_THREADED") == "1"


def get_shut_up_bf(env: Mapping[str, str]) -> bool:
    """Mirrors get_shut_up_bf(): set and not "0" means never use BlueFlame."""
    v = env.get("MLX5_SHUT_UP_BF")
    return v is not None and v != "0"


def get_always_bf(env: Mapping[str, str]) -> bool:
    """Mirrors get_always_bf() (ctx->prefer_bf): on unless set to "0"."""
    v = env.get("MLX5_POST_SEND_PREFER_BF")
    return v is None or v != "0"


def qp_sig_enabled(env: Mapping[str, str]) -> bool:
    """Mirrors qp_sig_enabled() in verbs.c: any value, even "0", enables it."""
    return "MLX5_QP_SIGNATURE" in env


def srq_sig_enabled(env: Mapping[str, str]) -> bool:
    """Mirrors srq_sig_enabled() in verbs.c: any value enables SRQ signatures."""
    return "MLX5_SRQ_SIGNATURE" in env


def use_scatter_to_cqe(env: Mapping[str, str]) -> bool:
    """Mirrors use_scatter_to_cqe() in verbs.c: on unless set to exactly "0"."""
    return env.get("MLX5_SCATTER_TO_CQE") != "0"


def need_uuar_lock(ctx: UuarContext, uuarn: int) -> bool:
    """Mirrors need_uuar_lock(): does legacy bfs[uuarn] need its spinlock?

    uuarn counts 4 registers per UAR (2 regular + 2 fast path);
    uuarn/2 + uuarn%2 maps a regular register back to the kernel's bfreg
    number, so exactly the kernel's high (low-latency, one QP each) class is
    lock-free - and bfreg 0, which never does BlueFlame.
    """
    if uuarn == 0 or ctx.single_threaded:
        return False
    i = uuarn // 2 + uuarn % 2
    return i < ctx.tot_uuars - ctx.low_lat_uuars
