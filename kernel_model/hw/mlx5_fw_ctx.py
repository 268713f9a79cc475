"""The firmware's queue and memory-key contexts: EQ, CQ, QP, mkey (device model).

The firmware keeps what the real device keeps, because the data path
executes through it: each object holds a copy of the context the driver
wrote (qpc, cqc, mkc, eqc as IfcStructs, read with obj.qpc["uar_page"]), the
PAS/MTT array exactly as the command carried it (big-endian U64Array), its
owning uid, and the objects it refers to (whose user counts make DEALLOC_PD,
DESTROY_CQ, DEALLOC_UAR and DESTROY_EQ fail with RES_BUSY while in use).

    fw.qps[qpn].qpc["log_sq_size"]       fw.qps[qpn].state == MLX5_QPC_STATE_RST
    fw.cqs[cqn].cqc["c_eqn_or_apu_element"]
    fw.mkeys[index].mkey, .mkc["start_addr"], .pas

Checks are the cheap ones a real firmware makes: field ranges against the
current capabilities, referenced objects exist and are the caller's (uid)
or shared (uid 0; a UAR must be the caller's own), the PAS covers the buffer
the context describes.
# EMU: XRC domains, DEVX umems and event delivery (EQEs) are not
# modelled: a context naming a umem is refused with BAD_PARAM, and no EQE
# is ever written to an EQ's buffer.  SRQs are mlx5_fw_srq.py's.
"""

from __future__ import annotations

from collections import ChainMap
from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.hw import mlx5_fw_memic, mlx5_fw_odp
from kernel_model.hw.mlx5_fw_cmd import ADAPTER_PAGE, FwError, FwObject, fw_command
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_CQ,
    MLX5_CMD_OP_CREATE_EQ,
    MLX5_CMD_OP_CREATE_MKEY,
    MLX5_CMD_OP_CREATE_QP,
    MLX5_CMD_OP_DESTROY_CQ,
    MLX5_CMD_OP_DESTROY_EQ,
    MLX5_CMD_OP_DESTROY_MKEY,
    MLX5_CMD_OP_DESTROY_QP,
    MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS,
    MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY,
    MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY,
    MLX5_CMD_OP_MODIFY_CQ,
    MLX5_CMD_OP_QUERY_CQ,
    MLX5_CMD_OP_QUERY_MKEY,
    MLX5_CMD_OP_QUERY_QP,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_BAD_RES_STATE_ERR,
    MLX5_CQ_OPMOD_RESIZE,
    MLX5_GET,
    MLX5_MKC_ACCESS_MODE_KSM,
    MLX5_MKC_ACCESS_MODE_MEMIC,
    MLX5_MKC_ACCESS_MODE_MTT,
    MLX5_MODIFY_CQ_MASK_LOG_SIZE,
    MLX5_MODIFY_CQ_MASK_PG_OFFSET,
    MLX5_MODIFY_CQ_MASK_PG_SIZE,
    MLX5_NON_ZERO_RQ,
    MLX5_QPC_ST_XRC,
    MLX5_QPC_STATE_RST,
    MLX5_SET,
    MLX5_SET64,
    MLX5_SRQ_RQ,
    MLX5_ZERO_LEN_RQ,
    IfcStruct,
    memcpy_ifc,
)

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware

_QP_STATES = {0: "RST", 1: "INIT", 2: "RTR", 3: "RTS", 4: "SQER", 6: "ERR", 7: "SQD"}
_QP_TYPES = {0x0: "RC", 0x1: "UC", 0x2: "UD", 0x3: "XRC", 0x5: "DCI", 0x7: "QP0", 0x8: "QP1",
             0x9: "RAW", 0xc: "REG_UMR"}
_ACCESS_MODES = {0: "PA", 1: "MTT", 2: "KLM", 3: "KSM", 5: "MEMIC"}


class Mlx5Ctx(FwObject):
    """A context-holding object: its context copy, PAS copy and referenced objects."""

    def __init__(self, num: int, uid: int, ctx: IfcStruct, pas: U64Array,
                 refs: list[FwObject]):
        super().__init__(num, uid)
        self.ctx, self.pas, self.refs = ctx, pas, []
        self.set_refs(refs)

    def drop_refs(self) -> None:
        for r in self.refs:
            r.users -= 1
        self.refs = []

    def set_refs(self, refs: list[FwObject]) -> None:
        """Hold `refs` (counted in their users) instead of what the object held: at
        creation, and when a UMR moves an mkey to another PD."""
        self.drop_refs()
        self.refs = list(refs)
        for r in self.refs:
            r.users += 1


def destroy_ctx(fw: Firmware, table: dict, obj: Mlx5Ctx, what: str) -> None:
    """The common end of a DESTROY command: RES_BUSY while something still uses the
    object, else it lets go of what it referenced, leaves its table, and the data path
    forgets what it kept of it."""
    fw.release(obj, what)
    obj.drop_refs()
    del table[obj.num]
    fw.hca.object_destroyed(what, obj.num)


class Mlx5Eq(Mlx5Ctx):
    kind = "EQ"

    @property
    def eqc(self) -> IfcStruct:
        return self.ctx

    def __repr__(self) -> str:
        return (f"EQ {self.num:#x} size=2^{self.eqc['log_eq_size']} "
                f"uar={self.eqc['uar_page']:#x} intr={self.eqc['intr']}")


class Mlx5Cq(Mlx5Ctx):
    kind = "CQ"

    @property
    def cqc(self) -> IfcStruct:
        return self.ctx

    def __repr__(self) -> str:
        c = self.cqc
        return (f"CQ {self.num:#x} size=2^{c['log_cq_size']} cqe={64 << c['cqe_sz']} "
                f"uar={c['uar_page']:#x} eqn={c['c_eqn_or_apu_element']:#x} uid={self.uid}")


class Mlx5Qp(Mlx5Ctx):
    kind = "QP"

    @property
    def qpc(self) -> IfcStruct:
        return self.ctx

    @property
    def state(self) -> int:
        """qpc.state - MLX5_GET("qpc", ctx, "state") with the field's lookup done: a
        top-level field, which the engine reads several times per WQE."""
        return self.ctx.vals.get("state", 0)

    def __repr__(self) -> str:
        q = self.qpc
        return (f"QP {self.num:#x} {_QP_STATES.get(q['state'], q['state'])} "
                f"{_QP_TYPES.get(q['st'], hex(q['st']))} pd={q['pd']:#x} "
                f"uar={q['uar_page']:#x} cqn_snd={q['cqn_snd']:#x} cqn_rcv={q['cqn_rcv']:#x} "
                f"uid={self.uid}")


class Mlx5Mkey(Mlx5Ctx):
    kind = "MKEY"

    @property
    def mkc(self) -> IfcStruct:
        return self.ctx

    @property
    def mkey(self) -> int:
        """The key a WQE names: index << 8 | the variant byte the driver chose."""
        return self.num << 8 | self.mkc["mkey_7_0"]

    def __repr__(self) -> str:
        m = self.mkc
        mode = _ACCESS_MODES.get(m["access_mode_4_2"] << 2 | m["access_mode_1_0"], "?")
        acc = " ".join(a for a in ("lr", "lw", "rr", "rw", "a") if m[a])
        return (f"MKEY {self.mkey:#x} pd={m['pd']:#x} va={m['start_addr']:#x} "
                f"len={m['len']:#x} {mode} {acc}{' free' if m['free'] else ''} uid={self.uid}")


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


def _bad(check: str) -> FwError:
    return FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, check)


def _check_pas(pas: U64Array, log_page_size: int, page_offset: int, nbytes: int,
               check: str) -> None:
    """The PAS must cover page_offset (in 1/64 page units) plus nbytes."""
    page = ADAPTER_PAGE << log_page_size
    need = -(-(page_offset * (page // 64) + nbytes) // page)
    if len(pas) < need:
        raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, check)


def _copy_pas(pas: U64Array) -> U64Array:
    keep = U64Array(pas.n, zero=False)          # every entry written next
    keep.view[: pas.n] = pas.view[: pas.n]
    return keep


# -- EQ -----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_EQ, "create_eq")
def create_eq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    eqc = MLX5_ADDR_OF("create_eq_in", in_, "eq_context_entry")
    if _uid(in_):
        raise _bad("create_eq_uid")
    if eqc["log_eq_size"] > fw.cap("log_max_eq_sz"):
        raise _bad("create_eq_log_size")
    uar = fw.ref_uar(eqc["uar_page"], 0, "create_eq_uar")
    pas = MLX5_ADDR_OF("create_eq_in", in_, "pas")
    _check_pas(pas, eqc["log_page_size"], eqc["page_offset"], 64 << eqc["log_eq_size"],
               "create_eq_pas")
    eqn = fw.new_id("eq", fw.eqs)
    fw.eqs[eqn] = Mlx5Eq(eqn, 0, eqc.copy(), _copy_pas(pas), [uar])
    fw.eqs[eqn].event_bitmask = MLX5_GET("create_eq_in", in_, "event_bitmask")
    MLX5_SET("create_eq_out", out, "eq_number", eqn)


@fw_command(MLX5_CMD_OP_DESTROY_EQ, "destroy_eq")
def destroy_eq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    eq = fw.lookup(fw.eqs, MLX5_GET("destroy_eq_in", in_, "eq_number"), _uid(in_), "eq")
    destroy_ctx(fw, fw.eqs, eq, "eq")


# -- CQ -----------------------------------------------------------------------------------
@fw_command(MLX5_CMD_OP_CREATE_CQ, "create_cq")
def create_cq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    uid = _uid(in_)
    cqc = MLX5_ADDR_OF("create_cq_in", in_, "cq_context")
    if MLX5_GET("create_cq_in", in_, "cq_umem_valid") or cqc["dbr_umem_valid"]:
        raise _bad("create_cq_umem")
    if cqc["log_cq_size"] > fw.cap("log_max_cq_sz"):
        raise _bad("create_cq_log_size")
    if cqc["cqe_sz"] > 2:  # 0: 64 B, 1: 128 B, 2: 128 B padded (cqe_128_always)
        raise _bad("create_cq_cqe_sz")
    uar = fw.ref_uar(cqc["uar_page"], uid, "create_cq_uar", shared=False)
    eq = fw.ref(fw.eqs, cqc["c_eqn_or_apu_element"], uid, "create_cq_eqn")
    pas = MLX5_ADDR_OF("create_cq_in", in_, "pas")
    _check_pas(pas, cqc["log_page_size"], cqc["page_offset"],
               (64 << min(cqc["cqe_sz"], 1)) << cqc["log_cq_size"], "create_cq_pas")
    cqn = fw.new_id("cq", fw.cqs)
    fw.cqs[cqn] = Mlx5Cq(cqn, uid, cqc.copy(), _copy_pas(pas), [uar, eq])
    MLX5_SET("create_cq_out", out, "cqn", cqn)


@fw_command(MLX5_CMD_OP_DESTROY_CQ, "destroy_cq")
def destroy_cq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    cq = fw.lookup(fw.cqs, MLX5_GET("destroy_cq_in", in_, "cqn"), _uid(in_), "cq")
    destroy_ctx(fw, fw.cqs, cq, "cq")


@fw_command(MLX5_CMD_OP_QUERY_CQ, "query_cq")
def query_cq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    cq = fw.lookup(fw.cqs, MLX5_GET("query_cq_in", in_, "cqn"), _uid(in_), "cq")
    memcpy_ifc(MLX5_ADDR_OF("query_cq_out", out, "cq_context"), cq.cqc)


@fw_command(MLX5_CMD_OP_MODIFY_CQ, "modify_cq")
def modify_cq(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """MODIFY_CQ with op_mod RESIZE: a new ring (size, page size and offset, PAS) for the
    CQ.  The CQEs software has not consumed must fit in it with the RESIZE CQE the
    device writes at the old producer index (BAD_PARAM otherwise); the device then
    goes on in the new ring.  # EMU: only resize is modelled (moderation: BAD_PARAM)."""
    cq = fw.lookup(fw.cqs, MLX5_GET("modify_cq_in", in_, "cqn"), _uid(in_), "cq")
    if MLX5_GET("modify_cq_in", in_, "op_mod") != MLX5_CQ_OPMOD_RESIZE:
        raise _bad("modify_cq_op_mod")
    if MLX5_GET("modify_cq_in", in_, "cq_umem_valid"):
        raise _bad("modify_cq_umem")
    select = MLX5_GET("modify_cq_in", in_, "modify_field_select")
    if select & ~(MLX5_MODIFY_CQ_MASK_LOG_SIZE | MLX5_MODIFY_CQ_MASK_PG_OFFSET
                  | MLX5_MODIFY_CQ_MASK_PG_SIZE) or not select & MLX5_MODIFY_CQ_MASK_LOG_SIZE:
        raise _bad("modify_cq_field_select")
    new = MLX5_ADDR_OF("modify_cq_in", in_, "cq_context")
    if new["log_cq_size"] > fw.cap("log_max_cq_sz") or not fw.cap("cq_resize"):
        raise _bad("modify_cq_log_size")
    pas = MLX5_ADDR_OF("modify_cq_in", in_, "pas")
    cqc = cq.cqc
    log_page = new["log_page_size"] if select & MLX5_MODIFY_CQ_MASK_PG_SIZE \
        else cqc["log_page_size"]
    offset = new["page_offset"] if select & MLX5_MODIFY_CQ_MASK_PG_OFFSET else cqc["page_offset"]
    _check_pas(pas, log_page, offset, (64 << min(cqc["cqe_sz"], 1)) << new["log_cq_size"],
               "modify_cq_pas")
    if not fw.hca.engine.cq_resize(cq, new["log_cq_size"], log_page, offset, _copy_pas(pas)):
        raise _bad("modify_cq_outstanding")


# -- QP -----------------------------------------------------------------------------------
def _qp_buffer_bytes(fw: Firmware, qpc: IfcStruct) -> int:
    """Bytes of the RQ (first) and SQ the QPC describes, after range checks."""
    if qpc["st"] not in _QP_TYPES:
        raise _bad("create_qp_st")
    if max(qpc["log_sq_size"], qpc["log_rq_size"]) > fw.cap("log_max_qp_sz"):
        raise _bad("create_qp_log_size")
    if 16 << qpc["log_rq_stride"] > fw.cap("max_wqe_sz_rq"):
        raise _bad("create_qp_rq_stride")
    if qpc["ts_format"] > 2:
        raise _bad("create_qp_ts_format")
    if qpc["dbr_addr"] & 3:
        raise _bad("create_qp_dbr_align")
    rq = (1 << qpc["log_rq_size"]) << (qpc["log_rq_stride"] + 4) \
        if qpc["rq_type"] == MLX5_NON_ZERO_RQ else 0
    sq = 0 if qpc["no_sq"] else 64 << qpc["log_sq_size"]
    return rq + sq


def _qp_refs(fw: Firmware, qpc: IfcStruct, uid: int) -> list[FwObject]:
    if qpc["st"] == MLX5_QPC_ST_XRC and qpc["no_sq"] and qpc["rq_type"] == MLX5_SRQ_RQ:
        # EMU: an XRC target QP refers to its domain only: the device-global PD, CQ
        # and SRQ mlx5_ib names in the real QPC (devr) are not modelled; each
        # request names the domain's SRQ it goes to
        return [fw.ref(fw.xrcds, qpc["xrcd"], uid, "create_qp_xrcd")]
    refs = [fw.ref(fw.pds, qpc["pd"], uid, "create_qp_pd"),
            fw.ref_uar(qpc["uar_page"], uid, "create_qp_uar", shared=False)]
    if not qpc["no_sq"]:
        refs.append(fw.ref(fw.cqs, qpc["cqn_snd"], uid, "create_qp_cqn_snd"))
    if qpc["rq_type"] in (MLX5_NON_ZERO_RQ, MLX5_SRQ_RQ) or (
            qpc["rq_type"] == MLX5_ZERO_LEN_RQ and qpc["cqn_rcv"]):
        refs.append(fw.ref(fw.cqs, qpc["cqn_rcv"], uid, "create_qp_cqn_rcv"))
    if qpc["rq_type"] == MLX5_SRQ_RQ and qpc["srqn_rmpn_xrqn"]:   # busy while attached
        refs.append(fw.ref(fw.srqs, qpc["srqn_rmpn_xrqn"], uid, "create_qp_srqn"))
    if qpc["xrcd"]:                     # an XRC QP's domain (uid 0: shared)
        refs.append(fw.ref(fw.xrcds, qpc["xrcd"], uid, "create_qp_xrcd"))
    return refs


@fw_command(MLX5_CMD_OP_CREATE_QP, "create_qp")
def create_qp(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    uid = _uid(in_)
    qpc = MLX5_ADDR_OF("create_qp_in", in_, "qpc")
    if MLX5_GET("create_qp_in", in_, "wq_umem_valid") or qpc["dbr_umem_valid"]:
        raise _bad("create_qp_umem")
    nbytes = _qp_buffer_bytes(fw, qpc)
    refs = _qp_refs(fw, qpc, uid)
    pas = MLX5_ADDR_OF("create_qp_in", in_, "pas")
    if nbytes:
        _check_pas(pas, qpc["log_page_size"], qpc["page_offset"], nbytes, "create_qp_pas")
    qpn = fw.new_id("qp", ChainMap(fw.qps, fw.dcts))   # DCTs share the numbers
    keep = qpc.copy()
    MLX5_SET("qpc", keep, "state", MLX5_QPC_STATE_RST)
    fw.qps[qpn] = Mlx5Qp(qpn, uid, keep, _copy_pas(pas), refs)
    MLX5_SET("create_qp_out", out, "qpn", qpn)


@fw_command(MLX5_CMD_OP_DESTROY_QP, "destroy_qp")
def destroy_qp(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    qp = fw.lookup(fw.qps, MLX5_GET("destroy_qp_in", in_, "qpn"), _uid(in_), "qp")
    qp.drop_refs()
    del fw.qps[qp.num]
    fw.hca.object_destroyed("qp", qp.num)


@fw_command(MLX5_CMD_OP_QUERY_QP, "query_qp")
def query_qp(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    qp = fw.lookup(fw.qps, MLX5_GET("query_qp_in", in_, "qpn"), _uid(in_), "qp")
    memcpy_ifc(MLX5_ADDR_OF("query_qp_out", out, "qpc"), qp.qpc)


# -- mkey ---------------------------------------------------------------------------------
def _check_mtt(in_: IfcStruct, mkc: IfcStruct) -> None:
    """An MTT mkey's translation table must cover [start_addr, start_addr + len)."""
    if mkc["free"] or mkc["length64"] or MLX5_GET("create_mkey_in", in_, "pg_access"):
        return  # created free for UMR, or whole address space: no table yet
    if mkc["log_page_size"] < 12:
        raise _bad("create_mkey_log_page_size")
    page = 1 << mkc["log_page_size"]
    need = -(-((mkc["start_addr"] & (page - 1)) + mkc["len"]) // page)
    if mkc["translations_octword_size"] * 2 < need:
        raise _bad("create_mkey_octwords")
    if len(MLX5_ADDR_OF("create_mkey_in", in_, "klm_pas_mtt")) < need:
        raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, "create_mkey_mtt")


@fw_command(MLX5_CMD_OP_CREATE_MKEY, "create_mkey")
def create_mkey(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    uid = _uid(in_)
    mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
    if MLX5_GET("create_mkey_in", in_, "mkey_umem_valid"):
        raise _bad("create_mkey_umem")
    mode = mkc["access_mode_4_2"] << 2 | mkc["access_mode_1_0"]
    if mode > MLX5_MKC_ACCESS_MODE_KSM and mode != MLX5_MKC_ACCESS_MODE_MEMIC:
        raise _bad("create_mkey_access_mode")
    pd = fw.ref(fw.pds, mkc["pd"], uid, "create_mkey_pd")
    refs: list = [pd]
    if mode == MLX5_MKC_ACCESS_MODE_MTT:
        _check_mtt(in_, mkc)
    elif mode == MLX5_MKC_ACCESS_MODE_MEMIC:
        # start_addr is a BAR-relative MEMIC address: the range must be allocated
        memic = mlx5_fw_memic.memic_covers(fw, mkc["start_addr"], mkc["len"])
        if memic is None or mkc["length64"]:
            raise _bad("create_mkey_memic_range")
        refs.append(memic)
    index = fw.new_id("mkey", fw.mkeys)
    pas = MLX5_ADDR_OF("create_mkey_in", in_, "klm_pas_mtt")
    fw.mkeys[index] = Mlx5Mkey(index, uid, mkc.copy(), _copy_pas(pas), refs)
    if mode == MLX5_MKC_ACCESS_MODE_MTT and MLX5_GET("create_mkey_in", in_, "pg_access"):
        # a page fault, not an error, for an entry not present (mlx5_fw_odp)
        fw.mkeys[index].pg_access = True
        fw.mkeys[index].pf_absent = mlx5_fw_odp.mtt_absent(fw, fw.mkeys[index].pas,
                                                            mlx5_fw_odp.mtt_entries(mkc))
    elif mode == MLX5_MKC_ACCESS_MODE_KSM and MLX5_GET("create_mkey_in", in_, "pg_access"):
        fw.mkeys[index].pg_access = True        # a null-mkey entry faults (implicit ODP)
    MLX5_SET("create_mkey_out", out, "mkey_index", index)


@fw_command(MLX5_CMD_OP_DESTROY_MKEY, "destroy_mkey")
def destroy_mkey(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    index = MLX5_GET("destroy_mkey_in", in_, "mkey_index")
    # mlx5_core_destroy_mkey() sends no uid, even for a user context's mkey: the
    # kernel's uid 0 may destroy any mkey; a user uid only its own
    mkey = fw.lookup(fw.mkeys, index, _uid(in_), "mkey", kernel_any=True)
    mkey.drop_refs()
    del fw.mkeys[index]


@fw_command(MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY, "emu_umr_revoke_mkey")
def emu_umr_revoke_mkey(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """What the UMR of mlx5r_umr_revoke_mr does (see the EMU note at the opcode): the
    mkey becomes free and moves to the UMR PD, so no later access passes its checks,
    and the command completes only after DMA already through it has finished."""
    index = MLX5_GET("emu_umr_revoke_mkey_in", in_, "mkey_index")
    mkey = fw.lookup(fw.mkeys, index, _uid(in_), "mkey", kernel_any=True)
    MLX5_SET("mkc", mkey.mkc, "free", 1)
    MLX5_SET("mkc", mkey.mkc, "pd", 0)      # the UMR PD: no user PD has number 0 here
    MLX5_SET("mkc", mkey.mkc, "qpn", 0xFFFFFF)
    mkey.hw_cache = None
    fw.hca.engine.mkey_revoked(index)


@fw_command(MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY, "emu_umr_update_mkey")
def emu_umr_update_mkey(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """What the UMR of MLNX_OFED 4.x mlx5_ib_update_xlt does (see the opcode's EMU
    note): load the translation and the PD, access bits and range of a kernel mkey
    made free for UMR, and with `enable` clear its free bit - from then on the HCA
    translates through it, whatever the pages are now.  The PD must exist (it is
    taken as the mkey's reference).  A UMR that fails changes nothing."""
    index = MLX5_GET("emu_umr_update_mkey_in", in_, "mkey_index")
    mkey = fw.lookup(fw.mkeys, index, _uid(in_), "mkey", kernel_any=True)
    new = MLX5_ADDR_OF("emu_umr_update_mkey_in", in_, "memory_key_mkey_entry")
    pd = fw.ref(fw.pds, new["pd"], mkey.uid, "umr_update_mkey_pd")
    pas = MLX5_ADDR_OF("emu_umr_update_mkey_in", in_, "klm_pas_mtt")
    page = 1 << new["log_page_size"]
    if -(-((new["start_addr"] & (page - 1)) + new["len"]) // page) > pas.n:
        raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, "umr_update_mkey_mtt")
    m = mkey.mkc
    for field in ("pd", "a", "rw", "rr", "lw", "lr", "log_page_size",
                  "translations_octword_size"):
        MLX5_SET("mkc", m, field, new[field])
    MLX5_SET64("mkc", m, "start_addr", new["start_addr"])
    MLX5_SET64("mkc", m, "len", new["len"])
    mkey.set_refs([pd])
    mkey.pas = _copy_pas(pas)
    if MLX5_GET("emu_umr_update_mkey_in", in_, "enable"):
        MLX5_SET("mkc", m, "free", 0)
    mkey.hw_cache = None


@fw_command(MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS, "emu_umr_rereg_pd_access")
def emu_umr_rereg_pd_access(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """What the UMR of mlx5r_umr_rereg_pd_access does (see the opcode's EMU note): the
    mkey keeps its key, translation and range; its PD and access bits (a, rw, rr, lw,
    lr) become the given ones.  MLX5_UMR_CHECK_FREE: a free (revoked) mkey fails
    (BAD_RES_STATE), as does a PD that does not exist (BAD_PARAM); a failed UMR
    changes nothing."""
    index = MLX5_GET("emu_umr_rereg_pd_access_in", in_, "mkey_index")
    mkey = fw.lookup(fw.mkeys, index, _uid(in_), "mkey", kernel_any=True)
    if mkey.mkc["free"]:
        raise FwError(MLX5_CMD_STAT_BAD_RES_STATE_ERR, "umr_rereg_pd_access_free")
    new = MLX5_ADDR_OF("emu_umr_rereg_pd_access_in", in_, "memory_key_mkey_entry")
    pd = fw.ref(fw.pds, new["pd"], mkey.uid, "umr_rereg_pd_access_pd")
    for field in ("pd", "a", "rw", "rr", "lw", "lr"):
        MLX5_SET("mkc", mkey.mkc, field, new[field])
    mkey.set_refs([pd])
    mkey.hw_cache = None


@fw_command(MLX5_CMD_OP_QUERY_MKEY, "query_mkey")
def query_mkey(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    mkey = fw.lookup(fw.mkeys, MLX5_GET("query_mkey_in", in_, "mkey_index"), _uid(in_), "mkey")
    memcpy_ifc(MLX5_ADDR_OF("query_mkey_out", out, "memory_key_mkey_entry"), mkey.mkc)
