"""Tests for drivers/mlx5_ib/probe.py and __init__.py: module load/unload, the stage
table, and its unwinding when a stage fails."""

from __future__ import annotations

import errno

import pytest

import drivers.mlx5_ib.probe as probe
from drivers.ib_core.device import ib_device_get_by_name
from kernel_model.auxiliary import auxiliary_bus
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import ENOMEM, KernelError
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT,
    MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS,
    MLX5_CMD_STAT_LIM_ERR,
)
from kernel_model.trace import Tracer
from tests.drivers.mlx5_ib.ladder import (
    cmds,
    errno_of,
    fw,
    host,
    ib_dev,
    last_error,
    open_ctx,
)
from userspace.libibverbs import verbs as v


def bare():
    """mlx5_core up, mlx5_ib not loaded yet."""
    return rdma_host(ram_size=64 << 20)


def test_load_runs_the_stages_in_order_and_registers_mlx5_0():
    m = bare()
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        m.load_module("mlx5_ib")
    assert_call_flow(t.trace, ["mlx5r_probe", "__mlx5_ib_add", "mlx5_ib_stage_init_init",
                               "mlx5_cmd_dump_fill_mkey", "mlx5_ib_roce_init",
                               "mlx5_ib_stage_ib_reg_init", "ib_register_device"])
    assert "QUERY_SPECIAL_CONTEXTS" in cmds(m, n)
    dev = ib_dev(m)
    assert dev.ib_active and dev.name == "mlx5_0" and dev.num_ports == 1
    assert dev.dump_fill_mkey == 1792 and dev.clock_info is not None and dev.wc_support
    assert fw(m).vport.roce_en == 1
    with m.kernel():
        assert ib_device_get_by_name("mlx5_0") is dev


def test_unload_undoes_every_stage():
    m = host()
    adev = auxiliary_bus(m).devices[0]
    n = len(fw(m).cmd_log)
    with Tracer() as t:
        m.unload_module("mlx5_ib")
    assert_call_flow(t.trace, ["mlx5r_remove", "__mlx5_ib_remove", "ib_unregister_device",
                               "mlx5_ib_roce_cleanup"])
    # the two default GIDs leave the RoCE address table, then RoCE goes off
    assert cmds(m, n) == ["SET_ROCE_ADDRESS", "SET_ROCE_ADDRESS", "MODIFY_NIC_VPORT_CONTEXT"]
    assert fw(m).vport.roce_en == 0 and fw(m).roce_addresses == {}
    assert adev.drvdata is None and adev.driver is None
    with m.kernel():
        assert ib_device_get_by_name("mlx5_0") is None
    m.load_module("mlx5_ib")  # and back again
    assert ib_dev(m).ib_active and fw(m).vport.roce_en == 1
    assert_all_freed(m)


def test_unload_with_an_open_context_disassociates_it():
    m = host()
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    m.unload_module("mlx5_ib")
    # every object of the context was destroyed with the device: only mlx5_core's remain
    assert fw(m).uctxs == {} and fw(m).pds == {} and fw(m).tds == {}
    assert errno_of(v.ibv_alloc_pd, ctx) == errno.EIO
    assert "device removed" in last_error(p)
    assert v.ibv_dealloc_pd(pd) == errno.EIO
    v.ibv_close_device(ctx)
    p.exit(0)


def test_unload_with_an_open_dyn_uar_context_frees_its_uar_before_the_uctx():
    """uverbs_user_mmap_disassociate drops each mapping's mmap entry, so the dynamic
    UAR's DEALLOC_UAR runs before DESTROY_UCTX (which fails while a UAR of the
    context is allocated) - no UCTX is left for TEARDOWN_HCA to find."""
    m = bare()
    m.load_module("mlx5_ib", dyn_uar=True)
    p = m.spawn("app")
    ctx = open_ctx(p)
    assert [u for u in fw(m).uars.values() if u.uid]  # the context's UAR object
    since = len(fw(m).cmd_log)
    m.unload_module("mlx5_ib")
    names = cmds(m, since)
    assert names.index("DEALLOC_UAR") < names.index("DESTROY_UCTX")
    assert fw(m).uctxs == {} and not [u for u in fw(m).uars.values() if u.uid]
    v.ibv_close_device(ctx)
    p.exit(0)
    assert cmds(m, since).count("DEALLOC_UAR") == 1  # munmap at exit frees nothing twice
    m.check_leaks()


def test_unknown_parameter_is_einval():
    m = bare()
    with pytest.raises(KernelError) as e:
        m.load_module("mlx5_ib", bogus=1)
    assert e.value.errno == errno.EINVAL and "bogus" in str(e.value)
    assert "mlx5_ib" not in m.modules


def test_parameters_reach_the_device():
    m = host(dyn_uar=True, mkey_update_tag=True)
    dev = ib_dev(m)
    assert (dev.dyn_uar, dev.mkey_update_tag, dev.comp_mask_v6) == (True, True, False)


@pytest.mark.parametrize("release,seen", [("upstream", None), ("6.8", (6, 8)),
                                          ("5.15.0", (5, 15))])
def test_release_parameter_reaches_the_device(release, seen):
    assert ib_dev(host(release=release)).release == seen
    assert ib_dev(host()).release is None


@pytest.mark.parametrize("release", ["6", "six.eight", ""])
def test_a_malformed_release_is_einval(release):
    m = bare()
    with pytest.raises(KernelError) as e:
        m.load_module("mlx5_ib", release=release)
    assert e.value.errno == errno.EINVAL and "mlx5_ib" not in m.modules


def assert_all_freed(m):
    """rmmod mlx5_ib and mlx5_core: nothing of either may be left."""
    m.unload_module("mlx5_ib")
    m.unload_module("mlx5_core")
    assert find_leaks(m) == []


def _probe_fails(m):
    m.load_module("mlx5_ib")  # the module loads; the probe fails
    adev = auxiliary_bus(m).devices[0]
    assert adev.driver is None and getattr(adev, "drvdata", None) is None
    with m.kernel():
        assert ib_device_get_by_name("mlx5_0") is None
    return adev


def test_failing_init_stage_unwinds_nothing_and_leaks_nothing():
    m = bare()
    fw(m).inject(MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS, MLX5_CMD_STAT_LIM_ERR)
    n = len(fw(m).cmd_log)
    _probe_fails(m)
    assert cmds(m, n)[-1] == "QUERY_SPECIAL_CONTEXTS" and fw(m).vport.roce_en == 0
    assert_all_freed(m)


def test_failing_roce_stage_unwinds_the_stages_before_it():
    m = bare()
    fw(m).inject(MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT, MLX5_CMD_STAT_LIM_ERR)
    with Tracer() as t:
        _probe_fails(m)
    assert not [c for c in t.trace.calls() if c.func == "mlx5_ib_roce_cleanup"]
    assert_all_freed(m)


def test_failing_registration_unwinds_clock_and_roce_in_reverse(monkeypatch):
    m = bare()

    def no_name(dev, name, dma_device):
        raise KernelError(ENOMEM, "ib_register_device: injected")

    monkeypatch.setattr(probe, "ib_register_device", no_name)
    with Tracer() as t:
        _probe_fails(m)
    assert_call_flow(t.trace, ["mlx5_ib_roce_init", "__mlx5_ib_remove",
                               "mlx5_ib_roce_cleanup"])
    assert fw(m).vport.roce_en == 0
    assert_all_freed(m)  # the clock-info page too
