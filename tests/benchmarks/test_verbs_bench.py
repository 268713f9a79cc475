"""ibv_reg_mr + ibv_dereg_mr and ibv_create_qp + ibv_destroy_qp end to end (verbs figures).

A process on an rdma_host (one ConnectX, mlx5_core + mlx5_ib loaded) calls the
libibverbs C API directly, as tests/flows do: libibverbs -> the mlx5 provider ->
uverbs write() -> ib_core -> mlx5_ib -> firmware command, and back.
  * reg_mr + dereg_mr of one page and of 1 GiB of the shared faulted memory
    (contiguous and fragmented layouts, see conftest.py, which builds it on an
    rdma_host): ib_umem_get (pin + coalesce + DMA map), find_best_pgsz,
    mlx5_ib_populate_pas filling the MTT, CREATE_MKEY (the firmware keeps a
    copy of the MTT); then DESTROY_MKEY, unmap, unpin.  On the C loops and
    on the Python twins (machine.ops swapped, as in the pin benchmarks).
  * the yardsticks, in the same module and run: the pin benchmark's kernel
    path on the same pages - pin_user_pages_fast + unpin_user_pages of one
    page (test_pin_1page_c), and PinMap's pin + coalesce + DMA map of 1 GiB
    followed by its unmap + unpin (test_pin_bench.PinMap) - so that
    reg/dereg : pin/unpin is a ratio from one run.
  * create_qp + destroy_qp (RC, caps 64/64/1/1) on an open context with a PD
    and a CQ: queue sizing, buffer + doorbell record, a umem of the buffer,
    CREATE_QP with the QPC and its PAS; then DESTROY_QP and the release.
Per-call figures and ratios are reported in the closing notes; nothing is
asserted about time, only what each call did (pages pinned, the mkey and its
MTT in the firmware, every pin and pinned_vm given back).
"""

from __future__ import annotations

import sys

import pytest

import c_ext
from c_ext import U64Array
from kernel_model.emu.platform import rdma_host
from kernel_model.gup import FOLL_LONGTERM, FOLL_WRITE, pin_user_pages_fast, unpin_user_pages
from kernel_model.pgtable import pte_addr
from kernel_model.task import RLIM_INFINITY, RLIMIT_MEMLOCK
from tests.benchmarks.conftest import Faulted
from tests.benchmarks.test_pin_bench import PinMap
from userspace.libibverbs import verbs as v

ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


class VerbsHost:
    """The faulted 1 GiB process (the shared `gib`, on an rdma_host), `ulimit -l
    unlimited`, with the device open and a PD allocated (nothing pinned yet:
    pinned_vm is 0)."""

    def __init__(self, f: Faulted):
        self.f = f
        m = f.machine
        self.m, self.p, self.fw = m, f.proc, m.hcas[0].fw
        self.saved_rlim = self.p.task.rlim[RLIMIT_MEMLOCK]
        self.p.task.rlim[RLIMIT_MEMLOCK] = [RLIM_INFINITY, RLIM_INFINITY]
        self.ctx = v.ibv_open_device(self.p, v.ibv_get_device_list(self.p)[0])
        self.pd = v.ibv_alloc_pd(self.ctx)

    def teardown(self) -> None:
        assert v.ibv_dealloc_pd(self.pd) == 0
        assert v.ibv_close_device(self.ctx) == 0
        self.p.task.rlim[RLIMIT_MEMLOCK] = self.saved_rlim


@pytest.fixture(scope="module")
def host(gib):
    h = VerbsHost(gib)
    yield h
    h.teardown()


def _be(x: int) -> int:
    """A big-endian MTT entry as the number the device reads."""
    return int.from_bytes(int(x).to_bytes(8, sys.byteorder), "big")


def _reg_dereg(h: VerbsHost, size: int):
    """One ibv_reg_mr + ibv_dereg_mr; returns what was true while the MR lived."""
    vm = h.m.vmstat
    pins = vm["nr_foll_pin_acquired"]
    mr = v.ibv_reg_mr(h.pd, h.f.addr, size, ACCESS)
    seen = (vm["nr_foll_pin_acquired"] - pins, h.p.mm.pinned_vm, h.fw.mkeys.get(mr.lkey >> 8),
            mr.lkey, mr.rkey)
    return seen + (v.ibv_dereg_mr(mr),)


def _check_mr(h: VerbsHost, size: int, result) -> None:
    pinned, pinned_vm, mkey, lkey, rkey, dereg = result
    npages = size >> h.m.page_shift
    assert dereg == 0
    assert pinned == pinned_vm == npages
    assert mkey is not None and mkey.mkey == lkey == rkey
    assert mkey.num not in h.fw.mkeys  # DESTROY_MKEY took it out
    mkc = mkey.mkc
    assert (mkc["start_addr"], mkc["len"], mkc["lw"], mkc["rw"], mkc["rr"], mkc["a"]) == \
        (h.f.addr, size, 1, 1, 1, 0)
    # the MTT the firmware copied maps the pinned pages: first and last block
    pgsz = 1 << mkc["log_page_size"]
    blocks = -(-size // pgsz)
    assert len(mkey.pas) == blocks + (blocks & 1)
    if h.f.layout == "fragmented":
        assert pgsz == h.m.page_size  # no two pages adjacent: one entry per page
    pgtable = h.p.mm.pgtable
    for i in (0, blocks - 1):
        pa = pte_addr(pgtable.get(h.f.addr + i * pgsz))
        assert _be(mkey.pas[i]) & -pgsz == pa
    assert h.p.mm.pinned_vm == 0
    assert h.m.vmstat["nr_foll_pin_acquired"] == h.m.vmstat["nr_foll_pin_released"]


@pytest.mark.parametrize("backend", ["c", "python"])
def test_reg_dereg_mr_1page(benchmark, host, backend):
    h = host
    h.m.ops = c_ext.backend(backend)
    try:
        result = benchmark(_reg_dereg, h, h.m.page_size)
    finally:
        h.m.ops = c_ext.backend("c")
    _check_mr(h, h.m.page_size, result)


@pytest.mark.parametrize("backend", ["c", "python"])
def test_pin_unpin_1page(benchmark, host, backend):
    """The yardstick of reg_mr 1 page: test_pin_1page_c's pin + unpin on the same page."""
    f, m = host.f, host.m
    pages = U64Array(1)

    def once():
        with f.proc.kernel():
            n = pin_user_pages_fast(f.addr, 1, FOLL_WRITE | FOLL_LONGTERM, pages)
            unpin_user_pages(pages, 1)
        return n

    m.ops = c_ext.backend(backend)
    try:
        n = benchmark(once)
    finally:
        m.ops = c_ext.backend("c")
    assert n == 1
    assert m.vmstat["nr_foll_pin_acquired"] == m.vmstat["nr_foll_pin_released"]


@pytest.mark.parametrize("backend", ["c", "python"])
def test_reg_dereg_mr_1gib(benchmark, host, backend):
    h = host
    h.m.ops = c_ext.backend(backend)
    try:
        rounds = 10 if backend == "c" else 2
        result = benchmark.pedantic(_reg_dereg, args=(h, h.f.size), rounds=rounds, iterations=1)
    finally:
        h.m.ops = c_ext.backend("c")
    _check_mr(h, h.f.size, result)


@pytest.mark.parametrize("backend", ["c", "python"])
def test_pin_map_unmap_1gib(benchmark, host, backend):
    """The yardstick of reg_mr 1 GiB: PinMap's pin + coalesce + map, then its unmap + unpin."""
    pm = PinMap(host.f, backend)

    def once():
        nents = pm.run()
        pm.reset()
        return nents

    rounds = 10 if backend == "c" else 2
    nents = benchmark.pedantic(once, rounds=rounds, iterations=1)
    assert nents == host.f.runs
    m = host.m
    assert m.vmstat["nr_foll_pin_acquired"] == m.vmstat["nr_foll_pin_released"]


@pytest.fixture(scope="module")
def qp_env():
    """A process with the device open, a PD and a 64-entry CQ (its buffer pinned)."""
    m = rdma_host(ram_size=256 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("bench")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 64)
    yield m, p, pd, cq
    assert v.ibv_destroy_cq(cq) == 0
    assert v.ibv_dealloc_pd(pd) == 0
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)
    m.check_leaks()


def test_create_destroy_qp(benchmark, qp_env):
    m, p, pd, cq = qp_env
    fw = m.hcas[0].fw
    pinned_before, qps_before = p.mm.pinned_vm, len(fw.qps)

    def once():
        attr = v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq, cap=v.ibv_qp_cap(64, 64, 1, 1),
                                  qp_type=v.IBV_QPT_RC)
        qp = v.ibv_create_qp(pd, attr)
        seen = (attr.cap, fw.qps.get(qp.qp_num), p.mm.pinned_vm - pinned_before)
        return seen + (v.ibv_destroy_qp(qp),)

    cap, fw_qp, pinned, destroyed = benchmark(once)
    assert destroyed == 0
    assert cap.max_send_wr >= 64 and cap.max_recv_wr >= 64
    assert cap.max_send_sge >= 1 and cap.max_recv_sge >= 1
    assert fw_qp is not None and fw_qp.num not in fw.qps  # created, then destroyed
    assert 1 << fw_qp.qpc["log_rq_size"] >= 64 and fw_qp.qpc["cqn_snd"] == fw_qp.qpc["cqn_rcv"]
    assert pinned >= 1  # the QP buffer was pinned while the QP lived ...
    assert p.mm.pinned_vm == pinned_before and len(fw.qps) == qps_before  # ... and given back
