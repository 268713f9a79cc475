"""Mirrors the address-handle part of rdma-core providers/mlx5/verbs.c (mlx5_create_ah,
mlx5_destroy_ah) and the AV a UD send WQE carries (struct mlx5_wqe_av, mlx5dv.h).

libmlx5 builds the address vector in user space: the GRH fields (source GID index,
destination GID, hop limit, traffic class, flow label), the rate and service level,
and on a RoCE v2 source GID the UDP source port (in the AV's rlid).  The one thing
it cannot find by itself on a RoCE port is the destination MAC: it asks the kernel
with CREATE_AH (the kernel resolves it from the destination GID) and keeps the
MAC mlx5_ib_create_ah_resp carries; the AH then has a kernel handle, destroyed
with it.  set_datagram_seg (qp.py) copies the AV into each UD send WQE.

Errors are rdma-core's: EINVAL for a port the device does not have and for an AV
without a GRH on a port that needs one (RoCE); a source GID index with no GID
type fails as ibv_query_gid_type does; the kernel's errno otherwise.

# EMU: the port's link layer and flags are queried at each create (rdma-core
# caches them in the context after the first query); the device is always told
# (cmds_supp_uhw has CREATE_AH), so ibv_resolve_eth_l2_from_gid is not modelled.
"""

from __future__ import annotations

import errno
import random
import struct
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_ah_resp
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs import IBV_GID_TYPE_SYSFS_ROCE_V2, ibv_query_gid_type
from userspace.libibverbs.verbs_types import ibv_ah

IBV_LINK_LAYER_ETHERNET = 2
IBV_QPF_GRH_REQUIRED = 1 << 0
MLX5_USER_CMDS_SUPP_UHW_CREATE_AH = 1 << 1
IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, IB_ROCE_UDP_ENCAP_VALID_PORT_MAX = 0xC000, 0xFFFF
IB_GRH_FLOWLABEL_MASK = 0x000FFFFF
MLX5_EXTENDED_UD_AV = 0x80000000
MLX5_WQE_AV_SIZE = 48


@attrs.define
class mlx5_wqe_av:
    """Mirrors struct mlx5_wqe_av: the 48-byte address vector of a UD WQE."""

    qkey: int = 0
    dqp_dct: int = 0
    stat_rate_sl: int = 0
    fl_mlid: int = 0
    rlid: int = 0            # IB: the destination LID; RoCE v2: the UDP source port
    rmac: bytes = bytes(6)
    tclass: int = 0
    hop_limit: int = 0
    grh_gid_fl: int = 0
    rgid: bytes = bytes(16)

    def pack(self) -> bytes:
        """The AV as the device reads it (big-endian fields)."""
        return struct.pack(">II I BBH 4s 6sBB I 16s", self.qkey, 0, self.dqp_dct,
                           self.stat_rate_sl, self.fl_mlid, self.rlid, bytes(4),
                           self.rmac, self.tclass, self.hop_limit, self.grh_gid_fl, self.rgid)


@attrs.define(eq=False)
class mlx5_ah(ibv_ah):
    """Mirrors struct mlx5_ah: the verbs AH, its AV, whether the kernel has one too."""

    av: mlx5_wqe_av = attrs.Factory(mlx5_wqe_av)
    kern_ah: bool = False


def ibv_flow_label_to_udp_sport(fl: int) -> int:
    """Mirrors ibv_flow_label_to_udp_sport(): RoCE v2's UDP source port from a flow
    label (the kernel's rdma_flow_label_to_udp_sport)."""
    fl_low, fl_high = fl & 0x03FFF, fl & 0xFC000
    fl_low ^= fl_high >> 14
    return fl_low | IB_ROCE_UDP_ENCAP_VALID_PORT_MIN


def mlx5_ah_set_udp_sport(ah: mlx5_ah, attr: Any) -> None:
    """Mirrors mlx5_ah_set_udp_sport(): from the flow label, else a random port of
    the RoCE v2 range."""
    fl = attr.grh.flow_label & IB_GRH_FLOWLABEL_MASK
    ah.av.rlid = ibv_flow_label_to_udp_sport(fl) if fl else \
        random.randint(IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, IB_ROCE_UDP_ENCAP_VALID_PORT_MAX)


@traced
def mlx5_create_ah(pd: Any, attr: Any) -> mlx5_ah:
    """Mirrors mlx5_create_ah(): see the module docstring."""
    ctx = pd.context
    if attr.port_num < 1 or attr.port_num > ctx.num_ports:
        raise VerbsError(errno.EINVAL, f"mlx5_create_ah: port {attr.port_num}")
    port_attr = ctx.ops.query_port(ctx, attr.port_num)
    is_eth = port_attr.link_layer == IBV_LINK_LAYER_ETHERNET
    grh_req = bool(port_attr.flags & IBV_QPF_GRH_REQUIRED)
    if not attr.is_global and (is_eth or grh_req):
        raise VerbsError(errno.EINVAL, "mlx5_create_ah: the port requires a GRH")
    ah = mlx5_ah(ctx, pd)
    av = ah.av
    static_rate = attr.static_rate & 0xF
    if is_eth:
        if ibv_query_gid_type(ctx, attr.port_num, attr.grh.sgid_index) == \
                IBV_GID_TYPE_SYSFS_ROCE_V2:
            mlx5_ah_set_udp_sport(ah, attr)
        grh = 0     # every RoCE packet has a GRH: the bit is reserved there
        av.stat_rate_sl = static_rate << 4 | (attr.sl & 0x7) << 1
    else:
        av.fl_mlid = attr.src_path_bits & 0x7F
        av.rlid = attr.dlid & 0xFFFF
        grh = 1
        av.stat_rate_sl = static_rate << 4 | attr.sl & 0xF
    if attr.is_global:
        g = attr.grh
        av.tclass, av.hop_limit = g.traffic_class & 0xFF, g.hop_limit & 0xFF
        av.grh_gid_fl = grh << 30 | (g.sgid_index & 0xFF) << 20 | g.flow_label & 0xFFFFF
        av.rgid = bytes(g.dgid)
    if is_eth:
        if ctx.resp.cmds_supp_uhw & MLX5_USER_CMDS_SUPP_UHW_CREATE_AH:
            resp, drv = c.ibv_cmd_create_ah(pd, attr, mlx5_ib_create_ah_resp)
            ah.handle, ah.kern_ah = resp.ah_handle, True
            av.rmac = bytes(drv.dmac)
        else:  # ibv_resolve_eth_l2_from_gid()  # EMU: see the module docstring
            raise VerbsError(errno.EOPNOTSUPP, "mlx5_create_ah: no CREATE_AH in the kernel")
    return ah


@traced
def mlx5_destroy_ah(ah: mlx5_ah) -> None:
    """Mirrors mlx5_destroy_ah(): DESTROY_AH when the kernel has the AH too."""
    if ah.kern_ah:
        c.ibv_cmd_destroy_ah(ah.context, ah.handle)
        ah.kern_ah = False


def set_datagram_seg(wr: Any) -> bytes:
    """Mirrors set_datagram_seg(): the AH's AV with the remote QPN (and the extended-AV
    bit) and the Q_Key of the WR - the 48-byte datagram segment of a UD send WQE."""
    av = attrs.evolve(wr.ah.av, dqp_dct=(wr.remote_qpn & 0xFFFFFF) | MLX5_EXTENDED_UD_AV,
                      qkey=wr.remote_qkey & 0xFFFFFFFF)
    return av.pack()
