"""Each test of the pyverbs face gets a fresh implicit host, leak-checked after it.

The face builds its host on first use (userspace.pyverbs.host); here it is torn down
after every test - its process exits, its machine is shut down and must have no leak
- so no test sees another's objects, and the suite-wide leak check (tests/conftest.py)
finds the machine already checked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from userspace.pyverbs import base, host


@pytest.fixture(autouse=True)
def fresh_pyverbs_host() -> Iterator[None]:
    host.shutdown(check_leaks=False)  # a host some other test left behind
    yield
    base._graveyard.clear()  # objects collected unclosed die with the host's process
    host.shutdown(check_leaks=True)
