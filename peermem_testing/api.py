"""The public testing API of a race-test author: an MR's core_context, the core's
invalidation fired for it, and a recorder of the calls the core makes into clients.

    from peermem_testing.api import CallRecorder, core_context, fire_invalidation

    lad = build_ladder(ClientUnderTest.nv_peer_mem(), ofed="4.9", record=True)
    core_context(lad.mr)        # the id the core gave get_pages for this MR (a 4.9 ticket)
    lad.proc.run(fire_invalidation, lad.mr)   # as the client's invalidate would
    lad.recorder.order("nv_mem")  # ['acquire', 'get_pages', 'dma_map', 'dma_unmap', ...]

Everything here reads the emulated kernel's own objects (the MR's ib_umem_peer,
the core's registration of the client); nothing is a kernel interface.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from drivers.ib_core.peer_mem import (
    PEER_NO_INVALIDATION_ID,
    ib_invalidate_peer_memory,
    ib_peer_memory_client,
    ib_umem_peer,
    peer_clients,
    peer_ticket_design,
)
from kernel_model.current import current_or_none
from peermem_testing.conformance import CALLBACKS, Recorder

__all__ = ["CALLBACKS", "CallRecorder", "PeerCall", "core_context", "fire_invalidation",
           "invalidate_core_context", "peer_client_of", "peer_umem", "registered_clients"]

NO_CORE_CONTEXT = PEER_NO_INVALIDATION_ID   # what get_pages gets from 5.1+ without an id


def _ibv_mr(mr: Any) -> Any:
    return getattr(mr, "mr", mr)             # a pyverbs MR, or the ibv_mr itself


def peer_umem(mr: Any) -> ib_umem_peer:
    """The core's ib_umem_peer behind `mr` (a pyverbs MR or an ibv_mr), looked up
    through the process's uverbs file as the kernel would find it by handle.
    LookupError when the MR is deregistered, not backed by a peer client, or its umem
    was already released (a 4.9 core deregisters an MR inside an invalidation)."""
    ibv = _ibv_mr(mr)
    proc = ibv.context.proc
    files = proc.task.files if proc.alive else None
    fdt = files.fdt if files is not None else []
    fd = ibv.context.cmd_fd
    f = fdt[fd] if 0 <= fd < len(fdt) else None
    uobj = f.private_data.idr.get(ibv.handle) if f is not None else None
    kmr = getattr(uobj, "object", None)
    umem = getattr(kmr, "umem", None)
    if umem is None or not getattr(umem, "is_peer", False):
        raise LookupError(f"MR handle {ibv.handle}: no peer-memory umem behind it "
                          "(deregistered, or memory gup pinned)")
    if umem.ib_peer_client is None:
        raise LookupError(f"MR handle {ibv.handle}: its peer umem was released")
    return umem


def peer_client_of(mr: Any) -> ib_peer_memory_client:
    """The core's registration (reg_handle) of the client that backs `mr`."""
    client = peer_umem(mr).ib_peer_client
    assert client is not None                  # peer_umem() checked it
    return client


def core_context(mr: Any) -> int:
    """The invalidation id the core gave the client's get_pages for `mr`: the value the
    client must pass to invalidate_peer_memory.  On 5.1+ cores an id from the client's
    cyclic xarray (NO_CORE_CONTEXT, U32_MAX, for a client registered without an
    invalidate callback); on a 4.x core (ofed="4.9") a ticket counted from 1 (0 when
    the MR's owner takes no invalidations).  LookupError as peer_umem()."""
    umem = peer_umem(mr)
    if _in_kernel(_ibv_mr(mr).context.proc.machine, peer_ticket_design):
        ctx = umem.invalidation_ctx
        return ctx.context_ticket if ctx is not None else 0
    return umem.xa_id


def _in_kernel(machine: Any, fn: Any, *args: Any) -> Any:
    """fn(*args) in the calling task when it is one of machine's, else as its init task."""
    cur = current_or_none()
    if cur is not None and cur.machine is machine:
        return fn(*args)
    with machine.kernel():
        return fn(*args)


def invalidate_core_context(client: ib_peer_memory_client, core_context: int,
                            machine: Any = None) -> int:
    """Call the core's invalidate callback (ib_invalidate_peer_memory) for the
    registration `client` with `core_context` - any value, also a stale or never
    allocated one, which the core ignores as the real one does.  Returns the core's
    answer (0).  Runs in the calling task (also while the client is unregistering);
    from outside any task, as the init task of `machine` (by default the machine the
    client is registered with)."""
    if current_or_none() is not None:
        return ib_invalidate_peer_memory(client, core_context)
    m = machine if machine is not None else _machine_of(client)
    return _in_kernel(m, ib_invalidate_peer_memory, client, core_context)


def fire_invalidation(mr: Any) -> int:
    """Fire the core's invalidation of `mr` as its client's invalidate would: the
    client's registration, the MR's core_context.  Run it in a task (a race test's
    thread: `lad.proc.thread(fire_invalidation, lad.mr)`, or `proc.run(...)`).

    The core then does what it does for that client: revokes the MR through its owner
    (mlx5 fences the mkey), and - for a client without PEER_MEM_INVALIDATE_UNMAPS, and
    always on a 4.x core - calls its dma_unmap and put_pages (on 4.x the whole MR is
    deregistered and release() called, inside this call).  The client's own teardown
    does not run: for an UNMAPS client (on 5.1+ cores) that is the client's job after
    its invalidate call, so use the client's revoke (Ladder.revoke) for a complete
    invalidation of such a client, and this to drive the core."""
    return invalidate_core_context(peer_client_of(mr), core_context(mr),
                                   _ibv_mr(mr).context.proc.machine)


def registered_clients(machine: Any) -> list[ib_peer_memory_client]:
    """The peer-memory clients registered with `machine`'s ib_core, in registration
    order (each one's `.peer_mem.name`, `.stats`, `.invalidation_required`)."""
    return _in_kernel(machine, peer_clients)


def _machine_of(client: ib_peer_memory_client) -> Any:
    from kernel_model.current import live_machines
    cur = current_or_none()
    if cur is not None and "ib_core" in cur.machine.modules and \
            client in _in_kernel(cur.machine, peer_clients):
        return cur.machine
    for m in list(live_machines):
        if "ib_core" in getattr(m, "modules", {}) and client in _in_kernel(m, peer_clients):
            return m
    raise LookupError(f"{client!r} is registered with no live machine")


class PeerCall(NamedTuple):
    """One call the core made into a client, recorded when it returned."""

    client: str      # the client's name (peer_memory_client.name: nv_mem, cmb_peer, ...)
    callback: str    # one of CALLBACKS
    detail: Any      # acquire: its answer (1: mine); get_pages: the core_context it got;
    #                  dma_map: (nmap, [(dma address, length), ...]) when it returned 0;
    #                  otherwise None
    task: str        # the comm of the task that made the call ("?" outside any task)


class CallRecorder(Recorder):
    """Records every call the core makes into the clients registered on `machine` when
    it is created (load the client first): their seven callbacks are wrapped.

    `log` is the calls in the order they returned, as PeerCall tuples; `order(client)`
    the callback names alone, of one client or all; `clear()` forgets them (to look at
    one phase).  A call that raised is not recorded.  build_ladder(record=True) installs
    one before the MR is registered (Ladder.recorder)."""

    def __init__(self, machine: Any):
        super().__init__(machine)

    @property
    def log(self) -> list[PeerCall]:
        """Every recorded call, oldest first."""
        return [PeerCall(client, name, detail, comm)
                for client, name, (detail, comm) in self.calls]

    def order(self, client: str | None = None) -> list[str]:
        """The callback names in call order, of `client` (a client's name) or of all."""
        return self.names(client)

    def clear(self) -> None:
        """Forget what was recorded so far."""
        self.calls.clear()
