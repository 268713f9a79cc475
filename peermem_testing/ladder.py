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
    """One registered buffer and everything under it.  `revoke`, `dereg`, `invalidate`
    and `unload_client` are what a race test runs in competing tasks; `teardown` (from
    main) undoes what is left.  `recorder` is the CallRecorder of build_ladder(record=True)
    (None otherwise); `core_context()` the MR's invalidation id."""

    cut: ClientUnderTest
    machine: Any
    proc: Any
    ctx: Context
    pd: PD
    addr: int
    size: int
    mr: MR
    recorder: Any = None    # peermem_testing.api.CallRecorder, with record=True

    def core_context(self) -> int:
        """The invalidation id the core gave the client for this MR (api.core_context)."""
        from peermem_testing.api import core_context
        return core_context(self.mr)

    def invalidate(self) -> int:
        """Fire the core's invalidation of the MR as the client's invalidate would
        (api.fire_invalidation; the client's own teardown does not run): run it in a task
        of `proc`."""
        from peermem_testing.api import fire_invalidation
        return fire_invalidation(self.mr)

    def unload_client(self, force: bool = True) -> None:
        """rmmod the client module; `force` is `rmmod -f`, which does not stop at the
        module references the client's MRs hold, so module_exit's
        ib_unregister_peer_memory_client waits for the outstanding MR (a plain rmmod
        fails with EBUSY while the client pins its module per MR).  Run it in a task."""
        self.machine.unload_module(self.cut.module, force=force)

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
                 access: int = ACCESS, *, ofed: str | None = None,
                 release: str | None = None, params: dict[str, Any] | None = None,
                 record: bool = False) -> Ladder:
    """Build a fresh machine with `cut`'s host and modules, a process, and an MR of
    `size` bytes on the client's memory.  Call it inside the test body.

    `ofed` picks ib_core's peer-memory core ("4.9", "5.1" ... "25.04"; the newest by
    default), `release` the nvidia driver's release, `params` the client module's
    parameters (merged over cut.params) - ClientUnderTest.configured.  With `record`
    the calls into the clients are recorded from before the registration on
    (Ladder.recorder, a peermem_testing.api.CallRecorder)."""
    cut = (cut or ClientUnderTest.nv_peer_mem()).configured(ofed, release, params)
    m = build_host(cut)
    recorder = None
    if record:
        from peermem_testing.api import CallRecorder
        recorder = CallRecorder(m)
    p = m.spawn("app")

    def climb() -> tuple[Context, PD, int, MR]:
        ctx = Context(p)
        pd = PD(ctx)
        addr = cut.alloc(p, size)
        return ctx, pd, addr, MR(pd, size, access, addr)
    ctx, pd, addr, mr = p.run(climb)
    return Ladder(cut, m, p, ctx, pd, addr, size, mr, recorder)
