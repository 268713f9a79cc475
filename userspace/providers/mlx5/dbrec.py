"""Mirrors rdma-core providers/mlx5/dbrec.c: the doorbell-record allocator.

Every QP, SRQ and CQ has a doorbell record: 8 bytes in process memory the
HCA reads by DMA (for a QP, word MLX5_RCV_DBR holds the receive counter and
MLX5_SND_DBR the send counter).  The kernel must pin the page each record
lives on, so libmlx5 packs records densely: it allocates whole pages and
hands out one record per cache line.

    page        page_size / cache_line_size records (64 on 4 KiB pages)
    free        bitmap of 64-bit words, initialised to all ones (1 = free);
                a record is the lowest set bit of the first non-zero word
    available   pages with a free record; a new page goes to the head, a
                full page leaves, a page that was full returns to the head
                when one of its records is freed
    use_cnt     records in use; the page is freed when it drops to 0

The page memory comes from the injected ctx.dbr_alloc_page() -> address
(rdma-core: mlx5_alloc_buf of one page-aligned page) and goes back through
ctx.dbr_free_page(address).

Lock: rdma-core serialises all of this under ctx->dbr_map_mutex; the
provider runs in one emulated thread per context, so there is no lock here.

EMU: DMA-buf backed pages (kept apart from ordinary ones on the available
list) are not modelled.  A parent domain's custom allocator for records is
buf.py's (mlx5_alloc_dbrec_pd), which falls back to this one.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Protocol

import attrs

from kernel_model.trace import traced
from userspace.providers.mlx5.errors import ProviderError

BITS_PER_LONG = 64
_ALL_ONES = (1 << BITS_PER_LONG) - 1


@attrs.define(eq=False)
class mlx5_db_page:
    """Mirrors struct mlx5_db_page: one page of doorbell records."""

    addr: int               # rdma-core: buf.ibv_buf.addr
    num_db: int
    use_cnt: int = 0
    free: list[int] = attrs.Factory(list)

    def __repr__(self) -> str:
        return f"db_page {self.addr:#x} used={self.use_cnt}/{self.num_db}"


class DbrContext(Protocol):
    """The mlx5_context fields the allocator reads and writes."""

    page_size: int          # rdma-core: to_mdev(ibdev)->page_size
    cache_line_size: int    # from the alloc_ucontext response
    # protected by dbr_map_mutex (see the module docstring):
    dbr_available_pages: list[mlx5_db_page]
    dbr_map: dict[int, mlx5_db_page]        # page address -> page (rdma-core: a cl_qmap)
    # EMU: the page allocator, injected
    dbr_alloc_page: Callable[[], int]
    dbr_free_page: Callable[[int], None]


def __add_page(ctx: DbrContext) -> mlx5_db_page:
    """Mirrors __add_page(): a fresh page, all records free, at the list's head."""
    pp = ctx.page_size // ctx.cache_line_size
    nlong = -(-pp // BITS_PER_LONG)
    page = mlx5_db_page(addr=ctx.dbr_alloc_page(), num_db=pp, free=[_ALL_ONES] * nlong)
    ctx.dbr_map[page.addr] = page
    ctx.dbr_available_pages.insert(0, page)
    return page


@traced
def mlx5_alloc_dbrec(ctx: DbrContext) -> int:
    """Mirrors mlx5_alloc_dbrec(): the user address of a free doorbell record.

    Takes the first page on the available list (adding a page if there is
    none), the lowest free record on it, and drops a page that became full
    from the list.  A failing dbr_alloc_page propagates.
    """
    if ctx.dbr_available_pages:
        page = ctx.dbr_available_pages[0]
    else:
        page = __add_page(ctx)
    page.use_cnt += 1
    if page.use_cnt == page.num_db:
        ctx.dbr_available_pages.remove(page)
    i = next(i for i, word in enumerate(page.free) if word)
    j = (page.free[i] & -page.free[i]).bit_length() - 1     # ffsl() - 1
    page.free[i] &= ~(1 << j)
    return page.addr + (i * BITS_PER_LONG + j) * ctx.cache_line_size


@traced
def mlx5_free_db(ctx: DbrContext, db: int) -> None:
    """Mirrors mlx5_free_db(): give a doorbell record back.

    A page that was full goes back to the head of the available list; a page
    with no record left in use is unlinked and freed.
    """
    page = ctx.dbr_map.get(db & ~(ctx.page_size - 1))
    if page is None:
        # EMU: rdma-core asserts; the model reports the bad address instead
        raise ProviderError(errno.EINVAL, f"mlx5_free_db: {db:#x} is on no doorbell page")
    i = (db - page.addr) // ctx.cache_line_size
    word, bit = divmod(i, BITS_PER_LONG)
    if page.free[word] >> bit & 1:
        # EMU: rdma-core would corrupt use_cnt silently on a double free
        raise ProviderError(errno.EINVAL, f"mlx5_free_db: record {db:#x} is not in use")
    page.free[word] |= 1 << bit
    if page.use_cnt == page.num_db:
        ctx.dbr_available_pages.insert(0, page)
    page.use_cnt -= 1
    if not page.use_cnt:
        del ctx.dbr_map[page.addr]
        ctx.dbr_available_pages.remove(page)
        ctx.dbr_free_page(page.addr)


# the name the issue uses for the same function
mlx5_free_dbrec = mlx5_free_db
