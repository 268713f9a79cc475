"""The kit's core_context checks (core-context, quiet-acquire, invalidate-once).

The example client passes them; a variant of it with one rule broken fails the check
named after that rule, with a message that names it - and so does a core that would
hand an id out again.
"""

from __future__ import annotations

import pathlib
import sys
import types

import pytest

from peermem_testing.conformance import ClientUnderTest, Recorder, run_conformance

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cmb_peer"
NEW_CHECKS = ("core-context", "quiet-acquire", "invalidate-once")


@pytest.fixture
def example():
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import cmb_peer
    return cmb_peer


def _reset(m):
    """The CMB device is reset: the example's revoke_all, on whichever module serves it."""
    with m.kernel():
        m.modules_state_cmb.revoke_all()


def _cut(name: str) -> ClientUnderTest:
    cut = ClientUnderTest.uio_mapping(name, revoke=lambda m, p, a, n: _reset(m))
    cut.reset = _reset
    return cut


def _variant(monkeypatch, example, name: str, patch=None) -> None:
    """A module `name`: the example client with `patch(state)` applied."""
    mod = types.ModuleType(name)
    mod.MODULE_DEPENDS = example.MODULE_DEPENDS

    def module_init(m):
        state = example.CmbPeer(m)               # m: the module, for its references
        if patch is not None:
            patch(state)
        client = example.peer_memory_client(
            name, "1.0", acquire=state.acquire, get_pages=state.get_pages,
            dma_map=state.dma_map, dma_unmap=state.dma_unmap, put_pages=state.put_pages,
            get_page_size=state.get_page_size, release=state.release)
        example.peer_memory_client_ex(client, flags=example.PEER_MEM_INVALIDATE_UNMAPS)
        state.reg = example.ib_register_peer_memory_client(client, state.invalidate)
        m.machine.modules_state_cmb = state
        return state

    mod.module_init = module_init
    mod.module_exit = example.module_exit
    monkeypatch.setitem(sys.modules, name, mod)


def _result(report, name: str):
    return next(r for r in report.results if r.name == name)


def test_the_example_passes_the_core_context_checks(monkeypatch, example):
    _variant(monkeypatch, example, "good_peer")
    report = run_conformance(_cut("good_peer"))
    assert report.ok, str(report)
    for name in NEW_CHECKS:
        assert _result(report, name).ok is True, str(report)
    assert "at most once" in _result(report, "invalidate-once").detail


def test_a_stale_core_context_is_reported(monkeypatch, example):
    """It remembers every id it was given and names them all on a reset."""
    def patch(state):
        given, real_get, real_revoke = [], state.get_pages, state.revoke_all

        def get_pages(addr, size, write, force, sg, ctx, core_context):
            given.append(core_context)
            return real_get(addr, size, write, force, sg, ctx, core_context)

        def revoke_all():
            live = {c.core_context for c in state.live}
            n = real_revoke()
            for cc in given:
                if cc not in live:                   # a deregistered one: stale
                    state.invalidate[0](state.reg, cc)
            return n
        state.get_pages, state.revoke_all = get_pages, revoke_all
    _variant(monkeypatch, example, "stale_peer", patch)
    report = run_conformance(_cut("stale_peer"))
    bad = _result(report, "core-context")
    assert bad.ok is False
    assert bad.detail.startswith("core-context: stale_peer")
    assert "invalidated core_context 0x0 after the core took it back (put_pages)" in bad.detail


def test_a_core_that_reuses_ids_is_reported(monkeypatch):
    """The core's ids are cyclic; one that gave a freed id straight out again would let
    a stale invalidation hit the next registration - the Recorder says so."""
    import drivers.ib_core.peer_mem as peer_mem
    real = peer_mem.xa_alloc_cyclic
    monkeypatch.setattr(peer_mem, "xa_alloc_cyclic",
                        lambda xa, entry, limit, nxt: real(xa, entry, limit, [limit[0]]))
    report = run_conformance(ClientUnderTest.nv_peer_mem())
    bad = _result(report, "core-context")
    assert bad.ok is False and "core_context 0x0 again: a reused id" in bad.detail


def test_an_invalidation_from_acquires_probe_is_reported(monkeypatch, example):
    """Its acquire puts the context on the revoke list while it probes the pages, so a
    reset meanwhile invalidates a core_context the core has not given yet."""
    def patch(state):
        real = state.acquire

        def acquire(addr, size, priv, name, client_context):
            if not real(addr, size, priv, name, client_context):
                return 0
            ctx = client_context[0]
            example.mutex_lock(state.lock)
            state.live.append(ctx)                      # the probe
            example.mutex_unlock(state.lock)
            example.mutex_lock(state.lock)
            if ctx in state.live:
                state.live.remove(ctx)
            example.mutex_unlock(state.lock)
            return 1
        state.acquire = acquire
    _variant(monkeypatch, example, "probe_peer", patch)
    report = run_conformance(_cut("probe_peer"))
    bad = _result(report, "quiet-acquire")
    assert bad.ok is False
    assert bad.detail.startswith("quiet-acquire: probe_peer")
    assert "while acquire ran on reg-" in bad.detail and "seed" in bad.detail


def test_an_invalidation_inside_acquire_is_reported(monkeypatch, example):
    def patch(state):
        real = state.acquire

        def acquire(addr, size, priv, name, client_context):
            state.invalidate[0](state.reg, 0)           # "just in case"
            return real(addr, size, priv, name, client_context)
        state.acquire = acquire
    _variant(monkeypatch, example, "eager_peer", patch)
    report = run_conformance(_cut("eager_peer"))
    bad = _result(report, "lifecycle")
    assert bad.ok is False
    assert "quiet-acquire: eager_peer" in bad.detail and "from inside its own acquire" \
        in bad.detail


def test_a_double_invalidation_is_reported(monkeypatch, example):
    """Its reset tests `revoked` before invalidating and sets it after, outside its
    lock: two resets at once both invalidate the same registration."""
    def patch(state):
        def revoke_all():
            victims = [c for c in state.live if not c.revoked]
            for ctx in victims:
                state.invalidate[0](state.reg, ctx.core_context)
                example.mutex_lock(state.lock)
                state._unmap(ctx, ctx.device)
                ctx.revoked = True
                example.mutex_unlock(state.lock)
            return len(victims)
        state.revoke_all = revoke_all
    _variant(monkeypatch, example, "twice_peer", patch)
    report = run_conformance(_cut("twice_peer"))
    bad = _result(report, "invalidate-once")
    assert bad.ok is False
    assert bad.detail.startswith("invalidate-once: twice_peer")
    assert "a second time" in bad.detail and "free-vs-reset race" in bad.detail
    assert _result(report, "invalidation").ok is True     # one reset alone is fine


def test_the_recorder_tracks_ids_per_client():
    """Recorder.ids: what the core handed out and took back, for invalidating clients."""
    from peermem_testing.conformance import build_host
    cut = ClientUnderTest.nv_peer_mem()
    m = build_host(cut)
    rec = Recorder(m)
    assert set(rec.ids) == {"nv_mem"}          # nv_mem_nc registered without invalidation
    m.leak_check_expected = False
    m.check_leaks()
