"""drivers/mlx5_ib/devx.py: DevX general commands (MLX5_IB_METHOD_DEVX_OTHER) through the
uverbs ioctl, and what libmlx5 learns with one at open (get_hca_general_caps)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_CREATE_UCTX,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_OUTP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
)
from tests.drivers.mlx5_ib.ladder import (
    devx_req,
    fw,
    get_context,
    host,
    last_error,
    open_ctx,
    raw_ctx,
    ucontext,
    ucontext_req,
)
from userspace.libc import free, posix_memalign
from userspace.libibverbs import verbs as v
from userspace.providers.mlx5 import dv
from userspace.providers.mlx5.devx import _mlx5dv_devx_general_cmd

OUT = 0x1010  # MLX5_ST_SZ_BYTES(query_hca_cap_out)


def hca_cap_in(cap_type: int = 0, uid: int = 0, opcode: int = 0x100) -> bytes:
    """query_hca_cap_in: opcode, uid, op_mod = type << 1 | GET_CUR."""
    return (opcode.to_bytes(2, "big") + uid.to_bytes(2, "big") + bytes(2)
            + (cap_type << 1 | 1).to_bytes(2, "big") + bytes(8))


def general_cmd(ctx, in_: bytes, outlen: int, fn=_mlx5dv_devx_general_cmd) -> tuple[int, bytes]:
    """(errno, the output mailbox) of one general command; the output buffer starts 0xee."""
    p = ctx.proc
    size = len(in_) + outlen + 16
    buf = posix_memalign(p, 8, size)
    try:
        p.store(buf, in_ + b"\xee" * (outlen + 16))
        rc = fn(ctx, buf, len(in_), buf + len(in_), outlen)
        return rc, p.load(buf + len(in_), outlen + 16)
    finally:
        free(p, buf, size)


@pytest.fixture
def machine():
    m = host()
    yield m
    m.check_leaks()


@pytest.fixture
def ctx(machine):
    p = machine.spawn("app")
    c = open_ctx(p)
    yield c
    v.ibv_close_device(c)
    p.exit(0)


def test_query_hca_cap_answers_the_general_page_in_prm_bytes(ctx):
    rc, out = general_cmd(ctx, hca_cap_in(), OUT)
    assert rc == 0
    assert out[:8] == bytes(8)                         # status OK, syndrome 0
    cap = out[0x10:0x110]
    assert cap[0x25] & 0x3f == 4 and cap[0x27] & 0x3f == 4  # log_max_ra_req/res_dc
    assert cap[0x13] & 0x1f == 18                      # log_max_qp (bits 0x9b..0x9f)
    assert out[OUT:] == b"\xee" * 16                   # nothing written past outlen


def test_the_kernel_writes_the_contexts_uid_over_the_callers(ctx):
    assert ucontext(ctx.proc, ctx).devx_uid
    rc, out = general_cmd(ctx, hca_cap_in(uid=0x7777), OUT)  # a uid the firmware lacks
    assert rc == 0 and out[0] == 0


def test_the_device_memory_page(ctx):
    rc, out = general_cmd(ctx, hca_cap_in(cap_type=0xF), OUT)
    assert rc == 0 and out[0x10] >> 7 == 1  # memic
    assert int.from_bytes(out[0x20:0x24], "big") == 256 << 10  # memic_bar_size (bit 0x80)


def test_a_capability_type_the_device_lacks_is_the_firmwares_bad_param(ctx):
    rc, out = general_cmd(ctx, hca_cap_in(cap_type=0xc), OUT)  # QoS
    assert rc == errno.EREMOTEIO
    assert out[0] == MLX5_CMD_STAT_BAD_PARAM_ERR and out[4:8] != bytes(4)  # a syndrome
    assert out[8:OUT] == bytes(OUT - 8)


def test_a_short_output_mailbox_is_the_firmwares_bad_output_length(ctx):
    rc, out = general_cmd(ctx, hca_cap_in(), 0x100)
    assert rc == errno.EREMOTEIO and out[0] == MLX5_CMD_STAT_BAD_OUTP_LEN_ERR
    assert out[0x100:] == b"\xee" * 16


@pytest.mark.parametrize("opcode", [0x80d, 0xb00])  # NOP, the general range
def test_a_general_command_the_firmware_lacks_is_bad_op(ctx, opcode):
    rc, out = general_cmd(ctx, hca_cap_in(opcode=opcode), 16)
    assert rc == errno.EREMOTEIO and out[0] == MLX5_CMD_STAT_BAD_OP_ERR


@pytest.mark.parametrize("opcode", [0x400, 0x500, 0xa04, 0x0])  # CREATE_CQ/QP/UCTX
def test_a_command_that_is_not_general_is_einval(ctx, opcode):
    n = len(fw(ctx.proc.machine).cmd_log)
    rc, out = general_cmd(ctx, hca_cap_in(opcode=opcode), 16)
    assert rc == errno.EINVAL and "not a general command" in last_error(ctx.proc)
    assert out == b"\xee" * 32 and len(fw(ctx.proc.machine).cmd_log) == n


@pytest.mark.parametrize("inlen,outlen", [(8, OUT), (15, OUT), (16, 8), (16, 15)])
def test_mailboxes_shorter_than_their_header_are_einval(ctx, inlen, outlen):
    rc, out = general_cmd(ctx, hca_cap_in()[:inlen], outlen)
    assert rc == errno.EINVAL and "uverbs_process_attr" in last_error(ctx.proc)
    assert out == b"\xee" * (outlen + 16)


def test_an_empty_input_is_no_general_command(ctx):
    assert general_cmd(ctx, b"", 16)[0] == errno.EINVAL


@pytest.mark.parametrize("cap_type", [1, 4])  # Ethernet offloads, RoCE
def test_pages_without_prm_offsets_are_eopnotsupp(ctx, cap_type):
    rc, _ = general_cmd(ctx, hca_cap_in(cap_type=cap_type), OUT)
    assert rc == errno.EOPNOTSUPP and "not converted" in last_error(ctx.proc)


def test_a_known_command_without_prm_offsets_is_eopnotsupp(ctx):
    rc, _ = general_cmd(ctx, hca_cap_in(opcode=0x101), 16)  # QUERY_ADAPTER
    assert rc == errno.EOPNOTSUPP


def test_a_non_mlx5_context_is_eopnotsupp(ctx):
    plain = v.ibv_context(ctx.device, ctx.proc, ctx.cmd_fd, ctx.ops, ctx.cmd_buf)
    assert general_cmd(plain, hca_cap_in(), OUT, fn=dv.mlx5dv_devx_general_cmd)[0] == \
        errno.EOPNOTSUPP


# -- a context without a DEVX uid --------------------------------------------------------
def test_without_a_devx_uid_whitelisted_queries_are_eopnotsupp_others_einval(machine):
    p = machine.spawn("app")
    c, _ = get_context(p, ucontext_req())
    assert ucontext(p, c).devx_uid == 0
    assert general_cmd(c, hca_cap_in(), OUT)[0] == errno.EOPNOTSUPP
    assert "no whitelist uid" in last_error(p)
    assert general_cmd(c, hca_cap_in(opcode=0x80d), 16)[0] == errno.EINVAL
    assert "no DEVX uid" in last_error(p)
    p.exit(0)


def test_with_a_devx_uid_from_a_raw_get_context(machine):
    p = machine.spawn("app")
    c, _ = get_context(p, devx_req())
    assert general_cmd(c, hca_cap_in(), OUT)[0] == 0
    p.exit(0)


def test_before_get_context_is_einval(machine):
    p = machine.spawn("app")
    c = raw_ctx(p)
    assert general_cmd(c, hca_cap_in(), OUT)[0] == errno.EINVAL
    assert "GET_CONTEXT first" in last_error(p)
    p.exit(0)


# -- what libmlx5 learns at open ---------------------------------------------------------
def query_dc_atoms(c) -> tuple[int, int, int]:
    attrs_out = dv.mlx5dv_context(comp_mask=dv.MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM)
    assert dv.mlx5dv_query_device(c, attrs_out) == 0
    return attrs_out.comp_mask, attrs_out.max_dc_rd_atom, attrs_out.max_dc_init_rd_atom


def test_the_context_learns_the_dc_atomic_depths(ctx):
    assert query_dc_atoms(ctx) == (dv.MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM, 16, 16)
    assert ("QUERY_HCA_CAP", 1, 0, 0) in fw(ctx.proc.machine).cmd_log


def test_the_depths_follow_the_device_caps():
    m = host(Mlx5Config(caps={"log_max_ra_req_dc": 2, "log_max_ra_res_dc": 5}))
    p = m.spawn("app")
    c = open_ctx(p)
    assert query_dc_atoms(c)[1:] == (4, 32)
    v.ibv_close_device(c)
    p.exit(0)
    m.check_leaks()


def test_a_context_the_kernel_refused_devx_keeps_zero(machine):
    """CREATE_UCTX fails: the default open falls back without DEVX and learns nothing;
    an open that insists on DEVX fails."""
    p = machine.spawn("app")
    fw(machine).inject(MLX5_CMD_OP_CREATE_UCTX, MLX5_CMD_STAT_BAD_PARAM_ERR)
    c = open_ctx(p)
    assert ucontext(p, c).devx_uid == 0
    assert query_dc_atoms(c)[1:] == (0, 0)
    v.ibv_close_device(c)
    fw(machine).inject(MLX5_CMD_OP_CREATE_UCTX, MLX5_CMD_STAT_BAD_PARAM_ERR)
    with pytest.raises(OSError) as info:
        dv.mlx5dv_open_device(p, v.ibv_get_device_list(p)[0],
                              dv.mlx5dv_context_attr(dv.MLX5DV_CONTEXT_FLAGS_DEVX))
    assert info.value.errno == errno.EINVAL
    p.exit(0)
