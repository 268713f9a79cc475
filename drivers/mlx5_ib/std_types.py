"""Mirrors drivers/infiniband/hw/mlx5/std_types.c: mlx5's methods on the core's
UVERBS_OBJECT_DEVICE - MLX5_IB_METHOD_QUERY_PORT, which mlx5dv_query_port() calls - and
on UVERBS_OBJECT_PD - MLX5_IB_METHOD_PD_QUERY, which ibv_import_pd() calls.

The answer (struct mlx5_ib_uapi_query_port) describes the port's e-switch vport.
The kernel fills it only when the e-switch is in switchdev (offloads) mode; a
function whose e-switch is in legacy mode - what the emulated ConnectX runs, as
any NIC without `devlink dev eswitch set ... mode switchdev` does - answers zeros.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import rdma_is_port_valid
from drivers.ib_core.rdma_core import (
    UVERBS_LOOKUP_READ,
    ib_uverbs_get_ucontext_file,
    rdma_lookup_get_uobject,
    rdma_lookup_put_uobject,
)
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_ptr_len,
    uverbs_copy_to,
    uverbs_copy_to_buf,
    uverbs_get_const,
)
from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_PD
from drivers.mlx5_ib.mlx5_ib import to_mdev, to_mpd
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_DEVICE
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_PD_HANDLE,
    MLX5_IB_ATTR_QUERY_PD_RESP_PDN,
    MLX5_IB_ATTR_QUERY_PORT,
    MLX5_IB_ATTR_QUERY_PORT_PORT_NUM,
    MLX5_IB_METHOD_PD_QUERY,
    MLX5_IB_METHOD_QUERY_PORT,
    mlx5_ib_uapi_query_port,
)


@traced
def UVERBS_HANDLER_MLX5_IB_METHOD_QUERY_PORT(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(MLX5_IB_METHOD_QUERY_PORT): EINVAL for a port the device
    lacks (or an answer buffer shorter than the struct); else the vport information,
    zeros outside switchdev mode (fill_switchdev_info is not reached), the rest of a
    longer buffer cleared (uverbs_copy_to_struct_or_zero)."""
    uverbs_attr_ptr_len(attrs_, MLX5_IB_ATTR_QUERY_PORT, mlx5_ib_uapi_query_port.SIZE)
    port_num = uverbs_get_const(attrs_, MLX5_IB_ATTR_QUERY_PORT_PORT_NUM)
    dev = to_mdev(ib_uverbs_get_ucontext_file(attrs_.ufile).device)
    if not rdma_is_port_valid(dev, port_num):
        raise KernelError(EINVAL, f"mlx5_ib_query_port: {dev.name} has no port {port_num}")
    info = mlx5_ib_uapi_query_port()  # the e-switch is in legacy mode: nothing to fill
    uverbs_copy_to_buf(attrs_, MLX5_IB_ATTR_QUERY_PORT, info.pack(), zero_tail=True)


@traced
def UVERBS_HANDLER_MLX5_IB_METHOD_PD_QUERY(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(MLX5_IB_METHOD_PD_QUERY): the PD's pdn, for
    ibv_import_pd (mlx5_import_pd keeps it as its own PD's pdn).  The handle is an
    IDR attribute of access READ: ENOENT for a handle the file does not hold, EINVAL
    for one of another type (rdma_lookup_get_uobject)."""
    uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_PD, attrs_.ufile,
                                   uverbs_get_const(attrs_, MLX5_IB_ATTR_QUERY_PD_HANDLE),
                                   UVERBS_LOOKUP_READ, attrs_)
    try:
        uverbs_copy_to(attrs_, MLX5_IB_ATTR_QUERY_PD_RESP_PDN, to_mpd(uobj.object).pdn, 4)
    finally:
        rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_READ)


#: ADD_UVERBS_METHODS(mlx5_ib_device, UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT)
mlx5_ib_std_types_methods = {
    (UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_QUERY_PORT,
        mandatory=(MLX5_IB_ATTR_QUERY_PORT_PORT_NUM, MLX5_IB_ATTR_QUERY_PORT)),
    # ADD_UVERBS_METHODS(mlx5_ib_pd, UVERBS_OBJECT_PD, MLX5_IB_METHOD_PD_QUERY)
    (c.UVERBS_OBJECT_PD, MLX5_IB_METHOD_PD_QUERY): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_PD_QUERY,
        mandatory=(MLX5_IB_ATTR_QUERY_PD_HANDLE, MLX5_IB_ATTR_QUERY_PD_RESP_PDN)),
}
