"""Tests for kernel_model/hw/mlx5.py: the ConnectX's PCI function, BAR0 and UAR decoding."""

from __future__ import annotations

import struct

import pytest

from kernel_model.emu.leakcheck import find_leaks
from kernel_model.hw.mlx5 import ConnectX, Mlx5Config, UarWrite
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_NAMES,
    MLX5_GET,
    MLX5_SET,
    CmdqMemory,
    IfcStruct,
    mlx5_cmd_layout,
)
from kernel_model.pci import (
    IORESOURCE_PREFETCH,
    pci_remove_device,
    pci_resource_flags,
    pci_resource_len,
    pci_resource_start,
)
from tests.kernel_model.hw.fwcmd import bring_up, ladder, ok, qp_fields

MiB = 1 << 20


def iseg32(hca, off):
    return struct.unpack(">I", hca.machine.phys_read(hca.bar.start + off, 4))[0]


def test_config_defaults_and_validation():
    cfg = Mlx5Config()
    assert (cfg.vendor, cfg.device, cfg.fw_rev(), cfg.board_id) == (
        0x15B3, 0x101D, (22, 39, 1002), "MT_0000000359")
    assert cfg.bar_size == 32 * MiB and cfg.write_combining and cfg.link_layer == "Ethernet"
    for bad in (dict(bar_size=3 * MiB), dict(bar_size=4096), dict(ports=2),
                dict(link_layer="InfiniBand")):
        with pytest.raises(ValueError):
            Mlx5Config(**bad)


def test_pci_function_and_initialisation_segment(m, hca):
    pdev = hca.pdev
    assert m.hcas == [hca] and (pdev.vendor, pdev.device) == (0x15B3, 0x101D)
    assert pci_resource_len(pdev, 0) == 32 * MiB
    assert pci_resource_flags(pdev, 0) & IORESOURCE_PREFETCH
    assert hca.bar.start == pci_resource_start(pdev, 0)
    assert pdev.driver is None and hca.fw.state == "disabled"
    assert iseg32(hca, 0x0) == 39 << 16 | 22           # fw_rev: minor << 16 | major
    assert iseg32(hca, 0x4) == 5 << 16 | 1002          # cmdif rev 5, subminor
    assert iseg32(hca, 0x14) & 0xFF == 5 << 4 | 6      # 32 entries of 64 bytes
    assert iseg32(hca, 0x1FC) == 0
    hca.initializing = True
    assert iseg32(hca, 0x1FC) == 1 << 31
    assert iseg32(hca, 0x1010) != iseg32(hca, 0x1010)  # the health counter moves
    assert m.phys_read(hca.bar.start + 0x2, 2) == (22).to_bytes(2, "big")  # unaligned read
    assert m.phys_read(hca.bar.start + 0x3000, 8) == bytes(8)


def test_internal_timer_follows_the_virtual_clock(m, hca):
    before = iseg32(hca, 0x1000) << 32 | iseg32(hca, 0x1004)
    m.sched.jiffies += 10
    after = iseg32(hca, 0x1000) << 32 | iseg32(hca, 0x1004)
    assert after - before == 10 * 156250  # device_frequency_khz ticks per jiffy (1 ms)


def _program_cmdq(m, hca, addr=0x1_2345_6000):
    entries = [mlx5_cmd_layout() for _ in range(32)]
    CmdqMemory.publish(m, addr, entries)
    m.phys_write(hca.bar.start + 0x10, struct.pack(">I", addr >> 32))
    m.phys_write(hca.bar.start + 0x14, struct.pack(">I", addr & 0xFFFFFFFF))
    assert iseg32(hca, 0x10) == addr >> 32 and iseg32(hca, 0x14) >> 12 == (addr >> 12) & 0xFFFFF
    return entries


def test_command_doorbell_executes_the_entry_inside_the_mmio_write(m, hca):
    entries = _program_cmdq(m, hca)
    ent = entries[3]
    ent.in_, ent.out = IfcStruct("enable_hca_in"), IfcStruct("enable_hca_out")
    MLX5_SET("enable_hca_in", ent.in_, "opcode", 0x104)
    ent.status_own = 1
    m.phys_write(hca.bar.start + 0x18, struct.pack(">I", 1 << 3))
    assert ent.status_own == 0 and hca.fw.state == "enabled"
    assert MLX5_GET("enable_hca_out", ent.out, "status") == 0
    assert hca.fw.cmd_log == [("ENABLE_HCA", 0, 0, 0)]
    # a doorbell for an entry software still owns is a descriptor error
    m.phys_write(hca.bar.start + 0x18, struct.pack(">I", 1 << 4))
    assert entries[4].status_own == 0x10 << 1
    assert hca.device_errors == ["command doorbell for entry 4 not handed to hardware"]
    hca.device_errors.clear()
    CmdqMemory.withdraw(m, hca.cmdq_addr)


def test_one_command_doorbell_runs_every_entry_it_names_lowest_first(m, hca):
    """A doorbell word with several bits runs each named entry in order of its bit
    (one handed to hardware or a descriptor error); bits beyond the queue are none."""
    entries = _program_cmdq(m, hca)
    for i, cmd, opcode in ((1, "enable_hca", 0x104), (31, "disable_hca", 0x105)):
        ent = entries[i]
        ent.in_, ent.out = IfcStruct(f"{cmd}_in"), IfcStruct(f"{cmd}_out")
        MLX5_SET(f"{cmd}_in", ent.in_, "opcode", opcode)
        ent.status_own = 1
    m.phys_write(hca.bar.start + 0x18, struct.pack(">I", 1 << 31 | 1 << 5 | 1 << 1))
    assert entries[1].status_own == entries[31].status_own == 0
    # entry 1 first: it enabled the function, which entry 31 could then disable
    assert [c[:2] for c in hca.fw.cmd_log] == [("ENABLE_HCA", 0), ("DISABLE_HCA", 0)]
    assert hca.fw.state == "disabled"
    assert hca.device_errors == ["command doorbell for entry 5 not handed to hardware"]
    hca.device_errors.clear()
    CmdqMemory.withdraw(m, hca.cmdq_addr)
    short = [mlx5_cmd_layout() for _ in range(4)]
    CmdqMemory.publish(m, hca.cmdq_addr, short)
    m.phys_write(hca.bar.start + 0x18, struct.pack(">I", 1 << 9 | 1 << 4))
    assert hca.device_errors == [] and len(hca.fw.cmd_log) == 2
    CmdqMemory.withdraw(m, hca.cmdq_addr)


def test_command_doorbell_without_a_queue_is_a_device_error(m, hca):
    m.phys_write(hca.bar.start + 0x18, struct.pack(">I", 1))
    assert hca.device_errors == ["command doorbell 0x1 with no command queue at 0x0"]
    assert find_leaks(m) == [f"mlx5 {hca.name}: device error: {hca.device_errors[0]}"]
    hca.device_errors.clear()
    m.phys_write(hca.bar.start + 0x100, b"\0\0")  # a 2-byte init-segment write
    assert "init segment write of 2 bytes at 0x100" in hca.device_errors[0]
    hca.device_errors.clear()


def test_uar_writes_are_decoded_logged_and_handed_to_hooks(m, hca):
    bring_up(hca)
    uar = MLX5_GET("alloc_uar_out", ok(hca, "alloc_uar"), "uar")
    assert uar == 3  # UARs 0-2 overlap the initialisation segment (0x0-0x200f)
    seen: list[UarWrite] = []
    hca.doorbell_hooks.append(lambda h, rec: seen.append(rec))
    base = hca.bar.start + uar * 4096
    writes = [(0x20, 8), (0x40, 4), (0x48, 4), (0x800, 8), (0x900, 64), (0x940, 64),
              (0xA00, 8), (0xC00, 64), (0xF00, 8), (0x100, 8)]
    for off, n in writes:
        m.phys_write(base + off, bytes(range(n)))
    got = [(r.kind, r.bfreg, r.buf, r.offset, len(r.data)) for r in seen]
    assert got == [("cq_db", None, None, 0x20, 8), ("eq_db", None, None, 0x40, 4),
                   ("eq_db", None, None, 0x48, 4), ("db", 0, 0, 0x800, 8),
                   ("bf", 0, 1, 0x900, 64), ("bf", 0, 1, 0x940, 64), ("db", 1, 0, 0xA00, 8),
                   ("bf", 2, 0, 0xC00, 64), ("db", 3, 1, 0xF00, 8),
                   ("reserved", None, None, 0x100, 8)]
    assert all(r.uar == uar and r.valid for r in seen) and list(hca.uar_log) == seen
    assert seen[0].data == bytes(range(8))
    assert m.phys_read(base + 0x800, 8) == bytes(8)  # UAR pages read as zeros
    assert hca.device_errors == []


def test_write_to_an_unallocated_uar_is_recorded_as_a_device_error(m, hca):
    bring_up(hca)
    seen = []
    hca.doorbell_hooks.append(lambda h, rec: seen.append(rec))
    m.phys_write(hca.bar.start + 9 * 4096 + 0x800, bytes(8))
    assert seen == []
    rec = hca.uar_log[-1]
    assert (rec.uar, rec.kind, rec.valid) == (9, "db", False)
    assert repr(rec) == "UAR 0x9+0x800 db bfreg 0 buf 0 8B (unallocated UAR)"
    assert hca.device_errors == ["write to UAR 0x9 (offset 0x800, 8 bytes), which the "
                                 "firmware has not allocated"]
    assert any("write to UAR 0x9" in line for line in find_leaks(m))
    hca.device_errors.clear()


@pytest.mark.parametrize("uar_4k,stride", [(1, 4096), (0, 65536)])
def test_uar_page_size_follows_uar_4k_and_log_uar_page_sz(m, hca, uar_4k, stride):
    ok(hca, "enable_hca")
    ok(hca, "set_hca_cap", capability__uar_4k=uar_4k, capability__log_uar_page_sz=4)
    ok(hca, "init_hca")
    assert hca.fw.uar_page_size == stride
    assert hca.fw.cap("num_of_uars_per_page") == (16 if uar_4k else 1)
    uar = MLX5_GET("alloc_uar_out", ok(hca, "alloc_uar"), "uar")
    assert uar == (16 if uar_4k else 1)  # the first system page past the init segment
    m.phys_write(hca.bar.start + uar * stride + 0x20, bytes(8))
    assert (hca.uar_log[-1].uar, hca.uar_log[-1].kind) == (uar, "cq_db")


def test_the_bar_layout_is_read_at_init_hca_and_kept_until_teardown(m, hca):
    """INIT_HCA fixes how BAR0 decodes (fw.bar); before it and after TEARDOWN_HCA the
    capabilities are read at each access, so a SET_HCA_CAP between two
    initialisations moves the UAR stride of the next one."""
    def uar_stride_of_a_doorbell(uar):
        """Ring UAR `uar`'s CQ doorbell at both candidate strides; the one that
        decodes as a cq_db at that UAR is the stride the device uses."""
        for stride in (4096, 65536):
            m.phys_write(hca.bar.start + uar * stride + 0x20, bytes(8))
            rec = hca.uar_log[-1]
            if (rec.uar, rec.offset, rec.kind) == (uar, 0x20, "cq_db"):
                return stride
        return None

    ok(hca, "enable_hca")
    assert hca.fw.bar is None
    ok(hca, "set_hca_cap", capability__uar_4k=1, capability__log_uar_page_sz=4)
    assert hca.fw.bar_layout().uar_page_size == 4096   # read from the caps, not kept
    assert hca.fw.bar is None
    ok(hca, "init_hca")
    assert hca.fw.bar == (4096, 16, 1 << hca.fw.cap("log_bf_reg_size"),
                          32 * MiB - 256 * 1024, 256 * 1024)      # MEMIC: the BAR's top
    assert uar_stride_of_a_doorbell(16) == 4096
    ok(hca, "teardown_hca")
    assert hca.fw.bar is None
    ok(hca, "set_hca_cap", capability__uar_4k=0, capability__log_uar_page_sz=4)
    assert hca.fw.bar_layout().uar_page_size == 65536
    ok(hca, "init_hca")
    assert hca.fw.bar.uar_page_size == 65536 and hca.fw.bar.uars_per_page == 1
    assert uar_stride_of_a_doorbell(1) == 65536
    hca.fw.reset()
    assert hca.fw.bar is None and hca.fw.state == "disabled"
    hca.device_errors.clear()        # the doorbells rang UARs nobody allocated


def test_teardown_records_leaked_objects_and_the_leak_check_reports_them(m, hca):
    bring_up(hca)
    objs = ladder(hca)
    ok(hca, "create_qp", pas=5, **qp_fields(objs))
    ok(hca, "teardown_hca")
    assert hca.fw.live_objects() == [] and hca.fw.state == "enabled"
    assert len(hca.fw.leaked) == 1
    line = hca.fw.leaked[0]
    assert "5 firmware object(s) still allocated at TEARDOWN_HCA" in line
    assert "QP 0x100 RST RC pd=0x1 uar=0x3 cqn_snd=0x400 cqn_rcv=0x400 uid=0" in line
    assert find_leaks(m) == [f"mlx5 {line}"]
    hca.fw.leaked.clear()


def test_live_objects_are_reported_and_a_pci_remove_resets_the_function(m, hca):
    bring_up(hca)
    ok(hca, "alloc_pd")
    assert find_leaks(m) == [f"mlx5 {hca.name}: 1 firmware object(s) still allocated: "
                             "PD 0x1 uid=0"]
    pci_remove_device(hca.pdev)
    assert hca.fw.state == "disabled" and hca.fw.live_objects() == []
    assert "at function reset: PD 0x1 uid=0" in hca.fw.leaked[0]
    hca.fw.leaked.clear()
    assert find_leaks(m) == []


def test_two_hcas_have_their_own_bars_names_and_guids(m):
    a, b = ConnectX(m), ConnectX(m, Mlx5Config(board_id="MT_0000000222"))
    assert m.hcas == [a, b] and a.index == 0 and b.index == 1
    assert a.name != b.name and a.bar.start + 32 * MiB <= b.bar.start
    assert a.fw.vport.node_guid != b.fw.vport.node_guid
    assert a.fw.vport.node_guid >> 40 == 0xB8CEF6
    assert a.fw.vport.node_guid == a.fw.vport.system_image_guid
    fixed = ConnectX(m, Mlx5Config(node_guid=0x1234, sys_image_guid=0x5678))
    assert (fixed.fw.vport.node_guid, fixed.fw.vport.system_image_guid) == (0x1234, 0x5678)
    assert repr(a) == f"ConnectX {a.name} [15b3:101d] fw 22.39.1002 disabled 0 objects"
    assert "CREATE_QP" in MLX5_CMD_NAMES.values()
