"""Tests for drivers/mlx5_ib/main.py: calc_total_bfregs, alloc/dealloc_ucontext, PDs.

Vectors from kernel_facts §3 and §13 (calc_total_bfregs table, request checks).
"""

from __future__ import annotations

import errno
import re

import pytest

from drivers.mlx5_ib.main import calc_total_bfregs, mlx5_ib_alloc_ucontext
from drivers.mlx5_ib.mlx5_ib import MLX5_IB_INVALID_UAR_INDEX, mlx5_bfreg_info
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_ALLOC_PD,
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_ALLOC_UAR,
    MLX5_CMD_STAT_LIM_ERR,
)
from kernel_model.trace import Tracer
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG,
    MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS,
    MLX5_LIB_CAP_DYN_UAR,
    mlx5_ib_alloc_pd_resp,
    mlx5_ib_alloc_ucontext_req,
    mlx5_ib_alloc_ucontext_resp,
)
from tests.drivers.mlx5_ib.ladder import (
    RawBytes,
    cmds,
    devx_req,
    errno_of,
    fw,
    fw_objects,
    get_context,
    host,
    ib_dev,
    last_error,
    open_ctx,
    raw_ctx,
    response_at_edge,
    ucontext,
    ucontext_req,
    user_pages,
    write_raw,
)
from userspace.libibverbs import verbs as v

LIB_4K = 1


@pytest.fixture(scope="module")
def m4k():
    """One 4 KiB-page host for the pure calc_total_bfregs vectors (nothing is allocated)."""
    return host()


# -- calc_total_bfregs -------------------------------------------------------------------
def _calc(m, total, low, lib_4k=LIB_4K):
    req, bfregi = ucontext_req(total, low), mlx5_bfreg_info()
    with m.kernel():
        calc_total_bfregs(ib_dev(m), bool(lib_4k), req, bfregi)
    return (bfregi.num_static_sys_pages, bfregi.num_dyn_bfregs, bfregi.total_num_bfregs,
            bfregi.num_sys_pages, req.total_num_bfregs)


@pytest.mark.parametrize("total,low,expected", [
    (16, 4, (8, 1024, 1040, 520, 16)),
    (7, 0, (4, 1024, 1032, 516, 8)),
    (511, 0, (256, 1024, 1536, 768, 512)),
    (512, 511, (256, 1024, 1536, 768, 512)),
])
def test_calc_total_bfregs_vectors_4k(m4k, total, low, expected):
    assert _calc(m4k, total, low) == expected
    assert _calc(m4k, total, low, lib_4k=0) == expected  # no uar_4k on 4 KiB hosts


@pytest.mark.parametrize("total,low,err", [
    (0, 0, errno.EINVAL), (513, 0, errno.ENOMEM), (16, 16, errno.EINVAL), (1 << 31, 0,
                                                                          errno.ENOMEM)])
def test_calc_total_bfregs_errors(m4k, total, low, err):
    with pytest.raises(KernelError) as e:
        _calc(m4k, total, low)
    assert e.value.errno == err


def test_calc_total_bfregs_on_64k_pages():
    m = host(page_size=65536)
    # uar_4k: 16 UARs per system page, 32 bfregs per page: 16 requested become 32
    assert _calc(m, 16, 4) == (1, 1024, 1056, 33, 32)
    # without the library's 4K-UAR cap: one UAR per page, and only 512 dynamic slots
    assert _calc(m, 16, 4, lib_4k=0) == (8, 512, 528, 264, 16)


# -- alloc_ucontext: the response and what it allocates ---------------------------------
def test_context_allocates_the_static_uars_and_reports_them(m):
    p = m.spawn("app")
    before = fw_objects(m)
    ctx, resp = get_context(p, ucontext_req(7, 0))
    uctx = ucontext(p, ctx)
    bfregi = uctx.bfregi
    assert (resp.tot_bfregs, resp.num_dyn_bfregs, resp.log_uar_size, resp.num_uars_per_page,
            resp.bf_reg_size, resp.cqe_version) == (8, 1024, 12, 1, 512, 1)
    assert resp.comp_mask == (MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET
                              | MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY)
    assert resp.response_length == mlx5_ib_alloc_ucontext_resp.SIZE
    assert (bfregi.ver, bfregi.num_low_latency_bfregs, len(bfregi.count),
            len(bfregi.sys_pages)) == (2, 0, 1032, 516)
    static = bfregi.sys_pages[:4]
    assert sorted(set(static)) == static and all(u in fw(m).uars for u in static)
    assert all(fw(m).uars[u].uid == 0 for u in static)  # no DEVX: uid 0
    assert bfregi.sys_pages[4:] == [MLX5_IB_INVALID_UAR_INDEX] * 512
    assert len(fw_objects(m)) == len(before) + 4 + 1  # 4 UARs + a transport domain
    p.close(ctx.cmd_fd)
    assert fw_objects(m) == before


def test_devx_context_stamps_its_uid_and_close_frees_in_kernel_order(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    uctx = ucontext(p, ctx)
    uid = uctx.devx_uid
    assert uid in fw(m).uctxs and fw(m).tds[uctx.tdn].uid == uid
    assert all(fw(m).uars[u].uid == uid for u in uctx.bfregi.sys_pages[:8])
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        v.ibv_close_device(ctx)
    assert cmds(m, n) == ["DEALLOC_TRANSPORT_DOMAIN"] + ["DEALLOC_UAR"] * 8 + ["DESTROY_UCTX"]
    assert_call_flow(t.trace, ["mlx5_ib_dealloc_ucontext", "mlx5_ib_dealloc_transport_domain",
                               "deallocate_uars", "mlx5_ib_devx_destroy"])
    assert uid not in fw(m).uctxs
    p.exit(0)


def test_v0_request_gets_abi_version_0_and_cqe_version_0(m):
    p = m.spawn("app")
    ctx, resp = get_context(p, mlx5_ib_alloc_ucontext_req(total_num_bfregs=16,
                                                          num_low_latency_bfregs=4))
    assert ucontext(p, ctx).bfregi.ver == 0 and resp.cqe_version == 0
    assert resp.tot_bfregs == 16
    p.exit(0)


def test_short_response_buffer_gets_a_short_response_length(m):
    p = m.spawn("app")
    ctx = raw_ctx(p)
    core = uv.ib_uverbs_get_context_resp.SIZE
    out = user_pages(p)
    p.store(out, b"\xff" * 256)
    assert write_raw(ctx, uv.IB_USER_VERBS_CMD_GET_CONTEXT, uv.ib_uverbs_get_context(), core,
                     ucontext_req().pack(), 48, out) == 0
    resp = mlx5_ib_alloc_ucontext_resp.unpack(p.load(out + core, 48))
    assert resp.response_length == 48 and resp.tot_bfregs == 16
    assert p.load(out + core + 48, 8) == b"\xff" * 8  # nothing written past outlen
    p.exit(0)


def test_dyn_uar_lib_cap_is_ignored_without_the_module_parameter(m):
    p = m.spawn("app")
    ctx, resp = get_context(p, ucontext_req(lib_caps=LIB_4K | MLX5_LIB_CAP_DYN_UAR))
    assert resp.tot_bfregs == 16 and not ucontext(p, ctx).bfregi.lib_uar_dyn
    p.exit(0)


def test_dyn_uar_context_allocates_no_uar_and_skips_the_bfreg_checks():
    m = host(dyn_uar=True)
    p = m.spawn("app")
    before = fw_objects(m)
    ctx, resp = get_context(p, ucontext_req(0, 5, lib_caps=LIB_4K | MLX5_LIB_CAP_DYN_UAR))
    bfregi = ucontext(p, ctx).bfregi
    assert (resp.tot_bfregs, resp.num_dyn_bfregs) == (0, 0)
    assert bfregi.lib_uar_dyn and bfregi.count == [] and bfregi.sys_pages == []
    assert [o for o in fw_objects(m) if o not in before] == [f"TD {ucontext(p, ctx).tdn:#x} uid=0"]
    p.exit(0)


def test_comp_mask_v6_and_mkey_update_tag_parameters_add_their_bits():
    m = host(comp_mask_v6=True, mkey_update_tag=True)
    p = m.spawn("app")
    _ctx, resp = get_context(p, ucontext_req())
    for bit in (MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE, MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS,
                MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG,
                MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY):
        assert resp.comp_mask & bit
    p.exit(0)


def test_64k_host_with_uar_4k_reports_4k_uars():
    m = host(page_size=65536)
    p = m.spawn("app")
    ctx, resp = get_context(p, ucontext_req())
    assert (resp.tot_bfregs, resp.log_uar_size, resp.num_uars_per_page) == (32, 12, 16)
    assert not resp.comp_mask & MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET
    assert ucontext(p, ctx).bfregi.num_static_sys_pages == 1
    p.exit(0)


def test_second_user_transport_domain_enables_loopback_and_the_last_disables_it(m):
    vport = fw(m).vport
    a, b = m.spawn("a"), m.spawn("b")
    ctx_a = open_ctx(a)
    assert vport.disable_uc_local_lb == vport.disable_mc_local_lb == 1
    ctx_b = open_ctx(b)
    assert vport.disable_uc_local_lb == vport.disable_mc_local_lb == 0
    assert ib_dev(m).lb.user_td == 2 and ib_dev(m).lb.enabled
    v.ibv_close_device(ctx_b)
    assert vport.disable_uc_local_lb == vport.disable_mc_local_lb == 1
    v.ibv_close_device(ctx_a)
    assert ib_dev(m).lb.user_td == 0 and not ib_dev(m).lb.enabled
    a.exit(0)
    b.exit(0)


# -- alloc_ucontext: each error, and nothing left behind -------------------------------
@pytest.mark.parametrize("drv_req,err,msg", [
    (ucontext_req(0, 0), errno.EINVAL, "zero bfregs"),
    (ucontext_req(513, 0), errno.ENOMEM, "514 bfregs > 512"),
    (ucontext_req(16, 16), errno.EINVAL, "16 low latency of 16"),
    (RawBytes(bytes(12)), errno.EINVAL, "request of 12 bytes"),
    (ucontext_req(flags=2), errno.EOPNOTSUPP, "flags 0x2"),
    (ucontext_req(comp_mask=1), errno.EOPNOTSUPP, "comp_mask/reserved"),
    (ucontext_req(reserved0=1), errno.EOPNOTSUPP, "comp_mask/reserved"),
    (ucontext_req(reserved1=1), errno.EOPNOTSUPP, "comp_mask/reserved"),
    (ucontext_req(reserved2=1), errno.EOPNOTSUPP, "comp_mask/reserved"),
])
def test_bad_requests_fail_with_their_errno_and_allocate_nothing(m, drv_req, err, msg):
    p = m.spawn("app")
    before = fw_objects(m)
    ctx = raw_ctx(p)
    assert errno_of(get_context, p, drv_req, ctx) == err
    assert msg in last_error(p)
    assert fw_objects(m) == before and ucontext(p, ctx) is None
    # the file still takes a good request afterwards
    assert get_context(p, ucontext_req(), ctx)[1].tot_bfregs == 16
    p.exit(0)


def test_devx_failure_and_zero_total_with_dyn_uar_lib_cap_accepted():
    # a total of 0 passes the u32 low-latency check (0 - 1 wraps) and, with DYN_UAR,
    # never reaches calc_total_bfregs
    m = host(dyn_uar=True, hca=Mlx5Config(caps={"log_max_uctx": 0}))
    p = m.spawn("app")
    before = fw_objects(m)
    ctx = raw_ctx(p)
    assert errno_of(get_context, p, devx_req(), ctx) == errno.EINVAL
    assert "no user contexts" in last_error(p) and fw_objects(m) == before
    _ctx, resp = get_context(p, ucontext_req(0, 5, lib_caps=MLX5_LIB_CAP_DYN_UAR), ctx)
    assert resp.tot_bfregs == 0
    p.exit(0)


def test_provider_retries_without_devx_when_the_device_has_no_uctx():
    m = host(hca=Mlx5Config(caps={"log_max_uctx": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    assert ucontext(p, ctx).devx_uid == 0 and fw(m).uctxs == {}
    p.exit(0)


def test_inactive_device_is_eagain(m):
    p = m.spawn("app")
    ctx = raw_ctx(p)
    ib_dev(m).ib_active = False
    try:
        assert errno_of(get_context, p, ucontext_req(), ctx) == errno.EAGAIN
    finally:
        ib_dev(m).ib_active = True
    p.exit(0)


def test_failing_third_uar_frees_the_first_two_newest_first_then_the_uid(m, monkeypatch):
    import drivers.mlx5_ib.main as main
    real, calls = main.mlx5_cmd_uar_alloc, []

    def third_fails(mdev, uid):
        calls.append(uid)
        if len(calls) == 3:
            fw(m).inject(MLX5_CMD_OP_ALLOC_UAR, MLX5_CMD_STAT_LIM_ERR)
        return real(mdev, uid)

    monkeypatch.setattr(main, "mlx5_cmd_uar_alloc", third_fails)
    p = m.spawn("app")
    before = fw_objects(m)
    ctx = raw_ctx(p)
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        assert errno_of(get_context, p, devx_req(), ctx) == errno.ENOMEM
    assert cmds(m, n) == ["CREATE_UCTX", "ALLOC_UAR", "ALLOC_UAR", "ALLOC_UAR",
                          "DEALLOC_UAR", "DEALLOC_UAR", "DESTROY_UCTX"]
    freed = [int(re.search(r"uarn=(\d+)", c.args)[1]) for c in t.trace.calls()
             if c.func == "mlx5_cmd_uar_dealloc"]
    assert len(freed) == 2 and freed[0] > freed[1]
    assert fw_objects(m) == before
    p.exit(0)


def test_failing_transport_domain_frees_every_uar_and_the_uid(m):
    p = m.spawn("app")
    before = fw_objects(m)
    ctx = raw_ctx(p)
    fw(m).inject(MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN, MLX5_CMD_STAT_LIM_ERR)
    n = len(fw(m).cmd_log)
    assert errno_of(get_context, p, devx_req(), ctx) == errno.ENOMEM
    assert cmds(m, n)[-10:] == ["ALLOC_TRANSPORT_DOMAIN"] + ["DEALLOC_UAR"] * 8 + \
        ["DESTROY_UCTX"]
    assert fw_objects(m) == before
    p.exit(0)


def test_response_that_cannot_be_written_is_efault_and_unwinds_everything(m):
    p = m.spawn("app")
    before = fw_objects(m)
    ctx = raw_ctx(p)
    core = uv.ib_uverbs_get_context_resp.SIZE
    n = len(fw(m).cmd_log)
    ret = write_raw(ctx, uv.IB_USER_VERBS_CMD_GET_CONTEXT, uv.ib_uverbs_get_context(), core,
                    devx_req().pack(), mlx5_ib_alloc_ucontext_resp.SIZE,
                    response_at_edge(p, core))
    assert ret == errno.EFAULT
    assert cmds(m, n)[-10:] == ["DEALLOC_TRANSPORT_DOMAIN"] + ["DEALLOC_UAR"] * 8 + \
        ["DESTROY_UCTX"]
    assert fw_objects(m) == before and ucontext(p, ctx) is None
    p.exit(0)


def test_alloc_ucontext_call_flow(m):
    p = m.spawn("app")
    with Tracer() as t:
        p.run(get_context, p, devx_req())
    assert_call_flow(t.trace, ["mlx5_ib_alloc_ucontext", "mlx5_ib_devx_create",
                               "calc_total_bfregs", "allocate_uars",
                               "mlx5_ib_alloc_transport_domain", "set_ucontext_resp"])
    p.exit(0)


def test_direct_alloc_ucontext_records_the_abi_version_only_on_success(m):
    # a failure leaves bfregi.ver untouched (the kernel sets it after the copy-out)
    from drivers.ib_core.ib_verbs import ib_udata
    from drivers.mlx5_ib.mlx5_ib import mlx5_ib_ucontext
    p = m.spawn("app")
    addr = p.mmap(0, 4096)
    p.store(addr, ucontext_req(0, 0).pack())
    uctx = mlx5_ib_ucontext(ib_dev(m))
    uctx.bfregi.ver = 7
    with p.kernel(), pytest.raises(KernelError) as e:
        mlx5_ib_alloc_ucontext(uctx, ib_udata(addr, 0, 40, 0))
    assert e.value.errno == errno.EINVAL and uctx.bfregi.ver == 7
    p.exit(0)


# -- PD ------------------------------------------------------------------------------------
def test_pd_carries_the_context_uid_and_dealloc_frees_it(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    uid = ucontext(p, ctx).devx_uid
    assert pd.pdn in fw(m).pds and fw(m).pds[pd.pdn].uid == uid != 0
    n = len(fw(m).cmd_log)
    assert v.ibv_dealloc_pd(pd) == 0
    assert cmds(m, n) == ["DEALLOC_PD"] and pd.pdn not in fw(m).pds
    p.exit(0)


def test_alloc_pd_firmware_failure_is_its_errno(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    fw(m).inject(MLX5_CMD_OP_ALLOC_PD, MLX5_CMD_STAT_LIM_ERR)
    assert errno_of(v.ibv_alloc_pd, ctx) == errno.ENOMEM
    assert fw(m).pds == {}
    p.exit(0)


def test_alloc_pd_response_fault_frees_the_pd(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    core = uv.ib_uverbs_alloc_pd_resp.SIZE
    n = len(fw(m).cmd_log)
    ret = write_raw(ctx, uv.IB_USER_VERBS_CMD_ALLOC_PD, uv.ib_uverbs_alloc_pd(), core, b"",
                    mlx5_ib_alloc_pd_resp.SIZE, response_at_edge(p, core))
    assert ret == errno.EFAULT
    assert cmds(m, n) == ["ALLOC_PD", "DEALLOC_PD"] and fw(m).pds == {}
    p.exit(0)
