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


@attrs.define(eq=False)
class ibv_pd:
    context: ibv_context
    handle: int


@attrs.define(eq=False)
class ibv_mr:
    context: ibv_context
    pd: ibv_pd
    addr: int
    length: int
    handle: int
    lkey: int
    rkey: int


@attrs.define(eq=False)
class ibv_cq:
    context: ibv_context
    handle: int
    cqe: int


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
