"""Device memory (MEMIC) in the kernel, driven by raw RDMA_VERBS_IOCTL calls: every errno
of UVERBS_METHOD_DM_ALLOC / DM_FREE / DM_MR_REG (drivers/ib_core/uverbs_std_types_dm.py)
and of mlx5_ib_alloc_dm / dealloc_dm / reg_dm_mr (drivers/mlx5_ib/dm.py), the
firmware's ALLOC_MEMIC / DEALLOC_MEMIC (kernel_model/hw/mlx5_fw_memic.py), when the
MEMIC goes back (the last mapping of its pages), and the leak check's report of a
MEMIC left allocated."""

from __future__ import annotations

import errno
from typing import Any

import pytest

import drivers.mlx5_ib.dm as mlx5_dm
from drivers.mlx5_ib.dm import mlx5_cmd_alloc_memic, mlx5_cmd_dealloc_memic
from kernel_model.emu.leakcheck import LeakError
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_fw_memic import memic_window
from kernel_model.hw.mlx5_ifc import (
    MLX5_CMD_OP_ALLOC_MEMIC,
    MLX5_CMD_OP_CREATE_MKEY,
    MLX5_CMD_OP_DEALLOC_MEMIC,
    MLX5_CMD_STAT_BAD_PARAM_ERR,
    MLX5_CMD_STAT_NO_RES_ERR,
    MLX5_CMD_STAT_RES_BUSY,
    MLX5_GET,
)
from kernel_model.uapi import ib_user_ioctl_cmds as c
from kernel_model.uapi import rdma_user_ioctl as ui
from kernel_model.uapi.mlx5_abi import MLX5_IB_MMAP_DEVICE_MEM
from kernel_model.uapi.rdma_user_ioctl import (
    MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE,
    MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX,
    MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET,
    MLX5_IB_UAPI_DM_TYPE_STEERING_SW_ICM,
)
from tests.drivers.mlx5_ib.ladder import host, ib_dev, last_error, open_ctx
from tests.kernel_model.hw.fwcmd import fails, ok
from userspace.libc import MAP_SHARED, PROT_READ, PROT_WRITE
from userspace.libibverbs import verbs as v

PS = 4096
MEMIC_SIZE = 256 << 10
ZB, LW = v.IBV_ACCESS_ZERO_BASED, v.IBV_ACCESS_LOCAL_WRITE
RW, RR = v.IBV_ACCESS_REMOTE_WRITE, v.IBV_ACCESS_REMOTE_READ
IB_ACCESS_MW_BIND, IB_ACCESS_ON_DEMAND = 0x10, 0x40
OUT = 0x800  # outputs live from here on in the command page


# -- helpers -------------------------------------------------------------------------------
def memics(m) -> dict:
    return m.hcas[0].fw.memics


def bitmap(m) -> set[int]:
    """The driver's taken MEMIC pages."""
    return ib_dev(m).dm.memic_alloc_pages


def A(attr_id: int, data: int = 0, n: int = 8) -> ui.ib_uverbs_attr:
    return ui.ib_uverbs_attr(attr_id=attr_id, len=n, flags=ui.UVERBS_ATTR_F_MANDATORY, data=data)


def call(ctx, obj: int, method: int, attrs: list[ui.ib_uverbs_attr]) -> tuple[int, list[int]]:
    """One RDMA_VERBS_IOCTL: (its return, every attribute's data as the kernel left it)."""
    hdr = ui.ib_uverbs_ioctl_hdr(length=ui.ib_uverbs_ioctl_hdr.SIZE
                                 + len(attrs) * ui.ib_uverbs_attr.SIZE,
                                 object_id=obj, method_id=method, num_attrs=len(attrs),
                                 driver_id=1)
    ctx.proc.store(ctx.cmd_buf, hdr.pack() + b"".join(a.pack() for a in attrs))
    rc = ctx.proc.ioctl(ctx.cmd_fd, ui.RDMA_VERBS_IOCTL, ctx.cmd_buf)
    raw = ctx.proc.load(ctx.cmd_buf + ui.ib_uverbs_ioctl_hdr.SIZE,
                        len(attrs) * ui.ib_uverbs_attr.SIZE)
    return rc, [ui.ib_uverbs_attr.unpack(raw[i:i + 16]).data for i in range(0, len(raw), 16)]


def alloc_attrs(ctx, length: int, align: int = 0, *, drop: tuple[int, ...] = (),
                page_len: int = 2, off_ptr: int | None = None,
                dm_type: int | None = None) -> list[ui.ib_uverbs_attr]:
    out = ctx.cmd_buf + OUT
    attrs = [A(c.UVERBS_ATTR_ALLOC_DM_HANDLE), A(c.UVERBS_ATTR_ALLOC_DM_LENGTH, length),
             A(c.UVERBS_ATTR_ALLOC_DM_ALIGNMENT, align, 4),
             A(MLX5_IB_ATTR_ALLOC_DM_RESP_START_OFFSET, out if off_ptr is None else off_ptr),
             A(MLX5_IB_ATTR_ALLOC_DM_RESP_PAGE_INDEX, out + 8, page_len)]
    if dm_type is not None:
        attrs.append(A(MLX5_IB_ATTR_ALLOC_DM_REQ_TYPE, dm_type, 4))
    return [a for a in attrs if a.attr_id not in drop]


def dm_alloc(ctx, length: int, align: int = 0, **kw: Any) -> tuple[int, int]:
    """DM_ALLOC; (0 or -errno, the new handle)."""
    rc, data = call(ctx, c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_ALLOC,
                    alloc_attrs(ctx, length, align, **kw))
    return rc, data[0]


def dm_out(ctx) -> tuple[int, int]:
    """The last DM_ALLOC's (start offset in its page, page index)."""
    p = ctx.proc
    return (int.from_bytes(p.load(ctx.cmd_buf + OUT, 8), "little"),
            int.from_bytes(p.load(ctx.cmd_buf + OUT + 8, 2), "little"))


def dm_free(ctx, handle: int | None) -> int:
    attrs = [] if handle is None else [A(c.UVERBS_ATTR_FREE_DM_HANDLE, handle)]
    return call(ctx, c.UVERBS_OBJECT_DM, c.UVERBS_METHOD_DM_FREE, attrs)[0]


def reg_attrs(ctx, pd: int, dm: int, offset: int, length: int, access: int, *,
              drop: tuple[int, ...] = (), lkey_ptr: int | None = None,
              access_len: int = 4) -> list:
    out = ctx.cmd_buf + OUT
    attrs = [A(c.UVERBS_ATTR_REG_DM_MR_HANDLE), A(c.UVERBS_ATTR_REG_DM_MR_OFFSET, offset),
             A(c.UVERBS_ATTR_REG_DM_MR_LENGTH, length),
             A(c.UVERBS_ATTR_REG_DM_MR_PD_HANDLE, pd, 4),
             A(c.UVERBS_ATTR_REG_DM_MR_ACCESS_FLAGS, access, access_len),
             A(c.UVERBS_ATTR_REG_DM_MR_DM_HANDLE, dm, 4),
             A(c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY, out if lkey_ptr is None else lkey_ptr, 4),
             A(c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY, out + 8, 4)]
    return [a for a in attrs if a.attr_id not in drop]


def reg(ctx, pd: int, dm: int, offset: int, length: int, access: int = ZB | LW,
        **kw: Any) -> tuple[int, int]:
    """DM_MR_REG; (0 or -errno, the MR's handle)."""
    rc, data = call(ctx, c.UVERBS_OBJECT_MR, c.UVERBS_METHOD_DM_MR_REG,
                    reg_attrs(ctx, pd, dm, offset, length, access, **kw))
    return rc, data[0]


def dereg(ctx, handle: int) -> int:
    """DEREG_MR through libibverbs' write() command."""
    mr = v.ibv_mr(ctx, None, 0, 0, handle, 0, 0, v.IBV_MR_TYPE_MR)
    return v.ibv_dereg_mr(mr)


def map_dm(ctx, page_idx: int, length: int = PS) -> int:
    """mmap of the DM's pages at libmlx5's DEVICE_MEM offset; the address or -errno."""
    pgoff = ((page_idx >> 8) << 16) | (MLX5_IB_MMAP_DEVICE_MEM << 8) | (page_idx & 0xFF)
    return ctx.proc.mmap(0, length, PROT_READ | PROT_WRITE, MAP_SHARED, ctx.cmd_fd, pgoff * PS)


@pytest.fixture
def app(m):
    """A process with mlx5_0 open and a PD: (p, ctx, pd)."""
    p = m.spawn("app")
    ctx = open_ctx(p)
    yield p, ctx, v.ibv_alloc_pd(ctx)
    if p.alive:
        p.exit(0)


# -- DM_ALLOC --------------------------------------------------------------------------------
def test_alloc_rounds_to_64_bytes_and_answers_page_and_offset(m, app):
    p, ctx, pd = app
    base = ib_dev(m).mdev.bar_addr
    start = memic_window(m.hcas[0].fw)[0]
    assert dm_alloc(ctx, 100)[0] == 0
    assert dm_out(ctx) == (0, 0)
    rc, h2 = dm_alloc(ctx, 64, 12)         # 4 KiB alignment: the next page
    assert rc == 0 and dm_out(ctx)[0] == 0
    assert {a: mm.size for a, mm in memics(m).items()} == {start: 128, start + PS: 64}
    assert bitmap(m) == {0, 1}
    dm = p.task.files.fdt[ctx.cmd_fd].private_data.idr[h2].object
    assert dm.dev_addr == base + start + PS and dm.req_length == 64


@pytest.mark.parametrize("length,align,err,msg", [
    (0, 0, errno.EINVAL, "mlx5_cmd_alloc_memic: length 0x0"),
    (MEMIC_SIZE + 1, 0, errno.ENOMEM, "no 65 free MEMIC page(s)"),
    (64, 13, errno.EINVAL, "alignment 2^13 beyond 64 << 6"),
])
def test_alloc_bad_length_or_alignment(m, app, length, align, err, msg):
    p, ctx, pd = app
    n = len(m.hcas[0].fw.cmd_log)
    assert dm_alloc(ctx, length, align)[0] == -err
    assert msg in last_error(p)
    assert memics(m) == {} and bitmap(m) == set()
    assert "ALLOC_MEMIC" not in [e[0] for e in m.hcas[0].fw.cmd_log[n:]]


def test_alloc_the_largest_alignment_and_the_whole_memic_work(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, MEMIC_SIZE, 12)
    assert rc == 0 and bitmap(m) == set(range(64))
    assert dm_alloc(ctx, 64)[0] == -errno.ENOMEM           # full
    assert dm_free(ctx, h) == 0 and memics(m) == {} and bitmap(m) == set()


@pytest.mark.parametrize("missing", [c.UVERBS_ATTR_ALLOC_DM_HANDLE, c.UVERBS_ATTR_ALLOC_DM_LENGTH,
                                     c.UVERBS_ATTR_ALLOC_DM_ALIGNMENT])
def test_alloc_without_a_mandatory_attribute_is_einval(m, app, missing):
    p, ctx, pd = app
    assert dm_alloc(ctx, 64, drop=(missing,))[0] == -errno.EINVAL
    assert f"mandatory attribute {missing:#x} missing" in last_error(p)
    assert memics(m) == {}


def test_alloc_of_a_steering_icm_type_is_eopnotsupp(m, app):
    p, ctx, pd = app
    assert dm_alloc(ctx, 64, dm_type=MLX5_IB_UAPI_DM_TYPE_STEERING_SW_ICM)[0] == -errno.EOPNOTSUPP
    assert "DM type 1" in last_error(p) and memics(m) == {}
    rc, h = dm_alloc(ctx, 64, dm_type=0)                    # MEMIC named explicitly
    assert rc == 0 and len(memics(m)) == 1


def test_alloc_on_a_device_without_memic_is_eopnotsupp():
    """No MEMIC: mlx5_ib sets no DM ops, so the core's handler refuses (and libmlx5's
    max_dm_size is 0: ibv_alloc_dm is EINVAL before any ioctl).  Upstream drops the DM
    object from such a device's uapi (UAPI_DEF_OBJ_NEEDS_FN): EPROTONOSUPPORT there."""
    m = host(Mlx5Config(caps={"devmem.memic": 0}))
    p = m.spawn("app")
    ctx = open_ctx(p)
    assert dm_alloc(ctx, 64)[0] == -errno.EOPNOTSUPP
    assert "has no device memory" in last_error(p)
    assert ctx.max_dm_size == 0
    with pytest.raises(OSError) as ei:
        v.ibv_alloc_dm(ctx, 64)
    assert ei.value.errno == errno.EINVAL
    p.exit(0)


@pytest.mark.parametrize("how,err", [("short", errno.ENOSPC), ("fault", errno.EFAULT)])
def test_alloc_output_failure_unwinds_the_memic(m, app, how, err):
    """err_copy: the mmap entry is removed, and with no mapping the MEMIC goes at once."""
    p, ctx, pd = app
    kw = dict(page_len=1) if how == "short" else dict(off_ptr=8)
    n = len(m.hcas[0].fw.cmd_log)
    assert dm_alloc(ctx, 64, **kw)[0] == -err
    assert [e[0] for e in m.hcas[0].fw.cmd_log[n:]] == ["ALLOC_MEMIC", "DEALLOC_MEMIC"]
    assert memics(m) == {} and bitmap(m) == set()
    assert dm_alloc(ctx, 64)[0] == 0 and dm_out(ctx)[1] == 0   # the page index is free again


def test_alloc_mmap_entry_failure_deallocs_the_memic(m, app, monkeypatch):
    p, ctx, pd = app

    def full(*a: Any) -> None:
        raise KernelError(errno.ENOMEM, "rdma_user_mmap_entry_insert_range: no free offset")
    monkeypatch.setattr(mlx5_dm, "rdma_user_mmap_entry_insert_range", full)
    assert dm_alloc(ctx, 64)[0] == -errno.ENOMEM
    assert memics(m) == {} and bitmap(m) == set()


def test_firmware_no_res_moves_one_page_on(m, app):
    """ALLOC_MEMIC's NO_RES is EAGAIN to mlx5_core: the driver tries the next page."""
    p, ctx, pd = app
    m.hcas[0].fw.inject(MLX5_CMD_OP_ALLOC_MEMIC, MLX5_CMD_STAT_NO_RES_ERR)
    start = memic_window(m.hcas[0].fw)[0]
    assert dm_alloc(ctx, 64)[0] == 0
    assert dm_out(ctx) == (0, 0)                 # the entry's page index, not the MEMIC page
    assert list(memics(m)) == [start + PS] and bitmap(m) == {1}


def test_firmware_bad_param_is_einval_and_frees_the_pages(m, app):
    p, ctx, pd = app
    m.hcas[0].fw.inject(MLX5_CMD_OP_ALLOC_MEMIC, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert dm_alloc(ctx, 64)[0] == -errno.EINVAL
    assert memics(m) == {} and bitmap(m) == set()


# -- DM_FREE ---------------------------------------------------------------------------------
def test_free_errors(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    assert rc == 0
    assert dm_free(ctx, 77) == -errno.ENOENT
    assert dm_free(ctx, pd.handle) == -errno.EINVAL       # a PD's handle
    assert "handle" in last_error(p)
    assert dm_free(ctx, None) == -errno.EINVAL            # no handle attribute
    assert len(memics(m)) == 1
    assert dm_free(ctx, h) == 0 and memics(m) == {}
    assert dm_free(ctx, h) == -errno.ENOENT               # twice


def test_free_while_an_mr_uses_it_is_ebusy(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 256)
    rc, mr = reg(ctx, pd.handle, h, 0, 256)
    assert rc == 0
    assert dm_free(ctx, h) == -errno.EBUSY
    assert "still in use" in last_error(p) and len(memics(m)) == 1
    assert v.ibv_dealloc_pd(pd) == errno.EBUSY            # the MR holds the PD too
    assert dereg(ctx, mr) == 0
    assert dm_free(ctx, h) == 0 and memics(m) == {}


# -- DM_MR_REG -------------------------------------------------------------------------------
def test_reg_dm_mr_makes_a_zero_based_memic_mkey(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 1000)
    start = next(iter(memics(m)))
    rc, mr = reg(ctx, pd.handle, h, 64, 936, ZB | LW | RW | RR)
    assert rc == 0
    lkey = int.from_bytes(p.load(ctx.cmd_buf + OUT, 4), "little")
    rkey = int.from_bytes(p.load(ctx.cmd_buf + OUT + 8, 4), "little")
    mk = m.hcas[0].fw.mkeys[lkey >> 8]
    mkc = mk.mkc
    assert lkey == rkey == mk.mkey
    assert (mkc["access_mode_1_0"], mkc["access_mode_4_2"]) == (1, 1)   # MEMIC (5)
    assert (mkc["start_addr"], mkc["len"]) == (start + 64, 936)
    assert (mkc["lw"], mkc["rw"], mkc["rr"], mkc["a"]) == (1, 1, 1, 0)
    # the firmware will not free a MEMIC an mkey maps
    fails(m.hcas[0], "dealloc_memic", MLX5_CMD_STAT_RES_BUSY, "memic_busy",
          memic_start_addr=start, memic_size=1024)
    assert dereg(ctx, mr) == 0 and lkey >> 8 not in m.hcas[0].fw.mkeys
    assert dm_free(ctx, h) == 0


def test_an_empty_dm_mr_at_a_dms_start_maps_that_dm_not_the_one_before(m, app):
    """Two DMs back to back in the MEMIC window: a zero-length MR at the second's first
    byte is the second's - the firmware finds the allocation its start lies in, not
    one that merely ends there - so freeing the first is not blocked by it and
    nothing outlives the two (found by peermem fuzz, seed 7002: the MR took a
    reference on the first DM's MEMIC, whose DEALLOC then failed and leaked it)."""
    p, ctx, pd = app
    _, h1 = dm_alloc(ctx, 4096)
    _, h2 = dm_alloc(ctx, 4096)
    first, second = sorted(memics(m))
    assert second == first + 4096                         # adjacent
    rc, mr = reg(ctx, pd.handle, h2, 0, 0, ZB | LW)
    assert rc == 0
    lkey = int.from_bytes(p.load(ctx.cmd_buf + OUT, 4), "little")
    fw = m.hcas[0].fw
    assert fw.mkeys[lkey >> 8].mkc["start_addr"] == second
    assert fw.memics[first].users == 0 and fw.memics[second].users == 1
    assert dm_free(ctx, h1) == 0 and first not in memics(m)     # not held by the MR
    assert dereg(ctx, mr) == 0 and dm_free(ctx, h2) == 0 and memics(m) == {}


@pytest.mark.parametrize("offset,length", [(0, 1001), (1001, 0), (8, 993), (1 << 63, 8)])
def test_reg_dm_mr_range_beyond_the_dm_is_einval(m, app, offset, length):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 1000)           # 1024 bytes allocated; the DM is 1000 long
    mkeys = set(m.hcas[0].fw.mkeys)
    assert reg(ctx, pd.handle, h, offset, length)[0] == -errno.EINVAL
    assert "beyond the DM's 0x3e8 bytes" in last_error(p)
    assert set(m.hcas[0].fw.mkeys) == mkeys
    assert reg(ctx, pd.handle, h, 8, 992)[0] == 0          # exactly to the end


@pytest.mark.parametrize("access,err,msg", [
    (LW, errno.EINVAL, "IB_ZERO_BASED is required"),
    (ZB | RW, errno.EINVAL, "remote write/atomic without local write"),
    (ZB | LW | (1 << 15), errno.EINVAL, "uverbs_get_flags32"),
    (ZB | LW | (1 << 40), errno.EINVAL, "uverbs_get_flags32"),
    # the device has ODP, so ib_check_mr_access passes it; a MEMIC MR refuses it
    (ZB | LW | IB_ACCESS_ON_DEMAND, errno.EINVAL, "mlx5_ib_reg_dm_mr: access 0x61 on MEMIC"),
    (ZB | LW | IB_ACCESS_MW_BIND, errno.EINVAL, "mlx5_ib_reg_dm_mr: access 0x31 on MEMIC"),
])
def test_reg_dm_mr_bad_access(m, app, access, err, msg):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    n = len(m.hcas[0].fw.cmd_log)
    assert reg(ctx, pd.handle, h, 0, 64, access, access_len=8)[0] == -err
    assert msg in last_error(p)
    assert "CREATE_MKEY" not in [e[0] for e in m.hcas[0].fw.cmd_log[n:]]
    assert dm_free(ctx, h) == 0                            # no usecnt left behind


def test_reg_dm_mr_bad_handles(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    assert reg(ctx, 77, h, 0, 64)[0] == -errno.ENOENT                # no such PD
    assert reg(ctx, pd.handle, 77, 0, 64)[0] == -errno.ENOENT        # no such DM
    assert reg(ctx, h, h, 0, 64)[0] == -errno.EINVAL                 # a DM as the PD
    assert reg(ctx, pd.handle, pd.handle, 0, 64)[0] == -errno.EINVAL  # a PD as the DM
    assert dm_free(ctx, h) == 0 and v.ibv_dealloc_pd(pd) == 0


@pytest.mark.parametrize("missing", [c.UVERBS_ATTR_REG_DM_MR_HANDLE, c.UVERBS_ATTR_REG_DM_MR_OFFSET,
                                     c.UVERBS_ATTR_REG_DM_MR_LENGTH,
                                     c.UVERBS_ATTR_REG_DM_MR_PD_HANDLE,
                                     c.UVERBS_ATTR_REG_DM_MR_DM_HANDLE,
                                     c.UVERBS_ATTR_REG_DM_MR_RESP_LKEY,
                                     c.UVERBS_ATTR_REG_DM_MR_RESP_RKEY])
def test_reg_dm_mr_without_a_mandatory_attribute_is_einval(m, app, missing):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    assert reg(ctx, pd.handle, h, 0, 64, drop=(missing,))[0] == -errno.EINVAL
    assert f"mandatory attribute {missing:#x} missing" in last_error(p)
    assert dm_free(ctx, h) == 0


def test_reg_dm_mr_without_access_flags_is_einval_for_want_of_zero_based(m, app):
    """The access attribute is optional (0 when absent): then IB_ZERO_BASED is missing."""
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    assert reg(ctx, pd.handle, h, 0, 64, drop=(c.UVERBS_ATTR_REG_DM_MR_ACCESS_FLAGS,))[0] \
        == -errno.EINVAL
    assert "IB_ZERO_BASED is required" in last_error(p)


def test_reg_dm_mr_create_mkey_failure_leaves_no_count(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    m.hcas[0].fw.inject(MLX5_CMD_OP_CREATE_MKEY, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert reg(ctx, pd.handle, h, 0, 64)[0] == -errno.EINVAL
    assert dm_free(ctx, h) == 0 and v.ibv_dealloc_pd(pd) == 0


def test_reg_dm_mr_output_fault_destroys_the_mr_and_its_counts(m, app):
    """The keys cannot be written back: the new MR is aborted (dereg), and neither the
    DM nor the PD stays counted."""
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    mkeys = set(m.hcas[0].fw.mkeys)
    assert reg(ctx, pd.handle, h, 0, 64, lkey_ptr=8)[0] == -errno.EFAULT
    assert set(m.hcas[0].fw.mkeys) == mkeys
    assert dm_free(ctx, h) == 0 and v.ibv_dealloc_pd(pd) == 0


# -- when the MEMIC goes back: the last mapping ---------------------------------------------
def test_free_then_munmap(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    va = map_dm(ctx, dm_out(ctx)[1])
    assert va > 0
    p.store(va, b"kept")
    assert dm_free(ctx, h) == 0
    assert len(memics(m)) == 1                      # still mapped: the MEMIC stays
    assert bytes(p.load(va, 4)) == b"kept"
    assert map_dm(ctx, 0) == -errno.EINVAL          # but no new mapping of the entry
    assert p.munmap(va, PS) == 0
    assert memics(m) == {} and bitmap(m) == set()


def test_munmap_then_free(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    va = map_dm(ctx, dm_out(ctx)[1])
    assert p.munmap(va, PS) == 0
    assert len(memics(m)) == 1                      # the DM object still holds the entry
    assert dm_free(ctx, h) == 0
    assert memics(m) == {}


def test_two_mappings_the_last_one_frees(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    idx = dm_out(ctx)[1]
    va1, va2 = map_dm(ctx, idx), map_dm(ctx, idx)
    assert va1 > 0 and va2 > 0
    p.store(va1, b"both")
    assert bytes(p.load(va2, 4)) == b"both"         # the same on-chip bytes
    assert dm_free(ctx, h) == 0
    assert p.munmap(va1, PS) == 0 and len(memics(m)) == 1
    assert p.munmap(va2, PS) == 0 and memics(m) == {}


def test_mapping_more_than_the_dm_s_pages_is_einval(m, app):
    p, ctx, pd = app
    rc, h = dm_alloc(ctx, 64)
    assert map_dm(ctx, dm_out(ctx)[1], 2 * PS) == -errno.EINVAL
    assert dm_free(ctx, h) == 0 and memics(m) == {}


def test_close_of_the_context_with_the_dm_mapped(m, app):
    """ibv_close_device with a DM still allocated and mapped (libmlx5's mapping): the
    file lives on in the VMA; the MEMIC goes when the process unmaps it or exits."""
    p, ctx, pd = app
    dm = v.ibv_alloc_dm(ctx, 100)
    v.ibv_dealloc_pd(pd)
    assert v.ibv_close_device(ctx) == 0
    assert len(memics(m)) == 1
    assert p.munmap(dm.mmap_va, dm.mmap_len) == 0
    assert memics(m) == {} and bitmap(m) == set()


def test_process_exit_with_the_dm_mapped_frees_it(m, app):
    p, ctx, pd = app
    v.ibv_alloc_dm(ctx, 100)
    v.ibv_alloc_dm(ctx, 5000)
    assert len(memics(m)) == 2
    p.exit(0)
    assert memics(m) == {} and bitmap(m) == set()


def test_dealloc_memic_failure_is_logged_and_the_leak_check_reports_it(m, app):
    p, ctx, pd = app
    dm = v.ibv_alloc_dm(ctx, 64)
    m.hcas[0].fw.inject(MLX5_CMD_OP_DEALLOC_MEMIC, MLX5_CMD_STAT_BAD_PARAM_ERR)
    assert v.ibv_free_dm(dm) == 0                  # void to the user: the free is logged
    assert any("DEALLOC_MEMIC" in line and "failed" in line for line in ib_dev(m).mdev.log)
    assert len(memics(m)) == 1
    p.exit(0)
    m.leak_check_expected = False
    with pytest.raises(LeakError, match=r"MEMIC 0x[0-9a-f]+ .*size=0x40"):
        m.check_leaks()


# -- mlx5_core's side and the firmware ------------------------------------------------------
def test_cmd_alloc_memic_errors_and_no_res(m):
    """mlx5_cmd_alloc_memic straight: a length not a multiple of 64 is EINVAL."""
    dm = ib_dev(m).dm
    with m.kernel():
        for length in (0, 100):
            with pytest.raises(KernelError) as ei:
                mlx5_cmd_alloc_memic(dm, length, 0)
            assert ei.value.errno == errno.EINVAL
        addr = mlx5_cmd_alloc_memic(dm, 64, 0)
        mlx5_cmd_dealloc_memic(dm, addr, 64)
        with pytest.raises(KernelError) as ei:            # not allocated any more
            mlx5_cmd_dealloc_memic(dm, addr, 64)
        assert ei.value.errno == errno.EINVAL
    assert memics(m) == {}


def _alloc(hca, **kw: int) -> dict[str, int]:
    start = memic_window(hca.fw)[0]
    fields = dict(range_start_addr=start, range_size=PS, memic_size=64,
                  log_memic_addr_alignment=0)
    fields.update(kw)
    return fields


@pytest.mark.parametrize("kw,check", [
    (dict(memic_size=0), "alloc_memic_size"),
    (dict(memic_size=100), "alloc_memic_size"),
    (dict(log_memic_addr_alignment=7), "alloc_memic_alignment"),
    (dict(range_size=32), "alloc_memic_range"),
    (dict(range_start_addr=0), "alloc_memic_range"),
    (dict(range_size=MEMIC_SIZE + PS), "alloc_memic_range"),
])
def test_firmware_alloc_memic_bad_param(m, kw, check):
    hca = m.hcas[0]
    fails(hca, "alloc_memic", MLX5_CMD_STAT_BAD_PARAM_ERR, check, **_alloc(hca, **kw))
    assert memics(m) == {}


def test_firmware_alloc_memic_lowest_aligned_place_then_full(m):
    hca = m.hcas[0]
    start = memic_window(hca.fw)[0]

    def at(size: int, log_align: int = 0) -> int:
        out = ok(hca, "alloc_memic", **_alloc(hca, memic_size=size,
                                              log_memic_addr_alignment=log_align))
        return MLX5_GET("alloc_memic_out", out, "memic_start_addr") - start

    assert at(64) == 0
    assert at(64, 2) == 256                 # aligned to 64 << 2
    assert at(128) == 64                    # the hole below it
    assert at(64) == 192
    assert at(PS - 320) == 320              # the rest of the window
    fails(hca, "alloc_memic", MLX5_CMD_STAT_NO_RES_ERR, "alloc_memic_range_full",
          **_alloc(hca, memic_size=64))
    for addr, mm in list(memics(m).items()):
        ok(hca, "dealloc_memic", memic_start_addr=addr, memic_size=mm.size)
    assert memics(m) == {}


def test_firmware_dealloc_memic_of_something_never_allocated(m):
    hca = m.hcas[0]
    start = memic_window(hca.fw)[0]
    fails(hca, "dealloc_memic", MLX5_CMD_STAT_BAD_PARAM_ERR, "dealloc_memic_not_allocated",
          memic_start_addr=start, memic_size=64)
    ok(hca, "alloc_memic", **_alloc(hca, memic_size=128))
    fails(hca, "dealloc_memic", MLX5_CMD_STAT_BAD_PARAM_ERR, "dealloc_memic_not_allocated",
          memic_start_addr=start, memic_size=64)        # another size
    fails(hca, "dealloc_memic", MLX5_CMD_STAT_BAD_PARAM_ERR, "dealloc_memic_not_allocated",
          memic_start_addr=start + 64, memic_size=64)   # inside it, not its start
    ok(hca, "dealloc_memic", memic_start_addr=start, memic_size=128)


def test_firmware_alloc_memic_without_memic(m):
    m2 = host(Mlx5Config(caps={"devmem.memic": 0}))
    hca = m2.hcas[0]
    fails(hca, "alloc_memic", MLX5_CMD_STAT_BAD_PARAM_ERR, "alloc_memic_no_memic",
          range_start_addr=0, range_size=PS, memic_size=64)


def test_leak_check_reports_a_memic_left_allocated(m):
    hca = m.hcas[0]
    start = memic_window(hca.fw)[0]
    ok(hca, "alloc_memic", **_alloc(hca, memic_size=192))
    m.leak_check_expected = False
    with pytest.raises(LeakError, match=rf"MEMIC {start:#x} uid=0 size=0xc0"):
        m.check_leaks()
