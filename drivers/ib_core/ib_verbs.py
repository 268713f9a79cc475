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

from kernel_model.errno import EFAULT, EINVAL, EOPNOTSUPP, KernelError
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
IBK_ON_DEMAND_PAGING = 1 << 2          # enum ib_kernel_cap_flags
IB_ACCESS_HUGETLB = IB_UVERBS_ACCESS_HUGETLB
IB_ACCESS_RELAXED_ORDERING = IB_UVERBS_ACCESS_RELAXED_ORDERING
IB_ACCESS_FLUSH_GLOBAL = IB_UVERBS_ACCESS_FLUSH_GLOBAL
IB_ACCESS_FLUSH_PERSISTENT = IB_UVERBS_ACCESS_FLUSH_PERSISTENT
IB_ACCESS_OPTIONAL = IB_UVERBS_ACCESS_OPTIONAL_RANGE
IB_ACCESS_SUPPORTED = ((IB_ACCESS_HUGETLB << 1) - 1) | IB_ACCESS_OPTIONAL \
    | IB_ACCESS_FLUSH_GLOBAL | IB_ACCESS_FLUSH_PERSISTENT

# enum ib_mr_rereg_flags (rereg_user_mr: what to change)
IB_MR_REREG_TRANS, IB_MR_REREG_PD, IB_MR_REREG_ACCESS = 1, 2, 4
IB_MR_REREG_SUPPORTED = (IB_MR_REREG_ACCESS << 1) - 1

# enum ib_qp_type
IB_QPT_SMI, IB_QPT_GSI, IB_QPT_RC, IB_QPT_UC, IB_QPT_UD = 0, 1, 2, 3, 4
IB_QPT_RAW_PACKET = 8
IB_QPT_XRC_INI, IB_QPT_XRC_TGT = 9, 10
IB_QPT_DRIVER = 0xFF
# enum ib_qp_create_flags
IB_QP_CREATE_IPOIB_UD_LSO, IB_QP_CREATE_BLOCK_MULTICAST_LOOPBACK = 1 << 0, 1 << 1
IB_QP_CREATE_CROSS_CHANNEL, IB_QP_CREATE_MANAGED_SEND = 1 << 2, 1 << 3
IB_QP_CREATE_MANAGED_RECV, IB_QP_CREATE_NETIF_QP = 1 << 4, 1 << 5
IB_QP_CREATE_INTEGRITY_EN, IB_QP_CREATE_NETDEV_USE = 1 << 6, 1 << 7
IB_QP_CREATE_SCATTER_FCS, IB_QP_CREATE_CVLAN_STRIPPING = 1 << 8, 1 << 9
IB_QP_CREATE_SOURCE_QPN, IB_QP_CREATE_PCI_WRITE_END_PADDING = 1 << 10, 1 << 11

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
# enum ib_qp_state
IB_QPS_RESET, IB_QPS_INIT, IB_QPS_RTR, IB_QPS_RTS, IB_QPS_SQD, IB_QPS_SQE, IB_QPS_ERR = range(7)
# enum ib_qp_attr_mask
IB_QP_STATE, IB_QP_CUR_STATE, IB_QP_EN_SQD_ASYNC_NOTIFY = 1 << 0, 1 << 1, 1 << 2
IB_QP_ACCESS_FLAGS, IB_QP_PKEY_INDEX, IB_QP_PORT, IB_QP_QKEY = 1 << 3, 1 << 4, 1 << 5, 1 << 6
IB_QP_AV, IB_QP_PATH_MTU, IB_QP_TIMEOUT, IB_QP_RETRY_CNT = 1 << 7, 1 << 8, 1 << 9, 1 << 10
IB_QP_RNR_RETRY, IB_QP_RQ_PSN, IB_QP_MAX_QP_RD_ATOMIC = 1 << 11, 1 << 12, 1 << 13
IB_QP_ALT_PATH, IB_QP_MIN_RNR_TIMER, IB_QP_SQ_PSN = 1 << 14, 1 << 15, 1 << 16
IB_QP_MAX_DEST_RD_ATOMIC, IB_QP_PATH_MIG_STATE, IB_QP_CAP = 1 << 17, 1 << 18, 1 << 19
IB_QP_DEST_QPN, IB_QP_RATE_LIMIT = 1 << 20, 1 << 25
IB_QP_ATTR_STANDARD_BITS = (1 << 21) - 1  # GENMASK(20, 0)
# enum ib_mig_state, ib_sig_type
IB_MIG_MIGRATED, IB_MIG_REARM, IB_MIG_ARMED = 0, 1, 2
IB_SIGNAL_ALL_WR, IB_SIGNAL_REQ_WR = 0, 1
# enum ib_ah_flags, rdma_ah_attr_type, ib_gid_type
IB_AH_GRH = 1
RDMA_AH_ATTR_TYPE_UNDEFINED, RDMA_AH_ATTR_TYPE_IB, RDMA_AH_ATTR_TYPE_ROCE = 0, 1, 2
RDMA_CREATE_AH_SLEEPABLE, RDMA_DESTROY_AH_SLEEPABLE = 1, 1  # enum rdma_create_ah_flags
IB_GID_TYPE_IB, IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP = 0, 1, 2
IB_GID_TYPE_SIZE = 3
# enum ib_rate (the ends of the range; mlx5 maps the rest)
IB_RATE_PORT_CURRENT, IB_RATE_2_5_GBPS, IB_RATE_800_GBPS = 0, 2, 23
IB_GRH_FLOWLABEL_MASK = 0x000FFFFF
# the protocol bits of a port's core_cap_flags (RDMA_CORE_CAP_PROT_*)
RDMA_CORE_CAP_PROT_IB, RDMA_CORE_CAP_PROT_ROCE = 0x00100000, 0x00200000
RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP = 0x00800000
IB_ROCE_UDP_ENCAP_VALID_PORT_MIN = 0xC000

# enum rdma_remove_reason
RDMA_REMOVE_DESTROY = 0
RDMA_REMOVE_CLOSE = 1
RDMA_REMOVE_DRIVER_REMOVE = 2
RDMA_REMOVE_ABORT = 3
RDMA_REMOVE_DRIVER_FAILURE = 4


def ib_is_destroy_retryable(why: int, uobj: Any) -> bool:
    """Mirrors ib_is_destroy_retryable() (a static inline in include/rdma/ib_verbs.h): an
    in-use object may refuse only on an explicit destroy or while the teardown still
    retries."""
    return why == RDMA_REMOVE_DESTROY or bool(getattr(uobj.context, "cleanup_retryable", False))


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
    # what only the extended QUERY_DEVICE reports
    odp_caps: ib_odp_caps = attrs.Factory(lambda: ib_odp_caps())
    timestamp_mask: int = 0
    hca_core_clock: int = 0  # kHz
    rss_caps: ib_rss_caps = attrs.Factory(lambda: ib_rss_caps())
    max_wq_type_rq: int = 0
    raw_packet_caps: int = 0
    tm_caps: ib_tm_caps = attrs.Factory(lambda: ib_tm_caps())
    cq_caps: ib_cq_caps = attrs.Factory(lambda: ib_cq_caps())
    max_dm_size: int = 0


@attrs.define
class ib_odp_caps:
    """Mirrors struct ib_odp_caps (general_caps and per_transport_caps, flattened)."""

    general_caps: int = 0
    rc_odp_caps: int = 0
    uc_odp_caps: int = 0
    ud_odp_caps: int = 0
    xrc_odp_caps: int = 0


@attrs.define
class ib_rss_caps:
    """Mirrors struct ib_rss_caps."""

    supported_qpts: int = 0
    max_rwq_indirection_tables: int = 0
    max_rwq_indirection_table_size: int = 0


@attrs.define
class ib_tm_caps:
    """Mirrors struct ib_tm_caps."""

    max_rndv_hdr_size: int = 0
    max_num_tags: int = 0
    flags: int = 0
    max_ops: int = 0
    max_sge: int = 0


@attrs.define
class ib_cq_caps:
    """Mirrors struct ib_cq_caps."""

    max_cq_moderation_count: int = 0
    max_cq_moderation_period: int = 0


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
        self.dm: ib_dm | None = None   # a device-memory MR's DM (ib_uverbs_reg_dm_mr)

    def __repr__(self) -> str:
        return f"MR lkey={self.lkey:#x} iova={self.iova:#x} len={self.length:#x}"


class ib_dm:
    """Mirrors struct ib_dm: device memory (ibv_alloc_dm); usecnt counts its MRs."""

    def __init__(self, device: ib_device):
        self.device = device
        self.uobject: Any = None
        self.length = 0
        self.flags = 0
        self.usecnt = atomic_t(0)

    def __repr__(self) -> str:
        return f"DM {self.device.name} len={self.length:#x} usecnt={self.usecnt.counter}"


# enum ib_mw_type
IB_MW_TYPE_1, IB_MW_TYPE_2 = 1, 2


class ib_mw:
    """Mirrors struct ib_mw (the core allocates the driver's size, alloc_mw fills it)."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.uobject: Any = None
        self.rkey = 0
        self.type = 0

    def __repr__(self) -> str:
        return f"MW type {self.type} rkey={self.rkey:#x}"


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
        self.comp_handler: Any = None   # called with (cq, cq_context) per completion event
        self.cq_context: Any = None
        self.event_handler: Any = None  # (ib_event, cq_context): its async events

    def __repr__(self) -> str:
        return f"CQ {self.device.name} cqe={self.cqe} usecnt={self.usecnt.counter}"


IB_SRQT_BASIC, IB_SRQT_XRC, IB_SRQT_TM = 0, 1, 2      # enum ib_srq_type
IB_SRQ_MAX_WR, IB_SRQ_LIMIT = 1 << 0, 1 << 1           # enum ib_srq_attr_mask


@attrs.define
class ib_srq_attr:
    """Mirrors struct ib_srq_attr."""

    max_wr: int = 0
    max_sge: int = 0
    srq_limit: int = 0


@attrs.define
class ib_srq_init_attr:
    """Mirrors struct ib_srq_init_attr (ext.cq / ext.xrc.xrcd as cq / xrcd)."""

    attr: ib_srq_attr = attrs.Factory(ib_srq_attr)
    srq_type: int = IB_SRQT_BASIC
    cq: Any = None
    xrcd: Any = None
    event_handler: Any = None      # called with (ib_event, srq_context)
    srq_context: Any = None


# enum ib_event_type (the same numbers as uapi's ibv_event_type)
(IB_EVENT_CQ_ERR, IB_EVENT_QP_FATAL, IB_EVENT_QP_REQ_ERR, IB_EVENT_QP_ACCESS_ERR,
 IB_EVENT_COMM_EST, IB_EVENT_SQ_DRAINED, IB_EVENT_PATH_MIG, IB_EVENT_PATH_MIG_ERR,
 IB_EVENT_DEVICE_FATAL, IB_EVENT_PORT_ACTIVE, IB_EVENT_PORT_ERR, IB_EVENT_LID_CHANGE,
 IB_EVENT_PKEY_CHANGE, IB_EVENT_SM_CHANGE, IB_EVENT_SRQ_ERR, IB_EVENT_SRQ_LIMIT_REACHED,
 IB_EVENT_QP_LAST_WQE_REACHED, IB_EVENT_CLIENT_REREGISTER, IB_EVENT_GID_CHANGE,
 IB_EVENT_WQ_FATAL) = range(20)


@attrs.define(eq=False)
class ib_event:
    """Mirrors struct ib_event: the device, the event, and its element (the CQ, QP,
    SRQ or WQ it is about - or, for a port event, the port number)."""

    device: Any
    event: int
    element: Any = None


class ib_xrcd:
    """Mirrors struct ib_xrcd: usecnt counts the XRC SRQs and target QPs in it and,
    for one shared by a file's inode, the handles opened on it."""

    def __init__(self, device: ib_device):
        self.device = device
        self.inode: Any = None
        self.usecnt = atomic_t(0)

    def __repr__(self) -> str:
        return f"XRCD {self.device.name} usecnt={self.usecnt.counter}"


class ib_srq:
    """Mirrors struct ib_srq: usecnt counts the QPs that take receives from it."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.uobject: Any = None
        self.srq_type = IB_SRQT_BASIC
        self.cq: Any = None           # ext.cq (XRC, TM)
        self.srq_num = 0              # ext.xrc.srq_num
        self.xrcd: Any = None         # ext.xrc.xrcd
        self.usecnt = atomic_t(0)
        self.event_handler: Any = None  # (ib_event, srq_context): its async events
        self.srq_context: Any = None

    def __repr__(self) -> str:
        return f"SRQ {self.device.name} type={self.srq_type} usecnt={self.usecnt.counter}"


# -- work queues and RSS indirection tables (enum ib_wq_type, ib_wq_state) -------------------
IB_WQT_RQ = 0
IB_WQS_RESET, IB_WQS_RDY, IB_WQS_ERR = 0, 1, 2
IB_WQ_STATE, IB_WQ_CUR_STATE, IB_WQ_FLAGS = 1 << 0, 1 << 1, 1 << 2   # enum ib_wq_attr_mask


@attrs.define
class ib_wq_init_attr:
    """Mirrors struct ib_wq_init_attr (the driver writes back the real sizes)."""

    wq_type: int = IB_WQT_RQ
    max_wr: int = 0
    max_sge: int = 0
    cq: Any = None
    create_flags: int = 0
    event_handler: Any = None


@attrs.define
class ib_wq_attr:
    """Mirrors struct ib_wq_attr."""

    wq_state: int = IB_WQS_RESET
    curr_wq_state: int = IB_WQS_RESET
    flags: int = 0
    flags_mask: int = 0


class ib_wq:
    """Mirrors struct ib_wq: a receive work queue; usecnt counts the indirection
    tables naming it."""

    def __init__(self, device: ib_device):
        self.device = device
        self.uobject: Any = None
        self.pd: ib_pd | None = None
        self.cq: Any = None
        self.wq_num = 0
        self.wq_type = IB_WQT_RQ
        self.state = IB_WQS_RESET
        self.usecnt = atomic_t(0)
        self.event_handler: Any = None

    def __repr__(self) -> str:
        return f"WQ {self.wq_num:#x} state={self.state} usecnt={self.usecnt.counter}"


@attrs.define
class ib_rwq_ind_table_init_attr:
    """Mirrors struct ib_rwq_ind_table_init_attr."""

    log_ind_tbl_size: int = 0
    ind_tbl: list = attrs.Factory(list)


class ib_rwq_ind_table:
    """Mirrors struct ib_rwq_ind_table: 1 << log_ind_tbl_size WQs an RSS QP spreads
    its receives over; usecnt counts those QPs."""

    def __init__(self, device: ib_device):
        self.device = device
        self.uobject: Any = None
        self.ind_tbl_num = 0
        self.log_ind_tbl_size = 0
        self.ind_tbl: list = []
        self.usecnt = atomic_t(0)

    def __repr__(self) -> str:
        return (f"RWQ_IND_TBL {self.ind_tbl_num:#x} size=2^{self.log_ind_tbl_size} "
                f"usecnt={self.usecnt.counter}")


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
    source_qpn: int = 0
    event_handler: Any = None      # called with (ib_event, qp_context)
    qp_context: Any = None


class ib_qp:
    """Mirrors struct ib_qp."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.send_cq: ib_cq | None = None
        self.recv_cq: ib_cq | None = None
        self.srq: Any = None
        self.xrcd: Any = None         # an XRC target QP's domain
        self.uobject: Any = None
        self.qp_num = 0
        self.qp_type = IB_QPT_RC
        self.usecnt = atomic_t(0)
        self.port = 0                 # set by a modify with IB_QP_PORT
        self.av_sgid_attr: Any = None  # the source GID entry of the primary path (held)
        self.event_handler: Any = None  # (ib_event, qp_context): its async events
        self.qp_context: Any = None

    def __repr__(self) -> str:
        return f"QP {self.qp_num:#x} type={self.qp_type}"


class ib_ah:
    """Mirrors struct ib_ah: an address handle in a PD (the driver's struct embeds it)."""

    def __init__(self, device: ib_device):
        self.device = device
        self.pd: ib_pd | None = None
        self.uobject: Any = None
        self.type = RDMA_AH_ATTR_TYPE_UNDEFINED
        self.sgid_attr: Any = None    # the source GID entry (held while the AH lives)

    def __repr__(self) -> str:
        return f"AH {self.device.name} type={self.type}"


@attrs.define
class rdma_ah_init_attr:
    """Mirrors struct rdma_ah_init_attr: what create_ah / create_user_ah get."""

    ah_attr: Any = None
    flags: int = 0
    xmit_slave: Any = None


@attrs.define
class ib_global_route:
    """Mirrors struct ib_global_route: the GRH of an address vector."""

    sgid_attr: Any = None   # the GID table entry sgid_index names, once resolved
    dgid: bytes = bytes(16)
    flow_label: int = 0
    sgid_index: int = 0
    hop_limit: int = 0
    traffic_class: int = 0


@attrs.define
class rdma_ah_attr:
    """Mirrors struct rdma_ah_attr (the IB and RoCE members of its union side by side)."""

    grh: ib_global_route = attrs.Factory(ib_global_route)
    sl: int = 0
    static_rate: int = 0
    port_num: int = 0
    ah_flags: int = 0
    type: int = RDMA_AH_ATTR_TYPE_UNDEFINED
    dlid: int = 0           # ib.dlid
    src_path_bits: int = 0  # ib.src_path_bits
    dmac: bytes = bytes(6)  # roce.dmac


@attrs.define
class ib_qp_attr:
    """Mirrors struct ib_qp_attr: what MODIFY_QP sets (per attr_mask) and QUERY_QP reports."""

    qp_state: int = IB_QPS_RESET
    cur_qp_state: int = IB_QPS_RESET
    path_mtu: int = 0
    path_mig_state: int = IB_MIG_MIGRATED
    qkey: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    dest_qp_num: int = 0
    qp_access_flags: int = 0
    cap: ib_qp_cap = attrs.Factory(ib_qp_cap)
    ah_attr: rdma_ah_attr = attrs.Factory(rdma_ah_attr)
    alt_ah_attr: rdma_ah_attr = attrs.Factory(rdma_ah_attr)
    pkey_index: int = 0
    alt_pkey_index: int = 0
    en_sqd_async_notify: int = 0
    sq_draining: int = 0
    max_rd_atomic: int = 0
    max_dest_rd_atomic: int = 0
    min_rnr_timer: int = 0
    port_num: int = 0
    timeout: int = 0
    retry_cnt: int = 0
    rnr_retry: int = 0
    alt_port_num: int = 0
    alt_timeout: int = 0
    rate_limit: int = 0


def _core_cap_flags(device: ib_device, port: int) -> int:
    immutable = device.port_data.get(port)
    return immutable.core_cap_flags if immutable is not None else 0


def rdma_protocol_ib(device: ib_device, port: int) -> bool:
    """Mirrors rdma_protocol_ib()."""
    return bool(_core_cap_flags(device, port) & RDMA_CORE_CAP_PROT_IB)


def rdma_protocol_roce_eth_encap(device: ib_device, port: int) -> bool:
    """Mirrors rdma_protocol_roce_eth_encap(): RoCE v1."""
    return bool(_core_cap_flags(device, port) & RDMA_CORE_CAP_PROT_ROCE)


def rdma_protocol_roce_udp_encap(device: ib_device, port: int) -> bool:
    """Mirrors rdma_protocol_roce_udp_encap(): RoCE v2."""
    return bool(_core_cap_flags(device, port) & RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP)


def rdma_protocol_roce(device: ib_device, port: int) -> bool:
    """Mirrors rdma_protocol_roce(): either RoCE version."""
    return rdma_protocol_roce_eth_encap(device, port) or \
        rdma_protocol_roce_udp_encap(device, port)


def rdma_ah_find_type(device: ib_device, port: int) -> int:
    """Mirrors rdma_ah_find_type(): what kind of address vector a port takes."""
    if rdma_protocol_roce(device, port):
        return RDMA_AH_ATTR_TYPE_ROCE
    if rdma_protocol_ib(device, port):
        return RDMA_AH_ATTR_TYPE_IB
    return RDMA_AH_ATTR_TYPE_UNDEFINED


def rdma_calc_flow_label(lqpn: int, rqpn: int) -> int:
    """Mirrors rdma_calc_flow_label(): a flow label from the two QPNs (for ECMP)."""
    v = lqpn * rqpn & (1 << 64) - 1
    v ^= v >> 20
    v ^= v >> 40
    return v & IB_GRH_FLOWLABEL_MASK


def rdma_flow_label_to_udp_sport(fl: int) -> int:
    """Mirrors rdma_flow_label_to_udp_sport(): RoCE v2's UDP source port from a flow label."""
    fl_low, fl_high = fl & 0x03FFF, fl & 0xFC000
    fl_low ^= fl_high >> 14
    return fl_low | IB_ROCE_UDP_ENCAP_VALID_PORT_MIN


def ib_check_mr_access(device: ib_device, flags: int) -> None:
    """Mirrors ib_check_mr_access(): remote write or atomic need local write;
    unknown bits are EINVAL, ODP without device support EOPNOTSUPP."""
    if flags & ~IB_ACCESS_SUPPORTED:
        raise KernelError(EINVAL, f"ib_check_mr_access: unknown access flags {flags:#x}")
    if flags & (IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_REMOTE_WRITE) and \
            not flags & IB_ACCESS_LOCAL_WRITE:
        raise KernelError(EINVAL, "ib_check_mr_access: remote write/atomic without "
                          "local write")
    if flags & IB_ACCESS_ON_DEMAND and not device.attrs.kernel_cap_flags & IBK_ON_DEMAND_PAGING:
        raise KernelError(EOPNOTSUPP, "ib_check_mr_access: on-demand paging not supported")


def ib_access_writable(access_flags: int) -> bool:
    """Mirrors ib_access_writable() (ib_verbs.h): may the device write this memory?

    MW_BIND counts: binding a window may grant remote write later.
    """
    return bool(access_flags & (IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE
                                | IB_ACCESS_REMOTE_ATOMIC | IB_ACCESS_MW_BIND))


def rdma_start_port(device: ib_device) -> int:
    """Mirrors rdma_start_port(): 1 for a CA."""
    return 1


def rdma_end_port(device: ib_device) -> int:
    """Mirrors rdma_end_port()."""
    return device.phys_port_cnt


def rdma_is_port_valid(device: ib_device, port: int) -> bool:
    """Mirrors rdma_is_port_valid()."""
    return rdma_start_port(device) <= port <= rdma_end_port(device)
