"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/cmd.c: the firmware command interface.

mlx5_cmd_init() reads the command interface revision and queue geometry from
the initialisation segment, allocates the command queue page and programs
its address there (cmdq_addr_h, then cmdq_addr_l_sz).  mlx5_cmd_exec() puts
a command into a queue entry, hands the entry to hardware (status_own bit 0)
and rings the doorbell (cmd_dbell, one bit per entry); when the entry comes
back, the output's status decides: 0 is success, anything else becomes an
errno through cmd_status_to_err() and a message like the kernel's
mlx5_cmd_out_err():

    mlx5_cmd_out_err: CREATE_QP(0x500) op_mod(0x0) failed, status bad parameter(0x3),
    syndrome (0x1a2b3c), err(-22)

Every command, success or failure, hits the mlx5_cmd tracepoint.

# EMU: polling mode only, and the device completes the command inside the
# doorbell's MMIO write, so there is no completion EQE, no timeout wait and
# no command-entry semaphore: commands are serialised by one mutex (the
# kernel lets up to 31 run at once).  Inputs and outputs are IfcStructs
# carried whole in the entry (no mailbox chain); the queue page's contents
# are found by the device through mlx5_ifc.CmdqMemory.

Lock order: cmd.lock is a leaf (nothing else is taken while a command runs,
except the device's own work inside the MMIO write).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.ifc import (
    CMD_IF_REV,
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_CMD_NAMES,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_OUTP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_PKT_ERR,
    MLX5_CMD_STAT_BAD_QP_STATE_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR,
    MLX5_CMD_STAT_BAD_SYS_STATE_ERR,
    MLX5_CMD_STAT_INT_ERR,
    MLX5_CMD_STAT_IX_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_CMD_STAT_NO_RES_ERR,
    MLX5_CMD_STAT_NOT_READY,
    MLX5_CMD_STAT_OK,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_ISEG_CMD_DBELL,
    MLX5_ISEG_CMDIF_REV_FW_SUB,
    MLX5_ISEG_CMDQ_ADDR_H,
    MLX5_ISEG_CMDQ_ADDR_L_SZ,
    MLX5_MAX_COMMANDS,
    MLX5_PCI_CMD_XPORT,
    CmdqMemory,
    IfcStruct,
    mlx5_cmd_layout,
)
from kernel_model import trace
from kernel_model.current import current
from kernel_model.errno import (
    EAGAIN,
    EBUSY,
    EINVAL,
    EIO,
    ENOMEM,
    ENXIO,
    EREMOTEIO,
    ETIMEDOUT,
    KernelError,
)
from kernel_model.ioport import MachineCheck
from kernel_model.locking import mutex
from kernel_model.page_alloc import (
    __GFP_ZERO,
    GFP_KERNEL,
    __free_pages,
    alloc_pages,
    page,
    page_to_phys,
)
from kernel_model.pci import ioread32be, iowrite32be
from kernel_model.trace import traced, tracepoint

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev

trace_mlx5_cmd = tracepoint("mlx5_cmd", "command opcode op_mod status_str status syndrome err",
                            layer="mlx5_core")

# status -> (cmd_status_str, cmd_status_to_err)
_STATUS = {
    MLX5_CMD_STAT_OK: ("OK", 0),
    MLX5_CMD_STAT_INT_ERR: ("internal error", -EIO),
    MLX5_CMD_STAT_BAD_OP_ERR: ("bad operation", -EINVAL),
    MLX5_CMD_STAT_BAD_PARAM_ERR: ("bad parameter", -EINVAL),
    MLX5_CMD_STAT_BAD_SYS_STATE_ERR: ("bad system state", -EIO),
    MLX5_CMD_STAT_BAD_RES_ERR: ("bad resource", -EINVAL),
    MLX5_CMD_STAT_RES_BUSY: ("resource busy", -EBUSY),
    MLX5_CMD_STAT_NOT_READY: ("FW not ready", -EAGAIN),
    MLX5_CMD_STAT_LIM_ERR: ("limits exceeded", -ENOMEM),
    MLX5_CMD_STAT_BAD_RES_STATE_ERR: ("bad resource state", -EINVAL),
    MLX5_CMD_STAT_IX_ERR: ("bad index", -EINVAL),
    MLX5_CMD_STAT_NO_RES_ERR: ("no resources", -EAGAIN),
    MLX5_CMD_STAT_BAD_INP_LEN_ERR: ("bad input length", -EIO),
    MLX5_CMD_STAT_BAD_OUTP_LEN_ERR: ("bad output length", -EIO),
    MLX5_CMD_STAT_BAD_QP_STATE_ERR: ("bad QP state", -EINVAL),
    MLX5_CMD_STAT_BAD_PKT_ERR: ("bad packet (discarded)", -EINVAL),
    MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR: ("bad size too many outstanding CQEs", -EINVAL),
}


def cmd_status_str(status: int) -> str:
    """Mirrors cmd_status_str()."""
    return _STATUS.get(status, ("unknown status", 0))[0]


def cmd_status_to_err(status: int) -> int:
    """Mirrors cmd_status_to_err(): a command status as -errno (-EIO when unknown)."""
    return _STATUS.get(status, ("", -EIO))[1]


def mlx5_command_str(opcode: int) -> str:
    """Mirrors mlx5_command_str()."""
    return MLX5_CMD_NAMES.get(opcode, "unknown command opcode")


class mlx5_cmd:
    """Mirrors struct mlx5_cmd: queue geometry, the queue page and its entries."""

    #: partial-order reduction: two commands' token increments commute - nothing
    #: decides on a token's value (the firmware echoes it), and after both the counter
    #: and the entry hold the same value whichever went first
    POR_ADDS = ("token",)

    def __init__(self, log_sz: int, log_stride: int, pg: page, dma: int,
                 entries: list[mlx5_cmd_layout]):
        self.cmdif_rev = CMD_IF_REV
        self.log_sz, self.log_stride = log_sz, log_stride
        self.max_reg_cmds = (1 << log_sz) - 1  # the last entry is the page queue's
        self.cmd_alloc_buf, self.dma = pg, dma
        self.entries = entries
        self.lock = mutex("&cmd->vars.sem")
        self.token = 0

    def __repr__(self) -> str:
        return f"mlx5_cmd {1 << self.log_sz} entries at {self.dma:#x}"


@traced
def mlx5_cmd_init(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_cmd_init(): check the interface, allocate and program the queue."""
    rev = ioread32be(dev.iseg + MLX5_ISEG_CMDIF_REV_FW_SUB) >> 16
    if rev != CMD_IF_REV:
        raise KernelError(EINVAL, f"mlx5_cmd_init: driver cmdif rev({CMD_IF_REV}) differs "
                          f"from firmware's({rev})")
    cmd_l = ioread32be(dev.iseg + MLX5_ISEG_CMDQ_ADDR_L_SZ) & 0xFF
    log_sz, log_stride = cmd_l >> 4 & 0xF, cmd_l & 0xF
    if 1 << log_sz > MLX5_MAX_COMMANDS:
        raise KernelError(EINVAL, f"mlx5_cmd_init: firmware reports too many outstanding "
                          f"commands {1 << log_sz}")
    if log_sz + log_stride > MLX5_ADAPTER_PAGE_SHIFT:
        raise KernelError(EINVAL, "mlx5_cmd_init: command queue size overflow")
    # alloc_cmd_page(): EMU: dma_alloc_coherent is not modelled - a zeroed page
    # whose physical address is its DMA address
    pg = alloc_pages(GFP_KERNEL | __GFP_ZERO, 0, f"mlx5 cmdq {dev.priv.name}")
    dma = page_to_phys(pg)
    entries = [mlx5_cmd_layout() for _ in range(1 << log_sz)]
    CmdqMemory.publish(dev.pdev.machine, dma, entries)
    dev.cmd = mlx5_cmd(log_sz, log_stride, pg, dma, entries)
    iowrite32be(dma >> 32, dev.iseg + MLX5_ISEG_CMDQ_ADDR_H)
    iowrite32be(dma & 0xFFFFFFFF, dev.iseg + MLX5_ISEG_CMDQ_ADDR_L_SZ)


@traced
def mlx5_cmd_cleanup(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_cmd_cleanup(): free the queue page."""
    cmd, dev.cmd = dev.cmd, None
    if cmd is None:
        return
    CmdqMemory.withdraw(dev.pdev.machine, cmd.dma)
    __free_pages(cmd.cmd_alloc_buf, 0)


@traced
def mlx5_cmd_invoke(dev: mlx5_core_dev, in_: IfcStruct, out: IfcStruct) -> None:
    """Mirrors mlx5_cmd_invoke() + cmd_work_handler() in polling mode: one round trip."""
    cmd = dev.cmd
    opcode = MLX5_GET("mbox_in", in_, "opcode")
    if cmd is None:
        raise KernelError(ENXIO, f"mlx5_cmd_invoke: {mlx5_command_str(opcode)}: command "
                          "interface is down")
    with cmd.lock:
        idx = 0  # alloc_ent(): the first free entry (commands are serialised)
        ent = cmd.entries[idx]
        cmd.token = (cmd.token + 1) & 0xFF or 1
        ent.type, ent.in_, ent.out, ent.token = MLX5_PCI_CMD_XPORT, in_, out, cmd.token
        ent.status_own = 1  # CMD_OWNER_HW
        try:
            # EMU: the firmware runs the command inside this doorbell write (polling
            # mode) and the interface's lock is held around it, so the write is no
            # scheduling point of its own: a command is one step, lock to unlock, whose
            # footprint is what the firmware's handler touches (the lock, the entry
            # and the register file end it as they began it: Recording's silent writes)
            current().machine.phys_write(dev.iseg + MLX5_ISEG_CMD_DBELL,
                                         (1 << idx).to_bytes(4, "big"), point=False)
        except MachineCheck as e:  # the function is gone (hot-unplug): a PCI error
            raise KernelError(ENXIO, f"mlx5_cmd_invoke: {mlx5_command_str(opcode)}: {e}") \
                from None
        finally:
            own, ent.in_, ent.out = ent.status_own, None, None
    if own & 1:
        raise KernelError(ETIMEDOUT, f"mlx5_cmd_invoke: cmd[{idx}]: "
                          f"{mlx5_command_str(opcode)}({opcode:#x}) timeout")
    if own >> 1:
        raise KernelError(EIO, f"mlx5_cmd_invoke: cmd[{idx}]: {mlx5_command_str(opcode)}: "
                          f"delivery status {own >> 1:#x}")


@traced
def mlx5_cmd_do(dev: mlx5_core_dev, in_: IfcStruct, out: IfcStruct) -> int:
    """Mirrors mlx5_cmd_do(): 0, or -EREMOTEIO with the firmware's status left in `out`."""
    mlx5_cmd_invoke(dev, in_, out)
    status = MLX5_GET("mbox_out", out, "status")
    if trace.enabled:
        trace_mlx5_cmd(mlx5_command_str(MLX5_GET("mbox_in", in_, "opcode")),
                       MLX5_GET("mbox_in", in_, "opcode"), MLX5_GET("mbox_in", in_, "op_mod"),
                       cmd_status_str(status), status, MLX5_GET("mbox_out", out, "syndrome"),
                       cmd_status_to_err(status))
    return -EREMOTEIO if status != MLX5_CMD_STAT_OK else 0


def mlx5_cmd_out_err(dev: mlx5_core_dev, opcode: int, op_mod: int, out: IfcStruct) -> str:
    """Mirrors mlx5_cmd_out_err(): the kernel's line for a failed command."""
    status = MLX5_GET("mbox_out", out, "status")
    syndrome = MLX5_GET("mbox_out", out, "syndrome")
    return (f"mlx5_cmd_out_err: {mlx5_command_str(opcode)}({opcode:#x}) op_mod({op_mod:#x}) "
            f"failed, status {cmd_status_str(status)}({status:#x}), syndrome ({syndrome:#x}), "
            f"err({cmd_status_to_err(status)})")


@traced
def mlx5_cmd_check(dev: mlx5_core_dev, err: int, in_: IfcStruct, out: IfcStruct) -> None:
    """Mirrors mlx5_cmd_check(): turn a firmware status into -errno (raised)."""
    if err != -EREMOTEIO:
        return
    opcode = MLX5_GET("mbox_in", in_, "opcode")
    op_mod = MLX5_GET("mbox_in", in_, "op_mod")
    msg = mlx5_cmd_out_err(dev, opcode, op_mod, out)
    # cmd_status_print(): commands of user contexts (uid != 0) and DESTROY_MKEY stay quiet
    if not MLX5_GET("mbox_in", in_, "uid") and mlx5_command_str(opcode) != "DESTROY_MKEY":
        dev.log.append(f"mlx5_core {dev.priv.name}: {msg}")
    raise KernelError(-cmd_status_to_err(MLX5_GET("mbox_out", out, "status")), msg)


@traced
def mlx5_cmd_exec(dev: mlx5_core_dev, in_: IfcStruct, out: IfcStruct) -> None:
    """Mirrors mlx5_cmd_exec(): run a command; raise KernelError(-errno) if it failed."""
    mlx5_cmd_check(dev, mlx5_cmd_do(dev, in_, out), in_, out)


def mlx5_cmd_exec_inout(dev: mlx5_core_dev, in_: IfcStruct) -> IfcStruct:
    """Mirrors the mlx5_cmd_exec_inout() macro: the output structure comes with the input's."""
    out = IfcStruct(in_.typ[: -len("_in")] + "_out")
    mlx5_cmd_exec(dev, in_, out)
    return out


mlx5_cmd_exec_in = mlx5_cmd_exec_inout  # the output is there, the caller may ignore it
