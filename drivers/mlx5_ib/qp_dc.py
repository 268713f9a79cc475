"""Mirrors the Dynamically Connected part of drivers/infiniband/hw/mlx5/qp.c (create_dct,
check_qp_attr, modify_dci_qp_is_ok, mlx5_ib_modify_dct, mlx5_ib_destroy_dct,
mlx5_ib_dct_query_qp) and the DCT commands of qpc.c (mlx5_core_create_dct,
mlx5_core_drain_dct, mlx5_core_destroy_dct, mlx5_core_dct_query).

ibv_create_qp of type IB_QPT_DRIVER carries the DC subtype in the vendor flags
(process_vendor_flags: MLX5_QP_FLAG_TYPE_DCI -> MLX5_IB_QPT_DCI, _TYPE_DCT ->
MLX5_IB_QPT_DCT):

    DCI   a send-only QP of service type DCI, created as a user QP (qp.py's
          create_user_qp) and moved through the usual transitions - with the
          attributes modify_dci_qp_is_ok allows, not ib_modify_qp_is_ok's.
    DCT   no queues and no firmware object at first: create_dct only starts the
          create_dct_in mailbox (PD, SRQ, CQ, access key, user index); RESET->INIT
          adds the access bits, P_Key index and port, INIT->RTR the MTU, the GID
          index and the GRH fields, then CREATE_DCT - the response tells user
          space the DCT's number (resp.dctn).  Destroy drains and destroys it.

Lock order: none here (one firmware command each; the DCT is on no QP list).
"""

from __future__ import annotations

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    IB_QP_ACCESS_FLAGS,
    IB_QP_AV,
    IB_QP_MAX_QP_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER,
    IB_QP_PATH_MTU,
    IB_QP_PKEY_INDEX,
    IB_QP_PORT,
    IB_QP_RETRY_CNT,
    IB_QP_RNR_RETRY,
    IB_QP_SQ_PSN,
    IB_QP_STATE,
    IB_QP_TIMEOUT,
    IB_QPS_ERR,
    IB_QPS_INIT,
    IB_QPS_RESET,
    IB_QPS_RTR,
    IB_QPS_RTS,
    RDMA_AH_ATTR_TYPE_ROCE,
    ib_copy_to_udata,
    ib_qp_attr,
    ib_qp_init_attr,
    ib_udata,
)
from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_DCT,
    MLX5_CMD_OP_DESTROY_DCT,
    MLX5_CMD_OP_DRAIN_DCT,
    MLX5_CMD_OP_QUERY_DCT,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_QPT_DCI,
    MLX5_IB_QPT_DCT,
    mlx5_core_dct,
    mlx5_ib_dev,
    mlx5_ib_qp,
    mlx5_ib_warn,
    to_mcq,
    to_mdev,
    to_mpd,
)
from drivers.mlx5_ib.srq import to_msrq
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi

MLX5_ATOMIC_MODE_IB_COMP = 1


def is_valid_mask(mask: int, req: int, opt: int) -> bool:
    """Mirrors is_valid_mask(): every required bit, nothing beyond required and optional."""
    return mask & req == req and not mask & ~(req | opt)


def modify_dci_qp_is_ok(cur_state: int, new_state: int, attr_mask: int) -> bool:
    """Mirrors modify_dci_qp_is_ok(): the transitions a DCI takes and their masks
    (a DCI has no remote QP, no receive side: no AV, no receive PSN)."""
    req, opt = IB_QP_STATE, 0
    if new_state == IB_QPS_RESET:
        return is_valid_mask(attr_mask, req, opt)
    if cur_state == IB_QPS_RESET and new_state == IB_QPS_INIT:
        return is_valid_mask(attr_mask, req | IB_QP_PKEY_INDEX | IB_QP_PORT, opt)
    if cur_state == IB_QPS_INIT and new_state == IB_QPS_INIT:
        return is_valid_mask(attr_mask, req, IB_QP_PKEY_INDEX | IB_QP_PORT)
    if cur_state == IB_QPS_INIT and new_state == IB_QPS_RTR:
        return is_valid_mask(attr_mask, req | IB_QP_PATH_MTU, IB_QP_PKEY_INDEX | IB_QP_AV)
    if cur_state == IB_QPS_RTR and new_state == IB_QPS_RTS:
        return is_valid_mask(attr_mask, req | IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY
                             | IB_QP_MAX_QP_RD_ATOMIC | IB_QP_SQ_PSN, IB_QP_MIN_RNR_TIMER)
    if cur_state == IB_QPS_RTS and new_state == IB_QPS_RTS:
        return is_valid_mask(attr_mask, req, IB_QP_MIN_RNR_TIMER)
    if cur_state != IB_QPS_RESET and new_state == IB_QPS_ERR:
        return is_valid_mask(attr_mask, req, opt)
    return False


def check_qp_attr(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr) -> None:
    """Mirrors check_qp_attr() for the DC types: a DCT needs an SRQ and a receive
    CQ, a DCI has no receive queue (EINVAL)."""
    if qp.type == MLX5_IB_QPT_DCT and (attr.srq is None or attr.recv_cq is None):
        raise KernelError(EINVAL, f"check_qp_attr: QP type {qp.type:#x} has wrong attributes "
                          "(a DCT needs an SRQ and a receive CQ)")
    if qp.type == MLX5_IB_QPT_DCI and (attr.cap.max_recv_wr or attr.cap.max_recv_sge):
        raise KernelError(EINVAL, f"check_qp_attr: QP type {qp.type:#x} has wrong attributes "
                          "(a DCI has no receive queue)")


@traced
def create_dct(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_init_attr,
               ucmd: abi.mlx5_ib_create_qp, uidx: int) -> None:
    """Mirrors create_dct(): the create_dct_in mailbox with the DCT's PD (and its
    uid), SRQ, receive CQ, access key (the request's buf_addr union member) and
    user index; the QP is in RESET and has no number yet.
    # EMU: no LAG (the lag_dct check), and scatter-to-CQE (cs_res) is not modelled."""
    pd = to_mpd(qp.pd)
    in_ = IfcStruct("create_dct_in")
    MLX5_SET("create_dct_in", in_, "uid", pd.uid)
    dctc = MLX5_ADDR_OF("create_dct_in", in_, "dct_context_entry")
    MLX5_SET("dctc", dctc, "pd", pd.pdn)
    MLX5_SET("dctc", dctc, "srqn_xrqn", to_msrq(attr.srq).msrq.srqn)
    MLX5_SET("dctc", dctc, "cqn", to_mcq(attr.recv_cq).mcq.cqn)
    MLX5_SET64("dctc", dctc, "dc_access_key", ucmd.buf_addr)   # union: access_key
    MLX5_SET("dctc", dctc, "user_index", uidx)
    if MLX5_CAP_GEN(dev.mdev, "ece_support"):
        MLX5_SET("dctc", dctc, "ece", ucmd.ece_options)
    qp.dct.in_ = in_
    qp.state = IB_QPS_RESET


# -- the firmware commands (qpc.c) --------------------------------------------------------
@traced
def mlx5_core_create_dct(dev: mlx5_ib_dev, dct: mlx5_core_dct, in_: IfcStruct) -> IfcStruct:
    """Mirrors mlx5_core_create_dct(): CREATE_DCT; the dctn and uid; returns the output."""
    out = IfcStruct("create_dct_out")
    MLX5_SET("create_dct_in", in_, "opcode", MLX5_CMD_OP_CREATE_DCT)
    mlx5_cmd_exec(dev.mdev, in_, out)
    dct.mqp.qpn = MLX5_GET("create_dct_out", out, "dctn")
    dct.mqp.uid = MLX5_GET("create_dct_in", in_, "uid")
    return out


@traced
def mlx5_core_drain_dct(dev: mlx5_ib_dev, dct: mlx5_core_dct) -> None:
    """Mirrors mlx5_core_drain_dct(): DRAIN_DCT."""
    in_ = IfcStruct("drain_dct_in")
    MLX5_SET("drain_dct_in", in_, "opcode", MLX5_CMD_OP_DRAIN_DCT)
    MLX5_SET("drain_dct_in", in_, "dctn", dct.mqp.qpn)
    MLX5_SET("drain_dct_in", in_, "uid", dct.mqp.uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("drain_dct_out"))


@traced
def mlx5_core_destroy_dct(dev: mlx5_ib_dev, dct: mlx5_core_dct) -> None:
    """Mirrors mlx5_core_destroy_dct(): drain, then DESTROY_DCT.
    # EMU: the DCT_DRAINED event it waits for between the two is not modelled
    # (the firmware model drains at once)."""
    mlx5_core_drain_dct(dev, dct)
    in_ = IfcStruct("destroy_dct_in")
    MLX5_SET("destroy_dct_in", in_, "opcode", MLX5_CMD_OP_DESTROY_DCT)
    MLX5_SET("destroy_dct_in", in_, "dctn", dct.mqp.qpn)
    MLX5_SET("destroy_dct_in", in_, "uid", dct.mqp.uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("destroy_dct_out"))


@traced
def mlx5_core_dct_query(dev: mlx5_ib_dev, dct: mlx5_core_dct) -> IfcStruct:
    """Mirrors mlx5_core_dct_query(): QUERY_DCT.
    # EMU: the uid is sent, as for QUERY_QP (mlx5_core_qp_query)."""
    in_, out = IfcStruct("query_dct_in"), IfcStruct("query_dct_out")
    MLX5_SET("query_dct_in", in_, "opcode", MLX5_CMD_OP_QUERY_DCT)
    MLX5_SET("query_dct_in", in_, "dctn", dct.mqp.qpn)
    MLX5_SET("query_dct_in", in_, "uid", dct.mqp.uid)
    mlx5_cmd_exec(dev.mdev, in_, out)
    return out


# -- modify, destroy, query ----------------------------------------------------------------
def _dct_atomic_mode(dev: mlx5_ib_dev) -> int:
    """Mirrors get_atomic_mode(dev, MLX5_IB_QPT_DCT): -EOPNOTSUPP without atomics.
    # EMU: the atomic capability page is not modelled (as for a QP's)."""
    return MLX5_ATOMIC_MODE_IB_COMP if MLX5_CAP_GEN(dev.mdev, "atomic") else -EOPNOTSUPP


@traced
def mlx5_ib_modify_dct(qp: mlx5_ib_qp, attr: ib_qp_attr, attr_mask: int,
                       ucmd: abi.mlx5_ib_modify_qp, udata: ib_udata | None) -> None:
    """Mirrors mlx5_ib_modify_dct(): only RESET->INIT (access bits, P_Key index, port:
    all required) and INIT->RTR (minimum RNR timer, AV, MTU: required; then
    CREATE_DCT, and the response carries the DCT's number).  EINVAL for anything
    else, a missing or extra attribute, a bad port, a response too short for the
    dctn; EOPNOTSUPP for remote atomics without them.  A response that cannot be
    written destroys the DCT again."""
    dev = to_mdev(qp.device)
    if not attr_mask & IB_QP_STATE:
        raise KernelError(EINVAL, "mlx5_ib_modify_dct: no IB_QP_STATE")
    cur_state, new_state = qp.state, attr.qp_state
    dctc = MLX5_ADDR_OF("create_dct_in", qp.dct.in_, "dct_context_entry")
    if MLX5_CAP_GEN(dev.mdev, "ece_support") and ucmd.ece_options:
        MLX5_SET("dctc", dctc, "ece", ucmd.ece_options)
    if cur_state == IB_QPS_RESET and new_state == IB_QPS_INIT:
        if not is_valid_mask(attr_mask, IB_QP_STATE | IB_QP_ACCESS_FLAGS | IB_QP_PKEY_INDEX
                             | IB_QP_PORT, 0):
            raise KernelError(EINVAL, f"mlx5_ib_modify_dct: attr_mask {attr_mask:#x} for "
                              "RESET->INIT")
        if not 1 <= attr.port_num <= dev.num_ports:
            raise KernelError(EINVAL, f"mlx5_ib_modify_dct: invalid port number "
                              f"{attr.port_num}. number of ports is {dev.num_ports}")
        if attr.qp_access_flags & IB_ACCESS_REMOTE_READ:
            MLX5_SET("dctc", dctc, "rre", 1)
        if attr.qp_access_flags & IB_ACCESS_REMOTE_WRITE:
            MLX5_SET("dctc", dctc, "rwe", 1)
        if attr.qp_access_flags & IB_ACCESS_REMOTE_ATOMIC:
            atomic_mode = _dct_atomic_mode(dev)
            if atomic_mode < 0:
                raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_dct: no remote atomics")
            MLX5_SET("dctc", dctc, "atomic_mode", atomic_mode)
            MLX5_SET("dctc", dctc, "rae", 1)
        MLX5_SET("dctc", dctc, "pkey_index", attr.pkey_index)
        MLX5_SET("dctc", dctc, "port", attr.port_num)
        # counter_set_id = mlx5_ib_get_counters_id()  # EMU: no Q counters: 0
    elif cur_state == IB_QPS_INIT and new_state == IB_QPS_RTR:
        resp = abi.mlx5_ib_modify_qp_resp()
        min_resp_len = abi.mlx5_ib_modify_qp_resp.offsetof("dctn") + 4
        outlen = udata.outlen if udata is not None else 0
        if outlen < min_resp_len:
            raise KernelError(EINVAL, f"mlx5_ib_modify_dct: response of {outlen} bytes has "
                              "no room for the dctn")
        resp.response_length = min_resp_len if outlen < resp.SIZE else resp.SIZE
        if not is_valid_mask(attr_mask, IB_QP_STATE | IB_QP_MIN_RNR_TIMER | IB_QP_AV
                             | IB_QP_PATH_MTU, 0):
            raise KernelError(EINVAL, f"mlx5_ib_modify_dct: attr_mask {attr_mask:#x} for "
                              "INIT->RTR")
        grh = attr.ah_attr.grh
        MLX5_SET("dctc", dctc, "min_rnr_nak", attr.min_rnr_timer)
        MLX5_SET("dctc", dctc, "tclass", grh.traffic_class)
        MLX5_SET("dctc", dctc, "flow_label", grh.flow_label)
        MLX5_SET("dctc", dctc, "mtu", attr.path_mtu)
        MLX5_SET("dctc", dctc, "my_addr_index", grh.sgid_index)
        MLX5_SET("dctc", dctc, "hop_limit", grh.hop_limit)
        if attr.ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE:
            MLX5_SET("dctc", dctc, "eth_prio", attr.ah_attr.sl & 0x7)
        out = mlx5_core_create_dct(dev, qp.dct.mdct, qp.dct.in_)
        resp.dctn = qp.dct.mdct.mqp.qpn
        if MLX5_CAP_GEN(dev.mdev, "ece_support"):
            resp.ece_options = MLX5_GET("create_dct_out", out, "ece")
        try:
            ib_copy_to_udata(udata, resp.pack(), resp.response_length)
        except KernelError:
            mlx5_core_destroy_dct(dev, qp.dct.mdct)
            raise
        qp.qp_num = resp.dctn        # EMU: the kernel's ibqp.qp_num stays 0 for a DCT
    else:
        mlx5_ib_warn(dev, f"Modify DCT: Invalid transition from {cur_state} to {new_state}")
        raise KernelError(EINVAL, f"mlx5_ib_modify_dct: invalid transition from {cur_state} "
                          f"to {new_state}")
    qp.state = new_state


@traced
def mlx5_ib_destroy_dct(qp: mlx5_ib_qp) -> None:
    """Mirrors mlx5_ib_destroy_dct(): a DCT that reached RTR exists in the firmware -
    drain and destroy it (a failure is warned about and fails the destroy); then
    the mailbox goes."""
    dev = to_mdev(qp.device)
    if qp.state == IB_QPS_RTR:
        try:
            mlx5_core_destroy_dct(dev, qp.dct.mdct)
        except KernelError as e:
            mlx5_ib_warn(dev, f"failed to destroy DCT {e}")
            raise
    qp.dct.in_ = None


@traced
def mlx5_ib_dct_query_qp(dev: mlx5_ib_dev, qp: mlx5_ib_qp, qp_attr: ib_qp_attr,
                         qp_attr_mask: int) -> None:
    """Mirrors mlx5_ib_dct_query_qp(): EINVAL for an attribute a DCT has not or a
    DCT not in RTR; else QUERY_DCT and the attributes the mask names."""
    supported = IB_QP_STATE | IB_QP_ACCESS_FLAGS | IB_QP_PORT | IB_QP_MIN_RNR_TIMER | \
        IB_QP_AV | IB_QP_PATH_MTU | IB_QP_PKEY_INDEX
    if qp_attr_mask & ~supported:
        raise KernelError(EINVAL, f"mlx5_ib_dct_query_qp: attr_mask {qp_attr_mask:#x}")
    if qp.state != IB_QPS_RTR:
        raise KernelError(EINVAL, "mlx5_ib_dct_query_qp: the DCT is not in RTR")
    out = mlx5_core_dct_query(dev, qp.dct.mdct)
    dctc = MLX5_ADDR_OF("query_dct_out", out, "dct_context_entry")
    if qp_attr_mask & IB_QP_STATE:
        qp_attr.qp_state = IB_QPS_RTR
    if qp_attr_mask & IB_QP_ACCESS_FLAGS:
        for bit, field in ((IB_ACCESS_REMOTE_READ, "rre"), (IB_ACCESS_REMOTE_WRITE, "rwe"),
                           (IB_ACCESS_REMOTE_ATOMIC, "rae")):
            if dctc[field]:
                qp_attr.qp_access_flags |= bit
    if qp_attr_mask & IB_QP_PORT:
        qp_attr.port_num = dctc["port"]
    if qp_attr_mask & IB_QP_MIN_RNR_TIMER:
        qp_attr.min_rnr_timer = dctc["min_rnr_nak"]
    if qp_attr_mask & IB_QP_AV:
        grh = qp_attr.ah_attr.grh
        grh.traffic_class, grh.flow_label = dctc["tclass"], dctc["flow_label"]
        grh.sgid_index, grh.hop_limit = dctc["my_addr_index"], dctc["hop_limit"]
    if qp_attr_mask & IB_QP_PATH_MTU:
        qp_attr.path_mtu = dctc["mtu"]
    if qp_attr_mask & IB_QP_PKEY_INDEX:
        qp_attr.pkey_index = dctc["pkey_index"]
