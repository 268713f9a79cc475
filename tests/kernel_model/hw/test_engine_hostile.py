"""Tests for kernel_model/hw/mlx5_engine.py: the engine task outlives its own bugs.

What a process writes ends in a completion error (tests/flows/test_hostile_rings.py);
this is the net under that: an exception escaping one step of the engine is a
bug of the model, so it is reported as a kernel WARN (machine.bugs, which the
leak check fails on) instead of ending the "mlx5_hca" task that serves every
QP of the HCA.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.mlx5_engine import engine_of
from kernel_model.sched import SCHED
from tests.flows.test_data_path import pattern
from tests.flows.test_hostile_rings import Hca, _pair
from userspace.libibverbs import verbs as v


@pytest.fixture
def hca() -> Hca:
    m = rdma_host(ram_size=128 << 20)
    m.load_module("mlx5_ib")
    return Hca(m, _pair(m, ("first", "first")), _pair(m, ("victim-a", "victim-b")))


def test_an_exception_in_a_step_is_warned_and_the_engine_keeps_running(hca, monkeypatch):
    eng = engine_of(hca.hca)
    real = eng.hca_execute
    broken = hca.bad.qpn

    def hca_execute(qp, hw, wqe):
        if qp.num == broken:
            raise IndexError("a parse the model got wrong")
        return real(qp, hw, wqe)

    monkeypatch.setattr(eng, "hca_execute", hca_execute)
    hca.bad.a.mr.write(pattern(64))
    hca.bad.write(wr_id=1)
    hca.settle()
    assert SCHED.failed == []
    assert eng.task is not None and not eng.task.done
    (bug,) = hca.m.bugs
    assert bug.startswith(f"WARNING: mlx5 engine: hca_sq_process({broken}) raised IndexError(")
    assert "a parse the model got wrong" in bug
    hca.m.bugs.clear()                    # asserted: the rest must pass the leak check
    # the same task still serves another QP
    data = pattern(256, seed=9)
    hca.victim.a.mr.write(data)
    hca.victim.write(wr_id=2, length=256, dst=1024)
    (wc,) = hca.victim.a.cq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (2, "SUCCESS")
    assert hca.victim.b.mr.read(256, 1024) == data
    assert hca.m.bugs == [] and SCHED.failed == []


def test_a_half_written_blueflame_copy_goes_with_its_uar_page():
    """DEALLOC_UAR drops what the engine assembled of a BlueFlame copy in that page, so
    the page's next owner can never continue the previous owner's WQE."""
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    eng = engine_of(m.hcas[0])
    p.store(ctx.uar[0].reg + 0x800, bytes(16))          # 16 of a 64-byte copy: pending
    assert len(eng._bf_chunks) == 1
    assert v.ibv_close_device(ctx) == 0                 # the context's UARs: DEALLOC_UAR
    assert eng._bf_chunks == {}
    p.exit(0)
