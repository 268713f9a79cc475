"""Tests for userspace/providers/mlx5/dbrec.py: the doorbell-record page allocator."""

from __future__ import annotations

import errno

import attrs
import pytest

from userspace.providers.mlx5.dbrec import (
    mlx5_alloc_dbrec,
    mlx5_db_page,
    mlx5_free_db,
    mlx5_free_dbrec,
)
from userspace.providers.mlx5.errors import ProviderError

P4K, P64K = 4096, 65536
BASE = 0x5555_0000_0000


@attrs.define
class Ctx:
    """The doorbell-record fields of an mlx5_context, with a fake page allocator."""

    page_size: int = P4K
    cache_line_size: int = 64
    dbr_available_pages: list = attrs.Factory(list)
    dbr_map: dict = attrs.Factory(dict)
    pages: list = attrs.Factory(list)           # every page handed out, in order
    freed: list = attrs.Factory(list)
    fail: bool = False

    def dbr_alloc_page(self) -> int:
        if self.fail:
            raise ProviderError(errno.ENOMEM, "mlx5_alloc_buf: out of memory")
        addr = BASE + len(self.pages) * 0x10_0000       # far apart, page aligned
        self.pages.append(addr)
        return addr

    def dbr_free_page(self, addr: int) -> None:
        self.freed.append(addr)


def test_first_page_holds_64_records_then_a_second_page() -> None:
    """kernel_facts §13: records 0..63 on page 0, the 65th at page 1 offset 0."""
    ctx = Ctx()
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(65)]
    page0, page1 = ctx.pages
    assert recs[:64] == [page0 + 64 * i for i in range(64)]
    assert recs[64] == page1
    assert ctx.dbr_available_pages == [ctx.dbr_map[page1]]     # the full page left


def test_freed_record_comes_back_first() -> None:
    """kernel_facts §13: after freeing page 0 offset 64 the next allocation returns it."""
    ctx = Ctx()
    for _ in range(65):
        mlx5_alloc_dbrec(ctx)
    page0, page1 = ctx.pages
    mlx5_free_db(ctx, page0 + 64)
    assert ctx.dbr_available_pages[0] is ctx.dbr_map[page0]    # back at the head
    assert mlx5_alloc_dbrec(ctx) == page0 + 64
    assert mlx5_alloc_dbrec(ctx) == page1 + 64


def test_new_pages_go_to_the_head() -> None:
    ctx = Ctx()
    first = mlx5_alloc_dbrec(ctx)
    ctx.dbr_available_pages.clear()             # as if page 0 were full
    mlx5_alloc_dbrec(ctx)
    ctx.dbr_available_pages.append(ctx.dbr_map[first])
    assert [p.addr for p in ctx.dbr_available_pages] == ctx.pages[::-1]


def test_lowest_free_record_is_reused() -> None:
    ctx = Ctx()
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(5)]
    mlx5_free_db(ctx, recs[3])
    mlx5_free_db(ctx, recs[1])
    assert [mlx5_alloc_dbrec(ctx) for _ in range(3)] == [recs[1], recs[3], recs[4] + 64]


def test_page_is_freed_when_its_last_record_goes() -> None:
    ctx = Ctx()
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(3)]
    page = ctx.dbr_map[ctx.pages[0]]
    for r in recs[:2]:
        mlx5_free_db(ctx, r)
    assert page.use_cnt == 1 and ctx.freed == []
    mlx5_free_dbrec(ctx, recs[2])
    assert ctx.freed == ctx.pages and ctx.dbr_map == {} and ctx.dbr_available_pages == []
    assert mlx5_alloc_dbrec(ctx) == ctx.pages[1]                # a fresh page next time


def test_full_page_freed_record_by_record() -> None:
    ctx = Ctx()
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(64)]
    assert ctx.dbr_available_pages == []
    for r in recs:
        mlx5_free_db(ctx, r)
    assert ctx.freed == ctx.pages and ctx.dbr_available_pages == []


def test_bitmap_is_64_bit_words_all_ones() -> None:
    ctx = Ctx(page_size=P64K)
    mlx5_alloc_dbrec(ctx)
    page = ctx.dbr_map[ctx.pages[0]]
    assert page.num_db == 1024 and len(page.free) == 16
    assert page.free[0] == (1 << 64) - 2 and page.free[1:] == [(1 << 64) - 1] * 15


def test_record_65_on_a_64k_page_is_in_the_second_word() -> None:
    ctx = Ctx(page_size=P64K)
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(66)]
    assert recs[65] == ctx.pages[0] + 65 * 64 and len(ctx.pages) == 1
    assert ctx.dbr_map[ctx.pages[0]].free[1] == (1 << 64) - 4


def test_larger_cache_lines_mean_fewer_records() -> None:
    ctx = Ctx(cache_line_size=128)
    recs = [mlx5_alloc_dbrec(ctx) for _ in range(33)]
    assert recs[31] == ctx.pages[0] + 31 * 128 and recs[32] == ctx.pages[1]
    page = ctx.dbr_map[ctx.pages[0]]
    assert page.num_db == 32 and len(page.free) == 1     # the unused high bits stay set


def test_failed_page_allocation_propagates() -> None:
    ctx = Ctx(fail=True)
    with pytest.raises(ProviderError) as e:
        mlx5_alloc_dbrec(ctx)
    assert e.value.errno == errno.ENOMEM
    assert ctx.dbr_map == {} and ctx.dbr_available_pages == []


def test_freeing_an_unknown_address_is_einval() -> None:
    ctx = Ctx()
    mlx5_alloc_dbrec(ctx)
    with pytest.raises(ProviderError) as e:
        mlx5_free_db(ctx, 0x1000)
    assert e.value.errno == errno.EINVAL and e.value.function == "mlx5_free_db"


def test_double_free_is_einval() -> None:
    ctx = Ctx()
    a, _ = mlx5_alloc_dbrec(ctx), mlx5_alloc_dbrec(ctx)
    mlx5_free_db(ctx, a)
    with pytest.raises(ProviderError) as e:
        mlx5_free_db(ctx, a)
    assert e.value.errno == errno.EINVAL
    assert ctx.dbr_map[ctx.pages[0]].use_cnt == 1


def test_page_repr() -> None:
    assert repr(mlx5_db_page(0x1000, 64, 3)) == "db_page 0x1000 used=3/64"
