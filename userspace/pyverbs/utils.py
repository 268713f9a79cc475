"""pyverbs.utils: the string helpers pyverbs and its tests print attributes with."""

from __future__ import annotations

import struct

import userspace.pyverbs.enums as e
from userspace.pyverbs.pyverbs_error import PyverbsUserError

__all__ = ["PyverbsUserError", "access_flags_to_str", "be64toh", "gid_str",
           "gid_str_to_array", "mig_state_to_str", "mtu_to_str", "qp_state_to_str",
           "qp_type_to_str", "rereg_error_to_str"]


def gid_str(subnet_prefix: int, interface_id: int) -> str:
    """The GID of (subnet prefix, interface id), both big-endian 64-bit, as
    eight colon-separated 16-bit groups."""
    raw = struct.pack(">QQ", be64toh(subnet_prefix), be64toh(interface_id))
    return ":".join(raw[i:i + 2].hex() for i in range(0, 16, 2))


def gid_str_to_array(val: str) -> list[int]:
    """The 16 bytes of a GID written as eight 16-bit groups."""
    groups = val.split(":")
    if len(groups) != 8:
        raise PyverbsUserError(f"Invalid GID value ({val})")
    return list(b"".join(int(g, 16).to_bytes(2, "big") for g in groups))


def be64toh(num: int) -> int:
    """A 64-bit big-endian value as the host (little-endian x86) reads it."""
    return int.from_bytes(num.to_bytes(8, "little"), "big")


def _name(table: dict[int, str], value: int) -> str:
    return table.get(value, f"Invalid value ({value})")


def qp_type_to_str(qp_type: int) -> str:
    return _name({e.IBV_QPT_RC: "RC", e.IBV_QPT_UC: "UC", e.IBV_QPT_UD: "UD",
                  e.IBV_QPT_RAW_PACKET: "Raw Packet", e.IBV_QPT_XRC_SEND: "XRC Send",
                  e.IBV_QPT_XRC_RECV: "XRC Recv", e.IBV_QPT_DRIVER: "Driver QP"}, qp_type)


def qp_state_to_str(qp_state: int) -> str:
    return _name({0: "Reset", 1: "Init", 2: "RTR", 3: "RTS", 4: "SQD", 5: "SQE", 6: "Error",
                  7: "Unknown"}, qp_state)


def mtu_to_str(mtu: int) -> str:
    return _name({1: "256 Bytes", 2: "512 Bytes", 3: "1024 Bytes", 4: "2048 Bytes",
                  5: "4096 Bytes"}, mtu)


def mig_state_to_str(mig: int) -> str:
    return _name({0: "Migrated", 1: "Rearm", 2: "Armed"}, mig)


def access_flags_to_str(flags: int) -> str:
    names = {e.IBV_ACCESS_LOCAL_WRITE: "Local write", e.IBV_ACCESS_REMOTE_WRITE: "Remote write",
             e.IBV_ACCESS_REMOTE_READ: "Remote read",
             e.IBV_ACCESS_REMOTE_ATOMIC: "Remote atomic", e.IBV_ACCESS_MW_BIND: "MW bind",
             e.IBV_ACCESS_ZERO_BASED: "Zero based", e.IBV_ACCESS_ON_DEMAND: "On demand"}
    return " ".join(n for bit, n in names.items() if flags & bit)


def rereg_error_to_str(error: int) -> str:
    """The name of an ibv_rereg_mr() error code (enum ibv_rereg_mr_err_code)."""
    try:
        return e.ibv_rereg_mr_err_code(error).name
    except ValueError:
        return f"Unknown error ({error})"
