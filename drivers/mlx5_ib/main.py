"""Mirrors drivers/infiniband/hw/mlx5/main.c: user contexts, their UARs, and PDs.

(main.c is split here by concept: this file has the user context and the PD;
mmap.py the mmap handler and UAR objects; query.py the device and port
queries; probe.py the stage table and the ops; the module is __init__.py.)

A user context (ibv_open_device -> GET_CONTEXT -> mlx5_ib_alloc_ucontext)
sizes its BlueFlame register space from the library's request: bfregs come
two per 4 KiB UAR (the fast-path pair is never handed out this way), grouped
per *system page*; the static ones are backed by UARs allocated now
(allocate_uars), 1024 (or 512) dynamic slots are only reserved - rdma-core
maps them on demand with ALLOC_WC.  A library announcing MLX5_LIB_CAP_DYN_UAR
gets none of this and allocates UAR objects instead (mmap.py).

    calc_total_bfregs(16 requested, 4 KiB pages):
        static 16 bfregs = 8 system pages, dynamic 1024 = 512 pages,
        total 1040 bfregs in 520 system pages; resp.tot_bfregs = 16

# EMU: the `dyn_uar` module parameter (default off) makes the kernel ignore
# MLX5_LIB_CAP_DYN_UAR, as kernels before v5.8 did - the seed document's
# flow with 16 static bfregs; the real v5.8+ kernel honours the lib cap.

Lock order: bfregi.lock (mutex) is a leaf; dev.lb.mutex -> (the vport command).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from drivers.ib_core.ib_verbs import (
    IB_LINK_LAYER_ETHERNET,
    ib_copy_from_udata,
    ib_respond_udata,
    ib_udata,
)
from drivers.ib_core.uverbs_ioctl import uverbs_attr_ptr_len, uverbs_copy_to_buf
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN, MLX5_CAP_ROCE
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CMD_OP_ALLOC_PD,
    MLX5_GET,
    MLX5_ISEG_INTERNAL_TIMER_H,
    MLX5_MAX_BFREGS,
    MLX5_NON_FP_BFREGS_PER_UAR,
    MLX5_SET,
    IfcStruct,
)
from drivers.mlx5_core.vport import mlx5_nic_vport_update_local_lb, mlx5_query_min_inline
from drivers.mlx5_core.wc import mlx5_wc_support_get
from drivers.mlx5_ib.cmd import (
    mlx5_cmd_alloc_transport_domain,
    mlx5_cmd_dealloc_pd,
    mlx5_cmd_dealloc_transport_domain,
    mlx5_cmd_uar_alloc,
    mlx5_cmd_uar_dealloc,
)
from drivers.mlx5_ib.devx import mlx5_ib_devx_create, mlx5_ib_devx_destroy
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_INVALID_UAR_INDEX,
    PAGE_SHIFT,
    PAGE_SIZE,
    get_uars_per_sys_page,
    mlx5_bfreg_info,
    mlx5_ib_dev,
    mlx5_ib_pd,
    mlx5_ib_ucontext,
    mlx5_ib_warn,
    to_mdev,
)
from kernel_model.errno import EAGAIN, EINVAL, ENOMEM, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS,
    MLX5_IB_ALLOC_UCTX_DEVX,
    MLX5_IB_CLOCK_INFO_V1,
    MLX5_LIB_CAP_4K_UAR,
    MLX5_LIB_CAP_DYN_UAR,
    MLX5_USER_CMDS_SUPP_UHW_CREATE_AH,
    MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE,
    mlx5_ib_alloc_pd_resp,
    mlx5_ib_alloc_ucontext_req,
    mlx5_ib_alloc_ucontext_req_v2,
    mlx5_ib_alloc_ucontext_resp,
)
from kernel_model.uapi.rdma_user_ioctl import MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX

U32 = 0xFFFFFFFF
L1_CACHE_BYTES = 64  # x86 cache_line_size()
MLX5_TIMESTAMP_FORMAT_CAP_REAL_TIME = 1
MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING_AND_REAL_TIME = 2


def ALIGN(x: int, a: int) -> int:
    """Mirrors ALIGN() on a u32."""
    return ((x + a - 1) & ~(a - 1)) & U32


# -- bfreg sizing ------------------------------------------------------------------------
def calc_dynamic_bfregs(uars_per_sys_page: int) -> int:
    """Mirrors calc_dynamic_bfregs(): 512 dynamic slots when 4 KiB UARs cannot be
    packed into a larger system page, else 1024."""
    if uars_per_sys_page == 1 and PAGE_SIZE() > 4096:
        return 512  # MLX5_MIN_DYN_BFREGS
    return 1024  # MLX5_MAX_DYN_BFREGS


@traced
def calc_total_bfregs(dev: mlx5_ib_dev, lib_uar_4k: bool, req: mlx5_ib_alloc_ucontext_req_v2,
                      bfregi: mlx5_bfreg_info) -> None:
    """Mirrors calc_total_bfregs(): size the static + dynamic bfregs (u32 arithmetic).

    EINVAL for 0 bfregs, ENOMEM above MLX5_MAX_BFREGS (512), EINVAL when the
    low-latency ones would leave none.  Rounds req.total_num_bfregs up to a
    whole number of system pages (the caller reads it back).
    """
    if req.total_num_bfregs == 0:
        raise KernelError(EINVAL, "calc_total_bfregs: zero bfregs requested")
    if req.total_num_bfregs > MLX5_MAX_BFREGS:
        raise KernelError(ENOMEM, f"calc_total_bfregs: {req.total_num_bfregs} bfregs > "
                          f"{MLX5_MAX_BFREGS}")
    uars_per_sys_page = get_uars_per_sys_page(dev, lib_uar_4k)
    bfregs_per_sys_page = uars_per_sys_page * MLX5_NON_FP_BFREGS_PER_UAR
    req.total_num_bfregs = ALIGN(req.total_num_bfregs, bfregs_per_sys_page)
    if req.num_low_latency_bfregs > (req.total_num_bfregs - 1) & U32:
        raise KernelError(EINVAL, f"calc_total_bfregs: {req.num_low_latency_bfregs} low "
                          f"latency of {req.total_num_bfregs} bfregs")
    bfregi.num_static_sys_pages = req.total_num_bfregs // bfregs_per_sys_page
    bfregi.num_dyn_bfregs = ALIGN(calc_dynamic_bfregs(uars_per_sys_page), bfregs_per_sys_page)
    bfregi.total_num_bfregs = req.total_num_bfregs + bfregi.num_dyn_bfregs
    bfregi.num_sys_pages = bfregi.total_num_bfregs // bfregs_per_sys_page


@traced
def allocate_uars(dev: mlx5_ib_dev, context: mlx5_ib_ucontext) -> None:
    """Mirrors allocate_uars(): one FW UAR per static system page; the dynamic pages
    are marked MLX5_IB_INVALID_UAR_INDEX until mmapped.  A failure frees the
    ones already allocated, newest first."""
    bfregi = context.bfregi
    for i in range(bfregi.num_static_sys_pages):
        try:
            bfregi.sys_pages[i] = mlx5_cmd_uar_alloc(dev.mdev, context.devx_uid)
        except KernelError:
            for j in range(i - 1, -1, -1):  # error:
                _uar_dealloc_warn(dev, bfregi.sys_pages[j], context.devx_uid)
            raise
    sys_pages = bfregi.sys_pages
    for i in range(bfregi.num_static_sys_pages, bfregi.num_sys_pages):
        sys_pages[i] = MLX5_IB_INVALID_UAR_INDEX


def _uar_dealloc_warn(dev: mlx5_ib_dev, uarn: int, uid: int) -> None:
    try:
        mlx5_cmd_uar_dealloc(dev.mdev, uarn, uid)
    except KernelError as e:
        mlx5_ib_warn(dev, f"failed to free uar {uarn}: {e}")


@traced
def deallocate_uars(dev: mlx5_ib_dev, context: mlx5_ib_ucontext) -> None:
    """Mirrors deallocate_uars(): every static page, and every dynamic page that was
    mmapped (ALLOC_WC); a failing DEALLOC_UAR is ignored, as in the kernel."""
    bfregi = context.bfregi
    sys_pages, nstatic = bfregi.sys_pages, bfregi.num_static_sys_pages
    for i in range(bfregi.num_sys_pages):
        if i < nstatic or sys_pages[i] != MLX5_IB_INVALID_UAR_INDEX:
            _uar_dealloc_warn(dev, sys_pages[i], context.devx_uid)


# -- transport domain and loopback --------------------------------------------------------
def _lb_capable(dev: mlx5_ib_dev) -> bool:
    mdev = dev.mdev
    return MLX5_CAP_GEN(mdev, "port_type") == MLX5_CAP_PORT_TYPE_ETH and (
        MLX5_CAP_GEN(mdev, "disable_local_lb_uc") or MLX5_CAP_GEN(mdev, "disable_local_lb_mc"))


@traced
def mlx5_ib_enable_lb(dev: mlx5_ib_dev, td: bool, qp: bool) -> None:
    """Mirrors mlx5_ib_enable_lb(): loopback goes on with the second user TD (the
    first is the netdev's) or the first loopback QP."""
    lb = dev.lb
    with lb.mutex:
        lb.user_td += int(td)
        lb.qps += int(qp)
        if (lb.user_td == 2 or lb.qps == 1) and not lb.enabled:
            lb.enabled = True
            mlx5_nic_vport_update_local_lb(dev.mdev, True)


@traced
def mlx5_ib_disable_lb(dev: mlx5_ib_dev, td: bool, qp: bool) -> None:
    """Mirrors mlx5_ib_disable_lb()."""
    lb = dev.lb
    with lb.mutex:
        lb.user_td -= int(td)
        lb.qps -= int(qp)
        if lb.user_td == 1 and lb.qps == 0 and lb.enabled:
            lb.enabled = False
            try:
                mlx5_nic_vport_update_local_lb(dev.mdev, False)
            except KernelError as e:  # the kernel ignores the result here
                mlx5_ib_warn(dev, f"mlx5_ib_disable_lb: {e}")


@traced
def mlx5_ib_alloc_transport_domain(dev: mlx5_ib_dev, uid: int) -> int:
    """Mirrors mlx5_ib_alloc_transport_domain(): ALLOC_TRANSPORT_DOMAIN, then count a
    loopback user.  # kernel: an enable_lb failure returns the error with the TD
    still allocated (the caller does not free it)."""
    if not MLX5_CAP_GEN(dev.mdev, "log_max_transport_domain"):
        return 0
    tdn = mlx5_cmd_alloc_transport_domain(dev.mdev, uid)
    if _lb_capable(dev):
        mlx5_ib_enable_lb(dev, True, False)
    return tdn


@traced
def mlx5_ib_dealloc_transport_domain(dev: mlx5_ib_dev, tdn: int, uid: int) -> None:
    """Mirrors mlx5_ib_dealloc_transport_domain()."""
    if not MLX5_CAP_GEN(dev.mdev, "log_max_transport_domain"):
        return
    mlx5_cmd_dealloc_transport_domain(dev.mdev, tdn, uid)
    if _lb_capable(dev):
        mlx5_ib_disable_lb(dev, True, False)


# -- the context ---------------------------------------------------------------------------
def _rt_supported(ts_cap: int) -> bool:
    return ts_cap in (MLX5_TIMESTAMP_FORMAT_CAP_REAL_TIME,
                      MLX5_TIMESTAMP_FORMAT_CAP_FREE_RUNNING_AND_REAL_TIME)


@traced
def set_ucontext_resp(uctx: mlx5_ib_ucontext, resp: mlx5_ib_alloc_ucontext_resp) -> None:
    """Mirrors set_ucontext_resp(): the device limits and the context's bfreg layout.

    # EMU: ECE, REAL_TIME_TS and SQD2RTS (v5.8+) are reported only with the
    # `comp_mask_v6` module parameter and MKEY_UPDATE_TAG (v6.x, always set by
    # the real driver) only with `mkey_update_tag`: by default the response
    # is the seed's kernel's, comp_mask = CORE_CLOCK_OFFSET | DUMP_FILL_MKEY.
    """
    dev = to_mdev(uctx.device)
    mdev = dev.mdev
    bfregi = uctx.bfregi
    if MLX5_CAP_GEN(mdev, "dump_fill_mkey"):
        resp.dump_fill_mkey = dev.dump_fill_mkey
        resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY
    resp.qp_tab_size = 1 << MLX5_CAP_GEN(mdev, "log_max_qp")
    if mlx5_wc_support_get(mdev):
        resp.bf_reg_size = 1 << MLX5_CAP_GEN(mdev, "log_bf_reg_size")
    resp.cache_line_size = L1_CACHE_BYTES
    resp.max_sq_desc_sz = MLX5_CAP_GEN(mdev, "max_wqe_sz_sq")
    resp.max_rq_desc_sz = MLX5_CAP_GEN(mdev, "max_wqe_sz_rq")
    resp.max_send_wqebb = 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz")
    resp.max_recv_wr = 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz")
    resp.max_srq_recv_wr = 1 << MLX5_CAP_GEN(mdev, "log_max_srq_sz")
    resp.cqe_version = uctx.cqe_version
    uar_4k = MLX5_CAP_GEN(mdev, "uar_4k")
    resp.log_uar_size = MLX5_ADAPTER_PAGE_SHIFT if uar_4k else PAGE_SHIFT()
    resp.num_uars_per_page = MLX5_CAP_GEN(mdev, "num_of_uars_per_page") if uar_4k else 1
    resp.tot_bfregs = 0 if bfregi.lib_uar_dyn else \
        bfregi.total_num_bfregs - bfregi.num_dyn_bfregs
    resp.num_ports = dev.num_ports
    resp.cmds_supp_uhw |= MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE | \
        MLX5_USER_CMDS_SUPP_UHW_CREATE_AH
    if dev.ops.get_link_layer(dev, 1) == IB_LINK_LAYER_ETHERNET:
        resp.eth_min_inline = mlx5_query_min_inline(mdev) + 1
    if dev.clock_info is not None:
        resp.clock_info_versions = 1 << MLX5_IB_CLOCK_INFO_V1
    if PAGE_SIZE() <= 4096:  # nothing of the BAR beyond the first 4 KiB
        resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET
        resp.hca_core_clock_offset = MLX5_ISEG_INTERNAL_TIMER_H % PAGE_SIZE()
    if dev.comp_mask_v6:
        if MLX5_CAP_GEN(mdev, "ece_support"):
            resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE
        if _rt_supported(MLX5_CAP_GEN(mdev, "sq_ts_format")) and \
                _rt_supported(MLX5_CAP_GEN(mdev, "rq_ts_format")) and \
                _rt_supported(MLX5_CAP_ROCE(mdev, "qp_ts_format")):
            resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS
    resp.num_dyn_bfregs = bfregi.num_dyn_bfregs
    if dev.comp_mask_v6 and MLX5_CAP_GEN(mdev, "drain_sigerr"):
        resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS
    if dev.mkey_update_tag:
        resp.comp_mask |= MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG


def _read_request(udata: ib_udata) -> tuple[int, mlx5_ib_alloc_ucontext_req_v2]:
    """Steps 2-4 of mlx5_ib_alloc_ucontext: ABI version, copy, flag checks."""
    min_req_v2 = mlx5_ib_alloc_ucontext_req_v2.offsetof("max_cqe_version")
    if udata.inlen == mlx5_ib_alloc_ucontext_req.SIZE:
        ver = 0
    elif udata.inlen >= min_req_v2:
        ver = 2
    else:
        raise KernelError(EINVAL, f"mlx5_ib_alloc_ucontext: request of {udata.inlen} bytes")
    req = ib_copy_from_udata(mlx5_ib_alloc_ucontext_req_v2, udata,
                             min(udata.inlen, mlx5_ib_alloc_ucontext_req_v2.SIZE))
    if req.flags & ~MLX5_IB_ALLOC_UCTX_DEVX:
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_alloc_ucontext: flags {req.flags:#x}")
    if req.comp_mask or req.reserved0 or req.reserved1 or req.reserved2:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_alloc_ucontext: comp_mask/reserved set")
    return ver, req


@traced
def mlx5_ib_alloc_ucontext(uctx: mlx5_ib_ucontext, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_alloc_ucontext(), in the kernel's order of steps.

    EAGAIN before the device is active; EINVAL for a request length between
    v0 and v2 or too many low-latency bfregs (u32: a total of 0 passes here);
    EOPNOTSUPP for unknown flags or non-zero reserved fields; then
    calc_total_bfregs' errors, firmware errors, EFAULT for the response.
    Everything allocated is undone on failure (the kernel's goto ladder).
    The ABI version and low-latency count are recorded only on success.
    """
    dev = to_mdev(uctx.device)
    if not dev.ib_active:
        raise KernelError(EAGAIN, "mlx5_ib_alloc_ucontext: device not active")
    ver, req = _read_request(udata)
    req.total_num_bfregs = ALIGN(req.total_num_bfregs, MLX5_NON_FP_BFREGS_PER_UAR)
    if req.num_low_latency_bfregs > (req.total_num_bfregs - 1) & U32:
        raise KernelError(EINVAL, f"mlx5_ib_alloc_ucontext: {req.num_low_latency_bfregs} "
                          f"low latency of {req.total_num_bfregs} bfregs")
    bfregi = uctx.bfregi
    with ExitStack() as unwind:
        if req.flags & MLX5_IB_ALLOC_UCTX_DEVX:
            uctx.devx_uid = mlx5_ib_devx_create(dev, True)
            unwind.callback(mlx5_ib_devx_destroy, dev, uctx.devx_uid)  # out_devx:
        lib_uar_4k = bool(req.lib_caps & MLX5_LIB_CAP_4K_UAR)
        lib_uar_dyn = bool(req.lib_caps & MLX5_LIB_CAP_DYN_UAR) and dev.dyn_uar  # EMU: above
        if lib_uar_dyn:
            bfregi.lib_uar_dyn = True
        else:
            calc_total_bfregs(dev, lib_uar_4k, req, bfregi)
            bfregi.lib_uar_4k = lib_uar_4k
            bfregi.count = [0] * bfregi.total_num_bfregs          # kcalloc
            bfregi.sys_pages = [0] * bfregi.num_sys_pages          # kcalloc
            unwind.callback(_free_bfreg_arrays, bfregi)            # out_sys_pages/out_count:
            allocate_uars(dev, uctx)
            unwind.callback(deallocate_uars, dev, uctx)            # out_uars:
        uctx.tdn = mlx5_ib_alloc_transport_domain(dev, uctx.devx_uid)
        unwind.callback(mlx5_ib_dealloc_transport_domain, dev, uctx.tdn,
                        uctx.devx_uid)                             # out_mdev:
        uctx.cqe_version = min(MLX5_CAP_GEN(dev.mdev, "cqe_version"), req.max_cqe_version)
        resp = mlx5_ib_alloc_ucontext_resp()
        set_ucontext_resp(uctx, resp)
        resp.response_length = min(udata.outlen, mlx5_ib_alloc_ucontext_resp.SIZE)
        ib_respond_udata(udata, resp)
        unwind.pop_all()
    bfregi.ver = ver
    bfregi.num_low_latency_bfregs = req.num_low_latency_bfregs
    uctx.lib_caps = req.lib_caps


@traced
def mlx5_ib_query_ucontext(uctx: mlx5_ib_ucontext, attrs_: Any) -> None:
    """Mirrors mlx5_ib_query_ucontext(): the alloc_ucontext response of this context
    (set_ucontext_resp) into MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX, response_length the
    part that fits the caller's buffer, the rest of a longer one zeroed.

    EINVAL when the attribute is missing or shorter than the struct up to
    dump_fill_mkey (# EMU: the attribute spec ADD_UVERBS_ATTRIBUTES_SIMPLE adds to the
    core method is checked here, after the core wrote its outputs); EFAULT for a bad
    buffer."""
    length = uverbs_attr_ptr_len(attrs_, MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX,
                                 mlx5_ib_alloc_ucontext_resp.offsetof("dump_fill_mkey") + 4)
    resp = mlx5_ib_alloc_ucontext_resp()
    set_ucontext_resp(uctx, resp)
    resp.response_length = min(length, mlx5_ib_alloc_ucontext_resp.SIZE)
    uverbs_copy_to_buf(attrs_, MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX, resp.pack(), zero_tail=True)


def _free_bfreg_arrays(bfregi: mlx5_bfreg_info) -> None:
    bfregi.sys_pages = []
    bfregi.count = []


@traced
def mlx5_ib_dealloc_ucontext(uctx: mlx5_ib_ucontext) -> None:
    """Mirrors mlx5_ib_dealloc_ucontext(): transport domain, UARs, the bfreg arrays,
    the DEVX uid - in that order.  The doorbell pages are not walked: uverbs
    destroyed every QP and CQ before."""
    dev = to_mdev(uctx.device)
    try:
        mlx5_ib_dealloc_transport_domain(dev, uctx.tdn, uctx.devx_uid)
    except KernelError as e:  # void in the kernel: the result is not looked at
        mlx5_ib_warn(dev, f"mlx5_ib_dealloc_ucontext: {e}")
    deallocate_uars(dev, uctx)
    while uctx.busy_uars:  # EMU: see mlx5_ib_mmap_free; its users are destroyed by now
        _uar_dealloc_warn(dev, uctx.busy_uars.pop(0), uctx.devx_uid)
    _free_bfreg_arrays(uctx.bfregi)
    if uctx.devx_uid:
        try:
            mlx5_ib_devx_destroy(dev, uctx.devx_uid)
        except KernelError as e:
            mlx5_ib_warn(dev, f"mlx5_ib_dealloc_ucontext: {e}")


# -- PD ----------------------------------------------------------------------------------
def rdma_udata_to_drv_context(obj: Any) -> mlx5_ib_ucontext | None:
    """Mirrors rdma_udata_to_drv_context(): the user context a command runs in.

    # EMU: the kernel finds it from the udata's attribute bundle; here from the
    # object's uobject, which the core sets before calling the driver.
    """
    uobject = getattr(obj, "uobject", None)
    return None if uobject is None else uobject.context


@traced
def mlx5_ib_alloc_pd(pd: mlx5_ib_pd, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_alloc_pd(): ALLOC_PD with the context's uid; the pdn goes back
    in mlx5_ib_alloc_pd_resp (a failing copy frees the PD: EFAULT)."""
    dev = to_mdev(pd.device)
    context = rdma_udata_to_drv_context(pd)
    uid = context.devx_uid if context is not None else 0
    in_, out = IfcStruct("alloc_pd_in"), IfcStruct("alloc_pd_out")
    MLX5_SET("alloc_pd_in", in_, "opcode", MLX5_CMD_OP_ALLOC_PD)
    MLX5_SET("alloc_pd_in", in_, "uid", uid)
    mlx5_cmd_exec(dev.mdev, in_, out)
    pd.pdn = MLX5_GET("alloc_pd_out", out, "pd")
    pd.uid = uid
    if udata.outlen:
        try:
            ib_respond_udata(udata, mlx5_ib_alloc_pd_resp(pdn=pd.pdn))
        except KernelError:
            mlx5_cmd_dealloc_pd(dev.mdev, pd.pdn, uid)
            raise


@traced
def mlx5_ib_dealloc_pd(pd: mlx5_ib_pd, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_dealloc_pd(): DEALLOC_PD with the PD's uid."""
    mlx5_cmd_dealloc_pd(to_mdev(pd.device).mdev, pd.pdn, pd.uid)

