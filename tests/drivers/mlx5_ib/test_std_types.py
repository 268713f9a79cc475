"""drivers/mlx5_ib/std_types.py: MLX5_IB_METHOD_QUERY_PORT through the uverbs ioctl."""

from __future__ import annotations

import errno

import pytest

from kernel_model.uapi.ib_user_ioctl_cmds import UVERBS_OBJECT_DEVICE
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_QUERY_PORT,
    MLX5_IB_ATTR_QUERY_PORT_PORT_NUM,
    MLX5_IB_METHOD_QUERY_PORT,
    mlx5_ib_uapi_query_port,
)
from tests.drivers.mlx5_ib.ladder import errno_of, host, last_error, open_ctx
from userspace.libc import free, posix_memalign
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import execute_ioctl


def query_port(ctx, port: int, size: int) -> None:
    execute_ioctl(ctx, UVERBS_OBJECT_DEVICE, MLX5_IB_METHOD_QUERY_PORT,
                  [(MLX5_IB_ATTR_QUERY_PORT_PORT_NUM, port, "in"),
                   (MLX5_IB_ATTR_QUERY_PORT, (BUF[0], size), "ptr_out")])


BUF = [0]  # the answer buffer of the current test's process


@pytest.fixture
def ctx():
    m = host()
    p = m.spawn("app")
    c = open_ctx(p)
    BUF[0] = posix_memalign(p, 8, 64)
    yield c
    free(p, BUF[0], 64)
    v.ibv_close_device(c)
    p.exit(0)
    m.check_leaks()


def test_a_legacy_eswitch_port_answers_zeros_and_clears_a_longer_buffer(ctx):
    ctx.proc.store(BUF[0], b"\xff" * 64)
    query_port(ctx, 1, 64)
    assert ctx.proc.load(BUF[0], 64) == bytes(64)
    assert mlx5_ib_uapi_query_port.unpack(ctx.proc.load(BUF[0], 40)).flags == 0


@pytest.mark.parametrize("port", [0, 2])
def test_a_port_the_device_lacks_is_einval(ctx, port):
    assert errno_of(query_port, ctx, port, 40) == errno.EINVAL
    assert "has no port" in last_error(ctx.proc)


def test_an_answer_buffer_shorter_than_the_struct_is_einval(ctx):
    ctx.proc.store(BUF[0], b"\xff" * 64)
    assert errno_of(query_port, ctx, 1, 32) == errno.EINVAL
    assert ctx.proc.load(BUF[0], 32) == b"\xff" * 32  # nothing written
