"""pyverbs.providers.mlx5.mlx5dv on the emulated stack: the mlx5 context
(mlx5dv_open_device, mlx5dv_query_device), UAR allocation (mlx5dv_devx_alloc_uar) and
the EINVAL / EOPNOTSUPP answers of what the emulated HCA or stack lacks."""

from __future__ import annotations

import errno
from collections.abc import Iterator

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from kernel_model.auxiliary import auxiliary_bus
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.trace import Tracer
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ, CqInitAttrEx
from userspace.pyverbs.pd import PD
from userspace.pyverbs.providers.mlx5.mlx5dv import (
    Mlx5Context,
    Mlx5CQ,
    Mlx5DVContext,
    Mlx5DVContextAttr,
    Mlx5DVCQInitAttr,
    Mlx5DVDCInitAttr,
    Mlx5DVQPInitAttr,
    Mlx5QP,
    Mlx5UAR,
    context_flags_to_str,
    cqe_comp_to_str,
    qpts_to_str,
)
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, QPCap, QPInitAttr, QPInitAttrEx

MLX5_BF_OFFSET = 0x800


def fw():
    return host.host().machine.hcas[0].fw


def open_fds() -> set[int]:
    return {fd for fd, f in enumerate(host.current_process().task.files.fdt) if f is not None}


@pytest.fixture
def ctx() -> Iterator[Mlx5Context]:
    c = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
    yield c
    c.close()


def raises_errno(err: int, match: str | None = None):
    """pytest.raises for a PyverbsRDMAError, checked for its errno afterwards."""
    return _ErrnoCheck(err, match)


class _ErrnoCheck:
    def __init__(self, err: int, match: str | None) -> None:
        self.err, self.cm = err, pytest.raises(PyverbsRDMAError, match=match)

    def __enter__(self):
        self.info = self.cm.__enter__()
        return self.info

    def __exit__(self, *exc):
        handled = self.cm.__exit__(*exc)
        assert self.info.value.error_code == self.err, self.info.value
        return handled


# -- the context --------------------------------------------------------------------------
def test_an_mlx5_context_is_a_context_with_its_own_user_context():
    uctxs = len(fw().uctxs)
    fds = open_fds()
    with Mlx5Context(Mlx5DVContextAttr(), name=b"mlx5_0") as c:
        assert isinstance(c, d.Context)
        assert c.ctx.cmd_fd in open_fds() and c.ctx.cmd_fd not in fds
        assert c.query_device().vendor_id == 0x02C9
        assert len(fw().uctxs) == uctxs + 1  # the default open asks for (and gets) DEVX
        with PD(c) as pd:
            assert pd.handle >= 0
    assert open_fds() == fds and len(fw().uctxs) == uctxs


def test_insisting_on_devx_opens_a_devx_context():
    fds, uctxs = open_fds(), len(fw().uctxs)
    with Mlx5Context(Mlx5DVContextAttr(dve.MLX5DV_CONTEXT_FLAGS_DEVX), "mlx5_0") as c:
        assert len(fw().uctxs) == uctxs + 1 and c.ctx.cmd_fd not in fds
    assert open_fds() == fds and len(fw().uctxs) == uctxs


def test_an_unknown_context_flag_is_einval():
    with raises_errno(errno.EINVAL, "Failed to open mlx5 context"):
        Mlx5Context(Mlx5DVContextAttr(flags=1 << 1), name="mlx5_0")


def test_a_missing_or_unknown_device_name():
    with pytest.raises(PyverbsUserError, match="Device name must be provided"):
        Mlx5Context(Mlx5DVContextAttr())
    with raises_errno(errno.ENODEV):
        Mlx5Context(Mlx5DVContextAttr(), name="mlx5_9")


def test_query_mlx5_device_answers_from_the_ucontext_response(ctx):
    attr = ctx.query_mlx5_device()
    assert isinstance(attr, Mlx5DVContext)
    assert attr.version == 0
    assert attr.flags & dve.MLX5DV_CONTEXT_FLAGS_CQE_V1  # the library asked for CQE v1
    # a kernel with UAR objects reserves no dynamic bfregs (num_dyn_bfregs 0)
    assert attr.max_dynamic_bfregs == ctx.ctx.resp.num_dyn_bfregs == 0
    # what was asked and can be answered; CLOCK_INFO_UPDATE: the clock-info page is mapped
    assert attr.comp_mask & dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS
    assert attr.comp_mask & dve.MLX5DV_CONTEXT_MASK_CQE_COMPRESION
    assert attr.comp_mask & dve.MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE
    assert attr.cqe_comp_caps == {"max_num": 0, "supported_format": 0}
    assert attr.striding_rq_caps["supported_qpts"] == 0
    assert attr.tunnel_offload_caps == 0 and attr.num_lag_ports == 0
    text = str(attr)
    assert "Max dynamic BF registers" in text and "CQE v1 (1)" in text


def test_query_mlx5_device_answers_only_the_asked_mask(ctx):
    attr = ctx.query_mlx5_device(dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS
                                 | dve.MLX5DV_CONTEXT_MASK_NUM_LAG_PORTS)
    assert attr.comp_mask == dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS  # no LAG ports to report
    assert ctx.query_mlx5_device(0).comp_mask == 0


def test_the_translations_print_as_pyverbs_does():
    assert context_flags_to_str(dve.MLX5DV_CONTEXT_FLAGS_CQE_V1) == "CQE v1 (1)"
    assert cqe_comp_to_str(dve.MLX5DV_CQE_RES_FORMAT_HASH | dve.MLX5DV_CQE_RES_FORMAT_CSUM) \
        == "with hash, with RX checksum CSUM (3)"
    assert qpts_to_str(1 << e.IBV_QPT_RC | 1 << e.IBV_QPT_UD) == "RC, UD (20)"


# -- UARs ---------------------------------------------------------------------------------
def test_a_bf_uar_is_a_register_of_a_new_firmware_uar_freed_at_context_close():
    baseline = len(fw().uars)
    c = Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0")
    with_ctx = len(fw().uars)  # the context's singleton NC UAR
    assert with_ctx == baseline + 1
    u0 = Mlx5UAR(c, dve._MLX5DV_UAR_ALLOC_TYPE_BF)
    assert len(fw().uars) == with_ctx + 1
    assert fw().uar_of(u0.page_id) is not None
    assert u0.reg_addr == u0.base_addr + MLX5_BF_OFFSET and u0.comp_mask == 0
    assert u0.mmap_off != 0 and u0.uar != 0
    u1 = Mlx5UAR(c, 0)  # the page's other register: no new firmware UAR
    assert len(fw().uars) == with_ctx + 1
    assert u1.base_addr == u0.base_addr and u1.page_id == u0.page_id
    assert u1.reg_addr == u0.reg_addr + c.ctx.bf_reg_size
    first = u0.reg_addr
    u0.close()  # the register goes back to the context's list, the UAR stays
    u0.close()
    assert len(fw().uars) == with_ctx + 1
    u2 = Mlx5UAR(c, 0)
    assert u2.reg_addr == first
    c.close()  # closes u1 and u2 first, then frees every dynamic UAR
    assert len(fw().uars) == baseline
    with pytest.raises(PyverbsUserError, match="closed"):
        _ = u1.page_id


def test_an_nc_uar_is_the_contexts_singleton(ctx):
    n = len(fw().uars)
    nc = ctx.ctx.nc_uar
    u = Mlx5UAR(ctx, dve._MLX5DV_UAR_ALLOC_TYPE_NC)
    assert (u.page_id, u.base_addr, u.reg_addr) == (nc.page_id, nc.uar, nc.uar + MLX5_BF_OFFSET)
    assert len(fw().uars) == n
    u.close()  # freeing the singleton does nothing
    again = Mlx5UAR(ctx, dve._MLX5DV_UAR_ALLOC_TYPE_NC)
    assert again.page_id == nc.page_id and ctx.ctx.nc_uar is nc
    assert len(fw().uars) == n
    again.close()


def test_an_unknown_uar_flag_is_eopnotsupp(ctx):
    n = len(fw().uars)
    with raises_errno(errno.EOPNOTSUPP, "Failed to allocate UAR"):
        Mlx5UAR(ctx, 2)
    assert len(fw().uars) == n


def test_a_kernel_without_uar_objects_has_no_uar_to_hand_out():
    host.shutdown()
    host.configure(params={})  # mlx5_ib without dyn_uar: a pre-v5.8 kernel
    try:
        with Mlx5Context(Mlx5DVContextAttr(), name="mlx5_0") as c:
            # the static-bfreg kernel reserves dynamic bfregs: the dv query reports them
            assert c.query_mlx5_device().max_dynamic_bfregs == c.ctx.resp.num_dyn_bfregs > 0
            assert c.query_mlx5_device(0).max_dynamic_bfregs == 0  # not asked, not filled
            n = len(fw().uars)
            for flags in (dve._MLX5DV_UAR_ALLOC_TYPE_BF, dve._MLX5DV_UAR_ALLOC_TYPE_NC):
                with raises_errno(errno.EOPNOTSUPP, "Failed to allocate UAR"):
                    Mlx5UAR(c, flags)
            assert len(fw().uars) == n
    finally:
        host._config.pop("params", None)


def test_a_bf_uar_without_write_combining_is_eopnotsupp(ctx):
    ibdev = auxiliary_bus(host.host().machine).devices[0].drvdata  # mlx5_ib's device
    saved, ibdev.wc_support = ibdev.wc_support, False
    try:
        with raises_errno(errno.EOPNOTSUPP, "Failed to allocate UAR"):
            Mlx5UAR(ctx, dve._MLX5DV_UAR_ALLOC_TYPE_BF)
    finally:
        ibdev.wc_support = saved


# -- mlx5dv_query_port ---------------------------------------------------------------------
def test_query_mlx5_port_asks_the_kernel_and_a_legacy_eswitch_answers_zeros(ctx):
    with Tracer() as t:
        port = Mlx5Context.query_mlx5_port(ctx, 1)
    assert_call_flow(t.trace, ["mlx5dv_query_port", "UVERBS_HANDLER_MLX5_IB_METHOD_QUERY_PORT"])
    assert (port.flags, port.vport, port.vport_steering_icm_rx, port.reg_c0_mask) == \
        (0, 0, 0, 0)
    assert str(port).startswith("flags")


@pytest.mark.parametrize("port", [0, 2])
def test_query_mlx5_port_of_a_port_the_device_lacks_is_einval(ctx, port):
    with raises_errno(errno.EINVAL, f"Failed to query dv port mlx5 mlx5_0 port {port}."):
        Mlx5Context.query_mlx5_port(ctx, port)


# -- what the emulated HCA lacks ---------------------------------------------------------
def test_the_static_calls_exist_and_answer_eopnotsupp(ctx):
    with raises_errno(errno.EOPNOTSUPP, "Failed to alloc reserved QP number."):
        Mlx5Context.reserved_qpn_alloc(ctx)
    with raises_errno(errno.EOPNOTSUPP, "Failed to dealloc QP number 5."):
        Mlx5Context.reserved_qpn_dealloc(ctx, 5)
    with raises_errno(errno.EOPNOTSUPP, "Failed to query the crypto login session state."):
        Mlx5Context.query_login_state(ctx)
    with raises_errno(errno.EOPNOTSUPP, "Failed to query EQN"):
        ctx.devx_query_eqn(0)


def test_lag_port_and_udp_sport_of_a_qp_are_eopnotsupp(ctx):
    with PD(ctx) as pd, CQ(ctx, 16) as cq:
        qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap()))
        with raises_errno(errno.EOPNOTSUPP, f"Failed to query QP #{qp.qp_num}"):
            Mlx5QP.query_lag_port(qp)
        with raises_errno(errno.EOPNOTSUPP, f"Failed to modify lag of QP #{qp.qp_num}"):
            Mlx5QP.modify_lag_port(qp, 1)
        with raises_errno(errno.EOPNOTSUPP, "Failed to modify UDP source port of QP"):
            Mlx5QP.modify_udp_sport(qp, 0xC000)
        qp.close()


def test_mlx5_qp_checks_its_dv_attributes(ctx):
    with PD(ctx) as pd, CQ(ctx, 16) as cq:
        attr = QPInitAttrEx(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, pd=pd,
                            comp_mask=e.IBV_QP_INIT_ATTR_PD)
        with raises_errno(errno.EINVAL, "Failed to create MLX5 QP."):
            Mlx5QP(ctx, attr, Mlx5DVQPInitAttr(comp_mask=1 << 7))
        dc = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_DC,
                              dc_init_attr=Mlx5DVDCInitAttr(dve.MLX5DV_DCTYPE_DCI))
        with raises_errno(errno.EINVAL, "Failed to create MLX5 QP."):   # DC on an RC QP
            Mlx5QP(ctx, attr, dc)
        flags = Mlx5DVQPInitAttr(comp_mask=dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS,
                                 create_flags=dve.MLX5DV_QP_CREATE_SIG_PIPELINING)
        with raises_errno(errno.EOPNOTSUPP):
            Mlx5QP(ctx, attr, flags)
        flags.create_flags = dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE   # taken
        Mlx5QP(ctx, attr, flags).close()


@pytest.mark.parametrize(("dv_attr", "err"), [
    (Mlx5DVCQInitAttr(comp_mask=1 << 5), errno.EINVAL),
    (Mlx5DVCQInitAttr(comp_mask=dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE, cqe_size=100),
     errno.EINVAL),
    (Mlx5DVCQInitAttr(comp_mask=dve.MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE,
                      cqe_comp_res_format=dve.MLX5DV_CQE_RES_FORMAT_HASH), errno.EINVAL),
    (Mlx5DVCQInitAttr(comp_mask=dve.MLX5DV_CQ_INIT_ATTR_MASK_FLAGS
                      | dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE,
                      flags=dve.MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD, cqe_size=64), errno.EINVAL),
    (Mlx5DVCQInitAttr(comp_mask=dve.MLX5DV_CQ_INIT_ATTR_MASK_FLAGS, flags=1 << 1),
     errno.EINVAL),
    (Mlx5DVCQInitAttr(comp_mask=dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE, cqe_size=128),
     errno.EOPNOTSUPP),
])
def test_mlx5_cq_checks_its_dv_attributes(ctx, dv_attr, err):
    n = len(fw().cqs)
    with raises_errno(err, "Failed to create MLX5 CQ."):
        Mlx5CQ(ctx, CqInitAttrEx(), dv_attr)
    assert len(fw().cqs) == n
