"""Mirrors rdma-core libibverbs/verbs.h: the verbs enums and the structs an application
and a provider share (ibv_device, ibv_context, ibv_pd, ibv_mr, ibv_cq, ibv_qp and the
attribute structs), with no verb behind them.

The header of libibverbs: the command layer (cmd.py), the verbs (verbs.py) and the
providers include it, so the command layer no longer imports the verbs above it.
verbs.py re-exports every name here, so callers keep `from userspace.libibverbs.verbs
import ...`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from userspace.libibverbs.driver import verbs_context_ops

# enum ibv_access_flags
IBV_ACCESS_LOCAL_WRITE = 1
IBV_ACCESS_REMOTE_WRITE = 2
IBV_ACCESS_REMOTE_READ = 4
IBV_ACCESS_REMOTE_ATOMIC = 8
IBV_ACCESS_MW_BIND = 16
IBV_ACCESS_ZERO_BASED = 32
IBV_ACCESS_ON_DEMAND = 64
IBV_ACCESS_RELAXED_ORDERING = 1 << 20
# enum ibv_qp_type
IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD, IBV_QPT_RAW_PACKET = 2, 3, 4, 8
IBV_QPT_XRC_SEND, IBV_QPT_XRC_RECV, IBV_QPT_DRIVER = 9, 10, 0xFF
# enum ibv_qp_init_attr_mask
IBV_QP_INIT_ATTR_PD, IBV_QP_INIT_ATTR_XRCD, IBV_QP_INIT_ATTR_CREATE_FLAGS = 1 << 0, 1 << 1, 1 << 2
IBV_QP_INIT_ATTR_MAX_TSO_HEADER, IBV_QP_INIT_ATTR_IND_TABLE = 1 << 3, 1 << 4
IBV_QP_INIT_ATTR_RX_HASH, IBV_QP_INIT_ATTR_SEND_OPS_FLAGS = 1 << 5, 1 << 6
# enum ibv_qp_create_flags
IBV_QP_CREATE_BLOCK_SELF_MCAST_LB, IBV_QP_CREATE_SCATTER_FCS = 1 << 1, 1 << 8
IBV_QP_CREATE_CVLAN_STRIPPING, IBV_QP_CREATE_SOURCE_QPN = 1 << 9, 1 << 10
IBV_QP_CREATE_PCI_WRITE_END_PADDING = 1 << 11
# enum ibv_qp_state
IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS = 0, 1, 2, 3
IBV_QPS_SQD, IBV_QPS_SQE, IBV_QPS_ERR = 4, 5, 6
# enum ibv_qp_attr_mask
IBV_QP_STATE, IBV_QP_CUR_STATE, IBV_QP_EN_SQD_ASYNC_NOTIFY = 1 << 0, 1 << 1, 1 << 2
IBV_QP_ACCESS_FLAGS, IBV_QP_PKEY_INDEX, IBV_QP_PORT, IBV_QP_QKEY = 1 << 3, 1 << 4, 1 << 5, 1 << 6
IBV_QP_AV, IBV_QP_PATH_MTU, IBV_QP_TIMEOUT, IBV_QP_RETRY_CNT = 1 << 7, 1 << 8, 1 << 9, 1 << 10
IBV_QP_RNR_RETRY, IBV_QP_RQ_PSN, IBV_QP_MAX_QP_RD_ATOMIC = 1 << 11, 1 << 12, 1 << 13
IBV_QP_ALT_PATH, IBV_QP_MIN_RNR_TIMER, IBV_QP_SQ_PSN = 1 << 14, 1 << 15, 1 << 16
IBV_QP_MAX_DEST_RD_ATOMIC, IBV_QP_PATH_MIG_STATE, IBV_QP_CAP = 1 << 17, 1 << 18, 1 << 19
IBV_QP_DEST_QPN, IBV_QP_RATE_LIMIT = 1 << 20, 1 << 25
# enum ibv_mtu, ibv_mig_state
IBV_MTU_256, IBV_MTU_512, IBV_MTU_1024, IBV_MTU_2048, IBV_MTU_4096 = 1, 2, 3, 4, 5
IBV_MIG_MIGRATED, IBV_MIG_REARM, IBV_MIG_ARMED = 0, 1, 2


@attrs.define(eq=False)
class ibv_device:
    """Mirrors struct ibv_device (+ verbs_sysfs_dev): one uverbs device found in sysfs."""

    name: str  # the ib device: mlx5_0
    dev_name: str  # uverbs0
    dev_path: str  # /dev/infiniband/uverbs0
    ibdev_path: str  # /sys/class/infiniband/mlx5_0
    abi_version: int
    vendor_id: int
    vendor_part_id: int
    node_guid: int
    ops: verbs_context_ops | None = None
    sysfs_cdev: int = 0  # the uverbs node's dev_t, from its sysfs `dev` (makedev)


@attrs.define(eq=False)
class ibv_context:
    """Mirrors struct ibv_context / verbs_context: an open device in one process."""

    device: ibv_device
    proc: Any
    cmd_fd: int
    ops: verbs_context_ops
    cmd_buf: int = 0
    async_fd: int = -1
    num_comp_vectors: int = 0
    imported: bool = False  # verbs_context priv->imported: made by ibv_import_device


@attrs.define(eq=False)
class ibv_pd:
    context: ibv_context
    handle: int


# enum ibv_parent_domain_init_attr_mask; IBV_ALLOCATOR_USE_DEFAULT is ((void *)-1)
IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS, IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT = 1, 2
IBV_ALLOCATOR_USE_DEFAULT = (1 << 64) - 1


@attrs.define(eq=False)
class ibv_parent_domain_init_attr:
    """Mirrors struct ibv_parent_domain_init_attr: the PD (and thread domain) a parent
    domain wraps; alloc(pd, pd_context, size, alignment, resource_type) -> address
    (0: failure, IBV_ALLOCATOR_USE_DEFAULT: the library's own allocation) and
    free(pd, pd_context, ptr, resource_type), valid when comp_mask has ALLOCATORS."""

    pd: ibv_pd | None = None
    td: Any = None
    comp_mask: int = 0
    alloc: Any = None
    free: Any = None
    pd_context: Any = None


# enum ibv_mr_type (driver.h: struct verbs_mr's mr_type)
IBV_MR_TYPE_MR, IBV_MR_TYPE_NULL_MR, IBV_MR_TYPE_IMPORTED_MR, IBV_MR_TYPE_DMABUF_MR = 0, 1, 2, 3

# enum ibv_rereg_mr_flags and enum ibv_rereg_mr_err_code
IBV_REREG_MR_CHANGE_TRANSLATION, IBV_REREG_MR_CHANGE_PD, IBV_REREG_MR_CHANGE_ACCESS = 1, 2, 4
IBV_REREG_MR_FLAGS_SUPPORTED = 7
IBV_REREG_MR_ERR_INPUT, IBV_REREG_MR_ERR_DONT_FORK_NEW, IBV_REREG_MR_ERR_DO_FORK_OLD = -1, -2, -3
IBV_REREG_MR_ERR_CMD, IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW = -4, -5


@attrs.define(eq=False)
class ibv_mr:
    """struct ibv_mr, with struct verbs_mr's mr_type."""

    context: ibv_context
    pd: ibv_pd
    addr: int
    length: int
    handle: int
    lkey: int
    rkey: int
    mr_type: int = IBV_MR_TYPE_MR


# enum ibv_mw_type
IBV_MW_TYPE_1, IBV_MW_TYPE_2 = 1, 2


@attrs.define(eq=False)
class ibv_mw:
    """struct ibv_mw: a memory window; rkey is the key of its current binding."""

    context: ibv_context
    pd: ibv_pd
    rkey: int
    handle: int
    type: int


@attrs.define(eq=False)
class ibv_comp_channel:
    """Mirrors struct ibv_comp_channel: the completion event file; refcnt counts its CQs."""

    context: ibv_context
    fd: int
    refcnt: int = 0


@attrs.define(eq=False)
class ibv_cq:
    """Mirrors struct ibv_cq (verbs_init_cq's fields: channel, cq_context, the
    events read and acknowledged)."""

    context: ibv_context
    handle: int
    cqe: int
    channel: ibv_comp_channel | None = None
    cq_context: Any = None
    comp_events_completed: int = 0
    async_events_completed: int = 0


# enum ibv_create_cq_wc_flags, ibv_cq_init_attr_mask, ibv_create_cq_attr_flags
IBV_WC_EX_WITH_BYTE_LEN, IBV_WC_EX_WITH_IMM, IBV_WC_EX_WITH_QP_NUM = 1 << 0, 1 << 1, 1 << 2
IBV_WC_EX_WITH_SRC_QP, IBV_WC_EX_WITH_SLID, IBV_WC_EX_WITH_SL = 1 << 3, 1 << 4, 1 << 5
IBV_WC_EX_WITH_DLID_PATH_BITS, IBV_WC_EX_WITH_COMPLETION_TIMESTAMP = 1 << 6, 1 << 7
IBV_WC_EX_WITH_CVLAN, IBV_WC_EX_WITH_FLOW_TAG, IBV_WC_EX_WITH_TM_INFO = 1 << 8, 1 << 9, 1 << 10
IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK = 1 << 11
IBV_WC_STANDARD_FLAGS = (1 << 7) - 1
IBV_CREATE_CQ_SUP_WC_FLAGS = (1 << 12) - 1
IBV_CQ_INIT_ATTR_MASK_FLAGS, IBV_CQ_INIT_ATTR_MASK_PD, IBV_CQ_INIT_ATTR_MASK_RESERVED = 1, 2, 4
IBV_CREATE_CQ_ATTR_SINGLE_THREADED, IBV_CREATE_CQ_ATTR_IGNORE_OVERRUN = 1, 2


@attrs.define(eq=False)
class ibv_cq_init_attr_ex:
    """Mirrors struct ibv_cq_init_attr_ex."""

    cqe: int = 0
    cq_context: Any = None
    channel: ibv_comp_channel | None = None
    comp_vector: int = 0
    wc_flags: int = 0
    comp_mask: int = 0
    flags: int = 0
    parent_domain: Any = None


@attrs.define(eq=False)
class ibv_poll_cq_attr:
    comp_mask: int = 0


@attrs.define(eq=False)
class ibv_cq_ex(ibv_cq):
    """Mirrors struct ibv_cq_ex: ibv_cq, the current completion's wr_id and status, and
    the provider's polling entry points (a read_* the CQ was not created with is None,
    as the C pointer would be unset)."""

    wr_id: int = 0
    status: int = 0
    wc_flags_req: int = 0
    start_poll: Any = None
    next_poll: Any = None
    end_poll: Any = None
    read_opcode: Any = None
    read_vendor_err: Any = None
    read_byte_len: Any = None
    read_imm_data: Any = None
    read_qp_num: Any = None
    read_src_qp: Any = None
    read_wc_flags: Any = None
    read_slid: Any = None
    read_sl: Any = None
    read_dlid_path_bits: Any = None
    read_completion_ts: Any = None
    read_cvlan: Any = None
    read_flow_tag: Any = None
    read_tm_info: Any = None
    read_completion_wallclock_ns: Any = None


@attrs.define
class ibv_qp_cap:
    max_send_wr: int = 0
    max_recv_wr: int = 0
    max_send_sge: int = 0
    max_recv_sge: int = 0
    max_inline_data: int = 0


@attrs.define(eq=False)
class ibv_qp_init_attr:
    send_cq: ibv_cq | None = None
    recv_cq: ibv_cq | None = None
    srq: Any = None
    cap: ibv_qp_cap = attrs.Factory(ibv_qp_cap)
    qp_type: int = IBV_QPT_RC
    sq_sig_all: int = 0


@attrs.define(eq=False)
class ibv_qp_init_attr_ex(ibv_qp_init_attr):
    """Mirrors struct ibv_qp_init_attr_ex: ibv_qp_init_attr's fields, then those
    comp_mask (IBV_QP_INIT_ATTR_*) says are valid."""

    comp_mask: int = 0
    pd: Any = None
    xrcd: Any = None
    create_flags: int = 0
    max_tso_header: int = 0
    rwq_ind_tbl: Any = None
    rx_hash_conf: Any = None
    source_qpn: int = 0
    send_ops_flags: int = 0


@attrs.define
class ibv_global_route:
    """Mirrors struct ibv_global_route (dgid: the 16 raw bytes of union ibv_gid)."""

    dgid: bytes = bytes(16)
    flow_label: int = 0
    sgid_index: int = 0
    hop_limit: int = 0
    traffic_class: int = 0


@attrs.define
class ibv_ah_attr:
    """Mirrors struct ibv_ah_attr."""

    grh: ibv_global_route = attrs.Factory(ibv_global_route)
    dlid: int = 0
    sl: int = 0
    src_path_bits: int = 0
    static_rate: int = 0
    is_global: int = 0
    port_num: int = 0


@attrs.define(eq=False)
class ibv_ah:
    """Mirrors struct ibv_ah (handle: the kernel's, when it made one)."""

    context: ibv_context
    pd: ibv_pd
    handle: int = 0


@attrs.define
class ibv_qp_attr:
    """Mirrors struct ibv_qp_attr: what ibv_modify_qp sets (the fields attr_mask
    names) and ibv_query_qp reports."""

    qp_state: int = IBV_QPS_RESET
    cur_qp_state: int = IBV_QPS_RESET
    path_mtu: int = 0
    path_mig_state: int = IBV_MIG_MIGRATED
    qkey: int = 0
    rq_psn: int = 0
    sq_psn: int = 0
    dest_qp_num: int = 0
    qp_access_flags: int = 0
    cap: ibv_qp_cap = attrs.Factory(ibv_qp_cap)
    ah_attr: ibv_ah_attr = attrs.Factory(ibv_ah_attr)
    alt_ah_attr: ibv_ah_attr = attrs.Factory(ibv_ah_attr)
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


@attrs.define(eq=False)
class ibv_qp:
    context: ibv_context
    pd: ibv_pd
    send_cq: ibv_cq | None
    recv_cq: ibv_cq | None
    handle: int
    qp_num: int
    qp_type: int
    state: int = IBV_QPS_RESET
    qp_ex: Any = None    # struct ibv_qp_ex when created with send ops (VERBS_QP_EX)
    srq: Any = None      # the SRQ it takes its receives from
    events_completed: int = 0   # async events acknowledged (ibv_ack_async_event)
    # EMU: DESTROY_QP's events_reported, kept for ibv_destroy_qp's wait (C's
    # ibv_cmd_destroy_qp waits itself, holding the QP)
    events_reported: int = 0


# -- shared receive queues ----------------------------------------------------------------
# enum ibv_srq_attr_mask, enum ibv_srq_type, enum ibv_srq_init_attr_mask
IBV_SRQ_MAX_WR, IBV_SRQ_LIMIT = 1 << 0, 1 << 1
IBV_SRQT_BASIC, IBV_SRQT_XRC, IBV_SRQT_TM = 0, 1, 2
IBV_SRQ_INIT_ATTR_TYPE, IBV_SRQ_INIT_ATTR_PD, IBV_SRQ_INIT_ATTR_XRCD = 1 << 0, 1 << 1, 1 << 2
IBV_SRQ_INIT_ATTR_CQ, IBV_SRQ_INIT_ATTR_TM = 1 << 3, 1 << 4


@attrs.define
class ibv_srq_attr:
    """Mirrors struct ibv_srq_attr."""

    max_wr: int = 0
    max_sge: int = 0
    srq_limit: int = 0


@attrs.define(eq=False)
class ibv_srq_init_attr:
    """Mirrors struct ibv_srq_init_attr."""

    srq_context: Any = None
    attr: ibv_srq_attr = attrs.Factory(ibv_srq_attr)


@attrs.define(eq=False)
class ibv_srq_init_attr_ex(ibv_srq_init_attr):
    """Mirrors struct ibv_srq_init_attr_ex."""

    comp_mask: int = 0
    srq_type: int = IBV_SRQT_BASIC
    pd: Any = None
    xrcd: Any = None
    cq: Any = None
    tm_cap: Any = None


@attrs.define(eq=False)
class ibv_srq:
    """Mirrors struct ibv_srq (+ verbs_srq: srq_type, xrcd, cq, srq_num)."""

    context: ibv_context
    pd: ibv_pd | None
    handle: int = 0
    srq_context: Any = None
    srq_type: int = IBV_SRQT_BASIC
    events_completed: int = 0
    xrcd: Any = None
    cq: Any = None
    srq_num: int = 0


# enum ibv_xrcd_init_attr_mask
IBV_XRCD_INIT_ATTR_FD, IBV_XRCD_INIT_ATTR_OFLAGS, IBV_XRCD_INIT_ATTR_RESERVED = 1, 2, 4


@attrs.define
class ibv_xrcd_init_attr:
    """Mirrors struct ibv_xrcd_init_attr."""

    comp_mask: int = 0
    fd: int = -1
    oflags: int = 0


@attrs.define(eq=False)
class ibv_xrcd:
    """Mirrors struct ibv_xrcd (+ verbs_xrcd: the handle)."""

    context: ibv_context
    handle: int = 0


# -- ibv_query_device_ex, ibv_query_gid_ex / _table ------------------------------------
@attrs.define
class ibv_odp_caps:
    """Mirrors struct ibv_odp_caps (per_transport_caps flattened)."""

    general_caps: int = 0
    rc_odp_caps: int = 0
    uc_odp_caps: int = 0
    ud_odp_caps: int = 0


@attrs.define
class ibv_tso_caps:
    max_tso: int = 0
    supported_qpts: int = 0


@attrs.define
class ibv_rss_caps:
    supported_qpts: int = 0
    max_rwq_indirection_tables: int = 0
    max_rwq_indirection_table_size: int = 0
    rx_hash_fields_mask: int = 0
    rx_hash_function: int = 0


@attrs.define
class ibv_packet_pacing_caps:
    qp_rate_limit_min: int = 0
    qp_rate_limit_max: int = 0
    supported_qpts: int = 0


@attrs.define
class ibv_tm_caps:
    max_rndv_hdr_size: int = 0
    max_num_tags: int = 0
    flags: int = 0
    max_ops: int = 0
    max_sge: int = 0


@attrs.define
class ibv_cq_moderation_caps:
    max_cq_count: int = 0
    max_cq_period: int = 0


@attrs.define
class ibv_pci_atomic_caps:
    fetch_add: int = 0
    swap: int = 0
    compare_swap: int = 0


# enum ibv_values_mask
IBV_VALUES_MASK_RAW_CLOCK = 1 << 0


@attrs.define(eq=False)
class ibv_values_ex:
    """Mirrors struct ibv_values_ex (ibv_query_rt_values_ex): comp_mask in (what to
    read) and out (what was read); raw_clock is the struct timespec (tv_sec, tv_nsec)."""

    comp_mask: int = 0
    raw_clock: tuple[int, int] = (0, 0)


@attrs.define(eq=False)
class ibv_device_attr_ex:
    """Mirrors struct ibv_device_attr_ex: orig_attr is what ibv_query_device gives
    (here the core's ib_uverbs_query_device_resp, as ibv_query_device returns it)."""

    orig_attr: Any = None
    comp_mask: int = 0
    odp_caps: ibv_odp_caps = attrs.Factory(ibv_odp_caps)
    completion_timestamp_mask: int = 0
    hca_core_clock: int = 0
    device_cap_flags_ex: int = 0
    tso_caps: ibv_tso_caps = attrs.Factory(ibv_tso_caps)
    rss_caps: ibv_rss_caps = attrs.Factory(ibv_rss_caps)
    max_wq_type_rq: int = 0
    packet_pacing_caps: ibv_packet_pacing_caps = attrs.Factory(ibv_packet_pacing_caps)
    raw_packet_caps: int = 0
    tm_caps: ibv_tm_caps = attrs.Factory(ibv_tm_caps)
    cq_mod_caps: ibv_cq_moderation_caps = attrs.Factory(ibv_cq_moderation_caps)
    max_dm_size: int = 0
    pci_atomic_caps: ibv_pci_atomic_caps = attrs.Factory(ibv_pci_atomic_caps)
    xrc_odp_caps: int = 0
    phys_port_cnt_ex: int = 0


# enum ibv_gid_type
IBV_GID_TYPE_IB, IBV_GID_TYPE_ROCE_V1, IBV_GID_TYPE_ROCE_V2 = 0, 1, 2


@attrs.define
class ibv_gid_entry:
    """Mirrors struct ibv_gid_entry (gid: the 16 raw bytes of union ibv_gid)."""

    gid: bytes = bytes(16)
    gid_index: int = 0
    port_num: int = 0
    gid_type: int = 0
    ndev_ifindex: int = 0
