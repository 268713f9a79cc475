"""The ConnectX firmware: the command interface's device side (device model, not kernel code).

A command arrives as a mlx5_cmd_layout entry the device found in the command
queue when its doorbell rang (kernel_model/hw/mlx5.py).  Firmware.execute()
looks the opcode up in a table filled by the @fw_command decorator, checks the
HCA's lifecycle state, runs the handler and writes status and syndrome into
the output, as the real firmware does; a handler refuses with FwError.

Lifecycle (the state machine of the HCA function):

    disabled --ENABLE_HCA--> enabled --INIT_HCA--> initialized
    initialized --TEARDOWN_HCA--> enabled --DISABLE_HCA--> disabled

QUERY_HCA_CAP, SET_HCA_CAP (before INIT_HCA only) and QUERY_ADAPTER need an
enabled function; resource commands need INIT_HCA.  TEARDOWN_HCA (or a
function reset) drops every object; whatever a driver still had allocated
then is recorded in `leaked`, which the machine's leak check reports.

What the firmware keeps - the objects the data path (mlx5_engine.py)
executes through - is in mlx5_fw_ctx.py (EQ, CQ, QP, mkey contexts); the QP
state transitions and the RoCE address table in mlx5_fw_qp.py; the port and
vport queries in mlx5_fw_port.py.  This file has the dispatch, the
capability pages and the small resources (UAR, PD, transport domain, uctx).

Errors follow the PRM: BAD_OP for an unknown opcode, BAD_PARAM for a bad
context or field, BAD_RES for an object number that names nothing,
RES_BUSY for an object still in use, LIM when a table is full,
BAD_INP_LEN for a PAS shorter than the context needs, BAD_SYS_STATE for a
command the HCA's state does not allow.  Syndromes are stable 32-bit values
per failing check: syndrome("create_qp_pd") - see SYNDROMES.

Layering: the opcode table, FwError and FwObject are in mlx5_fw_cmd.py at the
bottom; the handler modules register into it and name Firmware in annotations
only, so this file imports them and none of them imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import attrs

# mlx5_fw_ctx and mlx5_fw_qp are imported for their handlers: they fill the rest of COMMANDS
from kernel_model.hw import (  # noqa: F401 - mlx5_fw_srq: the SRQ commands
    mlx5_caps,
    mlx5_fw_ctx,
    mlx5_fw_dct,  # DCTs (Dynamically Connected targets)
    mlx5_fw_memic,
    mlx5_fw_odp,
    mlx5_fw_port,
    mlx5_fw_qp,
    mlx5_fw_srq,
    mlx5_fw_wq,  # TIS, TIR, SQ, RQ (raw packet QPs)
)
from kernel_model.hw.mlx5_fw_cmd import (  # noqa: F401 - SYNDROMES, syndrome: the public face
    ADAPTER_PAGE,
    COMMANDS,
    INIT_SEG_SIZE,
    LIFECYCLE_STATES,
    SYNDROMES,
    FwError,
    FwObject,
    FwTable,
    fw_command,
    syndrome,
)
from kernel_model.hw.mlx5_ifc import (
    HCA_CAP_OPMOD_GET_CUR,
    MLX5_ADDR_OF,
    MLX5_CAP_GENERAL,
    MLX5_CMD_NAMES,
    MLX5_CMD_OP_ALLOC_PD,
    MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_ALLOC_UAR,
    MLX5_CMD_OP_CREATE_UCTX,
    MLX5_CMD_OP_DEALLOC_PD,
    MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN,
    MLX5_CMD_OP_DEALLOC_UAR,
    MLX5_CMD_OP_DESTROY_UCTX,
    MLX5_CMD_OP_DISABLE_HCA,
    MLX5_CMD_OP_ENABLE_HCA,
    MLX5_CMD_OP_INIT_HCA,
    MLX5_CMD_OP_QUERY_HCA_CAP,
    MLX5_CMD_OP_SET_HCA_CAP,
    MLX5_CMD_OP_TEARDOWN_HCA,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_OP_ERR,
    MLX5_CMD_STAT_BAD_OUTP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_ERR,
    MLX5_CMD_STAT_BAD_SYS_STATE_ERR,
    MLX5_CMD_STAT_LIM_ERR,
    MLX5_CMD_STAT_OK,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5 import ConnectX

class BarLayout(NamedTuple):
    """Firmware.bar_layout(): how BAR0 decodes an access (byte sizes and offsets)."""

    uar_page_size: int
    uars_per_page: int
    bf_reg_size: int
    memic_start: int
    memic_size: int


@attrs.define
class Injection:
    """A failure the test asks for: the next `count` matching commands fail."""

    opcode: int
    status: int
    check: str
    op_mod: int | None = None
    count: int = 1


# -- small resources --------------------------------------------------------------------
class Mlx5Uar(FwObject):
    """What one ALLOC_UAR handed out: `span` consecutive UARs from `num` (one system
    page of 4 KiB UARs with uar_4k; a single UAR otherwise)."""

    kind = "UAR"

    def __init__(self, num: int, uid: int = 0, span: int = 1):
        super().__init__(num, uid)
        self.span = span

    def __repr__(self) -> str:
        return super().__repr__() + (f" uars={self.span}" if self.span > 1 else "")


class Mlx5Pd(FwObject):
    kind = "PD"


class Mlx5Td(FwObject):
    kind = "TD"


class Mlx5Uctx(FwObject):
    kind = "UCTX"


class IdAllocator:
    """A firmware number space: cyclic from `start`, at most `limit()` live numbers."""

    def __init__(self, start: int, end: int, limit: Callable[[], int]):
        self.start, self.end, self.limit = start, end, limit
        self.next = start

    def alloc(self, table: dict, what: str) -> int:
        if len(table) >= min(self.limit(), self.end - self.start):
            raise FwError(MLX5_CMD_STAT_LIM_ERR, f"{what}_table_full")
        n = self.next
        while n in table:
            n = n + 1 if n + 1 < self.end else self.start
        self.next = n + 1 if n + 1 < self.end else self.start
        return n


#: (cap overrides, BAR size) -> the maximum capability pages they give: built once,
#: copied for each firmware (a machine per schedule makes the explorer build many)
_CAPS_MAX_MADE: dict[tuple, dict[int, IfcStruct]] = {}


def _caps_max(cap_overrides: dict[str, int], bar_size: int) -> dict[int, IfcStruct]:
    """The device's maximum capability pages: the defaults, then the overrides."""
    key = (tuple(sorted(cap_overrides.items())), bar_size)
    made = _CAPS_MAX_MADE.get(key)
    if made is not None:
        return made
    per_type = mlx5_caps.split_overrides(cap_overrides)
    defaults = {MLX5_CAP_GENERAL: mlx5_caps.GENERAL_MAX,
                mlx5_caps.MLX5_CAP_ROCE: mlx5_caps.ROCE,
                mlx5_caps.MLX5_CAP_ETHERNET_OFFLOADS: mlx5_caps.ETH,
                mlx5_caps.MLX5_CAP_DEV_MEM: mlx5_caps.DEV_MEM}
    made = {}
    for cap, layout in mlx5_caps.CAP_LAYOUT.items():
        page = IfcStruct(layout)
        for field, value in {**defaults[cap], **per_type[cap]}.items():
            (MLX5_SET64 if field == "memic_bar_start_addr" else MLX5_SET)(
                layout, page, field, value)
        made[cap] = page
    dev_mem = made[mlx5_caps.MLX5_CAP_DEV_MEM]
    if "memic_bar_start_addr" not in per_type[mlx5_caps.MLX5_CAP_DEV_MEM]:
        # the MEMIC window is the top of BAR0, below it the UAR pages
        memic_size = MLX5_GET("device_mem_cap", dev_mem, "memic_bar_size")
        MLX5_SET64("device_mem_cap", dev_mem, "memic_bar_start_addr", bar_size - memic_size)
    for page in made.values():
        _untracked(page)
    _CAPS_MAX_MADE[key] = made
    return made


def _untracked(s: IfcStruct) -> None:
    """A template nobody writes: plain dicts, so that copying it records no reads
    for partial-order reduction (it may have been made while the reduction records)."""
    s.vals = dict(s.vals)
    for sub in s.subs.values():
        _untracked(sub)


class Firmware:
    """The firmware of one ConnectX function.  See the module docstring.

    Partial-order reduction sees a command's footprint, and a DMA's, field by field,
    its object tables key by key (FwTable) and a PRM context value by value
    (IfcStruct); an MTT changed in place (UMR's update_xlt) is a write of its mkey's
    `pas` field, which every DMA through the mkey reads."""

    #: the command log is a record for tests, in the schedule's order; nothing the
    #: machine does reads it, so appends commute (partial-order reduction)
    POR_ADDS = ("cmd_log",)

    def __init__(self, hca: ConnectX, cap_overrides: dict[str, int]):
        self.hca = hca
        self.caps_max: dict[int, IfcStruct] = {
            cap: page.copy() for cap, page in _caps_max(cap_overrides, hca.config.bar_size).items()}
        self.caps_cur: dict[int, IfcStruct] = {}
        memic_size = MLX5_GET("device_mem_cap", self.caps_max[mlx5_caps.MLX5_CAP_DEV_MEM],
                              "memic_bar_size")
        # the on-chip memory's bytes: they survive resets, as SRAM does while powered
        self.memic_data = bytearray(memic_size)
        self.injected: list[Injection] = []
        self.leaked: list[str] = []     # objects a TEARDOWN_HCA / reset found allocated
        self.cmd_log: list[tuple[str, int, int, int]] = []  # (name, op_mod, status, syndrome)
        self.reset()

    # -- state -----------------------------------------------------------------------
    def reset(self) -> None:
        """Function-level reset: back to disabled with default capabilities, no objects."""
        self._drop_objects("function reset")
        self.state = "disabled"
        self.bar = None
        self.caps_cur = {cap: page.copy() for cap, page in self.caps_max.items()}
        for field, value in mlx5_caps.GENERAL_CUR_DEFAULTS.items():
            MLX5_SET("cmd_hca_cap", self.caps_cur[MLX5_CAP_GENERAL], field, value)
        self.uars: dict[int, Mlx5Uar] = FwTable()
        self.pds: dict[int, Mlx5Pd] = FwTable()
        self.tds: dict[int, Mlx5Td] = FwTable()
        self.uctxs: dict[int, Mlx5Uctx] = FwTable()
        self.eqs: dict = FwTable()
        self.cqs: dict = FwTable()
        self.qps: dict = FwTable()
        self.srqs: dict = FwTable()    # srqn -> Mlx5Srq (mlx5_fw_srq.py)
        self.dcts: dict = FwTable()    # dctn -> Mlx5Dct (mlx5_fw_dct.py; QP numbers)
        self.xrcds: dict = FwTable()   # xrcdn -> Mlx5Xrcd (mlx5_fw_srq.py)
        self.mkeys: dict = FwTable()   # mkey index -> Mlx5Mkey
        self.memics: dict = FwTable()  # BAR-relative start -> Mlx5Memic (mlx5_fw_memic.py)
        self.roce_addresses: dict = FwTable()  # RoCE address (GID) index -> roce_addr_layout
        self.tises: dict = FwTable()   # tisn -> Mlx5Tis (mlx5_fw_wq.py)
        self.tirs: dict = FwTable()    # tirn -> Mlx5Tir
        self.sqs: dict = FwTable()     # sqn -> Mlx5Sq (numbered in the QP space)
        self.rqs: dict = FwTable()     # rqn -> Mlx5Rq
        self.rqts: dict = FwTable()    # rqtn -> Mlx5Rqt (an RSS indirection table of RQs)
        self._new_ids()
        self.vport = mlx5_fw_port.default_vport(self.hca)

    def _new_ids(self) -> None:
        """Fresh number spaces: after a reset or teardown, numbering starts over."""
        self._ids = {
            # numbered in system pages (uars_per_page UARs each), see alloc_uar
            "uar": IdAllocator(0, 1 << 24,
                               lambda: (self.nr_uars - self.first_uar) // self.uars_per_page),
            "pd": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_pd")),
            "td": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_transport_domain")),
            "uctx": IdAllocator(1, 1 << 16, lambda: 1 << self.cap("log_max_uctx")),
            "eq": IdAllocator(7, 1 << 8, lambda: 1 << self.cap("log_max_eq")),
            "cq": IdAllocator(0x400, 1 << 24, lambda: 1 << self.cap("log_max_cq")),
            "qp": IdAllocator(0x100, 1 << 24, lambda: 1 << self.cap("log_max_qp")),
            "srq": IdAllocator(0x100, 1 << 24, lambda: 1 << self.cap("log_max_srq")),
            "xrcd": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_xrcd")),
            "mkey": IdAllocator(8, 1 << 24, lambda: 1 << self.cap("log_max_mkey")),
            "tis": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_tis")),
            "tir": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_tir")),
            "rqt": IdAllocator(1, 1 << 24, lambda: 1 << self.cap("log_max_rqt")),
        }

    def tables(self) -> dict[str, dict]:
        return {"TIR": self.tirs, "RQT": self.rqts, "RQ": self.rqs, "SQ": self.sqs,
                "TIS": self.tises,
                "QP": self.qps, "DCT": self.dcts, "SRQ": self.srqs, "MKEY": self.mkeys,
                "CQ": self.cqs,
                "EQ": self.eqs, "XRCD": self.xrcds,
                "TD": self.tds, "PD": self.pds, "UAR": self.uars, "UCTX": self.uctxs,
                "MEMIC": self.memics}

    def live_objects(self) -> list[object]:
        return [obj for table in self.tables().values() for obj in table.values()]

    def _drop_objects(self, why: str) -> None:
        if getattr(self, "uars", None) is None:
            return
        live = self.live_objects()
        if live:
            self.leaked.append(f"{self.hca.name}: {len(live)} firmware object(s) still "
                               f"allocated at {why}: " + "; ".join(map(repr, live)))
        for table in self.tables().values():
            table.clear()
        self._new_ids()

    def cap(self, field: str, cap_type: int = MLX5_CAP_GENERAL) -> int:
        """A current capability (what QUERY_HCA_CAP GET_CUR would report)."""
        return MLX5_GET(mlx5_caps.CAP_LAYOUT[cap_type], self.caps_cur[cap_type], field)

    def bar_layout(self) -> BarLayout:
        """How BAR0 decodes an access: the UAR page size, UARs per system page,
        the BlueFlame register size and the MEMIC window, from the capabilities.

        Those are fixed from INIT_HCA (SET_HCA_CAP is refused after it) until
        TEARDOWN_HCA or a reset, so INIT_HCA reads them once into `bar` and every
        doorbell decodes through that; outside the initialized state they are read
        each time.  (Made in INIT_HCA's own step, not by the first doorbell, so that
        for partial-order reduction doorbells only ever read it.)"""
        if self.bar is not None:
            return self.bar
        start, size = mlx5_fw_memic.memic_window(self)
        return BarLayout(self.uar_page_size, self.uars_per_page,
                         1 << self.cap("log_bf_reg_size"), start, size)

    @property
    def uar_page_size(self) -> int:
        """Bytes per UAR in BAR0: 4 KiB with uar_4k, else 4 KiB << log_uar_page_sz."""
        return ADAPTER_PAGE if self.cap("uar_4k") else ADAPTER_PAGE << self.cap("log_uar_page_sz")

    @property
    def uars_per_page(self) -> int:
        """UARs in one system page, ALLOC_UAR's granule: 1 << log_uar_page_sz with uar_4k
        (the driver sets it to PAGE_SHIFT - 12), else 1 (a UAR is a system page)."""
        return 1 << self.cap("log_uar_page_sz") if self.cap("uar_4k") else 1

    @property
    def first_uar(self) -> int:
        """UARs of a system page overlapping the initialisation segment are never handed
        out (a process mapping that page would reach the command doorbell)."""
        page = self.uar_page_size * self.uars_per_page
        return -(-INIT_SEG_SIZE // page) * self.uars_per_page

    @property
    def nr_uars(self) -> int:
        """UAR pages fill BAR0 up to the MEMIC window (the BAR's end without MEMIC)."""
        start, size = mlx5_fw_memic.memic_window(self)
        return (start if size else self.hca.config.bar_size) // self.uar_page_size

    # -- dispatch --------------------------------------------------------------------
    def inject(self, opcode: int, status: int, check: str = "injected", *,
               op_mod: int | None = None, count: int = 1) -> None:
        """Make the next `count` commands `opcode` (op_mod) fail with `status`."""
        self.injected.append(Injection(opcode, status, check, op_mod, count))

    def execute(self, in_: IfcStruct, out: IfcStruct) -> int:
        """Run one command; its status (and syndrome) land in `out`.  Returns the status."""
        opcode = MLX5_GET("mbox_in", in_, "opcode")
        op_mod = MLX5_GET("mbox_in", in_, "op_mod")
        try:
            self._run(opcode, op_mod, in_, out)
            status, synd = MLX5_CMD_STAT_OK, 0
        except FwError as e:
            status, synd = e.status, e.syndrome
        if out.typ.endswith("_out"):
            MLX5_SET("mbox_out", out, "status", status)
            MLX5_SET("mbox_out", out, "syndrome", synd)
        self.cmd_log.append((MLX5_CMD_NAMES.get(opcode, hex(opcode)), op_mod, status, synd))
        return status

    def _run(self, opcode: int, op_mod: int, in_: IfcStruct, out: IfcStruct) -> None:
        for inj in self.injected:
            if inj.opcode == opcode and inj.op_mod in (None, op_mod) and inj.count > 0:
                inj.count -= 1
                raise FwError(inj.status, inj.check)
        cmd = COMMANDS.get(opcode)
        if cmd is None:
            raise FwError(MLX5_CMD_STAT_BAD_OP_ERR, "bad_opcode")
        if in_.typ != cmd.name + "_in":
            raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, f"{cmd.name}_inlen")
        if out.typ != cmd.name + "_out":
            raise FwError(MLX5_CMD_STAT_BAD_OUTP_LEN_ERR, f"{cmd.name}_outlen")
        if LIFECYCLE_STATES.index(self.state) < LIFECYCLE_STATES.index(cmd.state):
            raise FwError(MLX5_CMD_STAT_BAD_SYS_STATE_ERR, f"{cmd.name}_hca_{self.state}")
        uid = MLX5_GET("mbox_in", in_, "uid")
        if uid and uid not in self.uctxs and opcode != MLX5_CMD_OP_DESTROY_UCTX:
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, f"{cmd.name}_bad_uid")
        cmd.handler(self, in_, out)

    # -- helpers for handlers -------------------------------------------------------
    def lookup(self, table: dict, num: int, uid: int, what: str,
               kernel_any: bool = False) -> FwObject:
        """The object a destroy/dealloc names: BAD_RES if none, BAD_PARAM on a uid mismatch
        (with `kernel_any`, uid 0 - the kernel - may name any object)."""
        obj = table.get(num)
        if obj is None:
            raise FwError(MLX5_CMD_STAT_BAD_RES_ERR, f"{what}_not_found")
        if obj.uid != uid and not (kernel_any and uid == 0):
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, f"{what}_uid_mismatch")
        return obj

    def ref(self, table: dict, num: int, uid: int, check: str, shared: bool = True) -> FwObject:
        """An object a context refers to: BAD_PARAM if absent or owned by another uid
        (objects of uid 0 are shared with every uid, unless `shared` is False)."""
        obj = table.get(num)
        if obj is None or obj.uid not in ((0, uid) if shared else (uid,)):
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)
        return obj

    def uar_of(self, index: int, bar: BarLayout | None = None) -> Mlx5Uar | None:
        """The ALLOC_UAR object owning UAR `index`, if any (any UAR of its system page).
        `bar`: the layout, when the caller has it already (every doorbell does)."""
        return self.uars.get(index - index % (bar or self.bar_layout()).uars_per_page)

    def ref_uar(self, index: int, uid: int, check: str, shared: bool = True) -> FwObject:
        """ref() for a UAR a context names (uar_page): any UAR of an allocated page."""
        return self.ref(self.uars, index - index % self.bar_layout().uars_per_page, uid, check,
                        shared)

    def release(self, obj: FwObject, what: str) -> None:
        if obj.users:
            raise FwError(MLX5_CMD_STAT_RES_BUSY, f"{what}_busy")

    def new_id(self, kind: str, table: dict) -> int:
        return self._ids[kind].alloc(table, kind)


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


# -- lifecycle and capabilities -------------------------------------------------------------
@fw_command(MLX5_CMD_OP_ENABLE_HCA, "enable_hca", "disabled")
def enable_hca(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    if fw.state == "disabled":
        fw.state = "enabled"


@fw_command(MLX5_CMD_OP_DISABLE_HCA, "disable_hca", "enabled")
def disable_hca(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    fw._drop_objects("DISABLE_HCA")
    fw.state = "disabled"
    fw.bar = None


@fw_command(MLX5_CMD_OP_INIT_HCA, "init_hca", "enabled")
def init_hca(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    if fw.state == "initialized":
        raise FwError(MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "init_hca_twice")
    fw.state = "initialized"
    fw.bar = fw.bar_layout()


@fw_command(MLX5_CMD_OP_TEARDOWN_HCA, "teardown_hca", "initialized")
def teardown_hca(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    fw._drop_objects("TEARDOWN_HCA")
    fw.state = "enabled"
    fw.bar = None


@fw_command(MLX5_CMD_OP_QUERY_HCA_CAP, "query_hca_cap", "enabled")
def query_hca_cap(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    op_mod = MLX5_GET("mbox_in", in_, "op_mod")
    cap_type, mode = op_mod >> 1, op_mod & 1
    pages = fw.caps_cur if mode == HCA_CAP_OPMOD_GET_CUR else fw.caps_max
    if cap_type not in pages or MLX5_GET("query_hca_cap_in", in_, "other_function"):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "query_hca_cap_type")
    memcpy_ifc(MLX5_ADDR_OF("query_hca_cap_out", out, "capability"), pages[cap_type])


@fw_command(MLX5_CMD_OP_SET_HCA_CAP, "set_hca_cap", "enabled")
def set_hca_cap(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    if fw.state == "initialized":
        raise FwError(MLX5_CMD_STAT_BAD_SYS_STATE_ERR, "set_hca_cap_after_init")
    if MLX5_GET("mbox_in", in_, "op_mod") >> 1 != MLX5_CAP_GENERAL:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "set_hca_cap_type")
    new = MLX5_ADDR_OF("set_hca_cap_in", in_, "capability")
    cur, mx = fw.caps_cur[MLX5_CAP_GENERAL], fw.caps_max[MLX5_CAP_GENERAL]
    for field, rule in mlx5_caps.WRITABLE_GENERAL.items():
        v, top = MLX5_GET("cmd_hca_cap", new, field), MLX5_GET("cmd_hca_cap", mx, field)
        if (rule in ("log", "bool") and v > top) or (rule == "zero" and v) or (
                rule == "enum" and v > 5):
            raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, f"set_hca_cap_{field}")
    for field in mlx5_caps.WRITABLE_GENERAL:
        MLX5_SET("cmd_hca_cap", cur, field, MLX5_GET("cmd_hca_cap", new, field))
    per_page = 1 << fw.cap("log_uar_page_sz") if fw.cap("uar_4k") else 1
    MLX5_SET("cmd_hca_cap", cur, "num_of_uars_per_page", per_page)


# -- UAR, PD, transport domain, user context ---------------------------------------------------
def _alloc(fw: Firmware, kind: str, table: dict, cls: type, in_: IfcStruct) -> int:
    num = fw.new_id(kind, table)
    table[num] = cls(num, _uid(in_))
    return num


@fw_command(MLX5_CMD_OP_ALLOC_UAR, "alloc_uar")
def alloc_uar(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """A whole system page of UARs; the answer is its first UAR.  With uar_4k the
    caller owns uars_per_page consecutive 4 KiB UARs from that (aligned) index:
    mlx5_core's alloc_uars_page maps the page once and numbers its bfregs
    up->index + dbi / 4, mlx5_ib puts sys_pages[i] + n in a QPC, and no two
    callers can ever map the same system page."""
    per = fw.uars_per_page
    ids = fw._ids["uar"]  # in system pages; the granule is fixed once INIT_HCA ran
    ids.start = max(ids.start, fw.first_uar // per)
    ids.end = fw.nr_uars // per
    ids.next = max(ids.next, ids.start)
    num = ids.alloc({n // per for n in fw.uars}, "uar") * per
    fw.uars[num] = Mlx5Uar(num, _uid(in_), per)
    MLX5_SET("alloc_uar_out", out, "uar", num)


@fw_command(MLX5_CMD_OP_DEALLOC_UAR, "dealloc_uar")
def dealloc_uar(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """Frees what ALLOC_UAR gave: it must be named by the page's first UAR."""
    uar = fw.lookup(fw.uars, MLX5_GET("dealloc_uar_in", in_, "uar"), _uid(in_), "uar")
    fw.release(uar, "uar")
    del fw.uars[uar.num]
    fw.hca.object_destroyed("uar", uar.num)


@fw_command(MLX5_CMD_OP_ALLOC_PD, "alloc_pd")
def alloc_pd(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    MLX5_SET("alloc_pd_out", out, "pd", _alloc(fw, "pd", fw.pds, Mlx5Pd, in_))


@fw_command(MLX5_CMD_OP_DEALLOC_PD, "dealloc_pd")
def dealloc_pd(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    pd = fw.lookup(fw.pds, MLX5_GET("dealloc_pd_in", in_, "pd"), _uid(in_), "pd")
    fw.release(pd, "pd")
    del fw.pds[pd.num]


@fw_command(MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN, "alloc_transport_domain")
def alloc_transport_domain(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    MLX5_SET("alloc_transport_domain_out", out, "transport_domain",
             _alloc(fw, "td", fw.tds, Mlx5Td, in_))


@fw_command(MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN, "dealloc_transport_domain")
def dealloc_transport_domain(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    tdn = MLX5_GET("dealloc_transport_domain_in", in_, "transport_domain")
    td = fw.lookup(fw.tds, tdn, _uid(in_), "transport_domain")
    del fw.tds[td.num]


@fw_command(MLX5_CMD_OP_CREATE_UCTX, "create_uctx")
def create_uctx(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    if _uid(in_):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "create_uctx_with_uid")
    num = fw.new_id("uctx", fw.uctxs)
    fw.uctxs[num] = Mlx5Uctx(num, num)
    MLX5_SET("create_uctx_out", out, "uid", num)


@fw_command(MLX5_CMD_OP_DESTROY_UCTX, "destroy_uctx")
def destroy_uctx(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    uid = MLX5_GET("destroy_uctx_in", in_, "uid")
    if uid not in fw.uctxs:
        raise FwError(MLX5_CMD_STAT_BAD_RES_ERR, "uctx_not_found")
    if any(t.owns(uid) for t in fw.tables().values() if t is not fw.uctxs):
        raise FwError(MLX5_CMD_STAT_RES_BUSY, "uctx_busy")
    del fw.uctxs[uid]
