"""Broken variants of the example client (examples/cmb_peer) for the kit's layout, data
and module-reference checks: `broken(monkeypatch, name, patch)` makes a module `name`
whose client is the example's with `patch(state, mod)` applied; `one_check` runs a
single kit check the way run_conformance does.
"""

from __future__ import annotations

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
from tests.peermem_testing.test_conformance import _broken, _import_example

example = _import_example       # the example client, importable as `cmb_peer`


def broken(monkeypatch: Any, name: str, patch: Any) -> None:
    """A module `name` whose client is the example's, with its module references, with
    `patch(state, mod)` applied."""
    _broken(monkeypatch, example(), name, lambda state: patch(state, state.mod),
            module_refs=True)


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
