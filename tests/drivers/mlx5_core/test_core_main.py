"""Tests for drivers/mlx5_core/main.py and __init__.py: module load, probe/remove, unwinding."""

from __future__ import annotations

import pytest

import drivers.mlx5_core  # noqa: F401 - registered for tracing before a Tracer starts
from drivers.mlx5_core.cmd import mlx5_cmd_exec_inout
from drivers.mlx5_core.driver import (
    MLX5_CAP_ETH,
    MLX5_CAP_GEN,
    MLX5_CAP_GEN_MAX,
    MLX5_CAP_ROCE,
    MLX5_DEVICE_STATE_UP,
    fw_rev_maj,
    fw_rev_min,
    fw_rev_sub,
)
from drivers.mlx5_core.ifc import (
    MLX5_CMD_OP_ALLOC_PD,
    MLX5_CMD_OP_CREATE_EQ,
    MLX5_CMD_OP_DEALLOC_PD,
    MLX5_CMD_OP_INIT_HCA,
    MLX5_CMD_OP_QUERY_ADAPTER,
    MLX5_CMD_OP_QUERY_HCA_CAP,
    MLX5_CMD_STAT_INT_ERR,
    MLX5_GET,
    MLX5_SET,
    IfcStruct,
)
from drivers.mlx5_core.main import MLX5_INIT_STAGES
from kernel_model.auxiliary import (
    auxiliary_bus,
    auxiliary_driver,
    auxiliary_driver_register,
    auxiliary_driver_unregister,
)
from kernel_model.dma import DMA_BIT_MASK
from kernel_model.emu.leakcheck import find_leaks
from kernel_model.emu.platform import rdma_host
from kernel_model.emu.tracefilter import assert_call_flow
from kernel_model.errno import ETIMEDOUT
from kernel_model.hw.mlx5 import ConnectX, Mlx5Config
from kernel_model.trace import Tracer

KiB, MiB = 1 << 10, 1 << 20


def mdev_of(hca):
    return hca.pdev.dev.driver_data


def test_load_probes_the_hca_and_offers_the_rdma_auxiliary_device():
    m = rdma_host()
    hca = m.hcas[0]
    mdev = mdev_of(hca)
    pdev = hca.pdev
    assert pdev.driver.name == "mlx5_core" and mdev.state == MLX5_DEVICE_STATE_UP
    assert pdev.enable_cnt == 1 and pdev.is_busmaster
    assert pdev.dev.dma_mask == DMA_BIT_MASK(64) == pdev.dev.coherent_dma_mask
    assert pdev.dev.dma_parms.max_segment_size == 2 * 1024 * MiB
    assert mdev.bar_addr == hca.bar.start == mdev.iseg and mdev.device is pdev.dev
    assert mdev.board_id == "MT_0000000359" and hca.fw.state == "initialized"
    with m.kernel():
        assert (fw_rev_maj(mdev), fw_rev_min(mdev), fw_rev_sub(mdev)) == (22, 39, 1002)
    assert mdev.priv.stages_done == len(MLX5_INIT_STAGES)
    assert mdev.priv.uar.index == 3 and mdev.priv.uar.map == hca.bar.start + 3 * 4 * KiB
    eq = mdev.priv.eq_table.comp_eqs[0]
    assert eq.eqn in hca.fw.eqs and hca.fw.eqs[eq.eqn].eqc["uar_page"] == 3
    assert hca.fw.vport.disable_uc_local_lb == hca.fw.vport.disable_mc_local_lb == 1
    [adev] = auxiliary_bus(m).devices
    assert adev.dev.name == "mlx5_core.rdma.0" and adev.mdev is mdev
    assert adev.dev.parent is pdev.dev and adev.driver is None  # no mlx5_ib loaded
    assert "log_max_qp value in current profile is 255" in mdev.log[1]


def test_capabilities_after_probe_match_the_reference_dump():
    m = rdma_host()
    mdev = mdev_of(m.hcas[0])
    assert 1 << MLX5_CAP_GEN(mdev, "log_max_qp") == 262144            # qp_tab_size
    assert 1 << MLX5_CAP_GEN(mdev, "log_bf_reg_size") == 512          # bf_reg_size
    assert MLX5_CAP_GEN(mdev, "max_wqe_sz_sq") == 1024                # max_sq_desc_sz
    assert MLX5_CAP_GEN(mdev, "max_wqe_sz_rq") == 512                 # max_rq_desc_sz
    assert 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz") == 32768          # max_send_wqebb
    assert 1 << MLX5_CAP_GEN(mdev, "log_max_srq_sz") == 32768         # max_srq_recv_wr
    assert MLX5_CAP_GEN(mdev, "num_ports") == 1 and MLX5_CAP_GEN(mdev, "cqe_version") == 1
    assert MLX5_CAP_GEN(mdev, "dump_fill_mkey") == 1
    assert (MLX5_CAP_GEN_MAX(mdev, "uar_4k"), MLX5_CAP_GEN(mdev, "uar_4k")) == (1, 0)
    assert MLX5_CAP_GEN(mdev, "log_uar_page_sz") == 0
    assert MLX5_CAP_GEN(mdev, "num_of_uars_per_page") == 1
    assert MLX5_CAP_GEN(mdev, "pkey_table_size") == 0 and MLX5_CAP_GEN(mdev, "cmdif_checksum") == 0
    assert MLX5_CAP_GEN(mdev, "cache_line_128byte") == 0  # x86: 64-byte lines
    assert MLX5_CAP_ROCE(mdev, "roce_address_table_size") == 256
    assert MLX5_CAP_ETH(mdev, "wqe_inline_mode") == 1


def test_uar_4k_is_turned_on_only_on_hosts_with_bigger_pages():
    m = rdma_host(ram_size=256 * MiB, page_size=65536)
    hca = m.hcas[0]
    mdev = mdev_of(hca)
    assert MLX5_CAP_GEN(mdev, "uar_4k") == 1 and MLX5_CAP_GEN(mdev, "log_uar_page_sz") == 4
    assert MLX5_CAP_GEN(mdev, "num_of_uars_per_page") == 16
    assert hca.fw.uar_page_size == 4096
    # ALLOC_UAR gives a whole 64 KiB system page (16 UARs); page 0 holds the init segment
    assert mdev.priv.uar.index == 16 and mdev.priv.uar.map == hca.bar.start + 65536
    assert hca.fw.uars[16].span == 16 and mdev.priv.uar.bfregs == 16 * 4
    m2 = rdma_host(page_size=65536, hca=Mlx5Config(caps={"uar_4k": 0}))
    mdev2 = mdev_of(m2.hcas[0])
    assert MLX5_CAP_GEN(mdev2, "uar_4k") == 0 and m2.hcas[0].fw.uar_page_size == 65536
    assert mdev2.priv.uar.index == 1 and mdev2.priv.uar.map == m2.hcas[0].bar.start + 65536


def test_init_one_runs_the_stage_table_in_order():
    with Tracer() as t:
        m = rdma_host()
    assert_call_flow(t.trace, ["probe_one", "mlx5_init_one", "mlx5_pci_init",
                               "pci_enable_device", "dma_set_mask_and_coherent",
                               "wait_fw_init", "mlx5_cmd_init", "mlx5_core_enable_hca",
                               "handle_hca_cap", "mlx5_core_get_caps", "mlx5_cmd_init_hca",
                               "mlx5_query_hca_caps", "mlx5_query_board_id",
                               "mlx5_get_uars_page", "mlx5_eq_table_create",
                               "mlx5_core_set_hca_defaults", "mlx5_register_device",
                               "__auxiliary_device_add"])
    cmds = [(p.fields["command"], p.fields["status"]) for p in t.trace.points("mlx5_cmd")]
    assert cmds[:5] == [("ENABLE_HCA", 0), ("QUERY_HCA_CAP", 0), ("QUERY_HCA_CAP", 0),
                        ("SET_HCA_CAP", 0), ("INIT_HCA", 0)]
    # the async EQ, then the completion EQ
    assert cmds[-4:] == [("ALLOC_UAR", 0), ("CREATE_EQ", 0), ("CREATE_EQ", 0),
                         ("MODIFY_NIC_VPORT_CONTEXT", 0)]
    assert len(cmds) == len(m.hcas[0].fw.cmd_log)


def test_module_unload_removes_everything_in_reverse():
    m = rdma_host()
    hca = m.hcas[0]
    pdev = hca.pdev
    before = len(hca.fw.cmd_log)
    m.unload_module("mlx5_core")
    assert [c[0] for c in hca.fw.cmd_log[before:]] == [   # completion EQ, then async EQ
        "DESTROY_EQ", "DESTROY_EQ", "DEALLOC_UAR", "TEARDOWN_HCA", "DISABLE_HCA"]
    assert pdev.driver is None and pdev.enable_cnt == 0 and not pdev.is_busmaster
    assert pdev.dev.driver_data is None and auxiliary_bus(m).devices == []
    assert hca.fw.state == "disabled" and hca.fw.leaked == [] and m.pci_drivers == []
    assert find_leaks(m) == []
    m.load_module("mlx5_core")  # and back
    assert hca.fw.state == "initialized" and pdev.driver is not None
    assert auxiliary_bus(m).devices[0].dev.name == "mlx5_core.rdma.0"


# which command fails -> the firmware commands the unwinding issues after it
@pytest.mark.parametrize("opcode,op_mod,undo", [
    (MLX5_CMD_OP_QUERY_HCA_CAP, 0, ["DISABLE_HCA"]),
    (MLX5_CMD_OP_INIT_HCA, 0, ["DISABLE_HCA"]),
    (MLX5_CMD_OP_QUERY_HCA_CAP, 9, ["TEARDOWN_HCA", "DISABLE_HCA"]),  # RoCE caps
    (MLX5_CMD_OP_QUERY_ADAPTER, 0, ["TEARDOWN_HCA", "DISABLE_HCA"]),
    (MLX5_CMD_OP_CREATE_EQ, 0, ["DEALLOC_UAR", "TEARDOWN_HCA", "DISABLE_HCA"]),
])
def test_a_failing_stage_unwinds_the_earlier_ones_and_leaks_nothing(opcode, op_mod, undo):
    m = rdma_host(modules=())
    hca = m.hcas[0]
    hca.fw.inject(opcode, MLX5_CMD_STAT_INT_ERR, "test_fault", op_mod=op_mod)
    m.load_module("mlx5_core")  # the module loads; the probe fails
    pdev = hca.pdev
    assert pdev.driver is None and pdev.probe_error == -5  # EIO from INT_ERR
    log = [c[0] for c in hca.fw.cmd_log]
    failed = next(i for i, c in enumerate(hca.fw.cmd_log) if c[2])
    assert log[failed + 1:] == undo
    assert pdev.enable_cnt == 0 and not pdev.is_busmaster and pdev.dev.driver_data is None
    assert hca.fw.state == "disabled" and hca.fw.live_objects() == []
    assert auxiliary_bus(m).devices == []
    assert find_leaks(m) == []  # the cmdq page, the EQ buffer, the mdev: all freed


def test_firmware_that_never_gets_ready_times_out_the_probe():
    m = rdma_host(modules=())
    hca = m.hcas[0]
    hca.initializing = True
    start = m.sched.jiffies
    m.load_module("mlx5_core")
    assert hca.pdev.driver is None and hca.pdev.probe_error == -ETIMEDOUT
    assert m.sched.jiffies - start >= 120000  # 120 s of virtual time
    assert hca.pdev.enable_cnt == 0 and hca.fw.cmd_log == []


def test_two_hcas_and_a_hotplugged_one_get_their_own_auxiliary_devices():
    m = rdma_host(nr_hcas=2)
    names = [d.dev.name for d in auxiliary_bus(m).devices]
    assert names == ["mlx5_core.rdma.0", "mlx5_core.rdma.1"]
    a, b = (mdev_of(h) for h in m.hcas)
    assert a is not b and a.priv.uar.map != b.priv.uar.map
    third = ConnectX(m, Mlx5Config(board_id="MT_0000000222"))  # probed on add
    assert mdev_of(third).board_id == "MT_0000000222"
    assert auxiliary_bus(m).devices[-1].dev.name == "mlx5_core.rdma.2"
    m.unload_module("mlx5_core")
    assert all(h.fw.state == "disabled" for h in m.hcas)
    m.load_module("mlx5_core")  # indices are reused
    assert sorted(d.dev.name for d in auxiliary_bus(m).devices) == [
        "mlx5_core.rdma.0", "mlx5_core.rdma.1", "mlx5_core.rdma.2"]


class FakeIb:
    """An auxiliary driver like mlx5_ib: a PD per device, freed on remove."""

    def __init__(self):
        self.pds: dict[str, int] = {}
        self.drv = auxiliary_driver("mlx5_ib", ["mlx5_core.rdma"], self.probe, self.remove)

    def probe(self, adev, ident):
        in_ = IfcStruct("alloc_pd_in")
        MLX5_SET("alloc_pd_in", in_, "opcode", MLX5_CMD_OP_ALLOC_PD)
        out = mlx5_cmd_exec_inout(adev.mdev, in_)
        self.pds[adev.dev.name] = MLX5_GET("alloc_pd_out", out, "pd")

    def remove(self, adev):
        in_ = IfcStruct("dealloc_pd_in")
        MLX5_SET("dealloc_pd_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_PD)
        MLX5_SET("dealloc_pd_in", in_, "pd", self.pds.pop(adev.dev.name))
        mlx5_cmd_exec_inout(adev.mdev, in_)


def test_an_auxiliary_driver_binds_and_is_removed_before_teardown():
    m = rdma_host()
    ib = FakeIb()
    with m.kernel():
        auxiliary_driver_register(m, ib.drv)
    adev = auxiliary_bus(m).devices[0]
    assert adev.driver is ib.drv and ib.pds == {"mlx5_core.rdma.0": 1}
    assert list(m.hcas[0].fw.pds) == [1]
    m.unload_module("mlx5_core")  # unbinds mlx5_ib's device first: its PD goes
    assert ib.pds == {} and m.hcas[0].fw.leaked == []
    m.load_module("mlx5_core")    # a new device: the registered driver binds again
    assert ib.pds == {"mlx5_core.rdma.0": 1}
    with m.kernel():
        auxiliary_driver_unregister(m, ib.drv)
    assert ib.pds == {}


def test_unloading_with_a_firmware_object_still_allocated_is_a_leak():
    m = rdma_host()
    hca = m.hcas[0]
    leaky = auxiliary_driver("leaky", ["mlx5_core.rdma"], FakeIb().probe)  # no remove
    with m.kernel():
        auxiliary_driver_register(m, leaky)
    m.unload_module("mlx5_core")
    assert hca.fw.leaked == [f"{hca.name}: 1 firmware object(s) still allocated at "
                             "TEARDOWN_HCA: PD 0x1 uid=0"]
    assert find_leaks(m) == [f"mlx5 {hca.fw.leaked[0]}"]
    m.leak_check_expected = False


def test_a_command_is_one_step_from_lock_to_unlock(monkeypatch):
    """The firmware runs a command inside the doorbell write with the interface's lock
    held: no scheduling point comes between taking the lock and giving it back (so
    partial-order reduction sees the lock only read), and the doorbell is no MMIO
    write point - the command path's points are the mutex's own."""
    from kernel_model.sched import SCHED
    m = rdma_host()
    mdev = mdev_of(m.hcas[0])
    held, reasons = [], []
    point = type(SCHED).point

    def spy(self, reason):
        reasons.append(reason)
        held.append(mdev.cmd.lock.owner is self.current)
        return point(self, reason)
    monkeypatch.setattr(type(SCHED), "point", spy)
    with m.kernel():
        in_ = IfcStruct("alloc_pd_in")
        MLX5_SET("alloc_pd_in", in_, "opcode", MLX5_CMD_OP_ALLOC_PD)
        pd = MLX5_GET("alloc_pd_out", mlx5_cmd_exec_inout(mdev, in_), "pd")
        in_ = IfcStruct("dealloc_pd_in")
        MLX5_SET("dealloc_pd_in", in_, "opcode", MLX5_CMD_OP_DEALLOC_PD)
        MLX5_SET("dealloc_pd_in", in_, "pd", pd)
        mlx5_cmd_exec_inout(mdev, in_)
    assert reasons and "mmio_write" not in reasons and not any(held)
    assert reasons.count("mutex_lock") == reasons.count("mutex_unlock") == 2
