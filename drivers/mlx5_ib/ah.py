"""Mirrors drivers/infiniband/hw/mlx5/ah.c: address handles.

An mlx5 AH is the address vector (struct mlx5_av) a UD send WQE carries in its
datagram segment.  A user's AH is built by libmlx5 in user space; the kernel's
part of CREATE_AH on a RoCE port is to hand back the destination MAC the core
resolved (mlx5_ib_create_ah_resp.dmac), which user space cannot find by itself.
The kernel keeps its own copy of the AV (create_ib_ah), as it would use for a
kernel UD QP.  Destroying an AH has nothing to release in the device.
"""

from __future__ import annotations

import random

import attrs

from drivers.ib_core.device import ib_device
from drivers.ib_core.ib_verbs import (
    IB_AH_GRH,
    IB_GID_TYPE_ROCE_UDP_ENCAP,
    IB_RATE_2_5_GBPS,
    IB_RATE_800_GBPS,
    IB_RATE_PORT_CURRENT,
    IB_ROCE_UDP_ENCAP_VALID_PORT_MIN,
    RDMA_AH_ATTR_TYPE_ROCE,
    ib_ah,
    ib_copy_to_udata,
    ib_udata,
    rdma_ah_init_attr,
    rdma_flow_label_to_udp_sport,
)
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, to_mdev
from drivers.mlx5_ib.qp_modify import ib_to_mlx5_rate_map
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_ah_resp

IB_ROCE_UDP_ENCAP_VALID_PORT_MAX = 0xFFFF
#: offsetofend(struct mlx5_ib_create_ah_resp, dmac)
MLX5_CREATE_AH_RESP_MIN_LEN = 10


@attrs.define
class mlx5_av:
    """Mirrors struct mlx5_av (big-endian fields as integers)."""

    dqp_dct: int = 0
    stat_rate_sl: int = 0
    fl_mlid: int = 0
    rlid: int = 0            # IB: the destination LID; RoCE v2: the UDP source port
    rmac: bytes = bytes(6)
    tclass: int = 0
    hop_limit: int = 0
    grh_gid_fl: int = 0
    rgid: bytes = bytes(16)


class mlx5_ib_ah(ib_ah):
    """Mirrors struct mlx5_ib_ah: the core AH, its AV and the LAG port (none here)."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.av = mlx5_av()
        self.xmit_port = 0

    def __repr__(self) -> str:
        return f"mlx5 AH {self.device.name} dmac={self.av.rmac.hex()}"


def mlx5r_ib_rate(dev: mlx5_ib_dev, rate: int) -> int:
    """Mirrors mlx5r_ib_rate(): the AV's rate code - 0 (port rate) for the port's
    current rate or what is no IB rate, else the nearest lower rate the device
    supports."""
    if rate == IB_RATE_PORT_CURRENT or not IB_RATE_2_5_GBPS <= rate <= IB_RATE_800_GBPS:
        return 0
    supported = MLX5_CAP_GEN(dev.mdev, "stat_rate_support")
    while rate != IB_RATE_PORT_CURRENT and not 1 << ib_to_mlx5_rate_map(rate) & supported:
        rate -= 1
    return ib_to_mlx5_rate_map(rate) if rate else 0


def create_ib_ah(dev: mlx5_ib_dev, ah: mlx5_ib_ah, init_attr: rdma_ah_init_attr) -> None:
    """Mirrors create_ib_ah(): the AV from the address attributes - the GRH part
    (dgid, traffic class, hop limit, sgid index, flow label), the rate, and on RoCE
    the destination MAC, the priority and for a RoCE v2 source GID the UDP source
    port (from the flow label, else random); on IB the LID and path bits."""
    ah_attr = init_attr.ah_attr
    av = ah.av
    if ah_attr.ah_flags & IB_AH_GRH:
        grh = ah_attr.grh
        av.rgid = bytes(grh.dgid)
        av.grh_gid_fl = grh.flow_label | 1 << 30 | grh.sgid_index << 20
        av.hop_limit, av.tclass = grh.hop_limit, grh.traffic_class
    av.stat_rate_sl = mlx5r_ib_rate(dev, ah_attr.static_rate) << 4
    if ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE:
        sgid = ah_attr.grh.sgid_attr
        if sgid is not None and sgid.gid_type == IB_GID_TYPE_ROCE_UDP_ENCAP:
            fl = ah_attr.grh.flow_label
            av.rlid = rdma_flow_label_to_udp_sport(fl) if fl else \
                random.randint(IB_ROCE_UDP_ENCAP_VALID_PORT_MIN, IB_ROCE_UDP_ENCAP_VALID_PORT_MAX)
        av.rmac = bytes(ah_attr.dmac)
        av.stat_rate_sl |= (ah_attr.sl & 0x7) << 1
    else:
        av.rlid = ah_attr.dlid
        av.fl_mlid = ah_attr.src_path_bits & 0x7F
        av.stat_rate_sl |= ah_attr.sl & 0xF


@traced
def mlx5_ib_create_ah(ibah: mlx5_ib_ah, init_attr: rdma_ah_init_attr,
                      udata: ib_udata | None) -> None:
    """Mirrors mlx5_ib_create_ah() (create_ah and create_user_ah): EINVAL for a RoCE
    AV without a GRH; for a user's RoCE AH the resolved destination MAC goes back in
    mlx5_ib_create_ah_resp (EINVAL if the response has no room for it), then the AV."""
    ah_attr = init_attr.ah_attr
    dev = to_mdev(ibah.device)
    if ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE and not ah_attr.ah_flags & IB_AH_GRH:
        raise KernelError(EINVAL, "mlx5_ib_create_ah: RoCE address handle without a GRH")
    if ah_attr.type == RDMA_AH_ATTR_TYPE_ROCE and udata is not None:
        if udata.outlen < MLX5_CREATE_AH_RESP_MIN_LEN:
            raise KernelError(EINVAL, f"mlx5_ib_create_ah: response of {udata.outlen} bytes")
        resp = mlx5_ib_create_ah_resp(response_length=MLX5_CREATE_AH_RESP_MIN_LEN,
                                      dmac=bytes(ah_attr.dmac))
        ib_copy_to_udata(udata, resp.pack(), MLX5_CREATE_AH_RESP_MIN_LEN)
    create_ib_ah(dev, ibah, init_attr)


@traced
def mlx5_ib_destroy_ah(ah: mlx5_ib_ah, flags: int) -> None:
    """Mirrors mlx5_ib_destroy_ah(): nothing to undo in the device."""
