"""Mirrors the DevX general command of rdma-core providers/mlx5/verbs.c and what the
context learns with it at open (get_hca_general_caps).

mlx5dv_devx_general_cmd(ctx, in, inlen, out, outlen) (dv.py; the provider's op here)
runs one PRM command of the
kernel's whitelist (MLX5_IB_METHOD_DEVX_OTHER on MLX5_IB_OBJECT_DEVX): the input and
output mailboxes are raw big-endian PRM bytes in the caller's memory.  It returns 0 or
the errno - EOPNOTSUPP for a context that is not mlx5's, EREMOTEIO when the firmware
answered a bad status (the output then holds status and syndrome), the kernel's errno
otherwise (EINVAL for a command that is not general or a mailbox shorter than its
header, EOPNOTSUPP for a whitelisted query without a DEVX uid).

get_hca_general_caps() is the first step of mlx5_query_device_ctx: QUERY_HCA_CAP of the
current general capabilities through a DevX general command; a failure (a context
without DevX) leaves the defaults.  What it keeps: max_dc_rd_atom / max_dc_init_rd_atom
(1 << log_max_ra_req_dc / log_max_ra_res_dc), the LAG caps and general_obj_types.
# EMU: the other capabilities it reads (data-in-order, UDP sport, QoS, signature,
# crypto, DMA MMO, cap 2) stay 0 here; the emulated HCA reports none of them.
"""

from __future__ import annotations

from typing import Any

from kernel_model.trace import traced
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_DEVX_OTHER_CMD_IN,
    MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT,
    MLX5_IB_METHOD_DEVX_OTHER,
    MLX5_IB_OBJECT_DEVX,
)
from userspace.libc import free, posix_memalign
from userspace.libibverbs.cmd import VerbsError, execute_ioctl

# the bits of rdma-core's providers/mlx5/mlx5_ifc.h this file reads and writes:
# field -> (bit offset, width) in query_hca_cap_in / query_hca_cap_out
MLX5_CMD_OP_QUERY_HCA_CAP = 0x100
MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE, HCA_CAP_OPMOD_GET_CUR = 0x0, 0x1
QUERY_HCA_CAP_IN_BYTES, QUERY_HCA_CAP_OUT_BYTES = 0x10, 0x1010
_CAPABILITY = 0x80  # query_hca_cap_out.capability
_FIELDS = {
    "opcode": (0x0, 16), "op_mod": (0x30, 16), "status": (0x0, 8), "syndrome": (0x20, 32),
    "capability.cmd_hca_cap.log_max_ra_req_dc": (_CAPABILITY + 0x12a, 6),
    "capability.cmd_hca_cap.log_max_ra_res_dc": (_CAPABILITY + 0x13a, 6),
    "capability.cmd_hca_cap.lag_tx_port_affinity": (_CAPABILITY + 0x278, 1),
    "capability.cmd_hca_cap.num_lag_ports": (_CAPABILITY + 0x27c, 4),
    "capability.cmd_hca_cap.general_obj_types": (_CAPABILITY + 0x400, 64),
}


def DEVX_SET(buf: bytearray, field: str, value: int) -> None:
    """Mirrors DEVX_SET(): store value into a big-endian PRM mailbox."""
    off, width = _FIELDS[field]
    nbytes = (off % 8 + width + 7) // 8
    start = off // 8
    shift = nbytes * 8 - off % 8 - width
    cur = int.from_bytes(buf[start:start + nbytes], "big")
    mask = ((1 << width) - 1) << shift
    cur = (cur & ~mask) | ((value << shift) & mask)
    buf[start:start + nbytes] = cur.to_bytes(nbytes, "big")


def DEVX_GET(buf: bytes, field: str) -> int:
    """Mirrors DEVX_GET()/DEVX_GET64(): a field of a big-endian PRM mailbox."""
    off, width = _FIELDS[field]
    nbytes = (off % 8 + width + 7) // 8
    start = off // 8
    cur = int.from_bytes(buf[start:start + nbytes], "big")
    return (cur >> (nbytes * 8 - off % 8 - width)) & ((1 << width) - 1)


@traced
def _mlx5dv_devx_general_cmd(ctx: Any, in_: int, inlen: int, out: int, outlen: int) -> int:
    """Mirrors _mlx5dv_devx_general_cmd(): MLX5_IB_METHOD_DEVX_OTHER with the input
    mailbox (fill_attr_in) and the output one (fill_attr_out); 0 or the errno."""
    try:
        execute_ioctl(ctx, MLX5_IB_OBJECT_DEVX, MLX5_IB_METHOD_DEVX_OTHER, [
            (MLX5_IB_ATTR_DEVX_OTHER_CMD_IN, (in_, inlen), "ptr_in"),
            (MLX5_IB_ATTR_DEVX_OTHER_CMD_OUT, (out, outlen), "ptr_out")],
            "mlx5dv_devx_general_cmd")
    except VerbsError as e:
        return e.errno
    return 0


@traced
def get_hca_general_caps(mctx: Any) -> None:
    """Mirrors get_hca_general_caps() (see the module docstring).  Void."""
    proc = mctx.proc
    inbuf = bytearray(QUERY_HCA_CAP_IN_BYTES)
    DEVX_SET(inbuf, "opcode", MLX5_CMD_OP_QUERY_HCA_CAP)
    DEVX_SET(inbuf, "op_mod", MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE | HCA_CAP_OPMOD_GET_CUR)
    size = QUERY_HCA_CAP_IN_BYTES + QUERY_HCA_CAP_OUT_BYTES
    buf = posix_memalign(proc, 8, size)  # the in[] and out[] arrays on the C stack
    try:
        proc.store(buf, bytes(inbuf) + bytes(QUERY_HCA_CAP_OUT_BYTES))
        out_at = buf + QUERY_HCA_CAP_IN_BYTES
        # mlx5dv_devx_general_cmd() of an mlx5 context: the provider's op
        if _mlx5dv_devx_general_cmd(mctx, buf, QUERY_HCA_CAP_IN_BYTES, out_at,
                                    QUERY_HCA_CAP_OUT_BYTES):
            return
        out = proc.load(out_at, QUERY_HCA_CAP_OUT_BYTES)
    finally:
        free(proc, buf, size)
    cap = "capability.cmd_hca_cap."
    mctx.lag_tx_port_affinity = DEVX_GET(out, cap + "lag_tx_port_affinity")
    mctx.num_lag_ports = DEVX_GET(out, cap + "num_lag_ports")
    mctx.general_obj_types_caps = DEVX_GET(out, cap + "general_obj_types")
    mctx.max_dc_rd_atom = 1 << DEVX_GET(out, cap + "log_max_ra_req_dc")
    mctx.max_dc_init_rd_atom = 1 << DEVX_GET(out, cap + "log_max_ra_res_dc")
