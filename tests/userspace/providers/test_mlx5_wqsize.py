"""Tests for userspace/providers/mlx5/wqsize.py: rdma-core's QP sizing (mlx5_calc_*)."""

from __future__ import annotations

import errno

import attrs
import pytest

from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import (
    MLX5_QP_FLAGS_USE_UNDERLAY,
    MLX5DV_DCTYPE_DCI,
    MLX5DV_DCTYPE_DCT,
    MLX5DV_QP_EX_WITH_MKEY_CONFIGURE,
    MLX5DV_QP_EX_WITH_MR_LIST,
    MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
)
from userspace.providers.mlx5.wqsize import (
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD,
    IBV_QP_EX_WITH_RDMA_WRITE,
    IBV_QP_EX_WITH_SEND,
    IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
    IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
    IBV_QPT_DRIVER,
    IBV_QPT_RAW_PACKET,
    IBV_QPT_RC,
    IBV_QPT_UC,
    IBV_QPT_UD,
    IBV_QPT_XRC_RECV,
    IBV_QPT_XRC_SEND,
    align,
    create_qp_buf_sizes,
    ilog32,
    mlx5_calc_rcv_wqe,
    mlx5_calc_send_wqe,
    mlx5_calc_wq_size,
    mlx5_wq,
    roundup_pow_of_two,
    sq_overhead,
)

P4K = 4096


@attrs.define
class Limits:
    max_sq_desc_sz: int = 1024
    max_rq_desc_sz: int = 512
    max_send_wqebb: int = 32768
    max_recv_wr: int = 32768


@attrs.define
class Cap:
    max_send_wr: int = 0
    max_recv_wr: int = 0
    max_send_sge: int = 0
    max_recv_sge: int = 0
    max_inline_data: int = 0


@attrs.define
class Attr:
    qp_type: int
    cap: Cap
    srq: object = None
    comp_mask: int = 0
    send_ops_flags: int = 0
    max_tso_header: int = 0


@attrs.define
class Qp:
    sq: mlx5_wq = attrs.Factory(mlx5_wq)
    rq: mlx5_wq = attrs.Factory(mlx5_wq)
    wq_sig: bool = False
    flags: int = 0
    dc_type: int = 0
    max_inline_data: int = 0
    max_tso_header: int = 0


@attrs.define
class DvAttr:
    comp_mask: int = 0
    send_ops_flags: int = 0


def attr(qp_type: int, send_wr: int, recv_wr: int, send_sge: int, recv_sge: int,
         inline: int, srq: bool = False, **kw) -> Attr:
    return Attr(qp_type, Cap(send_wr, recv_wr, send_sge, recv_sge, inline),
                srq=object() if srq else None, **kw)


def sized(a: Attr, qp: Qp | None = None, ctx: Limits | None = None) -> tuple[int, Qp]:
    qp = qp or Qp()
    return mlx5_calc_wq_size(ctx or Limits(), a, qp), qp


def einval(fn, *args, func: str) -> None:
    with pytest.raises(ProviderError) as e:
        fn(*args)
    assert e.value.errno == errno.EINVAL
    assert e.value.function == func


# -- kernel_facts §13 "rdma-core sizes" ---------------------------------------------------

# (attr, SQ (wqe, cnt, max_post, inline), RQ (wqe, cnt, shift, max_post, max_gs), total)
TABLE = [
    (attr(IBV_QPT_RC, 64, 64, 1, 1, 0), (256, 256, 64, 60), (16, 64, 4, 64, 1), 17408),
    (attr(IBV_QPT_RC, 1, 1, 1, 1, 0), (256, 4, 1, 60), (16, 4, 4, 4, 1), 320),
    (attr(IBV_QPT_UD, 100, 100, 2, 3, 64), (192, 512, 170, 124), (64, 128, 6, 128, 4), 40960),
    (attr(IBV_QPT_RAW_PACKET, 512, 512, 1, 1, 0), (64, 512, 512, 12), (16, 512, 4, 512, 1),
     8192 + 32768),
    (attr(IBV_QPT_RC, 128, 0, 4, 0, 220, srq=True), (448, 1024, 146, 252), None, 65536),
    (attr(IBV_QPT_XRC_SEND, 10, 0, 2, 0, 0), (256, 64, 16, 44), None, 4096),
]


@pytest.mark.parametrize("a,sq,rq,total", TABLE,
                         ids=["rc-64", "rc-1", "ud", "raw", "rc-srq", "xrc-send"])
def test_sizes_table(a: Attr, sq: tuple, rq: tuple | None, total: int) -> None:
    wqe = mlx5_calc_send_wqe(Limits(), a, Qp())
    got, qp = sized(a)
    assert got == total
    assert (wqe, qp.sq.wqe_cnt, qp.sq.max_post, qp.max_inline_data) == sq
    assert a.cap.max_inline_data == sq[3]                  # written back to the caller
    assert qp.sq.wqe_shift == 6 and qp.sq.max_gs == a.cap.max_send_sge
    if rq is None:
        assert (qp.rq.wqe_cnt, qp.rq.max_post, qp.rq.max_gs) == (0, 0, 0)
    else:
        rwqe, cnt, shift, max_post, max_gs = rq
        assert mlx5_calc_rcv_wqe(Limits(), a, qp) == rwqe
        assert (qp.rq.wqe_cnt, qp.rq.wqe_shift, qp.rq.max_post, qp.rq.max_gs) == \
            (cnt, shift, max_post, max_gs)
    assert qp.rq.offset == 0 and qp.sq.offset == (rq[0] * rq[1] if rq else 0)


def test_rc_64_buffer_puts_the_rq_first_and_rounds_to_pages() -> None:
    a = attr(IBV_QPT_RC, 64, 64, 1, 1, 0)
    total, qp = sized(a)
    assert qp.sq.offset == 1024
    buf_size, sq_buf_size = create_qp_buf_sizes(qp, a.qp_type, total)
    assert (buf_size, sq_buf_size) == (17408, 0)
    assert align(buf_size, P4K) == 20480
    assert qp.sq.offset == 1024


def test_raw_packet_sq_gets_its_own_buffer() -> None:
    a = attr(IBV_QPT_RAW_PACKET, 512, 512, 1, 1, 0)
    total, qp = sized(a)
    assert create_qp_buf_sizes(qp, a.qp_type, total) == (8192, 32768)
    assert qp.sq.offset == 0


def test_underlay_ud_sq_gets_its_own_buffer() -> None:
    a = attr(IBV_QPT_UD, 16, 16, 1, 1, 0)
    total, qp = sized(a, Qp(flags=MLX5_QP_FLAGS_USE_UNDERLAY))
    buf, sq_buf = create_qp_buf_sizes(qp, a.qp_type, total)
    assert buf == 256 and sq_buf == total - 256 and qp.sq.offset == 0


def test_too_many_send_sges_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 64, 64, 60, 1, 0), func="mlx5_calc_send_wqe")
    sized(attr(IBV_QPT_RC, 64, 64, 52, 1, 0))           # max_gather = (1024 - 192) / 16


def test_too_many_send_wqebbs_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 16384, 1, 1, 1, 0), func="mlx5_calc_sq_size")
    total, qp = sized(attr(IBV_QPT_RC, 8192, 0, 1, 0, 0))
    assert qp.sq.wqe_cnt == 32768


# -- the other errno paths -----------------------------------------------------------------

def test_send_wr_overflow_guard_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 0x7FFFFFFF // 1024 + 1, 0, 1, 0, 0),
           func="mlx5_calc_sq_size")


def test_too_much_inline_data_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 1, 0, 1, 0, 1021), func="mlx5_calc_send_wqe")
    _, qp = sized(attr(IBV_QPT_RC, 1, 0, 1, 0, 828))    # 192 + align(832, 16) = 1024
    assert qp.max_inline_data == 828


def test_wqe_rounded_past_the_descriptor_limit_is_einval() -> None:
    # 192 + 50*16 = 992 fits 1000, but rounds up to 1024 basic-block bytes
    einval(sized, attr(IBV_QPT_RC, 1, 0, 50, 0, 0), None, Limits(max_sq_desc_sz=1000),
           func="mlx5_calc_sq_size")


def test_too_many_recv_wrs_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 1, 64, 1, 1, 0), None, Limits(max_recv_wr=32),
           func="mlx5_calc_rq_size")


def test_too_many_recv_sges_is_einval() -> None:
    einval(sized, attr(IBV_QPT_RC, 1, 1, 1, 33, 0), func="mlx5_calc_rcv_wqe")
    _, qp = sized(attr(IBV_QPT_RC, 1, 1, 1, 32, 0))
    assert qp.rq.max_gs == 32 and qp.rq.wqe_shift == 9


def test_signature_costs_a_scatter_entry() -> None:
    _, qp = sized(attr(IBV_QPT_RC, 1, 4, 1, 1, 0), Qp(wq_sig=True))
    assert (qp.rq.wqe_shift, qp.rq.max_gs) == (5, 1)          # 16 + 16 -> 32 bytes
    einval(sized, attr(IBV_QPT_RC, 1, 1, 1, 32, 0), Qp(wq_sig=True),
           func="mlx5_calc_rcv_wqe")


def test_driver_qp_must_be_a_dci() -> None:
    a = attr(IBV_QPT_DRIVER, 1, 0, 1, 0, 0)
    einval(sized, a, Qp(dc_type=MLX5DV_DCTYPE_DCT), func="_sq_overhead")
    assert sq_overhead(Qp(dc_type=MLX5DV_DCTYPE_DCI), a) == 192 + 48


def test_unknown_qp_type_is_einval() -> None:
    einval(sized, attr(5, 1, 0, 1, 0, 0), func="sq_overhead")
    a = attr(5, 1, 0, 1, 0, 0, comp_mask=IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
             send_ops_flags=IBV_QP_EX_WITH_SEND)
    einval(sized, a, func="_sq_overhead")


# -- the pieces --------------------------------------------------------------------------

@pytest.mark.parametrize("qp_type,overhead", [
    (IBV_QPT_RC, 192), (IBV_QPT_UC, 192), (IBV_QPT_UD, 64), (IBV_QPT_RAW_PACKET, 48),
    (IBV_QPT_XRC_SEND, 208), (IBV_QPT_XRC_RECV, 208)])
def test_default_overheads(qp_type: int, overhead: int) -> None:
    assert sq_overhead(Qp(), attr(qp_type, 1, 0, 1, 0, 0)) == overhead


def test_underlay_ud_adds_the_eth_segment_and_pad() -> None:
    assert sq_overhead(Qp(flags=MLX5_QP_FLAGS_USE_UNDERLAY), attr(IBV_QPT_UD, 1, 0, 1, 0, 0)) \
        == 64 + 32 + 16


@pytest.mark.parametrize("ops,overhead", [
    (IBV_QP_EX_WITH_SEND, 16), (IBV_QP_EX_WITH_RDMA_WRITE, 32),
    (IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND, 48)])
def test_named_send_ops_set_the_overhead(ops: int, overhead: int) -> None:
    a = attr(IBV_QPT_RC, 1, 0, 1, 0, 0, comp_mask=IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
             send_ops_flags=ops)
    assert sq_overhead(Qp(), a) == overhead


def test_mlx5_mr_ops_need_the_umr_overhead() -> None:
    a = attr(IBV_QPT_RC, 1, 0, 1, 0, 0, comp_mask=IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
             send_ops_flags=IBV_QP_EX_WITH_SEND)
    dv = DvAttr(MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS, MLX5DV_QP_EX_WITH_MR_LIST)
    assert sq_overhead(Qp(), a, dv) == 192
    assert sq_overhead(Qp(), a, DvAttr(0, MLX5DV_QP_EX_WITH_MR_LIST)) == 16   # mask unset


def test_mkey_configure_needs_the_umr_overhead() -> None:
    """A UD QP with MLX5DV_QP_EX_WITH_MKEY_CONFIGURE: 192 + the datagram's 48, so 60
    bytes of inline make a 320-byte WQE with 76 bytes of inline room (not 128 and 60)."""
    a = attr(IBV_QPT_UD, 4, 0, 1, 0, 60)
    dv = DvAttr(MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS, MLX5DV_QP_EX_WITH_MKEY_CONFIGURE)
    assert sq_overhead(Qp(), a, dv) == 240
    qp = Qp()
    mlx5_calc_wq_size(Limits(), a, qp, dv)
    assert (qp.max_inline_data, qp.sq.wqe_cnt) == (76, 32)


def test_small_wqe_from_send_only_ops() -> None:
    a = attr(IBV_QPT_RC, 16, 0, 1, 0, 0, comp_mask=IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
             send_ops_flags=IBV_QP_EX_WITH_SEND)
    total, qp = sized(a)
    assert total == 1024 and qp.sq.max_post == 16 and qp.max_inline_data == 64 - 16 - 4


def test_tso_header_grows_the_wqe() -> None:
    a = attr(IBV_QPT_RAW_PACKET, 1, 0, 1, 0, 0, comp_mask=IBV_QP_INIT_ATTR_MAX_TSO_HEADER,
             max_tso_header=18)
    total, qp = sized(a)
    assert mlx5_calc_send_wqe(Limits(), a, Qp()) == 128        # 48 + 32 + 16 -> 128
    assert qp.max_tso_header == 18 and qp.max_inline_data == 128 - 48 - 4


def test_srq_qp_has_no_rq_even_with_recv_wrs() -> None:
    total, qp = sized(attr(IBV_QPT_RC, 1, 16, 1, 1, 0, srq=True))
    assert total == 256 and qp.rq == mlx5_wq() and qp.sq.offset == 0


def test_no_send_wrs_means_no_sq() -> None:
    total, qp = sized(attr(IBV_QPT_RC, 0, 8, 0, 2, 0))
    assert total == 8 * 32 and qp.sq == mlx5_wq(offset=256)         # 2 SGEs: 32-byte WQEs


def test_helpers() -> None:
    assert [roundup_pow_of_two(n) for n in (0, 1, 2, 3, 17, 64)] == [1, 1, 2, 4, 32, 64]
    assert [ilog32(n) for n in (0, 1, 3, 15, 63, 64)] == [0, 1, 2, 4, 6, 7]
    assert align(17408, P4K) == 20480 and align(4096, P4K) == 4096
    assert repr(mlx5_wq(4, 6, 1, 1, 64)) == "wq cnt=4 stride=64 max_post=1 max_gs=1 offset=0x40"
