"""Mirrors drivers/infiniband/hw/mlx5/std_types.c: mlx5's methods on the core's
UVERBS_OBJECT_DEVICE - MLX5_IB_METHOD_QUERY_PORT, which mlx5dv_query_port() calls.

The answer (struct mlx5_ib_uapi_query_port) describes the port's e-switch vport.
The kernel fills it only when the e-switch is in switchdev (offloads) mode; a
function whose e-switch is in legacy mode - what the emulated ConnectX runs, as
any NIC without `devlink dev eswitch set ... mode switchdev` does - answers zeros.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import rdma_is_port_valid
from drivers.ib_core.rdma_core import ib_uverbs_get_ucontext_file
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_ptr_len,
    uverbs_copy_to_buf,
    uverbs_get_const,
)
from drivers.mlx5_ib.mlx5_ib import to_mdev
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced
from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_DEVICE
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_PORT,
    MLX5_IB_ATTR_QUERY_PORT_PORT_NUM,
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


#: ADD_UVERBS_METHODS(mlx5_ib_device, UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT)
mlx5_ib_std_types_methods = {
    (UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_QUERY_PORT,
        mandatory=(MLX5_IB_ATTR_QUERY_PORT_PORT_NUM, MLX5_IB_ATTR_QUERY_PORT)),
}
