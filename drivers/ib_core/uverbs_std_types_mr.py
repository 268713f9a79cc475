"""Mirrors drivers/infiniband/core/uverbs_std_types_mr.c: the MR methods that exist only
as ioctls - here UVERBS_METHOD_REG_DMABUF_MR (ibv_reg_dmabuf_mr),
UVERBS_METHOD_ADVISE_MR (ibv_advise_mr: prefetch an ODP MR's pages) and
UVERBS_METHOD_QUERY_MR (ibv_import_mr: the keys and length of an MR by its handle).

EINVAL when offset and iova differ in their page offset, for bad access
flags, or a missing attribute; EOPNOTSUPP when the driver has no
reg_user_mr_dmabuf; the driver's errors (ib_umem_dmabuf_get's EBADF/EINVAL).
"""

from __future__ import annotations

import struct
from typing import Any

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_RELAXED_ORDERING,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    ib_check_mr_access,
)
from drivers.ib_core.rdma_core import rdma_lookup_get_uobject, rdma_lookup_put_uobject
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_attr_ptr_get_array_size,
    uverbs_attr_ptr_len,
    uverbs_copy_to,
    uverbs_get_const,
    uverbs_get_flags32,
)
from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_MR, UVERBS_OBJECT_PD
from drivers.ib_core.verbs import ib_reg_user_mr_dmabuf
from kernel_model.current import current
from kernel_model.errno import EFAULT, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user
from kernel_model.uapi import ib_user_ioctl_cmds as c

# include/uapi/rdma/ib_user_ioctl_cmds.h
UVERBS_OBJECT_MR_ID = 7
UVERBS_METHOD_REG_DMABUF_MR = 4
(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE,
 UVERBS_ATTR_REG_DMABUF_MR_OFFSET, UVERBS_ATTR_REG_DMABUF_MR_LENGTH,
 UVERBS_ATTR_REG_DMABUF_MR_IOVA, UVERBS_ATTR_REG_DMABUF_MR_FD,
 UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY,
 UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY) = range(9)
UVERBS_LOOKUP_READ = 0
UVERBS_METHOD_ADVISE_MR = 2
(UVERBS_ATTR_ADVISE_MR_PD_HANDLE, UVERBS_ATTR_ADVISE_MR_ADVICE, UVERBS_ATTR_ADVISE_MR_FLAGS,
 UVERBS_ATTR_ADVISE_MR_SGE_LIST) = range(4)
IB_UVERBS_ADVISE_MR_FLAG_FLUSH = 1 << 0
IB_SGE_SIZE = 16                       # struct ib_sge / ib_uverbs_sge: addr, length, lkey


@traced
def UVERBS_HANDLER_UVERBS_METHOD_REG_DMABUF_MR(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_REG_DMABUF_MR)."""
    uobj = attrs_.uobject

    def get(attr_id: int) -> int:
        return uverbs_get_const(attrs_, attr_id)
    offset, length = get(UVERBS_ATTR_REG_DMABUF_MR_OFFSET), get(UVERBS_ATTR_REG_DMABUF_MR_LENGTH)
    iova, fd = get(UVERBS_ATTR_REG_DMABUF_MR_IOVA), get(UVERBS_ATTR_REG_DMABUF_MR_FD)
    if fd >= 1 << 31:                              # UVERBS_ATTR_RAW_FD: an s32
        fd -= 1 << 32
    access = uverbs_get_flags32(attrs_, UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS,
                                IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_READ
                                | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_ATOMIC
                                | IB_ACCESS_RELAXED_ORDERING)
    page_mask = current().machine.page_size - 1
    if offset & page_mask != iova & page_mask:
        raise KernelError(EINVAL, "reg_dmabuf_mr: offset and iova page offsets differ")
    device = uobj.context.device
    ib_check_mr_access(device, access)
    if device.ops.reg_user_mr_dmabuf is None:
        raise KernelError(EOPNOTSUPP, f"reg_dmabuf_mr: {device.name} has no dma-buf MRs")
    pd_uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_PD, attrs_.ufile,
                                      get(UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE),
                                      UVERBS_LOOKUP_READ, attrs_)
    try:
        mr = ib_reg_user_mr_dmabuf(pd_uobj.object, offset, length, iova, fd, access,
                                   attrs_.driver_udata, uobj)
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)
    uobj.object = mr
    uverbs_copy_to(attrs_, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY, mr.lkey, 4)
    uverbs_copy_to(attrs_, UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY, mr.rkey, 4)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_ADVISE_MR(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_ADVISE_MR): the driver's advise_mr over the
    SGE list, with the PD.

    EOPNOTSUPP when the driver has no advise_mr; EINVAL for a flag other than
    IB_UVERBS_ADVISE_MR_FLAG_FLUSH, an SGE list shorter than one SGE or not a whole
    number of them (the attribute's spec), a missing attribute; EFAULT when the list
    cannot be copied in; the driver's errors."""
    pd_uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_PD, attrs_.ufile,
                                      uverbs_get_const(attrs_, UVERBS_ATTR_ADVISE_MR_PD_HANDLE),
                                      UVERBS_LOOKUP_READ, attrs_)
    try:
        pd = pd_uobj.object
        if pd.device.ops.advise_mr is None:
            raise KernelError(EOPNOTSUPP, f"advise_mr: {pd.device.name} has no advise_mr")
        advice = uverbs_get_const(attrs_, UVERBS_ATTR_ADVISE_MR_ADVICE)
        flags = uverbs_get_flags32(attrs_, UVERBS_ATTR_ADVISE_MR_FLAGS,
                                   IB_UVERBS_ADVISE_MR_FLAG_FLUSH)
        uverbs_attr_ptr_len(attrs_, UVERBS_ATTR_ADVISE_MR_SGE_LIST, IB_SGE_SIZE)  # MIN_SIZE
        num_sge = uverbs_attr_ptr_get_array_size(attrs_, UVERBS_ATTR_ADVISE_MR_SGE_LIST,
                                                 IB_SGE_SIZE)
        sg_list = uverbs_attr_get_sge_list(attrs_, num_sge)
        pd.device.ops.advise_mr(pd, advice, flags, sg_list, num_sge, attrs_)
    finally:
        rdma_lookup_put_uobject(pd_uobj, UVERBS_LOOKUP_READ)


def uverbs_attr_get_sge_list(attrs_: Any, num_sge: int) -> list[tuple[int, int, int]]:
    """uverbs_attr_get_alloced_ptr() of the SGE list (UA_ALLOC_AND_COPY: copied in
    before the handler): (addr, length, lkey) of each struct ib_sge; EFAULT if the
    user buffer cannot be read."""
    attr = attrs_.ioctl.by_id[UVERBS_ATTR_ADVISE_MR_SGE_LIST][1]
    raw = bytearray(num_sge * IB_SGE_SIZE)
    if copy_from_user(raw, attr.data, len(raw)):
        raise KernelError(EFAULT, "uverbs_process_attr: SGE list not readable")
    return [struct.unpack_from("<QII", raw, i * IB_SGE_SIZE) for i in range(num_sge)]


@traced
def UVERBS_HANDLER_UVERBS_METHOD_QUERY_MR(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_QUERY_MR): lkey, rkey, length and (when the
    caller asks) iova of the MR behind the handle - what ibv_import_mr builds its MR
    from.  The handle is an IDR attribute of access READ: ENOENT for a handle this file
    does not hold, EINVAL for a handle of another type."""
    uobj = rdma_lookup_get_uobject(UVERBS_OBJECT_MR, attrs_.ufile,
                                   uverbs_get_const(attrs_, c.UVERBS_ATTR_QUERY_MR_HANDLE),
                                   UVERBS_LOOKUP_READ, attrs_)
    try:
        mr = uobj.object
        uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_MR_RESP_LKEY, mr.lkey, 4)
        uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_MR_RESP_RKEY, mr.rkey, 4)
        uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_MR_RESP_LENGTH, mr.length, 8)
        uverbs_copy_to(attrs_, c.UVERBS_ATTR_QUERY_MR_RESP_IOVA, mr.iova, 8)
    finally:
        rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_READ)


#: the core's ioctl-only methods, for every device (the driver's table adds its own)
CORE_METHODS = {
    (UVERBS_OBJECT_MR_ID, UVERBS_METHOD_ADVISE_MR): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_ADVISE_MR,
        mandatory=(UVERBS_ATTR_ADVISE_MR_PD_HANDLE, UVERBS_ATTR_ADVISE_MR_ADVICE,
                   UVERBS_ATTR_ADVISE_MR_SGE_LIST)),
    (UVERBS_OBJECT_MR_ID, UVERBS_METHOD_REG_DMABUF_MR): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_REG_DMABUF_MR,
        mandatory=(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE,
                   UVERBS_ATTR_REG_DMABUF_MR_OFFSET, UVERBS_ATTR_REG_DMABUF_MR_LENGTH,
                   UVERBS_ATTR_REG_DMABUF_MR_IOVA, UVERBS_ATTR_REG_DMABUF_MR_FD,
                   UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY,
                   UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY),
        new_idr=(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_OBJECT_MR)),
    (UVERBS_OBJECT_MR_ID, c.UVERBS_METHOD_QUERY_MR): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_QUERY_MR,
        mandatory=(c.UVERBS_ATTR_QUERY_MR_HANDLE, c.UVERBS_ATTR_QUERY_MR_RESP_LKEY,
                   c.UVERBS_ATTR_QUERY_MR_RESP_RKEY, c.UVERBS_ATTR_QUERY_MR_RESP_LENGTH)),
}
