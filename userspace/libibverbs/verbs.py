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
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi.ib_user_verbs import ib_uverbs_gid_entry
from kernel_model.uapi.stat import S_ISCHR, makedev
from kernel_model.uapi.stat import stat as kstat
from userspace.libc import O_CLOEXEC, O_RDONLY, O_RDWR, free, posix_memalign, read_sysfs
from userspace.libibverbs.cmd import (
    CMD_BUF_SIZE,
    VerbsError,
    execute_ioctl,
    ibv_cmd_alloc_async_fd,
    ibv_cmd_query_device,
)
from userspace.libibverbs.driver import load_drivers, verbs_context_ops  # noqa: F401
from userspace.libibverbs.verbs_async import ibv_destroy_wait_events
from userspace.libibverbs.verbs_cq import verbs_init_cq
from userspace.libibverbs.verbs_types import (  # noqa: F401 - re-exported: verbs.h
    IBV_ACCESS_LOCAL_WRITE,
    IBV_ACCESS_MW_BIND,
    IBV_ACCESS_ON_DEMAND,
    IBV_ACCESS_RELAXED_ORDERING,
    IBV_ACCESS_REMOTE_ATOMIC,
    IBV_ACCESS_REMOTE_READ,
    IBV_ACCESS_REMOTE_WRITE,
    IBV_ACCESS_ZERO_BASED,
    IBV_ALLOCATOR_USE_DEFAULT,
    IBV_MIG_ARMED,
    IBV_MIG_MIGRATED,
    IBV_MIG_REARM,
    IBV_MR_TYPE_DMABUF_MR,
    IBV_MR_TYPE_MR,
    IBV_MTU_256,
    IBV_MTU_512,
    IBV_MTU_1024,
    IBV_MTU_2048,
    IBV_MTU_4096,
    IBV_MW_TYPE_1,
    IBV_MW_TYPE_2,
    IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS,
    IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT,
    IBV_QP_ACCESS_FLAGS,
    IBV_QP_ALT_PATH,
    IBV_QP_AV,
    IBV_QP_CAP,
    IBV_QP_CUR_STATE,
    IBV_QP_DEST_QPN,
    IBV_QP_EN_SQD_ASYNC_NOTIFY,
    IBV_QP_INIT_ATTR_CREATE_FLAGS,
    IBV_QP_INIT_ATTR_IND_TABLE,
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
    IBV_QP_INIT_ATTR_PD,
    IBV_QP_INIT_ATTR_RX_HASH,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QP_INIT_ATTR_XRCD,
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
    IBV_REREG_MR_CHANGE_ACCESS,
    IBV_REREG_MR_CHANGE_PD,
    IBV_REREG_MR_CHANGE_TRANSLATION,
    IBV_REREG_MR_ERR_CMD,
    IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW,
    IBV_REREG_MR_ERR_DO_FORK_OLD,
    IBV_REREG_MR_ERR_DONT_FORK_NEW,
    IBV_REREG_MR_ERR_INPUT,
    IBV_REREG_MR_FLAGS_SUPPORTED,
    IBV_SRQ_INIT_ATTR_CQ,
    IBV_SRQ_INIT_ATTR_PD,
    IBV_SRQ_INIT_ATTR_TM,
    IBV_SRQ_INIT_ATTR_TYPE,
    IBV_SRQ_INIT_ATTR_XRCD,
    IBV_SRQ_LIMIT,
    IBV_SRQ_MAX_WR,
    IBV_SRQT_BASIC,
    IBV_SRQT_TM,
    IBV_SRQT_XRC,
    IBV_XRCD_INIT_ATTR_FD,
    IBV_XRCD_INIT_ATTR_OFLAGS,
    IBV_XRCD_INIT_ATTR_RESERVED,
    ibv_ah,
    ibv_ah_attr,
    ibv_context,
    ibv_cq,
    ibv_device,
    ibv_device_attr_ex,
    ibv_gid_entry,
    ibv_global_route,
    ibv_mr,
    ibv_mw,
    ibv_parent_domain_init_attr,
    ibv_pd,
    ibv_qp,
    ibv_qp_attr,
    ibv_qp_cap,
    ibv_qp_init_attr,
    ibv_qp_init_attr_ex,
    ibv_srq,
    ibv_srq_attr,
    ibv_srq_init_attr,
    ibv_srq_init_attr_ex,
    ibv_values_ex,
    ibv_xrcd,
    ibv_xrcd_init_attr,
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
        dev.sysfs_cdev = _sysfs_dev_t(proc, f"{base}/dev")
        dev.ops = load_drivers().get(dev.vendor_id)
        if dev.ops is not None:
            devices.append(dev)
    return devices


def _sysfs_dev_t(proc, path: str) -> int:
    """setup_sysfs_uverbs(): the node's "major:minor", as makedev() (0 if unreadable)."""
    text = (read_sysfs(proc, path) or "").strip()
    major, _, minor = text.partition(":")
    return makedev(int(major), int(minor)) if major.isdigit() and minor.isdigit() else 0


@traced
def ibv_get_device_name(device: ibv_device) -> str:
    return device.name


@traced
def ibv_open_device(proc, device: ibv_device, private_data: Any = None) -> ibv_context:
    """Mirrors ibv_open_device() -> verbs_open_device(): open the uverbs file,
    then the provider's alloc_context (which issues GET_CONTEXT).  private_data is
    verbs_open_device's (mlx5dv_open_device passes its mlx5dv_context_attr)."""
    fd = proc.open(device.dev_path, O_RDWR | O_CLOEXEC)
    if fd < 0:
        raise VerbsError(-fd, f"ibv_open_device({device.name})")
    ctx = ibv_context(device, proc, fd, device.ops)
    try:
        ctx.cmd_buf = posix_memalign(proc, 4096, CMD_BUF_SIZE)
        if private_data is not None:
            return device.ops.alloc_context(ctx, private_data)
        return device.ops.alloc_context(ctx)
    except BaseException:
        if ctx.cmd_buf:
            free(proc, ctx.cmd_buf, CMD_BUF_SIZE)
        proc.close(fd)
        raise


@traced
def ibv_import_device(proc, cmd_fd: int) -> ibv_context:
    """Mirrors ibv_import_device(): a second context on a command fd that already has
    one (a dup() of another context's, or one handed over by another process).

    fstat() finds the device: EINVAL for an fd that is not open or not a character
    device, ENODEV for one no uverbs device of the list is (by its dev_t),
    EOPNOTSUPP for a provider without import_context.  Up to there the fd stays the
    caller's; from the provider's import_context on it is the context's: a failure
    closes it, and ibv_close_device closes it with the context.  The imported context
    gets an async event file of its own (ibv_cmd_alloc_async_fd)."""
    buf = posix_memalign(proc, 8, kstat.SIZE)
    try:
        ret = proc.fstat(cmd_fd, buf)
        st = kstat.unpack(proc.load(buf, kstat.SIZE)) if ret == 0 else None
    finally:
        free(proc, buf, kstat.SIZE)
    if st is None or not S_ISCHR(st.st_mode):
        raise VerbsError(errno.EINVAL, f"ibv_import_device({cmd_fd})")
    device = next((d for d in ibv_get_device_list(proc) if d.sysfs_cdev == st.st_rdev), None)
    if device is None:
        raise VerbsError(errno.ENODEV, f"ibv_import_device({cmd_fd})")
    if device.ops.import_context is None:
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_import_device({cmd_fd})")
    ctx = ibv_context(device, proc, cmd_fd, device.ops)
    try:
        ctx.cmd_buf = posix_memalign(proc, 4096, CMD_BUF_SIZE)
        ctx = device.ops.import_context(ctx)
    except BaseException:           # the provider's uninit: verbs_uninit_context
        if ctx.cmd_buf:
            free(proc, ctx.cmd_buf, CMD_BUF_SIZE)
        proc.close(cmd_fd)
        raise
    ctx.imported = True
    try:
        ibv_cmd_alloc_async_fd(ctx)
    except VerbsError:
        ibv_close_device(ctx)
        raise
    return ctx


@traced
def ibv_import_pd(ctx: ibv_context, pd_handle: int) -> ibv_pd:
    """Mirrors ibv_import_pd(): the provider's import_pd - a PD object of this
    library for a PD the command fd's context holds (the kernel object is shared)."""
    return ctx.ops.import_pd(ctx, pd_handle)


@traced
def ibv_unimport_pd(pd: ibv_pd) -> None:
    """Mirrors ibv_unimport_pd(): forget the imported PD; the kernel object stays."""
    pd.context.ops.unimport_pd(pd)


@traced
def ibv_import_mr(pd: ibv_pd, mr_handle: int) -> ibv_mr:
    """Mirrors ibv_import_mr(): the provider's import_mr (UVERBS_METHOD_QUERY_MR)."""
    return pd.context.ops.import_mr(pd, mr_handle)


@traced
def ibv_unimport_mr(mr: ibv_mr) -> None:
    """Mirrors ibv_unimport_mr(): forget the imported MR; the kernel object stays."""
    mr.context.ops.unimport_mr(mr)


@traced
def ibv_import_dm(ctx: ibv_context, dm_handle: int):
    """Mirrors ibv_import_dm(): the provider's import_dm (maps the DM's pages)."""
    return ctx.ops.import_dm(ctx, dm_handle)


@traced
def ibv_unimport_dm(dm) -> None:
    """Mirrors ibv_unimport_dm(): unmap the imported DM; the kernel object stays."""
    dm.context.ops.unimport_dm(dm)


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
def ibv_alloc_parent_domain(ctx: ibv_context, attr: ibv_parent_domain_init_attr) -> ibv_pd:
    """Mirrors ibv_alloc_parent_domain() (verbs.h): the provider's alloc_parent_domain,
    EOPNOTSUPP for a provider without one.  The parent domain is a PD to every verb
    that takes one, and ibv_dealloc_pd() frees it."""
    op = ctx.ops.alloc_parent_domain
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_alloc_parent_domain: the provider has none")
    return op(ctx, attr)


def ibv_check_alloc_parent_domain(attr: ibv_parent_domain_init_attr) -> None:
    """Mirrors ibv_check_alloc_parent_domain() (driver.h): EINVAL without a PD."""
    if attr.pd is None:
        raise VerbsError(errno.EINVAL, "ibv_alloc_parent_domain: no protection domain")


def ibv_initialize_parent_domain(parent_domain: ibv_pd, protection_domain: ibv_pd) -> None:
    """Mirrors ibv_initialize_parent_domain() (driver.h): the parent domain takes the
    protection domain's context and kernel handle, so the commands that name a PD
    name the protection domain."""
    parent_domain.context = protection_domain.context
    parent_domain.handle = protection_domain.handle


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
    return ibv_mr(pd.context, pd, iova, length, out[0], out[7], out[8],
                  IBV_MR_TYPE_DMABUF_MR)


# include/uapi/rdma/ib_user_ioctl_cmds.h: UVERBS_METHOD_ADVISE_MR and its attributes
_UVERBS_METHOD_ADVISE_MR = 2
(_UVERBS_ATTR_ADVISE_MR_PD_HANDLE, _UVERBS_ATTR_ADVISE_MR_ADVICE, _UVERBS_ATTR_ADVISE_MR_FLAGS,
 _UVERBS_ATTR_ADVISE_MR_SGE_LIST) = range(4)


@traced
def ibv_cmd_advise_mr(pd: ibv_pd, advice: int, flags: int, sg_list: list) -> int:
    """Mirrors ibv_cmd_advise_mr() (cmd_mr.c): UVERBS_METHOD_ADVISE_MR with the PD, the
    advice, the flags and the SGE array (struct ibv_sge: addr, length, lkey) in the
    process's memory; 0 or the errno."""
    ctx = pd.context
    raw = b"".join(int(s.addr).to_bytes(8, "little") + int(s.length).to_bytes(4, "little")
                   + int(s.lkey).to_bytes(4, "little") for s in sg_list)
    buf = posix_memalign(ctx.proc, 8, max(len(raw), 8))
    try:
        ctx.proc.store(buf, raw)
        execute_ioctl(ctx, _UVERBS_OBJECT_MR, _UVERBS_METHOD_ADVISE_MR,
                      [(_UVERBS_ATTR_ADVISE_MR_PD_HANDLE, pd.handle, "in"),
                       (_UVERBS_ATTR_ADVISE_MR_ADVICE, advice, "in"),
                       (_UVERBS_ATTR_ADVISE_MR_FLAGS, flags, "in"),
                       (_UVERBS_ATTR_ADVISE_MR_SGE_LIST, (buf, len(raw)), "ptr_in")],
                      "ibv_cmd_advise_mr")
    except VerbsError as e:
        return e.errno
    finally:
        free(ctx.proc, buf, max(len(raw), 8))
    return 0


@traced
def ibv_advise_mr(pd: ibv_pd, advice: int, flags: int, sg_list: list) -> int:
    """Mirrors ibv_advise_mr() (verbs.h): the provider's advise_mr; EOPNOTSUPP without
    one.  0 or the errno."""
    fn = getattr(pd.context.ops, "advise_mr", None)
    if fn is None:
        return errno.EOPNOTSUPP
    return fn(pd, advice, flags, sg_list)


# -- device memory (verbs.h inlines: the provider's ops, EOPNOTSUPP without them) -----------
def _dm_op(ctx: ibv_context, name: str):
    fn = getattr(ctx.ops, name, None)
    if fn is None:
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_{name}")
    return fn


@traced
def ibv_alloc_dm(ctx: ibv_context, length: int, log_align_req: int = 0, comp_mask: int = 0):
    """Mirrors ibv_alloc_dm(): the provider's alloc_dm (struct ibv_alloc_dm_attr's length,
    log_align_req, comp_mask); raises OSError(errno) on failure."""
    return _dm_op(ctx, "alloc_dm")(ctx, length, log_align_req, comp_mask)


@traced
def ibv_free_dm(dm) -> int:
    """Mirrors ibv_free_dm(): 0 or the errno."""
    return _errno_of(_dm_op(dm.context, "free_dm"), dm)


@traced
def ibv_memcpy_to_dm(dm, dm_offset: int, data: bytes, length: int) -> int:
    """Mirrors ibv_memcpy_to_dm(): 0 or an errno (the provider's checks)."""
    return _dm_op(dm.context, "memcpy_to_dm")(dm, dm_offset, data, length)


@traced
def ibv_memcpy_from_dm(dm, dm_offset: int, length: int) -> tuple[int, bytes]:
    """Mirrors ibv_memcpy_from_dm(): (0, the bytes) or (errno, b"")."""
    return _dm_op(dm.context, "memcpy_from_dm")(dm, dm_offset, length)


@traced
def ibv_reg_dm_mr(pd: ibv_pd, dm, dm_offset: int, length: int, access: int) -> ibv_mr:
    """Mirrors ibv_reg_dm_mr(): the provider's reg_dm_mr (a zero-based MR over the DM)."""
    return _dm_op(pd.context, "reg_dm_mr")(pd, dm, dm_offset, length, access)


@traced
def ibv_rereg_mr(mr: ibv_mr, flags: int, pd: ibv_pd | None, addr: int, length: int,
                 access: int) -> tuple[int, int]:
    """Mirrors ibv_rereg_mr(): change the MR's translation, PD and/or access (the
    provider's rereg_mr).  Returns (the C return value, the errno it leaves): (0, 0),
    or IBV_REREG_MR_ERR_INPUT with EINVAL for a non-plain MR (dma-buf, imported),
    unknown flags, TRANSLATION without addr or length, or access without
    CHANGE_ACCESS; IBV_REREG_MR_ERR_CMD with the command's errno.  On success the
    ibv_mr follows (keys always, pd, addr and length as changed).

    # EMU: fork protection (ibv_dontfork_range / ibv_dofork_range) is not modelled,
    # as in ibv_reg_mr, so the *_FORK_* error codes do not occur.
    """
    if mr.mr_type != IBV_MR_TYPE_MR or flags & ~IBV_REREG_MR_FLAGS_SUPPORTED or \
            (flags & IBV_REREG_MR_CHANGE_TRANSLATION and (not length or not addr)) or \
            (access and not flags & IBV_REREG_MR_CHANGE_ACCESS):
        return IBV_REREG_MR_ERR_INPUT, errno.EINVAL
    try:
        mr.context.ops.rereg_mr(mr, flags, pd, addr, length, access)
    except OSError as e:
        return IBV_REREG_MR_ERR_CMD, e.errno or 0
    if flags & IBV_REREG_MR_CHANGE_PD:
        mr.pd = pd
    if flags & IBV_REREG_MR_CHANGE_TRANSLATION:
        mr.addr, mr.length = addr, length
    return 0, 0


@traced
def ibv_dereg_mr(mr: ibv_mr) -> int:
    return _errno_of(mr.context.ops.dereg_mr, mr)


@traced
def ibv_create_cq(ctx: ibv_context, cqe: int, cq_context: Any = None, channel: Any = None,
                  comp_vector: int = 0) -> ibv_cq:
    """Mirrors ibv_create_cq(): the provider's create_cq (with the completion channel
    the CQ reports events to, if any), then verbs_init_cq."""
    cq = ctx.ops.create_cq(ctx, cqe, channel, comp_vector)
    verbs_init_cq(cq, ctx, channel, cq_context)
    return cq


@traced
def ibv_destroy_cq(cq: ibv_cq) -> int:
    """Mirrors ibv_destroy_cq(): the provider's destroy_cq; on success the channel
    counts one CQ less."""
    channel = cq.channel
    ret = _errno_of(cq.context.ops.destroy_cq, cq)
    if channel is not None and not ret:
        channel.refcnt -= 1
    return ret


@traced
def ibv_create_qp(pd: ibv_pd, attr: ibv_qp_init_attr) -> ibv_qp:
    """Mirrors ibv_create_qp(): attr.cap is updated with what the QP really has."""
    return pd.context.ops.create_qp(pd, attr)


@traced
def ibv_create_qp_ex(ctx: ibv_context, attr: ibv_qp_init_attr_ex) -> ibv_qp:
    """Mirrors ibv_create_qp_ex() (verbs.h): an attr that names only the PD is
    ibv_create_qp() on it; anything more is the provider's create_qp_ex op
    (EOPNOTSUPP without one).  attr.cap is updated as by ibv_create_qp()."""
    if attr.comp_mask == IBV_QP_INIT_ATTR_PD:
        return ibv_create_qp(attr.pd, attr)
    op = ctx.ops.create_qp_ex
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_create_qp_ex: the provider has no create_qp_ex")
    return op(ctx, attr)


# -- shared receive queues -----------------------------------------------------------
@traced
def ibv_create_srq(pd: ibv_pd, attr: ibv_srq_init_attr) -> ibv_srq:
    """Mirrors ibv_create_srq(): the provider's create_srq (EOPNOTSUPP without one);
    attr.attr is updated with the SRQ's real sizes.  VerbsError on failure."""
    op = pd.context.ops.create_srq
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_create_srq: the provider has no create_srq")
    srq = op(pd, attr)
    srq.srq_context = attr.srq_context
    return srq


@traced
def ibv_create_srq_ex(ctx: ibv_context, attr: ibv_srq_init_attr_ex) -> ibv_srq:
    """Mirrors ibv_create_srq_ex() (verbs.h): a basic SRQ on a PD, naming nothing
    else, is ibv_create_srq(); anything more is the provider's create_srq_ex op
    (EOPNOTSUPP without one)."""
    mask = attr.comp_mask
    if not mask & ~(IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE) and \
            mask & IBV_SRQ_INIT_ATTR_PD and \
            (not mask & IBV_SRQ_INIT_ATTR_TYPE or attr.srq_type == IBV_SRQT_BASIC):
        return ibv_create_srq(attr.pd, attr)
    op = ctx.ops.create_srq_ex
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_create_srq_ex: the provider has no "
                         "create_srq_ex")
    srq = op(ctx, attr)
    srq.srq_context = attr.srq_context
    return srq


@traced
def ibv_modify_srq(srq: ibv_srq, attr: ibv_srq_attr, attr_mask: int) -> int:
    """Mirrors ibv_modify_srq(): 0 or the errno."""
    try:
        srq.context.ops.modify_srq(srq, attr, attr_mask)
    except OSError as e:
        return e.errno
    return 0


@traced
def ibv_query_srq(srq: ibv_srq) -> ibv_srq_attr:
    """Mirrors ibv_query_srq(): the SRQ's attributes (VerbsError on failure; the C
    function fills the caller's struct)."""
    attr = ibv_srq_attr()
    srq.context.ops.query_srq(srq, attr)
    return attr


@traced
def ibv_get_srq_num(srq: ibv_srq) -> int:
    """Mirrors ibv_get_srq_num(): the provider's get_srq_num (EOPNOTSUPP without one)."""
    op = srq.context.ops.get_srq_num
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_get_srq_num: the provider has none")
    return op(srq)


@traced
def ibv_destroy_srq(srq: ibv_srq) -> int:
    """Mirrors ibv_destroy_srq(): 0 or the errno (EBUSY while a QP uses it)."""
    return _errno_of(srq.context.ops.destroy_srq, srq)


@traced
def ibv_open_xrcd(ctx: ibv_context, attr: ibv_xrcd_init_attr) -> ibv_xrcd:
    """Mirrors ibv_open_xrcd(): the provider's open_xrcd (EOPNOTSUPP without one);
    VerbsError on failure."""
    op = ctx.ops.open_xrcd
    if op is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_open_xrcd: the provider has no open_xrcd")
    return op(ctx, attr)


@traced
def ibv_close_xrcd(xrcd: ibv_xrcd) -> int:
    """Mirrors ibv_close_xrcd(): 0 or the errno (EBUSY while its SRQs or QPs live)."""
    return _errno_of(xrcd.context.ops.close_xrcd, xrcd)


@traced
def ibv_post_srq_recv(srq: ibv_srq, wr: Any, bad_wr: list | None = None) -> int:
    """Mirrors ibv_post_srq_recv(): 0 or an errno; the first WR not posted is
    appended to bad_wr."""
    return srq.context.ops.post_srq_recv(srq, wr, bad_wr)


@traced
def ibv_destroy_qp(qp: ibv_qp) -> int:
    """Mirrors ibv_destroy_qp(): 0 or the errno; the wait for the QP's reported async
    events to be acknowledged (EDEADLK: see verbs_async) once the provider is done."""
    rc = _errno_of(qp.context.ops.destroy_qp, qp)
    if rc == 0:
        rc = _errno_of(lambda q: ibv_destroy_wait_events(q, "events_completed",
                                                         q.events_reported,
                                                         "ibv_destroy_qp"), qp)
    return rc


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
def ibv_query_qp_data_in_order(qp: ibv_qp, op: int, flags: int) -> int:
    """Mirrors ibv_query_qp_data_in_order(): the provider's answer, or 0 (data
    placement in order not guaranteed) when the provider has no such op.

    # EMU: the emulated libmlx5 has no query_qp_data_in_order op: always 0.
    """
    op_fn = getattr(qp.context.ops, "query_qp_data_in_order", None)
    return op_fn(qp, op, flags) if op_fn is not None else 0


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


# -- ibv_query_device_ex, pkeys, the GID ioctls -----------------------------------------
@traced
def ibv_query_device_ex(ctx: ibv_context, comp_mask: int = 0) -> ibv_device_attr_ex:
    """Mirrors ibv_query_device_ex() (verbs.h): the provider's query_device_ex
    (VerbsError with its errno); without one, or when it answers EOPNOTSUPP/ENOSYS,
    the legacy ibv_query_device() into orig_attr and nothing else.  `comp_mask` is
    the ibv_query_device_ex_input's (None in C: 0)."""
    op = ctx.ops.query_device_ex
    if op is not None:
        try:
            return op(ctx, comp_mask)
        except VerbsError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
                raise
    return ibv_device_attr_ex(orig_attr=ibv_query_device(ctx))


@traced
def ibv_query_rt_values_ex(ctx: ibv_context, values: ibv_values_ex) -> int:
    """Mirrors ibv_query_rt_values_ex() (verbs.h): the provider's query_rt_values on
    `values` (struct ibv_values_ex: comp_mask in and out, raw_clock); 0 or an errno,
    EOPNOTSUPP for a provider without the op."""
    op = getattr(ctx.ops, "query_rt_values", None)
    if op is None:
        return errno.EOPNOTSUPP
    return op(ctx, values)


def htobe16(v: int) -> int:
    """endian.h's htobe16 on a little-endian host: the two bytes swapped."""
    return int.from_bytes((v & 0xFFFF).to_bytes(2, "big"), "little")


@traced
def ibv_query_pkey(ctx: ibv_context, port_num: int, index: int) -> int:
    """Mirrors ibv_query_pkey(): read ports/<port>/pkeys/<index> in sysfs; the value
    is returned as C's __be16 holds it (htobe16 of the file's number, as a
    little-endian host reads those two bytes).  VerbsError(errno of the read) when
    there is no such file or it does not parse (C: -1)."""
    path = f"{ctx.device.ibdev_path}/ports/{port_num}/pkeys/{index}"
    text = read_sysfs(ctx.proc, path)
    if text is None:
        raise VerbsError(errno.ENOENT, f"ibv_query_pkey({path})")
    try:
        val = int(text.strip(), 16) & 0xFFFF
    except ValueError:
        raise VerbsError(errno.EINVAL, f"ibv_query_pkey({path})") from None
    return htobe16(val)


@traced
def ibv_get_pkey_index(ctx: ibv_context, port_num: int, pkey: int) -> int:
    """Mirrors ibv_get_pkey_index(): the first index whose P_Key (both __be16) is
    pkey; -1 once the table runs out without it."""
    i = 0
    while True:
        try:
            if ibv_query_pkey(ctx, port_num, i) == pkey:
                return i
        except VerbsError:
            return -1
        i += 1


def _gid_entry(raw: bytes) -> ibv_gid_entry:
    e = ib_uverbs_gid_entry.unpack(raw)
    return ibv_gid_entry(e.gid, e.gid_index, e.port_num, e.gid_type, e.netdev_ifindex)


@traced
def ibv_query_gid_ex(ctx: ibv_context, port_num: int, gid_index: int,
                     flags: int = 0) -> tuple[int, ibv_gid_entry | None]:
    """Mirrors ibv_query_gid_ex() -> _ibv_query_gid_ex(): the ioctl
    UVERBS_METHOD_QUERY_GID_ENTRY into a caller's entry; returns (0, entry) or
    (errno, None) as the C function returns 0 or a positive errno (ENODATA for an
    empty slot, EINVAL for a bad port, index or flags)."""
    size = ib_uverbs_gid_entry.SIZE
    buf = posix_memalign(ctx.proc, 8, size)
    try:
        execute_ioctl(ctx, c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_GID_ENTRY,
                      [(c.UVERBS_ATTR_QUERY_GID_ENTRY_PORT, port_num, "in"),
                       (c.UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, gid_index, "in"),
                       (c.UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, flags, "in"),
                       (c.UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, (buf, size), "ptr_out")],
                      "ibv_query_gid_ex")
        return 0, _gid_entry(ctx.proc.load(buf, size))
    except VerbsError as e:
        return e.errno, None
    finally:
        free(ctx.proc, buf, size)


@traced
def ibv_query_gid_table(ctx: ibv_context, max_entries: int,
                        flags: int = 0) -> tuple[int, list[ibv_gid_entry]]:
    """Mirrors ibv_query_gid_table() -> _ibv_query_gid_table(): the ioctl
    UVERBS_METHOD_QUERY_GID_TABLE into an array of max_entries entries; returns
    (number of entries, the entries), or (-errno, []) as the C function returns
    -errno: -EINVAL when the valid GIDs do not fit (max_entries 0 included)."""
    size = ib_uverbs_gid_entry.SIZE
    length = size * max_entries
    buf = posix_memalign(ctx.proc, 8, max(length, 8))
    try:
        out = execute_ioctl(ctx, c.UVERBS_OBJECT_DEVICE, c.UVERBS_METHOD_QUERY_GID_TABLE,
                            [(c.UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, size, "in8"),
                             (c.UVERBS_ATTR_QUERY_GID_TABLE_FLAGS, flags, "in"),
                             (c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES, (buf, length),
                              "ptr_out"),
                             (c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES, 0, "out8")],
                            "ibv_query_gid_table")
        n = out[c.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES]
        raw = ctx.proc.load(buf, n * size) if n else b""
        return n, [_gid_entry(raw[i * size:(i + 1) * size]) for i in range(n)]
    except VerbsError as e:
        return -e.errno, []
    finally:
        free(ctx.proc, buf, max(length, 8))


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


@traced
def ibv_create_ah(pd: ibv_pd, attr: ibv_ah_attr) -> ibv_ah:
    """Mirrors ibv_create_ah(): the provider's address handle for attr (VerbsError
    with the errno on failure)."""
    return pd.context.ops.create_ah(pd, attr)


@traced
def ibv_destroy_ah(ah: ibv_ah) -> int:
    """Mirrors ibv_destroy_ah(): 0 or the errno."""
    return _errno_of(ah.context.ops.destroy_ah, ah)


_IPPROTO_UDP = 0x11


def _find_gid_index(ctx: ibv_context, port_num: int, gid: bytes, gid_type: int) -> int:
    """The port's GID table index holding gid with gid_type (ENOENT if none): what
    ibv_init_ah_from_wc looks the received destination GID up with."""
    for index in range(ctx.ops.query_port(ctx, port_num).gid_tbl_len):
        try:
            if ibv_query_gid(ctx, port_num, index) == gid and \
                    ibv_query_gid_type(ctx, port_num, index) == gid_type:
                return index
        except VerbsError:
            continue
    raise VerbsError(errno.ENOENT, "ibv_init_ah_from_wc: the GRH's destination GID")


@traced
def ibv_init_ah_from_wc(ctx: ibv_context, port_num: int, wc: Any, grh: bytes) -> ibv_ah_attr:
    """Mirrors ibv_init_ah_from_wc(): the address attributes that answer a received
    datagram - its source is the destination; with a GRH (IBV_WC_GRH) the local GID
    it was sent to, of the RoCE version its header says (UDP: v2), gives the
    sgid_index, its flow label and traffic class carry over and the hop limit is 0xff.
    A RoCE v2 IPv4 datagram's header is in the last 20 bytes of the 40 (its addresses
    as IPv4-mapped GIDs).  VerbsError on failure."""
    ah = ibv_ah_attr(dlid=wc.slid, sl=wc.sl, src_path_bits=wc.dlid_path_bits,
                     port_num=port_num)
    if not wc.wc_flags & IBV_WC_GRH:
        return ah
    grh = bytes(grh)
    ah.is_global = 1
    gid_type = IBV_GID_TYPE_SYSFS_ROCE_V2
    if not any(grh[:20]) and grh[20] >> 4 == 4:        # an IPv4 header
        mapped = bytes(10) + b"\xff\xff"
        ah.grh.dgid, local = mapped + grh[32:36], mapped + grh[36:40]
        ah.grh.traffic_class = grh[21]
    else:
        if grh[6] != _IPPROTO_UDP:
            gid_type = IBV_GID_TYPE_SYSFS_IB_ROCE_V1
        flow_class = int.from_bytes(grh[:4], "big")
        ah.grh.dgid, local = grh[8:24], grh[24:40]
        ah.grh.flow_label, ah.grh.traffic_class = flow_class & 0xFFFFF, flow_class >> 20 & 0xFF
    ah.grh.hop_limit = 0xFF
    ah.grh.sgid_index = _find_gid_index(ctx, port_num, local, gid_type)
    return ah


@traced
def ibv_create_ah_from_wc(pd: ibv_pd, wc: Any, grh: bytes, port_num: int) -> ibv_ah:
    """Mirrors ibv_create_ah_from_wc(): ibv_init_ah_from_wc, then ibv_create_ah."""
    return ibv_create_ah(pd, ibv_init_ah_from_wc(pd.context, port_num, wc, grh))


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
IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD = 5, 6
IBV_WR_LOCAL_INV, IBV_WR_BIND_MW, IBV_WR_SEND_WITH_INV = 7, 8, 9
IBV_SEND_FENCE, IBV_SEND_SIGNALED, IBV_SEND_SOLICITED, IBV_SEND_INLINE = 1, 2, 4, 8
IBV_WC_SEND, IBV_WC_RDMA_WRITE, IBV_WC_RDMA_READ = 0, 1, 2
IBV_WC_COMP_SWAP, IBV_WC_FETCH_ADD = 3, 4
IBV_WC_BIND_MW, IBV_WC_LOCAL_INV = 5, 6
IBV_WC_RECV, IBV_WC_RECV_RDMA_WITH_IMM = 128, 129
IBV_WC_GRH, IBV_WC_WITH_IMM, IBV_WC_WITH_INV = 1 << 0, 1 << 1, 1 << 3
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
    """Mirrors struct ibv_send_wr (the wr union flattened: wr.rdma's and wr.atomic's
    remote_addr/rkey are one pair, wr.atomic adds compare_add and swap)."""

    wr_id: int = 0
    next: ibv_send_wr | None = None
    sg_list: list[ibv_sge] = attrs.Factory(list)
    opcode: int = IBV_WR_SEND
    send_flags: int = 0
    imm_data: int = 0       # __be32: as it travels on the wire
    remote_addr: int = 0
    rkey: int = 0
    compare_add: int = 0    # wr.atomic (remote_addr and rkey shared with wr.rdma)
    swap: int = 0
    ah: Any = None          # wr.ud: the address handle, remote QPN and Q_Key of a UD send
    remote_qpn: int = 0
    remote_qkey: int = 0
    bind_mw: Any = None     # wr.bind_mw: ibv_bind_mw_wr (the window, its new rkey, the binding)
    remote_srqn: int = 0    # qp_type.xrc.remote_srqn: an XRC send's target SRQ

    @property
    def num_sge(self) -> int:
        return len(self.sg_list)

    @property
    def invalidate_rkey(self) -> int:
        """The union with imm_data: the rkey a LOCAL_INV / SEND_WITH_INV invalidates."""
        return self.imm_data

    @invalidate_rkey.setter
    def invalidate_rkey(self, rkey: int) -> None:
        self.imm_data = rkey


@attrs.define(eq=False)
class ibv_mw_bind_info:
    """Mirrors struct ibv_mw_bind_info: the MR range a window exposes, and how."""

    mr: Any = None
    addr: int = 0
    length: int = 0
    mw_access_flags: int = 0


@attrs.define(eq=False)
class ibv_mw_bind:
    """Mirrors struct ibv_mw_bind (ibv_bind_mw's request)."""

    wr_id: int = 0
    send_flags: int = 0
    bind_info: ibv_mw_bind_info = attrs.Factory(ibv_mw_bind_info)


@attrs.define(eq=False)
class ibv_bind_mw_wr:
    """Mirrors the wr.bind_mw member of struct ibv_send_wr."""

    mw: Any = None
    rkey: int = 0
    bind_info: ibv_mw_bind_info = attrs.Factory(ibv_mw_bind_info)


def ibv_inc_rkey(rkey: int) -> int:
    """Mirrors ibv_inc_rkey(): the same key index with the next 8-bit tag."""
    return (rkey & ~0xFF & 0xFFFFFFFF) | ((rkey + 1) & 0xFF)


@traced
def ibv_alloc_mw(pd: ibv_pd, mw_type: int) -> ibv_mw:
    """Mirrors ibv_alloc_mw(): the provider's alloc_mw (EOPNOTSUPP without one);
    VerbsError on failure."""
    if pd.context.ops.alloc_mw is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_alloc_mw")
    return pd.context.ops.alloc_mw(pd, mw_type)


@traced
def ibv_dealloc_mw(mw: ibv_mw) -> int:
    """Mirrors ibv_dealloc_mw(): 0 or the errno."""
    return _errno_of(mw.context.ops.dealloc_mw, mw)


@traced
def ibv_bind_mw(qp: ibv_qp, mw: ibv_mw, mw_bind: ibv_mw_bind) -> int:
    """Mirrors ibv_bind_mw(): bind a type 1 window through the QP's send queue (the
    provider's bind_mw); 0 or an errno - EINVAL for a type 2 window (bound by a
    BIND_MW work request instead)."""
    if mw.type != IBV_MW_TYPE_1:
        return errno.EINVAL
    return mw.context.ops.bind_mw(qp, mw, mw_bind)


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


# -- the new post-send API (verbs.h: struct ibv_qp_ex, the ibv_wr_* inline functions) --
@attrs.define
class ibv_data_buf:
    """Mirrors struct ibv_data_buf: inline data for ibv_wr_set_inline_data_list()."""

    addr: int
    length: int


_WR_OPS = ("wr_start", "wr_complete", "wr_abort", "wr_send", "wr_send_imm", "wr_send_inv",
           "wr_send_tso", "wr_rdma_write", "wr_rdma_write_imm", "wr_rdma_read",
           "wr_atomic_cmp_swp", "wr_atomic_fetch_add", "wr_atomic_write", "wr_flush",
           "wr_bind_mw", "wr_local_inv", "wr_set_sge", "wr_set_sge_list",
           "wr_set_inline_data", "wr_set_inline_data_list", "wr_set_ud_addr",
           "wr_set_xrc_srqn")


@attrs.define(eq=False)
class ibv_qp_ex:
    """Mirrors struct ibv_qp_ex: the QP (qp_base), the attributes of the next WR
    (wr_id, wr_flags) and the builder/setter ops the provider fills in for the
    send_ops_flags the QP was created with (None: the provider has none)."""

    qp_base: Any
    comp_mask: int = 0
    wr_id: int = 0
    wr_flags: int = 0
    ops: dict[str, Any] = attrs.Factory(dict)


def ibv_qp_to_qp_ex(qp: ibv_qp) -> ibv_qp_ex | None:
    """Mirrors ibv_qp_to_qp_ex(): the extended QP, or None when the QP was not
    created with IBV_QP_INIT_ATTR_SEND_OPS_FLAGS (VERBS_QP_EX unset)."""
    return qp.qp_ex


def _wr_op(qp: ibv_qp_ex, name: str) -> Any:
    op = qp.ops.get(name)
    if op is None:
        # EMU: C calls through the NULL pointer (a crash); here EOPNOTSUPP
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_{name}: the QP has no {name} op")
    return op


def ibv_wr_start(qp: ibv_qp_ex) -> None:
    """Mirrors ibv_wr_start(): begin a batch of WRs (the send queue is the caller's)."""
    _wr_op(qp, "wr_start")(qp)


def ibv_wr_complete(qp: ibv_qp_ex) -> int:
    """Mirrors ibv_wr_complete(): post the batch and ring the doorbell; 0 or the
    errno of the first failed builder/setter (then nothing of the batch is posted)."""
    return _wr_op(qp, "wr_complete")(qp)


def ibv_wr_abort(qp: ibv_qp_ex) -> None:
    """Mirrors ibv_wr_abort(): drop the batch."""
    _wr_op(qp, "wr_abort")(qp)


def ibv_wr_send(qp: ibv_qp_ex) -> None:
    _wr_op(qp, "wr_send")(qp)


def ibv_wr_send_imm(qp: ibv_qp_ex, imm_data: int) -> None:
    """imm_data is __be32, as in ibv_send_wr."""
    _wr_op(qp, "wr_send_imm")(qp, imm_data)


def ibv_wr_send_inv(qp: ibv_qp_ex, invalidate_rkey: int) -> None:
    _wr_op(qp, "wr_send_inv")(qp, invalidate_rkey)


def ibv_wr_rdma_write(qp: ibv_qp_ex, rkey: int, remote_addr: int) -> None:
    _wr_op(qp, "wr_rdma_write")(qp, rkey, remote_addr)


def ibv_wr_rdma_write_imm(qp: ibv_qp_ex, rkey: int, remote_addr: int, imm_data: int) -> None:
    _wr_op(qp, "wr_rdma_write_imm")(qp, rkey, remote_addr, imm_data)


def ibv_wr_rdma_read(qp: ibv_qp_ex, rkey: int, remote_addr: int) -> None:
    _wr_op(qp, "wr_rdma_read")(qp, rkey, remote_addr)


def ibv_wr_atomic_cmp_swp(qp: ibv_qp_ex, rkey: int, remote_addr: int, compare: int,
                          swap: int) -> None:
    _wr_op(qp, "wr_atomic_cmp_swp")(qp, rkey, remote_addr, compare, swap)


def ibv_wr_atomic_fetch_add(qp: ibv_qp_ex, rkey: int, remote_addr: int, add: int) -> None:
    _wr_op(qp, "wr_atomic_fetch_add")(qp, rkey, remote_addr, add)


def ibv_wr_bind_mw(qp: ibv_qp_ex, mw: Any, rkey: int, bind_info: Any) -> None:
    _wr_op(qp, "wr_bind_mw")(qp, mw, rkey, bind_info)


def ibv_wr_local_inv(qp: ibv_qp_ex, invalidate_rkey: int) -> None:
    _wr_op(qp, "wr_local_inv")(qp, invalidate_rkey)


def ibv_wr_set_sge(qp: ibv_qp_ex, lkey: int, addr: int, length: int) -> None:
    _wr_op(qp, "wr_set_sge")(qp, lkey, addr, length)


def ibv_wr_set_sge_list(qp: ibv_qp_ex, num_sge: int, sg_list: list[ibv_sge]) -> None:
    _wr_op(qp, "wr_set_sge_list")(qp, num_sge, sg_list)


def ibv_wr_set_inline_data(qp: ibv_qp_ex, addr: int, length: int) -> None:
    _wr_op(qp, "wr_set_inline_data")(qp, addr, length)


def ibv_wr_set_inline_data_list(qp: ibv_qp_ex, num_buf: int,
                                buf_list: list[ibv_data_buf]) -> None:
    _wr_op(qp, "wr_set_inline_data_list")(qp, num_buf, buf_list)


def ibv_wr_set_ud_addr(qp: ibv_qp_ex, ah: Any, remote_qpn: int, remote_qkey: int) -> None:
    _wr_op(qp, "wr_set_ud_addr")(qp, ah, remote_qpn, remote_qkey)


def ibv_wr_set_xrc_srqn(qp: ibv_qp_ex, remote_srqn: int) -> None:
    _wr_op(qp, "wr_set_xrc_srqn")(qp, remote_srqn)


def ibv_poll_cq(cq: ibv_cq, num_entries: int) -> list[ibv_wc]:
    """Mirrors ibv_poll_cq(): up to num_entries completions (a list, where C
    fills an array and returns the count).  Not traced: callers spin on it."""
    return cq.context.ops.poll_cq(cq, num_entries, ibv_wc)
