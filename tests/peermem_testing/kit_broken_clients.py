"""Broken variants of the example client (examples/cmb_peer) for the kit's layout, data
and module-reference checks: `broken(monkeypatch, name, patch)` makes a module `name`
whose client is the example's with `patch(state, mod)` applied; `one_check` runs a
single kit check the way run_conformance does.
"""

from __future__ import annotations

import pathlib
import sys
import types
from typing import Any

from peermem_testing.conformance import (
    CHECKS,
    CheckResult,
    ClientUnderTest,
    Recorder,
    Violation,
    _finish,
    _unwind,
    build_host,
)

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "cmb_peer"


def example() -> Any:
    """The example client, importable as `cmb_peer` as if its package were installed."""
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import cmb_peer
    return cmb_peer


def broken(monkeypatch: Any, name: str, patch: Any) -> None:
    """A module `name` whose client is the example's with `patch(state, mod)` applied."""
    ex = example()
    mod = types.ModuleType(name)
    mod.MODULE_DEPENDS = ex.MODULE_DEPENDS

    def module_init(m):
        state = ex.CmbPeer(m)               # with the example's module references
        patch(state, m)
        client = ex.peer_memory_client(
            name, "1.0", acquire=state.acquire, get_pages=state.get_pages,
            dma_map=state.dma_map, dma_unmap=state.dma_unmap, put_pages=state.put_pages,
            get_page_size=state.get_page_size, release=state.release)
        ex.peer_memory_client_ex(client, flags=ex.PEER_MEM_INVALIDATE_UNMAPS)
        state.reg = ex.ib_register_peer_memory_client(client, state.invalidate)
        if state.reg is None:
            raise ex.KernelError(22, "broken: registration failed")
        m.machine.modules_state_cmb = state
        return state

    mod.module_init = module_init
    mod.module_exit = ex.module_exit
    monkeypatch.setitem(sys.modules, name, mod)


def revoke_all(m: Any, proc: Any, addr: int, size: int) -> None:
    """The broken modules' device reset: every registration invalidated."""
    with m.kernel():
        m.modules_state_cmb.revoke_all()


def cmb(name: str = "cmb_peer", revoke: Any = None) -> ClientUnderTest:
    """The example, or a broken variant of it, as the kit sees it."""
    example()
    if revoke is None and name == "cmb_peer":
        def revoke(m, proc, addr, size):
            with m.kernel():
                example().cmb_peer_revoke_all()
    return ClientUnderTest.uio_mapping(name, revoke=revoke)


def one_check(cut: ClientUnderTest, check: str) -> CheckResult:
    """Run the kit's check `check` alone on a fresh host, then the leak check."""
    fn = dict(CHECKS)[check]
    m = build_host(cut)
    rec = Recorder(m)
    try:
        result = CheckResult(check, True, fn(cut, m, rec))
    except Violation as e:
        _unwind(m)
        m.leak_check_expected = False          # failed part way: its leaks are expected
        return CheckResult(check, False, str(e))
    _finish(m)
    return result
