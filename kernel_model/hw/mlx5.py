"""The ConnectX HCA: an mlx5 PCI function's registers (device model, not kernel code).

This is the silicon side of drivers/net/ethernet/mellanox/mlx5/core: one PCI
function with one 64-bit BAR.  mlx5_core reaches it only through that BAR.

BAR0 layout (struct mlx5_init_seg, include/linux/mlx5/device.h, at offset 0):

    0x0000 fw_rev            minor << 16 | major
    0x0004 cmdif_rev_fw_sub  command interface revision (5) << 16 | subminor
    0x0010 cmdq_addr_h       the command queue's DMA address, high half
    0x0014 cmdq_addr_l_sz    low half; reads back log_sz << 4 | log_stride
    0x0018 cmd_dbell         a write rings the doorbell of the entries whose bits are set
    0x01fc initializing      bit 31 while the firmware is not ready
    0x1000 internal_timer_h  free-running device clock (device_frequency_khz)
    0x1004 internal_timer_l
    0x1010 health_counter    advances while the firmware lives

The last memic_bar_size bytes (device_mem_cap, 256 KiB) are on-chip memory (MEMIC,
mlx5_fw_memic.py): loads and stores there read and write its bytes.  The rest of the
BAR is cut into UAR pages (4 KiB each on a 4 KiB host; with
uar_4k off and a larger log_uar_page_sz, that many bytes): UAR index i at
BAR0 + i * uar_page_size.  In a UAR page (include/linux/mlx5/cq.h, eq.c,
rdma-core mlx5.h):

    0x020  CQ doorbell (64-bit: arm command and consumer index)
    0x040  EQ doorbell, arm; 0x048 EQ doorbell, update consumer index
    0x800  four BlueFlame registers of bf_reg_size bytes (512): two regular,
           two fast path; each holds two buffers of bf_reg_size / 2 that
           posters alternate between.  An 8-byte write at a buffer's start is
           a send doorbell; any other write there (64-byte chunks from
           libmlx5, but the CPU may store 1, 2, 4, 8 bytes or any memcpy) is
           part of a BlueFlame copy of the WQE itself, which the engine
           assembles (mlx5_engine.hca_doorbell; a torn copy is dropped).

A store of any width at any offset is accepted: it is logged and classified,
never refused.  A uverbs response that copy_to_user() writes into a mapped
UAR page goes to the device the same way, as on Linux, where the page is a
present VM_IO|VM_PFNMAP mapping and the copy's stores reach the BAR.

Every write to a UAR page is logged (`uar_log`, UarWrite records) and handed
to `doorbell_hooks` - the data path's engine subscribes there.  A write to a
UAR the firmware has not allocated is a device error (`device_errors`),
which the machine's leak check reports together with firmware objects a
driver left allocated (see mlx5_fw.Firmware.leaked).  Reads of a UAR page
return zeros.

Commands: a doorbell write makes the device fetch the entry from the command
queue (mlx5_ifc.CmdqMemory) and execute it synchronously inside the MMIO
write, then hand the entry back to software (status_own bit 0 cleared).
# EMU: there is no completion EQE and no polling delay: the command is done
# when the doorbell write returns.  Write-combining: Mlx5Config.write_combining
# says whether the host can write-combine into this BAR; the firmware reports
# it as the `bf` capability (the real driver learns it from wc.c's self-test,
# which needs the data path).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import attrs

from kernel_model.hw import mlx5_caps
from kernel_model.hw.mlx5_engine import Mlx5Engine
from kernel_model.hw.mlx5_fw import INIT_SEG_SIZE, BarLayout, Firmware
from kernel_model.hw.mlx5_ifc import LAYOUTS, CmdqMemory
from kernel_model.pci import pci_add_device, pci_dev, pci_register_bar

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

CMD_IF_REV = 5
CMDQ_LOG_SZ, CMDQ_LOG_STRIDE = 5, 6      # 32 entries of 64 bytes
CQ_DOORBELL, EQ_DOORBELL_ARM, EQ_DOORBELL_CI = 0x20, 0x40, 0x48
BF_OFFSET, NUM_BFREGS = 0x800, 4
MLX5_CMD_DELIVERY_STAT_CMD_DESCR_ERR = 0x10


@attrs.frozen
class Mlx5Config:
    """What kind of ConnectX to build (defaults: a one-port ConnectX-6 Dx running RoCE)."""

    vendor: int = 0x15B3
    device: int = 0x101D
    fw_version: str = "22.39.1002"
    board_id: str = "MT_0000000359"
    ports: int = attrs.field(default=1, validator=attrs.validators.in_((1,)))
    link_layer: str = attrs.field(default="Ethernet",
                                  validator=attrs.validators.in_(("Ethernet",)))
    write_combining: bool = True
    bar_size: int = attrs.field(default=32 << 20)
    node_guid: int | None = None       # None: derived from the machine serial
    sys_image_guid: int | None = None  # None: the node GUID
    mtu: int = 1500                    # the port's Ethernet MTU (netdev MTU)
    max_mtu: int = 9978                # PMTU max_mtu (hardware MTU)
    eth_proto_oper: int = 1 << 20      # PTYS: MLX5E_100GBASE_CR4 (100 Gb/s, 4 lanes)
    caps: dict[str, int] = attrs.field(factory=dict)  # "field", "roce.field", "eth.field"

    @bar_size.validator
    def _pow2(self, attribute: object, value: int) -> None:
        if value < 1 << 20 or value & (value - 1):
            raise ValueError("Mlx5Config: bar_size must be a power of two >= 1 MiB")

    @caps.validator
    def _known_caps(self, attribute: object, value: dict[str, int]) -> None:
        for cap, fields in mlx5_caps.split_overrides(value).items():
            unknown = set(fields) - set(LAYOUTS[mlx5_caps.CAP_LAYOUT[cap]])
            if unknown:
                raise ValueError(f"Mlx5Config.caps: no capability {sorted(unknown)}")

    def fw_rev(self) -> tuple[int, int, int]:
        major, minor, sub = (int(x) for x in self.fw_version.split("."))
        return major, minor, sub


class UarWrite(NamedTuple):
    """One write the device saw in a UAR page.  (A named tuple, immutable as the
    frozen attrs class it was: one is made for every doorbell and BlueFlame store,
    and a tuple is made in a third of the time.)"""

    uar: int
    offset: int              # within the UAR page
    data: bytes
    kind: str                # "cq_db", "eq_db", "db" (64-bit send doorbell), "bf", "reserved"
    bfreg: int | None = None  # BlueFlame register 0..3 (0, 1 regular; 2, 3 fast path)
    buf: int | None = None    # which half of the register
    valid: bool = True        # False: the UAR is not allocated

    def __repr__(self) -> str:
        where = f" bfreg {self.bfreg} buf {self.buf}" if self.bfreg is not None else ""
        bad = "" if self.valid else " (unallocated UAR)"
        return f"UAR {self.uar:#x}+{self.offset:#x} {self.kind}{where} {len(self.data)}B{bad}"


class ConnectX:
    """One ConnectX PCI function and its firmware.  See the module docstring."""

    def __init__(self, machine: Machine, config: Mlx5Config | None = None,
                 bus: int | None = None):
        self.machine = machine
        self.config = config or Mlx5Config()
        hcas = getattr(machine, "hcas", None)
        if hcas is None:
            hcas = machine.hcas = []
            machine.leak_checks.append(_leak_check)
        self.index = len(hcas)
        self.pdev = pci_dev(machine, self.config.vendor, self.config.device, bus)
        self.bar = pci_register_bar(self.pdev, 0, self.config.bar_size, self._read,
                                    self._write, prefetch=True)
        self.pdev.remove_hooks.append(lambda pdev: self.reset())
        self.uar_log: deque[UarWrite] = deque(maxlen=1 << 16)
        self.doorbell_hooks: list[Callable[[ConnectX, UarWrite], None]] = []
        self.device_errors: list[str] = []
        self.initializing = False      # a test may hold the firmware "not ready"
        self._cmdq_h = 0
        self.cmdq_addr = 0
        self._health = 0
        caps = {"bf": int(self.config.write_combining), **self.config.caps}
        self.fw = Firmware(self, caps)
        self.async_events: list[tuple] = []   # QP errors, CQ overruns, stray doorbells
        self.fabric = None                    # kernel_model.hw.fabric.Fabric, once attached
        self.engine = Mlx5Engine(self)
        hcas.append(self)
        pci_add_device(machine, self.pdev)  # a loaded mlx5_core probes it now

    @property
    def name(self) -> str:
        return self.pdev.name

    def __repr__(self) -> str:
        return (f"ConnectX {self.name} [{self.config.vendor:04x}:{self.config.device:04x}] "
                f"fw {self.config.fw_version} {self.fw.state} "
                f"{len(self.fw.live_objects())} objects")

    def qp_state_changed(self, qp: object, old: int, new: int) -> None:
        """The firmware moved a QP between states (a MODIFY_QP command ran):
        the data-path engine flushes or forgets the QP's queues."""
        self.engine.qp_state_changed(qp, old, new)

    def object_destroyed(self, kind: str, num: int) -> None:
        """The firmware destroyed a QP or CQ: the engine drops what it kept."""
        self.engine.object_destroyed(kind, num)

    def reset(self) -> None:
        """Function-level reset (or power off): the firmware forgets everything."""
        self.fw.reset()
        self.engine.reset()
        self.cmdq_addr = self._cmdq_h = 0

    # -- BAR decode -----------------------------------------------------------------
    def _read(self, off: int, n: int) -> bytes:
        if off < INIT_SEG_SIZE:
            return b"".join(struct.pack(">I", self._iseg_reg(word))
                            for word in range(off & ~3, off + n, 4))[off & 3:(off & 3) + n]
        memic = self._memic_offset(off, n, self.fw.bar_layout())
        if memic is not None:
            return bytes(self.fw.memic_data[memic:memic + n])
        return bytes(n)

    def _write(self, off: int, data: bytes) -> None:
        if off < INIT_SEG_SIZE:
            self._iseg_write(off, data)
            return
        bar = self.fw.bar_layout()
        memic = self._memic_offset(off, len(data), bar)
        if memic is not None:
            self.fw.memic_data[memic:memic + len(data)] = data
        else:
            self._uar_write(off, data, bar)

    # -- on-chip memory (MEMIC) --------------------------------------------------------
    def _memic_offset(self, off: int, n: int, bar: BarLayout) -> int | None:
        """Where a BAR access lands in the MEMIC window (None: below it).  Loads and
        stores reach the on-chip memory whether or not the piece is allocated, as
        the SRAM behind the BAR answers any address; the kernel maps only what
        ALLOC_MEMIC gave a context."""
        start, size = bar.memic_start, bar.memic_size
        if size and start <= off and off + n <= start + size:
            return off - start
        return None

    # -- initialisation segment ---------------------------------------------------
    def internal_timer(self) -> int:
        """The free-running 64-bit device clock (internal_timer_h:l), which also stamps
        every CQE: device_frequency_khz ticks per virtual millisecond.
        # EMU: it follows the scheduler's virtual clock (jiffies, HZ = 1000), so it
        # stands still while no task sleeps; it starts at 0 at power on."""
        return (self.machine.sched.jiffies * self.fw.cap("device_frequency_khz")) \
            & 0xFFFFFFFFFFFFFFFF

    def _iseg_reg(self, off: int) -> int:
        major, minor, sub = self.config.fw_rev()
        if off == 0x0:
            return minor << 16 | major
        if off == 0x4:
            return CMD_IF_REV << 16 | sub
        if off == 0x10:
            return self.cmdq_addr >> 32
        if off == 0x14:
            return (self.cmdq_addr & 0xFFFFF000) | CMDQ_LOG_SZ << 4 | CMDQ_LOG_STRIDE
        if off == 0x1FC:
            return 1 << 31 if self.initializing else 0
        if off in (0x1000, 0x1004):
            ticks = self.internal_timer()
            return ticks >> 32 if off == 0x1000 else ticks & 0xFFFFFFFF
        if off == 0x1010:
            self._health += 1
            return self._health
        return 0

    def _iseg_write(self, off: int, data: bytes) -> None:
        if len(data) != 4 or off & 3:
            self.device_errors.append(f"init segment write of {len(data)} bytes at {off:#x}")
            return
        val = struct.unpack(">I", data)[0]
        if off == 0x10:
            self._cmdq_h = val
        elif off == 0x14:
            self.cmdq_addr = self._cmdq_h << 32 | (val & 0xFFFFF000)
        elif off == 0x18:
            self._ring_cmd_doorbell(val)

    def _ring_cmd_doorbell(self, mask: int) -> None:
        entries = CmdqMemory.lookup(self.machine, self.cmdq_addr) if self.cmdq_addr else None
        if entries is None:
            self.device_errors.append(f"command doorbell {mask:#x} with no command queue at "
                                      f"{self.cmdq_addr:#x}")
            return
        pending = mask & ((1 << len(entries)) - 1)
        while pending:                    # each entry whose bit is set, lowest first
            low = pending & -pending
            pending ^= low
            idx = low.bit_length() - 1
            ent = entries[idx]
            if not ent.status_own & 1 or ent.in_ is None or ent.out is None:
                self.device_errors.append(f"command doorbell for entry {idx} not handed to "
                                          "hardware")
                ent.status_own = MLX5_CMD_DELIVERY_STAT_CMD_DESCR_ERR << 1
                continue
            self.fw.execute(ent.in_, ent.out)
            ent.status_own = 0  # delivered; ownership back to software

    # -- UAR pages ---------------------------------------------------------------------
    def _uar_write(self, off: int, data: bytes, bar: BarLayout) -> None:
        size = bar.uar_page_size
        uar, page_off = off // size, off % size
        rec = self._classify(bar, uar, page_off, bytes(data))
        self.uar_log.append(rec)
        if not rec.valid:
            self.device_errors.append(f"write to UAR {uar:#x} (offset {page_off:#x}, "
                                      f"{len(data)} bytes), which the firmware has not "
                                      "allocated")
            return
        for hook in list(self.doorbell_hooks):
            hook(self, rec)

    def _classify(self, bar: BarLayout, uar: int, off: int, data: bytes) -> UarWrite:
        valid = self.fw.state == "initialized" and self.fw.uar_of(uar, bar) is not None
        bf_size = bar.bf_reg_size
        if off == CQ_DOORBELL and len(data) == 8:
            return UarWrite(uar, off, data, "cq_db", valid=valid)
        if off in (EQ_DOORBELL_ARM, EQ_DOORBELL_CI) and len(data) == 4:
            return UarWrite(uar, off, data, "eq_db", valid=valid)
        if BF_OFFSET <= off < BF_OFFSET + NUM_BFREGS * bf_size:
            reg, within = divmod(off - BF_OFFSET, bf_size)
            buf, at = divmod(within, bf_size // 2)
            kind = "db" if len(data) == 8 and at == 0 else "bf"
            return UarWrite(uar, off, data, kind, reg, buf, valid)
        return UarWrite(uar, off, data, "reserved", valid=valid)


def _leak_check(machine: Machine) -> list[str]:
    """Device errors and firmware objects drivers left behind, on every HCA."""
    out: list[str] = []
    for hca in getattr(machine, "hcas", []):
        out += [f"mlx5 {hca.name}: device error: {e}" for e in hca.device_errors]
        out += [f"mlx5 {line}" for line in hca.fw.leaked]
        live = hca.fw.live_objects()
        if live:
            out.append(f"mlx5 {hca.name}: {len(live)} firmware object(s) still allocated: "
                       + "; ".join(map(repr, live)))
    return out
