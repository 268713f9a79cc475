"""Mirrors drivers/infiniband/hw/mlx5/mlx5_ib.h: the driver's structures and small helpers.

The verbs objects the core allocates for this driver are subclasses of the
core's (`size_ib_pd=mlx5_ib_pd` in the ops table), so to_mpd(pd) is pd itself.
Each struct lists its fields under the lock that protects them.

Locks (facts §11): bfregi.lock (mutex) - bfreg counts and the dynamic-page
busy marks; context.db_page_mutex - the user doorbell pages;
dev.reset_flow_resource_lock (spinlock) + each CQ's lock, taken in CQN
order, around the QP lists; dev.lb.mutex - the loopback counters.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivers.ib_core.device import ib_device
from drivers.ib_core.ib_core_uverbs import rdma_user_mmap_entry
from drivers.ib_core.ib_verbs import ib_cq, ib_mr, ib_mw, ib_pd, ib_qp, ib_ucontext
from drivers.mlx5_core.cq import mlx5_core_cq
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.locking import mutex_init, spin_lock_init

if TYPE_CHECKING:
    from drivers.ib_core.umem import ib_umem
    from drivers.mlx5_core.cq import mlx5_core_cq
    from drivers.mlx5_core.driver import mlx5_core_dev
    from kernel_model.mm import mm_struct

# mlx5_ib.h
MLX5_IB_MMAP_CMD_SHIFT = 8
MLX5_IB_MMAP_CMD_MASK = 0xFF
MLX5_IB_MMAP_OFFSET_START = 9
MLX5_IB_MMAP_OFFSET_END = 255
MLX5_IB_INVALID_UAR_INDEX = 1 << 31
MLX5_IB_INVALID_BFREG = 1 << 31
MLX5_IB_DEFAULT_UIDX = 0xFFFFFF
MLX5_USER_ASSIGNED_UIDX_MASK = (1 << 24) - 1
MLX5_CROSS_CHANNEL_BFREG = 0
MLX5_CQE_VERSION_V0, MLX5_CQE_VERSION_V1 = 0, 1
MLX5_IB_CQ_PR_FLAGS_CQE_128_PAD = 1 << 0
MLX5_IB_CQ_PR_FLAGS_REAL_TIME_TS = 1 << 1
# enum mlx5_ib_mmap_type
MLX5_IB_MMAP_TYPE_MEMIC = 1
MLX5_IB_MMAP_TYPE_VAR = 2
MLX5_IB_MMAP_TYPE_UAR_WC = 3
MLX5_IB_MMAP_TYPE_UAR_NC = 4
MLX5_IB_MMAP_TYPE_MEMIC_OP = 5
MLX5_IB_MMAP_TYPE_TLP_VAR = 6
# include/linux/mlx5/device.h
MLX5_MIN_DYN_BFREGS = 512
MLX5_MAX_DYN_BFREGS = 1024
MLX5_MKEY_MR, MLX5_MKEY_MW = 1, 2
# include/linux/mlx5/qp.h
MLX5_SEND_WQE_BB = 64
MLX5_SEND_WQE_DS = 16
MLX5_RCV_DBR, MLX5_SND_DBR = 0, 1


def MLX5_UARS_IN_PAGE() -> int:
    """Mirrors MLX5_UARS_IN_PAGE: 4 KiB UARs per system page (1 on x86, 16 on 64K)."""
    return current().machine.page_size // 4096


def PAGE_SIZE() -> int:
    """The machine's PAGE_SIZE (a Machine parameter: never hard-code 4096)."""
    return current().machine.page_size


def PAGE_SHIFT() -> int:
    return current().machine.page_shift


# -- the device -------------------------------------------------------------------------
class mlx5_ib_lb_state:
    """Mirrors struct mlx5_ib_lb_state: local loopback users."""

    def __init__(self) -> None:
        self.mutex = mutex_init("&dev->lb.mutex")
        # protected by mutex:
        self.user_td = 0
        self.qps = 0
        self.enabled = False


class mlx5_ib_port:
    """Mirrors struct mlx5_ib_port (what a RoCE port needs here)."""

    def __init__(self, num: int):
        self.num = num

    def __repr__(self) -> str:
        return f"mlx5_ib_port {self.num}"


class mlx5_ib_dev(ib_device):
    """Mirrors struct mlx5_ib_dev: the RDMA device over one mlx5_core function."""

    def __init__(self) -> None:
        super().__init__()
        self.mdev: mlx5_core_dev | None = None
        self.adev: Any = None
        self.num_ports = 0
        self.port: list[mlx5_ib_port] = []
        self.ib_active = False
        # module parameters (see __init__.py)
        self.dyn_uar = False
        self.mkey_update_tag = False
        self.comp_mask_v6 = False
        self.release: tuple[int, int] | None = None  # None: upstream, every fix in
        self.wc_support = False
        self.dump_fill_mkey = 0
        self.null_mkey = 0            # QUERY_SPECIAL_CONTEXTS (implicit ODP only)
        self.clock_info: Any = None     # mdev->clock_info: the page CLOCK_INFO maps
        self.dm: Any = None             # struct mlx5_dm (dm.py): the MEMIC page bitmap
        self.lb = mlx5_ib_lb_state()
        self.mkey_var = 0               # atomic: the 8-bit mkey variant counter
        self.pkey_table_len = 0
        self.stages_done: list[Any] = []
        self.reset_flow_resource_lock = spin_lock_init("&dev->reset_flow_resource_lock")
        # protected by reset_flow_resource_lock:
        self.qp_list: list[mlx5_ib_qp] = []

    def __repr__(self) -> str:
        state = "active" if self.ib_active else "inactive"
        return (f"mlx5_ib_dev {self.name or '?'} {state} ports={self.num_ports} "
                f"qps={len(self.qp_list)}")


def mlx5_ib_warn(dev: mlx5_ib_dev, msg: str) -> None:
    """Mirrors mlx5_ib_warn()/mlx5_ib_err(): a log line for the device.

    # EMU: no printk buffer; the line goes to the mlx5_core_dev's log.
    """
    dev.mdev.log.append(f"mlx5_ib {dev.name or '?'}: {msg}")


# -- the `release` module parameter ------------------------------------------------------------
#: Fixes the model knows, by the first release assumed to carry each.  A device
#: loaded with an older `release` keeps the bug (each use is marked # EMU: there).
MLX5_IB_FIXES: dict[str, tuple[int, int]] = {
    # uar_mmap's ALLOC_WC error path passes the page slot `idx` to mlx5_cmd_uar_dealloc
    # instead of the uar_index the firmware returned (since v4.15's ALLOC_WC); the model's
    # default frees the allocated UAR.  EMU: no released kernel with that fix is on
    # record here; 7.2 is an assumed boundary so older releases keep the bug.
    "uar_mmap_dealloc_uar_index": (7, 2),
}


def parse_kernel_release(release: str) -> tuple[int, int] | None:
    """"upstream" -> None; "6.8" (or "6.8.12") -> (6, 8); anything else is EINVAL."""
    if release == "upstream":
        return None
    parts = release.split(".")
    if len(parts) < 2 or not all(x.isdigit() for x in parts[:3]):
        raise KernelError(EINVAL, f"mlx5_ib: release {release!r} is not 'upstream' or "
                          "MAJOR.MINOR")
    return int(parts[0]), int(parts[1])


def mlx5_ib_release_has(dev: mlx5_ib_dev, fix: str) -> bool:
    """Does the release the device was loaded as carry this fix (MLX5_IB_FIXES)?"""
    return dev.release is None or dev.release >= MLX5_IB_FIXES[fix]


def to_mdev(ibdev: ib_device) -> mlx5_ib_dev:
    """Mirrors to_mdev(): the driver struct embedding ib_device (the object itself)."""
    return ibdev  # type: ignore[return-value]


# -- user context ----------------------------------------------------------------------
class mlx5_bfreg_info:
    """Mirrors struct mlx5_bfreg_info: the context's static and dynamic bfreg space."""

    def __init__(self) -> None:
        self.lock = mutex_init("&bfregi->lock")
        # protected by lock:
        self.count: list[int] = []          # users of each bfreg
        self.sys_pages: list[int] = []      # FW UAR index of each system page
        # fixed after alloc_ucontext:
        self.ver = 0
        self.lib_uar_4k = False
        self.lib_uar_dyn = False
        self.total_num_bfregs = 0           # static + dynamic
        self.num_low_latency_bfregs = 0
        self.num_static_sys_pages = 0
        self.num_dyn_bfregs = 0
        self.num_sys_pages = 0

    def __repr__(self) -> str:
        if self.lib_uar_dyn:
            return "bfregi dyn-UAR (no static bfregs)"
        return (f"bfregi v{self.ver} total={self.total_num_bfregs} "
                f"low_lat={self.num_low_latency_bfregs} static_pages="
                f"{self.num_static_sys_pages} sys_pages={self.num_sys_pages}")


class mlx5_ib_ucontext(ib_ucontext):
    """Mirrors struct mlx5_ib_ucontext."""

    def __init__(self, device: ib_device, ufile: Any = None):
        super().__init__(device, ufile)
        self.bfregi = mlx5_bfreg_info()
        self.cqe_version = 0
        self.tdn = 0
        self.devx_uid = 0
        self.lib_caps = 0
        self.mmap_xa: dict[int, rdma_user_mmap_entry] = {}
        # EMU: UAR objects whose DEALLOC_UAR found the UAR still named by a CQ/QP
        # (mlx5_ib_mmap_free); retried by mlx5_ib_dealloc_ucontext
        self.busy_uars: list[int] = []
        self.db_page_mutex = mutex_init("&context->db_page_mutex")
        # protected by db_page_mutex:
        self.db_page_list: list[mlx5_ib_user_db_page] = []

    def __repr__(self) -> str:
        return (f"mlx5_ib_ucontext {self.device.name} uid={self.devx_uid} tdn={self.tdn:#x} "
                f"{self.bfregi!r} db_pages={len(self.db_page_list)}")


def to_mucontext(ibucontext: ib_ucontext) -> mlx5_ib_ucontext:
    """Mirrors to_mucontext()."""
    return ibucontext  # type: ignore[return-value]


class mlx5_user_mmap_entry(rdma_user_mmap_entry):
    """Mirrors struct mlx5_user_mmap_entry: what an mmap offset stands for."""

    def __init__(self) -> None:
        super().__init__()
        self.mmap_flag = 0
        self.address = 0
        self.page_idx = 0

    def __repr__(self) -> str:
        return (f"mlx5 mmap entry type={self.mmap_flag} uar={self.page_idx:#x} "
                f"addr={self.address:#x} pgoff={self.start_pgoff:#x} "
                f"ref={self.ref.refcount.refs.counter}")


def to_mmmap(entry: rdma_user_mmap_entry) -> mlx5_user_mmap_entry:
    """Mirrors to_mmmap()."""
    return entry  # type: ignore[return-value]


# -- doorbells -----------------------------------------------------------------------
class mlx5_ib_user_db_page:
    """Mirrors struct mlx5_ib_user_db_page (doorbell.c): one pinned user page of
    doorbell records, shared by every QP/CQ of the context whose record is on it."""

    def __init__(self, user_virt: int) -> None:
        self.user_virt = user_virt
        self.umem: ib_umem | None = None
        self.refcnt = 0
        self.mm: mm_struct | None = None

    def __repr__(self) -> str:
        return f"db page {self.user_virt:#x} refcnt={self.refcnt}"


class mlx5_db:
    """Mirrors struct mlx5_db (the user flavour: u.user_page)."""

    def __init__(self) -> None:
        self.dma = 0
        self.user_page: mlx5_ib_user_db_page | None = None

    def __repr__(self) -> str:
        return f"mlx5_db dma={self.dma:#x}"


# -- PD, MR --------------------------------------------------------------------------
class mlx5_ib_pd(ib_pd):
    """Mirrors struct mlx5_ib_pd."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.pdn = 0
        self.uid = 0

    def __repr__(self) -> str:
        return f"mlx5_ib_pd pdn={self.pdn:#x} uid={self.uid} usecnt={self.usecnt.counter}"


def to_mpd(pd: ib_pd) -> mlx5_ib_pd:
    """Mirrors to_mpd()."""
    return pd  # type: ignore[return-value]


class mlx5_ib_mkey:
    """Mirrors struct mlx5_ib_mkey."""

    def __init__(self) -> None:
        self.key = 0
        self.type = 0
        self.ndescs = 0

    def __repr__(self) -> str:
        return f"mkey {self.key:#x}"


class mlx5_ib_mw(ib_mw):
    """Mirrors struct mlx5_ib_mw: a memory window is an mkey (KLM, free until bound)."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.mmkey = mlx5_ib_mkey()


class mlx5_ib_mr(ib_mr):
    """Mirrors struct mlx5_ib_mr (a user MR: mkey + umem)."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.mmkey = mlx5_ib_mkey()
        self.umem: ib_umem | None = None
        self.page_shift = 0
        self.access_flags = 0
        self.revoked = False         # a UMR revoked the mkey (peer invalidation or dereg)
        self.peer_id: Any = None     # OFED 4.x peer MRs: their mlx5_ib_peer_id
        self.invalidated = 0         # OFED 4.x: dereg vs invalidation (atomic_t)
        self.invalidation_comp: Any = None
        self.allocated_from_cache = False   # OFED 4.x: the mkey came from the mkey cache
        self.free = False            # OFED 4.x: the mkey is (still) free: UMR not enabled
        self.is_odp_implicit = False  # implicit ODP: the KSM parent of per-GiB children
        self.implicit_children: dict[int, mlx5_ib_mr] = {}   # xarray: slice index -> child
        self.parent: mlx5_ib_mr | None = None   # an implicit child's parent

    def __repr__(self) -> str:
        return (f"mlx5_ib_mr mkey={self.mmkey.key:#x} iova={self.iova:#x} "
                f"len={self.length:#x} page=2^{self.page_shift} access={self.access_flags:#x}")


# -- CQ --------------------------------------------------------------------------------
class mlx5_ib_cq_buf:
    """Mirrors struct mlx5_ib_cq_buf (user CQ: the pinned buffer)."""

    def __init__(self) -> None:
        self.umem: ib_umem | None = None
        self.cqe_size = 0


class mlx5_ib_cq(ib_cq):
    """Mirrors struct mlx5_ib_cq."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.mcq: mlx5_core_cq = mlx5_core_cq()
        self.buf = mlx5_ib_cq_buf()
        self.db = mlx5_db()
        self.cqe_size = 0
        self.private_flags = 0
        self.create_flags = 0
        self.resize_mutex = mutex_init("&cq->resize_mutex")
        self.lock = spin_lock_init("&cq->lock")
        # protected by lock (and dev->reset_flow_resource_lock):
        self.list_send_qp: list[mlx5_ib_qp] = []
        self.list_recv_qp: list[mlx5_ib_qp] = []

    def __repr__(self) -> str:
        return (f"mlx5_ib_cq cqn={self.mcq.cqn:#x} cqe={self.cqe} cqe_size={self.cqe_size} "
                f"qps={len(self.list_send_qp)}/{len(self.list_recv_qp)}")


def to_mcq(cq: ib_cq | None) -> mlx5_ib_cq | None:
    """Mirrors to_mcq()."""
    return cq  # type: ignore[return-value]


# -- QP ----------------------------------------------------------------------------------
class mlx5_ib_wq:
    """Mirrors struct mlx5_ib_wq (the sizes the control path sets)."""

    def __init__(self) -> None:
        self.wqe_cnt = 0
        self.wqe_shift = 0
        self.max_post = 0
        self.max_gs = 0
        self.offset = 0

    def __repr__(self) -> str:
        return f"wq cnt={self.wqe_cnt} shift={self.wqe_shift} offset={self.offset:#x}"


class mlx5_core_qp:
    """Mirrors struct mlx5_core_qp (qp.h): the QP as the firmware numbers it."""

    def __init__(self) -> None:
        self.qpn = 0
        self.uid = 0

    def __repr__(self) -> str:
        return f"mlx5_core_qp {self.qpn:#x} uid={self.uid}"


#: include/rdma/ib_verbs.h IB_QPT_RESERVED3 / _RESERVED4: mlx5_ib.h's DC QP types
MLX5_IB_QPT_DCI = 0x1002
MLX5_IB_QPT_DCT = 0x1003


class mlx5_core_dct:
    """Mirrors struct mlx5_core_dct: the DCT as the firmware numbers it (mqp.qpn is
    the dctn, from the QP number space)."""

    def __init__(self) -> None:
        self.mqp = mlx5_core_qp()


class mlx5_ib_dct:
    """Mirrors struct mlx5_ib_dct: the create_dct_in mailbox create_dct() starts and
    the modify steps fill (`in_`; None once freed), and the firmware's DCT."""

    def __init__(self) -> None:
        self.in_: Any = None
        self.mdct = mlx5_core_dct()


class mlx5_ib_qp_base:
    """Mirrors struct mlx5_ib_qp_base: the firmware QP and the user buffer."""

    def __init__(self) -> None:
        self.mqp = mlx5_core_qp()
        self.umem: ib_umem | None = None


class mlx5_ib_qp_trans:
    """Mirrors struct mlx5_ib_qp_trans: the base, and what modify_qp remembers
    for later transitions (set_qpc_atomic_flags reads them)."""

    def __init__(self) -> None:
        self.base = mlx5_ib_qp_base()
        self.atomic_rd_en = 0   # the last IB_QP_ACCESS_FLAGS
        self.resp_depth = 0     # the last IB_QP_MAX_DEST_RD_ATOMIC
        self.alt_port = 0


class mlx5_ib_ubuffer:
    """Mirrors struct mlx5_ib_ubuffer: a user buffer and its pinning."""

    def __init__(self) -> None:
        self.umem: ib_umem | None = None
        self.buf_size = 0
        self.buf_addr = 0


class mlx5_ib_sq:
    """Mirrors struct mlx5_ib_sq: a raw packet QP's send queue (the firmware SQ, its
    TIS and its own user buffer)."""

    def __init__(self) -> None:
        self.base = mlx5_ib_qp_base()   # base.mqp.qpn: the sqn
        self.ubuffer = mlx5_ib_ubuffer()
        self.tisn = 0
        self.state = 0                  # MLX5_SQC_STATE_*


class mlx5_ib_rq:
    """Mirrors struct mlx5_ib_rq: a raw packet QP's receive queue (the firmware RQ and
    the TIR dispatching to it)."""

    def __init__(self) -> None:
        self.base = mlx5_ib_qp_base()   # base.mqp.qpn: the rqn
        self.tirn = 0
        self.flags = 0                  # MLX5_IB_RQ_CVLAN_STRIPPING, ..._END_PADDING
        self.state = 0                  # MLX5_RQC_STATE_*


class mlx5_ib_raw_packet_qp:
    """Mirrors struct mlx5_ib_raw_packet_qp."""

    def __init__(self) -> None:
        self.sq = mlx5_ib_sq()
        self.rq = mlx5_ib_rq()


class mlx5_ib_qp(ib_qp):
    """Mirrors struct mlx5_ib_qp (user RC/UC/UD)."""

    def __init__(self, device: ib_device):
        super().__init__(device)
        self.trans_qp = mlx5_ib_qp_trans()
        self.type = -1                  # qp->type: qp_type, or MLX5_IB_QPT_DCI / _DCT
        self.dct = mlx5_ib_dct()        # MLX5_IB_QPT_DCT only
        self.raw_packet_qp = mlx5_ib_raw_packet_qp()  # IB_QPT_RAW_PACKET only
        self.rq = mlx5_ib_wq()
        self.sq = mlx5_ib_wq()
        self.db = mlx5_db()
        self.buf_size = 0
        self.bfregn = MLX5_IB_INVALID_BFREG
        self.flags = 0
        self.flags_en = 0
        self.has_rq = False
        self.wq_sig = False
        self.max_inline_data = 0
        self.sq_signal_bits = 0  # MLX5_WQE_CTRL_CQ_UPDATE when every send is signalled
        self.mutex = mutex_init("&qp->mutex")
        # protected by mutex (modify_qp, query_qp):
        self.state = 0   # enum ib_qp_state
        self.port = 0

    @property
    def mqp(self) -> mlx5_core_qp:
        return self.trans_qp.base.mqp

    def __repr__(self) -> str:
        bf = "-" if self.bfregn == MLX5_IB_INVALID_BFREG else self.bfregn
        return (f"mlx5_ib_qp {self.mqp.qpn:#x} type={self.qp_type} state={self.state} "
                f"bfreg={bf} sq={self.sq.wqe_cnt} rq={self.rq.wqe_cnt} buf={self.buf_size}")


def to_mqp(qp: ib_qp) -> mlx5_ib_qp:
    """Mirrors to_mqp()."""
    return qp  # type: ignore[return-value]


# -- small helpers ----------------------------------------------------------------------
def get_uars_per_sys_page(dev: mlx5_ib_dev, lib_support: bool) -> int:
    """Mirrors get_uars_per_sys_page(): MLX5_UARS_IN_PAGE only if both the library
    (4K-UAR lib cap) and the device (uar_4k) support 4 KiB UARs, else 1."""
    if lib_support and MLX5_CAP_GEN(dev.mdev, "uar_4k"):
        return MLX5_UARS_IN_PAGE()
    return 1


def get_num_static_uars(dev: mlx5_ib_dev, bfregi: mlx5_bfreg_info) -> int:
    """Mirrors get_num_static_uars()."""
    return get_uars_per_sys_page(dev, bfregi.lib_uar_4k) * bfregi.num_static_sys_pages


def fw_uars_per_page(dev: mlx5_ib_dev) -> int:
    """FW UARs in one system page: MLX5_UARS_IN_PAGE with uar_4k, else 1."""
    return MLX5_UARS_IN_PAGE() if MLX5_CAP_GEN(dev.mdev, "uar_4k") else 1


def order_base_2(n: int) -> int:
    """Mirrors order_base_2()."""
    return (n - 1).bit_length() if n > 1 else 0


def ilog2(n: int) -> int:
    """Mirrors ilog2() (of a positive value)."""
    return n.bit_length() - 1


def roundup_pow_of_two(n: int) -> int:
    """Mirrors roundup_pow_of_two()."""
    return 1 << (n - 1).bit_length() if n > 1 else 1


def is_power_of_2(n: int) -> bool:
    """Mirrors is_power_of_2()."""
    return n > 0 and n & (n - 1) == 0

