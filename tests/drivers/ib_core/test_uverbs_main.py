"""drivers/ib_core/uverbs_main.py: the write() command word (uapi_get_method).

Bits outside IB_USER_VERBS_CMD_COMMAND_MASK | IB_USER_VERBS_CMD_FLAG_EXTENDED are
EINVAL before anything else; a command number the table lacks is EOPNOTSUPP.
"""

from __future__ import annotations

import errno

import pytest

from kernel_model.uapi import ib_user_verbs as uv
from tests.drivers.mlx5_ib.ladder import errno_of, host, open_ctx
from userspace.libibverbs import cmd as c


@pytest.fixture
def ctx():
    m = host()
    p = m.spawn("app")
    yield open_ctx(p)
    p.exit(0)


@pytest.mark.parametrize("command, err", [
    (uv.IB_USER_VERBS_CMD_ALLOC_PD | 1 << 8, errno.EINVAL),        # past the mask
    (uv.IB_USER_VERBS_CMD_ALLOC_PD | 1 << 30, errno.EINVAL),
    (0x7FFFFF00, errno.EINVAL),
    (uv.IB_USER_VERBS_CMD_FLAG_EXTENDED | 0x100, errno.EINVAL),
    (uv.IB_USER_VERBS_CMD_FLAG_EXTENDED | uv.IB_USER_VERBS_CMD_ALLOC_PD, errno.EOPNOTSUPP),
    (0xFF, errno.EOPNOTSUPP),                                      # no such command
    (uv.IB_USER_VERBS_CMD_ALLOC_PD, 0),
])
def test_command_word(ctx, command, err):
    assert errno_of(c.execute_write, ctx, command, uv.ib_uverbs_alloc_pd(),
                    uv.ib_uverbs_alloc_pd_resp) == err
