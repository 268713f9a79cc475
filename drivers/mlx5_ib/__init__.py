"""Mirrors drivers/infiniband/hw/mlx5 (the mlx5_ib module): the RDMA driver over mlx5_core.

module_init registers the auxiliary driver "mlx5_ib.rdma", whose id table
names "mlx5_core.rdma": every HCA mlx5_core brought up is probed
(probe.mlx5r_probe), which runs the driver's stage table and registers the
ib_device mlx5_<n>.  module_exit unregisters the driver, removing each
device in reverse stage order.

Module parameters (insmod mlx5_ib dyn_uar=1 ...), all off by default so the
flow is the seed document's (16 static bfregs, 8 UAR pages at open):

    dyn_uar          honour MLX5_LIB_CAP_DYN_UAR (the v5.8+ kernel behaviour)
    comp_mask_v6     report ECE / REAL_TIME_TS / SQD2RTS in the ucontext response
    mkey_update_tag  report MKEY_UPDATE_TAG (v6.x)
    release          the kernel release whose known bugs to keep: "upstream" (the
                     default, every fix in) or "MAJOR.MINOR", e.g. release="6.8" -
                     see mlx5_ib_release_has() for what an older release still does

The files, by the part of the real driver they mirror:

    mlx5_ib.py   mlx5_ib.h: the structs, to_m*() downcasts, small helpers
    probe.py     main.c: the stage table, the ops table, probe/remove
    query.py     main.c: query_device, query_port, port immutable data, fw string
    main.py      main.c: user contexts (alloc_ucontext, calc_total_bfregs, UARs), PDs
    mmap.py      main.c: mlx5_ib_mmap and UAR objects
    cq.py        cq.c: user CQs
    mr.py        mr.c: user MRs (mkeys with an MTT)
    qp.py        qp.c: user QPs (alloc_bfreg, create_user_qp, the QPC)
    doorbell.py  doorbell.c: user doorbell pages
    mem.py       mem.c: page-size helpers and mlx5_ib_populate_pas
    cmd.py       cmd.c: the firmware commands mlx5_ib issues itself
    devx.py      devx.c: the DEVX user context (uid)
    std_types.py std_types.c: MLX5_IB_METHOD_QUERY_PORT (mlx5dv_query_port)
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_ib.mlx5_ib import parse_kernel_release
from drivers.mlx5_ib.probe import MLX5_IB_PARAMS, mlx5r_driver
from kernel_model.auxiliary import (
    auxiliary_driver,
    auxiliary_driver_register,
    auxiliary_driver_unregister,
)
from kernel_model.errno import EINVAL, KernelError

if TYPE_CHECKING:
    from kernel_model.module import module

MODULE_DEPENDS = ("mlx5_core", "ib_core", "ib_uverbs")


def module_init(mod: module, **params: bool | str) -> auxiliary_driver:
    """mlx5_ib_init(): check the parameters, register the "rdma" auxiliary driver."""
    unknown = set(params) - set(MLX5_IB_PARAMS)
    if unknown:
        raise KernelError(EINVAL, f"mlx5_ib: unknown parameter {sorted(unknown)[0]}")
    parse_kernel_release(str(params.get("release", "upstream")))  # EINVAL before anything
    drv = mlx5r_driver({**MLX5_IB_PARAMS, **{k: v if k == "release" else bool(v)
                                             for k, v in params.items()}})
    auxiliary_driver_register(mod.machine, drv)
    return drv


def module_exit(mod: module) -> None:
    """mlx5_ib_cleanup(): unregister the driver; every device is removed first."""
    auxiliary_driver_unregister(mod.machine, mod.state)
