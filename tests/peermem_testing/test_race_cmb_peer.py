"""The worked example of docs/race-testing.md: race tests for the cmb_peer client.

cmb_peer (examples/cmb_peer) invalidates every registration when its device
is reset.  A reset can come while the application deregisters the same MR:
the core then releases the client's context while revoke_all is still
working on it.  The shipped client takes a reference on each context it is
about to invalidate; the explorer shows that survives every schedule with up
to two preemptions, and finds the use-after-free in a version without it.
"""

from __future__ import annotations

import attrs
import pytest

from kernel_model.emu.explore import explore, replay
from peermem_testing.conformance import ClientUnderTest
from peermem_testing.ladder import build_ladder
from tests.peermem_testing.test_conformance import _broken, _import_example


def reset(m, proc, addr, size):
    """How cmb_peer's memory goes away: the device driver resets the device."""
    with m.kernel():
        m.modules["cmb_peer"].state.revoke_all()


@pytest.fixture
def cmb_peer():
    return _import_example()


# --8<-- [start:race]
@pytest.mark.race(strategy="dfs", bound=2)
def test_reset_during_deregistration(peermem_ladder, cmb_peer):
    lad = peermem_ladder(ClientUnderTest.uio_mapping("cmb_peer", revoke=reset), size=64 << 10)
    dereg = lad.proc.start(lad.dereg)                       # ibv_dereg_mr
    rst = lad.proc.thread(lad.revoke, name="reset")        # the device is reset
    dereg.join()
    rst.join()
    assert lad.mr.closed
    lad.teardown()                                          # the leak check runs after
# --8<-- [end:race]


def _draft(monkeypatch, cmb_peer, name, patch):
    """A race program for a variant of the client: `patch(state)` breaks one thing."""
    _broken(monkeypatch, cmb_peer, name, patch)

    def draft_reset(m, proc, addr, size):
        with m.kernel():
            m.modules_state_cmb.revoke_all()

    # the core as MLNX_OFED released it: the drafts' put_pages meets its B15 (the
    # default core has the proposed fix, ib_core late_invalidate_fix=1)
    cut = ClientUnderTest.uio_mapping(name, revoke=draft_reset)
    cut = attrs.evolve(cut, host_modules=("ib_core", *cut.host_modules),
                       host_params={"ib_core": {"late_invalidate_fix": 0}})

    def program():
        lad = build_ladder(cut, size=64 << 10)
        dereg = lad.proc.start(lad.dereg)
        rst = lad.proc.thread(lad.revoke, name="reset")
        dereg.join()
        rst.join()
        lad.teardown()
    return program


def _put_pages_no_wait(cmb_peer, state):
    def put_pages(sg_head, ctx):
        cmb_peer.mutex_lock(state.lock)
        if ctx in state.live:
            state.live.remove(ctx)
        cmb_peer.mutex_unlock(state.lock)
        cmb_peer.sg_free_table(sg_head)
    return put_pages


def _put_pages_waits_outside_the_lock(cmb_peer, state):
    def put_pages(sg_head, ctx):
        cmb_peer.wait_event(state.revoke_wq, lambda: not ctx.revoking)
        cmb_peer.mutex_lock(state.lock)         # revoke_all can take ctx just before
        if ctx in state.live:
            state.live.remove(ctx)
        cmb_peer.mutex_unlock(state.lock)
        cmb_peer.sg_free_table(sg_head)
    return put_pages


@pytest.mark.parametrize("draft", [_put_pages_no_wait, _put_pages_waits_outside_the_lock],
                         ids=["no-wait", "wait-outside-lock"])
def test_a_put_pages_that_does_not_wait_trips_the_cores_b15(monkeypatch, cmb_peer, draft):
    """The first draft's put_pages returned at once: the core then cleared the umem's
    client while revoke_all's invalidation waited for mapping_lock, and the
    invalidation dereferenced NULL (peermem_facts B15).  The second draft waited, but
    tested `revoking` before taking the lock - the same crash, one window later."""
    def patch(state):
        state.put_pages = draft(cmb_peer, state)
    program = _draft(monkeypatch, cmb_peer, "cmb_draft", patch)
    ex = explore(program, "dfs", bound=2)
    assert ex.failure is not None, f"{ex.runs} schedules and no failure"
    assert ex.failure.check == "null-deref"
    assert "ib_unmap_peer_client" in ex.failure.detail or \
        "ib_peer_unmap_on_invalidate" in ex.failure.detail, ex.failure.detail
    assert ex.failure.preemptions <= 2
    again = replay(program, ex.failure.schedule)
    assert again.failure is not None and again.failure.check == "null-deref"


def test_a_revoke_all_without_the_reference_is_a_use_after_free(monkeypatch, cmb_peer):
    """Without kref_get on its victims (and so without marking them), revoke_all
    touches a context the core released meanwhile."""
    def patch(state):
        def revoke_all():
            cmb_peer.mutex_lock(state.lock)
            victims, state.live = state.live, []
            cmb_peer.mutex_unlock(state.lock)
            for ctx in victims:
                state.invalidate[0](state.reg, ctx.core_context)
                cmb_peer.mutex_lock(state.lock)
                state._unmap(ctx, ctx.device)
                ctx.revoked = True
                cmb_peer.mutex_unlock(state.lock)
            return len(victims)
        state.revoke_all = revoke_all
    ex = explore(_draft(monkeypatch, cmb_peer, "cmb_draft2", patch), "dfs", bound=2)
    assert ex.failure is not None, f"{ex.runs} schedules and no failure"
    assert ex.failure.check in ("UseAfterFree", "null-deref"), ex.failure
