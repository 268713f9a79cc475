"""ib_write_bw, in the style of perftest: RC RDMA WRITE bandwidth between two processes.

    peermem write-bw --size 65536 --iters 1000 [--two-machines]

A server and a client process each open mlx5_0, allocate a PD, a CQ, a
buffer registered with remote write, and an RC QP; they exchange (QPN, PSN,
rkey, address, GID) - perftest does it over a TCP socket, here by handing
the values across (# EMU: out-of-band exchange without sockets) - and move
their QPs RESET -> INIT -> RTR -> RTS.  The client keeps up to tx_depth
RDMA WRITEs in flight, signalling every cq_mod-th one (perftest's CQ
moderation), and polls for completions; at the end the server checks every
byte it received.

The table is perftest's.  Times are wall-clock times of the emulation, so
the figures say how fast the emulated stack moves bytes, not what a
ConnectX would: BW average is all bytes over the whole run; BW peak is the
best rate over any tx_depth consecutive completions (perftest takes the
best over every span of completions, which costs O(n^2)).

Both processes run with RLIMIT_MEMLOCK unlimited, as perftest is run (as
root, or after `ulimit -l unlimited`): with the 8 MiB default any buffer
near 8 MiB fails ibv_reg_mr with ENOMEM.  A verb that fails while the two
sides are set up raises SetupError naming the parameter that sized it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs

from kernel_model.uapi.resource import RLIM_INFINITY
from userspace.cuda.runtime import cudaMemcpyDeviceToHost, cudaMemcpyHostToDevice, cudart
from userspace.libc import free, posix_memalign
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.libibverbs.verbs import ibv_sge

MB = 1 << 20  # perftest's MB/sec is 2^20 bytes per second
RULE = "-" * 87


class SetupError(ValueError):
    """A verb of the setup failed for the size or depth asked for (one line)."""


class RunError(RuntimeError):
    """The test itself failed: a completion in error, or data that did not arrive."""


@attrs.define
class Endpoint:
    """One side's resources, and what it tells the other side (pp_dest in perftest)."""

    ctx: Any
    pd: Any
    cq: Any
    mr: Any
    qp: Any
    gid: bytes
    psn: int
    gpu: bool = False          # the buffer is GPU memory (--use-gpu)

    def dest(self) -> dict[str, int | bytes]:
        return {"qpn": self.qp.qp_num, "psn": self.psn, "rkey": self.mr.rkey,
                "vaddr": self.mr.buf, "gid": self.gid}


def _gid_text(gid: bytes) -> str:
    return ":".join(f"{b:02d}" for b in gid)


def _step(what: str, param: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """fn(*args, **kw); an OSError (the verb's errno) becomes SetupError naming `param`."""
    try:
        return fn(*args, **kw)
    except OSError as e:
        raise SetupError(f"{param}: {what} failed: {e}") from None


def setup(proc: Any, size: int, tx_depth: int, psn: int, use_gpu: bool = False) -> Endpoint:
    """ctx, PD, CQ, a registered buffer and an RC QP (perftest's ctx_init).  With
    use_gpu the buffer is cudaMalloc'd (perftest --use_cuda): ibv_reg_mr then goes
    through the peer-memory client.  SetupError if the CQ, the QP or the buffer
    cannot be had for this tx_depth or size (what was made is freed at the
    process's exit, as the kernel frees it)."""
    ctx = Context(proc)
    pd = PD(ctx)
    cq = _step("ibv_create_cq", f"--tx-depth {tx_depth}", CQ, ctx, tx_depth)
    access = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
    what = f"--size {size}"
    if use_gpu:
        addr = _step("cudaMalloc", what, cudart(proc).cudaMalloc, max(size, 1))
        mr = _step("ibv_reg_mr", what, MR, pd, max(size, 1), access, addr=addr)
    else:
        mr = _step("ibv_reg_mr", what, MR, pd, max(size, 1), access)
    cap = QPCap(max_send_wr=tx_depth, max_recv_wr=1, max_send_sge=1, max_recv_sge=1)
    qp = _step("ibv_create_qp", f"--tx-depth {tx_depth}", QP, pd, QPInitAttr(cq, cq, cap=cap))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn, use_gpu)


def fill(ep: Endpoint, data: bytes) -> None:
    """Put data at the start of the endpoint's buffer (cudaMemcpy for GPU memory)."""
    if not ep.gpu:
        ep.mr.write(data)
        return
    proc = ep.ctx.proc
    host = posix_memalign(proc, 0, len(data))
    try:
        proc.store(host, data)
        cudart(proc).cudaMemcpy(ep.mr.buf, host, len(data), cudaMemcpyHostToDevice)
    finally:
        free(proc, host, len(data))


def contents(ep: Endpoint, n: int) -> bytes:
    """The first n bytes of the endpoint's buffer (cudaMemcpy for GPU memory)."""
    if not ep.gpu:
        return ep.mr.read(n)
    proc = ep.ctx.proc
    host = posix_memalign(proc, 0, n)
    try:
        cudart(proc).cudaMemcpy(host, ep.mr.buf, n, cudaMemcpyDeviceToHost)
        return proc.load(host, n)
    finally:
        free(proc, host, n)


def teardown(ep: Endpoint) -> None:
    """Close the verbs context (its MR first), then free the GPU buffer if there is one."""
    buf = ep.mr.buf
    ep.ctx.close()
    if ep.gpu:
        cudart(ep.ctx.proc).cudaFree(buf)


def connect(ep: Endpoint, remote: dict[str, int | bytes]) -> None:
    """RESET -> INIT -> RTR -> RTS against the other side's QPN, PSN and GID."""
    ep.qp.to_rts(remote["gid"], remote["qpn"], sq_psn=ep.psn, rq_psn=remote["psn"])


def run_client(ep: Endpoint, remote: dict[str, int | bytes], size: int, iters: int,
               tx_depth: int, cq_mod: int) -> tuple[list[float], list[float]]:
    """Post `iters` RDMA WRITEs, at most tx_depth outstanding, every cq_mod-th
    signalled; returns the post and completion times per message."""
    pattern = bytes((i * 131 + 7) & 0xFF for i in range(min(size, 4096)))
    fill(ep, (pattern * (size // max(len(pattern), 1) + 1))[:size])
    tposted = [0.0] * iters
    tcompleted = [0.0] * iters
    scnt = ccnt = 0
    while ccnt < iters:
        while scnt < iters and scnt - ccnt < tx_depth:
            last = scnt == iters - 1
            flags = v.IBV_SEND_SIGNALED if (scnt + 1) % cq_mod == 0 or last else 0
            tposted[scnt] = time.perf_counter()
            ep.qp.post_send(SendWR(wr_id=scnt, sg_list=[ibv_sge(ep.mr.buf, size, ep.mr.lkey)],
                                   opcode=v.IBV_WR_RDMA_WRITE, send_flags=flags,
                                   remote_addr=remote["vaddr"], rkey=remote["rkey"]))
            scnt += 1
        for wc in ep.cq.poll_until(1):
            if wc.status != v.IBV_WC_SUCCESS:
                raise RunError(f"write-bw: completion error "
                               f"{v.ibv_wc_status_str(wc.status)} (wr_id {wc.wr_id})")
            now = time.perf_counter()
            for i in range(ccnt, wc.wr_id + 1):   # one CQE completes the unsignalled ones too
                tcompleted[i] = now
            ccnt = wc.wr_id + 1
    return tposted, tcompleted


def report(size: int, iters: int, tx_depth: int, tposted: list[float],
           tcompleted: list[float]) -> tuple[str, float, float, float]:
    """perftest's result line: (#bytes #iterations BW peak BW average MsgRate)."""
    total = max(tcompleted[-1] - tposted[0], 1e-9)
    avg = size * iters / total / MB
    window = min(tx_depth, iters)
    best = min((tcompleted[j + window - 1] - tposted[j]) / window
               for j in range(iters - window + 1))
    peak = max(size / max(best, 1e-9) / MB, avg)
    rate = iters / total / 1e6
    line = f" {size:<10} {iters:<10}       {peak:<.2f}            {avg:<.2f}" \
           f"                  {rate:.6f}"
    return line, peak, avg, rate


def main(machines: tuple[Any, Any], size: int = 65536, iters: int = 1000,
         tx_depth: int = 128, cq_mod: int = 100, out: Any = print,
         use_gpu: bool = False) -> dict[str, float]:
    """Run the test between a server process on machines[0] and a client on
    machines[1] (the same machine for loopback); print perftest's report.
    use_gpu: both buffers in GPU memory (the machines need a GPU, the nvidia
    module and a peer-memory client)."""
    if size < 1 or iters < 1:
        raise ValueError("write-bw: --size and --iters must be at least 1")
    tx_depth = min(tx_depth, iters)
    server, client = (m.spawn("ib_write_bw", rlimit_memlock=RLIM_INFINITY) for m in machines)
    try:
        srv = server.run(setup, server, size, tx_depth, 0x1A2B3C, use_gpu)
        cli = client.run(setup, client, size, tx_depth, 0x4D5E6F, use_gpu)
        server.run(connect, srv, cli.dest())
        client.run(connect, cli, srv.dest())
        out(RULE)
        out("                    RDMA_Write BW Test")
        out(" Number of qps   : 1            Transport type : IB")
        out(" Connection type : RC           Using SRQ      : OFF")
        out(f" TX depth        : {tx_depth}")
        out(f" CQ Moderation   : {cq_mod}")
        out(" Mtu             : 1024[B]")
        out(" Link type       : Ethernet")
        out(" GID index       : 0")
        out(" Data ex. method : in-process (emulated)")
        if use_gpu:
            out(" Memory          : GPU (cudaMalloc; registered through the peer client)")
        out(RULE)
        for who, ep in (("local", cli), ("remote", srv)):
            out(f" {who} address: LID 0000 QPN {ep.qp.qp_num:#06x} PSN {ep.psn:#08x} "
                f"RKey {ep.mr.rkey:#08x} VAddr {ep.mr.buf:#016x}")
            out(f" GID: {_gid_text(ep.gid)}")
        out(RULE)
        tposted, tcompleted = client.run(run_client, cli, srv.dest(), size, iters, tx_depth,
                                         max(1, min(cq_mod, tx_depth)))
        line, peak, avg, rate = report(size, iters, tx_depth, tposted, tcompleted)
        out(" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]")
        out(line)
        out(RULE)
        sent = client.run(contents, cli, size)
        got = server.run(contents, srv, size)
        if got != sent:
            bad = next(i for i in range(size) if got[i] != sent[i])
            raise RunError(f"write-bw: data mismatch at byte {bad}")
        out(f" data verified: {size} bytes at the server match the client's buffer")
        client.run(teardown, cli)
        server.run(teardown, srv)
    finally:
        for p in (client, server):
            if p.alive:
                p.exit(0)
    return {"peak": peak, "average": avg, "msg_rate": rate}
