"""Tests for drivers/mlx5_ib/odp.py (and the firmware's ODP commands, the engine's page
faults): the ODP mkey and its MTT, the page-fault EQ, prefetch (ibv_advise_mr) and
each errno of the paths ODP added.  End-to-end traffic: tests/flows/test_odp_flow.py."""

from __future__ import annotations

import errno

import pytest

from drivers.mlx5_ib.odp import (
    MLX5_EVENT_TYPE_PAGE_FAULT,
    implicit_get_child_mr,
    mlx5_ib_pf_eq,
    mlx5r_deref_odp_mkey,
    pagefault_single_data_segment,
)
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_EMU_UMR_UPDATE_XLT,
    MLX5_CMD_OP_PAGE_FAULT_RESUME,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.mm import MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE
from tests.drivers.mlx5_ib.ladder import cmds, errno_of, fw, ib_dev, last_error, user_pages
from userspace.libibverbs import verbs as v

LW, RW, RR = v.IBV_ACCESS_LOCAL_WRITE, v.IBV_ACCESS_REMOTE_WRITE, v.IBV_ACCESS_REMOTE_READ
ODP = LW | RW | RR | v.IBV_ACCESS_ON_DEMAND
K4 = 4096
PREFETCH, PREFETCH_WRITE, NO_FAULT, FLUSH = 0, 1, 2, 1


@pytest.fixture
def app(app):
    p, ctx = app
    return p, ctx, v.ibv_alloc_pd(ctx)


def fresh(p, n: int = 4) -> int:
    """n anonymous pages, never touched (nothing present)."""
    return p.mmap(0, n * K4, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)


def present_bits(m, mr) -> list[int]:
    """The MTT read/write bits of each entry of the MR's mkey (MTT entries are BE)."""
    mk = fw(m).mkeys[mr.lkey >> 8]
    return [int(x).to_bytes(8, "little")[7] & 3 for x in mk.pas.view[:mk.pas.n]]


def sge(addr: int, length: int, lkey: int) -> v.ibv_sge:
    return v.ibv_sge(addr, length, lkey)


def test_an_odp_mkey_starts_empty_with_the_touched_pages_loaded(m, app):
    p, ctx, pd = app
    addr = fresh(p, 4)
    p.store(addr + K4, b"x")                       # one page present before registration
    mr = p.run(v.ibv_reg_mr, pd, addr, 4 * K4, ODP)
    mk = fw(m).mkeys[mr.lkey >> 8]
    assert mk.pg_access and mk.pf_absent and not mk.mkc["free"]
    assert present_bits(m, mr)[:4] == [0, 3, 0, 0]   # the snapshot: page 1 only
    assert p.mm.pinned_vm == 0
    assert cmds(m)[-2:] == ["CREATE_MKEY", "EMU_UMR_UPDATE_XLT"]


def test_the_page_fault_eq_is_made_once_and_goes_at_remove(m, app):
    p, ctx, pd = app
    dev = ib_dev(m)
    assert dev.odp_pf_eq.core is None              # no ODP MR yet: no EQ
    n = len(fw(m).eqs)
    p.run(v.ibv_reg_mr, pd, fresh(p), K4, ODP)
    p.run(v.ibv_reg_mr, pd, fresh(p), K4, ODP)
    assert len(fw(m).eqs) == n + 1
    eq = fw(m).eqs[dev.odp_pf_eq.core.eqn]
    assert eq.event_bitmask == 1 << MLX5_EVENT_TYPE_PAGE_FAULT
    p.exit(0)
    m.unload_module("mlx5_ib")
    assert len(fw(m).eqs) == n


def test_implicit_odp_with_an_iova_is_einval(m, app):
    p, ctx, pd = app
    assert errno_of(v.ibv_reg_mr_iova, pd, 0, (1 << 64) - 1, K4, ODP) == errno.EINVAL
    assert "implicit MR with an iova" in last_error(p)


def test_implicit_odp_children_come_and_go(m, app):
    """The first fault in a slice makes its child (an ODP MTT mkey among the ODP mkeys);
    munmap of every page the child mapped destroys it from a work; dereg takes the
    parent and the children left, every DMA mapping given back."""
    from kernel_model.workqueue import flush_workqueue, system_wq
    p, ctx, pd = app
    dev = m.hcas[0].pdev.dev
    n = dev.nr_dma_mappings
    imr = p.run(v.ibv_reg_mr, pd, 0, (1 << 64) - 1, ODP)
    parent = ib_dev(m).odp_mkeys[imr.lkey >> 8]
    assert parent.is_odp_implicit and parent.implicit_children == {}
    addr = fresh(p, 2)
    assert v.ibv_advise_mr(pd, PREFETCH_WRITE, FLUSH, [sge(addr, 2 * K4, imr.lkey)]) == 0
    [(idx, child)] = parent.implicit_children.items()
    assert idx == addr >> 30 and child.parent is parent and child.umem.npages_mapped == 2
    key = child.lkey
    assert ib_dev(m).odp_mkeys[child.lkey >> 8] is child and dev.nr_dma_mappings == n + 2
    assert p.munmap(addr, K4) == 0 and parent.implicit_children      # one page left
    assert p.munmap(addr + K4, K4) == 0 and not parent.implicit_children
    with p.kernel():
        flush_workqueue(system_wq(m))
    assert key >> 8 not in fw(m).mkeys and key >> 8 not in ib_dev(m).odp_mkeys  # child freed
    again = fresh(p, 1)
    assert v.ibv_advise_mr(pd, PREFETCH_WRITE, FLUSH, [sge(again, K4, imr.lkey)]) == 0
    assert p.run(v.ibv_dereg_mr, imr) == 0
    assert dev.nr_dma_mappings == n and ib_dev(m).odp_mkeys == {}
    assert imr.lkey >> 8 not in fw(m).mkeys


def test_a_child_made_twice_keeps_the_first(m, app):
    """Two faults racing to make the same slice's child: the loser's goes, both use the
    winner's, each with a reference (mlx5r_deref_odp_mkey drops it)."""
    p, ctx, pd = app
    imr = p.run(v.ibv_reg_mr, pd, 0, (1 << 64) - 1, ODP)
    parent = ib_dev(m).odp_mkeys[imr.lkey >> 8]
    n, maps = len(fw(m).mkeys), m.hcas[0].pdev.dev.nr_dma_mappings
    with p.kernel():
        first = implicit_get_child_mr(parent, 5)
        again = implicit_get_child_mr(parent, 5)
        assert again is first and first.odp_users == 2 and len(fw(m).mkeys) == n + 1
        assert parent.implicit_children == {5: first}
        mlx5r_deref_odp_mkey(first)
        mlx5r_deref_odp_mkey(again)
    assert first.odp_users == 0 and m.hcas[0].pdev.dev.nr_dma_mappings == maps
    assert p.run(v.ibv_dereg_mr, imr) == 0 and len(fw(m).mkeys) == n - 1


def test_dereg_unmaps_every_faulted_page(m, app):
    p, ctx, pd = app
    dev = m.hcas[0].pdev.dev
    n = dev.nr_dma_mappings
    mr = p.run(v.ibv_reg_mr, pd, user_pages(p, 3), 3 * K4, ODP)
    assert dev.nr_dma_mappings == n + 3
    assert p.run(v.ibv_dereg_mr, mr) == 0
    assert dev.nr_dma_mappings == n and ib_dev(m).odp_mkeys == {}


# -- prefetch ------------------------------------------------------------------------------
@pytest.mark.parametrize("advice,bits", [(PREFETCH_WRITE, 3), (PREFETCH, 1)])
def test_sync_prefetch_faults_the_range_in(m, app, advice, bits):
    p, ctx, pd = app
    addr = fresh(p, 4)
    mr = p.run(v.ibv_reg_mr, pd, addr, 4 * K4, ODP)
    assert v.ibv_advise_mr(pd, advice, FLUSH, [sge(addr + K4, 2 * K4, mr.lkey)]) == 0
    assert present_bits(m, mr)[:4] == [0, bits, bits, 0]
    assert p.mm.pgtable.get(addr + K4) & 1 and not p.mm.pgtable.get(addr) & 1


def test_no_fault_prefetch_maps_only_present_pages(m, app):
    p, ctx, pd = app
    addr = fresh(p, 2)
    mr = p.run(v.ibv_reg_mr, pd, addr, 2 * K4, ODP)
    p.store(addr + K4, b"y")
    assert v.ibv_advise_mr(pd, NO_FAULT, FLUSH, [sge(addr, 2 * K4, mr.lkey)]) == 0
    assert present_bits(m, mr)[:2] == [0, 3] and not p.mm.pgtable.get(addr) & 1


def test_async_prefetch_runs_on_a_workqueue(m, app):
    p, ctx, pd = app
    addr = fresh(p, 2)
    mr = p.run(v.ibv_reg_mr, pd, addr, 2 * K4, ODP)
    assert v.ibv_advise_mr(pd, PREFETCH_WRITE, 0, [sge(addr, 2 * K4, mr.lkey)]) == 0
    for _ in range(100):
        if present_bits(m, mr)[:2] == [3, 3]:
            break
        p.sched_yield()
    assert present_bits(m, mr)[:2] == [3, 3]


def test_advise_errnos(m, app):
    p, ctx, pd = app
    addr = fresh(p, 2)
    mr = p.run(v.ibv_reg_mr, pd, addr, 2 * K4, ODP)
    plain = p.run(v.ibv_reg_mr, pd, user_pages(p), K4, LW)
    ok = [sge(addr, K4, mr.lkey)]
    assert v.ibv_advise_mr(pd, 3, FLUSH, ok) == errno.EOPNOTSUPP       # unknown advice
    assert v.ibv_advise_mr(pd, PREFETCH, 2, ok) == errno.EINVAL        # unknown flag
    assert v.ibv_advise_mr(pd, PREFETCH, FLUSH, []) == errno.EINVAL    # no SGE
    bad = [sge(plain.addr, K4, plain.lkey)]                           # not an ODP MR
    assert v.ibv_advise_mr(pd, PREFETCH, FLUSH, bad) == errno.ENOENT
    assert v.ibv_advise_mr(pd, PREFETCH, 0, bad) == errno.EINVAL       # async: checked first
    pd2 = v.ibv_alloc_pd(ctx)                                          # another PD's MR
    assert v.ibv_advise_mr(pd2, PREFETCH, FLUSH, ok) == errno.ENOENT
    outside = [sge(addr + K4, 2 * K4, mr.lkey)]                        # beyond the MR
    assert v.ibv_advise_mr(pd, PREFETCH, FLUSH, outside) == errno.EFAULT


def test_prefetch_write_of_a_read_only_odp_mr_is_enoent(m, app):
    p, ctx, pd = app
    addr = fresh(p, 1)
    mr = p.run(v.ibv_reg_mr, pd, addr, K4, v.IBV_ACCESS_ON_DEMAND)
    assert v.ibv_advise_mr(pd, PREFETCH_WRITE, FLUSH, [sge(addr, K4, mr.lkey)]) == errno.ENOENT
    assert v.ibv_advise_mr(pd, PREFETCH, FLUSH, [sge(addr, K4, mr.lkey)]) == 0
    assert present_bits(m, mr)[0] == 1


def test_advise_without_the_driver_op_is_eopnotsupp(m, app):
    p, ctx, pd = app
    ops = ib_dev(m).ops
    saved, ops.advise_mr = ops.advise_mr, None
    try:
        mr = p.run(v.ibv_reg_mr, pd, fresh(p), K4, ODP)
        assert v.ibv_advise_mr(pd, PREFETCH, FLUSH, [sge(mr.addr, K4, mr.lkey)]) == \
            errno.EOPNOTSUPP
    finally:
        ops.advise_mr = saved


# -- the page-fault path's lookups ---------------------------------------------------------
def test_a_fault_on_a_deleted_or_stale_key(m, app):
    p, ctx, pd = app
    dev = ib_dev(m)
    mr = p.run(v.ibv_reg_mr, pd, fresh(p), K4, ODP)
    with p.kernel():
        assert pagefault_single_data_segment(dev, 0x12345600, 0, K4) == 0   # no such MR
        with pytest.raises(Exception) as ei:                               # stale variant
            pagefault_single_data_segment(dev, mr.lkey ^ 0x01, mr.addr, K4)
        assert ei.value.errno == errno.EFAULT
        assert pagefault_single_data_segment(dev, mr.lkey, mr.addr, K4) == 1


# -- the firmware's ODP commands -------------------------------------------------------------
def _exec(m, in_, out_name):
    return m.hcas[0].fw.execute(in_, IfcStruct(out_name))


def test_page_fault_resume_of_an_unknown_token_is_bad_param(m):
    in_ = IfcStruct("page_fault_resume_in")
    MLX5_SET("page_fault_resume_in", in_, "opcode", MLX5_CMD_OP_PAGE_FAULT_RESUME)
    MLX5_SET("page_fault_resume_in", in_, "token", 77)
    assert _exec(m, in_, "page_fault_resume_out") == MLX5_CMD_STAT_BAD_PARAM_ERR
    MLX5_SET("page_fault_resume_in", in_, "uid", 5)                 # a user's uid
    assert _exec(m, in_, "page_fault_resume_out") == MLX5_CMD_STAT_BAD_PARAM_ERR


def test_update_xlt_errors(m, app):
    p, ctx, pd = app
    odp = p.run(v.ibv_reg_mr, pd, fresh(p), K4, ODP)
    plain = p.run(v.ibv_reg_mr, pd, user_pages(p), K4, LW)

    def xlt(key: int, first: int, n: int, entries: int, zap: int = 0) -> int:
        in_ = IfcStruct("emu_umr_update_xlt_in", klm_pas_mtt=entries)
        MLX5_SET("emu_umr_update_xlt_in", in_, "opcode", MLX5_CMD_OP_EMU_UMR_UPDATE_XLT)
        MLX5_SET("emu_umr_update_xlt_in", in_, "mkey_index", key >> 8)
        MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_offset", first)
        MLX5_SET("emu_umr_update_xlt_in", in_, "xlt_nentries", n)
        MLX5_SET("emu_umr_update_xlt_in", in_, "zap", zap)
        return _exec(m, in_, "emu_umr_update_xlt_out")
    assert xlt(odp.lkey, 0, 8, 8) == MLX5_CMD_STAT_BAD_PARAM_ERR        # beyond the table
    assert xlt(odp.lkey, 0, 2, 1) == MLX5_CMD_STAT_BAD_INP_LEN_ERR      # fewer entries
    # with the pg capability every MTT mkey has pg_access (reg_create); a pinned MR's
    # entries are all present, so the engine never checks them
    plain_mk = fw(m).mkeys[plain.lkey >> 8]
    assert plain_mk.pg_access and not plain_mk.pf_absent
    assert xlt(odp.lkey, 0, 1, 0, zap=1) == 0
    assert fw(m).mkeys[odp.lkey >> 8].pf_absent
    # a KSM mkey (an implicit MR's parent): 16-byte entries, two of the table's words
    imr = p.run(v.ibv_reg_mr, pd, 0, (1 << 64) - 1, ODP)
    last = (1 << 17) - 1
    assert xlt(imr.lkey, last, 2, 4) == MLX5_CMD_STAT_BAD_PARAM_ERR     # beyond the KSMs
    assert xlt(imr.lkey, last, 1, 1) == MLX5_CMD_STAT_BAD_INP_LEN_ERR   # half an entry
    assert xlt(imr.lkey, last, 1, 2) == 0                               # one whole entry


def test_pf_eq_object_repr():
    assert mlx5_ib_pf_eq(None).core is None
