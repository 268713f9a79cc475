"""Suite-wide fixtures: the leak check after every test that builds a Machine.

Every Machine registers itself (Machine.made_since lists those built since a
serial).  After each test, each machine built during it is shut down (its
processes exit in the kernel's order) and must pass check_leaks(): no page,
pin, mm or object left behind.  A test that deliberately leaves a leak marks the machine with
`machine.leak_check_expected = False` after asserting on it itself.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.machine import Machine
from kernel_model.sched import SCHED

pytest_plugins = ["pytester"]


@pytest.fixture(autouse=True)
def _leak_check_every_machine():
    first = Machine.next_serial
    yield
    try:
        for m in Machine.made_since(first):
            if not getattr(m, "leak_check_expected", True):
                continue
            m.leak_check_expected = False  # check once, even if the check raises
            m.check_leaks()
    finally:
        _reset_scheduler()


def _reset_scheduler() -> None:
    """Leave the one scheduler as the next test expects it: idle, default strategy."""
    SCHED.use(None)
    stuck = SCHED.abandon()
    SCHED.failed.clear()
    assert not stuck, f"tasks left running after the test: {stuck}"


@pytest.fixture(params=["c", "python"])
def backend(request) -> str:
    """Run a test on the C loops and on their Python twins."""
    return request.param


@pytest.fixture
def m() -> Machine:
    """A small machine (64 MiB) on the C loops, for tests of kernel primitives."""
    return Machine(ram_size=64 << 20)


@pytest.fixture
def machine(backend: str) -> Machine:
    """A small machine (64 MiB) on each backend."""
    return Machine(ram_size=64 << 20, backend=backend)
