"""Mirrors drivers/infiniband/core/uverbs_main.c: the /dev/infiniband/uverbsN files.

ib_uverbs is an ib_core *client*: for every registered device with
alloc_ucontext it creates an `ib_uverbs_device` and the character device
/dev/infiniband/uverbsN (+ /sys/class/infiniband_verbs/uverbsN/{ibdev,
abi_version}, which is how libibverbs finds it).  Each open() makes an
`ib_uverbs_file` (the "ufile"): its ucontext, its handle table and its
mmaps.

A command is one write(): ib_uverbs_cmd_hdr, the command struct, the
driver's request.  ib_uverbs_write() checks the header against the
command's sizes (verify_hdr), splits the buffers into the core part
(ucore) and the driver part (driver_udata), runs the handler, and commits
or aborts the object the handler created.  mmap() goes to the driver's
ops.mmap with the VMA tracked (rdma_umap_ops), so that removing the device
can zap every mapping (uverbs_user_mmap_disassociate).

Lock order: ufile.ucontext_lock; ufile.umap_lock (EMU: the SRCU that
guards ib_dev against disassociation is folded into `ib_dev is None`
checks - the model never removes a device while a command runs).
"""

from __future__ import annotations

from typing import Any

import attrs

from drivers.ib_core import uverbs_cmd as cmds
from drivers.ib_core import uverbs_cmd_wq as wq_cmds
from drivers.ib_core.device import ib_client, ib_set_client_data
from drivers.ib_core.ib_core_uverbs import rdma_user_mmap_entry_put
from drivers.ib_core.ib_verbs import RDMA_REMOVE_CLOSE, RDMA_REMOVE_DRIVER_REMOVE, ib_udata
from drivers.ib_core.rdma_core import (
    ib_uverbs_get_ucontext_file,
    rdma_alloc_abort_uobject,
    rdma_alloc_commit_uobject,
    ufile_init_uobjects,
    uverbs_attr_bundle,
    uverbs_destroy_ufile_hw,
)
from drivers.ib_core.uverbs_comp_event import ib_uverbs_close_comp_event_files
from drivers.ib_core.uverbs_ioctl import ib_uverbs_ioctl
from drivers.ib_core.uverbs_std_types_async_fd import uverbs_async_event_destroy_uobj
from drivers.ib_core.uverbs_uapi import uverbs_alloc_api, uverbs_api, uverbs_disassociate_api_pre
from kernel_model.errno import EFAULT, EINVAL, EIO, ENOSPC, EOPNOTSUPP, KernelError
from kernel_model.fs import (
    MAJOR,
    MINOR,
    MKDEV,
    cdev,
    cdev_add,
    cdev_del,
    file,
    file_operations,
    inode,
)
from kernel_model.locking import mutex_init
from kernel_model.mm import vm_operations_struct
from kernel_model.pci import to_pci_dev
from kernel_model.sysfs import sysfs_create_file, sysfs_remove_dir
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user, get_user_u64
from kernel_model.uapi import ib_user_verbs as uv

IB_UVERBS_MAX_DEVICES = 1 << 20
IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR = 231, 192   # the fixed range of the first 32


@attrs.define(eq=False)
class uverbs_api_write_method:
    """Mirrors struct uverbs_api_write_method: one command's handler and sizes."""

    handler: Any
    req_size: int
    resp_size: int
    has_udata: bool
    has_resp: bool
    is_ex: bool = False


def _m(handler, req, resp=None, udata=True) -> uverbs_api_write_method:
    return uverbs_api_write_method(handler, req.SIZE, resp.SIZE if resp else 0, udata,
                                   bool(resp))


#: the legacy write() commands this model implements (uverbs_core_api's write table)
WRITE_METHODS: dict[int, uverbs_api_write_method] = {
    uv.IB_USER_VERBS_CMD_GET_CONTEXT: _m(cmds.ib_uverbs_get_context, uv.ib_uverbs_get_context,
                                         uv.ib_uverbs_get_context_resp),
    uv.IB_USER_VERBS_CMD_QUERY_DEVICE: _m(cmds.ib_uverbs_query_device,
                                          uv.ib_uverbs_query_device,
                                          uv.ib_uverbs_query_device_resp),
    uv.IB_USER_VERBS_CMD_QUERY_PORT: _m(cmds.ib_uverbs_query_port, uv.ib_uverbs_query_port,
                                        uv.ib_uverbs_query_port_resp),
    uv.IB_USER_VERBS_CMD_ALLOC_PD: _m(cmds.ib_uverbs_alloc_pd, uv.ib_uverbs_alloc_pd,
                                      uv.ib_uverbs_alloc_pd_resp),
    uv.IB_USER_VERBS_CMD_DEALLOC_PD: _m(cmds.ib_uverbs_dealloc_pd, uv.ib_uverbs_dealloc_pd,
                                        udata=False),
    uv.IB_USER_VERBS_CMD_CREATE_AH: _m(cmds.ib_uverbs_create_ah, uv.ib_uverbs_create_ah,
                                       uv.ib_uverbs_create_ah_resp),
    uv.IB_USER_VERBS_CMD_DESTROY_AH: _m(cmds.ib_uverbs_destroy_ah, uv.ib_uverbs_destroy_ah,
                                        udata=False),
    uv.IB_USER_VERBS_CMD_REG_MR: _m(cmds.ib_uverbs_reg_mr, uv.ib_uverbs_reg_mr,
                                    uv.ib_uverbs_reg_mr_resp),
    uv.IB_USER_VERBS_CMD_REREG_MR: _m(cmds.ib_uverbs_rereg_mr, uv.ib_uverbs_rereg_mr,
                                      uv.ib_uverbs_rereg_mr_resp),
    uv.IB_USER_VERBS_CMD_DEREG_MR: _m(cmds.ib_uverbs_dereg_mr, uv.ib_uverbs_dereg_mr,
                                      udata=False),
    uv.IB_USER_VERBS_CMD_ALLOC_MW: _m(cmds.ib_uverbs_alloc_mw, uv.ib_uverbs_alloc_mw,
                                      uv.ib_uverbs_alloc_mw_resp),
    uv.IB_USER_VERBS_CMD_DEALLOC_MW: _m(cmds.ib_uverbs_dealloc_mw, uv.ib_uverbs_dealloc_mw,
                                        udata=False),
    uv.IB_USER_VERBS_CMD_CREATE_CQ: _m(cmds.ib_uverbs_create_cq, uv.ib_uverbs_create_cq,
                                       uv.ib_uverbs_create_cq_resp),
    uv.IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL: _m(cmds.ib_uverbs_create_comp_channel,
                                                 uv.ib_uverbs_create_comp_channel,
                                                 uv.ib_uverbs_create_comp_channel_resp,
                                                 udata=False),
    uv.IB_USER_VERBS_CMD_RESIZE_CQ: _m(cmds.ib_uverbs_resize_cq, uv.ib_uverbs_resize_cq,
                                       uv.ib_uverbs_resize_cq_resp),
    uv.IB_USER_VERBS_CMD_DESTROY_CQ: _m(cmds.ib_uverbs_destroy_cq, uv.ib_uverbs_destroy_cq,
                                        uv.ib_uverbs_destroy_cq_resp, udata=False),
    uv.IB_USER_VERBS_CMD_CREATE_QP: _m(cmds.ib_uverbs_create_qp, uv.ib_uverbs_create_qp,
                                       uv.ib_uverbs_create_qp_resp),
    uv.IB_USER_VERBS_CMD_QUERY_QP: _m(cmds.ib_uverbs_query_qp, uv.ib_uverbs_query_qp,
                                      uv.ib_uverbs_query_qp_resp, udata=False),
    uv.IB_USER_VERBS_CMD_MODIFY_QP: _m(cmds.ib_uverbs_modify_qp, uv.ib_uverbs_modify_qp,
                                       udata=False),
    uv.IB_USER_VERBS_CMD_DESTROY_QP: _m(cmds.ib_uverbs_destroy_qp, uv.ib_uverbs_destroy_qp,
                                        uv.ib_uverbs_destroy_qp_resp, udata=False),
    uv.IB_USER_VERBS_CMD_CREATE_SRQ: _m(cmds.ib_uverbs_create_srq, uv.ib_uverbs_create_srq,
                                        uv.ib_uverbs_create_srq_resp),
    uv.IB_USER_VERBS_CMD_CREATE_XSRQ: _m(cmds.ib_uverbs_create_xsrq, uv.ib_uverbs_create_xsrq,
                                         uv.ib_uverbs_create_srq_resp),
    uv.IB_USER_VERBS_CMD_MODIFY_SRQ: _m(cmds.ib_uverbs_modify_srq, uv.ib_uverbs_modify_srq),
    uv.IB_USER_VERBS_CMD_QUERY_SRQ: _m(cmds.ib_uverbs_query_srq, uv.ib_uverbs_query_srq,
                                       uv.ib_uverbs_query_srq_resp, udata=False),
    uv.IB_USER_VERBS_CMD_DESTROY_SRQ: _m(cmds.ib_uverbs_destroy_srq, uv.ib_uverbs_destroy_srq,
                                         uv.ib_uverbs_destroy_srq_resp, udata=False),
    uv.IB_USER_VERBS_CMD_OPEN_XRCD: _m(cmds.ib_uverbs_open_xrcd, uv.ib_uverbs_open_xrcd,
                                       uv.ib_uverbs_open_xrcd_resp),
    uv.IB_USER_VERBS_CMD_CLOSE_XRCD: _m(cmds.ib_uverbs_close_xrcd, uv.ib_uverbs_close_xrcd,
                                        udata=False),
}


#: the extended write() commands (uverbs_core_api's DECLARE_UVERBS_WRITE_EX entries);
#: req_size and resp_size are the minimum lengths (offsetofend of the last field
#: UAPI_DEF_WRITE_IO_EX names), not sizeof
WRITE_EX_METHODS: dict[int, uverbs_api_write_method] = {
    uv.IB_USER_VERBS_EX_CMD_QUERY_DEVICE: uverbs_api_write_method(
        cmds.ib_uverbs_ex_query_device, uv.ib_uverbs_ex_query_device.SIZE,
        uv.ib_uverbs_ex_query_device_resp.offsetof("response_length") + 4, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_CREATE_CQ: uverbs_api_write_method(
        cmds.ib_uverbs_ex_create_cq, uv.ib_uverbs_ex_create_cq.offsetof("reserved") + 4,
        uv.ib_uverbs_ex_create_cq_resp.offsetof("response_length") + 4, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_CREATE_QP: uverbs_api_write_method(
        cmds.ib_uverbs_ex_create_qp, uv.ib_uverbs_ex_create_qp.offsetof("comp_mask") + 4,
        uv.ib_uverbs_ex_create_qp_resp.offsetof("response_length") + 4, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_MODIFY_QP: uverbs_api_write_method(
        cmds.ib_uverbs_ex_modify_qp, uv.ib_uverbs_modify_qp.SIZE,
        uv.ib_uverbs_ex_modify_qp_resp.offsetof("response_length") + 4, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_CREATE_WQ: uverbs_api_write_method(
        wq_cmds.ib_uverbs_ex_create_wq, uv.ib_uverbs_ex_create_wq.offsetof("max_sge") + 4,
        uv.ib_uverbs_ex_create_wq_resp.SIZE, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_MODIFY_WQ: uverbs_api_write_method(
        wq_cmds.ib_uverbs_ex_modify_wq, uv.ib_uverbs_ex_modify_wq.offsetof("flags"), 0,
        True, False, True),
    uv.IB_USER_VERBS_EX_CMD_DESTROY_WQ: uverbs_api_write_method(
        wq_cmds.ib_uverbs_ex_destroy_wq, uv.ib_uverbs_ex_destroy_wq.SIZE,
        uv.ib_uverbs_ex_destroy_wq_resp.SIZE, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL: uverbs_api_write_method(
        wq_cmds.ib_uverbs_ex_create_rwq_ind_table,
        uv.ib_uverbs_ex_create_rwq_ind_table.SIZE,
        uv.ib_uverbs_ex_create_rwq_ind_table_resp.SIZE, True, True, True),
    uv.IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL: uverbs_api_write_method(
        wq_cmds.ib_uverbs_ex_destroy_rwq_ind_table,
        uv.ib_uverbs_ex_destroy_rwq_ind_table.SIZE, 0, True, False, True),
}


class ib_uverbs_device:
    """Mirrors struct ib_uverbs_device: the uverbsN character device of one ib_device."""

    def __init__(self, ib_dev: Any, devnum: int):
        self.machine = ib_dev.machine
        self.ib_dev = ib_dev  # None once the device is removed (disassociated)
        self.devnum = devnum
        self.name = f"uverbs{devnum}"
        self.num_comp_vectors = ib_dev.num_comp_vectors
        self.files: list[ib_uverbs_file] = []  # protected by lists_mutex (EMU: implied)
        self.cdev: cdev | None = None
        self.uapi: uverbs_api | None = None  # the ioctl methods, from uverbs_alloc_api
        # the XRC domains shared by a file's inode: id(inode) -> (inode, ib_xrcd)
        self.xrcd_tree: dict[int, tuple[Any, Any]] = {}
        self.xrcd_tree_mutex = mutex_init("&dev->xrcd_tree_mutex")

    def __repr__(self) -> str:
        dev = self.ib_dev.name if self.ib_dev else "(removed)"
        return f"{self.name} -> {dev} files={len(self.files)}"


class ib_uverbs_file:
    """Mirrors struct ib_uverbs_file: one open of uverbsN."""

    def __init__(self, device: ib_uverbs_device):
        self.device = device
        self.ucontext: Any = None
        self.ucontext_lock = mutex_init("ib_uverbs_file.ucontext_lock")
        self.umap_lock = mutex_init("ib_uverbs_file.umap_lock")
        self.umaps: list[tuple[Any, Any]] = []  # (vma, mmap entry): protected by umap_lock
        self.disassociated = False
        ufile_init_uobjects(self)

    def __repr__(self) -> str:
        return (f"ib_uverbs_file {self.device.name} ucontext={self.ucontext is not None} "
                f"objects={len(self.uobjects)} umaps={len(self.umaps)}")


# -- write() -----------------------------------------------------------------------
def uapi_get_method(command: int) -> uverbs_api_write_method:
    """Mirrors uapi_get_method(): bits outside the command number and the
    extended flag are EINVAL; a command the table lacks (the legacy one, or with
    IB_USER_VERBS_CMD_FLAG_EXTENDED the extended one) is EOPNOTSUPP."""
    if command & ~(uv.IB_USER_VERBS_CMD_FLAG_EXTENDED | uv.IB_USER_VERBS_CMD_COMMAND_MASK):
        raise KernelError(EINVAL, f"uapi_get_method: command word {command:#x} has bits "
                          "outside the command mask")
    table = WRITE_EX_METHODS if command & uv.IB_USER_VERBS_CMD_FLAG_EXTENDED else WRITE_METHODS
    method = table.get(command & uv.IB_USER_VERBS_CMD_COMMAND_MASK)
    if method is None:
        raise KernelError(EOPNOTSUPP, f"uapi_get_method: command {command:#x} not supported")
    return method


def verify_hdr(hdr: uv.ib_uverbs_cmd_hdr, count: int, method: uverbs_api_write_method,
               ex_hdr: uv.ib_uverbs_ex_cmd_hdr | None = None) -> None:
    """Mirrors verify_hdr().  A legacy command: in_words covers the whole write
    (EINVAL otherwise); request or response too small: ENOSPC.  An extended one
    counts 8-byte words after both headers: the core and provider words must
    cover the rest of the write (EINVAL), the core request and response their
    minimum (ENOSPC); cmd_hdr_reserved set, output words without a response
    pointer or a response pointer without output words: EINVAL."""
    if method.is_ex:
        assert ex_hdr is not None
        rest = count - uv.ib_uverbs_cmd_hdr.SIZE - uv.ib_uverbs_ex_cmd_hdr.SIZE
        if (hdr.in_words + ex_hdr.provider_in_words) * 8 != rest:
            raise KernelError(EINVAL, f"verify_hdr: in_words {hdr.in_words} + provider "
                              f"{ex_hdr.provider_in_words} words != {rest} bytes")
        if hdr.in_words * 8 < method.req_size:
            raise KernelError(ENOSPC, f"verify_hdr: request of {hdr.in_words * 8} bytes "
                              f"below {method.req_size}")
        if ex_hdr.cmd_hdr_reserved:
            raise KernelError(EINVAL, "verify_hdr: cmd_hdr_reserved set")
        if ex_hdr.response:
            if not hdr.out_words and not ex_hdr.provider_out_words:
                raise KernelError(EINVAL, "verify_hdr: a response pointer, no out words")
            if hdr.out_words * 8 < method.resp_size:
                raise KernelError(ENOSPC, f"verify_hdr: response of {hdr.out_words * 8} "
                                  f"bytes below {method.resp_size}")
        elif hdr.out_words or ex_hdr.provider_out_words:
            raise KernelError(EINVAL, "verify_hdr: out words without a response pointer")
        return
    if hdr.in_words * 4 != count:
        raise KernelError(EINVAL, f"verify_hdr: in_words {hdr.in_words} * 4 != count {count}")
    if count < method.req_size + uv.ib_uverbs_cmd_hdr.SIZE:
        raise KernelError(ENOSPC, f"verify_hdr: request of {count} bytes below "
                          f"{method.req_size + uv.ib_uverbs_cmd_hdr.SIZE}")
    if hdr.out_words * 4 < method.resp_size:
        raise KernelError(ENOSPC, f"verify_hdr: response of {hdr.out_words * 4} bytes "
                          f"below {method.resp_size}")


@traced
def ib_uverbs_write(filp: file, buf: int, count: int) -> int:
    """Mirrors ib_uverbs_write(): header, method, udata split, handler, finalize."""
    ufile: ib_uverbs_file = filp.private_data
    hsize = uv.ib_uverbs_cmd_hdr.SIZE
    if count < hsize:
        raise KernelError(EINVAL, f"ib_uverbs_write: {count} bytes, no header")
    raw = bytearray(hsize)
    if copy_from_user(raw, buf, hsize):
        raise KernelError(EFAULT, "ib_uverbs_write: copy_from_user of the header")
    hdr = uv.ib_uverbs_cmd_hdr.unpack(raw)
    method = uapi_get_method(hdr.command)
    ex_hdr = None
    if method.is_ex:
        xsize = uv.ib_uverbs_ex_cmd_hdr.SIZE
        if count < hsize + xsize:
            raise KernelError(EINVAL, f"ib_uverbs_write: {count} bytes, no extended header")
        raw_ex = bytearray(xsize)
        if copy_from_user(raw_ex, buf + hsize, xsize):
            raise KernelError(EFAULT, "ib_uverbs_write: copy_from_user of the extended header")
        ex_hdr = uv.ib_uverbs_ex_cmd_hdr.unpack(raw_ex)
    verify_hdr(hdr, count, method, ex_hdr)
    if ufile.device.ib_dev is None:
        raise KernelError(EIO, "ib_uverbs_write: device removed")
    buf += hsize
    if ex_hdr is not None:
        return _ib_uverbs_write_ex(ufile, method, hdr, ex_hdr,
                                  buf + uv.ib_uverbs_ex_cmd_hdr.SIZE, count)
    in_len, out_len = hdr.in_words * 4 - hsize, hdr.out_words * 4
    attrs_ = uverbs_attr_bundle(ufile)
    response = 0
    if method.has_resp:
        response = get_user_u64(buf)  # the request's first field
    if method.has_udata:
        d_in, d_out = in_len - method.req_size, out_len - method.resp_size
        attrs_.driver_udata = ib_udata(buf + method.req_size if d_in else 0,
                                       response + method.resp_size if d_out else 0,
                                       d_in, d_out)
        in_len, out_len = method.req_size, method.resp_size
    attrs_.ucore = ib_udata(buf, response, in_len, out_len)
    _run_write_method(method, attrs_)
    return count


def _run_write_method(method: uverbs_api_write_method, attrs_: uverbs_attr_bundle) -> None:
    """ib_uverbs_write()'s tail for either form: the handler, then the uobject it
    created committed, or aborted if the handler failed."""
    try:
        method.handler(attrs_)
    except BaseException:
        if attrs_.uobject is not None:
            rdma_alloc_abort_uobject(attrs_.uobject, attrs_)
        raise
    if attrs_.uobject is not None:
        rdma_alloc_commit_uobject(attrs_.uobject, attrs_)


def _ib_uverbs_write_ex(ufile: ib_uverbs_file, method: uverbs_api_write_method,
                       hdr: uv.ib_uverbs_cmd_hdr, ex_hdr: uv.ib_uverbs_ex_cmd_hdr, buf: int,
                       count: int) -> int:
    """ib_uverbs_write()'s extended branch: ucore is in_words * 8 bytes of request
    and out_words * 8 of response at ex_hdr.response; the driver udata follows each."""
    attrs_ = uverbs_attr_bundle(ufile)
    in_len, out_len = hdr.in_words * 8, hdr.out_words * 8
    response = ex_hdr.response
    attrs_.ucore = ib_udata(buf if in_len else 0, response if out_len else 0, in_len, out_len)
    d_in, d_out = ex_hdr.provider_in_words * 8, ex_hdr.provider_out_words * 8
    attrs_.driver_udata = ib_udata(buf + in_len if d_in else 0,
                                   response + out_len if d_out else 0, d_in, d_out)
    _run_write_method(method, attrs_)
    return count


# -- mmap --------------------------------------------------------------------------
def rdma_umap_close(vma: Any) -> None:
    """Mirrors rdma_umap_close(): forget the mapping, drop its mmap entry."""
    ufile: ib_uverbs_file = vma.vm_file.private_data
    with ufile.umap_lock:
        for item in [u for u in ufile.umaps if u[0] is vma]:
            ufile.umaps.remove(item)
            if item[1] is not None:
                rdma_user_mmap_entry_put(item[1])


rdma_umap_ops = vm_operations_struct(close=rdma_umap_close)


@traced
def ib_uverbs_mmap(filp: file, vma: Any) -> None:
    """Mirrors ib_uverbs_mmap(): needs a ucontext; the driver maps the pages."""
    ufile: ib_uverbs_file = filp.private_data
    ucontext = ib_uverbs_get_ucontext_file(ufile)
    vma.vm_ops = rdma_umap_ops
    ucontext.device.ops.mmap(ucontext, vma)


# -- open / close -------------------------------------------------------------------
@traced
def ib_uverbs_open(ino: inode, filp: file) -> None:
    """Mirrors ib_uverbs_open(): a new ufile; EIO once the device is gone."""
    dev: ib_uverbs_device = ino.i_cdev.private
    if dev.ib_dev is None:
        raise KernelError(EIO, "ib_uverbs_open: device removed")
    ufile = ib_uverbs_file(dev)
    dev.files.append(ufile)
    filp.private_data = ufile


@traced
def ib_uverbs_close(ino: inode, filp: file) -> None:
    """Mirrors ib_uverbs_close(): destroy every object and the ucontext."""
    ufile: ib_uverbs_file = filp.private_data
    uverbs_destroy_ufile_hw(ufile, RDMA_REMOVE_CLOSE)
    ib_uverbs_close_comp_event_files(ufile)
    if ufile in ufile.device.files:
        ufile.device.files.remove(ufile)


def uverbs_fops(owner: Any) -> file_operations:
    """uverbs_mmap_fops: the file operations of every uverbsN."""
    return file_operations(owner=owner, open=ib_uverbs_open, release=ib_uverbs_close,
                           write=ib_uverbs_write, mmap=ib_uverbs_mmap,
                           unlocked_ioctl=ib_uverbs_ioctl)


# -- the client ----------------------------------------------------------------------
class UverbsState:
    """ib_uverbs' globals on one machine: the client, the devnum ida, the devices."""

    def __init__(self, owner: Any):
        self.owner = owner
        self.devices: dict[int, ib_uverbs_device] = {}
        self.client = ib_client("uverbs", add=self.add_one, remove=self.remove_one)

    def __repr__(self) -> str:
        return f"ib_uverbs {list(self.devices.values())}"

    @traced
    def add_one(self, device: Any) -> None:
        """Mirrors ib_uverbs_add_one(): uverbsN for a device with alloc_ucontext."""
        if device.ops.alloc_ucontext is None:
            return
        devnum = next(i for i in range(IB_UVERBS_MAX_DEVICES) if i not in self.devices)
        udev = ib_uverbs_device(device, devnum)
        udev.uapi = uverbs_alloc_api(device)
        cd = cdev(uverbs_fops(self.owner))
        cd.private = udev
        # EMU: every devnum gets a number of the fixed 231:192 range (the kernel
        # takes a dynamic major beyond the first 32 devices)
        cd.dev = MKDEV(IB_UVERBS_MAJOR, IB_UVERBS_BASE_MINOR + devnum)
        cdev_add(cd, f"/dev/infiniband/{udev.name}")
        udev.cdev = cd
        base = f"/sys/class/infiniband_verbs/{udev.name}"
        sysfs_create_file(f"{base}/dev", lambda: f"{MAJOR(cd.dev)}:{MINOR(cd.dev)}\n")
        sysfs_create_file(f"{base}/ibdev", lambda: f"{device.name}\n")
        sysfs_create_file(f"{base}/abi_version", lambda: f"{device.ops.uverbs_abi_ver}\n")
        # device -> the parent PCI function: its PCI ids, which libibverbs matches
        # providers by (attrs.vendor_id is the IEEE OUI the driver reports, not this)
        pdev = to_pci_dev(device.dev_parent)
        ids = (pdev.vendor, pdev.device) if pdev is not None else \
            (device.attrs.vendor_id, device.attrs.vendor_part_id)  # EMU: no PCI parent
        sysfs_create_file(f"{base}/device/vendor", lambda: f"0x{ids[0]:04x}\n")
        sysfs_create_file(f"{base}/device/device", lambda: f"0x{ids[1]:04x}\n")
        self.devices[devnum] = udev
        ib_set_client_data(device, self.client, udev)

    @traced
    def remove_one(self, device: Any, udev: ib_uverbs_device | None) -> None:
        """Mirrors ib_uverbs_remove_one(): no new opens; every open file is
        disassociated - its objects destroyed, its mmaps zapped - and later
        commands on it fail with EIO."""
        if udev is None:
            return
        cdev_del(udev.cdev)
        sysfs_remove_dir(f"/sys/class/infiniband_verbs/{udev.name}")
        uverbs_disassociate_api_pre(udev.uapi)
        for ufile in list(udev.files):  # ib_uverbs_free_hw_resources()
            uverbs_destroy_ufile_hw(ufile, RDMA_REMOVE_DRIVER_REMOVE)
            ib_uverbs_close_comp_event_files(ufile)
            async_file = getattr(ufile, "default_async_file", None)
            if async_file is not None:
                uverbs_async_event_destroy_uobj(async_file, RDMA_REMOVE_DRIVER_REMOVE)
            ufile.disassociated = True
        udev.ib_dev = None
        del self.devices[udev.devnum]
