"""The common ladder of a peer-memory race test: machine, process, context, PD, buffer, MR.

A race test builds its world inside the test body - the explorer runs the
body once per schedule, and every run needs a fresh machine - so the ladder
is a function, not a fixture value: the `peermem_ladder` fixture hands it
out.  It climbs the steps an RDMA application takes (ibv_open_device,
ibv_alloc_pd, the client's allocation, ibv_reg_mr) for any client the
conformance kit can describe (a ClientUnderTest), GPU memory through
nv_peer_mem by default.
"""

from __future__ import annotations

from typing import Any

import attrs

from peermem_testing.conformance import ACCESS, ClientUnderTest, build_host
from userspace.libibverbs.pyverbs import MR, PD, Context

MiB = 1 << 20


@attrs.define
class Ladder:
    """One registered buffer and everything under it.  `revoke` and `dereg` are what a
    race test runs in competing tasks; `teardown` (from main) undoes what is left."""

    cut: ClientUnderTest
    machine: Any
    proc: Any
    ctx: Context
    pd: PD
    addr: int
    size: int
    mr: MR

    def revoke(self) -> None:
        """Take the memory away as its owner would (cudaFree, a device reset): run it in a
        task of `proc`.  The client then invalidates the MR."""
        if self.cut.revoke is None:
            raise ValueError(f"ladder: {self.cut.module} has no way to revoke its memory")
        self.cut.revoke(self.machine, self.proc, self.addr, self.size)

    def dereg(self) -> None:
        """ibv_dereg_mr: run it in a task of `proc`."""
        self.mr.close()

    def teardown(self) -> None:
        """From main: deregister (if still registered), free the buffer, close the
        context, exit the process - what the application would do at the end."""
        p = self.proc
        if p.alive:
            p.run(self.mr.close)
            p.run(self.cut.free, p, self.addr, self.size)
            p.run(self.ctx.close)
            p.exit(0)


def build_ladder(cut: ClientUnderTest | None = None, size: int = MiB,
                 access: int = ACCESS) -> Ladder:
    """Build a fresh machine with `cut`'s host and modules, a process, and an MR of
    `size` bytes on the client's memory.  Call it inside the test body."""
    cut = cut or ClientUnderTest.nv_peer_mem()
    m = build_host(cut)
    p = m.spawn("app")

    def climb() -> tuple[Context, PD, int, MR]:
        ctx = Context(p)
        pd = PD(ctx)
        addr = cut.alloc(p, size)
        return ctx, pd, addr, MR(pd, size, access, addr)
    ctx, pd, addr, mr = p.run(climb)
    return Ladder(cut, m, p, ctx, pd, addr, size, mr)
