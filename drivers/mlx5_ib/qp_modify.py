"""Mirrors the modify and query part of drivers/infiniband/hw/mlx5/qp.c (qp.py has create
and destroy): mlx5_ib_modify_qp, __mlx5_ib_modify_qp, mlx5_set_path, mlx5_ib_query_qp.

ibv_modify_qp reaches the driver after ib_core's checks (the transition's
attribute mask against qp_state_table is the driver's job; the core resolved
the source GID entry and the destination MAC):

    mlx5_ib_modify_qp    the udata (only the extended command carries one) ->
                         qp->mutex -> ib_modify_qp_is_ok -> port, P_Key index,
                         rd_atomic depths -> (RESET to RESET: nothing to do)
    __mlx5_ib_modify_qp  a fresh QPC with what this transition brings: st,
                         pm_state, mtu, remote_qpn, the address path
                         (mlx5_set_path: GID index, hop limit, traffic class,
                         flow label, dgid, dmac, UDP source port, port, ack
                         timeout), pd and CQs, retry/rnr, PSNs, rd_atomic
                         depths, the rwe/rre/rae access bits, min_rnr_nak,
                         q_key, the doorbell record at RST2INIT;
                         optab[cur][new] picks the command and
                         ib_mask_to_mlx5_opt(mask) & opt_mask[cur][new][st] the
                         optional fields it may change
    mlx5_core_qp_modify  (qpc.c) the command; qp->state moves only once the
                         firmware agreed

The firmware refuses a transition from the wrong state (BAD_QP_STATE ->
EINVAL) and keeps the context that QUERY_QP (mlx5_ib_query_qp) reads back.
# EMU: LAG port affinity, Q counters (counter_set_id stays 0), rate limits,
# GSI QPs and kernel QPs (the CQ cleaning on RESET) are not modelled.  A DCT has its
# own two transitions (qp_dc.py's mlx5_ib_modify_dct); a DCI's masks are
# modify_dci_qp_is_ok's, its QPC is built here with service type DCI.
# A RAW_PACKET QP's transitions move its SQ and RQ (qp_raw.py).

Lock order: qp->mutex -> the firmware command (cmd.lock).
"""

from __future__ import annotations

import attrs

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    IB_AH_GRH,
    IB_GID_TYPE_ROCE_UDP_ENCAP,
    IB_MIG_ARMED,
    IB_MIG_MIGRATED,
    IB_MIG_REARM,
    IB_MTU_256,
    IB_MTU_4096,
    IB_QP_ACCESS_FLAGS,
    IB_QP_ALT_PATH,
    IB_QP_ATTR_STANDARD_BITS,
    IB_QP_AV,
    IB_QP_CUR_STATE,
    IB_QP_DEST_QPN,
    IB_QP_MAX_DEST_RD_ATOMIC,
    IB_QP_MAX_QP_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER,
    IB_QP_PATH_MIG_STATE,
    IB_QP_PATH_MTU,
    IB_QP_PKEY_INDEX,
    IB_QP_PORT,
    IB_QP_QKEY,
    IB_QP_RATE_LIMIT,
    IB_QP_RETRY_CNT,
    IB_QP_RNR_RETRY,
    IB_QP_RQ_PSN,
    IB_QP_SQ_PSN,
    IB_QP_STATE,
    IB_QP_TIMEOUT,
    IB_QPS_ERR,
    IB_QPS_INIT,
    IB_QPS_RESET,
    IB_QPS_RTR,
    IB_QPS_RTS,
    IB_QPS_SQD,
    IB_QPS_SQE,
    IB_QPT_RAW_PACKET,
    IB_QPT_RC,
    IB_QPT_UC,
    IB_QPT_UD,
    IB_QPT_XRC_INI,
    IB_QPT_XRC_TGT,
    IB_RATE_2_5_GBPS,
    IB_RATE_800_GBPS,
    IB_RATE_PORT_CURRENT,
    IB_SIGNAL_ALL_WR,
    IB_SIGNAL_REQ_WR,
    RDMA_AH_ATTR_TYPE_IB,
    RDMA_AH_ATTR_TYPE_ROCE,
    ib_copy_from_udata,
    ib_copy_to_udata,
    ib_is_udata_cleared,
    ib_qp_attr,
    ib_qp_init_attr,
    ib_udata,
    rdma_ah_attr,
    rdma_ah_find_type,
    rdma_calc_flow_label,
    rdma_flow_label_to_udp_sport,
)
from drivers.ib_core.verbs import ib_modify_qp_is_ok
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_2ERR_QP,
    MLX5_CMD_OP_2RST_QP,
    MLX5_CMD_OP_INIT2INIT_QP,
    MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_RST2INIT_QP,
    MLX5_CMD_OP_RTR2RTS_QP,
    MLX5_CMD_OP_RTS2RTS_QP,
    MLX5_CMD_OP_SQD_RTS_QP,
    MLX5_CMD_OP_SQERR2RTS_QP,
    MLX5_GET,
    MLX5_QP_OPTPAR_ACK_TIMEOUT,
    MLX5_QP_OPTPAR_ALT_ADDR_PATH,
    MLX5_QP_OPTPAR_CQN_RCV,
    MLX5_QP_OPTPAR_DC_KEY,
    MLX5_QP_OPTPAR_LAG_TX_AFF,
    MLX5_QP_OPTPAR_PKEY_INDEX,
    MLX5_QP_OPTPAR_PM_STATE,
    MLX5_QP_OPTPAR_PRI_PORT,
    MLX5_QP_OPTPAR_PRIMARY_ADDR_PATH,
    MLX5_QP_OPTPAR_Q_KEY,
    MLX5_QP_OPTPAR_RAE,
    MLX5_QP_OPTPAR_RETRY_COUNT,
    MLX5_QP_OPTPAR_RNR_RETRY,
    MLX5_QP_OPTPAR_RNR_TIMEOUT,
    MLX5_QP_OPTPAR_RRA_MAX,
    MLX5_QP_OPTPAR_RRE,
    MLX5_QP_OPTPAR_RWE,
    MLX5_QP_OPTPAR_SRA_MAX,
    MLX5_QP_OPTPAR_SRQN,
    MLX5_QPC_ST_DCI,
    MLX5_QPC_ST_RC,
    MLX5_QPC_ST_UC,
    MLX5_QPC_ST_UD,
    MLX5_QPC_ST_XRC,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_IB_QPT_DCI,
    MLX5_IB_QPT_DCT,
    mlx5_ib_dev,
    mlx5_ib_qp,
    mlx5_ib_warn,
    to_mcq,
    to_mdev,
    to_mpd,
)
from drivers.mlx5_ib.qp import _MLX5_ST, MLX5_QP_PM_MIGRATED, MLX5_WQE_CTRL_CQ_UPDATE
from drivers.mlx5_ib.qp_dc import (
    mlx5_ib_dct_query_qp,
    mlx5_ib_modify_dct,
    modify_dci_qp_is_ok,
)
from drivers.mlx5_ib.qp_raw import modify_raw_packet_qp, query_raw_packet_qp_state
from drivers.mlx5_ib.qpc import mlx5_core_qp_modify, mlx5_core_qp_query
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uapi import mlx5_abi as abi

# include/linux/mlx5/qp.h: enum mlx5_qp_state (the driver's numbering; optab's index)
MLX5_QP_STATE_RST, MLX5_QP_STATE_INIT, MLX5_QP_STATE_RTR, MLX5_QP_STATE_RTS = 0, 1, 2, 3
MLX5_QP_STATE_SQER, MLX5_QP_STATE_SQD, MLX5_QP_STATE_ERR = 4, 5, 6
MLX5_QP_STATE_SQ_DRAINING = 7
MLX5_QP_PM_ARMED, MLX5_QP_PM_REARM = 0x0, 0x1
MLX5_ATOMIC_MODE_IB_COMP = 1
MLX5_IB_ACK_REQ_FREQ = 8
MLX5_STAT_RATE_OFFSET = 5
# enum ib_rate values mlx5 encodes specially
IB_RATE_25_GBPS, IB_RATE_50_GBPS, IB_RATE_56_GBPS = 15, 20, 12
IB_RATE_100_GBPS, IB_RATE_200_GBPS, IB_RATE_400_GBPS = 16, 17, 21

_TO_MLX5_STATE = {IB_QPS_RESET: MLX5_QP_STATE_RST, IB_QPS_INIT: MLX5_QP_STATE_INIT,
                  IB_QPS_RTR: MLX5_QP_STATE_RTR, IB_QPS_RTS: MLX5_QP_STATE_RTS,
                  IB_QPS_SQD: MLX5_QP_STATE_SQD, IB_QPS_SQE: MLX5_QP_STATE_SQER,
                  IB_QPS_ERR: MLX5_QP_STATE_ERR}
#: the firmware's QPC state -> enum ib_qp_state (to_ib_qp_state; the QPC says SQD as 7)
_TO_IB_STATE = {0: IB_QPS_RESET, 1: IB_QPS_INIT, 2: IB_QPS_RTR, 3: IB_QPS_RTS, 4: IB_QPS_SQE,
                5: IB_QPS_SQD, 6: IB_QPS_ERR, 7: IB_QPS_SQD}

_RST, _INIT, _RTR, _RTS = MLX5_QP_STATE_RST, MLX5_QP_STATE_INIT, MLX5_QP_STATE_RTR, \
    MLX5_QP_STATE_RTS
_SQER, _SQD, _ERR = MLX5_QP_STATE_SQER, MLX5_QP_STATE_SQD, MLX5_QP_STATE_ERR
#: Mirrors __mlx5_ib_modify_qp's optab: (cur, new) -> the command (absent: EINVAL).
#: Note there is no RTS -> SQD: mlx5 cannot drain a send queue on request.
optab: dict[tuple[int, int], int] = {
    **{(s, _RST): MLX5_CMD_OP_2RST_QP for s in (_RST, _INIT, _RTR, _RTS, _SQD, _SQER, _ERR)},
    **{(s, _ERR): MLX5_CMD_OP_2ERR_QP for s in (_RST, _INIT, _RTR, _RTS, _SQD, _SQER, _ERR)},
    (_RST, _INIT): MLX5_CMD_OP_RST2INIT_QP, (_INIT, _INIT): MLX5_CMD_OP_INIT2INIT_QP,
    (_INIT, _RTR): MLX5_CMD_OP_INIT2RTR_QP, (_RTR, _RTS): MLX5_CMD_OP_RTR2RTS_QP,
    (_RTS, _RTS): MLX5_CMD_OP_RTS2RTS_QP, (_SQD, _RTS): MLX5_CMD_OP_SQD_RTS_QP,
    (_SQER, _RTS): MLX5_CMD_OP_SQERR2RTS_QP,
}

_RC, _UC, _UD, _XRC = MLX5_QPC_ST_RC, MLX5_QPC_ST_UC, MLX5_QPC_ST_UD, MLX5_QPC_ST_XRC
_RRAW = MLX5_QP_OPTPAR_RRE | MLX5_QP_OPTPAR_RAE | MLX5_QP_OPTPAR_RWE
#: Mirrors opt_mask[cur][new][st]: the optional fields each transition may change
opt_mask: dict[tuple[int, int], dict[int, int]] = {
    (_INIT, _INIT): {
        _RC: _RRAW | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_PRI_PORT
        | MLX5_QP_OPTPAR_LAG_TX_AFF,
        _UC: MLX5_QP_OPTPAR_RWE | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_PRI_PORT
        | MLX5_QP_OPTPAR_LAG_TX_AFF,
        _UD: MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_Q_KEY | MLX5_QP_OPTPAR_PRI_PORT,
        _XRC: _RRAW | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_PRI_PORT
        | MLX5_QP_OPTPAR_LAG_TX_AFF},
    (_INIT, _RTR): {
        _RC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | _RRAW | MLX5_QP_OPTPAR_PKEY_INDEX
        | MLX5_QP_OPTPAR_LAG_TX_AFF,
        _UC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | MLX5_QP_OPTPAR_RWE | MLX5_QP_OPTPAR_PKEY_INDEX
        | MLX5_QP_OPTPAR_LAG_TX_AFF,
        _UD: MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_Q_KEY,
        _XRC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | _RRAW | MLX5_QP_OPTPAR_PKEY_INDEX
        | MLX5_QP_OPTPAR_LAG_TX_AFF},
    (_RTR, _RTS): {
        _RC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | _RRAW | MLX5_QP_OPTPAR_PM_STATE
        | MLX5_QP_OPTPAR_RNR_TIMEOUT,
        _UC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | MLX5_QP_OPTPAR_RWE | MLX5_QP_OPTPAR_PM_STATE,
        _UD: MLX5_QP_OPTPAR_Q_KEY,
        _XRC: MLX5_QP_OPTPAR_ALT_ADDR_PATH | _RRAW | MLX5_QP_OPTPAR_PM_STATE
        | MLX5_QP_OPTPAR_RNR_TIMEOUT},
    (_RTS, _RTS): {
        _RC: _RRAW | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_PM_STATE
        | MLX5_QP_OPTPAR_ALT_ADDR_PATH,
        _UC: MLX5_QP_OPTPAR_RWE | MLX5_QP_OPTPAR_PM_STATE | MLX5_QP_OPTPAR_ALT_ADDR_PATH,
        _UD: MLX5_QP_OPTPAR_Q_KEY | MLX5_QP_OPTPAR_SRQN | MLX5_QP_OPTPAR_CQN_RCV,
        _XRC: _RRAW | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_PM_STATE
        | MLX5_QP_OPTPAR_ALT_ADDR_PATH},
    (_SQER, _RTS): {
        _UD: MLX5_QP_OPTPAR_Q_KEY, _UC: MLX5_QP_OPTPAR_RWE,
        _RC: MLX5_QP_OPTPAR_RNR_TIMEOUT | _RRAW, _XRC: MLX5_QP_OPTPAR_RNR_TIMEOUT | _RRAW},
    (_SQD, _RTS): {
        _UD: MLX5_QP_OPTPAR_Q_KEY, _UC: MLX5_QP_OPTPAR_RWE,
        _RC: MLX5_QP_OPTPAR_RNR_TIMEOUT | _RRAW},
}

# opt_mask's MLX5_QP_ST_DCI column (DC_KEY is no IB attribute: never asked for)
for _key, _bits in {
        (_INIT, _INIT): MLX5_QP_OPTPAR_PRI_PORT | MLX5_QP_OPTPAR_DC_KEY
        | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_RAE,
        (_INIT, _RTR): MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_RAE | MLX5_QP_OPTPAR_DC_KEY,
        (_RTR, _RTS): MLX5_QP_OPTPAR_DC_KEY | MLX5_QP_OPTPAR_PM_STATE | MLX5_QP_OPTPAR_RAE,
        (_RTS, _RTS): MLX5_QP_OPTPAR_DC_KEY | MLX5_QP_OPTPAR_PM_STATE | MLX5_QP_OPTPAR_RAE,
        (_SQER, _RTS): MLX5_QP_OPTPAR_DC_KEY | MLX5_QP_OPTPAR_RAE}.items():
    opt_mask[_key][MLX5_QPC_ST_DCI] = _bits

#: Mirrors ib_nr_to_mlx5_nr(): each IB attribute bit -> the mlx5 optional bits it touches
_IB_NR_TO_MLX5 = {
    IB_QP_ACCESS_FLAGS: _RRAW,
    IB_QP_PKEY_INDEX: MLX5_QP_OPTPAR_PKEY_INDEX,
    IB_QP_PORT: MLX5_QP_OPTPAR_PRI_PORT,
    IB_QP_QKEY: MLX5_QP_OPTPAR_Q_KEY,
    IB_QP_AV: MLX5_QP_OPTPAR_PRIMARY_ADDR_PATH | MLX5_QP_OPTPAR_PRI_PORT,
    IB_QP_TIMEOUT: MLX5_QP_OPTPAR_ACK_TIMEOUT,
    IB_QP_RETRY_CNT: MLX5_QP_OPTPAR_RETRY_COUNT,
    IB_QP_RNR_RETRY: MLX5_QP_OPTPAR_RNR_RETRY,
    IB_QP_MAX_QP_RD_ATOMIC: MLX5_QP_OPTPAR_SRA_MAX,
    IB_QP_ALT_PATH: MLX5_QP_OPTPAR_ALT_ADDR_PATH,
    IB_QP_MIN_RNR_TIMER: MLX5_QP_OPTPAR_RNR_TIMEOUT,
    IB_QP_MAX_DEST_RD_ATOMIC: MLX5_QP_OPTPAR_RRA_MAX | _RRAW,
    IB_QP_PATH_MIG_STATE: MLX5_QP_OPTPAR_PM_STATE,
}


def fls(x: int) -> int:
    """Mirrors include/asm-generic/bitops/fls.h fls(): the last set bit, 1-based
    (0 for 0), so 1 << fls(n - 1) is n rounded up to a power of two."""
    return x.bit_length()

def ib_mask_to_mlx5_opt(ib_mask: int) -> int:
    """Mirrors ib_mask_to_mlx5_opt(): the mlx5 optional bits of an IB attribute mask."""
    result = 0
    for bit, mlx5_bits in _IB_NR_TO_MLX5.items():
        if ib_mask & bit:
            result |= mlx5_bits
    return result


def to_mlx5_state(state: int) -> int:
    """Mirrors to_mlx5_state(); -1 for what is no QP state."""
    return _TO_MLX5_STATE.get(state, -1)


# -- the address path --------------------------------------------------------------------
_IB_TO_MLX5_RATE = {IB_RATE_PORT_CURRENT: 0, IB_RATE_56_GBPS: 1, IB_RATE_25_GBPS: 2,
                    IB_RATE_100_GBPS: 3, IB_RATE_200_GBPS: 4, IB_RATE_50_GBPS: 5,
                    IB_RATE_400_GBPS: 6}
_MLX5_TO_IB_RATE = {v: k for k, v in _IB_TO_MLX5_RATE.items()}


def ib_to_mlx5_rate_map(rate: int) -> int:
    """Mirrors ib_to_mlx5_rate_map()."""
    return _IB_TO_MLX5_RATE.get(rate, rate + MLX5_STAT_RATE_OFFSET)


def mlx5_to_ib_rate_map(rate: int) -> int:
    """Mirrors mlx5_to_ib_rate_map()."""
    return _MLX5_TO_IB_RATE.get(rate, rate - MLX5_STAT_RATE_OFFSET)


def ib_rate_to_mlx5(dev: mlx5_ib_dev, rate: int) -> int:
    """Mirrors ib_rate_to_mlx5(): the nearest lower rate the device supports;
    EINVAL for what is no IB rate."""
    if rate == IB_RATE_PORT_CURRENT:
        return 0
    if not IB_RATE_2_5_GBPS <= rate <= IB_RATE_800_GBPS:
        raise KernelError(EINVAL, f"ib_rate_to_mlx5: static rate {rate}")
    supported = MLX5_CAP_GEN(dev.mdev, "stat_rate_support")
    while rate != IB_RATE_PORT_CURRENT and not 1 << ib_to_mlx5_rate_map(rate) & supported:
        rate -= 1
    return ib_to_mlx5_rate_map(rate)


@traced
def mlx5_set_path(dev: mlx5_ib_dev, qp: mlx5_ib_qp, ah: rdma_ah_attr, path: IfcStruct, port: int,
                  attr_mask: int, path_flags: int, attr: ib_qp_attr, alt: bool) -> None:
    """Mirrors mlx5_set_path(): an address vector into an ads.

    EINVAL for a GID index past the port's table, a RoCE AV without a GRH, a
    bad static rate.  On RoCE the ads takes the destination MAC the core
    resolved, the priority, and for a RoCE v2 source GID the DSCP and (for a
    connected QP given its remote QPN) the UDP source port; the grh bit is an
    IB-port field (every RoCE packet carries a GRH).
    """
    grh = ah.grh
    if attr_mask & IB_QP_PKEY_INDEX:
        MLX5_SET("ads", path, "pkey_index", attr.alt_pkey_index if alt else attr.pkey_index)
    if ah.ah_flags & IB_AH_GRH:
        immutable = dev.port_data[port]
        if grh.sgid_index >= immutable.gid_tbl_len:
            raise KernelError(EINVAL, f"mlx5_set_path: sgid_index ({grh.sgid_index}) too "
                              f"large. max is {immutable.gid_tbl_len}")
    if ah.type == RDMA_AH_ATTR_TYPE_ROCE:
        if not ah.ah_flags & IB_AH_GRH:
            raise KernelError(EINVAL, "mlx5_set_path: RoCE address vector without a GRH")
        dmac = int.from_bytes(ah.dmac, "big")  # ether_addr_copy(rmac_47_32, dmac)
        MLX5_SET("ads", path, "rmac_47_32", dmac >> 32)
        MLX5_SET("ads", path, "rmac_31_0", dmac)
        v2 = grh.sgid_attr is not None and grh.sgid_attr.gid_type == IB_GID_TYPE_ROCE_UDP_ENCAP
        if qp.qp_type in (IB_QPT_RC, IB_QPT_UC, IB_QPT_XRC_INI, IB_QPT_XRC_TGT) and v2 and \
                attr_mask & IB_QP_DEST_QPN:
            mlx5_set_path_udp_sport(path, ah, qp.qp_num, attr.dest_qp_num)
        MLX5_SET("ads", path, "eth_prio", ah.sl & 0x7)
        if v2:
            MLX5_SET("ads", path, "dscp", grh.traffic_class >> 2)
    else:
        MLX5_SET("ads", path, "fl", int(bool(path_flags & 1)))
        MLX5_SET("ads", path, "free_ar", int(bool(path_flags & 2)))
        MLX5_SET("ads", path, "rlid", ah.dlid)
        MLX5_SET("ads", path, "mlid", ah.src_path_bits)
        MLX5_SET("ads", path, "grh", int(bool(ah.ah_flags & IB_AH_GRH)))
        MLX5_SET("ads", path, "sl", ah.sl)
    if ah.ah_flags & IB_AH_GRH:
        MLX5_SET("ads", path, "src_addr_index", grh.sgid_index)
        MLX5_SET("ads", path, "hop_limit", grh.hop_limit)
        MLX5_SET("ads", path, "tclass", grh.traffic_class)
        MLX5_SET("ads", path, "flow_label", grh.flow_label)
        MLX5_ADDR_OF("ads", path, "rgid_rip")[:] = grh.dgid
    MLX5_SET("ads", path, "stat_rate", ib_rate_to_mlx5(dev, ah.static_rate))
    MLX5_SET("ads", path, "vhca_port_num", port)
    if attr_mask & IB_QP_TIMEOUT:
        MLX5_SET("ads", path, "ack_timeout", attr.alt_timeout if alt else attr.timeout)


def mlx5_set_path_udp_sport(path: IfcStruct, ah: rdma_ah_attr, lqpn: int, rqpn: int) -> None:
    """Mirrors mlx5_set_path_udp_sport(): RoCE v2's UDP source port from the flow
    label, or from the two QPNs when the AV has none."""
    fl = ah.grh.flow_label or rdma_calc_flow_label(lqpn, rqpn)
    MLX5_SET("ads", path, "udp_sport", rdma_flow_label_to_udp_sport(fl))


# -- the QPC of one transition -------------------------------------------------------------
def get_atomic_mode(dev: mlx5_ib_dev, qp: mlx5_ib_qp) -> int:
    """Mirrors get_atomic_mode(): -EOPNOTSUPP without atomics.

    # EMU: the atomic capability page is not modelled; a device with `atomic`
    # does the IB-compatible compare-swap and fetch-add (MLX5_ATOMIC_MODE_IB_COMP).
    """
    if not MLX5_CAP_GEN(dev.mdev, "atomic"):
        return -EOPNOTSUPP
    return MLX5_ATOMIC_MODE_IB_COMP


def set_qpc_atomic_flags(qp: mlx5_ib_qp, attr: ib_qp_attr, attr_mask: int, qpc: IfcStruct) -> None:
    """Mirrors set_qpc_atomic_flags(): rre/rae/rwe from the access flags (given now
    or remembered), remote read and atomics only with a responder depth."""
    dest_rd_atomic = attr.max_dest_rd_atomic if attr_mask & IB_QP_MAX_DEST_RD_ATOMIC \
        else qp.trans_qp.resp_depth
    access = attr.qp_access_flags if attr_mask & IB_QP_ACCESS_FLAGS else qp.trans_qp.atomic_rd_en
    if not dest_rd_atomic:
        access &= IB_ACCESS_REMOTE_WRITE
    MLX5_SET("qpc", qpc, "rre", int(bool(access & IB_ACCESS_REMOTE_READ)))
    if access & IB_ACCESS_REMOTE_ATOMIC:
        atomic_mode = get_atomic_mode(to_mdev(qp.device), qp)
        if atomic_mode < 0:
            raise KernelError(EOPNOTSUPP, "set_qpc_atomic_flags: no remote atomics")
        MLX5_SET("qpc", qpc, "rae", 1)
        MLX5_SET("qpc", qpc, "atomic_mode", atomic_mode)
    MLX5_SET("qpc", qpc, "rwe", int(bool(access & IB_ACCESS_REMOTE_WRITE)))


_PM_STATE = {IB_MIG_MIGRATED: MLX5_QP_PM_MIGRATED, IB_MIG_REARM: MLX5_QP_PM_REARM,
             IB_MIG_ARMED: MLX5_QP_PM_ARMED}


def _fill_qpc(dev: mlx5_ib_dev, qp: mlx5_ib_qp, attr: ib_qp_attr, attr_mask: int,
              cur_state: int, new_state: int, qpc: IfcStruct) -> None:
    """The QPC __mlx5_ib_modify_qp builds (in the real function's order)."""
    MLX5_SET("qpc", qpc, "st", _MLX5_ST[qp.type])
    MLX5_SET("qpc", qpc, "pm_state", _PM_STATE.get(attr.path_mig_state, 0)
             if attr_mask & IB_QP_PATH_MIG_STATE else MLX5_QP_PM_MIGRATED)
    MLX5_SET("qpc", qpc, "lag_tx_port_affinity", 0)  # EMU: no LAG (get_tx_affinity: 0)
    if qp.qp_type == IB_QPT_UD:
        MLX5_SET("qpc", qpc, "mtu", IB_MTU_4096)
        MLX5_SET("qpc", qpc, "log_msg_max", 12)
    elif attr_mask & IB_QP_PATH_MTU:
        if not IB_MTU_256 <= attr.path_mtu <= IB_MTU_4096:
            mlx5_ib_warn(dev, f"invalid mtu {attr.path_mtu}")
            raise KernelError(EINVAL, f"__mlx5_ib_modify_qp: invalid mtu {attr.path_mtu}")
        MLX5_SET("qpc", qpc, "mtu", attr.path_mtu)
        MLX5_SET("qpc", qpc, "log_msg_max", MLX5_CAP_GEN(dev.mdev, "log_max_msg"))
    if attr_mask & IB_QP_DEST_QPN:
        MLX5_SET("qpc", qpc, "remote_qpn", attr.dest_qp_num)
    pri_path = MLX5_ADDR_OF("qpc", qpc, "primary_address_path")
    if attr_mask & IB_QP_PKEY_INDEX:
        MLX5_SET("ads", pri_path, "pkey_index", attr.pkey_index)
    if attr_mask & IB_QP_PORT:
        MLX5_SET("ads", pri_path, "vhca_port_num", attr.port_num)
    if attr_mask & IB_QP_AV:
        mlx5_set_path(dev, qp, attr.ah_attr, pri_path,
                      attr.port_num if attr_mask & IB_QP_PORT else qp.port, attr_mask, 0, attr,
                      False)
    if attr_mask & IB_QP_TIMEOUT:
        MLX5_SET("ads", pri_path, "ack_timeout", attr.timeout)
    if attr_mask & IB_QP_ALT_PATH:
        mlx5_set_path(dev, qp, attr.alt_ah_attr, MLX5_ADDR_OF("qpc", qpc, "secondary_address_path"),
                      attr.alt_port_num, attr_mask | IB_QP_PKEY_INDEX | IB_QP_TIMEOUT, 0, attr,
                      True)
    send_cq, recv_cq = to_mcq(qp.send_cq), to_mcq(qp.recv_cq)  # get_cqs()
    # an XRC target has no PD: the kernel names the device's own (devr.p0), which
    # EMU: is not modelled - pd 0 (see create_xrc_tgt_qp)
    MLX5_SET("qpc", qpc, "pd", to_mpd(qp.pd).pdn if qp.pd is not None else 0)
    if send_cq is not None:
        MLX5_SET("qpc", qpc, "cqn_snd", send_cq.mcq.cqn)
    if recv_cq is not None:
        MLX5_SET("qpc", qpc, "cqn_rcv", recv_cq.mcq.cqn)
    MLX5_SET("qpc", qpc, "log_ack_req_freq", MLX5_IB_ACK_REQ_FREQ)
    if attr_mask & IB_QP_RNR_RETRY:
        MLX5_SET("qpc", qpc, "rnr_retry", attr.rnr_retry)
    if attr_mask & IB_QP_RETRY_CNT:
        MLX5_SET("qpc", qpc, "retry_count", attr.retry_cnt)
    # upstream 78ed28e08e74: the depths round up to a power of two (fls(n - 1));
    # before it ilog2 rounded down, so asking for 12 gave 8
    if attr_mask & IB_QP_MAX_QP_RD_ATOMIC and attr.max_rd_atomic:
        MLX5_SET("qpc", qpc, "log_sra_max", fls(attr.max_rd_atomic - 1))
    if attr_mask & IB_QP_SQ_PSN:
        MLX5_SET("qpc", qpc, "next_send_psn", attr.sq_psn)
    if attr_mask & IB_QP_MAX_DEST_RD_ATOMIC and attr.max_dest_rd_atomic:
        MLX5_SET("qpc", qpc, "log_rra_max", fls(attr.max_dest_rd_atomic - 1))
    if attr_mask & (IB_QP_ACCESS_FLAGS | IB_QP_MAX_DEST_RD_ATOMIC):
        set_qpc_atomic_flags(qp, attr, attr_mask, qpc)
    if attr_mask & IB_QP_MIN_RNR_TIMER:
        MLX5_SET("qpc", qpc, "min_rnr_nak", attr.min_rnr_timer)
    if attr_mask & IB_QP_RQ_PSN:
        MLX5_SET("qpc", qpc, "next_rcv_psn", attr.rq_psn)
    if attr_mask & IB_QP_QKEY:
        MLX5_SET("qpc", qpc, "q_key", attr.qkey)
    if qp.rq.wqe_cnt and cur_state == IB_QPS_RESET and new_state == IB_QPS_INIT:
        MLX5_SET64("qpc", qpc, "dbr_addr", qp.db.dma)
    # RST2INIT: counter_set_id = mlx5_ib_get_counters_id()  # EMU: no Q counters: 0
    if qp.uobject is None and cur_state == IB_QPS_RESET and new_state == IB_QPS_INIT:
        MLX5_SET("qpc", qpc, "rlky", 1)


@traced
def __mlx5_ib_modify_qp(ibqp: mlx5_ib_qp, attr: ib_qp_attr, attr_mask: int, cur_state: int,
                        new_state: int, ucmd: abi.mlx5_ib_modify_qp,
                        resp: abi.mlx5_ib_modify_qp_resp, udata: ib_udata | None) -> None:
    """Mirrors __mlx5_ib_modify_qp(): build the QPC, pick the command (optab) and
    its optional fields (opt_mask), run it; only then does the QP's state move
    and the access flags, responder depth and port get remembered.

    EINVAL for a QP type without a service type, a bad MTU, rate or GID index,
    a transition mlx5 has no command for (RTS -> SQD); EOPNOTSUPP for remote
    atomics on a device without them; the firmware's errno otherwise.
    """
    dev, qp = to_mdev(ibqp.device), ibqp
    if qp.type not in _MLX5_ST:
        raise KernelError(EINVAL, f"__mlx5_ib_modify_qp: QP type {qp.qp_type}")
    qpc = IfcStruct("qpc")
    _fill_qpc(dev, qp, attr, attr_mask, cur_state, new_state, qpc)
    mlx5_cur, mlx5_new = to_mlx5_state(cur_state), to_mlx5_state(new_state)
    op = optab.get((mlx5_cur, mlx5_new))
    if op is None:
        raise KernelError(EINVAL, f"__mlx5_ib_modify_qp: no command for {cur_state} -> "
                          f"{new_state}")
    optpar = ib_mask_to_mlx5_opt(attr_mask) & \
        opt_mask.get((mlx5_cur, mlx5_new), {}).get(_MLX5_ST[qp.type], 0)
    if udata is not None:  # for the kernel's own QPs the response stays zero
        resp.ece_options = ucmd.ece_options if MLX5_CAP_GEN(dev.mdev, "ece_support") else 0
        resp.response_length = abi.mlx5_ib_modify_qp_resp.SIZE
    if qp.qp_type == IB_QPT_RAW_PACKET:    # no QP in the firmware: its SQ and RQ move
        modify_raw_packet_qp(dev, qp, op, attr_mask & IB_QP_RATE_LIMIT)
    else:
        ece = [resp.ece_options]
        mlx5_core_qp_modify(dev, op, optpar, qpc, qp.mqp, ece)
        resp.ece_options = ece[0]
    qp.state = new_state
    if attr_mask & IB_QP_ACCESS_FLAGS:
        qp.trans_qp.atomic_rd_en = attr.qp_access_flags
    if attr_mask & IB_QP_MAX_DEST_RD_ATOMIC:
        qp.trans_qp.resp_depth = attr.max_dest_rd_atomic
    if attr_mask & IB_QP_PORT:
        qp.port = attr.port_num
    if attr_mask & IB_QP_ALT_PATH:
        qp.trans_qp.alt_port = attr.alt_port_num


def validate_rd_atomic(dev: mlx5_ib_dev, attr: ib_qp_attr, attr_mask: int) -> bool:
    """Mirrors validate_rd_atomic(): the initiator and responder depths the device has."""
    max_ra_res = 1 << MLX5_CAP_GEN(dev.mdev, "log_max_ra_res_qp")
    max_ra_req = 1 << MLX5_CAP_GEN(dev.mdev, "log_max_ra_req_qp")
    if attr_mask & IB_QP_MAX_QP_RD_ATOMIC and attr.max_rd_atomic > max_ra_res:
        return False
    return not (attr_mask & IB_QP_MAX_DEST_RD_ATOMIC and attr.max_dest_rd_atomic > max_ra_req)


def _read_ucmd(udata: ib_udata | None) -> abi.mlx5_ib_modify_qp:
    """The driver request, if the command carried one (only MODIFY_QP_EX does)."""
    ucmd = abi.mlx5_ib_modify_qp()
    if udata is None or not udata.inlen:
        return ucmd
    if udata.inlen < abi.mlx5_ib_modify_qp.offsetof("ece_options") + 4:
        raise KernelError(EINVAL, f"mlx5_ib_modify_qp: request of {udata.inlen} bytes")
    if udata.inlen > abi.mlx5_ib_modify_qp.SIZE and not ib_is_udata_cleared(
            udata, abi.mlx5_ib_modify_qp.SIZE, udata.inlen - abi.mlx5_ib_modify_qp.SIZE):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_modify_qp: unknown trailing request bytes")
    size = abi.mlx5_ib_modify_qp.SIZE
    ucmd = ib_copy_from_udata(abi.mlx5_ib_modify_qp, udata, min(udata.inlen, size))
    if ucmd.comp_mask or ucmd.burst_info.reserved:
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_modify_qp: comp_mask {ucmd.comp_mask:#x}")
    return ucmd


@traced
def mlx5_ib_modify_qp(ibqp: mlx5_ib_qp, attr: ib_qp_attr, attr_mask: int,
                      udata: ib_udata | None) -> None:
    """Mirrors mlx5_ib_modify_qp(): the request, the transition's checks, then
    __mlx5_ib_modify_qp under the QP's mutex.

    EOPNOTSUPP for attribute bits past the standard ones (and rate limits) or
    a driver request with unknown parts; EINVAL for a short request, a
    transition or mask qp_state_table refuses, a port or P_Key index the
    device lacks, rd_atomic depths beyond it.  A response that cannot be
    written is EFAULT (the QP has moved; the user is expected to destroy it).
    """
    dev, qp = to_mdev(ibqp.device), ibqp
    if attr_mask & ~(IB_QP_ATTR_STANDARD_BITS | IB_QP_RATE_LIMIT):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_modify_qp: attr_mask {attr_mask:#x}")
    ucmd = _read_ucmd(udata)
    if qp.type == MLX5_IB_QPT_DCT:       # its own transitions (qp_dc.py)
        mlx5_ib_modify_dct(qp, attr, attr_mask, ucmd, udata)
        return
    resp = abi.mlx5_ib_modify_qp_resp()
    with qp.mutex:
        cur_state = attr.cur_qp_state if attr_mask & IB_QP_CUR_STATE else qp.state
        new_state = attr.qp_state if attr_mask & IB_QP_STATE else cur_state
        if qp.type == MLX5_IB_QPT_DCI:
            if not modify_dci_qp_is_ok(cur_state, new_state, attr_mask):
                raise KernelError(EINVAL, f"mlx5_ib_modify_qp: invalid DCI transition from "
                                  f"{cur_state} to {new_state}, attr_mask {attr_mask:#x}")
        elif not ib_modify_qp_is_ok(cur_state, new_state, qp.qp_type, attr_mask):
            raise KernelError(EINVAL, f"mlx5_ib_modify_qp: invalid QP state transition from "
                              f"{cur_state} to {new_state}, qp_type {qp.qp_type}, "
                              f"attr_mask {attr_mask:#x}")
        if attr_mask & IB_QP_PORT and not 1 <= attr.port_num <= dev.num_ports:
            raise KernelError(EINVAL, f"mlx5_ib_modify_qp: invalid port number "
                              f"{attr.port_num}. number of ports is {dev.num_ports}")
        if attr_mask & IB_QP_PKEY_INDEX and attr.pkey_index >= dev.pkey_table_len:
            raise KernelError(EINVAL, f"mlx5_ib_modify_qp: invalid pkey index {attr.pkey_index}")
        if not validate_rd_atomic(dev, attr, attr_mask):
            raise KernelError(EINVAL, "mlx5_ib_modify_qp: invalid max_rd_atomic / "
                              "max_dest_rd_atomic")
        if cur_state == new_state == IB_QPS_RESET:
            return
        __mlx5_ib_modify_qp(ibqp, attr, attr_mask, cur_state, new_state, ucmd, resp, udata)
        if resp.response_length and udata.outlen >= resp.response_length:
            ib_copy_to_udata(udata, resp.pack(), resp.response_length)


# -- query ----------------------------------------------------------------------------------
def to_rdma_ah_attr(dev: mlx5_ib_dev, ah_attr: rdma_ah_attr, path: IfcStruct) -> None:
    """Mirrors to_rdma_ah_attr(): an ads back into an address vector (nothing for
    a path without a valid port)."""
    _zero(ah_attr)
    port = MLX5_GET("ads", path, "vhca_port_num")
    if not 1 <= port <= dev.num_ports:
        return
    ah_attr.type = rdma_ah_find_type(dev, port)
    ah_attr.port_num = port
    ah_attr.sl = MLX5_GET("ads", path, "sl")
    if ah_attr.type == RDMA_AH_ATTR_TYPE_IB:  # rdma_ah_set_dlid / _path_bits: IB only
        ah_attr.dlid = MLX5_GET("ads", path, "rlid")
        ah_attr.src_path_bits = MLX5_GET("ads", path, "mlid")
    ah_attr.static_rate = mlx5_to_ib_rate_map(MLX5_GET("ads", path, "stat_rate"))
    if MLX5_GET("ads", path, "grh") or ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE:
        ah_attr.ah_flags |= IB_AH_GRH
        grh = ah_attr.grh
        grh.flow_label = MLX5_GET("ads", path, "flow_label")
        grh.sgid_index = MLX5_GET("ads", path, "src_addr_index")
        grh.hop_limit = MLX5_GET("ads", path, "hop_limit")
        grh.traffic_class = MLX5_GET("ads", path, "tclass")
        grh.dgid = bytes(MLX5_ADDR_OF("ads", path, "rgid_rip"))


_TO_IB_MIG = {MLX5_QP_PM_ARMED: IB_MIG_ARMED, MLX5_QP_PM_REARM: IB_MIG_REARM,
              MLX5_QP_PM_MIGRATED: IB_MIG_MIGRATED}


def query_qp_attr(dev: mlx5_ib_dev, qp: mlx5_ib_qp, qp_attr: ib_qp_attr) -> None:
    """Mirrors query_qp_attr(): QUERY_QP, and the attributes from the QPC (the
    QP's state too: the device may have moved it, to ERR or SQE)."""
    out = mlx5_core_qp_query(dev, qp.mqp)
    qpc = MLX5_ADDR_OF("query_qp_out", out, "qpc")
    state = MLX5_GET("qpc", qpc, "state")
    qp.state = _TO_IB_STATE.get(state, -1)
    if state == MLX5_QP_STATE_SQ_DRAINING:
        qp_attr.sq_draining = 1
    qp_attr.path_mtu = MLX5_GET("qpc", qpc, "mtu")
    qp_attr.path_mig_state = _TO_IB_MIG.get(MLX5_GET("qpc", qpc, "pm_state"), -1)
    qp_attr.qkey = MLX5_GET("qpc", qpc, "q_key")
    qp_attr.rq_psn = MLX5_GET("qpc", qpc, "next_rcv_psn")
    qp_attr.sq_psn = MLX5_GET("qpc", qpc, "next_send_psn")
    qp_attr.dest_qp_num = MLX5_GET("qpc", qpc, "remote_qpn")
    for bit, field in ((IB_ACCESS_REMOTE_READ, "rre"), (IB_ACCESS_REMOTE_WRITE, "rwe"),
                       (IB_ACCESS_REMOTE_ATOMIC, "rae")):
        if MLX5_GET("qpc", qpc, field):
            qp_attr.qp_access_flags |= bit
    qp_attr.max_rd_atomic = 1 << MLX5_GET("qpc", qpc, "log_sra_max")
    qp_attr.max_dest_rd_atomic = 1 << MLX5_GET("qpc", qpc, "log_rra_max")
    qp_attr.min_rnr_timer = MLX5_GET("qpc", qpc, "min_rnr_nak")
    qp_attr.retry_cnt = MLX5_GET("qpc", qpc, "retry_count")
    qp_attr.rnr_retry = MLX5_GET("qpc", qpc, "rnr_retry")
    pri_path = MLX5_ADDR_OF("qpc", qpc, "primary_address_path")
    alt_path = MLX5_ADDR_OF("qpc", qpc, "secondary_address_path")
    if qp.qp_type in (IB_QPT_RC, IB_QPT_UC, IB_QPT_XRC_INI, IB_QPT_XRC_TGT):
        to_rdma_ah_attr(dev, qp_attr.ah_attr, pri_path)
        to_rdma_ah_attr(dev, qp_attr.alt_ah_attr, alt_path)
        qp_attr.alt_pkey_index = MLX5_GET("ads", alt_path, "pkey_index")
        qp_attr.alt_port_num = MLX5_GET("ads", alt_path, "vhca_port_num")
    qp_attr.pkey_index = MLX5_GET("ads", pri_path, "pkey_index")
    qp_attr.port_num = MLX5_GET("ads", pri_path, "vhca_port_num")
    qp_attr.timeout = MLX5_GET("ads", pri_path, "ack_timeout")
    qp_attr.alt_timeout = MLX5_GET("ads", alt_path, "ack_timeout")


def _zero(obj: object) -> None:
    """memset(obj, 0, sizeof(*obj)) of an attrs struct: every field to its default."""
    for field in attrs.fields(type(obj)):
        default = field.default
        setattr(obj, field.name, default.factory() if isinstance(default, attrs.Factory)
                else default)


@traced
def mlx5_ib_query_qp(ibqp: mlx5_ib_qp, qp_attr: ib_qp_attr, qp_attr_mask: int,
                     qp_init_attr: ib_qp_init_attr) -> None:
    """Mirrors mlx5_ib_query_qp(): both structs zeroed, the firmware's view of the
    QP (query_qp_attr), then what the driver knows: the RQ's size, the inline
    size, the CQs, how sends are signalled.  A user QP reports no send queue
    sizes (the library knows them: mlx5_query_qp fills them in)."""
    dev, qp = to_mdev(ibqp.device), ibqp
    _zero(qp_init_attr)
    _zero(qp_attr)
    if qp.type == MLX5_IB_QPT_DCT:
        mlx5_ib_dct_query_qp(dev, qp, qp_attr, qp_attr_mask)
        return
    with qp.mutex:
        if qp.qp_type == IB_QPT_RAW_PACKET:
            qp.state = query_raw_packet_qp_state(dev, qp)
            qp_attr.port_num = 1
        else:
            query_qp_attr(dev, qp, qp_attr)
        qp_attr.qp_state = qp.state
        qp_attr.cur_qp_state = qp_attr.qp_state
        qp_attr.cap.max_recv_wr = qp.rq.wqe_cnt
        qp_attr.cap.max_recv_sge = qp.rq.max_gs
        if ibqp.uobject is None:
            qp_attr.cap.max_send_wr = qp.sq.max_post
            qp_attr.cap.max_send_sge = qp.sq.max_gs
        qp_init_attr.qp_type = qp.qp_type
        qp_init_attr.recv_cq, qp_init_attr.send_cq = ibqp.recv_cq, ibqp.send_cq
        qp_init_attr.srq = ibqp.srq
        qp_attr.cap.max_inline_data = qp.max_inline_data
        qp_init_attr.cap = attrs.evolve(qp_attr.cap)
        qp_init_attr.create_flags = qp.flags
        qp_init_attr.sq_sig_type = IB_SIGNAL_ALL_WR if \
            qp.sq_signal_bits & MLX5_WQE_CTRL_CQ_UPDATE else IB_SIGNAL_REQ_WR
