"""End-to-end verbs flows: a process opens the device, creates objects and
tears them down through libibverbs -> uverbs write() -> ib_core -> mlx5_ib ->
firmware, and the machine passes the leak check after every test.

These assert what a kernel engineer would check on a real system: the
alloc_ucontext response, the UAR pages mapped, which bfreg each QP gets, the
pages an MR pins, the errno of each bad call, and the teardown order.
"""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.trace import Tracer
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPInitAttr


@pytest.fixture
def host():
    m = rdma_host(ram_size=256 << 20)
    m.load_module("mlx5_ib")
    return m


def _open(p):
    devs = v.ibv_get_device_list(p)
    assert [d.name for d in devs] == ["mlx5_0"]
    return v.ibv_open_device(p, devs[0])


def test_open_device_reproduces_the_seed_response(host):
    p = host.spawn("app")
    ctx = _open(p)
    r = ctx.resp
    assert (r.bf_reg_size, r.tot_bfregs, r.num_dyn_bfregs, r.num_uars_per_page,
            r.log_uar_size) == (512, 16, 1024, 1, 12)
    assert (r.qp_tab_size, r.cache_line_size, r.max_sq_desc_sz, r.max_rq_desc_sz) == \
        (262144, 64, 1024, 512)
    assert (r.max_send_wqebb, r.max_recv_wr, r.max_srq_recv_wr, r.num_ports) == \
        (32768, 32768, 32768, 1)
    assert (r.comp_mask, r.response_length, r.cqe_version, r.cmds_supp_uhw,
            r.eth_min_inline, r.clock_info_versions, r.dump_fill_mkey) == \
        (3, 72, 1, 3, 2, 1, 1792)
    # 8 UAR pages mapped at open, 32 bfs[] entries, bfreg 0 never BlueFlame; and the
    # two read-only clock pages (core clock, clock info: commands 5 and 7)
    assert len(ctx.uar) == 8 and len(ctx.bfs) == 32
    uverbs_vmas = [vma for vma in p.mm.vmas if vma.vm_file is not None
                   and vma.vm_file.f_path == "/dev/infiniband/uverbs0"]
    assert sorted(vma.vm_pgoff >> 8 for vma in uverbs_vmas) == [0] * 8 + [5, 7]
    assert ctx.bfs[0].buf_size == 0 and ctx.bfs[24].buf_size == 256
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


def test_open_device_call_flow(host):
    p = host.spawn("app")
    with Tracer() as t:
        ctx = p.run(_open, p)
        p.run(v.ibv_close_device, ctx)
    assert_call_flow(t.trace, ["ibv_open_device", "sys_open", "mlx5_alloc_context",
                               "sys_write", "ib_uverbs_write", "ib_uverbs_get_context",
                               "mlx5_ib_alloc_ucontext", "calc_total_bfregs",
                               "allocate_uars", "mlx5_cmd_exec", "sys_mmap", "mlx5_ib_mmap",
                               "ibv_close_device", "mlx5_ib_dealloc_ucontext"])
    p.exit(0)


def test_seventeen_qps_share_bfregs_as_the_kernel_allocates_them(host):
    p = host.spawn("app")
    with Context(p) as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16)
        qps = [QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=v.ibv_qp_cap(1, 1, 1, 1)))
               for _ in range(17)]
        uuarns = [qp.qp.bf.uuarn for qp in qps]
        # kernel bfregs 12..15 (low latency), then 1..11, then 1 and 2 again;
        # user numbering bfregn/2*4 + bfregn%2
        kernel = [12, 13, 14, 15] + list(range(1, 12)) + [1, 2]
        assert uuarns == [b // 2 * 4 + b % 2 for b in kernel]
        assert len({qp.qp_num for qp in qps}) == 17
    p.exit(0)


def test_reg_mr_pins_and_dereg_releases(host):
    p = host.spawn("app")
    n = 16
    with Context(p) as ctx, PD(ctx) as pd:
        before = p.mm.pinned_vm
        mr = MR(pd, n * host.page_size, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
        assert p.mm.pinned_vm == before + n
        assert mr.lkey == mr.rkey and mr.lkey != 0
        mr.close()
        assert p.mm.pinned_vm == before
    p.exit(0)


@pytest.mark.parametrize("access,length,err", [
    (v.IBV_ACCESS_REMOTE_WRITE, 4096, errno.EINVAL),   # remote write without local write
    (v.IBV_ACCESS_LOCAL_WRITE, 0, errno.EINVAL),       # empty
    (1 << 15, 4096, errno.EINVAL),                     # unknown access bit
])
def test_reg_mr_bad_input(host, access, length, err):
    p = host.spawn("app")
    with Context(p) as ctx, PD(ctx) as pd:
        addr = p.mmap(0, 4096)
        with pytest.raises(VerbsError) as e:
            v.ibv_reg_mr(pd.pd, addr, length, access)
        assert e.value.errno == err
        assert p.mm.pinned_vm == 0
    p.exit(0)


def test_reg_mr_overflowing_range_is_einval(host):
    p = host.spawn("app")
    with Context(p) as ctx, PD(ctx) as pd:
        with pytest.raises(VerbsError) as e:
            v.ibv_reg_mr(pd.pd, (1 << 64) - 4096, 8192, v.IBV_ACCESS_LOCAL_WRITE)
        assert e.value.errno == errno.EINVAL
    p.exit(0)


def test_destroying_objects_in_use_is_ebusy(host):
    p = host.spawn("app")
    with Context(p) as ctx:
        pd = PD(ctx)
        cq = CQ(ctx, 8)
        qp = QP(pd, QPInitAttr(scq=cq, rcq=cq))
        assert v.ibv_dealloc_pd(pd.pd) == errno.EBUSY
        assert v.ibv_destroy_cq(cq.cq) == errno.EBUSY
        qp.close()
        assert v.ibv_destroy_cq(cq.cq) == 0
        cq.closed = True
        assert v.ibv_dealloc_pd(pd.pd) == 0
        pd.closed = True
    p.exit(0)


def test_handles_are_per_file(host):
    a, b = host.spawn("a"), host.spawn("b")
    ctx_a, ctx_b = _open(a), _open(b)
    pd_a = v.ibv_alloc_pd(ctx_a)
    pd_b = v.ibv_alloc_pd(ctx_b)
    assert pd_a.handle == pd_b.handle == 0
    # b names a handle only a has: b's file has no handle 1 (the lookup's ENOENT)
    ghost = v.ibv_pd(ctx_b, 1)
    assert v.ibv_dealloc_pd(ghost) == errno.ENOENT
    a.exit(0)
    b.exit(0)


def test_exit_without_cleanup_destroys_everything_newest_first(host):
    p = host.spawn("app")
    ctx = _open(p)
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 4)
    v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq, cap=v.ibv_qp_cap(1, 1, 1, 1)))
    addr = p.mmap(0, 4096)
    v.ibv_reg_mr(pd, addr, 4096, v.IBV_ACCESS_LOCAL_WRITE)
    with Tracer() as t:
        p.exit(0)
    names = [c.func for c in t.trace.calls() if c.func in (
        "mlx5_ib_dereg_mr", "mlx5_ib_destroy_qp", "mlx5_ib_destroy_cq", "mlx5_ib_dealloc_pd",
        "mlx5_ib_dealloc_ucontext")]
    assert names == ["mlx5_ib_dereg_mr", "mlx5_ib_destroy_qp", "mlx5_ib_destroy_cq",
                     "mlx5_ib_dealloc_pd", "mlx5_ib_dealloc_ucontext"]


def test_mmap_errors(host):
    p = host.spawn("app")
    ctx = _open(p)
    ps = host.page_size
    assert p.mmap(0, 2 * ps, 2, 1, ctx.cmd_fd, 0) == -errno.EINVAL          # two pages
    assert p.mmap(0, ps, 2, 1, ctx.cmd_fd, 8 * ps) == -errno.EINVAL         # index 8 of 8
    assert p.mmap(0, ps, 2, 1, ctx.cmd_fd, (1 << 8) * ps) == -errno.ENOSYS  # contiguous pages
    v.ibv_close_device(ctx)
    p.exit(0)


def test_commands_before_get_context_are_einval(host):
    p = host.spawn("app")
    fd = p.open("/dev/infiniband/uverbs0")
    ctx = v.ibv_context(v.ibv_get_device_list(p)[0], p, fd, None)
    from userspace.libc import posix_memalign
    ctx.cmd_buf = posix_memalign(p, 4096, 4096)
    with pytest.raises(VerbsError) as e:
        v.ibv_query_device(ctx)
    assert e.value.errno == errno.EINVAL
    p.exit(0)


@pytest.fixture
def dyn_host():
    m = rdma_host(ram_size=256 << 20)
    m.load_module("mlx5_ib", dyn_uar=True)
    return m


def test_dynamic_uar_mode_allocates_uars_per_qp(dyn_host):
    """kernel_facts §13, dynamic end to end: nothing static at open; QP1-4 get the
    dedicated registers of 2 UARs, QP5-16 the shared ones of 6 more, QP17 shares
    the first shared register (count 2); 8 BlueFlame UARs plus the NC one."""
    p = dyn_host.spawn("app")
    fw = dyn_host.hcas[0].fw
    with Context(p) as ctx:
        assert ctx.ctx.resp.tot_bfregs == 0 and len(ctx.ctx.uar) == 0
        assert ctx.ctx.nc_uar is not None          # the singleton NC UAR object
        uars_at_open = len(fw.uars)
        with PD(ctx) as pd:
            cq = CQ(ctx, 16)
            qps = [QP(pd, QPInitAttr(scq=cq, rcq=cq, cap=v.ibv_qp_cap(1, 1, 1, 1)))
                   for _ in range(17)]
            bfs = [qp.qp.bf for qp in qps]
            assert all(bf.qp_dedicated for bf in bfs[:4])
            assert all(bf.qp_shared for bf in bfs[4:])
            assert len({bf.uar for bf in bfs[:4]}) == 2
            assert len({bf.uar for bf in bfs[4:16]}) == 6
            assert bfs[16] is bfs[4] and bfs[4].count == 2
            assert len(fw.uars) == uars_at_open + 8
            # each QP's QPC names the UAR its register lives on
            assert {fw.qps[qp.qp_num].qpc["uar_page"] for qp in qps} == \
                {bf_page for bf_page in (bf.page_id for bf in bfs)}
    p.exit(0)


def test_uar_object_ioctl_errors(dyn_host):
    from kernel_model.uapi import rdma_user_ioctl as ui
    from userspace.libibverbs.cmd import execute_ioctl
    p = dyn_host.spawn("app")
    ctx = _open(p)
    with pytest.raises(VerbsError) as e:          # alloc type 7 is neither BF nor NC
        execute_ioctl(ctx, ui.MLX5_IB_OBJECT_UAR, ui.MLX5_IB_METHOD_UAR_OBJ_ALLOC, [
            (ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, 0, "idr"),
            (ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, 7, "in"),
            (ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, 0, "out8"),
            (ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH, 0, "out4"),
            (ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, 0, "out4")])
    assert e.value.errno == errno.EOPNOTSUPP
    with pytest.raises(VerbsError) as e:          # a mandatory attribute missing
        execute_ioctl(ctx, ui.MLX5_IB_OBJECT_UAR, ui.MLX5_IB_METHOD_UAR_OBJ_ALLOC,
                      [(ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, 1, "in")])
    assert e.value.errno == errno.EINVAL
    with pytest.raises(VerbsError) as e:          # no such method
        execute_ioctl(ctx, ui.MLX5_IB_OBJECT_UAR, 0x1FFF, [])
    assert e.value.errno == errno.EPROTONOSUPPORT
    with pytest.raises(VerbsError) as e:          # no such handle
        execute_ioctl(ctx, ui.MLX5_IB_OBJECT_UAR, ui.MLX5_IB_METHOD_UAR_OBJ_DESTROY,
                      [(ui.MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, 99, "idr")])
    assert e.value.errno == errno.ENOENT
    assert p.ioctl(ctx.cmd_fd, 0x1234, 0) == -errno.ENOTTY
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


def test_legacy_kernel_has_no_uar_objects(host):
    """Without dyn_uar (the seed's kernel) UAR objects are EOPNOTSUPP, and the
    library falls back to the static UARs."""
    p = host.spawn("app")
    ctx = _open(p)
    assert ctx.nc_uar is None and len(ctx.uar) == 8
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)
