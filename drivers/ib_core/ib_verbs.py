"""Mirrors include/rdma/ib_verbs.h: the verbs objects, attributes and udata.

The objects the core hands to drivers (ib_ucontext, ib_pd, ib_cq, ib_qp,
ib_mr) are base classes; a driver subclasses them (`class mlx5_ib_pd(ib_pd)`)
and names its classes in its ib_device_ops (`size_ib_pd=mlx5_ib_pd`), which is
what INIT_RDMA_OBJ_SIZE() does: the core allocates the driver's struct with the
core struct embedded, and the driver's to_mpd() is then just the object itself.

udata is the driver-private part of a uverbs command: user addresses and
lengths of the request the driver may read and the response it may write,
reached only through copy_from_user / copy_to_user.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import attrs

from kernel_model.errno import EFAULT, EINVAL, KernelError
from kernel_model.refcount import atomic_t
from kernel_model.uaccess import copy_from_user, copy_to_user
from kernel_model.uapi.ib_user_verbs import (
    IB_UVERBS_ACCESS_FLUSH_GLOBAL,
    IB_UVERBS_ACCESS_FLUSH_PERSISTENT,
    IB_UVERBS_ACCESS_HUGETLB,
    IB_UVERBS_ACCESS_LOCAL_WRITE,
    IB_UVERBS_ACCESS_MW_BIND,
    IB_UVERBS_ACCESS_ON_DEMAND,
    IB_UVERBS_ACCESS_OPTIONAL_RANGE,
    IB_UVERBS_ACCESS_RELAXED_ORDERING,
    IB_UVERBS_ACCESS_REMOTE_ATOMIC,
    IB_UVERBS_ACCESS_REMOTE_READ,
    IB_UVERBS_ACCESS_REMOTE_WRITE,
    IB_UVERBS_ACCESS_ZERO_BASED,
)
from kernel_model.uapi.ustruct import UStruct

if TYPE_CHECKING:
    from drivers.ib_core.device import ib_device

T = TypeVar("T", bound=UStruct)

# enum ib_access_flags (= the uapi values)
IB_ACCESS_LOCAL_WRITE = IB_UVERBS_ACCESS_LOCAL_WRITE
IB_ACCESS_REMOTE_WRITE = IB_UVERBS_ACCESS_REMOTE_WRITE
IB_ACCESS_REMOTE_READ = IB_UVERBS_ACCESS_REMOTE_READ
IB_ACCESS_REMOTE_ATOMIC = IB_UVERBS_ACCESS_REMOTE_ATOMIC
IB_ACCESS_MW_BIND = IB_UVERBS_ACCESS_MW_BIND
IB_ZERO_BASED = IB_UVERBS_ACCESS_ZERO_BASED
IB_ACCESS_ON_DEMAND = IB_UVERBS_ACCESS_ON_DEMAND
IB_ACCESS_HUGETLB = IB_UVERBS_ACCESS_HUGETLB
IB_ACCESS_RELAXED_ORDERING = IB_UVERBS_ACCESS_RELAXED_ORDERING
IB_ACCESS_FLUSH_GLOBAL = IB_UVERBS_ACCESS_FLUSH_GLOBAL
IB_ACCESS_FLUSH_PERSISTENT = IB_UVERBS_ACCESS_FLUSH_PERSISTENT
IB_ACCESS_OPTIONAL = IB_UVERBS_ACCESS_OPTIONAL_RANGE
IB_ACCESS_SUPPORTED = ((IB_ACCESS_HUGETLB << 1) - 1) | IB_ACCESS_OPTIONAL \
    | IB_ACCESS_FLUSH_GLOBAL | IB_ACCESS_FLUSH_PERSISTENT

# enum ib_qp_type
IB_QPT_SMI, IB_QPT_GSI, IB_QPT_RC, IB_QPT_UC, IB_QPT_UD = 0, 1, 2, 3, 4
IB_QPT_RAW_PACKET = 8
IB_QPT_XRC_INI, IB_QPT_XRC_TGT = 9, 10
IB_QPT_DRIVER = 0xFF

# enum ib_port_state
IB_PORT_NOP, IB_PORT_DOWN, IB_PORT_INIT, IB_PORT_ARMED, IB_PORT_ACTIVE = 0, 1, 2, 3, 4
# enum ib_mtu
IB_MTU_256, IB_MTU_512, IB_MTU_1024, IB_MTU_2048, IB_MTU_4096 = 1, 2, 3, 4, 5
# link layers
IB_LINK_LAYER_UNSPECIFIED, IB_LINK_LAYER_INFINIBAND, IB_LINK_LAYER_ETHERNET = 0, 1, 2
# enum ib_port_width / ib_port_speed
IB_WIDTH_1X, IB_WIDTH_2X, IB_WIDTH_4X, IB_WIDTH_8X, IB_WIDTH_12X = 1, 16, 2, 4, 8
IB_SPEED_SDR, IB_SPEED_DDR, IB_SPEED_QDR, IB_SPEED_FDR10 = 1, 2, 4, 8
IB_SPEED_FDR, IB_SPEED_EDR, IB_SPEED_HDR, IB_SPEED_NDR, IB_SPEED_XDR = 16, 32, 64, 128, 256
# enum ib_atomic_cap
IB_ATOMIC_NONE, IB_ATOMIC_HCA, IB_ATOMIC_GLOB = 0, 1, 2
# enum rdma_node_type
RDMA_NODE_IB_CA = 1

# enum rdma_remove_reason
RDMA_REMOVE_DESTROY = 0
RDMA_REMOVE_CLOSE = 1
RDMA_REMOVE_DRIVER_REMOVE = 2
RDMA_REMOVE_ABORT = 3
RDMA_REMOVE_DRIVER_FAILURE = 4


def ib_mtu_enum_to_int(mtu: int) -> int:
    """Mirrors ib_mtu_enum_to_int()."""
    return 128 << mtu if IB_MTU_256 <= mtu <= IB_MTU_4096 else -1


@attrs.define
class ib_device_attr:
    """Mirrors struct ib_device_attr: what QUERY_DEVICE reports."""

    fw_ver: int = 0
    sys_image_guid: int = 0
    max_mr_size: int = 0
    page_size_cap: int = 0
    vendor_id: int = 0
    vendor_part_id: int = 0
    hw_ver: int = 0
    max_qp: int = 0
    max_qp_wr: int = 0
    device_cap_flags: int = 0
    kernel_cap_flags: int = 0
    max_send_sge: int = 0
    max_recv_sge: int = 0
    max_sge_rd: int = 0
    max_cq: int = 0
    max_cqe: int = 0
    max_mr: int = 0
    max_pd: int = 0
    max_qp_rd_atom: int = 0
    max_ee_rd_atom: int = 0
    max_res_rd_atom: int = 0
    max_qp_init_rd_atom: int = 0
    max_ee_init_rd_atom: int = 0
    atomic_cap: int = IB_ATOMIC_NONE
    masked_atomic_cap: int = IB_ATOMIC_NONE
    max_ee: int = 0
    max_rdd: int = 0
    max_mw: int = 0
    max_raw_ipv6_qp: int = 0
    max_raw_ethy_qp: int = 0
    max_mcast_grp: int = 0
    max_mcast_qp_attach: int = 0
    max_total_mcast_qp_attach: int = 0
    max_ah: int = 0
    max_srq: int = 0
    max_srq_wr: int = 0
    max_srq_sge: int = 0
    max_fast_reg_page_list_len: int = 0
    max_pkeys: int = 0
    local_ca_ack_delay: int = 0


@attrs.define
class ib_port_attr:
    """Mirrors struct ib_port_attr: what QUERY_PORT reports."""

    subnet_prefix: int = 0
    state: int = IB_PORT_DOWN
    max_mtu: int = IB_MTU_4096
    active_mtu: int = IB_MTU_1024
    phys_mtu: int = 4096
    gid_tbl_len: int = 0
    ip_gids: bool = False
    port_cap_flags: int = 0
    max_msg_sz: int = 0
    bad_pkey_cntr: int = 0
    qkey_viol_cntr: int = 0
    pkey_tbl_len: int = 0
    sm_lid: int = 0
    lid: int = 0
    lmc: int = 0
    max_vl_num: int = 0
    sm_sl: int = 0
    subnet_timeout: int = 0
    init_type_reply: int = 0
    active_width: int = 0
    active_speed: int = 0
    phys_state: int = 0
    port_cap_flags2: int = 0


@attrs.define
class ib_port_immutable:
    """Mirrors struct ib_port_immutable: per-port facts fixed at registration."""

    pkey_tbl_len: int = 0
    gid_tbl_len: int = 0
    core_cap_flags: int = 0
    max_mad_size: int = 0


# -- udata ---------------------------------------------------------------------
@attrs.define
class ib_udata:
    """Mirrors struct ib_udata: the driver's request and response in user memory."""

    inbuf: int = 0
    outbuf: int = 0
    inlen: int = 0
    outlen: int = 0


def ib_copy_from_udata(cls: type[T], udata: ib_udata, length: int) -> T:
    """Mirrors ib_copy_from_udata(): read `length` bytes of the request as `cls`
    (shorter than sizeof(cls): the rest reads as zero, as into a zeroed struct)."""
    raw = bytearray(length)
    if length and copy_from_user(raw, udata.inbuf, length):
        raise KernelError(EFAULT, "ib_copy_from_udata: copy_from_user of the request")
    return cls.unpack(raw)


def ib_copy_to_udata(udata: ib_udata, src: bytes, length: int) -> None:
    """Mirrors ib_copy_to_udata(): write `length` bytes of the response."""
    if length and copy_to_user(udata.outbuf, src[:length], length):
        raise KernelError(EFAULT, "ib_copy_to_udata: copy_to_user of the response")


def ib_respond_udata(udata: ib_udata, resp: UStruct) -> None:
    """Mirrors ib_respond_udata(): copy min(outlen, sizeof) of the response and
    zero-fill any further bytes the user offered."""
    raw = resp.pack()
    n = min(udata.outlen, len(raw))
    ib_copy_to_udata(udata, raw, n)
    if udata.outlen > n and copy_to_user(udata.outbuf + n, bytes(udata.outlen - n),
                                         udata.outlen - n):
        raise KernelError(EFAULT, "ib_respond_udata: clearing the response tail")


def ib_is_udata_cleared(udata: ib_udata, offset: int, length: int) -> bool:
    """Mirrors ib_is_udata_cleared(): are request bytes [offset, offset+len) zero?"""
    if length <= 0:
        return True
    raw = bytearray(length)
    if copy_from_user(raw, udata.inbuf + offset, length):
        return False
    return not any(raw)


# -- objects -------------------------------------------------------------------
class ib_ucontext:
    """Mirrors struct ib_ucontext: one process's open context on a device."""

    def __init__(self, device: ib_device, ufile: Any = None):
        self.device = device
        self.ufile = ufile
        self.res_uobject: Any = None  # the uobject of GET_CONTEXT (rdma restrack)

    def __repr__(self) -> str:
        return f"ucontext {self.device.name}"


class ib_pd:
    """Mirrors struct ib_pd: usecnt counts the MRs and QPs that use it."""

    def __init__(self, device: ib_device):
        self.device = device
        self.uobject: Any = None
        self.usecnt = atomic_t(0)
        self.local_dma_lkey = 0
        self.flags = 0

    def __repr__(self) -> str:
        return f"PD {self.device.name} usecnt={self.usecnt.counter}"


class ib_mr:
    """Mirrors struct ib_mr (the driver allocates it in reg_user_mr)."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.uobject: Any = None
        self.lkey = 0
        self.rkey = 0
        self.iova = 0
        self.length = 0
        self.type = 0

    def __repr__(self) -> str:
        return f"MR lkey={self.lkey:#x} iova={self.iova:#x} len={self.length:#x}"


@attrs.define
class ib_cq_init_attr:
    """Mirrors struct ib_cq_init_attr."""

    cqe: int = 0
    comp_vector: int = 0
    flags: int = 0


class ib_cq:
    """Mirrors struct ib_cq: usecnt counts the QPs attached to it."""

    def __init__(self, device: ib_device):
        self.device = device
        self.uobject: Any = None
        self.cqe = 0
        self.usecnt = atomic_t(0)

    def __repr__(self) -> str:
        return f"CQ {self.device.name} cqe={self.cqe} usecnt={self.usecnt.counter}"


@attrs.define
class ib_qp_cap:
    """Mirrors struct ib_qp_cap."""

    max_send_wr: int = 0
    max_recv_wr: int = 0
    max_send_sge: int = 0
    max_recv_sge: int = 0
    max_inline_data: int = 0


@attrs.define
class ib_qp_init_attr:
    """Mirrors struct ib_qp_init_attr."""

    send_cq: ib_cq | None = None
    recv_cq: ib_cq | None = None
    srq: Any = None
    xrcd: Any = None
    cap: ib_qp_cap = attrs.Factory(ib_qp_cap)
    sq_sig_type: int = 0
    qp_type: int = IB_QPT_RC
    create_flags: int = 0
    port_num: int = 0


class ib_qp:
    """Mirrors struct ib_qp."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.send_cq: ib_cq | None = None
        self.recv_cq: ib_cq | None = None
        self.srq: Any = None
        self.uobject: Any = None
        self.qp_num = 0
        self.qp_type = IB_QPT_RC
        self.usecnt = atomic_t(0)

    def __repr__(self) -> str:
        return f"QP {self.qp_num:#x} type={self.qp_type}"


def ib_check_mr_access(device: ib_device, flags: int) -> None:
    """Mirrors ib_check_mr_access(): remote write or atomic need local write;
    unknown bits are EINVAL, ODP without device support EOPNOTSUPP."""
    from kernel_model.errno import EOPNOTSUPP
    if flags & ~IB_ACCESS_SUPPORTED:
        raise KernelError(EINVAL, f"ib_check_mr_access: unknown access flags {flags:#x}")
    if flags & (IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_REMOTE_WRITE) and \
            not flags & IB_ACCESS_LOCAL_WRITE:
        raise KernelError(EINVAL, "ib_check_mr_access: remote write/atomic without "
                          "local write")
    if flags & IB_ACCESS_ON_DEMAND and not getattr(device.attrs, "odp_supported", False):
        raise KernelError(EOPNOTSUPP, "ib_check_mr_access: on-demand paging not supported")
