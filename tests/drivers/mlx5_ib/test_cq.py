"""Tests for drivers/mlx5_ib/cq.py: the CQC of a user CQ, each errno, destroy."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import ib_cq_init_attr, ib_udata
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_ib.cq import mlx5_ib_create_cq
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_cq
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import MLX5_CMD_OP_CREATE_CQ, MLX5_CMD_STAT_LIM_ERR
from kernel_model.trace import Tracer
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD,
    MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
    MLX5_LIB_CAP_DYN_UAR,
    mlx5_ib_create_cq_resp,
)
from tests.drivers.mlx5_ib.ladder import (
    RawBytes,
    cmds,
    cq_ucmd,
    create_cq_raw,
    errno_of,
    fw,
    get_context,
    hole,
    host,
    ib_dev,
    last_error,
    open_ctx,
    response_at_edge,
    state,
    ucontext,
    ucontext_req,
    user_pages,
    write_raw,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v


def test_cq_of_16_gets_32_entries_and_its_cqc(m, app):
    p, ctx = app
    uctx = ucontext(p, ctx)
    before = p.mm.pinned_vm
    cq = v.ibv_create_cq(ctx, 16)
    assert cq.cqe == 31
    fcq = fw(m).cqs[cq.cqn]
    cqc = fcq.cqc
    eqn = m.hcas[0].pdev.dev.driver_data.priv.eq_table.comp_eqs[0].eqn
    assert (cqc["log_cq_size"], cqc["cqe_sz"], cqc["log_page_size"]) == (5, 0, 0)
    assert cqc["uar_page"] == uctx.bfregi.sys_pages[0] and cqc["c_eqn_or_apu_element"] == eqn
    assert fcq.uid == uctx.devx_uid and len(fcq.pas) == 1
    assert p.mm.pinned_vm == before + 2  # the ring and the doorbell page
    assert len(uctx.db_page_list) == 1
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        assert v.ibv_destroy_cq(cq) == 0
    assert_call_flow(t.trace, ["mlx5_ib_destroy_cq", "mlx5_core_destroy_cq",
                               "mlx5_ib_db_unmap_user", "ib_umem_release"])
    assert cmds(m, n) == ["DESTROY_CQ"] and cq.cqn not in fw(m).cqs
    assert p.mm.pinned_vm == before and uctx.db_page_list == []


def test_dbr_addr_is_the_doorbell_records_dma_address(m, app):
    p, ctx = app
    ucmd = cq_ucmd(p)
    ucmd.db_addr += 0x40  # the second record on its page
    _core, resp = create_cq_raw(ctx, ucmd)
    uctx = ucontext(p, ctx)
    [page] = uctx.db_page_list
    assert fw(m).cqs[resp.cqn].cqc["dbr_addr"] & 0xFFF == 0x40
    assert page.user_virt == ucmd.db_addr & ~0xFFF and page.refcnt == 1


def test_create_cq_call_flow(m, app):
    p, ctx = app
    with Tracer() as t:
        p.run(v.ibv_create_cq, ctx, 4)
    assert_call_flow(t.trace, ["mlx5_ib_create_cq", "create_cq_user", "ib_umem_get",
                               "mlx5_ib_db_map_user", "mlx5_ib_populate_pas",
                               "mlx5_core_create_cq"])


@pytest.mark.parametrize("pad,cqe_sz", [(False, 1), (True, 2)])
def test_128_byte_cqes_and_padding(m, app, pad, cqe_sz):
    p, ctx = app
    flags = MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD if pad else 0
    _core, resp = create_cq_raw(ctx, cq_ucmd(p, 64, cqe_size=128, flags=flags))
    assert fw(m).cqs[resp.cqn].cqc["cqe_sz"] == cqe_sz


def test_uar_page_index_names_the_cq_uar(m, app):
    p, ctx = app
    uar = ucontext(p, ctx).bfregi.sys_pages[5]
    _core, resp = create_cq_raw(ctx, cq_ucmd(p, flags=MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
                                             uar_page_index=uar))
    assert fw(m).cqs[resp.cqn].cqc["uar_page"] == uar


def _bad(p, case):
    ucmd = cq_ucmd(p)
    return {
        "short": lambda: RawBytes(ucmd.pack()[:16]),  # flags at 22
        "unknown flag": lambda: cq_ucmd(p, flags=1 << 3),
        "cqe size 32": lambda: cq_ucmd(p, cqe_size=32),
        "reserved0": lambda: cq_ucmd(p, reserved0=1),
        "reserved1": lambda: cq_ucmd(p, reserved1=1),
        "compression": lambda: cq_ucmd(p, cqe_comp_en=1),
        "buffer unmapped": lambda: _set(ucmd, buf_addr=hole(p)),
        "buffer at 0x20": lambda: _set(ucmd, buf_addr=user_pages(p, 2) + 0x20),
        "doorbell unmapped": lambda: _set(ucmd, db_addr=hole(p)),
        "foreign uar": lambda: cq_ucmd(p, flags=MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX,
                                       uar_page_index=3),
    }[case]()


def _set(ucmd, **fields):
    for k, val in fields.items():
        setattr(ucmd, k, val)
    return ucmd


@pytest.mark.parametrize("case,err,msg", [
    ("short", errno.EINVAL, "request of 16 bytes"),
    ("unknown flag", errno.EINVAL, "flags 0x8"),
    ("cqe size 32", errno.EINVAL, "cqe_size 32"),
    ("reserved0", errno.EINVAL, "reserved set"),
    ("reserved1", errno.EINVAL, "reserved set"),
    ("compression", errno.EOPNOTSUPP, "CQE compression"),
    ("buffer unmapped", errno.EFAULT, ""),
    ("buffer at 0x20", errno.EINVAL, "no page size fits the CQ buffer"),
    ("doorbell unmapped", errno.EFAULT, ""),
    ("foreign uar", errno.EINVAL, "CREATE_CQ"),
])
def test_create_cq_errors_leave_nothing_behind(m, app, case, err, msg):
    p, ctx = app
    ucmd = _bad(p, case)
    before = state(p, ctx)
    assert errno_of(create_cq_raw, ctx, ucmd) == err
    assert msg in last_error(p) and state(p, ctx) == before


def test_size_limits(m, app):
    p, ctx = app
    with m.kernel():
        max_cqes = 1 << MLX5_CAP_GEN(ib_dev(m).mdev, "log_max_cq_sz")
    before = state(p, ctx)
    ucmd = cq_ucmd(p, 1)  # never pinned: the size checks come first
    assert errno_of(create_cq_raw, ctx, ucmd, max_cqes + 1) == errno.EINVAL
    assert f"{max_cqes + 1} entries > {max_cqes}" in last_error(p)
    # max_cqes itself passes the first check, but rounds up to 2 * max_cqes
    assert errno_of(create_cq_raw, ctx, ucmd, max_cqes) == errno.EINVAL
    assert f"{2 * max_cqes} entries > {max_cqes}" in last_error(p)
    assert state(p, ctx) == before


def test_create_flags_are_eopnotsupp(m):
    """Flags past TIMESTAMP_COMPLETION | IGNORE_OVERRUN (the two mlx5 takes)."""
    cq = mlx5_ib_cq(ib_dev(m))
    with m.kernel(), pytest.raises(KernelError) as e:
        mlx5_ib_create_cq(cq, ib_cq_init_attr(cqe=1, flags=1 << 2), ib_udata())
    assert e.value.errno == errno.EOPNOTSUPP


def test_padding_without_cqe_128_always_is_eopnotsupp():
    m = host(hca=Mlx5Config(caps={"cqe_128_always": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    ucmd = cq_ucmd(p, 64, cqe_size=128, flags=MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD)
    before = state(p, ctx)
    assert errno_of(create_cq_raw, ctx, ucmd) == errno.EOPNOTSUPP
    assert "CQE padding not supported" in last_error(p) and state(p, ctx) == before
    p.exit(0)


def test_dyn_uar_context_must_name_the_cq_uar():
    m = host(dyn_uar=True)
    p = m.spawn("app")
    ctx, _ = get_context(p, ucontext_req(lib_caps=1 | MLX5_LIB_CAP_DYN_UAR))
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    assert errno_of(create_cq_raw, ctx, ucmd) == errno.EINVAL
    assert "must name its UAR" in last_error(p) and state(p, ctx) == before
    p.exit(0)


def test_firmware_failure_unwinds_doorbell_and_ring(m, app):
    p, ctx = app
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    fw(m).inject(MLX5_CMD_OP_CREATE_CQ, MLX5_CMD_STAT_LIM_ERR)
    assert errno_of(create_cq_raw, ctx, ucmd) == errno.ENOMEM
    assert state(p, ctx) == before


def test_cqn_that_cannot_be_copied_destroys_the_cq(m, app):
    p, ctx = app
    ucmd = cq_ucmd(p)
    before = state(p, ctx)
    core = uv.ib_uverbs_create_cq_resp.SIZE
    n = len(fw(m).cmd_log)
    req = uv.ib_uverbs_create_cq(cqe=31, comp_channel=-1)
    ret = write_raw(ctx, uv.IB_USER_VERBS_CMD_CREATE_CQ, req, core, ucmd.pack(),
                    mlx5_ib_create_cq_resp.SIZE, response_at_edge(p, core))
    assert ret == errno.EFAULT
    assert cmds(m, n) == ["CREATE_CQ", "DESTROY_CQ"]
    assert state(p, ctx)[1:] == before[1:] and p.mm.pinned_vm == before[0]


def test_two_cqs_share_one_doorbell_page(m, app):
    p, ctx = app
    db = user_pages(p)
    a = create_cq_raw(ctx, cq_ucmd(p, db_addr=db))[0]
    pinned = p.mm.pinned_vm
    b = create_cq_raw(ctx, cq_ucmd(p, db_addr=db + 64))[0]
    uctx = ucontext(p, ctx)
    assert len(uctx.db_page_list) == 1 and uctx.db_page_list[0].refcnt == 2
    assert p.mm.pinned_vm == pinned + 1  # only the second ring
    c.ibv_cmd_destroy_cq(ctx, a.cq_handle)
    assert uctx.db_page_list[0].refcnt == 1
    c.ibv_cmd_destroy_cq(ctx, b.cq_handle)
    assert uctx.db_page_list == []
