"""pyverbs.device: devices, the device context and what it can be asked.

Mirrors rdma-core's pyverbs/device.pyx on the project's libibverbs: get_device_list()
reads sysfs as ibv_get_device_list() does, Context(name=...) opens the uverbs device
(ibv_open_device: the uverbs file, GET_CONTEXT, the UAR mmaps), and each query is the
verb of the same name, through the implicit host's process (userspace.pyverbs.host).
A failed verb raises PyverbsRDMAError with pyverbs' message and the errno.
"""

from __future__ import annotations

import errno
import os
import weakref
from typing import Any

import userspace.pyverbs.enums as e
from userspace import libc
from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_async as va
from userspace.pyverbs.addr import GID
from userspace.pyverbs.base import (
    PyverbsCM,
    PyverbsObject,
    call,
    destroy,
    set_errno,
)
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsError, PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.utils import gid_str


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


class QueryDeviceExInput(PyverbsObject):
    """Mirrors pyverbs' QueryDeviceExInput (struct ibv_query_device_ex_input)."""

    def __init__(self, comp_mask: int) -> None:
        super().__init__()
        self.comp_mask = comp_mask


class ODPCaps(_Wrapped):
    """Mirrors pyverbs' ODPCaps (struct ibv_odp_caps, plus the device's xrc_odp_caps)."""

    def __init__(self, raw: Any, xrc_odp_caps: int = 0) -> None:
        super().__init__(raw)
        self.xrc_odp_caps = xrc_odp_caps

    def __str__(self) -> str:
        general = {e.IBV_ODP_SUPPORT: "IBV_ODP_SUPPORT",
                   e.IBV_ODP_SUPPORT_IMPLICIT: "IBV_ODP_SUPPORT_IMPLICIT"}
        per = {e.IBV_ODP_SUPPORT_SEND: "IBV_ODP_SUPPORT_SEND",
               e.IBV_ODP_SUPPORT_RECV: "IBV_ODP_SUPPORT_RECV",
               e.IBV_ODP_SUPPORT_WRITE: "IBV_ODP_SUPPORT_WRITE",
               e.IBV_ODP_SUPPORT_READ: "IBV_ODP_SUPPORT_READ",
               e.IBV_ODP_SUPPORT_ATOMIC: "IBV_ODP_SUPPORT_ATOMIC",
               e.IBV_ODP_SUPPORT_SRQ_RECV: "IBV_ODP_SUPPORT_SRQ_RECV"}
        return (f"ODP General caps: {str_from_flags(self.general_caps, general)}\n"
                f"RC ODP caps: {str_from_flags(self.rc_odp_caps, per)}\n"
                f"UD ODP caps: {str_from_flags(self.ud_odp_caps, per)}\n"
                f"UC ODP caps: {str_from_flags(self.uc_odp_caps, per)}\n"
                f"XRC ODP caps: {str_from_flags(self.xrc_odp_caps, per)}\n")


class TSOCaps(_Wrapped):
    """Mirrors pyverbs' TSOCaps."""


class RSSCaps(_Wrapped):
    """Mirrors pyverbs' RSSCaps."""


class PacketPacingCaps(_Wrapped):
    """Mirrors pyverbs' PacketPacingCaps."""


class PCIAtomicCaps(_Wrapped):
    """Mirrors pyverbs' PCIAtomicCaps."""


class TMCaps(_Wrapped):
    """Mirrors pyverbs' TMCaps."""


class CQModerationCaps(_Wrapped):
    """Mirrors pyverbs' CQModerationCaps."""


class DeviceAttrEx(_Wrapped):
    """Mirrors pyverbs' DeviceAttrEx (struct ibv_device_attr_ex)."""

    @property
    def orig_attr(self) -> DeviceAttr:
        return DeviceAttr(self._raw.orig_attr)

    @property
    def odp_caps(self) -> ODPCaps:
        return ODPCaps(self._raw.odp_caps, self._raw.xrc_odp_caps)

    @property
    def tso_caps(self) -> TSOCaps:
        return TSOCaps(self._raw.tso_caps)

    @property
    def rss_caps(self) -> RSSCaps:
        return RSSCaps(self._raw.rss_caps)

    @property
    def packet_pacing_caps(self) -> PacketPacingCaps:
        return PacketPacingCaps(self._raw.packet_pacing_caps)

    @property
    def pci_atomic_caps(self) -> PCIAtomicCaps:
        return PCIAtomicCaps(self._raw.pci_atomic_caps)

    @property
    def tm_caps(self) -> TMCaps:
        return TMCaps(self._raw.tm_caps)

    @property
    def cq_mod_caps(self) -> CQModerationCaps:
        return CQModerationCaps(self._raw.cq_mod_caps)


class GIDEntry(PyverbsObject):
    """Mirrors pyverbs' GIDEntry (struct ibv_gid_entry): the GID's two halves as
    the host reads their big-endian bytes, its index, port, type and netdev."""

    def __init__(self, subnet_prefix: int = 0, interface_id: int = 0, gid_index: int = 0,
                 port_num: int = 0, gid_type: int = 0, ndev_ifindex: int = 0) -> None:
        super().__init__()
        self.gid_subnet_prefix, self.gid_interface_id = subnet_prefix, interface_id
        self.gid_index, self.port_num = gid_index, port_num
        self.gid_type, self.ndev_ifindex = gid_type, ndev_ifindex

    @classmethod
    def _from(cls, entry: Any) -> GIDEntry:
        return cls(int.from_bytes(entry.gid[:8], "little"),
                   int.from_bytes(entry.gid[8:], "little"), entry.gid_index, entry.port_num,
                   entry.gid_type, entry.ndev_ifindex)

    def gid_str(self) -> str:
        return gid_str(self.gid_subnet_prefix, self.gid_interface_id)

    def __str__(self) -> str:
        fmt = "{:<24}: {:<20}\n"
        return (fmt.format("GID", self.gid_str()) + fmt.format("GID Index", self.gid_index)
                + fmt.format("Port number", self.port_num)
                + fmt.format("GID type", translate_gid_type(self.gid_type))
                + fmt.format("Ndev ifindex", self.ndev_ifindex))


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
        if kwargs.get("cmd_fd") is not None:
            self._import(kwargs["cmd_fd"])
            return
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

    def _import(self, cmd_fd: int) -> None:
        """Context(cmd_fd=...): ibv_import_device() of the command fd `cmd_fd` stands
        for (see cmd_fd) - a second context on the same uverbs file, whose objects'
        handles are valid in both.  Like the library, the context owns the fd from then
        on: closing it closes the fd (also when the provider's import fails)."""
        self.proc = current_process()
        emu_fd = _emulated_dup(self.proc, cmd_fd)
        try:
            self.ctx = call("Failed to import device", v.ibv_import_device, self.proc, emu_fd)
        except PyverbsRDMAError:
            if emu_fd >= 0 and not _emulated_fd_open(self.proc, emu_fd):
                os.close(cmd_fd)           # import_context failed: the library closed it
            elif emu_fd >= 0:
                self.proc.close(emu_fd)    # EMU: the dup stood for cmd_fd, which stays open
            raise
        self.device = self.ctx.device
        self._fd_token = cmd_fd
        _register_fd(cmd_fd, self)
        self._created()
        self.logger.debug(f"Context: imported device {self.device.name}")

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
        """The command fd, as a descriptor of this (real) process.

        EMU: the uverbs file is open in the emulated process (self.ctx.cmd_fd there);
        a program that hands pyverbs' cmd_fd to the OS (os.dup, as rdma-core's shared-PD
        test does before importing the context) gets a real descriptor standing for
        it - an empty memfd, closed with the Context - never some unrelated file of
        this process that happens to have the emulated number."""
        if getattr(self, "_fd_token", None) is None:
            self._fd_token = os.memfd_create(f"uverbs-fd{self.ctx.cmd_fd}", os.MFD_CLOEXEC)
            _register_fd(self._fd_token, self)
        return self._fd_token

    def _free(self) -> None:
        self.logger.debug("Closing Context")
        if getattr(self, "_fd_token", None) is not None:
            _unregister_fd(self)
            os.close(self._fd_token)
            self._fd_token = None
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

    def query_device_ex(self, ex_input: QueryDeviceExInput | None = None) -> DeviceAttrEx:
        """ibv_query_device_ex(): a failure carries the verb's errno."""
        self._check_open("query_device_ex")
        comp_mask = ex_input.comp_mask if ex_input is not None else 0
        return DeviceAttrEx(call(f"Failed to query EX device {self.name}",
                                 v.ibv_query_device_ex, self.ctx, comp_mask))

    def get_pkey_index(self, port_num: int, pkey: int) -> int:
        """ibv_get_pkey_index() of `pkey` given in host order (as the sysfs file shows
        it; pyverbs passes htobe16(pkey)): its index, or PyverbsRDMAError when the
        port's table lacks it."""
        self._check_open("get_pkey_index")
        idx = v.ibv_get_pkey_index(self.ctx, port_num, v.htobe16(pkey))
        if idx == -1:
            raise PyverbsRDMAError(f"Failed to get pkey index of pkey = {pkey} of port "
                                   f"{port_num}")
        return idx

    def query_pkey(self, port_num: int, index: int) -> int:
        """ibv_query_pkey(): the P_Key as its __be16 reads on the host; pyverbs'
        error carries no errno for this verb."""
        self._check_open("query_pkey")
        try:
            return v.ibv_query_pkey(self.ctx, port_num, index)
        except OSError:
            raise PyverbsRDMAError(f"Failed to query pkey {index} of port {port_num}") \
                from None

    def query_gid_type(self, port_num: int, index: int) -> int:
        """ibv_query_gid_type(): e.IBV_GID_TYPE_SYSFS_IB_ROCE_V1 or _ROCE_V2."""
        self._check_open("query_gid_type")
        return call("Failed to query gid type of index {index}", v.ibv_query_gid_type,
                    self.ctx, port_num, index)

    def query_gid_table(self, max_entries: int, flags: int = 0) -> list[GIDEntry]:
        """ibv_query_gid_table(): its -errno is the error's code (as pyverbs passes
        the verb's negative return on)."""
        self._check_open("query_gid_table")
        rc, entries = v.ibv_query_gid_table(self.ctx, max_entries, flags)
        if rc < 0:
            set_errno(-rc)
            raise PyverbsRDMAError("Failed to query gid tables of the device", rc)
        return [GIDEntry._from(x) for x in entries]

    def query_gid_ex(self, port_num: int, gid_index: int, flags: int = 0) -> GIDEntry:
        """ibv_query_gid_ex(): a failure carries the verb's (positive) errno."""
        self._check_open("query_gid_ex")
        rc, entry = v.ibv_query_gid_ex(self.ctx, port_num, gid_index, flags)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError(f"Failed to query gid table of port {port_num} in index "
                                   f"{gid_index}", rc)
        return GIDEntry._from(entry)

    def query_rt_values_ex(self, comp_mask: int = e.IBV_VALUES_MASK_RAW_CLOCK
                           ) -> tuple[int, int]:
        """ibv_query_rt_values_ex(): (tv_sec, tv_nsec) of the raw clock (for mlx5, 0 and
        the device clock's cycles); PyverbsRDMAError with the verb's errno, or without
        one when the provider answered less than comp_mask asked."""
        self._check_open("query_rt_values_ex")
        val = v.ibv_values_ex(comp_mask=comp_mask)
        rc = v.ibv_query_rt_values_ex(self.ctx, val)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to query real time values", rc)
        if val.comp_mask != comp_mask:
            raise PyverbsRDMAError("Failed to query real time values with requested comp_mask")
        return val.raw_clock

    def get_async_event(self) -> AsyncEvent:
        """ibv_get_async_event(): the next async event of the context (blocking unless
        its async fd is O_NONBLOCK); PyverbsRDMAError with the read's errno."""
        self._check_open("get_async_event")
        event = AsyncEvent()
        event.event = call("Failed to get async event", va.ibv_get_async_event, self.ctx)
        return event


# -- the command fds handed to the program ----------------------------------------------
# EMU: the uverbs files are open in the emulated process; the descriptor pyverbs'
# Context.cmd_fd gives the program is a memfd of this process standing for one of them
# (see Context.cmd_fd).  os.dup() of it names the same memfd, so its inode (st_dev,
# st_ino) says which emulated file a descriptor the program passes back stands for:
# these are the open Contexts whose cmd_fd has that inode.
_fd_holders: dict[tuple[int, int], list[Any]] = {}


def _fd_key(fd: int) -> tuple[int, int] | None:
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _register_fd(fd: int, ctx: Context) -> None:
    key = _fd_key(fd)
    if key is not None:
        ctx._fd_key = key
        _fd_holders.setdefault(key, []).append(weakref.ref(ctx))


def _unregister_fd(ctx: Context) -> None:
    key = getattr(ctx, "_fd_key", None)
    refs = _fd_holders.get(key, [])
    refs[:] = [r for r in refs if r() is not None and r() is not ctx]
    if not refs:
        _fd_holders.pop(key, None)


def _emulated_dup(proc: Any, fd: int) -> int:
    """The emulated process's dup() of the uverbs file `fd` stands for - the dup the
    program made of the token, made now of what it stands for - or -1 when `fd` stands
    for none (not open, not a token, or its contexts are closed): the emulated
    process has no such fd, so ibv_import_device's fstat() fails (EINVAL)."""
    key = _fd_key(fd)
    for ref in _fd_holders.get(key, []) if key is not None else []:
        holder = ref()
        if holder is not None and not holder._closed and holder.proc is proc:
            return proc.dup(holder.ctx.cmd_fd)
    return -1


def _emulated_fd_open(proc: Any, fd: int) -> bool:
    """Whether the emulated process still has `fd` open (its fstat() succeeds)."""
    buf = libc.posix_memalign(proc, 8, 144)
    try:
        return proc.fstat(fd, buf) == 0
    finally:
        libc.free(proc, buf, 144)


class DM(PyverbsCM):
    """Mirrors pyverbs' DM (ibv_alloc_dm): device memory - the ConnectX's on-chip memory
    (MEMIC), mapped into the process; copy_to_dm/copy_from_dm load and store through
    the mapping (libmlx5's 4-byte rules: EINVAL unaligned, EFAULT out of range).

    DM(context, handle=h) imports the DM of handle h of the context's command fd
    (ibv_import_dm: its pages mapped again); closing it does not free the DM, which
    stays its creator's; unimport() unmaps it."""

    def __init__(self, context: Context, dm_attr: Any = None, **kwargs: Any) -> None:
        super().__init__()
        self._is_imported = False
        if kwargs.get("handle") is not None:
            self.context = context
            self.dm = call("Failed to import DM", v.ibv_import_dm, context.ctx, kwargs["handle"])
            self._is_imported = True
            context.add_ref(self)
            self._created()
            return
        device_attr = context.query_device_ex()
        if device_attr.max_dm_size <= 0:
            raise PyverbsUserError("Device doesn't support dm allocation")
        self.context = context
        self.dm = call(f"Failed to allocate device memory of size {dm_attr.length}. "
                       f"Max available size {device_attr.max_dm_size}.", v.ibv_alloc_dm,
                       context.ctx, dm_attr.length, dm_attr.log_align_req, dm_attr.comp_mask)
        context.add_ref(self)
        self._created()

    @property
    def handle(self) -> int:
        return self.dm.handle

    def unimport(self) -> None:
        """ibv_unimport_dm(), then close() (which leaves the DM to its creator)."""
        self._check_open("DM.unimport")
        v.ibv_unimport_dm(self.dm)
        self.close()

    def _free(self) -> None:
        if not self._is_imported:
            destroy("Failed to free dm", v.ibv_free_dm, self.dm)

    def copy_to_dm(self, dm_offset: int, data: bytes | str, length: int) -> None:
        """ibv_memcpy_to_dm(): 'Failed to copy to dm' with the errno."""
        raw = data.encode() if isinstance(data, str) else bytes(data)
        rc = v.ibv_memcpy_to_dm(self.dm, dm_offset, raw.ljust(length, b"\0"), length)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to copy to dm", rc)

    def copy_from_dm(self, dm_offset: int, length: int) -> bytes:
        """ibv_memcpy_from_dm(): 'Failed to copy from dm' with the errno."""
        rc, data = v.ibv_memcpy_from_dm(self.dm, dm_offset, length)
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to copy from dm", rc)
        return data


class AllocDmAttr(PyverbsObject):
    """Mirrors pyverbs' AllocDmAttr (struct ibv_alloc_dm_attr)."""

    def __init__(self, length: int, log_align_req: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        # the C struct's fields: size_t, uint32_t, uint64_t (a float length is truncated)
        self.length, self.log_align_req, self.comp_mask = int(length), log_align_req, comp_mask


class AsyncEvent(PyverbsObject):
    """Mirrors pyverbs' AsyncEvent: a struct ibv_async_event (Context.get_async_event
    fills it); ack() is ibv_ack_async_event, which the destroy of its object waits for."""

    def __init__(self, event_type: int = 0) -> None:
        super().__init__()
        self.event = va.ibv_async_event(None, event_type)

    def ack(self) -> None:
        va.ibv_ack_async_event(self.event)

    @property
    def event_type(self) -> int:
        return self.event.event_type

    def __str__(self) -> str:
        return "{:<24}: {:<20}\n".format("Event Type", translate_event_type(self.event_type))


def translate_event_type(event_type: int) -> str:
    """pyverbs' name of an ibv_event_type (its QP_LAST_WQE_REACHED has a stray dot)."""
    names = {getattr(e, n): n for n in (
        "IBV_EVENT_CQ_ERR", "IBV_EVENT_QP_FATAL", "IBV_EVENT_QP_REQ_ERR",
        "IBV_EVENT_QP_ACCESS_ERR", "IBV_EVENT_COMM_EST", "IBV_EVENT_SQ_DRAINED",
        "IBV_EVENT_PATH_MIG", "IBV_EVENT_PATH_MIG_ERR", "IBV_EVENT_DEVICE_FATAL",
        "IBV_EVENT_PORT_ACTIVE", "IBV_EVENT_PORT_ERR", "IBV_EVENT_LID_CHANGE",
        "IBV_EVENT_PKEY_CHANGE", "IBV_EVENT_SM_CHANGE", "IBV_EVENT_SRQ_ERR",
        "IBV_EVENT_SRQ_LIMIT_REACHED", "IBV_EVENT_CLIENT_REREGISTER",
        "IBV_EVENT_GID_CHANGE", "IBV_EVENT_WQ_FATAL")}
    names[e.IBV_EVENT_QP_LAST_WQE_REACHED] = ".IBV_EVENT_QP_LAST_WQE_REACHED"
    return names.get(event_type, f"Unknown event_type ({event_type})")


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


def speed_to_str(active_speed: int, active_speed_ex: int = 0) -> str:
    """The port's speed as text: active_speed_ex when the kernel gave one (rdma-core
    v50+ takes both), else the legacy active_speed."""
    speed = active_speed_ex or active_speed
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


__all__ = ["AllocDmAttr", "CQModerationCaps", "Context", "DM", "Device", "DeviceAttr",
           "DeviceAttrEx", "GIDEntry", "ODPCaps", "PCIAtomicCaps", "PacketPacingCaps",
           "QueryDeviceExInput", "RSSCaps", "TMCaps", "TSOCaps", "PortAttr", "PyverbsError",
           "PyverbsRDMAError", "PyverbsUserError", "get_device_list", "rdma_get_devices"]
