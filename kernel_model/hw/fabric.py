"""The Ethernet fabric between HCA ports (device model, not kernel code).

RoCE carries InfiniBand transport packets in Ethernet frames, so what joins
two ConnectX ports is a switch: it delivers a frame to the port whose MAC is
the frame's destination.  An RC QP on machine A reaches one on machine B by
(destination MAC, destination QPN); the MAC is what ib_core resolved from
the remote GID when the QP went to RTR (qpc.primary_address_path.rmac).

    fabric = Fabric()
    a = rdma_host(name="a", fabric=fabric)
    b = rdma_host(name="b", fabric=fabric)

A port not attached to any fabric still reaches itself: the HCA loops a
frame for its own MAC back internally (that is how two QPs of one machine
talk).  A frame for a MAC nobody owns is dropped, and RC's retry timer
turns that into a transport-retry-exceeded completion.

# EMU: one lossless, in-order switch with no link speed, no MTU
# segmentation (a message travels as one frame) and no congestion; PFC,
# ECN and multicast are not modelled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kernel_model.hw.mlx5 import ConnectX


class Fabric:
    """A switch: MAC -> the ConnectX that owns it."""

    def __init__(self, name: str = "fabric0"):
        self.name = name
        self.ports: dict[int, ConnectX] = {}
        self.frames = 0           # frames switched between two different HCAs

    def __repr__(self) -> str:
        macs = ", ".join(f"{mac:012x}:{hca.machine.name}" for mac, hca in self.ports.items())
        return f"Fabric {self.name} [{macs}]"

    def attach(self, hca: ConnectX) -> None:
        """Plug the HCA's port into the switch (a cable)."""
        mac = hca.fw.vport.mac
        if mac in self.ports and self.ports[mac] is not hca:
            raise ValueError(f"Fabric.attach: MAC {mac:012x} is already on {self.name}")
        self.ports[mac] = hca
        hca.fabric = self

    def detach(self, hca: ConnectX) -> None:
        """Pull the cable."""
        for mac, h in list(self.ports.items()):
            if h is hca:
                del self.ports[mac]
        hca.fabric = None

    def route(self, src: ConnectX, dmac: int) -> ConnectX | None:
        """The HCA a frame from `src` to `dmac` reaches, or None (dropped)."""
        if dmac == src.fw.vport.mac:
            return src            # the port's internal loopback
        dst = self.ports.get(dmac)
        if dst is not None:
            self.frames += 1
        return dst


def route(src: ConnectX, dmac: int) -> ConnectX | None:
    """Where a frame from `src` goes: its fabric's answer, or loopback only."""
    fabric = getattr(src, "fabric", None)
    if fabric is not None:
        return fabric.route(src, dmac)
    return src if dmac == src.fw.vport.mac else None
