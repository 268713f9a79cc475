"""pyverbs.device: devices, the device context and what it can be asked.

Mirrors rdma-core's pyverbs/device.pyx on the project's libibverbs: get_device_list()
reads sysfs as ibv_get_device_list() does, Context(name=...) opens the uverbs device
(ibv_open_device: the uverbs file, GET_CONTEXT, the UAR mmaps), and each query is the
verb of the same name, through the implicit host's process (userspace.pyverbs.host).
A failed verb raises PyverbsRDMAError with pyverbs' message and the errno.
"""

from __future__ import annotations

import errno
from typing import Any

import userspace.pyverbs.enums as e
from userspace.libibverbs import verbs as v
from userspace.pyverbs.addr import GID
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy, unsupported
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError


# -- devices --------------------------------------------------------------------------
class Device(PyverbsObject):
    """Mirrors pyverbs' Device: one ibv_device of the list (name is bytes)."""

    def __init__(self, name: bytes, guid: int, node_type: int, transport_type: int,
                 index: int = 0) -> None:
        super().__init__()
        self.name, self.guid, self.index = name, guid, index
        self.node_type, self.transport_type = node_type, transport_type

    def __str__(self) -> str:
        return (f"Device {self.name.decode()}, node type {translate_node_type(self.node_type)}, "
                f"transport type {translate_transport_type(self.transport_type)}, "
                f"guid {guid_format(self.guid)}")


def get_device_list() -> list[Device]:
    """Mirrors get_device_list(): ibv_get_device_list() of the host's process."""
    devs = v.ibv_get_device_list(current_process())
    return [Device(d.name.encode(), d.node_guid, e.IBV_NODE_CA, e.IBV_TRANSPORT_IB, i)
            for i, d in enumerate(devs)]


def rdma_get_devices() -> list[Device]:
    """Mirrors rdma_get_devices(): the same devices, as librdmacm lists them."""
    return get_device_list()


# -- attributes ---------------------------------------------------------------------
class _Wrapped(PyverbsObject):
    """A read-only view of a response struct: its fields are the properties."""

    _RENAMES: dict[str, str] = {}

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._raw, self._RENAMES.get(name, name))


def fw_version_str(raw_fw_ver: int) -> str:
    """mlx5_query_device's fw_ver: major.minor.subminor of the raw 64-bit value."""
    return f"{(raw_fw_ver >> 32) & 0xFFFF}.{(raw_fw_ver >> 16) & 0xFFFF}.{raw_fw_ver & 0xFFFF:04d}"


class DeviceAttr(_Wrapped):
    """Mirrors pyverbs' DeviceAttr (struct ibv_device_attr)."""

    _RENAMES = {"atomic_caps": "atomic_cap", "max_raw_ipv6_qps": "max_raw_ipv6_qp"}

    @property
    def fw_version(self) -> str:
        return fw_version_str(self._raw.fw_ver)

    def __str__(self) -> str:
        return (f"FW version: {self.fw_version}\nNode guid: {guid_format(self.node_guid)}\n"
                f"Vendor ID: {self.vendor_id:#x}\nVendor part ID: {self.vendor_part_id}\n"
                f"Max QP: {self.max_qp}\nPhys port count: {self.phys_port_cnt}")


class PortAttr(_Wrapped):
    """Mirrors pyverbs' PortAttr (struct ibv_port_attr)."""

    _RENAMES = {"port_cap_flags2": "port_cap_flags2"}

    def __str__(self) -> str:
        return (f"Port state: {port_state_to_str(self.state)}\n"
                f"Active MTU: {translate_mtu(self.active_mtu)}\n"
                f"Link layer: {translate_link_layer(self.link_layer)}")


# -- the context ----------------------------------------------------------------------
class Context(PyverbsCM):
    """Mirrors pyverbs' Context: ibv_open_device() of the device called `name`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__()
        name = kwargs.get("name")
        if name is None:
            raise PyverbsUserError("Device name must be provided")
        if isinstance(name, bytes):
            name = name.decode()
        self.proc = current_process()
        devs = [d for d in v.ibv_get_device_list(self.proc) if d.name == name]
        if not devs:
            raise PyverbsRDMAError(f"Failed to open device {name}", errno.ENODEV)
        self.device = devs[0]
        self.ctx = call(f"Failed to open device {name}", v.ibv_open_device, self.proc, devs[0])
        self._created()
        self.logger.debug(f"Context: opened device {name}")

    @property
    def context(self) -> Any:
        return self.ctx

    @property
    def name(self) -> str:
        return self.device.name

    @property
    def num_comp_vectors(self) -> int:
        return self.ctx.num_comp_vectors

    @property
    def cmd_fd(self) -> int:
        return self.ctx.cmd_fd

    def _free(self) -> None:
        self.logger.debug("Closing Context")
        destroy("Failed to close device", v.ibv_close_device, self.ctx)

    def query_device(self) -> DeviceAttr:
        self._check_open("query_device")
        return DeviceAttr(call("Failed to query device", v.ibv_query_device, self.ctx))

    def query_port(self, port_num: int) -> PortAttr:
        self._check_open("query_port")
        return PortAttr(call(f"Failed to query port {port_num}", v.ibv_query_port,
                             self.ctx, port_num))

    def query_gid(self, port_num: int, index: int) -> Any:
        raw = call("Failed to query gid", v.ibv_query_gid, self.ctx, port_num, index)
        return GID(raw)

    def query_device_ex(self, ex_input: Any = None) -> Any:
        raise unsupported("Failed to query EX device")

    def query_pkey(self, port_num: int, index: int) -> int:
        raise unsupported(f"Failed to query pkey {index} of port {port_num}")

    def query_gid_type(self, port_num: int, index: int) -> int:
        """ibv_query_gid_type(): e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1 or _ROCE_V2."""
        self._check_open("query_gid_type")
        return call("Failed to query gid type of index {index}", v.ibv_query_gid_type,
                    self.ctx, port_num, index)

    def query_gid_table(self, max_entries: int, flags: int = 0) -> list:
        raise unsupported("Failed to query gid table")

    def query_gid_ex(self, port_num: int, gid_index: int, flags: int = 0) -> Any:
        raise unsupported("Failed to query gid ex")

    def query_rt_values_ex(self, comp_mask: int = 0) -> Any:
        raise unsupported("Failed to query rt values")

    def get_async_event(self) -> Any:
        raise unsupported("Failed to get async event")


class DM(PyverbsCM):
    """Mirrors pyverbs' DM (ibv_alloc_dm): the emulated ConnectX has no MEMIC."""

    def __init__(self, context: Context, dm_attr: Any = None, **kwargs: Any) -> None:
        super().__init__()
        raise unsupported("Failed to allocate device memory")


class AllocDmAttr(PyverbsObject):
    """Mirrors pyverbs' AllocDmAttr (struct ibv_alloc_dm_attr)."""

    def __init__(self, length: int, log_align_req: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.length, self.log_align_req, self.comp_mask = length, log_align_req, comp_mask


# -- translations, as pyverbs prints them -----------------------------------------------
def _name(table: dict[int, str], value: int) -> str:
    return table.get(value, f"Invalid value {value}")


def translate_node_type(node_type: int) -> str:
    return _name({e.IBV_NODE_CA: "CA", e.IBV_NODE_SWITCH: "Switch", e.IBV_NODE_ROUTER: "Router",
                  e.IBV_NODE_RNIC: "RNIC", e.IBV_NODE_USNIC: "usNIC",
                  e.IBV_NODE_USNIC_UDP: "usNIC UDP", e.IBV_NODE_UNSPECIFIED: "Unspecified"},
                 node_type)


def translate_transport_type(transport_type: int) -> str:
    return _name({e.IBV_TRANSPORT_IB: "IB", e.IBV_TRANSPORT_IWARP: "IWARP",
                  e.IBV_TRANSPORT_USNIC: "usNIC", e.IBV_TRANSPORT_USNIC_UDP: "usNIC UDP",
                  e.IBV_TRANSPORT_UNSPECIFIED: "Unspecified"}, transport_type)


def translate_mtu(mtu: int) -> str:
    return _name({1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}, mtu)


def translate_link_layer(ll: int) -> str:
    return _name({e.IBV_LINK_LAYER_UNSPECIFIED: "Unspecified",
                  e.IBV_LINK_LAYER_INFINIBAND: "InfiniBand",
                  e.IBV_LINK_LAYER_ETHERNET: "Ethernet"}, ll)


def port_state_to_str(state: int) -> str:
    return _name({0: "NOP", 1: "Down", 2: "Init", 3: "Armed", 4: "Active", 5: "Active defer"},
                 state)


def phys_state_to_str(state: int) -> str:
    return _name({1: "Sleep", 2: "Polling", 3: "Disabled", 4: "Port configuration training",
                  5: "Link up", 6: "Link error recovery", 7: "Phy test"}, state)


def width_to_str(width: int) -> str:
    return _name({1: "1X", 2: "4X", 4: "8X", 8: "12X", 16: "2X"}, width)


def speed_to_str(speed: int) -> str:
    return _name({0: "0.0 Gbps", 1: "2.5 Gbps", 2: "5.0 Gbps", 4: "5.0 Gbps", 8: "10.0 Gbps",
                  16: "14.0 Gbps", 32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps",
                  256: "200.0 Gbps"}, speed)


def translate_gid_type(gid_type: int) -> str:
    return _name({0: "IB/RoCE v1", 1: "RoCE v2"}, gid_type)


def guid_format(num: int) -> str:
    """The GUID as ibv_devinfo prints it: four 16-bit groups, byte-swapped."""
    raw = num.to_bytes(8, "little").hex()
    return ":".join(raw[i:i + 4] for i in range(0, 16, 4))


def guid_to_hex(guid: str) -> int:
    """The inverse of guid_format."""
    return int.from_bytes(bytes.fromhex(guid.replace(":", "")), "little")


def str_from_flags(flags: int, dictionary: dict[int, str]) -> str:
    return " ".join(name for bit, name in dictionary.items() if flags & bit)


__all__ = ["AllocDmAttr", "Context", "DM", "Device", "DeviceAttr", "PortAttr", "PyverbsError",
           "PyverbsRDMAError", "PyverbsUserError", "get_device_list", "rdma_get_devices"]
