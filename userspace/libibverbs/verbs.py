"""Mirrors rdma-core libibverbs (device.c, verbs.c, init.c): the C verbs API.

    devs = ibv_get_device_list(proc)
    ctx = ibv_open_device(proc, devs[0])        # open uverbs0, GET_CONTEXT, mmap UARs
    pd = ibv_alloc_pd(ctx)
    mr = ibv_reg_mr(pd, addr, length, IBV_ACCESS_LOCAL_WRITE)
    cq = ibv_create_cq(ctx, 16)
    qp = ibv_create_qp(pd, ibv_qp_init_attr(send_cq=cq, recv_cq=cq, cap=ibv_qp_cap(...)))
    ibv_modify_qp(qp, ibv_qp_attr(qp_state=IBV_QPS_INIT, port_num=1, ...),
                  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)
    gid = ibv_query_gid(ctx, 1, 0)              # the port's default (link-local) GID
    ibv_destroy_qp(qp); ... ibv_close_device(ctx)

Every call runs in the caller's process (`proc`, an emulated Process) and
reaches the kernel through the provider and the command layer (cmd.py).
Calls that return a pointer in C raise VerbsError(errno) on failure; calls
that return an int in C return 0 or a positive errno, as they do in C.

Providers (userspace/providers/*) plug in through `verbs_context_ops`, found
by the PCI vendor id the kernel publishes in sysfs, as rdma-core matches a
provider's hca_table against the device's modalias; libibverbs loads them by name
and they register themselves (driver.py), so no verb imports a provider.  The
enums and structs are in verbs_types.py (verbs.h), re-exported here.
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from userspace.libc import O_CLOEXEC, O_RDONLY, O_RDWR, free, posix_memalign, read_sysfs
from userspace.libibverbs.cmd import (
    CMD_BUF_SIZE,
    VerbsError,
    execute_ioctl,
    ibv_cmd_query_device,
)
from userspace.libibverbs.driver import load_drivers, verbs_context_ops  # noqa: F401
from userspace.libibverbs.verbs_types import (  # noqa: F401 - re-exported: verbs.h
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_RELAXED_ORDERING,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_MIG_ARMED,
    IBV_MIG_MIGRATED,
    IBV_MIG_REARM,
    IBV_MTU_256,
    IBV_MTU_512,
    IBV_MTU_1024,
    IBV_MTU_2048,
    IBV_MTU_4096,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_ALT_PATH,
    IBV_QP_AV,
    IBV_QP_CAP,
    IBV_QP_CUR_STATE,
    IBV_QP_DEST_QPN,
    IBV_QP_EN_SQD_ASYNC_NOTIFY,
    IBV_QP_MAX_DEST_RD_ATOMIC,
    IBV_QP_MAX_QP_RD_ATOMIC,
    IBV_QP_MIN_RNR_TIMER,
    IBV_QP_PATH_MIG_STATE,
    IBV_QP_PATH_MTU,
    IBV_QP_PKEY_INDEX,
    IBV_QP_PORT,
    IBV_QP_QKEY,
    IBV_QP_RATE_LIMIT,
    IBV_QP_RETRY_CNT,
    IBV_QP_RNR_RETRY,
    IBV_QP_RQ_PSN,
    IBV_QP_SQ_PSN,
    IBV_QP_STATE,
    IBV_QP_TIMEOUT,
    IBV_QPS_ERR,
    IBV_QPS_INIT,
    IBV_QPS_RESET,
    IBV_QPS_RTR,
    IBV_QPS_RTS,
    IBV_QPS_SQD,
    IBV_QPS_SQE,
    IBV_QPT_DRIVER,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    ibv_ah_attr,
    ibv_context,
    ibv_cq,
    ibv_device,
    ibv_global_route,
    ibv_mr,
    ibv_pd,
    ibv_qp,
    ibv_qp_attr,
    ibv_qp_cap,
    ibv_qp_init_attr,
)

SYSFS_VERBS = "/sys/class/infiniband_verbs"
SYSFS_IB = "/sys/class/infiniband"


# -- devices -----------------------------------------------------------------------
def _sysfs_int(proc, path: str) -> int:
    text = read_sysfs(proc, path)
    return int(text.strip(), 0) if text else 0


@traced
def ibv_get_device_list(proc) -> list[ibv_device]:
    """Mirrors ibv_get_device_list(): every uverbsN in sysfs with a provider."""
    names = proc.getdents(SYSFS_VERBS)
    if isinstance(names, int):
        return []
    devices = []
    for dev_name in names:
        if not dev_name.startswith("uverbs"):
            continue
        base = f"{SYSFS_VERBS}/{dev_name}"
        ibdev = (read_sysfs(proc, f"{base}/ibdev") or "").strip()
        guid = (read_sysfs(proc, f"{SYSFS_IB}/{ibdev}/node_guid") or "0").strip()
        dev = ibv_device(ibdev, dev_name, f"/dev/infiniband/{dev_name}",
                         f"{SYSFS_IB}/{ibdev}", _sysfs_int(proc, f"{base}/abi_version"),
                         _sysfs_int(proc, f"{base}/device/vendor"),
                         _sysfs_int(proc, f"{base}/device/device"),
                         int(guid.replace(":", ""), 16))
        dev.ops = load_drivers().get(dev.vendor_id)
        if dev.ops is not None:
            devices.append(dev)
    return devices


@traced
def ibv_get_device_name(device: ibv_device) -> str:
    return device.name


@traced
def ibv_open_device(proc, device: ibv_device) -> ibv_context:
    """Mirrors ibv_open_device() -> verbs_open_device(): open the uverbs file,
    then the provider's alloc_context (which issues GET_CONTEXT)."""
    fd = proc.open(device.dev_path, O_RDWR | O_CLOEXEC)
    if fd < 0:
        raise VerbsError(-fd, f"ibv_open_device({device.name})")
    ctx = ibv_context(device, proc, fd, device.ops)
    try:
        ctx.cmd_buf = posix_memalign(proc, 4096, CMD_BUF_SIZE)
        return device.ops.alloc_context(ctx)
    except BaseException:
        if ctx.cmd_buf:
            free(proc, ctx.cmd_buf, CMD_BUF_SIZE)
        proc.close(fd)
        raise


@traced
def ibv_close_device(ctx: ibv_context) -> int:
    """Mirrors ibv_close_device(): the provider unmaps its pages, then the fds close."""
    ctx.ops.free_context(ctx)
    if ctx.async_fd >= 0:
        ctx.proc.close(ctx.async_fd)
    free(ctx.proc, ctx.cmd_buf, CMD_BUF_SIZE)
    ctx.proc.close(ctx.cmd_fd)
    return 0


@traced
def ibv_query_device(ctx: ibv_context):
    """Mirrors ibv_query_device(): the core's ib_uverbs_query_device_resp."""
    return ibv_cmd_query_device(ctx)


@traced
def ibv_query_port(ctx: ibv_context, port_num: int):
    """Mirrors ibv_query_port()."""
    return ctx.ops.query_port(ctx, port_num)


@traced
def ibv_alloc_pd(ctx: ibv_context) -> ibv_pd:
    return ctx.ops.alloc_pd(ctx)


@traced
def ibv_dealloc_pd(pd: ibv_pd) -> int:
    return _errno_of(pd.context.ops.dealloc_pd, pd)


@traced
def ibv_reg_mr(pd: ibv_pd, addr: int, length: int, access: int) -> ibv_mr:
    return pd.context.ops.reg_mr(pd, addr, length, addr, access)


@traced
def ibv_reg_mr_iova(pd: ibv_pd, addr: int, length: int, iova: int, access: int) -> ibv_mr:
    """rdma-core's ibv_reg_mr_iova(): the MR's remote addresses start at `iova`, not at
    `addr` (iova 0: offsets into the region, as zero-based registrations use)."""
    return pd.context.ops.reg_mr(pd, addr, length, iova, access)


# include/uapi/rdma/ib_user_ioctl_cmds.h: UVERBS_OBJECT_MR, UVERBS_METHOD_REG_DMABUF_MR
_UVERBS_OBJECT_MR, _UVERBS_METHOD_REG_DMABUF_MR = 7, 4


@traced
def ibv_reg_dmabuf_mr(pd: ibv_pd, offset: int, length: int, iova: int, fd: int,
                      access: int) -> ibv_mr:
    """rdma-core's ibv_reg_dmabuf_mr(): register [offset, offset + length) of the dma-buf
    behind fd, seen by the HCA from iova (the ioctl UVERBS_METHOD_REG_DMABUF_MR)."""
    out = execute_ioctl(pd.context, _UVERBS_OBJECT_MR, _UVERBS_METHOD_REG_DMABUF_MR,
                        [(0, 0, "idr"), (1, pd.handle, "in"), (2, offset, "in8"),
                         (3, length, "in8"), (4, iova, "in8"), (5, fd, "in"), (6, access, "in"),
                         (7, 0, "out4"), (8, 0, "out4")], "ibv_reg_dmabuf_mr")
    return ibv_mr(pd.context, pd, iova, length, out[0], out[7], out[8])


@traced
def ibv_dereg_mr(mr: ibv_mr) -> int:
    return _errno_of(mr.context.ops.dereg_mr, mr)


@traced
def ibv_create_cq(ctx: ibv_context, cqe: int, cq_context: Any = None, channel: Any = None,
                  comp_vector: int = 0) -> ibv_cq:
    return ctx.ops.create_cq(ctx, cqe, comp_vector)


@traced
def ibv_destroy_cq(cq: ibv_cq) -> int:
    return _errno_of(cq.context.ops.destroy_cq, cq)


@traced
def ibv_create_qp(pd: ibv_pd, attr: ibv_qp_init_attr) -> ibv_qp:
    """Mirrors ibv_create_qp(): attr.cap is updated with what the QP really has."""
    return pd.context.ops.create_qp(pd, attr)


@traced
def ibv_destroy_qp(qp: ibv_qp) -> int:
    return _errno_of(qp.context.ops.destroy_qp, qp)


@traced
def ibv_modify_qp(qp: ibv_qp, attr: ibv_qp_attr, attr_mask: int) -> int:
    """Mirrors ibv_modify_qp(): 0 or the errno; with IBV_QP_STATE the QP's
    state is the new one once the provider succeeded."""
    try:
        qp.context.ops.modify_qp(qp, attr, attr_mask)
    except OSError as e:
        return e.errno
    if attr_mask & IBV_QP_STATE:
        qp.state = attr.qp_state
    return 0


@traced
def ibv_query_qp(qp: ibv_qp, attr_mask: int) -> tuple[ibv_qp_attr, ibv_qp_init_attr]:
    """Mirrors ibv_query_qp(): the QP's attributes and creation attributes
    (VerbsError on failure; the C function fills the caller's two structs)."""
    attr, init_attr = ibv_qp_attr(), ibv_qp_init_attr()
    qp.context.ops.query_qp(qp, attr, attr_mask, init_attr)
    if attr_mask & IBV_QP_STATE:
        qp.state = attr.qp_state
    return attr, init_attr


@traced
def ibv_query_gid(ctx: ibv_context, port_num: int, index: int) -> bytes:
    """Mirrors ibv_query_gid() as rdma-core did before the QUERY_GID ioctls: read
    ports/<port>/gids/<index> in sysfs and parse its eight 16-bit groups.
    VerbsError(ENOENT) when there is no such file, EINVAL when it does not parse."""
    path = f"{ctx.device.ibdev_path}/ports/{port_num}/gids/{index}"
    text = read_sysfs(ctx.proc, path)
    if text is None:
        raise VerbsError(errno.ENOENT, f"ibv_query_gid({path})")
    try:
        groups = [int(text[i * 5:i * 5 + 4], 16) for i in range(8)]
    except ValueError:
        raise VerbsError(errno.EINVAL, f"ibv_query_gid({path})") from None
    return b"".join(g.to_bytes(2, "big") for g in groups)


# enum ibv_gid_type_sysfs: what gid_attrs/types/<index> says
IBV_GID_TYPE_SYSFS_IB_ROCE_V1, IBV_GID_TYPE_SYSFS_ROCE_V2 = 0, 1


@traced
def ibv_query_gid_type(ctx: ibv_context, port_num: int, index: int) -> int:
    """Mirrors ibv_query_gid_type() (libibverbs' sysfs path): read
    ports/<port>/gid_attrs/types/<index>; "RoCE v2" is IBV_GID_TYPE_SYSFS_ROCE_V2,
    "IB/RoCE v1" IBV_GID_TYPE_SYSFS_IB_ROCE_V1.  A port without the file (InfiniBand,
    where the kernel answers EINVAL) is IB/RoCE v1; an empty slot is VerbsError(ENODATA)."""
    path = f"{ctx.device.ibdev_path}/ports/{port_num}/gid_attrs/types/{index}"
    fd = ctx.proc.open(path, O_RDONLY)
    if fd < 0:
        if -fd == errno.EINVAL:
            return IBV_GID_TYPE_SYSFS_IB_ROCE_V1
        raise VerbsError(-fd, f"ibv_query_gid_type({path})")
    try:
        buf = posix_memalign(ctx.proc, 0, 64)
        try:
            n = ctx.proc.read(fd, buf, 64)
            if n < 0:
                raise VerbsError(-n, f"ibv_query_gid_type({path})")
            text = ctx.proc.load(buf, n).decode().strip()
        finally:
            free(ctx.proc, buf, 64)
    finally:
        ctx.proc.close(fd)
    if text == "RoCE v2":
        return IBV_GID_TYPE_SYSFS_ROCE_V2
    if text == "IB/RoCE v1":
        return IBV_GID_TYPE_SYSFS_IB_ROCE_V1
    raise VerbsError(errno.EINVAL, f"ibv_query_gid_type({path}): {text!r}")


def _errno_of(fn, obj) -> int:
    """The C convention for destroy verbs: 0, or the errno."""
    try:
        fn(obj)
    except OSError as e:
        return e.errno
    return 0


# -- the data path ------------------------------------------------------------------
# enum ibv_wr_opcode, ibv_send_flags, ibv_wc_opcode, ibv_wc_flags, ibv_wc_status
IBV_WR_RDMA_WRITE, IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_SEND = 0, 1, 2
IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_READ = 3, 4
IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE = 1, 2, 4, 8
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ = 0, 1, 2
IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM = 128, 129
IBV_WC_GRH, IBV_WC_WITH_IMM = 1 << 0, 1 << 1
IBV_WC_STATUS = ("SUCCESS", "LOC_LEN_ERR", "LOC_QP_OP_ERR", "LOC_EEC_OP_ERR", "LOC_PROT_ERR",
                 "WR_FLUSH_ERR", "MW_BIND_ERR", "BAD_RESP_ERR", "LOC_ACCESS_ERR",
                 "REM_INV_REQ_ERR", "REM_ACCESS_ERR", "REM_OP_ERR", "RETRY_EXC_ERR",
                 "RNR_RETRY_EXC_ERR", "LOC_RDD_VIOL_ERR", "REM_INV_RD_REQ_ERR", "REM_ABORT_ERR",
                 "INV_EECN_ERR", "INV_EEC_STATE_ERR", "FATAL_ERR", "RESP_TIMEOUT_ERR",
                 "GENERAL_ERR")
(IBV_WC_SUCCESS, IBV_WC_LOC_LEN_ERR, IBV_WC_LOC_QP_OP_ERR, _, IBV_WC_LOC_PROT_ERR,
 IBV_WC_WR_FLUSH_ERR, _, _, _, IBV_WC_REM_INV_REQ_ERR, IBV_WC_REM_ACCESS_ERR,
 IBV_WC_REM_OP_ERR, IBV_WC_RETRY_EXC_ERR, IBV_WC_RNR_RETRY_EXC_ERR) = range(14)


@attrs.define
class ibv_sge:
    addr: int
    length: int
    lkey: int


@attrs.define(eq=False)
class ibv_send_wr:
    """Mirrors struct ibv_send_wr (wr.rdma.remote_addr/rkey flattened)."""

    wr_id: int = 0
    next: ibv_send_wr | None = None
    sg_list: list[ibv_sge] = attrs.Factory(list)
    opcode: int = IBV_WR_SEND
    send_flags: int = 0
    imm_data: int = 0       # __be32: as it travels on the wire
    remote_addr: int = 0
    rkey: int = 0

    @property
    def num_sge(self) -> int:
        return len(self.sg_list)


@attrs.define(eq=False)
class ibv_recv_wr:
    wr_id: int = 0
    next: ibv_recv_wr | None = None
    sg_list: list[ibv_sge] = attrs.Factory(list)


@attrs.define
class ibv_wc:
    """Mirrors struct ibv_wc."""

    wr_id: int = 0
    status: int = IBV_WC_SUCCESS
    opcode: int = 0
    vendor_err: int = 0
    byte_len: int = 0
    imm_data: int = 0
    qp_num: int = 0
    src_qp: int = 0
    wc_flags: int = 0
    pkey_index: int = 0
    slid: int = 0
    sl: int = 0
    dlid_path_bits: int = 0


def ibv_wc_status_str(status: int) -> str:
    """Mirrors ibv_wc_status_str()."""
    return IBV_WC_STATUS[status] if 0 <= status < len(IBV_WC_STATUS) else "unknown"


@traced
def ibv_post_send(qp: ibv_qp, wr: ibv_send_wr, bad_wr: list | None = None) -> int:
    """Mirrors ibv_post_send(): 0 or an errno; the first WR not posted is
    appended to bad_wr (the C API's out-parameter)."""
    return qp.context.ops.post_send(qp, wr, bad_wr)


@traced
def ibv_post_recv(qp: ibv_qp, wr: ibv_recv_wr, bad_wr: list | None = None) -> int:
    """Mirrors ibv_post_recv()."""
    return qp.context.ops.post_recv(qp, wr, bad_wr)


def ibv_poll_cq(cq: ibv_cq, num_entries: int) -> list[ibv_wc]:
    """Mirrors ibv_poll_cq(): up to num_entries completions (a list, where C
    fills an array and returns the count).  Not traced: callers spin on it."""
    return cq.context.ops.poll_cq(cq, num_entries, ibv_wc)
