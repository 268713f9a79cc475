"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/main.c (+ dev.c): probe and remove.

probe_one() allocates the mlx5_core_dev and runs mlx5_init_one(), a table of
init/cleanup pairs (MLX5_INIT_STAGES) executed in order and unwound in
reverse - on a failing stage, only the stages before it; at remove, all:

    pci           enable the function, bus mastering, 64-bit DMA, 2 GiB segments, map iseg
    fw_pre_init   wait until the firmware leaves its initializing state
    cmd           the command interface
    enable_hca    ENABLE_HCA                                / DISABLE_HCA
    set_hca_cap   QUERY_HCA_CAP max+cur, SET_HCA_CAP (handle_hca_cap)
    init_hca      INIT_HCA                                  / TEARDOWN_HCA
    query_caps    QUERY_HCA_CAP of every type the device has
    board_id      QUERY_ADAPTER
    uars_page     the core's own UAR                        / DEALLOC_UAR
    eq_table      the async EQ, completion EQs              / DESTROY_EQ
    events        async events forwarded to the interfaces  / unhooked
    hca_defaults  local loopback off (Ethernet)
    register      the auxiliary device "mlx5_core.rdma.<n>" / removed

The real function splits these over mlx5_pci_init, mlx5_function_setup,
mlx5_init_once, mlx5_load and mlx5_register_device, in the same order.
# EMU: ISSI negotiation, boot/init page supply (MANAGE_PAGES), the host
# endianness register, health polling, devlink and the netdev ("eth"
# auxiliary device) are not modelled.

handle_hca_cap() writes the capabilities with SET_HCA_CAP, as the kernel
does: P_Key table 128 entries, log_max_qp from the profile (capped by the
device), checksum off, uar_4k on only if the device supports it AND
PAGE_SIZE > 4096, log_uar_page_sz = PAGE_SHIFT - 12, 128-byte cache lines
only on hosts that have them.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from drivers.mlx5_core.cmd import mlx5_cmd_cleanup, mlx5_cmd_exec, mlx5_cmd_init
from drivers.mlx5_core.driver import (
    MLX5_CAP_GEN,
    MLX5_CAP_GEN_MAX,
    MLX5_DEVICE_STATE_UNINITIALIZED,
    MLX5_DEVICE_STATE_UP,
    MLX5_PROF_MASK_QP_SIZE,
    fw_rev_maj,
    fw_rev_min,
    fw_rev_sub,
    mlx5_core_dev,
    mlx5_core_warn,
)
from drivers.mlx5_core.eq import mlx5_eq_table_create, mlx5_eq_table_destroy
from drivers.mlx5_core.events import mlx5_events_start, mlx5_events_stop
from drivers.mlx5_core.ifc import (
    HCA_CAP_OPMOD_GET_CUR,
    HCA_CAP_OPMOD_GET_MAX,
    MLX5_ADDR_OF,
    MLX5_CAP_DEV_MEM,
    MLX5_CAP_ETHERNET_OFFLOADS,
    MLX5_CAP_GENERAL,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CAP_ROCE,
    MLX5_CMD_OP_DISABLE_HCA,
    MLX5_CMD_OP_ENABLE_HCA,
    MLX5_CMD_OP_INIT_HCA,
    MLX5_CMD_OP_QUERY_ADAPTER,
    MLX5_CMD_OP_QUERY_HCA_CAP,
    MLX5_CMD_OP_SET_HCA_CAP,
    MLX5_CMD_OP_TEARDOWN_HCA,
    MLX5_INIT_SEG_SIZE,
    MLX5_ISEG_INITIALIZING,
    MLX5_SET,
    MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE,
    IfcStruct,
    memcpy_ifc,
)
from drivers.mlx5_core.uar import mlx5_get_uars_page, mlx5_put_uars_page
from drivers.mlx5_core.vport import mlx5_nic_vport_update_local_lb
from kernel_model.auxiliary import (
    auxiliary_device,
    auxiliary_device_add,
    auxiliary_device_delete,
    auxiliary_device_init,
    auxiliary_device_uninit,
)
from kernel_model.current import current
from kernel_model.dma import DMA_BIT_MASK, dma_set_mask_and_coherent, dma_set_max_seg_size
from kernel_model.errno import ENODEV, ETIMEDOUT, KernelError
from kernel_model.locking import msleep
from kernel_model.pci import (
    IORESOURCE_MEM,
    ioread32be,
    ioremap,
    iounmap,
    pci_clear_master,
    pci_disable_device,
    pci_enable_device,
    pci_get_drvdata,
    pci_resource_flags,
    pci_resource_start,
    pci_set_drvdata,
    pci_set_master,
)
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.pci import pci_dev

DRIVER_NAME = "mlx5_core"
FW_PRE_INIT_TIMEOUT_MILI = 120000
FW_PRE_INIT_WAIT_MILI = 120
L1_CACHE_BYTES = 64  # arch/x86: cache_line_size()
#: the functions mlx5_core drives (pci_device_id table, a subset)
MLX5_CORE_PCI_TABLE = [(0x15B3, d) for d in (0x1013, 0x1015, 0x1017, 0x1019, 0x101B, 0x101D,
                                             0x101F, 0x1021, 0xA2D6)]


# -- pci -----------------------------------------------------------------------------------
@traced
def mlx5_pci_init(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_pci_init(): enable, request BAR0, bus master, DMA caps, map iseg."""
    pdev = dev.pdev
    dev.bar_addr = pci_resource_start(pdev, 0)
    pci_enable_device(pdev)
    try:
        if not pci_resource_flags(pdev, 0) & IORESOURCE_MEM:  # request_bar()
            raise KernelError(ENODEV, "mlx5_pci_init: missing registers BAR, aborting")
        pci_set_master(pdev)
        set_dma_caps(pdev)
        dev.iseg_base = dev.bar_addr
        dev.iseg = ioremap(dev.iseg_base, MLX5_INIT_SEG_SIZE)
    except BaseException:
        pci_clear_master(pdev)   # err_clr_master:
        pci_disable_device(pdev)  # err_disable:
        raise


def set_dma_caps(pdev: pci_dev) -> None:
    """Mirrors set_dma_caps(): 64-bit masks (32-bit fallback), 2 GiB DMA segments."""
    try:
        dma_set_mask_and_coherent(pdev.dev, DMA_BIT_MASK(64))
    except KernelError:
        dma_set_mask_and_coherent(pdev.dev, DMA_BIT_MASK(32))
    dma_set_max_seg_size(pdev.dev, 2 * 1024 * 1024 * 1024)


@traced
def mlx5_pci_close(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_pci_close()."""
    iounmap(dev.iseg)
    pci_clear_master(dev.pdev)
    pci_disable_device(dev.pdev)


@traced
def wait_fw_init(dev: mlx5_core_dev) -> None:
    """Mirrors wait_fw_init(): poll the initializing bit (ETIMEDOUT after 120 s)."""
    waited = 0
    while ioread32be(dev.iseg + MLX5_ISEG_INITIALIZING) >> 31:
        if waited >= FW_PRE_INIT_TIMEOUT_MILI:
            raise KernelError(ETIMEDOUT, f"wait_fw_init: firmware over {waited} ms in "
                              "pre-initializing state, aborting")
        msleep(FW_PRE_INIT_WAIT_MILI)
        waited += FW_PRE_INIT_WAIT_MILI


# -- HCA lifecycle commands --------------------------------------------------------------
def _simple_cmd(dev: mlx5_core_dev, typ: str, opcode: int, **fields: int) -> IfcStruct:
    in_, out = IfcStruct(f"{typ}_in"), IfcStruct(f"{typ}_out")
    MLX5_SET(f"{typ}_in", in_, "opcode", opcode)
    for field, value in fields.items():
        MLX5_SET(f"{typ}_in", in_, field, value)
    mlx5_cmd_exec(dev, in_, out)
    return out


@traced
def mlx5_core_enable_hca(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_core_enable_hca(dev, 0)."""
    _simple_cmd(dev, "enable_hca", MLX5_CMD_OP_ENABLE_HCA, function_id=0)


@traced
def mlx5_core_disable_hca(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_core_disable_hca(dev, 0)."""
    _simple_cmd(dev, "disable_hca", MLX5_CMD_OP_DISABLE_HCA, function_id=0)


@traced
def mlx5_cmd_init_hca(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_cmd_init_hca()."""
    _simple_cmd(dev, "init_hca", MLX5_CMD_OP_INIT_HCA)


@traced
def mlx5_cmd_teardown_hca(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_cmd_teardown_hca() (graceful profile)."""
    _simple_cmd(dev, "teardown_hca", MLX5_CMD_OP_TEARDOWN_HCA)


@traced
def mlx5_core_get_caps_mode(dev: mlx5_core_dev, cap_type: int, cap_mode: int) -> None:
    """Mirrors mlx5_core_get_caps_mode(): QUERY_HCA_CAP into caps.hca[type].cur/max."""
    out = _simple_cmd(dev, "query_hca_cap", MLX5_CMD_OP_QUERY_HCA_CAP,
                      op_mod=cap_type << 1 | cap_mode)
    page = dev.caps[cap_type].cur if cap_mode == HCA_CAP_OPMOD_GET_CUR else \
        dev.caps[cap_type].max
    memcpy_ifc(page, MLX5_ADDR_OF("query_hca_cap_out", out, "capability"))


@traced
def mlx5_core_get_caps(dev: mlx5_core_dev, cap_type: int) -> None:
    """Mirrors mlx5_core_get_caps(): the maximum, then the current page."""
    mlx5_core_get_caps_mode(dev, cap_type, HCA_CAP_OPMOD_GET_MAX)
    mlx5_core_get_caps_mode(dev, cap_type, HCA_CAP_OPMOD_GET_CUR)


def to_fw_pkey_sz(dev: mlx5_core_dev, size: int) -> int:
    """Mirrors to_fw_pkey_sz(): 128 << n entries -> n."""
    table = {128: 0, 256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
    if size not in table:
        mlx5_core_warn(dev, f"invalid pkey table size {size}")
        return 0
    return table[size]


@traced
def handle_hca_cap(dev: mlx5_core_dev, set_ctx: IfcStruct) -> None:
    """Mirrors handle_hca_cap(): adjust the current general caps, SET_HCA_CAP them."""
    mlx5_core_get_caps(dev, MLX5_CAP_GENERAL)
    cap = MLX5_ADDR_OF("set_hca_cap_in", set_ctx, "capability")
    memcpy_ifc(cap, dev.caps[MLX5_CAP_GENERAL].cur)
    MLX5_SET("cmd_hca_cap", cap, "pkey_table_size", to_fw_pkey_sz(dev, 128))
    prof = dev.profile
    if MLX5_CAP_GEN_MAX(dev, "log_max_qp") < prof.log_max_qp:
        mlx5_core_warn(dev, f"log_max_qp value in current profile is {prof.log_max_qp}, "
                       "changing it to HCA capability limit "
                       f"({MLX5_CAP_GEN_MAX(dev, 'log_max_qp')})")
        prof.log_max_qp = MLX5_CAP_GEN_MAX(dev, "log_max_qp")
    if prof.mask & MLX5_PROF_MASK_QP_SIZE:
        MLX5_SET("cmd_hca_cap", cap, "log_max_qp", prof.log_max_qp)
    MLX5_SET("cmd_hca_cap", cap, "cmdif_checksum", 0)  # disable cmdif checksum
    machine = current().machine
    # 4K UARs only when the HCA supports them and the page is bigger than 4 KiB
    if MLX5_CAP_GEN_MAX(dev, "uar_4k") and machine.page_size > 4096:
        MLX5_SET("cmd_hca_cap", cap, "uar_4k", 1)
    MLX5_SET("cmd_hca_cap", cap, "log_uar_page_sz", machine.page_shift - 12)
    if MLX5_CAP_GEN_MAX(dev, "cache_line_128byte"):
        MLX5_SET("cmd_hca_cap", cap, "cache_line_128byte", int(L1_CACHE_BYTES >= 128))
    if MLX5_CAP_GEN_MAX(dev, "dct"):
        MLX5_SET("cmd_hca_cap", cap, "dct", 1)
    if MLX5_CAP_GEN_MAX(dev, "num_vhca_ports"):
        MLX5_SET("cmd_hca_cap", cap, "num_vhca_ports", MLX5_CAP_GEN_MAX(dev, "num_vhca_ports"))
    if MLX5_CAP_GEN_MAX(dev, "mkey_by_name"):
        MLX5_SET("cmd_hca_cap", cap, "mkey_by_name", 1)
    MLX5_SET("set_hca_cap_in", set_ctx, "opcode", MLX5_CMD_OP_SET_HCA_CAP)  # set_caps()
    MLX5_SET("set_hca_cap_in", set_ctx, "op_mod", MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE << 1)
    mlx5_cmd_exec(dev, set_ctx, IfcStruct("set_hca_cap_out"))


@traced
def set_hca_cap(dev: mlx5_core_dev) -> None:
    """Mirrors set_hca_cap(): the general capabilities (atomic/ODP/RoCE ones not modelled)."""
    handle_hca_cap(dev, IfcStruct("set_hca_cap_in"))


@traced
def mlx5_query_hca_caps(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_query_hca_caps(): every capability type the device reports."""
    mlx5_core_get_caps(dev, MLX5_CAP_GENERAL)
    if MLX5_CAP_GEN(dev, "eth_net_offloads"):
        mlx5_core_get_caps(dev, MLX5_CAP_ETHERNET_OFFLOADS)
    if MLX5_CAP_GEN(dev, "roce"):
        mlx5_core_get_caps(dev, MLX5_CAP_ROCE)
    if MLX5_CAP_GEN(dev, "device_memory"):  # only the current page, as upstream asks
        mlx5_core_get_caps_mode(dev, MLX5_CAP_DEV_MEM, HCA_CAP_OPMOD_GET_CUR)


@traced
def mlx5_query_board_id(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_query_board_id(): QUERY_ADAPTER's PSID."""
    out = _simple_cmd(dev, "query_adapter", MLX5_CMD_OP_QUERY_ADAPTER)
    psid = MLX5_ADDR_OF("query_adapter_out", out, "query_adapter_struct.vsd_contd_psid")
    dev.board_id = bytes(psid).rstrip(b"\0").decode()


# -- load: the core's own resources ---------------------------------------------------------
@traced
def mlx5_alloc_priv_uar(dev: mlx5_core_dev) -> None:
    """mlx5_load(): dev->priv.uar = mlx5_get_uars_page(dev)."""
    dev.priv.uar = mlx5_get_uars_page(dev)


@traced
def mlx5_free_priv_uar(dev: mlx5_core_dev) -> None:
    """mlx5_unload(): mlx5_put_uars_page(dev, dev->priv.uar)."""
    up, dev.priv.uar = dev.priv.uar, None
    mlx5_put_uars_page(dev, up)


@traced
def mlx5_core_set_hca_defaults(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_core_set_hca_defaults(): local loopback off on Ethernet."""
    if MLX5_CAP_GEN(dev, "port_type") == MLX5_CAP_PORT_TYPE_ETH:
        mlx5_nic_vport_update_local_lb(dev, False)


# -- the auxiliary device (dev.c) -------------------------------------------------------------
class mlx5_adev(auxiliary_device):
    """Mirrors struct mlx5_adev: the auxiliary device and the mdev it serves."""

    def __init__(self, machine: Machine, mdev: mlx5_core_dev, name: str, idx: int):
        super().__init__(machine, name, idx, parent=mdev.device, release=adev_release)
        self.mdev, self.idx = mdev, idx


_adev_ida: weakref.WeakKeyDictionary[Machine, set[int]] = weakref.WeakKeyDictionary()


def mlx5_adev_idx_alloc(machine: Machine) -> int:
    """Mirrors mlx5_adev_idx_alloc(): the lowest free index (one ida per machine)."""
    used = _adev_ida.setdefault(machine, set())
    idx = next(i for i in range(len(used) + 1) if i not in used)
    used.add(idx)
    return idx


def mlx5_adev_idx_free(machine: Machine, idx: int) -> None:
    """Mirrors mlx5_adev_idx_free()."""
    _adev_ida.get(machine, set()).discard(idx)


def adev_release(adev: auxiliary_device) -> None:
    """Mirrors adev_release(): the last reference frees the mlx5_adev."""
    adev.mdev.priv.adev.pop(adev.name, None)
    kfree(adev)


@traced
def mlx5_register_device(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_register_device() -> add_adev(dev, "rdma"): mlx5_ib binds to it."""
    machine = current().machine
    dev.priv.adev_idx = mlx5_adev_idx_alloc(machine)
    adev = kmalloc_obj(mlx5_adev(machine, dev, "rdma", dev.priv.adev_idx))
    try:
        auxiliary_device_init(adev)
    except BaseException:
        kfree(adev)
        mlx5_adev_idx_free(machine, dev.priv.adev_idx)
        raise
    try:
        auxiliary_device_add(adev, DRIVER_NAME)
    except BaseException:
        auxiliary_device_uninit(adev)  # release() frees it
        mlx5_adev_idx_free(machine, dev.priv.adev_idx)
        raise
    dev.priv.adev["rdma"] = adev


@traced
def mlx5_unregister_device(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_unregister_device() -> del_adev(): mlx5_ib's remove runs here."""
    adev = dev.priv.adev.get("rdma")
    if adev is not None:
        auxiliary_device_delete(adev)
        auxiliary_device_uninit(adev)
    mlx5_adev_idx_free(current().machine, dev.priv.adev_idx)


# -- the stage table ---------------------------------------------------------------------
@attrs.frozen
class mlx5_stage:
    """One init/cleanup pair of mlx5_init_one()."""

    name: str
    init: Callable[[mlx5_core_dev], None]
    cleanup: Callable[[mlx5_core_dev], None] | None = None


MLX5_INIT_STAGES: tuple[mlx5_stage, ...] = (
    mlx5_stage("pci", mlx5_pci_init, mlx5_pci_close),
    mlx5_stage("fw_pre_init", wait_fw_init),
    mlx5_stage("cmd", mlx5_cmd_init, mlx5_cmd_cleanup),
    mlx5_stage("enable_hca", mlx5_core_enable_hca, mlx5_core_disable_hca),
    mlx5_stage("set_hca_cap", set_hca_cap),
    mlx5_stage("init_hca", mlx5_cmd_init_hca, mlx5_cmd_teardown_hca),
    mlx5_stage("query_caps", mlx5_query_hca_caps),
    mlx5_stage("board_id", mlx5_query_board_id),
    mlx5_stage("uars_page", mlx5_alloc_priv_uar, mlx5_free_priv_uar),
    mlx5_stage("eq_table", mlx5_eq_table_create, mlx5_eq_table_destroy),
    mlx5_stage("events", mlx5_events_start, mlx5_events_stop),
    mlx5_stage("hca_defaults", mlx5_core_set_hca_defaults),
    mlx5_stage("register", mlx5_register_device, mlx5_unregister_device),
)


def _unwind(dev: mlx5_core_dev) -> None:
    """Run the cleanups of the stages done, newest first; a failing one is only logged."""
    while dev.priv.stages_done:
        dev.priv.stages_done -= 1
        stage = MLX5_INIT_STAGES[dev.priv.stages_done]
        if stage.cleanup is None:
            continue
        try:
            stage.cleanup(dev)
        except KernelError as e:
            mlx5_core_warn(dev, f"{stage.name} cleanup failed: {e}")


@traced
def mlx5_init_one(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_init_one(): every stage in order; a failure unwinds the done ones."""
    for stage in MLX5_INIT_STAGES:
        try:
            stage.init(dev)
        except BaseException as e:
            mlx5_core_warn(dev, f"{stage.name} failed: {e}")
            _unwind(dev)
            raise
        dev.priv.stages_done += 1
        if stage.name == "fw_pre_init":  # mlx5_function_setup() prints it first
            mlx5_core_warn(dev, f"firmware version: {fw_rev_maj(dev)}.{fw_rev_min(dev)}."
                           f"{fw_rev_sub(dev)}")
    dev.state = MLX5_DEVICE_STATE_UP


@traced
def mlx5_uninit_one(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_uninit_one(): every stage's cleanup, newest first."""
    dev.state = MLX5_DEVICE_STATE_UNINITIALIZED
    _unwind(dev)


# -- the pci_driver callbacks --------------------------------------------------------------
@traced
def probe_one(pdev: pci_dev, id: tuple[int, int]) -> int:
    """Mirrors probe_one(): allocate the mlx5_core_dev and bring the function up."""
    dev = kmalloc_obj(mlx5_core_dev(pdev))
    pci_set_drvdata(pdev, dev)
    try:
        mlx5_init_one(dev)
    except BaseException:
        pci_set_drvdata(pdev, None)  # err_init_one / err_devlink:
        kfree(dev)
        raise
    return 0


@traced
def remove_one(pdev: pci_dev) -> None:
    """Mirrors remove_one(): everything probe_one built, in reverse."""
    dev = pci_get_drvdata(pdev)
    mlx5_uninit_one(dev)
    pci_set_drvdata(pdev, None)
    kfree(dev)
