"""The firmware's port, vport and adapter queries (device model).

What mlx5_core and mlx5_ib learn about the port of an Ethernet (RoCE)
function comes from the NIC vport context (GUIDs, MAC, MTU, RoCE enable,
minimum inline mode), two access registers (PMTU: port MTUs; PTYS: link
protocols, from which mlx5_ib derives speed and width), QUERY_ADAPTER (the
board id, PSID) and QUERY_SPECIAL_CONTEXTS (the reserved mkeys).

The vport context belongs to the function: a reset restores the defaults
below, built from the device's Mlx5Config.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from kernel_model.hw.mlx5_fw_cmd import FwError, fw_command
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_ACCESS_REG,
    MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_ADAPTER,
    MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_GET,
    MLX5_INLINE_MODE_L2,
    MLX5_PTYS_EN,
    MLX5_REG_PMTU,
    MLX5_REG_PTYS,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5 import ConnectX
    from kernel_model.hw.mlx5_fw import Firmware

MELLANOX_OUI = 0xB8CEF6
ETH_HW_OVERHEAD = 14 + 4 + 4  # MLX5E_SW2HW_MTU: Ethernet header, one VLAN tag, FCS
# the reserved mkeys of QUERY_SPECIAL_CONTEXTS (index << 8: firmware-owned indices 0..7)
RESD_LKEY, NULL_MKEY, TERMINATE_SCATTER_LIST_MKEY, REPEATED_MKEY, DUMP_FILL_MKEY = (
    0x100, 0x200, 0x300, 0x400, 0x700)


@attrs.define
class VportState:
    """The function's NIC vport context (what QUERY_NIC_VPORT_CONTEXT returns)."""

    mac: int
    node_guid: int
    system_image_guid: int
    port_guid: int
    mtu: int                     # hardware MTU: the netdev MTU plus L2 overhead
    min_wqe_inline_mode: int = MLX5_INLINE_MODE_L2
    roce_en: int = 0
    disable_uc_local_lb: int = 0
    disable_mc_local_lb: int = 0


def default_vport(hca: ConnectX) -> VportState:
    """GUIDs derived from the MAC as Mellanox does (OUI:03:00:xx:yy:zz), MAC from the serial."""
    cfg = hca.config
    mac = MELLANOX_OUI << 24 | (hca.machine.serial & 0xFF) << 16 | (hca.index & 0xFF) << 8
    guid = MELLANOX_OUI << 40 | 0x0300 << 24 | (mac & 0xFFFFFF)
    node = cfg.node_guid if cfg.node_guid is not None else guid
    sysimg = cfg.sys_image_guid if cfg.sys_image_guid is not None else node
    return VportState(mac=mac, node_guid=node, system_image_guid=sysimg, port_guid=node,
                      mtu=cfg.mtu + ETH_HW_OVERHEAD)


def _vport_0(in_: IfcStruct, typ: str) -> None:
    if MLX5_GET(typ, in_, "other_vport") or MLX5_GET(typ, in_, "vport_number"):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "vport_not_own")


@fw_command(MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT, "query_nic_vport_context")
def query_nic_vport_context(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    _vport_0(in_, "query_nic_vport_context_in")
    v = fw.vport
    ctx = MLX5_ADDR_OF("query_nic_vport_context_out", out, "nic_vport_context")
    for field in ("min_wqe_inline_mode", "roce_en", "disable_uc_local_lb",
                  "disable_mc_local_lb", "mtu"):
        MLX5_SET("nic_vport_context", ctx, field, getattr(v, field))
    for field in ("node_guid", "system_image_guid", "port_guid"):
        MLX5_SET64("nic_vport_context", ctx, field, getattr(v, field))
    mac = MLX5_ADDR_OF("nic_vport_context", ctx, "permanent_address")
    MLX5_SET("mac_address_layout", mac, "mac_addr_47_32", v.mac >> 32)
    MLX5_SET("mac_address_layout", mac, "mac_addr_31_0", v.mac)


@fw_command(MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, "modify_nic_vport_context")
def modify_nic_vport_context(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    _vport_0(in_, "modify_nic_vport_context_in")
    sel = MLX5_ADDR_OF("modify_nic_vport_context_in", in_, "field_select")
    ctx = MLX5_ADDR_OF("modify_nic_vport_context_in", in_, "nic_vport_context")
    if sel["node_guid"] or sel["port_guid"] or sel["permanent_address"]:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "modify_vport_pf_field")  # a PF's own
    for field in ("roce_en", "disable_uc_local_lb", "disable_mc_local_lb", "mtu"):
        if sel[field]:
            setattr(fw.vport, field, ctx[field])
    if sel["min_inline"]:
        fw.vport.min_wqe_inline_mode = ctx["min_wqe_inline_mode"]


@fw_command(MLX5_CMD_OP_ACCESS_REG, "access_register")
def access_register(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    reg_id = MLX5_GET("access_register_in", in_, "register_id")
    write = MLX5_GET("mbox_in", in_, "op_mod") == 0   # mlx5_core_access_reg: op_mod = !write
    data = MLX5_ADDR_OF("access_register_in", in_, "register_data")
    reply = MLX5_ADDR_OF("access_register_out", out, "register_data")
    cfg = fw.hca.config
    if reg_id == MLX5_REG_PMTU:
        if MLX5_GET("pmtu_reg", data, "local_port") != 1:
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "pmtu_local_port")
        if write:
            fw.vport.mtu = MLX5_GET("pmtu_reg", data, "admin_mtu")
        MLX5_SET("pmtu_reg", reply, "local_port", 1)
        MLX5_SET("pmtu_reg", reply, "max_mtu", cfg.max_mtu)
        MLX5_SET("pmtu_reg", reply, "admin_mtu", fw.vport.mtu)
        MLX5_SET("pmtu_reg", reply, "oper_mtu", fw.vport.mtu)
    elif reg_id == MLX5_REG_PTYS:
        if MLX5_GET("ptys_reg", data, "local_port") != 1 or write:
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "ptys_access")
        MLX5_SET("ptys_reg", reply, "local_port", 1)
        MLX5_SET("ptys_reg", reply, "proto_mask", MLX5_PTYS_EN)
        for field in ("eth_proto_capability", "eth_proto_admin", "eth_proto_oper"):
            MLX5_SET("ptys_reg", reply, field, cfg.eth_proto_oper)
    else:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "access_reg_unknown_register")


@fw_command(MLX5_CMD_OP_QUERY_ADAPTER, "query_adapter", "enabled")
def query_adapter(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    blk = MLX5_ADDR_OF("query_adapter_out", out, "query_adapter_struct")
    MLX5_SET("query_adapter_param_block", blk, "ieee_vendor_id", 0x02C9)
    psid = MLX5_ADDR_OF("query_adapter_param_block", blk, "vsd_contd_psid")
    psid[:] = fw.hca.config.board_id.encode()[:16].ljust(16, b"\0")


@fw_command(MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS, "query_special_contexts")
def query_special_contexts(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    typ = "query_special_contexts_out"
    MLX5_SET(typ, out, "resd_lkey", RESD_LKEY)
    for field, value in (("dump_fill_mkey", DUMP_FILL_MKEY), ("null_mkey", NULL_MKEY),
                         ("terminate_scatter_list_mkey", TERMINATE_SCATTER_LIST_MKEY),
                         ("repeated_mkey", REPEATED_MKEY)):
        if fw.cap(field):  # only the contexts the device reports support for
            MLX5_SET(typ, out, field, value)
