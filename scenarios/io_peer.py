"""The `io-peer` scenario: RDMA into a device's memory BAR through io_peer_mem.

One machine with a ConnectX and a device whose BAR2 is a 1 MiB memory
(kernel_model/hw/cmb.py, a controller memory buffer), bound to uio_cmb.
A process mmaps /dev/uio0 (io_remap_pfn_range: VM_IO|VM_PFNMAP, so gup
refuses it), registers that mapping with ibv_reg_mr - gup fails, io_peer_mem
acquires it by following the PFNs, and the HCA's MTT holds the BAR's bus
addresses - then RDMA-WRITEs 4 KiB from a host buffer into it over the HCA's
loopback and reads the bytes back through its own mapping of the BAR.
"""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from kernel_model.trace import traced
from scenarios import scenario
from scenarios.gpudirect import format_stats, read_peer_stats
from userspace.libc import MAP_SHARED, O_RDWR, PROT_READ, PROT_WRITE, check
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, SendWR
from userspace.tools.write_bw import Endpoint, connect, setup

CMB = 1 << 20
N = 4096
OFFSET = 0x2100


@traced(layer="userspace")
def cmb_register(ep: Endpoint) -> tuple[int, int, MR]:
    """mmap the device memory, then ibv_reg_mr it (the io_peer_mem path)."""
    p = ep.ctx.proc
    fd = check(p.open("/dev/uio0", O_RDWR), "open /dev/uio0")
    base = check(p.mmap(0, CMB, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), "mmap")
    mr = MR(ep.pd, CMB, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE, addr=base)
    return fd, base, mr


@traced(layer="userspace")
def write_to_cmb(ep: Endpoint, raddr: int, rkey: int) -> str:
    """One signalled RDMA WRITE of 4 KiB into the device memory."""
    ep.mr.write(bytes((i * 3 + 1) & 0xFF for i in range(N)))
    ep.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(ep.mr.buf, N, ep.mr.lkey)],
                           opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                           remote_addr=raddr, rkey=rkey))
    (wc,) = ep.cq.poll_until(1)
    return v.ibv_wc_status_str(wc.status)


@scenario("io-peer", "a process mmaps a device's memory BAR (uio), ibv_reg_mrs it "
          "(gup fails, io_peer_mem follows the PFNs) and RDMA-WRITEs into it")
def io_peer() -> str:
    m = rdma_host(cmb_size=CMB)
    for mod in ("mlx5_ib", "uio_cmb", "io_peer_mem"):
        m.load_module(mod)
    p = m.spawn("app")
    tgt = p.run(setup, p, 4096, 4, 0x10)
    src = p.run(setup, p, N, 4, 0x20)
    fd, base, cmb_mr = p.run(cmb_register, tgt)
    p.run(connect, tgt, src.dest())
    p.run(connect, src, tgt.dest())
    assert p.run(write_to_cmb, src, base + OFFSET, cmb_mr.rkey) == "SUCCESS"
    got = p.load(base + OFFSET, N)
    assert got == bytes((i * 3 + 1) & 0xFF for i in range(N)), "the BAR does not hold it"
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    stats = p.run(read_peer_stats, p, "io_peer_mem")
    p.munmap(base, CMB)
    p.close(fd)
    p.exit(0)
    m.check_leaks()
    return format_stats(stats, "io_peer_mem")
