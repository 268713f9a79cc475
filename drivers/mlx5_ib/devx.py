"""Mirrors the user-context part of drivers/infiniband/hw/mlx5/devx.c: the DEVX uid.

A user context opened with MLX5_IB_ALLOC_UCTX_DEVX gets a firmware user
context (CREATE_UCTX); its number, the uid, is stamped on every object the
context then creates, so the firmware refuses commands that name another
context's objects.
# EMU: the uid and the general commands (MLX5_IB_METHOD_DEVX_OTHER) are modelled - no
# DEVX object, UMEM or event commands, no UCTX caps (RAW_TX / INTERNAL_DEV_RES need
# capabilities the emulated HCA lacks).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.rdma_core import ib_uverbs_get_ucontext_file
from drivers.ib_core.uverbs_ioctl import uverbs_api_ioctl_method, uverbs_copy_to_buf
from drivers.mlx5_core.cmd import mlx5_cmd_do, mlx5_cmd_exec
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    LAYOUTS,
    MLX5_CAP_DEV_MEM,
    MLX5_CAP_ETHERNET_OFFLOADS,
    MLX5_CAP_GENERAL,
    MLX5_CAP_ROCE,
    MLX5_CMD_NAMES,
    MLX5_CMD_OP_CREATE_UCTX,
    MLX5_CMD_OP_DESTROY_UCTX,
    MLX5_CMD_OP_GENERAL_END,
    MLX5_CMD_OP_GENERAL_START,
    MLX5_CMD_OP_GET_DROPPED_PACKET_LOG,
    MLX5_CMD_OP_NOP,
    MLX5_CMD_OP_QUERY_ADAPTER,
    MLX5_CMD_OP_QUERY_CONG_PARAMS,
    MLX5_CMD_OP_QUERY_CONG_STATISTICS,
    MLX5_CMD_OP_QUERY_CONG_STATUS,
    MLX5_CMD_OP_QUERY_ESW_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_HCA_CAP,
    MLX5_CMD_OP_QUERY_HCA_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_ISSI,
    MLX5_CMD_OP_QUERY_LAG,
    MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_ROCE_ADDRESS,
    MLX5_CMD_OP_QUERY_VNIC_ENV,
    MLX5_CMD_OP_QUERY_VPORT_COUNTER,
    MLX5_CMD_OP_QUERY_VPORT_STATE,
    MLX5_GET,
    MLX5_SET,
    MLX5_ST_SZ_BYTES,
    PRM_LAYOUTS,
    IfcStruct,
    prm_pack,
    prm_unpack,
)
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, to_mdev, to_mucontext
from kernel_model.errno import EFAULT, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
    MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
    MLX5_IB_METHOD_DEVX_OTHER,
    MLX5_IB_OBJECT_DEVX,
)


@traced
def mlx5_ib_devx_create(dev: mlx5_ib_dev, is_user: bool) -> int:
    """Mirrors mlx5_ib_devx_create(): CREATE_UCTX; the new uid (EINVAL without uctx support)."""
    if not MLX5_CAP_GEN(dev.mdev, "log_max_uctx"):
        raise KernelError(EINVAL, "mlx5_ib_devx_create: device has no user contexts")
    in_, out = IfcStruct("create_uctx_in"), IfcStruct("create_uctx_out")
    MLX5_SET("create_uctx_in", in_, "opcode", MLX5_CMD_OP_CREATE_UCTX)
    MLX5_SET("create_uctx_in", in_, "uctx.cap", 0)
    mlx5_cmd_exec(dev.mdev, in_, out)
    return MLX5_GET("create_uctx_out", out, "uid")


@traced
def mlx5_ib_devx_destroy(dev: mlx5_ib_dev, uid: int) -> None:
    """Mirrors mlx5_ib_devx_destroy(): DESTROY_UCTX."""
    in_ = IfcStruct("destroy_uctx_in")
    MLX5_SET("destroy_uctx_in", in_, "opcode", MLX5_CMD_OP_DESTROY_UCTX)
    MLX5_SET("destroy_uctx_in", in_, "uid", uid)
    mlx5_cmd_exec(dev.mdev, in_, IfcStruct("destroy_uctx_out"))


# -- DevX general commands (MLX5_IB_METHOD_DEVX_OTHER) ------------------------------------
# EMU: the command mailbox carries IfcStructs, not bytes: the raw PRM input is read into
# one (prm_unpack) and the answer written back as raw PRM bytes (prm_pack), for the
# layouts whose bit offsets mlx5_ifc.PRM_LAYOUTS lists.  A general command the model
# knows but cannot convert (a layout without offsets) fails with EOPNOTSUPP; one the
# emulated firmware lacks reaches it as a bare header and is answered BAD_OP.
#: QUERY_HCA_CAP's capability types -> the union member their page is read as
_HCA_CAP_MEMBER = {MLX5_CAP_GENERAL: "cmd_hca_cap", MLX5_CAP_DEV_MEM: "device_mem_cap",
                   MLX5_CAP_ETHERNET_OFFLOADS: "per_protocol_networking_offload_caps",
                   MLX5_CAP_ROCE: "roce_cap"}


def _hdr_get(cmd_in: bytes | bytearray, field: str) -> int:
    """MLX5_GET(general_obj_in_cmd_hdr, cmd_in, field) on the raw mailbox."""
    off, width = PRM_LAYOUTS["mbox_in"][1][field]
    return int.from_bytes(bytes(cmd_in[off // 8:(off + width) // 8]).ljust(width // 8, b"\0"),
                          "big")


def devx_is_whitelist_cmd(cmd_in: bytes | bytearray) -> bool:
    """Mirrors devx_is_whitelist_cmd(): the queries a context without a DEVX uid may send
    under the device's whitelist uid."""
    return _hdr_get(cmd_in, "opcode") in (MLX5_CMD_OP_QUERY_HCA_CAP,
                                          MLX5_CMD_OP_QUERY_HCA_VPORT_CONTEXT,
                                          MLX5_CMD_OP_QUERY_ESW_VPORT_CONTEXT)


def devx_get_uid(c: Any, cmd_in: bytes | bytearray) -> int:
    """Mirrors devx_get_uid(): the context's DEVX uid; for a whitelisted query without
    one the device's whitelist uid, else EOPNOTSUPP; any other command without one is
    EINVAL.
    # EMU: mlx5_ib_devx_init's whitelist uid (a user context the driver creates at
    # load) is not modelled: dev.devx_whitelist_uid is 0, as when its creation failed."""
    if devx_is_whitelist_cmd(cmd_in):
        if c.devx_uid:
            return c.devx_uid
        whitelist_uid = getattr(to_mdev(c.device), "devx_whitelist_uid", 0)
        if whitelist_uid:
            return whitelist_uid
        raise KernelError(EOPNOTSUPP, "devx_get_uid: no DEVX uid and no whitelist uid")
    if not c.devx_uid:
        raise KernelError(EINVAL, "devx_get_uid: the context has no DEVX uid")
    return c.devx_uid


def devx_is_general_cmd(cmd_in: bytes | bytearray, dev: mlx5_ib_dev) -> bool:
    """Mirrors devx_is_general_cmd(): the general range (0xb00..0xcff) and a whitelist of
    queries; no vhca tunnel (the emulated HCA has no vhca_tunnel_commands)."""
    opcode = _hdr_get(cmd_in, "opcode")
    if MLX5_CMD_OP_GENERAL_START <= opcode < MLX5_CMD_OP_GENERAL_END:
        return True
    return opcode in (
        MLX5_CMD_OP_QUERY_HCA_CAP, MLX5_CMD_OP_QUERY_HCA_VPORT_CONTEXT,
        MLX5_CMD_OP_QUERY_ESW_VPORT_CONTEXT, MLX5_CMD_OP_QUERY_VPORT_STATE,
        MLX5_CMD_OP_QUERY_ADAPTER, MLX5_CMD_OP_QUERY_ISSI, MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT,
        MLX5_CMD_OP_QUERY_ROCE_ADDRESS, MLX5_CMD_OP_QUERY_VNIC_ENV,
        MLX5_CMD_OP_QUERY_VPORT_COUNTER, MLX5_CMD_OP_GET_DROPPED_PACKET_LOG, MLX5_CMD_OP_NOP,
        MLX5_CMD_OP_QUERY_CONG_STATUS, MLX5_CMD_OP_QUERY_CONG_PARAMS,
        MLX5_CMD_OP_QUERY_CONG_STATISTICS, MLX5_CMD_OP_QUERY_LAG)


def _devx_attr_in(attrs_: Any, attr_id: int, min_len: int) -> bytes:
    """uverbs_attr_get_alloced_ptr() of a PTR_IN attribute with UVERBS_ATTR_MIN_SIZE,
    MIN_SZ_OR_ZERO and ALLOC_AND_COPY (checked as uverbs_process_attr does): EINVAL when
    shorter than min_len but not empty; up to 8 bytes the value is inline in `data`;
    EFAULT for an unreadable buffer."""
    attr = attrs_.ioctl.by_id[attr_id][1]
    if attr.len and attr.len < min_len:
        raise KernelError(EINVAL, f"uverbs_process_attr: attribute {attr_id:#x} of "
                          f"{attr.len} bytes (spec {min_len}..)")
    if attr.len <= 8:
        return attr.data.to_bytes(8, "little")[:attr.len]
    raw = bytearray(attr.len)
    if copy_from_user(raw, attr.data, attr.len):
        raise KernelError(EFAULT, f"uverbs_process_attr: attribute {attr_id:#x} not readable")
    return bytes(raw)


def _devx_mailboxes(cmd_in: bytearray, out_len: int) -> tuple[IfcStruct, IfcStruct, dict]:
    """The IfcStructs the mailboxes of a general command hold (see the EMU note above):
    a too short input or output is a bare header, which the firmware answers with
    BAD_INP_LEN / BAD_OUTP_LEN as for a short mailbox."""
    opcode, op_mod = _hdr_get(cmd_in, "opcode"), _hdr_get(cmd_in, "op_mod")
    name = MLX5_CMD_NAMES.get(opcode, "").lower()
    in_typ, out_typ = f"{name}_in", f"{name}_out"
    if in_typ not in PRM_LAYOUTS or out_typ not in PRM_LAYOUTS:
        if in_typ in LAYOUTS:
            raise KernelError(EOPNOTSUPP, f"devx: {name} mailboxes are not converted")
        return prm_unpack("mbox_in", cmd_in), IfcStruct("mbox_out"), {}
    unions = {}
    if opcode == MLX5_CMD_OP_QUERY_HCA_CAP:
        member = _HCA_CAP_MEMBER.get(op_mod >> 1, "cmd_hca_cap")  # others: BAD_PARAM
        if member not in PRM_LAYOUTS:
            raise KernelError(EOPNOTSUPP, f"devx: capability type {op_mod >> 1:#x} pages "
                              "are not converted")
        unions = {"hca_cap_union": member}
    short_in = len(cmd_in) < MLX5_ST_SZ_BYTES(in_typ)
    in_ = prm_unpack("mbox_in" if short_in else in_typ, cmd_in, unions)
    out = IfcStruct("mbox_out" if out_len < MLX5_ST_SZ_BYTES(out_typ) else out_typ)
    return in_, out, unions


@traced
def UVERBS_HANDLER_MLX5_IB_METHOD_DEVX_OTHER(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(MLX5_IB_METHOD_DEVX_OTHER): a general command on the raw
    PRM mailboxes.  EINVAL for a mailbox shorter than its header (16 bytes in and out),
    devx_get_uid's errors, EINVAL for a command that is not general; the context's uid is
    written into the command, which runs as mlx5_cmd_do: a firmware status other than OK
    copies the output (status, syndrome) out and fails with EREMOTEIO."""
    cmd_in = bytearray(_devx_attr_in(attrs_, MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
                                     MLX5_ST_SZ_BYTES("mbox_out")))
    out_attr = attrs_.ioctl.by_id[MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT][1]
    cmd_out_len = out_attr.len
    if cmd_out_len and cmd_out_len < MLX5_ST_SZ_BYTES("mbox_out"):
        raise KernelError(EINVAL, f"uverbs_process_attr: attribute "
                          f"{MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT:#x} of {cmd_out_len} bytes")
    c = to_mucontext(ib_uverbs_get_ucontext_file(attrs_.ufile))
    dev = to_mdev(c.device)
    uid = devx_get_uid(c, cmd_in)
    if not devx_is_general_cmd(cmd_in, dev):
        raise KernelError(EINVAL, f"devx_is_general_cmd: opcode "
                          f"{_hdr_get(cmd_in, 'opcode'):#x} is not a general command")
    cmd_in[2:4] = uid.to_bytes(2, "big")  # MLX5_SET(general_obj_in_cmd_hdr, cmd_in, uid)
    in_, out, unions = _devx_mailboxes(cmd_in, cmd_out_len)
    err = mlx5_cmd_do(dev.mdev, in_, out)
    raw = prm_pack(out, unions)[:cmd_out_len].ljust(cmd_out_len, b"\0")
    uverbs_copy_to_buf(attrs_, MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT, raw)
    if err:
        raise KernelError(-err, f"mlx5_cmd_do: {MLX5_CMD_NAMES.get(_hdr_get(cmd_in, 'opcode'))}"
                          f" status {MLX5_GET('mbox_out', out, 'status'):#x} syndrome "
                          f"{MLX5_GET('mbox_out', out, 'syndrome'):#x}")


#: DECLARE_UVERBS_GLOBAL_METHODS(MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_OTHER)
# EMU: DEVX_QUERY_UAR, DEVX_QUERY_EQN, DEVX_SUBSCRIBE_EVENT, the DEVX object, UMEM and
# async fd objects are not modelled: the uapi has no such methods (EPROTONOSUPPORT)
mlx5_ib_devx_methods = {
    (MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_OTHER): uverbs_api_ioctl_method(
        UVERBS_HANDLER_MLX5_IB_METHOD_DEVX_OTHER,
        mandatory=(MLX5_IB_ATTR_DEVX_OTHER_CMD_IN, MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT)),
}
