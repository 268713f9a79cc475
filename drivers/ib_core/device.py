"""Mirrors drivers/infiniband/core/device.c: ib_device, its ops table, registration, clients.

A driver allocates its device (`ib_alloc_device(mlx5_ib_dev)`: the driver's
struct with struct ib_device embedded - here a subclass), fills one
`ib_device_ops` table, and calls ib_register_device().  Registration checks
the mandatory ops, caches the device attributes (ops.query_device) and each
port's immutable data (ops.get_port_immutable), sets up the GID tables
(cache.py: the default RoCE GIDs), publishes the sysfs files under
/sys/class/infiniband/<name>/, and then tells every registered
*client* (ib_uverbs is one: its add_one creates /dev/infiniband/uverbsN)
about the new device.  Unregistration removes the clients in reverse order.

The core reaches the driver only through `device.ops`; it never checks the
driver's type.

Per-machine state (the kernel's globals: the devices xarray, the client
list) lives in the ib_core module's state, so ib_core must be loaded first,
as modprobe guarantees for a module that needs its symbols.

Lock order: devices_rwsem -> clients_rwsem (EMU: registration runs in module
init/exit only, which the model never runs concurrently; the rwsems are not
modelled).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from drivers.ib_core.cache import ib_cache_cleanup_one, ib_cache_setup_one, ib_setup_gid_attrs
from drivers.ib_core.core_priv import _core  # noqa: F401 - ib_core's globals
from drivers.ib_core.ib_verbs import (  # noqa: F401 - port helpers re-exported
    IB_LINK_LAYER_ETHERNET,
    IB_LINK_LAYER_INFINIBAND,
    RDMA_NODE_IB_CA,
    ib_ah,
    ib_cq,
    ib_device_attr,
    ib_mw,
    ib_pd,
    ib_port_attr,
    ib_port_immutable,
    ib_qp,
    ib_rwq_ind_table,
    ib_srq,
    ib_ucontext,
    ib_udata,
    ib_xrcd,
    rdma_end_port,
    rdma_is_port_valid,
    rdma_start_port,
)
from drivers.ib_core.peer_mem import PeerMemState
from kernel_model.current import current
from kernel_model.errno import EEXIST, EINVAL, EOPNOTSUPP, KernelError
from kernel_model.sysfs import sysfs_create_file, sysfs_remove_dir
from kernel_model.trace import traced

D = TypeVar("D", bound="ib_device")

IB_DEVICE_NAME_MAX = 64


@attrs.define(eq=False)
class ib_device_ops:
    """Mirrors struct ib_device_ops: one table per driver (only what the model uses)."""

    owner: Any = None
    driver_id: int = 0
    uverbs_abi_ver: int = 0
    uverbs_no_driver_id_binding: int = 0
    # device and port
    query_device: Callable | None = None
    query_port: Callable | None = None
    query_pkey: Callable | None = None
    get_port_immutable: Callable | None = None
    get_link_layer: Callable | None = None
    get_dev_fw_str: Callable | None = None
    # user context and mmap
    alloc_ucontext: Callable | None = None
    dealloc_ucontext: Callable | None = None
    query_ucontext: Callable | None = None   # UVERBS_METHOD_QUERY_CONTEXT (ibv_import_device)
    mmap: Callable | None = None
    mmap_free: Callable | None = None
    disassociate_ucontext: Callable | None = None
    # objects
    alloc_pd: Callable | None = None
    dealloc_pd: Callable | None = None
    reg_user_mr: Callable | None = None
    reg_user_mr_dmabuf: Callable | None = None
    advise_mr: Callable | None = None
    rereg_user_mr: Callable | None = None
    dereg_mr: Callable | None = None
    alloc_mw: Callable | None = None
    dealloc_mw: Callable | None = None
    create_cq: Callable | None = None
    resize_cq: Callable | None = None
    destroy_cq: Callable | None = None
    create_qp: Callable | None = None
    modify_qp: Callable | None = None
    query_qp: Callable | None = None
    destroy_qp: Callable | None = None
    create_srq: Callable | None = None
    modify_srq: Callable | None = None
    query_srq: Callable | None = None
    destroy_srq: Callable | None = None
    alloc_xrcd: Callable | None = None
    dealloc_xrcd: Callable | None = None
    create_ah: Callable | None = None
    create_user_ah: Callable | None = None
    destroy_ah: Callable | None = None
    # receive work queues and RSS indirection tables (the extended WQ commands)
    create_wq: Callable | None = None
    modify_wq: Callable | None = None
    destroy_wq: Callable | None = None
    create_rwq_ind_table: Callable | None = None
    destroy_rwq_ind_table: Callable | None = None
    # the RoCE GID table (cache.c)
    add_gid: Callable | None = None
    del_gid: Callable | None = None
    # EMU: stands in for the port's net_device (get_netdev / dev_addr): its MAC
    get_port_mac: Callable | None = None
    # device memory (ib_uverbs_alloc_dm, ib_uverbs_reg_dm_mr)
    alloc_dm: Callable | None = None
    dealloc_dm: Callable | None = None
    reg_dm_mr: Callable | None = None
    # the driver's ioctl methods: (object_id, method_id) -> uverbs_api_ioctl_method
    # (EMU: the kernel chains uapi definition trees; see uverbs_ioctl.py)
    uapi_methods: dict | None = None
    # INIT_RDMA_OBJ_SIZE(): the driver's object types the core allocates
    size_ib_ucontext: type = ib_ucontext
    size_ib_pd: type = ib_pd
    size_ib_cq: type = ib_cq
    size_ib_qp: type = ib_qp
    size_ib_ah: type = ib_ah
    size_ib_mw: type = ib_mw
    size_ib_srq: type = ib_srq
    size_ib_xrcd: type = ib_xrcd
    size_ib_rwq_ind_table: type = ib_rwq_ind_table


# EMU: the kernel consumers' data path (post_send, post_recv, poll_cq, req_notify_cq,
# get_dma_mr) is not modelled, so those ops are not mandatory here
_MANDATORY = ("query_device", "query_port", "alloc_pd", "dealloc_pd", "create_qp",
              "modify_qp", "destroy_qp", "reg_user_mr", "dereg_mr", "create_cq",
              "destroy_cq", "get_port_immutable")


class ib_device:
    """Mirrors struct ib_device (embedded in the driver's struct: subclass it)."""

    def __init__(self) -> None:
        self.machine = current().machine
        self.name = ""
        self.ops = ib_device_ops()
        self.dev_parent: Any = None  # device.dev.parent: the PCI function's struct device
        self.dma_device: Any = None
        self.node_type = RDMA_NODE_IB_CA
        self.node_guid = 0
        self.phys_port_cnt = 0
        self.num_comp_vectors = 1
        self.attrs = ib_device_attr()
        self.port_data: dict[int, ib_port_immutable] = {}
        self.client_data: dict[str, Any] = {}
        self.gid_tables: dict[int, Any] = {}  # port -> ib_gid_table (port_data[].cache.gid)
        self.log: list[str] = []  # EMU: the device's dev_warn()/pr_warn() lines (no printk)
        self.registered = False
        self.index = -1

    def __repr__(self) -> str:
        state = "registered" if self.registered else "unregistered"
        return f"ib_device {self.name or '?'} {state} ports={self.phys_port_cnt}"

    @property
    def trace_name(self) -> str:
        return self.name


@attrs.define(eq=False)
class ib_client:
    """Mirrors struct ib_client: told of every device added and removed."""

    name: str
    add: Callable[[ib_device], None] | None = None
    remove: Callable[[ib_device, Any], None] | None = None


class IbCoreState:
    """ib_core's globals for one machine: the devices xarray and the clients list."""

    def __init__(self, ofed: tuple[int, int] = (25, 4)) -> None:
        self.devices: dict[str, ib_device] = {}
        self.clients: list[ib_client] = []
        self.next_index = 0
        # peer_mem.c's globals (part of ib_core here, as in OFED), for OFED release `ofed`
        self.peer = PeerMemState(ofed)

    def __repr__(self) -> str:
        return f"ib_core devices={list(self.devices)} clients={[c.name for c in self.clients]}"


def ib_alloc_device(cls: type[D]) -> D:
    """Mirrors ib_alloc_device(drv_struct, ibdev member): the driver's device object."""
    return cls()


def ib_dealloc_device(device: ib_device) -> None:
    """Mirrors ib_dealloc_device(): the device must be unregistered."""
    if device.registered:
        device.machine.report_bug("ib_dealloc_device", f"{device.name} still registered")


def ib_set_device_ops(device: ib_device, ops: ib_device_ops) -> None:
    """Mirrors ib_set_device_ops(): copy each op the driver provides and the
    device has not yet got (SET_DEVICE_OP), so stage-specific tables combine."""
    defaults = ib_device_ops()
    for field in attrs.fields(ib_device_ops):
        value = getattr(ops, field.name)
        if value != getattr(defaults, field.name) and \
                getattr(device.ops, field.name) == getattr(defaults, field.name):
            setattr(device.ops, field.name, value)


def rdma_zalloc_drv_obj(device: ib_device, kind: str, *args: Any) -> Any:
    """Mirrors rdma_zalloc_drv_obj(): a zeroed driver object of the size the
    driver declared for `kind` ("ib_pd", "ib_cq", "ib_qp", "ib_ucontext")."""
    return getattr(device.ops, "size_" + kind)(device, *args)


def _check_mandatory(device: ib_device) -> None:
    """Mirrors ib_device_check_mandatory(): WARN and fail on a missing op."""
    for name in _MANDATORY:
        if getattr(device.ops, name) is None:
            device.machine.report_bug("ib_device_check_mandatory",
                                      f"{device.name}: op {name} missing")
            raise KernelError(EINVAL, f"ib_device_check_mandatory: {device.name}: "
                              f"{name} missing")


def _alloc_name(core: IbCoreState, fmt: str) -> str:
    """Mirrors alloc_name(): the lowest free number for a "%d" pattern."""
    if "%d" not in fmt:
        if fmt in core.devices:
            raise KernelError(EEXIST, f"alloc_name: {fmt} exists")
        return fmt
    i = 0
    while fmt.replace("%d", str(i)) in core.devices:
        i += 1
    return fmt.replace("%d", str(i))


def _publish_sysfs(device: ib_device) -> None:
    """ib_setup_device_attrs() + the port attribute groups: the files
    ibv_devinfo reads (node_guid, fw_ver, hca_type, board_id, port state)."""
    base = f"/sys/class/infiniband/{device.name}"
    attrs_ = device.attrs

    def guid(v: int) -> str:
        return ":".join(f"{(v >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0)) + "\n"

    sysfs_create_file(f"{base}/node_type", lambda: f"{device.node_type}: CA\n")
    sysfs_create_file(f"{base}/node_guid", lambda: guid(device.node_guid))
    sysfs_create_file(f"{base}/sys_image_guid", lambda: guid(attrs_.sys_image_guid))
    fw = device.ops.get_dev_fw_str
    sysfs_create_file(f"{base}/fw_ver", lambda: (fw(device) if fw else "") + "\n")
    for name in ("hca_type", "hw_rev", "board_id"):
        show = getattr(device, "sysfs_" + name, None)
        if show is not None:
            sysfs_create_file(f"{base}/{name}", lambda s=show: s() + "\n")
    ib_setup_gid_attrs(device, base)
    for port, immutable in device.port_data.items():  # setup_port(): port_attr_group
        for name, show in (("state", show_port_state), ("phys_state", show_port_phys_state),
                           ("link_layer", show_port_link_layer)):
            sysfs_create_file(f"{base}/ports/{port}/{name}", lambda p=port, s=show: s(device, p))
        for i in range(immutable.pkey_tbl_len):  # and its pkeys/ group
            sysfs_create_file(f"{base}/ports/{port}/pkeys/{i}",
                              lambda p=port, i=i: show_port_pkey(device, p, i))


@traced
def ib_query_port(device: ib_device, port: int, attr: ib_port_attr) -> None:
    """Mirrors ib_query_port() (device.c): valid port, then ops.query_port into a
    zeroed attr."""
    if not rdma_is_port_valid(device, port):
        raise KernelError(EINVAL, f"ib_query_port: {device.name} has no port {port}")
    device.ops.query_port(device, port, attr)


#: sysfs.c's names for enum ib_port_state and the IBTA physical port states
_PORT_STATE_NAMES = {0: "NOP", 1: "DOWN", 2: "INIT", 3: "ARMED", 4: "ACTIVE", 5: "ACTIVE_DEFER"}
_PHYS_STATE_NAMES = {1: "Sleep", 2: "Polling", 3: "Disabled", 4: "PortConfigurationTraining",
                     5: "LinkUp", 6: "LinkErrorRecovery", 7: "Phy Test"}


def _port_attr(device: ib_device, port: int) -> ib_port_attr:
    attr = ib_port_attr()
    ib_query_port(device, port, attr)
    return attr


def show_port_state(device: ib_device, port: int) -> str:
    """Mirrors state_show() (sysfs.c): "4: ACTIVE"."""
    state = _port_attr(device, port).state
    return f"{state}: {_PORT_STATE_NAMES.get(state, 'UNKNOWN')}\n"


def show_port_phys_state(device: ib_device, port: int) -> str:
    """Mirrors phys_state_show() (sysfs.c): "5: LinkUp"."""
    phys = _port_attr(device, port).phys_state
    return f"{phys}: {_PHYS_STATE_NAMES.get(phys, 'Unknown')}\n"


def show_port_link_layer(device: ib_device, port: int) -> str:
    """Mirrors link_layer_show() (sysfs.c): "Ethernet" or "InfiniBand"."""
    ll = (device.ops.get_link_layer(device, port) if device.ops.get_link_layer
          else IB_LINK_LAYER_INFINIBAND)
    return "Ethernet\n" if ll == IB_LINK_LAYER_ETHERNET else "InfiniBand\n"


@traced
def ib_query_pkey(device: ib_device, port: int, index: int) -> int:
    """Mirrors ib_query_pkey(): EINVAL for a port the device lacks, EOPNOTSUPP
    without ops.query_pkey, else the driver's P_Key at index."""
    if not rdma_is_port_valid(device, port):
        raise KernelError(EINVAL, f"ib_query_pkey: {device.name} has no port {port}")
    if device.ops.query_pkey is None:
        raise KernelError(EOPNOTSUPP, f"ib_query_pkey: {device.name} has no query_pkey")
    return device.ops.query_pkey(device, port, index)


def show_port_pkey(device: ib_device, port: int, index: int) -> str:
    """Mirrors show_port_pkey() (sysfs.c): the P_Key as 0x%04x, or the query's error."""
    return f"0x{ib_query_pkey(device, port, index):04x}\n"


@traced
def ib_register_device(device: ib_device, name: str, dma_device: Any) -> None:
    """Mirrors ib_register_device(): name, check, cache attributes, publish, add clients.

    Failure unwinds what was done; the device stays unregistered.
    """
    core = _core()
    device.name = _alloc_name(core, name)
    device.dma_device = dma_device
    try:
        _check_mandatory(device)
        # setup_device(): cache the attributes the core answers from
        device.ops.query_device(device, device.attrs, ib_udata())
        for port in range(1, device.phys_port_cnt + 1):
            immutable = ib_port_immutable()
            device.ops.get_port_immutable(device, port, immutable)
            device.port_data[port] = immutable
        ib_cache_setup_one(device)
    except KernelError:
        device.name = ""
        raise
    core.devices[device.name] = device
    device.index = core.next_index
    core.next_index += 1
    _publish_sysfs(device)
    device.registered = True
    # enable_device_and_get(): every client learns of the device
    for client in core.clients:
        _add_client_context(device, client)


def _add_client_context(device: ib_device, client: ib_client) -> None:
    if client.add is not None:
        client.add(device)


@traced
def ib_unregister_device(device: ib_device) -> None:
    """Mirrors ib_unregister_device(): remove clients newest first, then unpublish."""
    core = _core()
    if not device.registered:
        raise KernelError(EINVAL, f"ib_unregister_device: {device.name} not registered")
    for client in reversed(core.clients):
        if client.remove is not None:
            client.remove(device, device.client_data.get(client.name))
        device.client_data.pop(client.name, None)
    sysfs_remove_dir(f"/sys/class/infiniband/{device.name}")
    ib_cache_cleanup_one(device)
    del core.devices[device.name]
    device.registered = False


@traced
def ib_register_client(client: ib_client) -> None:
    """Mirrors ib_register_client(): add it, then call add() for every device."""
    core = _core()
    core.clients.append(client)
    for device in list(core.devices.values()):
        _add_client_context(device, client)


@traced
def ib_unregister_client(client: ib_client) -> None:
    """Mirrors ib_unregister_client(): remove() on every device, then forget it."""
    core = _core()
    for device in list(core.devices.values()):
        if client.remove is not None:
            client.remove(device, device.client_data.get(client.name))
        device.client_data.pop(client.name, None)
    core.clients.remove(client)


def ib_set_client_data(device: ib_device, client: ib_client, data: Any) -> None:
    """Mirrors ib_set_client_data()."""
    device.client_data[client.name] = data


def ib_get_client_data(device: ib_device, client: ib_client) -> Any:
    """Mirrors ib_get_client_data()."""
    return device.client_data.get(client.name)


def ib_device_get_by_name(name: str) -> ib_device | None:
    """Mirrors ib_device_get_by_name() (without the reference)."""
    return _core().devices.get(name)
