"""Fixtures for the device-model tests: a ConnectX with no driver bound."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5 import ConnectX
from tests.kernel_model.hw.fwcmd import bring_up


@pytest.fixture
def hca(m):
    """A ConnectX on the small machine `m`; what a test leaves in it by hand is not a leak."""
    hca = ConnectX(m)
    yield hca
    hca.reset()
    hca.fw.leaked.clear()


@pytest.fixture
def up(hca):
    """The same ConnectX after ENABLE_HCA and INIT_HCA."""
    bring_up(hca)
    return hca


@pytest.fixture
def new_hca(m):
    """Build more ConnectX functions on `m` (a config each); reset like `hca`."""
    made: list[ConnectX] = []

    def make(config=None):
        made.append(ConnectX(m, config))
        return made[-1]

    yield make
    for hca in made:
        hca.reset()
        hca.fw.leaked.clear()
