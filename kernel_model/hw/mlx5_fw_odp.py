"""The firmware's on-demand-paging commands (device model): the MTT update UMR and
PAGE_FAULT_RESUME.

An mkey created with create_mkey_in.pg_access (the device's pg capability) may
have MTT entries without their present bits (MTT read bit 0, write bit 1): an
access through one raises a page fault (mlx5_engine.Mlx5Engine.hca_page_fault)
instead of a protection error.  The driver fills the entries with
EMU_UMR_UPDATE_XLT (mlx5r_umr_update_xlt) and tells the device to go on with
PAGE_FAULT_RESUME (the token of the fault; `error` when it could not resolve
it: the access then completes in error).  Zapping entries (an invalidation)
drains the DMA already through the mkey before the command completes, as the
UMR's completion does.

The firmware keeps, per mkey, whether any entry lacks its present bits
(Mlx5Mkey.pf_absent) so the engine checks the bits only on such mkeys.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.hw.mlx5_fw_cmd import FwError, fw_command
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_OP_EMU_UMR_UPDATE_XLT,
    MLX5_CMD_OP_PAGE_FAULT_RESUME,
    MLX5_CMD_STAT_BAD_INP_LEN_ERR,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_GET,
    MLX5_MKC_ACCESS_MODE_KSM,
    MLX5_SET,
    IfcStruct,
)
from kernel_model.sched import touch_key

if TYPE_CHECKING:
    from c_ext import U64Array
    from kernel_model.hw.mlx5_fw import Firmware

MTT_PRESENT = 3          # MLX5_IB_MTT_READ | MLX5_IB_MTT_WRITE


def mtt_entries(mkc: IfcStruct) -> int:
    """The MTT entries an mkey's range [start_addr, start_addr + len) uses."""
    page = 1 << mkc["log_page_size"]
    return -(-((mkc["start_addr"] & (page - 1)) + mkc["len"]) // page)


def mtt_absent(fw: Firmware, pas: U64Array, n: int) -> bool:
    """Does any of the first n (big-endian) MTT entries lack a present bit
    (MTT_PRESENT, the entry's two lowest bits)?  The machine's loop (c_ext
    mtt_absent): a 1 GiB table of 64 KiB pages is 16,384 entries."""
    return fw.hca.machine.ops.mtt_absent(pas, min(n, pas.n))


def _uid(in_: IfcStruct) -> int:
    return MLX5_GET("mbox_in", in_, "uid")


@fw_command(MLX5_CMD_OP_EMU_UMR_UPDATE_XLT, "emu_umr_update_xlt")
def emu_umr_update_xlt(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """What the UMR of mlx5r_umr_update_xlt does for an ODP MR (see the opcode's EMU
    note): xlt_nentries entries from xlt_offset replaced - by the command's entries,
    or (zap) by entries with no present bit, after the DMA already through the mkey
    has drained; with `enable` the mkey's free bit cleared.  BAD_PARAM for a range
    beyond the mkey's table or an mkey not created with pg_access; BAD_INP_LEN when
    the command carries fewer entries than it names.  A KSM mkey's entries (the parent
    of an implicit ODP MR) are 16-byte KSMs (reserved, key, address), and the driver
    sends them even to zap (entries on the null mkey)."""
    index = MLX5_GET("emu_umr_update_xlt_in", in_, "mkey_index")
    mkey = fw.lookup(fw.mkeys, index, _uid(in_), "mkey", kernel_any=True)
    first = MLX5_GET("emu_umr_update_xlt_in", in_, "xlt_offset")
    n = MLX5_GET("emu_umr_update_xlt_in", in_, "xlt_nentries")
    zap = MLX5_GET("emu_umr_update_xlt_in", in_, "zap")
    # a KSM mkey's entries (implicit ODP's parent) are 16 bytes: two of the table's words
    ksm = mkey.mkc["access_mode_4_2"] << 2 | mkey.mkc["access_mode_1_0"] == MLX5_MKC_ACCESS_MODE_KSM
    w = 2 if ksm else 1
    if not getattr(mkey, "pg_access", None) or (first + n) * w > mkey.pas.n:
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "umr_update_xlt_range")
    src = MLX5_ADDR_OF("emu_umr_update_xlt_in", in_, "klm_pas_mtt")
    if not zap and src.n < n * w:
        raise FwError(MLX5_CMD_STAT_BAD_INP_LEN_ERR, "umr_update_xlt_entries")
    view = mkey.pas.view
    # the table changes in place: for partial-order reduction, a write of the field
    # every DMA through the mkey reads (the C array reports nothing itself)
    touch_key((id(mkey), "pas"), True)
    if zap:
        view[first * w:(first + n) * w] = memoryview(bytes(8 * n * w)).cast("Q")
    else:
        view[first * w:(first + n) * w] = src.view[:n * w]
    if not ksm:
        mkey.pf_absent = mtt_absent(fw, mkey.pas, mtt_entries(mkey.mkc))
    mkey.hw_cache = None
    if MLX5_GET("emu_umr_update_xlt_in", in_, "enable"):
        MLX5_SET("mkc", mkey.mkc, "free", 0)
    if zap:
        fw.hca.engine.mkey_revoked(index)      # the UMR completes once the DMA drained


@fw_command(MLX5_CMD_OP_PAGE_FAULT_RESUME, "page_fault_resume")
def page_fault_resume(fw: Firmware, in_: IfcStruct, out: IfcStruct) -> None:
    """PAGE_FAULT_RESUME: the page fault named by token is handled (error: it could not
    be resolved - its access completes in error); the QP goes on.  Kernel only (uid 0);
    BAD_PARAM for a token no fault waits with."""
    if _uid(in_):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "page_fault_resume_uid")
    token = MLX5_GET("page_fault_resume_in", in_, "token")
    error = bool(MLX5_GET("page_fault_resume_in", in_, "error"))
    if not fw.hca.engine.page_fault_resume(token, error):
        raise FwError(MLX5_CMD_STAT_BAD_PARAM_ERR, "page_fault_resume_token")
