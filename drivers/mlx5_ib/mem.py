"""Mirrors drivers/infiniband/hw/mlx5/mem.c and the page-size helpers of mlx5_ib.h.

The device describes a user buffer by one page size (a power of two the
context's log_page_size field can encode) and, for QPs and CQs, an offset of
the buffer's start into its first page, in quanta (page_offset, 6 bits of
1/64 page).  These helpers pick the largest usable page size, compute the
quantized offset, and fill the PAS/MTT table the command carries.

Lock order: none (the caller owns the umem).
"""

from __future__ import annotations

from c_ext import U64Array
from drivers.ib_core.umem import (
    ib_umem,
    ib_umem_dma_offset,
    ib_umem_fill_dma_blocks,
    ib_umem_find_best_pgoff,
    ib_umem_find_best_pgsz,
)
from drivers.mlx5_core.ifc import MLX5_ADAPTER_PAGE_SHIFT, __mlx5_bit_sz
from kernel_model.current import current
from kernel_model.trace import traced

BITS_PER_LONG = 64


def GENMASK(h: int, low: int) -> int:
    """Mirrors GENMASK(): bits low..h set."""
    return ((1 << (h + 1)) - 1) & ~((1 << low) - 1)


def __mlx5_log_page_size_to_bitmap(log_pgsz_bits: int, pgsz_shift: int) -> int:
    """Mirrors __mlx5_log_page_size_to_bitmap(): the page sizes a log_page_size field
    of `log_pgsz_bits` bits (value + pgsz_shift = log2(size)) can say.

    The device takes nothing below 4 KiB, whatever the field allows.
    """
    largest_pg_shift = min((1 << log_pgsz_bits) - 1 + pgsz_shift, BITS_PER_LONG - 1)
    pgsz_shift = max(MLX5_ADAPTER_PAGE_SHIFT, pgsz_shift)
    return GENMASK(largest_pg_shift, pgsz_shift)


def mlx5_umem_find_best_pgsz(umem: ib_umem, typ: str, log_pgsz_fld: str, pgsz_shift: int,
                             iova: int) -> int:
    """Mirrors the mlx5_umem_find_best_pgsz() macro: ib_umem_find_best_pgsz over the
    sizes the context field typ.log_pgsz_fld can encode."""
    bitmap = __mlx5_log_page_size_to_bitmap(__mlx5_bit_sz(typ, log_pgsz_fld), pgsz_shift)
    return ib_umem_find_best_pgsz(umem, bitmap, iova)


@traced
def __mlx5_umem_find_best_quantized_pgoff(umem: ib_umem, pgsz_bitmap: int,
                                          page_offset_bits: int, pgoff_bitmask: int,
                                          scale: int) -> tuple[int, int]:
    """Mirrors __mlx5_umem_find_best_quantized_pgoff(): (page_size, quantized offset).

    Start from the best page size for the buffer's DMA start; shrink it until
    the start's offset in the page is a whole number of page_size/scale quanta
    that fits in `page_offset_bits`.  (0, 0) when nothing fits - the caller
    returns EINVAL.  Side effect, as in the kernel: umem.iova becomes
    start_dma & pgoff_bitmask.
    """
    page_offset_mask = (1 << page_offset_bits) - 1
    page_size = ib_umem_find_best_pgoff(umem, pgsz_bitmap, pgoff_bitmask)
    if not page_size:
        return 0, 0
    page_offset = ib_umem_dma_offset(umem, page_size)
    while page_offset & ~(page_offset_mask * (page_size // scale)):
        page_size //= 2
        page_offset = ib_umem_dma_offset(umem, page_size)
    if not pgsz_bitmap & page_size:
        return 0, 0  # not aligned, or the offset cannot be represented
    quantized = page_offset // (page_size // scale)
    if quantized > page_offset_mask:
        current().machine.report_bug("__mlx5_umem_find_best_quantized_pgoff",
                                     f"page_offset_quantized {quantized} too large")
        return 0, 0
    return page_size, quantized


def mlx5_umem_find_best_quantized_pgoff(umem: ib_umem, typ: str, log_pgsz_fld: str,
                                        pgsz_shift: int, page_offset_fld: str,
                                        scale: int) -> tuple[int, int]:
    """Mirrors the mlx5_umem_find_best_quantized_pgoff() macro (QP, SRQ, WQ buffers):
    the DMA offset may only use bits order_base_2(scale)..31."""
    return __mlx5_umem_find_best_quantized_pgoff(
        umem, __mlx5_log_page_size_to_bitmap(__mlx5_bit_sz(typ, log_pgsz_fld), pgsz_shift),
        __mlx5_bit_sz(typ, page_offset_fld), GENMASK(31, (scale - 1).bit_length()), scale)


def mlx5_umem_find_best_cq_quantized_pgoff(umem: ib_umem, typ: str, log_pgsz_fld: str,
                                           pgsz_shift: int, page_offset_fld: str,
                                           scale: int) -> tuple[int, int]:
    """Mirrors the mlx5_umem_find_best_cq_quantized_pgoff() macro: pgoff_bitmask 0."""
    return __mlx5_umem_find_best_quantized_pgoff(
        umem, __mlx5_log_page_size_to_bitmap(__mlx5_bit_sz(typ, log_pgsz_fld), pgsz_shift),
        __mlx5_bit_sz(typ, page_offset_fld), 0, scale)


@traced
def mlx5_ib_populate_pas(umem: ib_umem, page_size: int, pas: U64Array,
                         access_flags: int) -> int:
    """Mirrors mlx5_ib_populate_pas(): one big-endian entry per page_size DMA block,
    `block | access_flags`; returns the count (ib_umem_num_dma_blocks)."""
    return ib_umem_fill_dma_blocks(umem, page_size, pas, access_flags, big_endian=True)
