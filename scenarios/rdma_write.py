"""The `rdma-write` scenario: bytes from a process on one machine into a process on another.

Two machines, host-a and host-b, have their ConnectX ports on one Fabric.
A server process on host-b registers a buffer with remote write; a client
on host-a registers its own, and both bring an RC QP to RTS against the
other's (GID, QPN).  Then the client:

  ibv_post_send (1 RDMA WRITE, signalled)
     mlx5_post_send    the WQE into the SQ ring: control, remote-address and
                       data segments (3 x 16 bytes)
     post_send_db      the doorbell record's send counter, then - one small
                       WQE - a BlueFlame copy of the WQE to the UAR register
  [mlx5_hca host-a]    hca_doorbell takes the WQE from the BlueFlame write;
                       hca_sq_process reads the doorbell record by DMA,
                       hca_execute translates the lkey through the mkey's MTT,
                       hca_dma_gather reads the bytes, fabric_transmit sends
  [mlx5_hca host-b]    hca_responder checks the rkey, hca_dma_scatter writes
                       the bytes into the server's buffer, and ACKs
  [mlx5_hca host-a]    hca_requester_answer: hca_cqe_write
  ibv_poll_cq          the CQE, found by its owner bit
  ibv_post_send (2 WRs) two WQEs, one 64-bit doorbell (no BlueFlame for more
                       than one WQE); the register offset toggles each time;
                       only the second is signalled, and its CQE retires both

The server checks the bytes; both sides tear down and the machines pass
the leak check.
"""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric
from kernel_model.trace import traced
from scenarios import scenario
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR
from userspace.tools.write_bw import Endpoint, connect, setup

SIZE = 64


@traced(layer="userspace")
def write_signalled(ep: Endpoint, remote: dict) -> list:
    """One signalled RDMA WRITE of SIZE bytes, polled to its completion."""
    ep.mr.write(bytes(range(SIZE)))
    sge = v.ibv_sge(ep.mr.buf, SIZE, ep.mr.lkey)
    ep.qp.post_send(SendWR(wr_id=1, sg_list=[sge], opcode=v.IBV_WR_RDMA_WRITE,
                           send_flags=v.IBV_SEND_SIGNALED, remote_addr=remote["vaddr"],
                           rkey=remote["rkey"]))
    return ep.cq.poll_until(1)


@traced(layer="userspace")
def write_chain(ep: Endpoint, remote: dict) -> list:
    """Two chained WRITEs in one post, only the second signalled: its CQE
    retires both.  Together they fill the remote buffer's second half."""
    second = SendWR(wr_id=3, sg_list=[v.ibv_sge(ep.mr.buf + SIZE // 2, SIZE // 2, ep.mr.lkey)],
                    opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                    remote_addr=remote["vaddr"] + SIZE + SIZE // 2, rkey=remote["rkey"])
    ep.qp.post_send(SendWR(wr_id=2, next=second,
                           sg_list=[v.ibv_sge(ep.mr.buf, SIZE // 2, ep.mr.lkey)],
                           opcode=v.IBV_WR_RDMA_WRITE, remote_addr=remote["vaddr"] + SIZE,
                           rkey=remote["rkey"]))
    return ep.cq.poll_until(1)


@scenario("rdma-write", "a client on host-a RDMA-WRITEs 64 bytes into a server's buffer on "
          "host-b: WQE, doorbell record, BlueFlame, the HCAs' DMA across the fabric, CQE")
def rdma_write() -> None:
    fabric = Fabric()
    hosts = [rdma_host(name=name, fabric=fabric) for name in ("host-a", "host-b")]
    for m in hosts:
        m.load_module("mlx5_ib")
    client, server = hosts[0].spawn("client"), hosts[1].spawn("server")
    srv = server.run(setup, server, 2 * SIZE, 16, 0x100)
    cli = client.run(setup, client, 2 * SIZE, 16, 0x200)
    server.run(connect, srv, cli.dest())
    client.run(connect, cli, srv.dest())
    wcs = client.run(write_signalled, cli, srv.dest())
    wcs += client.run(write_chain, cli, srv.dest())
    assert [(wc.wr_id, wc.status) for wc in wcs] == [(1, 0), (3, 0)], wcs
    got = server.run(srv.mr.read, 2 * SIZE)
    assert got == bytes(range(SIZE)) * 2, got
    client.run(cli.ctx.close)
    server.run(srv.ctx.close)
    for p in (client, server):
        p.exit(0)
    for m in hosts:
        m.check_leaks()
