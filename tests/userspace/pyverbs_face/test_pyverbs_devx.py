"""pyverbs.providers.mlx5.mlx5dv on the emulated stack: a DevX context
(MLX5DV_CONTEXT_FLAGS_DEVX), Mlx5Context.devx_general_cmd on raw PRM mailboxes, and
the DC atomic depths query_mlx5_device answers (learnt with a DevX QUERY_HCA_CAP)."""

from __future__ import annotations

import errno
import struct
from collections.abc import Iterator

import pytest

import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from userspace.pyverbs.providers.mlx5.mlx5dv import Mlx5Context, Mlx5DVContextAttr
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError

QUERY_HCA_CAP, OUT_LEN = 0x100, 0x1010


def cap_in(cap_type: int, opcode: int = QUERY_HCA_CAP) -> bytes:
    """What rdma-core's tests pack: struct.pack('!HIH8s', opcode, 0, op_mod, bytes(8))."""
    return struct.pack("!HIH8s", opcode, 0, cap_type << 1 | 0x1, bytes(8))


@pytest.fixture
def ctx() -> Iterator[Mlx5Context]:
    c = Mlx5Context(Mlx5DVContextAttr(dve.MLX5DV_CONTEXT_FLAGS_DEVX), "mlx5_0")
    yield c
    c.close()


def test_a_devx_context_runs_query_hca_cap(ctx):
    out = ctx.devx_general_cmd(cap_in(0), OUT_LEN)
    assert isinstance(out, bytes) and len(out) == OUT_LEN and out[0] == 0
    assert out[0x10 + 0x25] & 0x3f == 4  # log_max_ra_req_dc


def test_the_device_memory_caps_read_as_test_mlx5_dm_ops_reads_them(ctx):
    out = Mlx5Context.devx_general_cmd(ctx, cap_in(0xF), OUT_LEN)
    view = memoryview(out)
    assert view[0] == 0
    assert int.from_bytes(view[80:84], "big") == 0  # no MEMIC atomic operations


def test_query_mlx5_device_answers_the_dc_atomic_depths(ctx):
    attr = ctx.query_mlx5_device()
    assert attr.comp_mask & dve.MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM
    assert (attr.max_dc_rd_atom, attr.max_dc_init_rd_atom) == (16, 16)


@pytest.mark.parametrize("opcode,err", [(0x400, errno.EINVAL), (0x80d, errno.EREMOTEIO)])
def test_failures_raise_with_the_errno(ctx, opcode, err):
    with pytest.raises(PyverbsRDMAError, match="DevX general command failed") as info:
        ctx.devx_general_cmd(cap_in(0, opcode), 16)
    assert info.value.error_code == err


def test_a_short_mailbox_is_einval(ctx):
    with pytest.raises(PyverbsRDMAError) as info:
        ctx.devx_general_cmd(cap_in(0)[:8], OUT_LEN)
    assert info.value.error_code == errno.EINVAL


def test_a_closed_context_refuses(ctx):
    ctx.close()
    with pytest.raises(PyverbsUserError, match="closed"):
        ctx.devx_general_cmd(cap_in(0), OUT_LEN)
