"""Mirrors include/linux/mlx5/driver.h: struct mlx5_core_dev and its accessors.

One mlx5_core_dev per probed PCI function.  Kernel code reaches the device
only through it: `bar_addr`/`iseg` (MMIO), `cmd` (the command interface) and
`device` (pdev->dev, the struct device DMA maps against).  The capability
pages are copies of QUERY_HCA_CAP's answers, read with the MLX5_CAP_* macros:

    MLX5_CAP_GEN(mdev, log_max_qp)        # current (after SET_HCA_CAP)
    MLX5_CAP_GEN_MAX(mdev, uar_4k)        # what the device supports
    MLX5_CAP_ROCE(mdev, roce_address_table_size)

(the field is a string here: MLX5_CAP_GEN(mdev, "log_max_qp")).

Locks: `wc_state_lock` (mutex) guards wc_state; `roce_lock` (mutex) guards
roce_en.  The command interface has its own (cmd.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivers.mlx5_core import ifc as _ifc
from drivers.mlx5_core.ifc import (
    MLX5_CAP_ETHERNET_OFFLOADS,
    MLX5_CAP_GENERAL,
    MLX5_GET,
    MLX5_ISEG_CMDIF_REV_FW_SUB,
    MLX5_ISEG_FW_REV,
    IfcStruct,
)
from kernel_model.locking import mutex
from kernel_model.pci import ioread32be

if TYPE_CHECKING:
    from drivers.mlx5_core.cmd import mlx5_cmd
    from drivers.mlx5_core.eq import mlx5_eq_table
    from drivers.mlx5_core.uar import mlx5_uars_page
    from kernel_model.pci import pci_dev

MLX5_DEVICE_STATE_UNINITIALIZED, MLX5_DEVICE_STATE_UP, MLX5_DEVICE_STATE_INTERNAL_ERROR = 0, 1, 2
MLX5_WC_STATE_UNINITIALIZED, MLX5_WC_STATE_UNSUPPORTED, MLX5_WC_STATE_SUPPORTED = 0, 1, 2
MLX5_PROF_MASK_QP_SIZE = 1 << 0
MLX5_PROF_MASK_MR_CACHE = 1 << 1
LOG_MAX_SUPPORTED_QPS = 0xff

_CAP_LAYOUT = {MLX5_CAP_GENERAL: "cmd_hca_cap", _ifc.MLX5_CAP_ROCE: "roce_cap",
               MLX5_CAP_ETHERNET_OFFLOADS: "per_protocol_networking_offload_caps",
               _ifc.MLX5_CAP_DEV_MEM: "device_mem_cap"}


class mlx5_hca_cap:
    """Mirrors struct mlx5_hca_cap: the current and maximum page of one capability type."""

    def __init__(self, cap_type: int):
        layout = _CAP_LAYOUT[cap_type]
        self.cur = IfcStruct(layout)
        self.max = IfcStruct(layout)


class mlx5_profile:
    """Mirrors struct mlx5_profile (profile[MLX5_DEFAULT_PROF])."""

    def __init__(self, mask: int = MLX5_PROF_MASK_QP_SIZE | MLX5_PROF_MASK_MR_CACHE,
                 log_max_qp: int = LOG_MAX_SUPPORTED_QPS):
        self.mask, self.log_max_qp = mask, log_max_qp


class mlx5_priv:
    """Mirrors struct mlx5_priv (what this model needs of it)."""

    def __init__(self, name: str):
        self.name = name
        self.uar: mlx5_uars_page | None = None     # the core's own UAR (EQ/CQ doorbells)
        self.eq_table: mlx5_eq_table | None = None
        self.adev: dict[str, object] = {}          # name ("rdma") -> mlx5_adev
        self.adev_idx = -1
        self.stages_done = 0                        # how far mlx5_init_one got


class mlx5_core_dev:
    """Mirrors struct mlx5_core_dev."""

    def __init__(self, pdev: pci_dev):
        self.pdev = pdev
        self.device = pdev.dev            # the DMA device (dev->device = &pdev->dev)
        self.bar_addr = 0
        self.iseg_base = 0
        self.iseg = 0                     # __iomem address of struct mlx5_init_seg
        self.cmd: mlx5_cmd | None = None
        self.caps = {cap: mlx5_hca_cap(cap) for cap in _CAP_LAYOUT}  # caps.hca[]
        self.board_id = ""
        self.priv = mlx5_priv(pdev.name)
        self.profile = mlx5_profile()
        self.state = MLX5_DEVICE_STATE_UNINITIALIZED
        self.wc_state = MLX5_WC_STATE_UNINITIALIZED
        self.wc_state_lock = mutex("&mdev->wc_state_lock")
        self.roce_en = 0                            # mdev->roce.roce_en
        self.roce_lock = mutex("&mdev->roce.state_lock")
        self.log: list[str] = []  # EMU: mlx5_core_warn/err messages (no printk buffer)
        self.clock: Any = None                      # struct mlx5_clock (clock.py)
        self.clock_info: Any = None                 # the clock-info page (clock.py)

    @property
    def trace_name(self) -> str:
        return self.priv.name

    def __repr__(self) -> str:
        return f"mlx5_core_dev {self.priv.name} board {self.board_id or '?'} state {self.state}"


def mlx5_core_warn(dev: mlx5_core_dev, msg: str) -> None:
    """Mirrors mlx5_core_warn()/mlx5_core_err(): the driver's log line for this device."""
    dev.log.append(f"mlx5_core {dev.priv.name}: {msg}")


mlx5_core_err = mlx5_core_warn


def _cap(mdev: mlx5_core_dev, cap_type: int, which: str, field: str) -> int:
    page = getattr(mdev.caps[cap_type], which)
    return MLX5_GET(_CAP_LAYOUT[cap_type], page, field)


def MLX5_CAP_GEN(mdev: mlx5_core_dev, cap: str) -> int:
    """Mirrors MLX5_CAP_GEN(): a current general capability."""
    return _cap(mdev, MLX5_CAP_GENERAL, "cur", cap)


def MLX5_CAP_GEN_MAX(mdev: mlx5_core_dev, cap: str) -> int:
    """Mirrors MLX5_CAP_GEN_MAX(): what the device supports at most."""
    return _cap(mdev, MLX5_CAP_GENERAL, "max", cap)


class _CapTypeMacro(int):
    """In C, MLX5_CAP_ROCE is both a capability type (enum mlx5_cap_type) and the
    MLX5_CAP_ROCE(mdev, cap) macro; this value is both too: == 4, and callable."""

    def __call__(self, mdev: mlx5_core_dev, cap: str) -> int:
        return _cap(mdev, int(self), "cur", cap)


#: Mirrors MLX5_CAP_ROCE(mdev, cap) - and is the capability type (4) as well
MLX5_CAP_ROCE = _CapTypeMacro(_ifc.MLX5_CAP_ROCE)


#: Mirrors MLX5_CAP_DEV_MEM(mdev, cap) (and MLX5_CAP64_DEV_MEM) - and is the
#: capability type (0xf) as well
MLX5_CAP_DEV_MEM = _CapTypeMacro(_ifc.MLX5_CAP_DEV_MEM)
MLX5_CAP64_DEV_MEM = MLX5_CAP_DEV_MEM


def MLX5_CAP_ROCE_MAX(mdev: mlx5_core_dev, cap: str) -> int:
    """Mirrors MLX5_CAP_ROCE_MAX()."""
    return _cap(mdev, _ifc.MLX5_CAP_ROCE, "max", cap)


def MLX5_CAP_ETH(mdev: mlx5_core_dev, cap: str) -> int:
    """Mirrors MLX5_CAP_ETH(): an Ethernet offload capability."""
    return _cap(mdev, MLX5_CAP_ETHERNET_OFFLOADS, "cur", cap)


def fw_rev_maj(dev: mlx5_core_dev) -> int:
    """Mirrors fw_rev_maj(): read from the initialisation segment."""
    return ioread32be(dev.iseg + MLX5_ISEG_FW_REV) & 0xFFFF


def fw_rev_min(dev: mlx5_core_dev) -> int:
    """Mirrors fw_rev_min()."""
    return ioread32be(dev.iseg + MLX5_ISEG_FW_REV) >> 16


def fw_rev_sub(dev: mlx5_core_dev) -> int:
    """Mirrors fw_rev_sub()."""
    return ioread32be(dev.iseg + MLX5_ISEG_CMDIF_REV_FW_SUB) & 0xFFFF


def cmdif_rev(dev: mlx5_core_dev) -> int:
    """Mirrors cmdif_rev()."""
    return ioread32be(dev.iseg + MLX5_ISEG_CMDIF_REV_FW_SUB) >> 16
