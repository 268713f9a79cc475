"""Tests for drivers/mlx5_core/uar.py: the core's own UAR page and uar2pfn.

One ALLOC_UAR owns a whole system page: with uar_4k (hosts with pages larger
than 4 KiB) the firmware answers with the page's first 4 KiB UAR, and the
system page holding the initialisation segment is never handed out.
"""

from __future__ import annotations

import pytest

from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.uar import uar2pfn, uars_per_sys_page
from kernel_model.emu.platform import rdma_host
from tests.drivers.mlx5_core.test_core_main import mdev_of


@pytest.mark.parametrize("page_size,index", [(4096, 3), (16384, 4), (65536, 16)])
def test_the_cores_uar_is_a_whole_system_page_past_the_init_segment(page_size, index):
    m = rdma_host(ram_size=64 << 20, page_size=page_size)
    hca = m.hcas[0]
    mdev = mdev_of(hca)
    per = page_size // 4096
    assert uars_per_sys_page(mdev) == per == MLX5_CAP_GEN(mdev, "num_of_uars_per_page")
    up = mdev.priv.uar
    # 4 KiB: UARs 0-2 overlap the init segment; larger pages: system page 0 does
    assert up.index == index and up.bfregs == per * 4
    assert up.map == hca.bar.start + index * 4096 and up.index % per == 0
    with m.kernel():
        pfns = {uar2pfn(mdev, up.index + i) for i in range(per)}
    assert pfns == {(hca.bar.start >> m.page_shift) + index * 4096 // page_size}
    assert hca.fw.uars[index].span == per and sorted(hca.fw.uars) == [index]
