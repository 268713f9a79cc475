"""The mlx5_ib tests' rungs of the resource ladder: a host, then a process with an
open context (ladder.py has the helpers these build on)."""

from __future__ import annotations

import pytest

from tests.drivers.mlx5_ib.ladder import host, open_ctx


@pytest.fixture
def m():
    """A fresh 64 MiB RDMA host with mlx5_ib loaded."""
    return host()


@pytest.fixture
def app(m):
    """A process with mlx5_0 open; yields (p, ctx) and exits the process after."""
    p = m.spawn("app")
    ctx = open_ctx(p)
    yield p, ctx
    if p.alive:
        p.exit(0)
