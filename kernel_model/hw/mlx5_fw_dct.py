"""The firmware's Dynamically Connected targets: CREATE_DCT, DRAIN_DCT, DESTROY_DCT,
QUERY_DCT (device model).

A DCT is the responder end of Dynamically Connected transport: any DC initiator
(a QP of service type DCI, created with CREATE_QP) may send to it by naming its
number (dctn) and its access key in each WQE's address vector.  It has no queues
of its own: a SEND takes its receive WQE from the SRQ the context names
(srqn_xrqn) and completes on its CQ (cqn) under its user index; RDMA and atomics
work on memory of its PD, as its rre / rwe / rae bits allow.

    fw.dcts[dctn].dctc["dc_access_key"]    fw.dcts[dctn].dctc["srqn_xrqn"]

The firmware keeps the context the driver wrote at CREATE_DCT (mlx5_ib builds it
across RESET->INIT->RTR and issues the command at RTR) and refers to the PD, the
CQ and the SRQ (busy while the DCT exists).  DCT numbers come from the QP number
space: no QP and DCT share a number.  A DCT is ACTIVE from CREATE_DCT; DRAIN_DCT
makes it stop taking requests (DRAINED).

Checks: the device's dct capability (BAD_OP without it), the uid's own or shared
PD, CQ and SRQ (BAD_PARAM), the port, the MTU, and on an Ethernet port a
programmed source GID (my_addr_index).
# EMU: DRAIN_DCT completes at once - the DCT_DRAINED event the driver would
# wait for is not modelled (mlx5_core's async EQ is not); DESTROY_DCT does not
# insist on a drained DCT.
"""

from __future__ import annotations

from collections import ChainMap
from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.hw.mlx5_fw_cmd import FwError, fw_command
from kernel_model.hw.mlx5_fw_ctx import Mlx5Ctx, destroy_ctx
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CMD_OP_CREATE_DCT,
    MLX5_CMD_OP_DESTROY_DCT,
    MLX5_CMD_OP_DRAIN_DCT,
    MLX5_CMD_OP_QUERY_DCT,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_DCTC_STATE_ACTIVE,
    MLX5_DCTC_STATE_DRAINED,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware

_DCT_STATES = {MLX5_DCTC_STATE_ACTIVE: "ACTIVE", 1: "DRAINING", MLX5_DCTC_STATE_DRAINED: "DRAINED"}


class Mlx5Dct(Mlx5Ctx):
    kind = "DCT"

    @property
    def dctc(self) -> IfcStruct:
        return self.ctx

    @property
    def state(self) -> int:
        return self.dctc["state"]

    def __repr__(self) -> str:
        d = self.dctc
        return (f"DCT {self.num:#x} {_DCT_STATES.get(d['state'], d['state'])} pd={d['pd']:#x} "
                f"cqn={d['cqn']:#x} srqn={d['srqn_xrqn']:#x} uid={self.uid}")


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


def _bad(check: str) -> FwError:
    return FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)


@fw_command(MLX5_CMD_OP_CREATE_DCT, "create_dct")
def create_dct(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """A new ACTIVE DCT on the context's PD, CQ and SRQ (see the module docstring)."""
    if not fw.cap("dct"):
        raise FwError(MLX5_CMD_STAT_BAD_OP_ERR, "create_dct_no_dct_cap")
    uid = _uid(in_)
    dctc = MLX5_ADDR_OF("create_dct_in", in_, "dct_context_entry")
    if not 1 <= dctc["port"] <= fw.cap("num_ports"):
        raise _bad("create_dct_port")
    if not 1 <= dctc["mtu"] <= 5:  # IB_MTU_256 .. IB_MTU_4096
        raise _bad("create_dct_mtu")
    if fw.cap("port_type") == MLX5_CAP_PORT_TYPE_ETH and \
            dctc["my_addr_index"] not in fw.roce_addresses:
        raise _bad("create_dct_my_addr_index")
    refs = [fw.ref(fw.pds, dctc["pd"], uid, "create_dct_pd"),
            fw.ref(fw.cqs, dctc["cqn"], uid, "create_dct_cqn"),
            fw.ref(fw.srqs, dctc["srqn_xrqn"], uid, "create_dct_srqn")]
    dctn = fw.new_id("qp", ChainMap(fw.qps, fw.dcts))   # one number space with the QPs
    keep = dctc.copy()
    MLX5_SET("dctc", keep, "state", MLX5_DCTC_STATE_ACTIVE)
    MLX5_SET("dctc", keep, "dc_access_key_violation_count", 0)
    fw.dcts[dctn] = Mlx5Dct(dctn, uid, keep, U64Array(0), refs)
    MLX5_SET("create_dct_out", out, "dctn", dctn)
    MLX5_SET("create_dct_out", out, "ece", dctc["ece"])


@fw_command(MLX5_CMD_OP_DRAIN_DCT, "drain_dct")
def drain_dct(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """ACTIVE -> DRAINED: the DCT takes no more requests (BAD_RES_STATE otherwise)."""
    dct = fw.lookup(fw.dcts, MLX5_GET("drain_dct_in", in_, "dctn"), _uid(in_), "dct")
    if dct.state != MLX5_DCTC_STATE_ACTIVE:
        raise FwError(MLX5_CMD_STAT_BAD_RES_STATE_ERR, "drain_dct_not_active")
    MLX5_SET("dctc", dct.dctc, "state", MLX5_DCTC_STATE_DRAINED)


@fw_command(MLX5_CMD_OP_DESTROY_DCT, "destroy_dct")
def destroy_dct(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    dct = fw.lookup(fw.dcts, MLX5_GET("destroy_dct_in", in_, "dctn"), _uid(in_), "dct")
    destroy_ctx(fw, fw.dcts, dct, "dct")


@fw_command(MLX5_CMD_OP_QUERY_DCT, "query_dct")
def query_dct(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    dct = fw.lookup(fw.dcts, MLX5_GET("query_dct_in", in_, "dctn"), _uid(in_), "dct")
    memcpy_ifc(MLX5_ADDR_OF("query_dct_out", out, "dct_context_entry"), dct.dctc)
