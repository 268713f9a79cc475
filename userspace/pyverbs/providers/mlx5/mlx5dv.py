"""pyverbs.providers.mlx5.mlx5dv: mlx5 direct verbs.

Emulated, on the project's libmlx5 (userspace/providers/mlx5/dv.py):

* Mlx5Context(Mlx5DVContextAttr, name=...): mlx5dv_open_device, a Context whose
  open passes the mlx5dv context flags (MLX5DV_CONTEXT_FLAGS_DEVX: a DevX context).
* Mlx5Context.devx_general_cmd(): mlx5dv_devx_general_cmd on raw PRM mailboxes (the
  kernel's MLX5_IB_METHOD_DEVX_OTHER; the queries the emulated firmware answers).
* Mlx5Context.query_mlx5_device(): mlx5dv_query_device (Mlx5DVContext).
* Mlx5UAR(ctx, flags): mlx5dv_devx_alloc_uar / mlx5dv_devx_free_uar (the BF and NC
  types, through the kernel's UAR object).
* Mlx5QP: mlx5dv_create_qp (userspace/providers/mlx5/dc.py): libmlx5's checks of the dv
  attributes (EINVAL / EOPNOTSUPP), mlx5 create flags, dv send ops, and DC QPs - DCIs
  (wr_set_dc_addr) and DCTs, through the kernel's DCI QPs and the firmware's DCTs.
* Mlx5CQ: mlx5dv_create_cq checks its dv attributes as libmlx5 does (EINVAL), then
  needs the extended CQ, which succeeds only with nothing an mlx5-specific attribute
  asks of the HCA (else EOPNOTSUPP).
* Mlx5Context.query_mlx5_port(): mlx5dv_query_port (the kernel's
  MLX5_IB_METHOD_QUERY_PORT).
* The other static calls (reserved QPNs, crypto login, clock info, LAG port, UDP
  source port, DevX EQN query) exist with pyverbs' signatures and fail with
  EOPNOTSUPP, as libmlx5 does on a kernel or device without the feature.

DevX objects, UMEMs, EQs, VAR, packet pacing, DM operation addresses and raw WQEs
stay NotEmulated: creating one fails with EOPNOTSUPP, which the rdma-core tests
report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

import errno
import struct
import weakref
from typing import Any

import attrs

import userspace.pyverbs.providers.mlx5.mlx5_enums as dve
from userspace import libc
from userspace.libibverbs import verbs as v
from userspace.providers.mlx5 import dc, dv
from userspace.pyverbs import enums as e
from userspace.pyverbs.base import (
    AttrStruct,
    NotEmulated,
    PyverbsCM,
    PyverbsObject,
    call,
    set_errno,
)
from userspace.pyverbs.cq import CQEX, CqInitAttrEx
from userspace.pyverbs.device import Context
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QPEx, QPInitAttrEx

_FMT = "{:20}: {:<20}\n"


def _fail(msg: str, rc: int) -> PyverbsRDMAError:
    """A verb that returned the errno rc (pyverbs raises PyverbsRDMAError(msg, rc))."""
    set_errno(rc)
    return PyverbsRDMAError(msg, rc)


class Mlx5DVContextAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVContextAttr (struct mlx5dv_context_attr)."""

    def __init__(self, flags: int = 0, comp_mask: int = 0) -> None:
        super().__init__()
        self.flags, self.comp_mask = flags, comp_mask

    def __str__(self) -> str:
        return _FMT.format("flags", self.flags) + _FMT.format("comp_mask", self.comp_mask)


class Mlx5DVPortAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVPortAttr (struct mlx5dv_port)."""

    def __init__(self) -> None:
        super().__init__()
        self.flags = self.vport = self.vport_vhca_id = self.esw_owner_vhca_id = 0
        self.vport_steering_icm_rx = self.vport_steering_icm_tx = 0
        self.reg_c0_value = self.reg_c0_mask = 0

    def __str__(self) -> str:
        return _FMT.format("flags", hex(self.flags))


class Mlx5DVContext(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVContext (struct mlx5dv_context): the answer of
    mlx5dv_query_device.  The nested caps read as dicts, as Cython returns structs."""

    def __init__(self) -> None:
        super().__init__()
        self.dv = dv.mlx5dv_context()

    @property
    def comp_mask(self) -> int:
        return self.dv.comp_mask

    @comp_mask.setter
    def comp_mask(self, val: int) -> None:
        self.dv.comp_mask = val

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "dv":
            raise AttributeError(name)
        field = "tunnel_offloads_caps" if name == "tunnel_offload_caps" else name
        if field not in _DV_FIELDS:
            raise AttributeError(name)
        value = getattr(self.dv, field)
        return attrs.asdict(value) if attrs.has(type(value)) else value

    def __str__(self) -> str:
        d, ind = self.dv, "  {:20}: {:<20}\n"
        cqe = "CQE compression caps:\n" + ind.format("max num", d.cqe_comp_caps.max_num) + \
            ind.format("supported formats", cqe_comp_to_str(d.cqe_comp_caps.supported_format))
        swp = "SW parsing caps:\n" + \
            ind.format("SW parsing offloads", swp_to_str(d.sw_parsing_caps.sw_parsing_offloads)) \
            + ind.format("supported QP types", qpts_to_str(d.sw_parsing_caps.supported_qpts))
        s = d.striding_rq_caps
        strd = "Striding RQ caps:\n" + \
            ind.format("min single stride log num of bytes",
                       s.min_single_stride_log_num_of_bytes) + \
            ind.format("max single stride log num of bytes",
                       s.max_single_stride_log_num_of_bytes) + \
            ind.format("min single wqe log num of strides", s.min_single_wqe_log_num_of_strides) \
            + ind.format("max single wqe log num of strides",
                         s.max_single_wqe_log_num_of_strides) + \
            ind.format("supported QP types", qpts_to_str(s.supported_qpts))
        stream = "DCI stream caps:\n" + \
            ind.format("max log num concurrent streams",
                       d.dci_streams_caps.max_log_num_concurent) + \
            ind.format("max log num errored streams", d.dci_streams_caps.max_log_num_errored)
        return (_FMT.format("Version", d.version)
                + _FMT.format("Flags", context_flags_to_str(d.flags))
                + _FMT.format("comp mask", context_comp_mask_to_str(d.comp_mask))
                + cqe + swp + strd + stream
                + _FMT.format("Tunnel offloads caps",
                              tunnel_offloads_to_str(d.tunnel_offloads_caps))
                + _FMT.format("Max dynamic BF registers", d.max_dynamic_bfregs)
                + _FMT.format("Max clock info update [nsec]", d.max_clock_info_update_nsec)
                + _FMT.format("Flow action flags", d.flow_action_flags)
                + _FMT.format("DC ODP caps", d.dc_odp_caps)
                + _FMT.format("Num LAG ports", d.num_lag_ports)
                + _FMT.format("Max WR memcpy length", d.max_wr_memcpy_length))


_DV_FIELDS = frozenset(("version", "flags", "cqe_comp_caps", "sw_parsing_caps",
                        "striding_rq_caps", "tunnel_offloads_caps", "max_dynamic_bfregs",
                        "max_clock_info_update_nsec", "flow_action_flags", "dc_odp_caps",
                        "crypto_caps", "num_lag_ports", "dci_streams_caps",
                        "max_wr_memcpy_length", "max_dc_rd_atom", "max_dc_init_rd_atom"))

# what query_mlx5_device() asks for when the caller leaves comp_mask at -1 (pyverbs' list)
_DEFAULT_QUERY_MASK = (dve.MLX5DV_CONTEXT_MASK_CQE_COMPRESION | dve.MLX5DV_CONTEXT_MASK_SWP
                       | dve.MLX5DV_CONTEXT_MASK_STRIDING_RQ
                       | dve.MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS
                       | dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS
                       | dve.MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE
                       | dve.MLX5DV_CONTEXT_MASK_DC_ODP_CAPS
                       | dve.MLX5DV_CONTEXT_MASK_FLOW_ACTION_FLAGS
                       | dve.MLX5DV_CONTEXT_MASK_DCI_STREAMS
                       | dve.MLX5DV_CONTEXT_MASK_WR_MEMCPY_LENGTH
                       | dve.MLX5DV_CONTEXT_MASK_CRYPTO_OFFLOAD
                       | dve.MLX5DV_CONTEXT_MASK_MAX_DC_RD_ATOM)


class Mlx5Context(Context):
    """Mirrors pyverbs' Mlx5Context: the device opened by mlx5dv_open_device()."""

    def __init__(self, attr: Mlx5DVContextAttr, name: str | bytes = "") -> None:
        PyverbsCM.__init__(self)
        if attr is None:
            raise TypeError("Argument 'attr' must not be None")
        if isinstance(name, bytes):
            name = name.decode()
        if not name:
            raise PyverbsUserError("Device name must be provided")
        self.proc = current_process()
        devs = [d for d in v.ibv_get_device_list(self.proc) if d.name == name]
        if not devs:
            raise PyverbsRDMAError(f"Failed to open device {name}", errno.ENODEV)
        self.device = devs[0]
        if not dv.mlx5dv_is_supported(self.device):
            raise PyverbsUserError("This is not an MLX5 device")
        self.ctx = call(f"Failed to open mlx5 context on {name}", dv.mlx5dv_open_device,
                        self.proc, self.device,
                        dv.mlx5dv_context_attr(attr.flags, attr.comp_mask))
        self._created()
        self.uars: weakref.WeakSet[Mlx5UAR] = weakref.WeakSet()

    def query_mlx5_device(self, comp_mask: int = -1) -> Mlx5DVContext:
        """mlx5dv_query_device(); comp_mask -1 asks for pyverbs' default set."""
        self._check_open("query_mlx5_device")
        dv_attr = Mlx5DVContext()
        dv_attr.comp_mask = _DEFAULT_QUERY_MASK if comp_mask == -1 else comp_mask
        rc = dv.mlx5dv_query_device(self.ctx, dv_attr.dv)
        if rc:
            raise _fail(f"Failed to query mlx5 device {self.name}.", rc)
        return dv_attr

    @staticmethod
    def query_mlx5_port(ctx: Context, port_num: int) -> Mlx5DVPortAttr:
        """mlx5dv_query_port(): the port's e-switch vport information (zeros on a
        function whose e-switch is not in switchdev mode); EINVAL for a bad port."""
        rc, info = dv.mlx5dv_query_port(ctx.ctx, port_num)
        if rc:
            raise _fail(f"Failed to query dv port mlx5 {ctx.name} port {port_num}.", rc)
        attr = Mlx5DVPortAttr()
        for name in ("flags", "vport", "vport_vhca_id", "esw_owner_vhca_id",
                     "vport_steering_icm_rx", "vport_steering_icm_tx", "reg_c0_value",
                     "reg_c0_mask"):
            setattr(attr, name, getattr(info, name))
        return attr

    @staticmethod
    def reserved_qpn_alloc(ctx: Context) -> int:
        """mlx5dv_reserved_qpn_alloc(): needs DevX (ALLOC_QPN commands): EOPNOTSUPP."""
        raise _fail("Failed to alloc reserved QP number.",
                    dv.mlx5dv_unsupported(ctx.ctx, "mlx5dv_reserved_qpn_alloc"))

    @staticmethod
    def reserved_qpn_dealloc(ctx: Context, qpn: int) -> None:
        raise _fail(f"Failed to dealloc QP number {qpn}.",
                    dv.mlx5dv_unsupported(ctx.ctx, "mlx5dv_reserved_qpn_dealloc"))

    @staticmethod
    def crypto_login(ctx: Context, login_attr: Any) -> None:
        raise _fail("Failed to create crypto login session.",
                    dv.mlx5dv_unsupported(ctx.ctx, "mlx5dv_crypto_login"))

    @staticmethod
    def query_login_state(ctx: Context) -> int:
        raise _fail("Failed to query the crypto login session state.",
                    dv.mlx5dv_unsupported(ctx.ctx, "mlx5dv_crypto_login_query_state"))

    @staticmethod
    def crypto_logout(ctx: Context) -> None:
        raise _fail("Failed to logout from crypto login session.",
                    dv.mlx5dv_unsupported(ctx.ctx, "mlx5dv_crypto_logout"))

    @staticmethod
    def device_timestamp_to_ns(ctx: Context, device_timestamp: int) -> int:
        """mlx5dv_get_clock_info() then mlx5dv_ts_to_ns(): the device timestamp in
        nanoseconds; PyverbsRDMAError with get_clock_info's errno (EOPNOTSUPP: not an
        mlx5 context, EINVAL: no clock-info page mapped, EBUSY)."""
        clock_info = dv.mlx5dv_clock_info()
        rc = dv.mlx5dv_get_clock_info(ctx.ctx, clock_info)
        if rc:
            raise _fail("Failed to get the clock info", rc)
        return dv.mlx5dv_ts_to_ns(clock_info, device_timestamp)

    def devx_general_cmd(self, in_: Any, outlen: int) -> bytes:
        """mlx5dv_devx_general_cmd(): bytes(in_) as the input mailbox (malloc'ed and
        copied, as pyverbs' _prepare_devx_inbox), outlen bytes of output mailbox; the
        output bytes, or PyverbsRDMAError with the errno (EREMOTEIO for a firmware
        status, EINVAL for a command that is not general, ...)."""
        self._check_open("devx_general_cmd")
        in_bytes = bytes(in_)
        proc = self.proc
        in_at = libc.posix_memalign(proc, 8, max(len(in_bytes), 1))
        out_at = libc.posix_memalign(proc, 8, max(outlen, 1))
        try:
            proc.store(in_at, in_bytes)
            rc = dv.mlx5dv_devx_general_cmd(self.ctx, in_at, len(in_bytes), out_at, outlen)
            if rc:
                raise _fail("DevX general command failed", rc)
            return bytes(proc.load(out_at, outlen)) if outlen else b""
        finally:
            libc.free(proc, in_at, max(len(in_bytes), 1))
            libc.free(proc, out_at, max(outlen, 1))

    def devx_query_eqn(self, vector: int) -> int:
        raise _fail("Failed to query EQN", dv.mlx5dv_unsupported(self.ctx, "mlx5dv_devx_query_eqn"))


class Mlx5UAR(PyverbsCM):
    """Mirrors pyverbs' Mlx5UAR: mlx5dv_devx_alloc_uar(); close() is mlx5dv_devx_free_uar()."""

    def __init__(self, context: Context, flags: int = 0) -> None:
        super().__init__()
        if context is None:
            raise TypeError("Argument 'context' must not be None")
        self._uar = call("Failed to allocate UAR", dv.mlx5dv_devx_alloc_uar, context.ctx, flags)
        self._created()
        context.add_ref(self)

    def _free(self) -> None:
        dv.mlx5dv_devx_free_uar(self._uar)

    def _field(self, name: str) -> int:
        self._check_open(f"Mlx5UAR.{name}")
        return getattr(self._uar, name)

    @property
    def reg_addr(self) -> int:
        return self._field("reg_addr")

    @property
    def base_addr(self) -> int:
        return self._field("base_addr")

    @property
    def page_id(self) -> int:
        return self._field("page_id")

    @property
    def mmap_off(self) -> int:
        return self._field("mmap_off")

    @property
    def comp_mask(self) -> int:
        return self._field("comp_mask")

    @property
    def uar(self) -> int:
        """The struct's address in C; here an identifier that is non-zero while allocated."""
        return 0 if self._closed else id(self._uar)

    def __str__(self) -> str:
        return (_FMT.format("reg addr", self.reg_addr) + _FMT.format("base addr", self.base_addr)
                + _FMT.format("page id", self.page_id) + _FMT.format("mmap off", self.mmap_off)
                + _FMT.format("comp mask", self.comp_mask))


class Mlx5DVQPInitAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVQPInitAttr (struct mlx5dv_qp_init_attr): the DC init
    attributes are copied in - the DCI streams with MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS,
    else the DCT access key (a union in C)."""

    def __init__(self, comp_mask: int = 0, create_flags: int = 0,
                 dc_init_attr: Mlx5DVDCInitAttr | None = None, send_ops_flags: int = 0) -> None:
        super().__init__()
        self.comp_mask, self.create_flags, self.send_ops_flags = \
            comp_mask, create_flags, send_ops_flags
        self.dc_type = self.dct_access_key = 0
        self.dci_streams = Mlx5DCIStreamInitAttr()
        if dc_init_attr is not None:
            self.dc_type = dc_init_attr.dc_type
            if comp_mask & dve.MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS:
                self.dci_streams = Mlx5DCIStreamInitAttr(
                    dc_init_attr.dci_streams.log_num_concurent,
                    dc_init_attr.dci_streams.log_num_errored)
            else:
                self.dct_access_key = dc_init_attr.dct_access_key

    def to_c(self) -> dc.mlx5dv_qp_init_attr:
        streams = dc.mlx5dv_dci_streams(self.dci_streams.log_num_concurent,
                                        self.dci_streams.log_num_errored)
        return dc.mlx5dv_qp_init_attr(
            self.comp_mask, self.create_flags,
            dc.mlx5dv_dc_init_attr(self.dc_type, self.dct_access_key, streams),
            self.send_ops_flags)

    def __str__(self) -> str:
        return (_FMT.format("Comp mask", qp_comp_mask_to_str(self.comp_mask))
                + _FMT.format("Create flags", qp_create_flags_to_str(self.create_flags))
                + "DC init attr:\n"
                + _FMT.format("  DC type", dc_type_to_str(self.dc_type))
                + _FMT.format("  DCI Stream log_num_concurent",
                              self.dci_streams.log_num_concurent)
                + _FMT.format("  DCI Stream log_num_errored", self.dci_streams.log_num_errored)
                + _FMT.format("  DCT access key", self.dct_access_key)
                + _FMT.format("Send ops flags", send_ops_flags_to_str(self.send_ops_flags)))


#: pyverbs' Mlx5QP._get_comp_mask(): the attributes of each DC transition
_DC_MASKS = {
    dve.MLX5DV_DCTYPE_DCT: {e.IBV_QPS_INIT: e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT
                            | e.IBV_QP_ACCESS_FLAGS,
                            e.IBV_QPS_RTR: e.IBV_QP_AV | e.IBV_QP_PATH_MTU
                            | e.IBV_QP_MIN_RNR_TIMER},
    dve.MLX5DV_DCTYPE_DCI: {e.IBV_QPS_INIT: e.IBV_QP_PKEY_INDEX | e.IBV_QP_PORT,
                            e.IBV_QPS_RTR: e.IBV_QP_PATH_MTU,
                            e.IBV_QPS_RTS: e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT
                            | e.IBV_QP_RNR_RETRY | e.IBV_QP_SQ_PSN
                            | e.IBV_QP_MAX_QP_RD_ATOMIC},
}


class Mlx5QP(QPEx):
    """Mirrors pyverbs' Mlx5QP: mlx5dv_create_qp (libmlx5's checks and errnos: dc.py),
    DC QPs (IBV_QPT_DRIVER: a DCI sends to DCTs it names per WR with wr_set_dc_addr; a
    DCT receives into its SRQ and gets its number at RTR) moved with the DC
    transitions' attributes; the new post-send API of the QP type."""

    def __init__(self, context: Context, init_attr: QPInitAttrEx,
                 dv_init_attr: Mlx5DVQPInitAttr | None = None) -> None:
        self.dc_type = dv_init_attr.dc_type if dv_init_attr else 0
        self._dv_attr = dv_init_attr
        self._msg = (f"Failed to create MLX5 QP.\nQPInitAttrEx attributes:\n{init_attr}\n"
                     f"MLX5DVQPInitAttr:\n{dv_init_attr}")
        super().__init__(context, init_attr)

    def _create_ex(self, ctx: Context, c_attr: Any) -> Any:
        """mlx5dv_create_qp() with the dv attributes (NULL without)."""
        dv_attr = self._dv_attr.to_c() if self._dv_attr is not None else None
        return call(self._msg, dv.mlx5dv_create_qp, ctx.ctx, c_attr, dv_attr)

    def _move(self, qp_attr: Any, state: int, masks: dict[int, int]) -> None:
        if not self.dc_type:
            super()._move(qp_attr, state, masks)
            return
        qp_attr.qp_state = state
        self.modify(qp_attr, _DC_MASKS[self.dc_type][state] | e.IBV_QP_STATE)

    def wr_raw_wqe(self, wqe: Wqe) -> None:
        """mlx5dv_wr_raw_wqe(): the WQE as it is, into the send queue."""
        self._check_open("Mlx5QP.wr_raw_wqe")
        call("Failed to wr_raw_wqe", dv.mlx5dv_wr_raw_wqe, self._qpx(), wqe.to_bytes())

    def wr_set_dc_addr(self, ah: Any, remote_dctn: int, remote_dc_key: int) -> None:
        """mlx5dv_wr_set_dc_addr(): the DCT this WR goes to (DCI only)."""
        self._check_open("Mlx5QP.wr_set_dc_addr")
        call("Failed to wr_set_dc_addr", dv.mlx5dv_wr_set_dc_addr, self._qpx(), ah.ah,
             remote_dctn, remote_dc_key)

    def wr_set_dc_addr_stream(self, ah: Any, remote_dctn: int, remote_dc_key: int,
                              stream_id: int) -> None:
        """mlx5dv_wr_set_dc_addr_stream(): as wr_set_dc_addr, on a DCI stream."""
        self._check_open("Mlx5QP.wr_set_dc_addr_stream")
        call("Failed to wr_set_dc_addr_stream", dv.mlx5dv_wr_set_dc_addr_stream,
             self._qpx(), ah.ah, remote_dctn, remote_dc_key, stream_id)

    @staticmethod
    def query_lag_port(qp: Any) -> tuple[int, int]:
        """mlx5dv_query_qp_lag_port(): the emulated HCA has no LAG: EOPNOTSUPP."""
        raise _fail(f"Failed to query QP #{qp.qp_num}",
                    dv.mlx5dv_unsupported(qp.qp.context, "mlx5dv_query_qp_lag_port"))

    @staticmethod
    def modify_lag_port(qp: Any, port_num: int) -> None:
        raise _fail(f"Failed to modify lag of QP #{qp.qp_num}",
                    dv.mlx5dv_unsupported(qp.qp.context, "mlx5dv_modify_qp_lag_port"))

    @staticmethod
    def modify_qp_sched_elem(qp: Any, req_sched_leaf: Any = None,
                             resp_sched_leaf: Any = None) -> None:
        raise _fail(f"Failed to modify QP #{qp.qp_num} sched element",
                    dv.mlx5dv_unsupported(qp.qp.context, "mlx5dv_modify_qp_sched_elem"))

    @staticmethod
    def modify_udp_sport(qp: Any, udp_sport: int) -> None:
        """mlx5dv_modify_qp_udp_sport(): a DevX RTS2RTS command: EOPNOTSUPP."""
        raise _fail(f"Failed to modify UDP source port of QP #{qp.qp_num}",
                    dv.mlx5dv_unsupported(qp.qp.context, "mlx5dv_modify_qp_udp_sport"))

    @staticmethod
    def map_ah_to_qp(ah: Any, qp_num: int) -> None:
        raise _fail(f"Failed to map AH to QP #{qp_num}", errno.EOPNOTSUPP)

    @staticmethod
    def modify_dci_stream_channel_id(qp: Any, stream_id: int) -> None:
        raise _fail(f"Failed to reset stream_id #{stream_id} for DCI QP", errno.EOPNOTSUPP)


class Mlx5DVCQInitAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVCQInitAttr (struct mlx5dv_cq_init_attr)."""

    def __init__(self, comp_mask: int = 0, cqe_comp_res_format: int = 0, flags: int = 0,
                 cqe_size: int = 0) -> None:
        super().__init__()
        self.comp_mask, self.cqe_comp_res_format = comp_mask, cqe_comp_res_format
        self.flags, self.cqe_size = flags, cqe_size

    def __str__(self) -> str:
        fmt = "{:22}: {:<20}\n"
        return ("Mlx5DVCQInitAttr:\n" + fmt.format("comp_mask", self.comp_mask)
                + fmt.format("CQE compression format", self.cqe_comp_res_format)
                + fmt.format("flags", self.flags) + fmt.format("CQE size", self.cqe_size))


_DV_CQ_COMP_MASK = (dve.MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE
                    | dve.MLX5DV_CQ_INIT_ATTR_MASK_FLAGS | dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE)


class Mlx5CQ(CQEX):
    """Mirrors pyverbs' Mlx5CQ (mlx5dv_create_cq).

    The checks of libmlx5's create_cq on the dv attributes, in its order, are
    EINVAL: unknown comp_mask bits; CQE compression the device does not report (the
    emulated HCA reports none) or more than one format; a CQE size other than 64 or
    128; unknown flags, or padding without 128-byte CQEs or the device's padding
    cap.  Then the extended CQ (CQEX); 128-byte CQEs are EOPNOTSUPP - the emulated
    provider builds 64-byte CQEs only.
    """

    def __init__(self, context: Mlx5Context, init_attr: CqInitAttrEx,
                 dv_init_attr: Mlx5DVCQInitAttr | None = None) -> None:
        msg = f"Failed to create MLX5 CQ.\nCQInitAttrEx:\n{init_attr}\nMLX5DVCQInitAttr:\n" \
              f"{dv_init_attr}"
        rc = self._check(context, dv_init_attr)
        if rc:
            PyverbsCM.__init__(self)
            raise _fail(msg, rc)
        super().__init__(context, init_attr)

    @staticmethod
    def _check(context: Context, attr: Mlx5DVCQInitAttr | None) -> int:
        if attr is None or not attr.comp_mask:
            return 0
        if attr.comp_mask & ~_DV_CQ_COMP_MASK:
            return errno.EINVAL
        caps = Mlx5Context.query_mlx5_device(context) if isinstance(context, Mlx5Context) \
            else None
        flags = caps.flags if caps is not None else 0
        if attr.comp_mask & dve.MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE:
            comp = caps.cqe_comp_caps if caps is not None else {"max_num": 0}
            fmt = attr.cqe_comp_res_format
            if not comp["max_num"] or not fmt & comp.get("supported_format", 0) \
                    or fmt & (fmt - 1):
                return errno.EINVAL
        cqe_sz = 64
        if attr.comp_mask & dve.MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE:
            if attr.cqe_size not in (64, 128):
                return errno.EINVAL
            cqe_sz = attr.cqe_size
        if attr.comp_mask & dve.MLX5DV_CQ_INIT_ATTR_MASK_FLAGS:
            if attr.flags & ~dve.MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD:
                return errno.EINVAL
            if attr.flags & dve.MLX5DV_CQ_INIT_ATTR_FLAGS_CQE_PAD and (
                    cqe_sz != 128 or not flags & dve.MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD):
                return errno.EINVAL
        if cqe_sz != 64:
            return errno.EOPNOTSUPP
        return 0

    def __str__(self) -> str:
        return "Mlx5 CQ:\n" + "{:<22}: {:<20}\n".format("CQEs", getattr(self, "cqe", 0))


# -- not emulated ----------------------------------------------------------------------
class Mlx5DevxEq(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxEq: not emulated."""

    _VERB = "create Mlx5DevxEq"


class Mlx5DevxMsiVector(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxMsiVector: not emulated."""

    _VERB = "create Mlx5DevxMsiVector"


class Mlx5DevxObj(NotEmulated):
    """Mirrors pyverbs' Mlx5DevxObj: not emulated."""

    _VERB = "create Mlx5DevxObj"


class Mlx5DmOpAddr(AttrStruct):
    """Mirrors pyverbs' Mlx5DmOpAddr."""

    _FIELDS = ('dm', 'op')


class Mlx5PP(NotEmulated):
    """Mirrors pyverbs' Mlx5PP: not emulated."""

    _VERB = "create Mlx5PP"


class Mlx5UMEM(NotEmulated):
    """Mirrors pyverbs' Mlx5UMEM: not emulated."""

    _VERB = "create Mlx5UMEM"


class Mlx5VAR(NotEmulated):
    """Mirrors pyverbs' Mlx5VAR: not emulated."""

    _VERB = "create Mlx5VAR"


class Mlx5Cqe64(AttrStruct):
    """Mirrors pyverbs' Mlx5Cqe64."""

    _FIELDS = ('addr',)


class Mlx5DCIStreamInitAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DCIStreamInitAttr (struct mlx5dv_dci_streams)."""

    def __init__(self, log_num_concurent: int = 0, log_num_errored: int = 0) -> None:
        super().__init__()
        self.log_num_concurent, self.log_num_errored = log_num_concurent, log_num_errored

    def __str__(self) -> str:
        return (_FMT.format("DCI Stream log_num_concurent", self.log_num_concurent)
                + _FMT.format("DCI Stream log_num_errored", self.log_num_errored))


class Mlx5DVDCInitAttr(PyverbsObject):
    """Mirrors pyverbs' Mlx5DVDCInitAttr (struct mlx5dv_dc_init_attr): a DCI unless
    dc_type says DCT."""

    def __init__(self, dc_type: int = dve.MLX5DV_DCTYPE_DCI, dct_access_key: int = 0,
                 dci_streams: Mlx5DCIStreamInitAttr | None = None) -> None:
        super().__init__()
        self.dc_type, self.dct_access_key = dc_type, dct_access_key
        self.dci_streams = Mlx5DCIStreamInitAttr(
            dci_streams.log_num_concurent, dci_streams.log_num_errored) \
            if dci_streams is not None else Mlx5DCIStreamInitAttr()

    def __str__(self) -> str:
        return (_FMT.format("DC type", dc_type_to_str(self.dc_type))
                + _FMT.format("DCT access key", self.dct_access_key) + str(self.dci_streams))


class Mlx5VfioAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5VfioAttr."""

    _FIELDS = ()


class WqeSeg(PyverbsCM):
    """Mirrors pyverbs' WqeSeg: one WQE segment in its wire (PRM, big-endian) format.
    # EMU: the segment's bytes live here, not in a calloc'ed C struct."""

    SIZE = 0

    def __init__(self) -> None:
        super().__init__()
        self.segment = bytearray(self.SIZE)
        self._created()

    @classmethod
    def sizeof(cls) -> int:
        return cls.SIZE

    def _get(self, fmt: str, off: int) -> int:
        return struct.unpack_from(fmt, self.segment, off)[0]

    def _set(self, fmt: str, off: int, val: int) -> None:
        struct.pack_into(fmt, self.segment, off, int(val) & ((1 << struct.calcsize(fmt) * 8) - 1))

    def _free(self) -> None:
        pass


class WqeCtrlSeg(WqeSeg):
    """Mirrors pyverbs' WqeCtrlSeg (struct mlx5_wqe_ctrl_seg, mlx5dv_set_ctrl_seg)."""

    SIZE = 16

    def __init__(self, pi: int = 0, opcode: int = 0, opmod: int = 0, qp_num: int = 0,
                 fm_ce_se: int = 0, ds: int = 0, signature: int = 0, imm: int = 0) -> None:
        super().__init__()
        self.set_ctrl_seg(pi, opcode, opmod, qp_num, fm_ce_se, ds, signature, imm)

    def set_ctrl_seg(self, pi: int, opcode: int, opmod: int, qp_num: int, fm_ce_se: int,
                     ds: int, signature: int, imm: int) -> None:
        """mlx5dv_set_ctrl_seg()."""
        self.opmod_idx_opcode = (opmod & 0xFF) << 24 | (pi & 0xFFFF) << 8 | opcode & 0xFF
        self.qpn_ds = (qp_num & 0xFFFFFF) << 8 | ds & 0x3F
        self.fm_ce_se, self.signature = fm_ce_se, signature
        self._set(">I", 12, imm)      # imm is stored as given (already big-endian in C)

    opmod_idx_opcode = property(lambda self: self._get(">I", 0),
                                lambda self, val: self._set(">I", 0, val))
    qpn_ds = property(lambda self: self._get(">I", 4), lambda self, val: self._set(">I", 4, val))
    signature = property(lambda self: self.segment[8],
                         lambda self, val: self._set("B", 8, val))
    fm_ce_se = property(lambda self: self.segment[11], lambda self, val: self._set("B", 11, val))
    imm = property(lambda self: self._get(">I", 12), lambda self, val: self._set(">I", 12, val))

    def __str__(self) -> str:
        return (_FMT.format("opcode", self.opmod_idx_opcode) + _FMT.format("qpn_ds", self.qpn_ds)
                + _FMT.format("signature", self.signature)
                + _FMT.format("fm_ce_se", self.fm_ce_se) + _FMT.format("imm", self.imm))


class WqeDataSeg(WqeSeg):
    """Mirrors pyverbs' WqeDataSeg (struct mlx5_wqe_data_seg, mlx5dv_set_data_seg)."""

    SIZE = 16

    def __init__(self, length: int = 0, lkey: int = 0, addr: int = 0) -> None:
        super().__init__()
        self.set_data_seg(length, lkey, addr)

    def set_data_seg(self, length: int, lkey: int, addr: int) -> None:
        self.byte_count, self.lkey, self.addr = length, lkey, addr

    byte_count = property(lambda self: self._get(">I", 0),
                          lambda self, val: self._set(">I", 0, val))
    lkey = property(lambda self: self._get(">I", 4), lambda self, val: self._set(">I", 4, val))
    addr = property(lambda self: self._get(">Q", 8), lambda self, val: self._set(">Q", 8, val))

    def __str__(self) -> str:
        return (_FMT.format("byte_count", self.byte_count) + _FMT.format("lkey", self.lkey)
                + _FMT.format("addr", self.addr))


class Wqe(PyverbsCM):
    """Mirrors pyverbs' Wqe: one or more segments (WqeSeg, or bytes in PRM format) one
    after the other.
    # EMU: the WQE is its bytes; `address` is 0 unless the caller gave one."""

    def __init__(self, segments: list, addr: int = 0) -> None:
        super().__init__()
        self.segments = segments
        self.is_user_addr = bool(addr)
        self._addr = addr
        self._created()

    @property
    def address(self) -> int:
        return self._addr

    def to_bytes(self) -> bytes:
        return b"".join(bytes(s.segment) if isinstance(s, WqeSeg) else bytes(s)
                        for s in self.segments)

    def _free(self) -> None:
        pass


# -- the translations pyverbs prints with --------------------------------------------------
def bitmask_to_str(bits: int, values: dict[int, str]) -> str:
    """The names of the bits set, comma separated, then the number in parentheses."""
    names = [name for bit, name in values.items() if bit & bits]
    return ", ".join(names) + f" ({bits})"


def qpts_to_str(qp_types: int) -> str:
    names = {e.IBV_QPT_RC: "RC", e.IBV_QPT_UC: "UC", e.IBV_QPT_UD: "UD",
             e.IBV_QPT_RAW_PACKET: "Raw Packet", e.IBV_QPT_XRC_SEND: "XRC Send",
             e.IBV_QPT_XRC_RECV: "XRC Recv", e.IBV_QPT_DRIVER: "Driver QPT"}
    return bitmask_to_str(qp_types, {1 << t: n for t, n in names.items()})


def context_comp_mask_to_str(mask: int) -> str:
    return bitmask_to_str(mask, {
        dve.MLX5DV_CONTEXT_MASK_CQE_COMPRESION: "CQE compression",
        dve.MLX5DV_CONTEXT_MASK_SWP: "SW parsing",
        dve.MLX5DV_CONTEXT_MASK_STRIDING_RQ: "Striding RQ",
        dve.MLX5DV_CONTEXT_MASK_TUNNEL_OFFLOADS: "Tunnel offloads",
        dve.MLX5DV_CONTEXT_MASK_DYN_BFREGS: "Dynamic BF regs",
        dve.MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE: "Clock info update",
        dve.MLX5DV_CONTEXT_MASK_FLOW_ACTION_FLAGS: "Flow action flags"})


def context_flags_to_str(flags: int) -> str:
    return bitmask_to_str(flags, {
        dve.MLX5DV_CONTEXT_FLAGS_CQE_V1: "CQE v1",
        dve.MLX5DV_CONTEXT_FLAGS_MPW_ALLOWED: "Multi packet WQE allowed",
        dve.MLX5DV_CONTEXT_FLAGS_ENHANCED_MPW: "Enhanced multi packet WQE",
        dve.MLX5DV_CONTEXT_FLAGS_CQE_128B_COMP: "Support CQE 128B compression",
        dve.MLX5DV_CONTEXT_FLAGS_CQE_128B_PAD: "Support CQE 128B padding",
        dve.MLX5DV_CONTEXT_FLAGS_PACKET_BASED_CREDIT_MODE:
            "Support packet based credit mode (in RC QP)"})


def swp_to_str(swps: int) -> str:
    return bitmask_to_str(swps, {dve.MLX5DV_SW_PARSING: "SW Parsing",
                                 dve.MLX5DV_SW_PARSING_CSUM: "SW Parsing CSUM",
                                 dve.MLX5DV_SW_PARSING_LSO: "SW Parsing LSO"})


def cqe_comp_to_str(cqe: int) -> str:
    return bitmask_to_str(cqe, {dve.MLX5DV_CQE_RES_FORMAT_HASH: "with hash",
                                dve.MLX5DV_CQE_RES_FORMAT_CSUM: "with RX checksum CSUM",
                                dve.MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX: "with stride index"})


def tunnel_offloads_to_str(tun: int) -> str:
    return bitmask_to_str(tun, {
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_VXLAN: "VXLAN",
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_GRE: "GRE",
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_GENEVE: "Geneve",
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_CW_MPLS_OVER_GRE:
            "Ctrl word + MPLS over GRE",
        dve.MLX5DV_RAW_PACKET_CAP_TUNNELED_OFFLOAD_CW_MPLS_OVER_UDP:
            "Ctrl word + MPLS over UDP"})


def dc_type_to_str(dctype: int) -> str:
    return {dve.MLX5DV_DCTYPE_DCT: "DCT", dve.MLX5DV_DCTYPE_DCI: "DCI"}.get(
        dctype, f"Unknown DC type ({dctype})")


def qp_comp_mask_to_str(flags: int) -> str:
    return bitmask_to_str(flags, {
        dve.MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS: "Create flags",
        dve.MLX5DV_QP_INIT_ATTR_MASK_DC: "DC",
        dve.MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS: "Send ops flags",
        dve.MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS: "DCI Stream"})


def qp_create_flags_to_str(flags: int) -> str:
    return bitmask_to_str(flags, {
        dve.MLX5DV_QP_CREATE_TUNNEL_OFFLOADS: "Tunnel offloads",
        dve.MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_UC: "Allow UC self loopback",
        dve.MLX5DV_QP_CREATE_TIR_ALLOW_SELF_LOOPBACK_MC: "Allow MC self loopback",
        dve.MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: "Disable scatter to CQE",
        dve.MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE: "Allow scatter to CQE",
        dve.MLX5DV_QP_CREATE_PACKET_BASED_CREDIT_MODE: "Packet based credit mode",
        dve.MLX5DV_QP_CREATE_SIG_PIPELINING: "Support signature pipeline support"})


def send_ops_flags_to_str(flags: int) -> str:
    return bitmask_to_str(flags, {dve.MLX5DV_QP_EX_WITH_MR_INTERLEAVED: "With MR interleaved",
                                  dve.MLX5DV_QP_EX_WITH_MR_LIST: "With MR list",
                                  dve.MLX5DV_QP_EX_WITH_MKEY_CONFIGURE: "With Mkey configure"})

