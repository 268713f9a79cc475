"""Mirrors drivers/infiniband/core/uverbs_std_types_mr.c: the MR methods that exist only
as ioctls - here UVERBS_METHOD_REG_DMABUF_MR (ibv_reg_dmabuf_mr).

EINVAL when offset and iova differ in their page offset, for bad access
flags, or a missing attribute; EOPNOTSUPP when the driver has no
reg_user_mr_dmabuf; the driver's errors (ib_umem_dmabuf_get's EBADF/EINVAL).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import ib_check_mr_access
from drivers.ib_core.rdma_core import rdma_lookup_get_uobject, rdma_lookup_put_uobject
from drivers.ib_core.uverbs_ioctl import (
    uverbs_api_ioctl_method,
    uverbs_copy_to,
    uverbs_get_const,
)
from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_MR, UVERBS_OBJECT_PD
from drivers.ib_core.verbs import ib_reg_user_mr_dmabuf
from kernel_model.current import current
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced

# include/uapi/rdma/ib_user_ioctl_cmds.h
UVERBS_OBJECT_MR_ID = 7
UVERBS_METHOD_REG_DMABUF_MR = 4
(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE,
 UVERBS_ATTR_REG_DMABUF_MR_OFFSET, UVERBS_ATTR_REG_DMABUF_MR_LENGTH,
 UVERBS_ATTR_REG_DMABUF_MR_IOVA, UVERBS_ATTR_REG_DMABUF_MR_FD,
 UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY,
 UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY) = range(9)
UVERBS_LOOKUP_READ = 0


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
    access = get(UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS)
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


#: the core's ioctl-only methods, for every device (the driver's table adds its own)
CORE_METHODS = {
    (UVERBS_OBJECT_MR_ID, UVERBS_METHOD_REG_DMABUF_MR): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_REG_DMABUF_MR,
        mandatory=(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_ATTR_REG_DMABUF_MR_PD_HANDLE,
                   UVERBS_ATTR_REG_DMABUF_MR_OFFSET, UVERBS_ATTR_REG_DMABUF_MR_LENGTH,
                   UVERBS_ATTR_REG_DMABUF_MR_IOVA, UVERBS_ATTR_REG_DMABUF_MR_FD,
                   UVERBS_ATTR_REG_DMABUF_MR_ACCESS_FLAGS, UVERBS_ATTR_REG_DMABUF_MR_RESP_LKEY,
                   UVERBS_ATTR_REG_DMABUF_MR_RESP_RKEY),
        new_idr=(UVERBS_ATTR_REG_DMABUF_MR_HANDLE, UVERBS_OBJECT_MR)),
}
