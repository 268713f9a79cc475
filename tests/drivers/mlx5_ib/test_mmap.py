"""Tests for drivers/mlx5_ib/mmap.py: UAR pages, ALLOC_WC, clock pages, UAR objects.

Offsets from kernel_facts §4 and §13: vm_pgoff = command << 8 | index (plus the
extended index's high byte at bit 16); ALLOC_WC pgoff 0x600 -> system page 8.
"""

from __future__ import annotations

import errno

import pytest

from drivers.mlx5_core.clock import clock_info_read
from drivers.mlx5_core.ifc import MLX5_ISEG_INTERNAL_TIMER_H
from drivers.mlx5_ib.mlx5_ib import MLX5_IB_INVALID_UAR_INDEX
from drivers.mlx5_ib.mmap import (
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF,
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
    get_command,
    get_extended_index,
    mlx5_entry_to_mmap_offset,
    mlx5_ib_uar_obj_alloc,
    mlx5_ib_uar_obj_destroy,
)
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_ALLOC_UAR, MLX5_CMD_STAT_LIM_ERR
from kernel_model.pgtable import cache_mode, pte_addr, pte_present
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_MMAP_ALLOC_WC,
    MLX5_IB_MMAP_CLOCK_INFO,
    MLX5_IB_MMAP_CORE_CLOCK,
    MLX5_IB_MMAP_NC_PAGE,
    MLX5_IB_MMAP_REGULAR_PAGE,
    MLX5_IB_MMAP_WC_PAGE,
    MLX5_LIB_CAP_DYN_UAR,
    MLX5_QP_FLAG_BFREG_INDEX,
    mlx5_ib_clock_info,
)
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    create_qp_raw,
    fw,
    get_context,
    host,
    ib_dev,
    last_error,
    open_ctx,
    qp_cmd,
    qp_ucmd,
    rc_qp,
    ucontext,
    ucontext_req,
)
from userspace.libc import MAP_PRIVATE, MAP_SHARED, PROT_READ, PROT_WRITE
from userspace.libibverbs import verbs as v

PS = 4096


def pgoff(cmd, idx):
    return cmd << 8 | (idx & 0xFF) | (idx >> 8) << 16


def map_(p, ctx, cmd, idx, length=PS, prot=PROT_WRITE, flags=MAP_SHARED):
    """mmap of the uverbs file; the address or -errno."""
    return p.mmap(0, length, prot, flags, ctx.cmd_fd, pgoff(cmd, idx) * p.machine.page_size)


def phys(p, va):
    pte = p.mm.pgtable.get(va)
    assert pte_present(pte)
    return pte_addr(pte), cache_mode(pte)


def test_pgoff_decoding_vectors():
    assert (get_command(0x303), get_extended_index(0x303)) == (3, 3)
    assert (get_command(0x1062C), get_extended_index(0x1062C)) == (6, 300)


def test_entry_offset_vectors(m):
    class E:
        start_pgoff = 0x90000

    e = E()
    with m.kernel():
        assert mlx5_entry_to_mmap_offset(e) == 0x900 * PS
        e.start_pgoff = 0x90123
        assert mlx5_entry_to_mmap_offset(e) == 0x10923 * PS


@pytest.mark.parametrize("cmd,mode", [(MLX5_IB_MMAP_REGULAR_PAGE, "WC"),
                                      (MLX5_IB_MMAP_WC_PAGE, "WC"),
                                      (MLX5_IB_MMAP_NC_PAGE, "UC-")])
def test_static_uar_page_maps_the_uar_of_its_bar_page(m, app, cmd, mode):
    p, ctx = app
    uar = ucontext(p, ctx).bfregi.sys_pages[3]
    va = map_(p, ctx, cmd, 3)
    assert va > 0
    assert phys(p, va) == (ib_dev(m).mdev.bar_addr + uar * PS, mode)
    assert p.munmap(va, PS) == 0


@pytest.mark.parametrize("length,cmd,idx,err", [
    (2 * PS, MLX5_IB_MMAP_REGULAR_PAGE, 0, errno.EINVAL),   # not one page
    (PS, MLX5_IB_MMAP_REGULAR_PAGE, 8, errno.EINVAL),       # 8 static pages: 0..7
    (PS, MLX5_IB_MMAP_NC_PAGE, 255, errno.EINVAL),
    (PS, 1, 0, errno.ENOSYS),                               # GET_CONTIGUOUS_PAGES
    (PS, 9, 0, errno.EINVAL),                               # no mmap entry there
    (PS, MLX5_IB_MMAP_ALLOC_WC, 512, errno.EINVAL),         # page 520 of 520
])
def test_uar_mmap_errors(m, app, length, cmd, idx, err):
    p, ctx = app
    before = p.mm.rss, fw(m).live_objects()
    assert map_(p, ctx, cmd, idx, length) == -err
    assert (p.mm.rss, fw(m).live_objects()) == before


def test_wc_commands_without_write_combining_are_eperm():
    m = host(hca=Mlx5Config(write_combining=False))
    p = m.spawn("app")
    ctx = open_ctx(p)
    assert ctx.resp.bf_reg_size == 0
    for cmd in (MLX5_IB_MMAP_WC_PAGE, MLX5_IB_MMAP_ALLOC_WC):
        assert map_(p, ctx, cmd, 0) == -errno.EPERM
    assert map_(p, ctx, MLX5_IB_MMAP_NC_PAGE, 0) > 0
    p.exit(0)


def test_alloc_wc_maps_a_dynamic_page_once_and_a_qp_can_name_it(m, app):
    p, ctx = app
    bfregi = ucontext(p, ctx).bfregi
    uars = set(fw(m).uars)
    va = map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0)  # pgoff 0x600
    assert va > 0
    [new] = set(fw(m).uars) - uars
    assert bfregi.sys_pages[8] == new and bfregi.count[16] == 1
    assert phys(p, va) == (ib_dev(m).mdev.bar_addr + new * PS, "WC")
    # a QP on dynamic bfreg 1 (the page's second register) rings that UAR
    pd, cq = v.ibv_alloc_pd(ctx), v.ibv_create_cq(ctx, 4)
    core, resp = create_qp_raw(ctx, qp_cmd(pd, cq), qp_ucmd(
        p, flags=MLX5_QP_FLAG_BFREG_INDEX, bfreg_index=1))
    assert fw(m).qps[core.qpn].qpc["uar_page"] == new and resp.bfreg_index == 1 << 31
    # the busy mark stays after munmap: the page cannot be mapped again
    assert p.munmap(va, PS) == 0
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0) == -errno.EINVAL
    assert "is busy" in last_error(p)
    assert bfregi.sys_pages[9] == MLX5_IB_INVALID_UAR_INDEX


def test_dynamic_pages_are_freed_with_the_context(m, app):
    p, ctx = app
    va = map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 300)  # extended index: page 308
    assert va > 0
    bfregi = ucontext(p, ctx).bfregi
    dyn = bfregi.sys_pages[308]
    assert dyn in fw(m).uars and bfregi.count[616] == 1
    p.munmap(va, PS)  # the mapping holds the file (and the context) open
    n = len(fw(m).cmd_log)
    v.ibv_close_device(ctx)
    assert cmds(m, n).count("DEALLOC_UAR") == 9 and dyn not in fw(m).uars


def test_alloc_wc_firmware_failure_clears_the_busy_mark(m, app):
    p, ctx = app
    bfregi = ucontext(p, ctx).bfregi
    fw(m).inject(MLX5_CMD_OP_ALLOC_UAR, MLX5_CMD_STAT_LIM_ERR)
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0) == -errno.ENOMEM
    assert bfregi.count[16] == 0 and bfregi.sys_pages[8] == MLX5_IB_INVALID_UAR_INDEX
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0) > 0  # free to try again


def test_alloc_wc_mapping_failure_frees_the_uar_it_allocated(m, app):
    """Upstream (the default): the error path gives back the UAR ALLOC_WC took."""
    p, ctx = app
    bfregi = ucontext(p, ctx).bfregi
    uars = dict(fw(m).uars)
    n = len(fw(m).cmd_log)
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0, flags=MAP_PRIVATE) == -errno.EINVAL
    assert "not MAP_SHARED" in last_error(p)
    assert cmds(m, n) == ["ALLOC_UAR", "DEALLOC_UAR"]
    assert fw(m).uars == uars  # the new one went back, every static page's UAR stays
    assert bfregi.count[16] == 0 and bfregi.sys_pages[8] == MLX5_IB_INVALID_UAR_INDEX
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0) > 0  # the slot can be mapped after


def test_alloc_wc_mapping_failure_before_the_fix_frees_the_page_index(m):
    """release=6.8 keeps the bug of every release before the fix: DEALLOC_UAR is
    given the page slot `idx` (8) instead of the UAR just allocated.  The
    machine is left as the bug leaves it (no teardown, no leak check)."""
    m = host(release="6.8")
    m.leak_check_expected = False
    p = m.spawn("app")
    ctx = open_ctx(p)
    bfregi = ucontext(p, ctx).bfregi
    uars = set(fw(m).uars)
    n = len(fw(m).cmd_log)
    assert map_(p, ctx, MLX5_IB_MMAP_ALLOC_WC, 0, flags=MAP_PRIVATE) == -errno.EINVAL
    assert cmds(m, n) == ["ALLOC_UAR", "DEALLOC_UAR"]
    [leaked] = set(fw(m).uars) - uars  # the new UAR stays allocated, owned by no page
    assert bfregi.sys_pages[4] == 8 and 8 not in fw(m).uars  # static page 4's UAR: gone
    assert bfregi.count[16] == 0 and bfregi.sys_pages[8] == MLX5_IB_INVALID_UAR_INDEX
    assert leaked not in bfregi.sys_pages


@pytest.mark.parametrize("release,freed", [("upstream", False), ("7.2", False),
                                           ("6.8", True)])
def test_alloc_wc_failure_and_another_uid0_process_s_mapped_uar(release, freed):
    """Two contexts without DEVX (the device has no user contexts) are both uid 0:
    before the fix, A's failed ALLOC_WC mapping at slot 4 (idx 12) frees UAR 12 -
    B's static page 0, which B has mapped."""
    m = host(Mlx5Config(caps={"log_max_uctx": 0}), release=release)
    a, b = m.spawn("a"), m.spawn("b")
    ca, cb = open_ctx(a), open_ctx(b)
    ua, ub = ucontext(a, ca), ucontext(b, cb)
    assert ua.devx_uid == ub.devx_uid == 0 and ub.bfregi.sys_pages[0] == 12
    b_page = v_bar_page(b, cb)
    assert map_(a, ca, MLX5_IB_MMAP_ALLOC_WC, 4, flags=MAP_PRIVATE) == -errno.EINVAL
    assert (12 not in fw(m).uars) is freed
    assert b_page == ib_dev(m).mdev.bar_addr + 12 * PS  # B still maps the page
    a.exit(0)
    b.exit(0)  # B's context gives back its static pages: UAR 12 is gone if freed
    warned = any("failed to free uar 12" in line for line in ib_dev(m).mdev.log)
    assert warned is freed
    if freed:
        assert len(fw(m).uars) == 2  # the kernel's own, and the one A allocated: leaked
        m.leak_check_expected = False


def v_bar_page(p, ctx):
    """The physical page behind the process's first static UAR mapping."""
    return phys(p, ctx.uar[0].reg)[0]


# -- clock pages -----------------------------------------------------------------------------
def test_core_clock_page_is_the_timer_page_read_only_uncached(m, app):
    p, ctx = app
    va = map_(p, ctx, MLX5_IB_MMAP_CORE_CLOCK, 0, prot=PROT_READ)
    assert va > 0
    timer = ib_dev(m).mdev.iseg_base + MLX5_ISEG_INTERNAL_TIMER_H
    assert phys(p, va) == (timer & ~(PS - 1), "UC-")
    assert map_(p, ctx, MLX5_IB_MMAP_CORE_CLOCK, 0) == -errno.EPERM          # writable
    assert map_(p, ctx, MLX5_IB_MMAP_CORE_CLOCK, 0, 2 * PS, PROT_READ) == -errno.EINVAL


def test_core_clock_needs_4k_pages():
    m = host(page_size=65536)
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req())
    assert map_(p, ctx, MLX5_IB_MMAP_CORE_CLOCK, 0, 65536, PROT_READ) == -errno.EOPNOTSUPP
    p.exit(0)


def test_clock_info_page(m, app):
    p, ctx = app
    va = map_(p, ctx, MLX5_IB_MMAP_CLOCK_INFO, 0, prot=PROT_READ)
    assert va > 0
    assert mlx5_ib_clock_info.unpack(p.load(va, mlx5_ib_clock_info.SIZE)) == \
        clock_info_read(ib_dev(m).clock_info)               # what mlx5_core wrote
    assert phys(p, va)[0] == ib_dev(m).clock_info.pfn * PS
    ci = MLX5_IB_MMAP_CLOCK_INFO
    assert map_(p, ctx, ci, 0, prot=PROT_READ, flags=MAP_PRIVATE) == -errno.EINVAL
    assert map_(p, ctx, ci, 0, 2 * PS, PROT_READ) == -errno.EINVAL
    assert map_(p, ctx, ci, 1, prot=PROT_READ) == -errno.EOPNOTSUPP    # version 1
    assert map_(p, ctx, ci, 0) == -errno.EPERM                         # writable
    assert p.munmap(va, PS) == 0


def test_clock_info_without_the_page_is_eopnotsupp(m, app):
    p, ctx = app
    dev = ib_dev(m)
    page, dev.clock_info = dev.clock_info, None
    try:
        assert map_(p, ctx, MLX5_IB_MMAP_CLOCK_INFO, 0, prot=PROT_READ) == -errno.EOPNOTSUPP
    finally:
        dev.clock_info = page


# -- dynamic-UAR contexts and UAR objects ----------------------------------------------------
@pytest.fixture
def dyn():
    m = host(dyn_uar=True)
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req(lib_caps=1 | MLX5_LIB_CAP_DYN_UAR))
    yield m, p, ctx
    if p.alive:
        p.exit(0)


def test_dyn_uar_context_has_no_static_pages_to_map(dyn):
    m, p, ctx = dyn
    for cmd in (MLX5_IB_MMAP_REGULAR_PAGE, MLX5_IB_MMAP_ALLOC_WC):
        assert map_(p, ctx, cmd, 0) == -errno.EINVAL
        assert "dynamic-UAR context" in last_error(p)


@pytest.mark.parametrize("kind,mode", [(MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF, "WC"),
                                       (MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC, "UC-")])
def test_uar_object_mmap_and_free_after_the_last_unmap(dyn, kind, mode):
    m, p, ctx = dyn
    uctx = ucontext(p, ctx)
    with p.kernel():
        offset, page_id, length = mlx5_ib_uar_obj_alloc(uctx, kind)
        second = mlx5_ib_uar_obj_alloc(uctx, kind)
    assert (offset, length) == (0x900 * PS, PS) and second[0] == 0x901 * PS
    assert fw(m).uars[page_id].uid == 0
    va = p.mmap(0, PS, PROT_WRITE, MAP_SHARED, ctx.cmd_fd, offset)
    assert va > 0 and phys(p, va) == (ib_dev(m).mdev.bar_addr + page_id * PS, mode)
    with p.kernel():
        mlx5_ib_uar_obj_destroy(uctx, offset)
        mlx5_ib_uar_obj_destroy(uctx, second[0])
    assert page_id in fw(m).uars and second[1] not in fw(m).uars  # still mapped
    assert p.mmap(0, PS, PROT_WRITE, MAP_SHARED, ctx.cmd_fd, offset) == -errno.EINVAL
    n = len(fw(m).cmd_log)
    assert p.munmap(va, PS) == 0
    assert cmds(m, n) == ["DEALLOC_UAR"] and page_id not in fw(m).uars


def _uar_obj_errno(p, ctx, kind):
    try:
        with p.kernel():
            mlx5_ib_uar_obj_alloc(ucontext(p, ctx), kind)
    except KernelError as e:
        return e.errno
    return 0


def test_uar_object_errors(dyn):
    m, p, ctx = dyn
    before = fw(m).live_objects()
    assert _uar_obj_errno(p, ctx, 2) == errno.EOPNOTSUPP
    fw(m).inject(MLX5_CMD_OP_ALLOC_UAR, MLX5_CMD_STAT_LIM_ERR)
    assert _uar_obj_errno(p, ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC) == errno.ENOMEM
    assert fw(m).live_objects() == before and ucontext(p, ctx).mmap_xa == {}
    with p.kernel(), pytest.raises(KernelError) as e:
        mlx5_ib_uar_obj_destroy(ucontext(p, ctx), 0x900 * PS)
    assert e.value.errno == errno.EINVAL


def test_uar_objects_need_the_dyn_uar_parameter(m, app):
    p, ctx = app
    assert _uar_obj_errno(p, ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC) == errno.EOPNOTSUPP


def test_bf_uar_object_needs_write_combining():
    m = host(dyn_uar=True, hca=Mlx5Config(write_combining=False))
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req(lib_caps=1 | MLX5_LIB_CAP_DYN_UAR))
    assert _uar_obj_errno(p, ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF) == errno.EOPNOTSUPP
    assert _uar_obj_errno(p, ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC) == 0
    with p.kernel():
        mlx5_ib_uar_obj_destroy(ucontext(p, ctx), 0x900 * PS)
    p.exit(0)


# -- no two processes share a UAR page, whatever the system page size -------------------------
def bar_pages(p, hca) -> set[int]:
    """The physical pages of the HCA's BAR the process has mapped (its UAR mmaps; not
    the init-segment timer page libmlx5 maps read-only as the core clock)."""
    pages = set()
    for vma in p.mm.vmas:
        if vma.vm_file is None or vma.vm_pgoff >> 8 == MLX5_IB_MMAP_CORE_CLOCK:
            continue
        for va in range(vma.vm_start, vma.vm_end, p.machine.page_size):
            pte = p.mm.pgtable.get(va)
            if pte_present(pte) and hca.bar.start <= pte_addr(pte) <= hca.bar.end:
                pages.add(pte_addr(pte))
    return pages


@pytest.mark.parametrize("page_size", [4096, 16384, 65536])
@pytest.mark.parametrize("dyn_uar", [False, True], ids=["static", "dyn_uar"])
def test_two_processes_never_map_the_same_uar_page(page_size, dyn_uar):
    """Each system page of UARs is one ALLOC_UAR: on 16/64 KiB hosts the firmware
    used to hand out single 4 KiB UARs, so two contexts' UARs (and the kernel's,
    and the init segment) could sit in, and be mapped as, one system page."""
    m = host(page_size=page_size, dyn_uar=dyn_uar)
    hca, procs = m.hcas[0], [m.spawn("a"), m.spawn("b")]
    for p in procs:
        rc_qp(open_ctx(p))  # a QP: a dyn-UAR context maps its BF page now
    a, b = (bar_pages(p, hca) for p in procs)
    kernel = ib_dev(m).mdev.priv.uar.map  # the core's own UAR page (ioremap is 1:1 here)
    assert a and b and not a & b
    assert not (a | b) & {hca.bar.start, kernel - kernel % page_size}
    assert len(a) == {(4096, False): 8, (16384, False): 2, (65536, False): 1}.get(
        (page_size, dyn_uar), 2)  # static pages; or the NC page and one BF page
    for p in procs:
        p.exit(0)


# -- a UAR object destroyed while a CQ still names it (issue 18 #1, #2) -----------------------
@pytest.fixture
def dyn_cq():
    """rdma-core on a dyn_uar kernel: the singleton NC UAR object, a CQ naming it."""
    m = host(dyn_uar=True)
    p = m.spawn("app")
    ctx = open_ctx(p)
    cq = v.ibv_create_cq(ctx, 16)
    uar = ctx.nc_uar.page_id
    assert fw(m).uars[uar].users == 1  # the CQ
    yield m, p, ctx, cq, uar
    if p.alive:
        p.exit(0)


def test_close_device_with_a_live_cq_frees_its_uar_after_the_cq(dyn_cq):
    """ibv_close_device destroys the NC UAR object first (as rdma-core does): its
    DEALLOC_UAR is busy, which the kernel only logs (mlx5_ib_mmap_free is void);
    the UAR goes back once uverbs destroyed the CQ, before the DEVX uid."""
    m, p, ctx, cq, uar = dyn_cq
    n = len(fw(m).cmd_log)
    assert v.ibv_close_device(ctx) == 0
    assert cmds(m, n) == ["DEALLOC_UAR", "DESTROY_CQ", "DEALLOC_TRANSPORT_DOMAIN",
                          "DEALLOC_UAR", "DESTROY_UCTX"]
    assert fw(m).cmd_log[n][2] != 0 and uar not in fw(m).uars  # the first: a status
    assert any("DEALLOC_UAR" in line and "busy" in line for line in ib_dev(m).mdev.log)
    p.exit(0)


@pytest.mark.parametrize("then", ["munmap", "exit"])
def test_destroyed_uar_object_s_mapping_goes_without_error(dyn_cq, then):
    """The UAR object is destroyed while its page is mapped and the CQ lives: the
    munmap (or the exit) that drops the last reference succeeds, and everything
    is freed by the end (the autouse leak check)."""
    m, p, ctx, cq, uar = dyn_cq
    bf = ctx.nc_uar
    ctx._destroy_uar_obj(ctx.uar_obj_handles.pop(bf.uar))
    assert uar in fw(m).uars
    if then == "munmap":
        assert p.munmap(bf.uar, bf.length) == 0
        assert uar in fw(m).uars  # busy: the CQ still names it
    p.exit(0)
    assert uar not in fw(m).uars and not fw(m).uctxs
