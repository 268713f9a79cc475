"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/uar.c: UAR allocation and mapping.

A UAR (user access region) is a page of doorbell registers in BAR0 the
firmware hands out by index (ALLOC_UAR).  mlx5_cmd_alloc_uar/free_uar are the
bare commands (mlx5_ib uses them for user contexts, with a uid through its
own command); mlx5_get_uars_page() also maps the page for the kernel's own
doorbells (EQs, kernel CQs).

uar2pfn(): with uar_4k a system page holds PAGE_SIZE / 4 KiB UARs, so the
page is index >> (PAGE_SHIFT - 12); without it every UAR is a system page.
One ALLOC_UAR owns a whole system page either way: the firmware answers with
the page's first UAR and the rest are the caller's too (alloc_uars_page maps
the page once, sizes its bfreg bitmaps uars_per_sys_page * 4, and a bfreg's
UAR is up->index + dbi / MLX5_BFREGS_PER_UAR).

# EMU: mlx5_get_uars_page hands out a whole page per call; the kernel shares
# pages between callers through a list of partially used bfreg bitmaps.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_BFREGS_PER_UAR,
    MLX5_CMD_OP_ALLOC_UAR,
    MLX5_CMD_OP_DEALLOC_UAR,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.current import current
from kernel_model.pci import ioremap, iounmap
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


class mlx5_uars_page:
    """Mirrors struct mlx5_uars_page: a mapped system page of UARs (the FW index of
    its first UAR, the __iomem base, and how many bfregs the page holds)."""

    def __init__(self, index: int, map_: int, bfregs: int = MLX5_BFREGS_PER_UAR):
        self.index, self.map, self.bfregs = index, map_, bfregs

    def __repr__(self) -> str:
        return f"mlx5_uars_page index {self.index:#x} map {self.map:#x} bfregs {self.bfregs}"


@traced
def mlx5_cmd_alloc_uar(dev: mlx5_core_dev) -> int:
    """Mirrors mlx5_cmd_alloc_uar(): ALLOC_UAR; the firmware's UAR index."""
    in_, out = IfcStruct("alloc_uar_in"), IfcStruct("alloc_uar_out")
    MLX5_SET("alloc_uar_in", in_, "opcode", MLX5_CMD_OP_ALLOC_UAR)
    mlx5_cmd_exec(dev, in_, out)
    return MLX5_GET("alloc_uar_out", out, "uar")


@traced
def mlx5_cmd_free_uar(dev: mlx5_core_dev, uarn: int) -> None:
    """Mirrors mlx5_cmd_free_uar(): DEALLOC_UAR."""
    in_ = IfcStruct("dealloc_uar_in")
    MLX5_SET("dealloc_uar_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_UAR)
    MLX5_SET("dealloc_uar_in", in_, "uar", uarn)
    mlx5_cmd_exec(dev, in_, IfcStruct("dealloc_uar_out"))


def uars_per_sys_page(mdev: mlx5_core_dev) -> int:
    """Mirrors uars_per_sys_page(): the device's num_of_uars_per_page with uar_4k, else 1."""
    if MLX5_CAP_GEN(mdev, "uar_4k"):
        return MLX5_CAP_GEN(mdev, "num_of_uars_per_page")
    return 1


def uar2pfn(mdev: mlx5_core_dev, index: int) -> int:
    """Mirrors uar2pfn(): the system page frame of UAR `index` in BAR0."""
    shift = current().machine.page_shift
    if MLX5_CAP_GEN(mdev, "uar_4k"):
        index >>= shift - MLX5_ADAPTER_PAGE_SHIFT
    return (mdev.bar_addr >> shift) + index


@traced
def mlx5_get_uars_page(mdev: mlx5_core_dev) -> mlx5_uars_page:
    """Mirrors mlx5_get_uars_page() / alloc_uars_page(): one ALLOC_UAR, whose system
    page (uars_per_sys_page UARs from `index`) is ioremapped whole."""
    bfregs = uars_per_sys_page(mdev) * MLX5_BFREGS_PER_UAR
    index = mlx5_cmd_alloc_uar(mdev)
    machine = current().machine
    try:
        map_ = ioremap(uar2pfn(mdev, index) << machine.page_shift, machine.page_size)
    except BaseException:
        mlx5_cmd_free_uar(mdev, index)  # err_map:
        raise
    return mlx5_uars_page(index, map_, bfregs)


@traced
def mlx5_put_uars_page(mdev: mlx5_core_dev, up: mlx5_uars_page) -> None:
    """Mirrors mlx5_put_uars_page(): unmap and free the UAR."""
    iounmap(up.map)
    mlx5_cmd_free_uar(mdev, up.index)
