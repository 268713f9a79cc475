"""Mirrors include/uapi/rdma/rdma_user_ioctl_cmds.h (+ the mlx5 UAR ids of
mlx5_user_ioctl_cmds.h): the uverbs ioctl() ABI.

One ioctl, RDMA_VERBS_IOCTL, carries a method call: a header naming the
object and method, then an array of attributes.  Each attribute has an id
(core ids below 1 << 12, driver ids in the driver namespace from 1 << 12)
and either an inline value (len <= 8: in `data`) or a user pointer to a
buffer of `len` bytes.  The kernel writes output attributes back the same
way, and a new object's handle into its IDR attribute's `data`.
"""

from __future__ import annotations

from kernel_model.uapi.ioctl import _IOWR
from kernel_model.uapi.ustruct import UStruct, uapi_struct

UVERBS_ID_NS_SHIFT = 12
UVERBS_ID_DRIVER_NS = 1 << UVERBS_ID_NS_SHIFT
UVERBS_ATTR_F_MANDATORY = 1 << 0
UVERBS_ATTR_F_VALID_OUTPUT = 1 << 1


@uapi_struct
class ib_uverbs_attr(UStruct):
    FIELDS = (("attr_id", "H"), ("len", "H"), ("flags", "H"), ("elem_id", "H"),
              ("data", "Q"))


@uapi_struct
class ib_uverbs_ioctl_hdr(UStruct):
    FIELDS = (("length", "H"), ("object_id", "H"), ("method_id", "H"), ("num_attrs", "H"),
              ("reserved1", "Q"), ("driver_id", "I"), ("reserved2", "I"))


RDMA_IOCTL_MAGIC = "\x1b"
RDMA_VERBS_IOCTL = _IOWR(RDMA_IOCTL_MAGIC, 1, ib_uverbs_ioctl_hdr.SIZE)

# mlx5_user_ioctl_cmds.h: enum mlx5_ib_objects (MLX5_IB_OBJECT_UAR is the 9th)
MLX5_IB_OBJECT_UAR = UVERBS_ID_DRIVER_NS + 8
# enum mlx5_ib_uar_alloc_methods
MLX5_IB_METHOD_UAR_OBJ_ALLOC = UVERBS_ID_DRIVER_NS
MLX5_IB_METHOD_UAR_OBJ_DESTROY = UVERBS_ID_DRIVER_NS + 1
# enum mlx5_ib_uar_alloc_attrs / mlx5_ib_uar_obj_destroy_attrs
MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE = UVERBS_ID_DRIVER_NS + 1
MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET = UVERBS_ID_DRIVER_NS + 2
MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH = UVERBS_ID_DRIVER_NS + 3
MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID = UVERBS_ID_DRIVER_NS + 4
MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE = UVERBS_ID_DRIVER_NS
# enum mlx5_ib_objects: MLX5_IB_OBJECT_DEVX (the first); enum mlx5_ib_devx_methods and
# enum mlx5_ib_devx_other_attrs (the raw PRM mailboxes of a DevX general command)
MLX5_IB_OBJECT_DEVX = UVERBS_ID_DRIVER_NS
MLX5_IB_METHOD_DEVX_OTHER = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_DEVX_OTHER_CMD_IN = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT = UVERBS_ID_DRIVER_NS + 1

# mlx5_user_ioctl_cmds.h: enum mlx5_ib_std_types_methods (on UVERBS_OBJECT_DEVICE) and
# enum mlx5_ib_query_port_attrs
MLX5_IB_METHOD_QUERY_PORT = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_QUERY_PORT_PORT_NUM = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_QUERY_PORT = UVERBS_ID_DRIVER_NS + 1

# mlx5_user_ioctl_cmds.h: enum mlx5_ib_alloc_dm_attrs (the driver's attributes on
# UVERBS_METHOD_DM_ALLOC) and mlx5_user_ioctl_verbs.h: enum mlx5_ib_uapi_dm_type
MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX = UVERBS_ID_DRIVER_NS + 1
MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE = UVERBS_ID_DRIVER_NS + 2
MLX5_IB_UAPI_DM_TYPE_MEMIC = 0
MLX5_IB_UAPI_DM_TYPE_STEERING_SW_ICM = 1
MLX5_IB_UAPI_DM_TYPE_HEADER_MODIFY_SW_ICM = 2


@uapi_struct
class mlx5_ib_uapi_query_port(UStruct):
    """Mirrors struct mlx5_ib_uapi_query_port (mlx5_user_ioctl_verbs.h); reg_c0 is
    struct mlx5_ib_uapi_reg {value, mask}."""

    FIELDS = (("flags", "Q"), ("vport", "H"), ("vport_vhca_id", "H"),
              ("esw_owner_vhca_id", "H"), ("rsvd0", "H"), ("vport_steering_icm_rx", "Q"),
              ("vport_steering_icm_tx", "Q"), ("reg_c0_value", "I"), ("reg_c0_mask", "I"))

# mlx5_user_ioctl_cmds.h: importing objects into another context
MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX = UVERBS_ID_DRIVER_NS   # on UVERBS_METHOD_QUERY_CONTEXT
MLX5_IB_METHOD_PD_QUERY = UVERBS_ID_DRIVER_NS                # on UVERBS_OBJECT_PD
MLX5_IB_ATTR_QUERY_PD_HANDLE = UVERBS_ID_DRIVER_NS
MLX5_IB_ATTR_QUERY_PD_RESP_PDN = UVERBS_ID_DRIVER_NS + 1
MLX5_IB_METHOD_DM_QUERY = UVERBS_ID_DRIVER_NS + 1            # on UVERBS_OBJECT_DM
(MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE, MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET,
 MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX,
 MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH) = range(UVERBS_ID_DRIVER_NS, UVERBS_ID_DRIVER_NS + 4)
