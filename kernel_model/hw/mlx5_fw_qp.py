"""The firmware's QP state machine and RoCE address table (device model, not kernel code).

A QP leaves RESET only through the modify commands, one per transition:

    RST --RST2INIT--> INIT --INIT2RTR--> RTR --RTR2RTS--> RTS
    INIT --INIT2INIT--> INIT     RTS --RTS2RTS--> RTS
    SQER --SQERR2RTS--> RTS      SQD --SQD_RTS--> RTS
    any --2ERR--> ERR            any --2RST--> RST

Each names the QP (looked up with the caller's uid, like every object
command) and must find it in the transition's source state (BAD_QP_STATE
otherwise).  A transition carrying a QPC takes two kinds of fields into the
stored context: those it always carries (RTR2RTS: next_send_psn, retry_count
...; a datagram QP carries fewer), and each optional group whose bit is set
in opt_param_mask (RWE, Q_KEY, PKEY_INDEX ... - an optional bit the
transition does not accept is BAD_PARAM).  Fields set at CREATE_QP - pd, the
CQs, the UAR, the queue sizes, the doorbell and buffer geometry, st,
user_index - never change here, even though the driver's QPC repeats some of
them.  The new state is then stored and the HCA told (qp_state_changed: the
data path starts, flushes or forgets the QP's queues).  2RST also clears what
the transitions set and the queue counters, so a QP back in RESET is as
CREATE_QP left it.

Checks are the cheap ones: the port exists (RST2INIT); a connected QP's
INIT2RTR names a remote QP and, on an Ethernet port, a destination MAC and a
programmed source GID (src_addr_index into the RoCE address table); the path
MTU is one of the five IB MTUs.
# EMU: the RoCE driver leaves primary_address_path.grh at 0 (every RoCE
# packet carries a GRH; mlx5_set_path sets the bit on IB ports only), so the
# firmware checks the GID index and MAC instead of that bit.

SET_ROCE_ADDRESS fills the RoCE address table (the GID table of an Ethernet
port): an index, its GID, source MAC, RoCE version and L3 type.  A zero GID
clears the entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from kernel_model.hw import mlx5_caps
from kernel_model.hw.mlx5_fw_cmd import FwError, fw_command
from kernel_model.hw.mlx5_fw_ctx import Mlx5Qp
from kernel_model.hw.mlx5_ifc import (
    LAYOUTS,
    MLX5_ADDR_OF,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CMD_OP_2ERR_QP,
    MLX5_CMD_OP_2RST_QP,
    MLX5_CMD_OP_INIT2INIT_QP,
    MLX5_CMD_OP_INIT2RTR_QP,
    MLX5_CMD_OP_RST2INIT_QP,
    MLX5_CMD_OP_RTR2RTS_QP,
    MLX5_CMD_OP_RTS2RTS_QP,
    MLX5_CMD_OP_SET_ROCE_ADDRESS,
    MLX5_CMD_OP_SQD_RTS_QP,
    MLX5_CMD_OP_SQERR2RTS_QP,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_QP_STATE_ERR,
    MLX5_GET,
    MLX5_QP_OPTPAR_ACK_TIMEOUT,
    MLX5_QP_OPTPAR_ALT_ADDR_PATH,
    MLX5_QP_OPTPAR_COUNTER_SET_ID,
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
    MLX5_QPC_ST_DCI,
    MLX5_QPC_ST_RC,
    MLX5_QPC_ST_UC,
    MLX5_QPC_ST_XRC,
    MLX5_QPC_STATE_ERR,
    MLX5_QPC_STATE_INIT,
    MLX5_QPC_STATE_RST,
    MLX5_QPC_STATE_RTR,
    MLX5_QPC_STATE_RTS,
    MLX5_QPC_STATE_SQD,
    MLX5_QPC_STATE_SQER,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware

_CONNECTED = (MLX5_QPC_ST_RC, MLX5_QPC_ST_UC, MLX5_QPC_ST_XRC, MLX5_QPC_ST_DCI)
#: the address path but its P_Key index (which has its own optional bit)
_PATH = tuple(f"primary_address_path.{f}" for f in LAYOUTS["ads"] if f != "pkey_index")

#: opt_param_mask bit -> the QPC fields it lets a transition change
OPTPAR_FIELDS: dict[int, tuple[str, ...]] = {
    MLX5_QP_OPTPAR_ALT_ADDR_PATH: ("secondary_address_path",),
    MLX5_QP_OPTPAR_RRE: ("rre",),
    MLX5_QP_OPTPAR_RAE: ("rae", "atomic_mode"),
    MLX5_QP_OPTPAR_RWE: ("rwe",),
    MLX5_QP_OPTPAR_PKEY_INDEX: ("primary_address_path.pkey_index",),
    MLX5_QP_OPTPAR_Q_KEY: ("q_key",),
    MLX5_QP_OPTPAR_RNR_TIMEOUT: ("min_rnr_nak",),
    MLX5_QP_OPTPAR_PRIMARY_ADDR_PATH: _PATH,
    MLX5_QP_OPTPAR_SRA_MAX: ("log_sra_max",),
    MLX5_QP_OPTPAR_RRA_MAX: ("log_rra_max",),
    MLX5_QP_OPTPAR_PM_STATE: ("pm_state",),
    MLX5_QP_OPTPAR_RETRY_COUNT: ("retry_count",),
    MLX5_QP_OPTPAR_RNR_RETRY: ("rnr_retry",),
    MLX5_QP_OPTPAR_ACK_TIMEOUT: ("primary_address_path.ack_timeout",),
    MLX5_QP_OPTPAR_LAG_TX_AFF: ("lag_tx_port_affinity",),
    MLX5_QP_OPTPAR_PRI_PORT: ("primary_address_path.vhca_port_num",),
    MLX5_QP_OPTPAR_COUNTER_SET_ID: ("counter_set_id",),
}
_ACCESS = MLX5_QP_OPTPAR_RRE | MLX5_QP_OPTPAR_RAE | MLX5_QP_OPTPAR_RWE
#: the QP's send/receive progress, which RESET clears
_COUNTERS = ("hw_sq_wqebb_counter", "sw_sq_wqebb_counter", "hw_rq_counter", "sw_rq_counter",
             "last_acked_psn", "ssn", "rmsn", "cur_rnr_retry", "cur_retry_count")


@attrs.frozen
class QpTransition:
    """One modify command: where it may start, where it leads, what it carries."""

    name: str                           # the layout stem: rst2init_qp -> rst2init_qp_in
    source: tuple[int, ...] | None      # None: from any state
    target: int
    connected: tuple[str, ...] = ()     # always taken for RC, UC, XRC, DCI
    datagram: tuple[str, ...] = ()      # always taken for UD (and the special QPs)
    optional: int = 0                   # the opt_param_mask bits it accepts


_INIT = ("pm_state", "primary_address_path.pkey_index", "primary_address_path.vhca_port_num",
         "rre", "rwe", "rae", "atomic_mode", "q_key", "counter_set_id", "lag_tx_port_affinity",
         "log_ack_req_freq")
RST2INIT = QpTransition("rst2init_qp", (MLX5_QPC_STATE_RST,), MLX5_QPC_STATE_INIT, _INIT, _INIT)
INIT2INIT = QpTransition(
    "init2init_qp", (MLX5_QPC_STATE_INIT,), MLX5_QPC_STATE_INIT,
    optional=_ACCESS | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_PRI_PORT | MLX5_QP_OPTPAR_Q_KEY
    | MLX5_QP_OPTPAR_LAG_TX_AFF | MLX5_QP_OPTPAR_COUNTER_SET_ID)
INIT2RTR = QpTransition(
    "init2rtr_qp", (MLX5_QPC_STATE_INIT,), MLX5_QPC_STATE_RTR,
    ("mtu", "log_msg_max", "remote_qpn", *_PATH, "log_rra_max", "min_rnr_nak", "next_rcv_psn",
     "log_ack_req_freq"),
    ("mtu", "log_msg_max"),
    _ACCESS | MLX5_QP_OPTPAR_ALT_ADDR_PATH | MLX5_QP_OPTPAR_PKEY_INDEX | MLX5_QP_OPTPAR_Q_KEY
    | MLX5_QP_OPTPAR_LAG_TX_AFF)
RTR2RTS = QpTransition(
    "rtr2rts_qp", (MLX5_QPC_STATE_RTR,), MLX5_QPC_STATE_RTS,
    ("next_send_psn", "retry_count", "rnr_retry", "log_sra_max",
     "primary_address_path.ack_timeout"),
    ("next_send_psn",),
    _ACCESS | MLX5_QP_OPTPAR_ALT_ADDR_PATH | MLX5_QP_OPTPAR_PM_STATE
    | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_Q_KEY)
RTS2RTS = QpTransition(
    "rts2rts_qp", (MLX5_QPC_STATE_RTS,), MLX5_QPC_STATE_RTS,
    optional=_ACCESS | MLX5_QP_OPTPAR_ALT_ADDR_PATH | MLX5_QP_OPTPAR_PM_STATE
    | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_Q_KEY | MLX5_QP_OPTPAR_COUNTER_SET_ID)
SQERR2RTS = QpTransition("sqerr2rts_qp", (MLX5_QPC_STATE_SQER,), MLX5_QPC_STATE_RTS,
                         optional=_ACCESS | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_Q_KEY)
SQD2RTS = QpTransition("sqd2rts_qp", (MLX5_QPC_STATE_SQD,), MLX5_QPC_STATE_RTS,
                       optional=_ACCESS | MLX5_QP_OPTPAR_RNR_TIMEOUT | MLX5_QP_OPTPAR_Q_KEY)
QP_2ERR = QpTransition("qp_2err", None, MLX5_QPC_STATE_ERR)
QP_2RST = QpTransition("qp_2rst", None, MLX5_QPC_STATE_RST)

#: every field some transition writes (but pm_state, which CREATE_QP sets too): what
#: 2RST clears
_CARRIED = tuple(f for f in dict.fromkeys(
    [f for t in (RST2INIT, INIT2RTR, RTR2RTS) for f in t.connected + t.datagram]
    + [f for group in OPTPAR_FIELDS.values() for f in group] + list(_COUNTERS))
    if f != "pm_state")


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


def _bad(check: str) -> FwError:
    return FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)


def _kind(typ: str, field: str) -> int | str:
    head, _, rest = field.partition(".")
    kind = LAYOUTS[typ][head]
    return _kind(str(kind)[1:], rest) if rest else kind


def _take(keep: IfcStruct, cmd: IfcStruct | None, field: str) -> None:
    """keep.field = cmd.field (cmd None: cleared) - a scalar, a byte string or a struct."""
    kind = _kind("qpc", field)
    if isinstance(kind, int):
        value = MLX5_GET("qpc", cmd, field) if cmd is not None else 0
        (MLX5_SET64 if kind == 64 else MLX5_SET)("qpc", keep, field, value)
    elif kind.startswith("bytes"):
        dst = MLX5_ADDR_OF("qpc", keep, field)
        dst[:] = MLX5_ADDR_OF("qpc", cmd, field) if cmd is not None else bytes(len(dst))
    else:
        memcpy_ifc(MLX5_ADDR_OF("qpc", keep, field),
                   MLX5_ADDR_OF("qpc", cmd, field) if cmd is not None else IfcStruct(kind[1:]))


def _check(fw: Firmware, t: QpTransition, qp: Mlx5Qp, qpc: IfcStruct) -> None:
    """The cheap checks of the context a transition brings."""
    if t is RST2INIT and not 1 <= qpc["primary_address_path.vhca_port_num"] <= \
            fw.cap("num_ports"):
        raise _bad("rst2init_qp_port")
    if t is not INIT2RTR:
        return
    if not 1 <= qpc["mtu"] <= 5:  # IB_MTU_256 .. IB_MTU_4096
        raise _bad("init2rtr_qp_mtu")
    if qp.qpc["st"] not in _CONNECTED or qp.qpc["st"] == MLX5_QPC_ST_DCI:
        return                  # a DCI names its peer (a DCT) in every WQE instead
    if not qpc["remote_qpn"]:
        raise _bad("init2rtr_qp_remote_qpn")
    if fw.cap("port_type") == MLX5_CAP_PORT_TYPE_ETH:
        path = MLX5_ADDR_OF("qpc", qpc, "primary_address_path")
        if not path["rmac_47_32"] | path["rmac_31_0"]:
            raise _bad("init2rtr_qp_rmac")
        if path["src_addr_index"] not in fw.roce_addresses:
            raise _bad("init2rtr_qp_src_addr_index")


def _modify_qp(fw: Firmware, t: QpTransition, in_: IfcStruct) -> None:
    """Every transition: find the QP, check its state and the context, take the
    fields, move the state, tell the HCA."""
    typ = in_.typ
    qp = fw.lookup(fw.qps, MLX5_GET(typ, in_, "qpn"), _uid(in_), "qp")
    old = qp.state
    if t.source is not None and old not in t.source:
        raise FwError(MLX5_CMD_STAT_BAD_QP_STATE_ERR, f"{t.name}_bad_state")
    if "qpc" in LAYOUTS[typ]:
        cmd = MLX5_ADDR_OF(typ, in_, "qpc")
        mask = MLX5_GET(typ, in_, "opt_param_mask")
        if mask & ~t.optional:
            raise _bad(f"{t.name}_opt_param_mask")
        _check(fw, t, qp, cmd)
        fields = list(t.connected if qp.qpc["st"] in _CONNECTED else t.datagram)
        for bit, group in OPTPAR_FIELDS.items():
            if mask & bit:
                fields.extend(group)
        for field in fields:
            _take(qp.qpc, cmd, field)
    if t is QP_2RST:
        for field in _CARRIED:
            _take(qp.qpc, None, field)
    MLX5_SET("qpc", qp.qpc, "state", t.target)
    fw.hca.qp_state_changed(qp, old, t.target)


def _modify_command(opcode: int, t: QpTransition) -> None:
    """Register the firmware handler of one modify command: the table's row for it."""
    def handler(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
        _modify_qp(fw, t, in_)
    handler.__name__ = handler.__qualname__ = t.name
    fw_command(opcode, t.name)(handler)


for _opcode, _t in ((MLX5_CMD_OP_RST2INIT_QP, RST2INIT), (MLX5_CMD_OP_INIT2INIT_QP, INIT2INIT),
                    (MLX5_CMD_OP_INIT2RTR_QP, INIT2RTR), (MLX5_CMD_OP_RTR2RTS_QP, RTR2RTS),
                    (MLX5_CMD_OP_RTS2RTS_QP, RTS2RTS), (MLX5_CMD_OP_SQERR2RTS_QP, SQERR2RTS),
                    (MLX5_CMD_OP_SQD_RTS_QP, SQD2RTS), (MLX5_CMD_OP_2ERR_QP, QP_2ERR),
                    (MLX5_CMD_OP_2RST_QP, QP_2RST)):
    _modify_command(_opcode, _t)


# -- the RoCE address table --------------------------------------------------------------
@fw_command(MLX5_CMD_OP_SET_ROCE_ADDRESS, "set_roce_address")
def set_roce_address(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    typ = "set_roce_address_in"
    if _uid(in_):
        raise _bad("set_roce_address_uid")
    if fw.cap("port_type") != MLX5_CAP_PORT_TYPE_ETH:
        raise _bad("set_roce_address_port_type")
    index = MLX5_GET(typ, in_, "roce_address_index")
    if index >= fw.cap("roce_address_table_size", mlx5_caps.MLX5_CAP_ROCE):
        raise _bad("set_roce_address_index")
    addr = MLX5_ADDR_OF(typ, in_, "roce_address")
    if any(MLX5_ADDR_OF("roce_addr_layout", addr, "source_l3_address")):
        fw.roce_addresses[index] = addr.copy()
    else:
        fw.roce_addresses.pop(index, None)
