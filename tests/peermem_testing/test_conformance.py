"""The conformance kit on every client here, and on broken clients it must catch.

Every built-in client and the worked example (examples/cmb_peer) pass; each
deliberately broken variant of the example fails the check named after the
rule it breaks - which is what shows the kit can fail.
"""

from __future__ import annotations

import importlib.metadata
import pathlib
import sys
import types

import pytest

from kernel_model.emu.platform import peer_client_modules, rdma_host
from peermem_testing.conformance import ClientUnderTest, run_conformance

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cmb_peer"


def _import_example():
    """The example client, importable as `cmb_peer` as if its package were installed."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import cmb_peer
    return cmb_peer


@pytest.fixture
def example():
    return _import_example()


def _checks(report) -> dict[str, bool | None]:
    return {r.name: r.ok for r in report.results}


@pytest.mark.parametrize("cut", [ClientUnderTest.nv_peer_mem(),
                                 ClientUnderTest.uio_mapping("io_peer_mem")],
                         ids=["nv_peer_mem-unmaps", "io_peer_mem"])
def test_built_in_clients_conform(cut):
    report = run_conformance(cut)
    assert report.ok, str(report)
    checks = _checks(report)
    assert checks["lifecycle"] and checks["data"] and checks["leaks"]
    # io_peer_mem cannot invalidate: that check says so instead of passing
    assert checks["invalidation"] is (None if cut.module == "io_peer_mem" else True)
    for name in ("core-context", "quiet-acquire", "invalidate-once"):
        assert checks[name] is (None if cut.module == "io_peer_mem" else True)


def test_nv_peer_mem_old_style_deadlocks_when_its_memory_goes_during_dereg():
    """nv_peer_mem as an old-style client (peerdirect_support=1, no UNMAPS) on the 25.04
    core: the core's stop calls put_pages under mapping_lock, nvidia_p2p_put_pages waits
    for the free callback, which waits for mapping_lock in the invalidation - MLNX bug
    2696789 (the dereg-vs-invalidate corpus scenario).  The invalidate-once race
    (cudaFree against ibv_dereg_mr) finds it; every other check conforms."""
    report = run_conformance(ClientUnderTest.nv_peer_mem(peerdirect_support=1))
    checks = _checks(report)
    for name in ("lifecycle", "data", "invalidation", "core-context", "quiet-acquire",
                 "exit-teardown", "unload-busy"):
        assert checks[name] is True, str(report)
    once = next(r for r in report.results if r.name == "invalidate-once")
    assert once.ok is False and once.detail.startswith("DeadlockError"), str(report)
    assert "mapping_lock" in once.detail and "nv_p2p_teardown" in once.detail
    assert [r.name for r in report.violations if r.name != "module-refs"] == \
        ["invalidate-once", "leaks"]


def test_cmb_peer_conforms(peer_client_conformance):
    cmb_peer = _import_example()

    def reset(m, proc, addr, size):        # how this client's memory goes away
        with m.kernel():
            cmb_peer.cmb_peer_revoke_all()
    peer_client_conformance(ClientUnderTest.uio_mapping("cmb_peer", revoke=reset))


# -- broken clients: the example with one rule broken each ----------------------------------
def _broken(monkeypatch, example, name: str, patch, *, module_refs: bool = False) -> None:
    """A module `name` whose client is the example's with `patch(state)` applied (with
    `module_refs`, the example's module references too: state.mod is the module)."""
    mod = types.ModuleType(name)
    mod.MODULE_DEPENDS = example.MODULE_DEPENDS

    def module_init(m):
        state = example.CmbPeer(m if module_refs else None)
        patch(state)
        client = example.peer_memory_client(
            name, "1.0", acquire=state.acquire, get_pages=state.get_pages,
            dma_map=state.dma_map, dma_unmap=state.dma_unmap, put_pages=state.put_pages,
            get_page_size=state.get_page_size, release=state.release)
        example.peer_memory_client_ex(client, flags=example.PEER_MEM_INVALIDATE_UNMAPS)
        state.reg = example.ib_register_peer_memory_client(client, state.invalidate)
        if state.reg is None:
            raise example.KernelError(22, "broken: registration failed")
        m.machine.modules_state_cmb = state
        return state

    mod.module_init = module_init
    mod.module_exit = example.module_exit
    monkeypatch.setitem(sys.modules, name, mod)


def _revoke_all(m, proc, addr, size):
    with m.kernel():
        m.modules_state_cmb.revoke_all()


def test_a_greedy_acquire_is_reported(monkeypatch, example):
    def patch(state):
        def greedy(addr, size, priv, name, client_context):   # says "mine" to anything
            ctx = example.kmalloc_obj(example.cmb_ctx(addr, size))
            ctx.kref.ctx = ctx
            client_context[0] = ctx
            return 1
        state.acquire = greedy
    _broken(monkeypatch, example, "greedy_peer", patch)
    report = run_conformance(ClientUnderTest.uio_mapping("greedy_peer"))
    assert _checks(report)["declines-foreign"] is False
    assert "past" in next(r.detail for r in report.violations if r.name == "declines-foreign")


def test_a_release_that_leaks_is_reported(monkeypatch, example):
    def patch(state):
        state.release = lambda ctx: None            # the context is never freed
    _broken(monkeypatch, example, "leaky_peer", patch)
    report = run_conformance(ClientUnderTest.uio_mapping("leaky_peer"))
    leaks = [r for r in report.violations if r.name == "leaks"]
    assert leaks and "cmb_ctx" in leaks[0].detail


def test_a_missing_mandatory_callback_is_reported(monkeypatch, example):
    def patch(state):
        state.dma_unmap = None
    _broken(monkeypatch, example, "partial_peer", patch)
    report = run_conformance(ClientUnderTest.uio_mapping("partial_peer"))
    assert not report.ok
    assert all("does not load" in r.detail for r in report.violations)


def test_invalidating_the_wrong_id_is_reported(monkeypatch, example):
    def patch(state):
        real = state.get_pages

        def get_pages(addr, size, write, force, sg, ctx, core_context):
            return real(addr, size, write, force, sg, ctx, core_context + 7)
        state.get_pages = get_pages
    _broken(monkeypatch, example, "wrongid_peer", patch)
    report = run_conformance(ClientUnderTest.uio_mapping("wrongid_peer", revoke=_revoke_all))
    detail = next(r.detail for r in report.violations if r.name == "invalidation")
    assert "still accepts RDMA" in detail
    assert "core-context: wrongid_peer" in detail and "which the core never gave it" in detail


def test_a_client_installed_by_another_package_is_found(monkeypatch, example):
    """The peermem.clients entry-point group: listed by peer_client_modules, loadable."""
    ep = importlib.metadata.EntryPoint("cmb_peer", "cmb_peer", "peermem.clients")
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == "peermem.clients":
            return importlib.metadata.EntryPoints([ep])
        return real(**kw)
    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    assert ("cmb_peer", "installed (?)", "cmb_peer") in peer_client_modules()
    m = rdma_host(cmb_size=1 << 20)
    m.load_module("cmb_peer")                     # its MODULE_DEPENDS come first
    assert {"ib_core", "uio_cmb", "cmb_peer"} <= set(m.modules)
    with m.kernel():
        assert [c.peer_mem.name for c in sys.modules["drivers.ib_core.peer_mem"]
                .peer_clients()] == ["cmb_peer"]


def test_the_guide_shows_the_example_as_it_is():
    """docs/peer-clients.md's code is the example's and this file's, verbatim."""
    import re
    doc = (ROOT / "docs" / "peer-clients.md").read_text()
    here = pathlib.Path(__file__).parent
    sources = (EXAMPLE / "cmb_peer.py").read_text() + pathlib.Path(__file__).read_text() + \
        (here / "test_peer_clients_guide.py").read_text()
    blocks = re.findall(r"```python\n(.*?)```", doc, re.S)
    assert len(blocks) >= 8
    for block in blocks:
        for line in block.splitlines():
            if line.strip() and not line.startswith(("from ", "import ")):
                assert line in sources, f"docs/peer-clients.md: {line!r} is not in the code"


def test_amdp2p_breaks_three_rules_on_a_5_x_core():
    """amdp2p on the default (25.04) core: the kit finds the three things the code
    does - acquire asks KFD about the first address only, so a range running past the
    buffer is claimed and fails in get_pages (EINVAL) instead of going back to gup
    (EFAULT); its invalidation makes a lockdep cycle - KFD's process mutex held
    across the free callback, ib_core's mapping_lock held across KFD's get_pages -
    reported after every check that invalidates; and when hipFree races ibv_dereg_mr,
    free_callback writes free_callback_called after the invalidation returned, into
    the context the deregistration's release() freed (the write of B17 in
    peermem_facts.md, here on the 25.04 core).  Everything else conforms."""
    report = run_conformance(ClientUnderTest.amdp2p())
    checks = _checks(report)
    for name in ("lifecycle", "invalidation", "core-context", "quiet-acquire"):
        assert checks[name] is True, str(report)
    leaks = [r for r in report.results if r.name == "leaks"]
    assert leaks[0].ok is False and "after invalidation" in leaks[0].detail
    for leak in leaks:
        assert "circular locking" in leak.detail and "kfd_process.mutex" in leak.detail
    (foreign,) = [r for r in report.results if r.name == "declines-foreign"]
    assert foreign.ok is False and "errno 22, not gup's EFAULT" in foreign.detail
    once = next(r for r in report.results if r.name == "invalidate-once")
    assert once.ok is False and "slab-use-after-free: write of .free_callback_called" \
        in once.detail and "amd_release" in once.detail
    assert {"declines-foreign", "invalidate-once", "leaks"} <= \
        {r.name for r in report.violations}
