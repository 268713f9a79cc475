"""Mirrors drivers/infiniband/core/uverbs_std_types_dm.c (UVERBS_OBJECT_DM: ibv_alloc_dm,
ibv_free_dm) and the device-memory part of uverbs_std_types_mr.c
(UVERBS_METHOD_DM_MR_REG: ibv_reg_dm_mr).

DM_ALLOC: EOPNOTSUPP when the driver has no alloc_dm; the driver's errors
(mlx5: EINVAL for a size or alignment the firmware cannot take, ENOMEM when the
on-chip memory is full, EOPNOTSUPP for an unknown type).  DM_FREE and the
file's teardown: EBUSY while an MR is registered on it (a retryable destroy;
at teardown the MRs go first).

DM_MR_REG: EOPNOTSUPP without reg_dm_mr; EINVAL for access bits outside
IB_ACCESS_SUPPORTED, without IB_ZERO_BASED (a DM MR is always zero-based: the
mapped pointer means nothing to the HCA), for an access ib_check_mr_access
refuses, or a range [offset, offset + length) beyond the DM; then the driver's.
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import IB_ACCESS_SUPPORTED, IB_ZERO_BASED, ib_check_mr_access
from drivers.ib_core.rdma_core import (
    ib_uobject,
    rdma_lookup_get_uobject,
    rdma_lookup_put_uobject,
    uverbs_obj_type,
)
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_copy_to,
    uverbs_get_const,
    uverbs_get_flags32,
)
from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_MR, UVERBS_OBJECT_PD
from drivers.ib_core.verbs import ib_destroy_usecnt
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.refcount import atomic_inc
from kernel_model.trace import traced
from kernel_model.uapi import ib_user_ioctl_cmds as c

UVERBS_LOOKUP_READ = 0
IB_MR_TYPE_DM = 2  # enum ib_mr_type: MEM_REG, SG_GAPS, DM, USER


def uverbs_free_dm(uobj: ib_uobject, why: int, attrs_: Any) -> None:
    """Mirrors uverbs_free_dm(): EBUSY while MRs use it, else ops.dealloc_dm."""
    dm = uobj.object
    ib_destroy_usecnt(dm.usecnt, why, uobj, repr(dm))
    dm.device.ops.dealloc_dm(dm, attrs_)


UVERBS_OBJECT_DM = uverbs_obj_type("DM", uverbs_free_dm)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_DM_ALLOC(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_DM_ALLOC): the driver's alloc_dm with the
    length (u64) and log2 alignment (u32) asked for; the core fields after."""
    uobj = attrs_.uobject
    ib_dev = uobj.context.device
    if ib_dev.ops.alloc_dm is None:
        raise KernelError(EOPNOTSUPP, f"ib_uverbs_alloc_dm: {ib_dev.name} has no device memory")
    length = uverbs_get_const(attrs_, c.UVERBS_ATTR_ALLOC_DM_LENGTH)
    alignment = uverbs_get_const(attrs_, c.UVERBS_ATTR_ALLOC_DM_ALIGNMENT) & 0xFFFFFFFF
    dm = ib_dev.ops.alloc_dm(ib_dev, uobj.context, length, alignment, attrs_)
    dm.device, dm.length, dm.uobject = ib_dev, length, uobj
    uobj.object = dm


@traced
def UVERBS_HANDLER_UVERBS_METHOD_DM_MR_REG(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_DM_MR_REG): see the module docstring."""
    uobj = attrs_.uobject
    ufile = attrs_.ufile
    offset = uverbs_get_const(attrs_, c.UVERBS_ATTR_REG_DM_MR_OFFSET)
    length = uverbs_get_const(attrs_, c.UVERBS_ATTR_REG_DM_MR_LENGTH)
    access = uverbs_get_flags32(attrs_, c.UVERBS_ATTR_REG_DM_MR_ACCESS_FLAGS,
                                IB_ACCESS_SUPPORTED)
    pd_uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_PD, ufile,
                                      uverbs_get_const(attrs_, c.UVERBS_ATTR_REG_DM_MR_PD_HANDLE),
                                      UVERBS_LOOKUP_READ, attrs_)
    try:
        dm_uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_DM, ufile,
                                          uverbs_get_const(attrs_,
                                                           c.UVERBS_ATTR_REG_DM_MR_DM_HANDLE),
                                          UVERBS_LOOKUP_READ, attrs_)
        try:
            pd, dm = pd_uobj.object, dm_uobj.object
            ib_dev = pd.device
            if ib_dev.ops.reg_dm_mr is None:
                raise KernelError(EOPNOTSUPP, f"ib_uverbs_reg_dm_mr: {ib_dev.name} has no "
                                  "device-memory MRs")
            if not access & IB_ZERO_BASED:
                raise KernelError(EINVAL, "ib_uverbs_reg_dm_mr: IB_ZERO_BASED is required")
            ib_check_mr_access(ib_dev, access)
            if offset > dm.length or length > dm.length or length > dm.length - offset:
                raise KernelError(EINVAL, f"ib_uverbs_reg_dm_mr: [{offset:#x}, +{length:#x}) "
                                  f"beyond the DM's {dm.length:#x} bytes")
            mr = ib_dev.ops.reg_dm_mr(pd, dm, offset, length, access, attrs_)
            mr.device, mr.pd, mr.type, mr.dm, mr.uobject = ib_dev, pd, IB_MR_TYPE_DM, dm, uobj
            atomic_inc(pd.usecnt)
            atomic_inc(dm.usecnt)
        finally:
            rdma_lookup_put_uobject(dm_uobj, UVERBS_LOOKUP_READ)
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    uobj.object = mr
    uverbs_copy_to(attrs_, c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY, mr.lkey, 4)
    uverbs_copy_to(attrs_, c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY, mr.rkey, 4)


#: DECLARE_UVERBS_NAMED_OBJECT(UVERBS_OBJECT_DM, ...) and the MR object's DM_MR_REG
DM_METHODS = {
    (c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_ALLOC): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_DM_ALLOC,
        mandatory=(c.UVERBS_ATTR_ALLOC_DM_HANDLE, c.UVERBS_ATTR_ALLOC_DM_LENGTH,
                   c.UVERBS_ATTR_ALLOC_DM_ALIGNMENT),
        new_idr=(c.UVERBS_ATTR_ALLOC_DM_HANDLE, UVERBS_OBJECT_DM)),
    (c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_FREE): uverbs_api_ioctl_method(
        lambda attrs_: None, mandatory=(c.UVERBS_ATTR_FREE_DM_HANDLE,),
        destroy_idr=(c.UVERBS_ATTR_FREE_DM_HANDLE, UVERBS_OBJECT_DM)),
    (c.UVERBS_OBJECT_MR, c.UVERBS_METHOD_DM_MR_REG): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_DM_MR_REG,
        mandatory=(c.UVERBS_ATTR_REG_DM_MR_HANDLE, c.UVERBS_ATTR_REG_DM_MR_OFFSET,
                   c.UVERBS_ATTR_REG_DM_MR_LENGTH, c.UVERBS_ATTR_REG_DM_MR_PD_HANDLE,
                   c.UVERBS_ATTR_REG_DM_MR_DM_HANDLE, c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY,
                   c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY),
        new_idr=(c.UVERBS_ATTR_REG_DM_MR_HANDLE, UVERBS_OBJECT_MR)),
}
