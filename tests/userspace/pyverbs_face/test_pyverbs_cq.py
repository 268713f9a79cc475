"""userspace/pyverbs CQ: sizes given as floats (as rdma-core's suite passes
max_cqe / 2), the bad flows' errnos, and a library store that faults becoming an
error rather than a crash."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


def fw_cqs() -> int:
    return len(host.host().machine.hcas[0].fw.cqs)


def test_a_float_size_and_vector_are_truncated_as_pyverbs_c_ints_are():
    with d.Context(name="mlx5_0") as ctx:
        cq = CQ(ctx, 100.9, None, None, 0.0)
        assert cq.cqe >= 100 and fw_cqs() == 1
        cq.close()
        assert fw_cqs() == 0


def test_the_default_host_holds_a_cq_of_max_cqe_plus_one_until_the_kernel_refuses_it():
    # libmlx5 allocates and initialises the ring (512 MiB) before mlx5_ib refuses it
    assert host.config()["ram_mb"] >= 2048
    with d.Context(name="mlx5_0") as ctx:
        max_cqe = ctx.query_device().max_cqe
        with pytest.raises(PyverbsRDMAError) as ei:
            CQ(ctx, max_cqe + 1, None, None, 0)
        assert ei.value.error_code == errno.EINVAL
        assert fw_cqs() == 0


def test_a_comp_vector_past_the_last_is_einval():
    with d.Context(name="mlx5_0") as ctx:
        with pytest.raises(PyverbsRDMAError) as ei:
            CQ(ctx, 100, None, None, ctx.num_comp_vectors + 1)
        assert ei.value.error_code == errno.EINVAL
        assert fw_cqs() == 0


def test_a_store_the_machine_cannot_back_is_an_error_not_a_crash():
    host.configure(ram_mb=64)
    try:
        with d.Context(name="mlx5_0") as ctx:
            with pytest.raises(PyverbsRDMAError, match="Failed to create CQ") as ei:
                CQ(ctx, 1 << 20)  # a 128 MiB ring on a 64 MiB machine
            assert ei.value.error_code == errno.EFAULT
            assert fw_cqs() == 0
            cq = CQ(ctx, 64)  # the library freed what it had: the next CQ is fine
            cq.close()
    finally:
        host._config.pop("ram_mb", None)
