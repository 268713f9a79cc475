"""Mirrors drivers/infiniband/hw/mlx5/doorbell.c: user doorbell records.

A QP's or CQ's doorbell record is 8 bytes of user memory the HCA reads by
DMA.  rdma-core packs many records into one page (one per cache line), so
the kernel pins each user page once per context and mm and shares it:
the first record on a page pins it (ib_umem_get of that one page, access
0), later ones only take a reference; the last unmap unpins it.  Eight
records in one page cost one pinned page.

Lock order: context.db_page_mutex -> (ib_umem_get's mm locks).
"""

from __future__ import annotations

from contextlib import ExitStack

from drivers.ib_core.umem import ib_umem_get, ib_umem_release
from drivers.mlx5_ib.mlx5_ib import PAGE_SIZE, mlx5_db, mlx5_ib_ucontext, mlx5_ib_user_db_page
from kernel_model.current import current
from kernel_model.mm import mmdrop, mmgrab
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced


@traced
def mlx5_ib_db_map_user(context: mlx5_ib_ucontext, virt: int, db: mlx5_db) -> None:
    """Mirrors mlx5_ib_db_map_user(): db.dma = the record's DMA address, pinning
    its page (shared per context and mm) on first use."""
    ps = PAGE_SIZE()
    mm = current().mm
    with context.db_page_mutex:
        page = next((p for p in context.db_page_list
                     if p.mm is mm and p.user_virt == virt & ~(ps - 1)), None)
        if page is None:
            page = kmalloc_obj(mlx5_ib_user_db_page(virt & ~(ps - 1)))
            with ExitStack() as unwind:
                unwind.callback(kfree, page)
                page.umem = ib_umem_get(context.device, virt & ~(ps - 1), ps, 0)
                unwind.pop_all()
            mmgrab(mm)
            page.mm = mm
            context.db_page_list.insert(0, page)  # list_add()
        sgt = page.umem.sgt_append.sgt
        db.dma = sgt.dma_addr.view[0] + (virt & (ps - 1))  # sg_dma_address(sgl)
        db.user_page = page
        page.refcnt += 1


@traced
def mlx5_ib_db_unmap_user(context: mlx5_ib_ucontext, db: mlx5_db) -> None:
    """Mirrors mlx5_ib_db_unmap_user(): drop the page's reference; the last unpins it."""
    with context.db_page_mutex:
        page = db.user_page
        page.refcnt -= 1
        if not page.refcnt:
            context.db_page_list.remove(page)
            mmdrop(page.mm)
            ib_umem_release(page.umem)
            kfree(page)
