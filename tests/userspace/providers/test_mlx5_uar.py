"""Tests for userspace/providers/mlx5/uar.py: mmap offsets, legacy bfs[], dynamic UARs."""

from __future__ import annotations

import errno
from collections.abc import Callable

import attrs
import pytest

from kernel_model.uapi.mlx5_abi import mlx5_ib_alloc_ucontext_resp
from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import MLX5_CTX_FLAGS_NO_KERN_DYN_UAR
from userspace.providers.mlx5.uar import (
    MLX5_IB_MMAP_ALLOC_WC,
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF,
    MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC,
    MLX5_MMAP_GET_NC_PAGES_CMD,
    MLX5_MMAP_GET_REGULAR_PAGES_CMD,
    MLX5_UAR_TYPE_NC,
    MLX5_UAR_TYPE_REGULAR,
    MLX5_UAR_TYPE_REGULAR_DYN,
    adjust_uar_info,
    bf_for_bfreg_index,
    build_legacy_bfs,
    clean_dyn_uars,
    get_uar_mmap_offset,
    legacy_num_sys_pages,
    mlx5_bf,
    mlx5_get_qp_uar,
    mlx5_map_legacy_uars,
    mlx5_mmap,
    mlx5_put_qp_uar,
    mlx5_set_singleton_nc_uar,
    mlx5_uar_info,
    set_command,
    set_extended_index,
    set_index,
)

P4K, P64K = 4096, 65536
UAR_BASE = 0x7F00_0000_0000


def decode_pgoff(pgoff: int) -> tuple[int, int]:
    """The kernel's view of vm_pgoff (mlx5_ib_mmap): (command, extended index)."""
    return (pgoff >> 8) & 0xFF, (pgoff & 0xFF) | (((pgoff >> 16) & 0xFF) << 8)


# -- mmap offsets (kernel_facts §13 "mmap offsets") ----------------------------------

def test_regular_page_3_is_byte_0x3000() -> None:
    assert get_uar_mmap_offset(3, P4K, MLX5_MMAP_GET_REGULAR_PAGES_CMD) == 0x3000


def test_nc_page_3_is_0x303_pages() -> None:
    assert get_uar_mmap_offset(3, P4K, MLX5_MMAP_GET_NC_PAGES_CMD) == 0x303 * P4K


def test_alloc_wc_300_uses_the_extended_index() -> None:
    off = get_uar_mmap_offset(300, P4K, MLX5_IB_MMAP_ALLOC_WC)
    assert off == 0x1062C * P4K
    assert decode_pgoff(off // P4K) == (MLX5_IB_MMAP_ALLOC_WC, 300)


def test_alloc_wc_page_0_is_pgoff_0x600() -> None:
    # the kernel maps it to system page 8 of a 16/4 context (uar_mmap)
    assert get_uar_mmap_offset(0, P4K, MLX5_IB_MMAP_ALLOC_WC) == 0x600 * P4K


def test_extended_form_starts_at_256() -> None:
    assert get_uar_mmap_offset(255, P4K, MLX5_IB_MMAP_ALLOC_WC) == 0x6FF * P4K
    assert get_uar_mmap_offset(256, P4K, MLX5_IB_MMAP_ALLOC_WC) == 0x10600 * P4K


def test_only_alloc_wc_is_extended() -> None:
    # set_index ORs the index in unmasked, so 300 spills into the command byte
    assert get_uar_mmap_offset(300, P4K, MLX5_MMAP_GET_REGULAR_PAGES_CMD) == 300 * P4K


def test_page_size_scales_the_offset() -> None:
    assert get_uar_mmap_offset(3, P64K, MLX5_MMAP_GET_NC_PAGES_CMD) == 0x303 * P64K


def test_uar_object_offsets_round_trip() -> None:
    # mlx5_entry_to_mmap_offset: start_pgoff = cmd << 16 | index
    def entry_offset(start_pgoff: int) -> int:
        return set_extended_index(start_pgoff & 0xFFFF, set_command(start_pgoff >> 16))

    assert entry_offset(0x90000) == 0x900
    assert entry_offset(0x90123) == 0x10923
    cmd, idx = decode_pgoff(0x10923)
    assert cmd << 16 | idx == 0x90123


def test_set_helpers_or_into_an_offset() -> None:
    assert set_index(5, set_command(3)) == 0x305
    assert set_command(6, 0x10000) == 0x10600


# -- mlx5_mmap -----------------------------------------------------------------------

class FakeMmap:
    """mmap_page/munmap_page: hands out addresses, fails the offsets it is told to."""

    def __init__(self, fail: Callable[[int], bool] = lambda off: False):
        self.fail, self.calls, self.live = fail, [], set()
        self.next = UAR_BASE

    def mmap(self, offset: int) -> int:
        self.calls.append(offset)
        if self.fail(offset):
            raise ProviderError(errno.EINVAL, "mmap: refused")
        addr, self.next = self.next, self.next + P4K
        self.live.add(addr)
        return addr

    def munmap(self, addr: int) -> None:
        self.live.remove(addr)


def test_nc_mapping_when_the_kernel_knows_nc() -> None:
    mm = FakeMmap()
    info = mlx5_mmap(mm.mmap, 2, P4K, MLX5_UAR_TYPE_NC)
    assert info == mlx5_uar_info(UAR_BASE, MLX5_UAR_TYPE_NC)
    assert mm.calls == [0x302 * P4K]


def test_nc_falls_back_to_regular_on_an_old_kernel() -> None:
    mm = FakeMmap(fail=lambda off: off == 0x302 * P4K)
    info = mlx5_mmap(mm.mmap, 2, P4K, MLX5_UAR_TYPE_NC)
    assert info.type == MLX5_UAR_TYPE_REGULAR
    assert mm.calls == [0x302 * P4K, 0x2 * P4K]


def test_legacy_dynamic_type_maps_with_alloc_wc() -> None:
    mm = FakeMmap()
    info = mlx5_mmap(mm.mmap, 1, P4K, MLX5_UAR_TYPE_REGULAR_DYN)
    assert mm.calls == [0x601 * P4K] and info.type == MLX5_UAR_TYPE_REGULAR


def test_failed_mapping_propagates() -> None:
    mm = FakeMmap(fail=lambda off: True)
    with pytest.raises(ProviderError) as e:
        mlx5_mmap(mm.mmap, 0, P4K, MLX5_UAR_TYPE_NC)
    assert e.value.errno == errno.EINVAL and len(mm.calls) == 2


# -- legacy bfs[] -----------------------------------------------------------------------

@attrs.define
class Resp:
    tot_bfregs: int = 16
    bf_reg_size: int = 512
    log_uar_size: int = 12
    num_uars_per_page: int = 1


def legacy_bfs(resp: Resp | None = None, page_size: int = P4K, **kw) -> list[mlx5_bf]:
    resp = resp or Resp()
    pages = [UAR_BASE + i * page_size for i in range(legacy_num_sys_pages(resp, page_size))]
    return build_legacy_bfs(resp, pages, low_lat_uuars=kw.pop("low", 4),
                            page_size=page_size, **kw)


def test_legacy_16_uuars_give_32_entries_over_8_pages() -> None:
    bfs = legacy_bfs()
    assert len(bfs) == 32
    assert legacy_num_sys_pages(Resp(), P4K) == 8


def test_legacy_entry_24_is_page_6_offset_0x800() -> None:
    bfs = legacy_bfs()
    page6 = UAR_BASE + 6 * P4K
    assert bfs[24].reg == page6 + 0x800 and bfs[24].buf_size == 256
    assert bfs[25].reg == page6 + 0xA00 and bfs[25].buf_size == 256
    assert bfs[24].offset == 0 and bfs[24].uuarn == 24
    assert bfs[24].uar_mmap_offset == 6 * P4K


def test_legacy_bfs_from_the_uapi_response() -> None:
    raw = mlx5_ib_alloc_ucontext_resp(tot_bfregs=16, bf_reg_size=512, log_uar_size=12,
                                      num_uars_per_page=1).pack()
    resp = mlx5_ib_alloc_ucontext_resp.unpack(raw)
    bfs = build_legacy_bfs(resp, [UAR_BASE + i * P4K for i in range(8)],
                           low_lat_uuars=4, page_size=P4K)
    assert [bf.uuarn for bf in bfs] == list(range(32))


def test_legacy_entry_0_never_does_blueflame() -> None:
    bfs = legacy_bfs()
    assert bfs[0].buf_size == 0 and not bfs[0].need_lock
    assert all(bf.buf_size == 256 for bf in bfs[1:])


def test_legacy_end_to_end_16_4() -> None:
    """kernel_facts §13: QP1-4 bfreg 12-15 lock-free, QP5-15 bfreg 1-11 locked, QP16 bfreg 1."""
    bfs = legacy_bfs()
    kernel_bfregs = [12, 13, 14, 15, *range(1, 12), 1]          # alloc_bfreg's order
    resp_index = [n // 2 * 4 + n % 2 for n in kernel_bfregs]    # adjust_bfregn
    assert resp_index[:4] == [24, 25, 28, 29]
    got = [bf_for_bfreg_index(bfs, i) for i in resp_index]
    assert [bf.uuarn for bf in got[:4]] == [24, 25, 28, 29]
    assert not any(bf.need_lock for bf in got[:4])
    assert all(bf.need_lock for bf in got[4:])
    assert got[15] is got[4]                                    # QP16 shares bfreg 1


def test_legacy_single_threaded_has_no_locks() -> None:
    assert not any(bf.need_lock for bf in legacy_bfs(single_threaded=True))


def test_legacy_64k_page_with_16_uars() -> None:
    resp = Resp(tot_bfregs=32, log_uar_size=16, num_uars_per_page=16)
    bfs = legacy_bfs(resp, P64K, low=20)
    assert legacy_num_sys_pages(resp, P64K) == 1 and len(bfs) == 64
    assert bfs[5 * 4 + 1].reg == UAR_BASE + 5 * 4096 + 0x800 + 512
    assert bfs[63].reg == UAR_BASE + 15 * 4096 + 0x800 + 3 * 512


def test_old_kernel_means_one_uar_per_page() -> None:
    old = Resp(log_uar_size=0, num_uars_per_page=0)
    assert adjust_uar_info(P64K, old) == (P64K, 1)
    assert adjust_uar_info(P4K, Resp()) == (P4K, 1)
    assert legacy_num_sys_pages(Resp(tot_bfregs=32, log_uar_size=0, num_uars_per_page=0),
                                P64K) == 16


def test_nc_pages_record_their_mmap_command() -> None:
    resp = Resp()
    pages = [mlx5_uar_info(UAR_BASE + i * P4K, MLX5_UAR_TYPE_NC) for i in range(8)]
    bfs = build_legacy_bfs(resp, pages, low_lat_uuars=4, page_size=P4K)
    assert bfs[24].uar_mmap_offset == 0x306 * P4K


def test_wrong_number_of_pages_is_a_caller_bug() -> None:
    with pytest.raises(ValueError):
        build_legacy_bfs(Resp(), [UAR_BASE], low_lat_uuars=4, page_size=P4K)


def test_bad_bfreg_index_is_einval() -> None:
    with pytest.raises(ProviderError) as e:
        bf_for_bfreg_index(legacy_bfs(), 32)
    assert e.value.errno == errno.EINVAL and e.value.function == "map_uuar"


def test_map_legacy_uars_maps_every_static_page() -> None:
    mm = FakeMmap()
    uars = mlx5_map_legacy_uars(Resp(), P4K, False, mm.mmap, mm.munmap)
    assert [u.reg for u in uars] == [UAR_BASE + i * P4K for i in range(8)]
    assert mm.calls == [i * P4K for i in range(8)]


def test_map_legacy_uars_shut_up_bf_asks_for_nc() -> None:
    mm = FakeMmap()
    uars = mlx5_map_legacy_uars(Resp(tot_bfregs=4), P4K, True, mm.mmap, mm.munmap)
    assert [u.type for u in uars] == [MLX5_UAR_TYPE_NC] * 2
    assert mm.calls == [0x300 * P4K, 0x301 * P4K]


def test_map_legacy_uars_unmaps_on_failure() -> None:
    mm = FakeMmap(fail=lambda off: off == 3 * P4K)
    with pytest.raises(ProviderError):
        mlx5_map_legacy_uars(Resp(), P4K, False, mm.mmap, mm.munmap)
    assert len(mm.calls) == 4 and mm.live == set()


# -- dynamic UARs ---------------------------------------------------------------------

@attrs.define
class DynCtx:
    """The dynamic-UAR fields of an mlx5_context, with a fake UAR object allocator."""

    tot_uuars: int = 16
    low_lat_uuars: int = 4
    page_size: int = P4K
    num_uars_per_page: int = 1
    bf_reg_size: int = 512
    shut_up_bf: bool = False
    single_threaded: bool = False
    flags: int = 0
    nc_uar: mlx5_bf | None = None
    dyn_uar_bf_list: list = attrs.Factory(list)
    dyn_uar_qp_shared_list: list = attrs.Factory(list)
    dyn_uar_qp_dedicated_list: list = attrs.Factory(list)
    qp_max_dedicated_uuars: int = 0
    qp_alloc_dedicated_uuars: int = 0
    qp_max_shared_uuars: int = 0
    qp_alloc_shared_uuars: int = 0
    allocated: list = attrs.Factory(list)       # (kind, addr, page_id) per UAR object
    freed: list = attrs.Factory(list)
    fail_next: int = 0                          # errno for the next allocation

    def __attrs_post_init__(self) -> None:
        # mlx5_set_context, modern kernel branch
        self.qp_max_dedicated_uuars = self.low_lat_uuars
        self.qp_max_shared_uuars = self.tot_uuars - self.low_lat_uuars

    def alloc_uar_obj(self, kind: int) -> tuple[int, int, int]:
        if self.fail_next:
            err, self.fail_next = self.fail_next, 0
            raise ProviderError(err, "mlx5_alloc_dyn_uar: UAR_OBJ_ALLOC failed")
        n = len(self.allocated)
        addr = UAR_BASE + n * self.page_size
        page_id = 100 + n * self.num_uars_per_page
        pgoff = set_extended_index(n, set_command(9))     # the kernel's entry offsets
        self.allocated.append((kind, addr, page_id))
        return addr, page_id, pgoff * self.page_size

    def free_uar_obj(self, bf: mlx5_bf) -> None:
        self.freed.append(bf.uar)


def uar_no(ctx: DynCtx, bf: mlx5_bf) -> int:
    """Which allocated UAR object a register lives on."""
    return next(i for i, (_, addr, _) in enumerate(ctx.allocated)
                if addr <= bf.reg < addr + ctx.page_size)


def test_dynamic_end_to_end_16_4() -> None:
    """kernel_facts §13: QP1-4 dedicated on UARs 0,1; QP5-16 shared on UARs 2-7;
    QP17 -> UAR 2 register 0 (count 2); 8 UARs total."""
    ctx = DynCtx()
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(17)]
    assert len(ctx.allocated) == 8
    assert all(kind == MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF for kind, _, _ in ctx.allocated)
    assert [uar_no(ctx, bf) for bf in bfs[:4]] == [0, 0, 1, 1]
    assert all(bf.qp_dedicated and not bf.need_lock for bf in bfs[:4])
    assert sorted({uar_no(ctx, bf) for bf in bfs[4:16]}) == [2, 3, 4, 5, 6, 7]
    assert all(bf.qp_shared and bf.need_lock for bf in bfs[4:16])
    assert len({id(bf) for bf in bfs[:16]}) == 16                 # 16 distinct registers
    assert bfs[16] is bfs[4]
    assert uar_no(ctx, bfs[16]) == 2 and bfs[16].reg == ctx.allocated[2][1] + 0x800
    assert bfs[16].count == 2
    assert (ctx.qp_alloc_dedicated_uuars, ctx.qp_alloc_shared_uuars) == (4, 12)


def test_dynamic_uars_are_allocated_as_the_code_walks() -> None:
    # a dedicated UAR on QPs 1 and 3; then every shared QP allocates one more
    # UAR until 12 shared registers exist (QPs 5-10), and picks the least used
    ctx = DynCtx()
    after = []
    for _ in range(12):
        mlx5_get_qp_uar(ctx)
        after.append(len(ctx.allocated))
    assert after == [1, 1, 2, 2, 3, 4, 5, 6, 7, 8, 8, 8]


def test_dynamic_register_geometry() -> None:
    ctx = DynCtx()
    a, b = mlx5_get_qp_uar(ctx), mlx5_get_qp_uar(ctx)
    _, addr, page_id = ctx.allocated[0]
    assert (a.reg, b.reg) == (addr + 0x800, addr + 0x800 + 512)
    assert a.buf_size == b.buf_size == 256 and a.uuarn == b.uuarn == 1
    assert a.page_id == b.page_id == page_id
    assert a.uar_mmap_offset == b.uar_mmap_offset == 0x900 * P4K
    assert a.length == P4K and b.length == 0                      # a owns the page


def test_dynamic_64k_page_splits_into_32_registers() -> None:
    ctx = DynCtx(tot_uuars=32, low_lat_uuars=20, page_size=P64K, num_uars_per_page=16)
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(3)]
    assert len(ctx.allocated) == 1 and ctx.qp_alloc_dedicated_uuars == 32
    assert len(ctx.dyn_uar_qp_dedicated_list) == 29
    assert bfs[2].reg == UAR_BASE + 4096 + 0x800 and bfs[2].page_id == 101


def test_put_dedicated_returns_to_the_tail() -> None:
    ctx = DynCtx()
    qp1, qp2 = mlx5_get_qp_uar(ctx), mlx5_get_qp_uar(ctx)
    mlx5_put_qp_uar(ctx, qp1)
    assert ctx.dyn_uar_qp_dedicated_list == [qp1]
    assert mlx5_get_qp_uar(ctx) is qp1              # freeing then allocating returns it
    qp3 = mlx5_get_qp_uar(ctx)                      # UAR 1, whose 2nd register waits
    assert uar_no(ctx, qp3) == 1 and len(ctx.dyn_uar_qp_dedicated_list) == 1
    mlx5_put_qp_uar(ctx, qp2)
    mlx5_put_qp_uar(ctx, qp3)
    assert [uar_no(ctx, bf) for bf in ctx.dyn_uar_qp_dedicated_list] == [1, 0, 1]
    assert ctx.dyn_uar_qp_dedicated_list[1:] == [qp2, qp3]
    assert mlx5_get_qp_uar(ctx) is not qp2          # the head goes first


def test_put_shared_drops_the_count() -> None:
    ctx = DynCtx(tot_uuars=6, low_lat_uuars=4)      # 2 shared registers, one UAR
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(8)]
    shared = ctx.dyn_uar_qp_shared_list
    assert [bf.count for bf in shared] == [2, 2]
    mlx5_put_qp_uar(ctx, bfs[5])                    # the second shared register
    assert [bf.count for bf in shared] == [2, 1]
    assert mlx5_get_qp_uar(ctx) is shared[1]        # the least used one


def test_put_of_static_nc_or_none_is_a_no_op() -> None:
    ctx = DynCtx()
    mlx5_put_qp_uar(ctx, None)
    mlx5_put_qp_uar(ctx, mlx5_bf(reg=1))
    assert ctx.dyn_uar_qp_dedicated_list == []


def test_single_threaded_shared_registers_are_lock_free() -> None:
    ctx = DynCtx(single_threaded=True)
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(6)]
    assert bfs[5].qp_shared and not bfs[5].need_lock


def test_failed_allocation_propagates_and_changes_nothing() -> None:
    ctx = DynCtx(fail_next=errno.ENOMEM)
    with pytest.raises(ProviderError) as e:
        mlx5_get_qp_uar(ctx)
    assert e.value.errno == errno.ENOMEM
    assert ctx.qp_alloc_dedicated_uuars == 0 and ctx.dyn_uar_qp_dedicated_list == []
    assert mlx5_get_qp_uar(ctx).qp_dedicated                      # the next try works


def test_failed_shared_allocation_fails_the_qp() -> None:
    ctx = DynCtx()
    for _ in range(5):
        mlx5_get_qp_uar(ctx)
    ctx.fail_next = errno.ENOSPC
    with pytest.raises(ProviderError):
        mlx5_get_qp_uar(ctx)
    assert ctx.qp_alloc_shared_uuars == 2 and [b.count for b in ctx.dyn_uar_qp_shared_list] \
        == [1, 0]


def test_singleton_nc_uar() -> None:
    ctx = DynCtx()
    mlx5_set_singleton_nc_uar(ctx)
    nc = ctx.nc_uar
    assert ctx.allocated[0][0] == MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC
    assert nc.reg == UAR_BASE + 0x800 and nc.nc_mode
    assert nc.buf_size == 0 and nc.uuarn == 0 and not nc.need_lock


def test_singleton_nc_uar_failure_is_harmless() -> None:
    ctx = DynCtx(fail_next=errno.EOPNOTSUPP)
    mlx5_set_singleton_nc_uar(ctx)
    assert ctx.nc_uar is None


def test_legacy_kernel_has_no_nc_uar_object() -> None:
    ctx = DynCtx(flags=MLX5_CTX_FLAGS_NO_KERN_DYN_UAR)
    mlx5_set_singleton_nc_uar(ctx)
    assert ctx.nc_uar is None and ctx.allocated == []


@pytest.mark.parametrize("kw", [{"shut_up_bf": True}, {"bf_reg_size": 0}])
def test_without_blueflame_every_qp_shares_the_nc_uar(kw: dict) -> None:
    ctx = DynCtx(**kw)
    mlx5_set_singleton_nc_uar(ctx)
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(20)]
    assert all(bf is ctx.nc_uar for bf in bfs) and len(ctx.allocated) == 1
    mlx5_put_qp_uar(ctx, bfs[0])                    # not tracked
    assert ctx.nc_uar.count == 0


def test_without_blueflame_and_nc_uar_there_is_no_register() -> None:
    assert mlx5_get_qp_uar(DynCtx(shut_up_bf=True)) is None


def test_clean_dyn_uars_frees_each_page_once() -> None:
    ctx = DynCtx()
    mlx5_set_singleton_nc_uar(ctx)
    bfs = [mlx5_get_qp_uar(ctx) for _ in range(17)]
    for bf in bfs:
        mlx5_put_qp_uar(ctx, bf)
    clean_dyn_uars(ctx)
    assert sorted(ctx.freed) == sorted(addr for _, addr, _ in ctx.allocated)
    assert ctx.nc_uar is None and ctx.dyn_uar_qp_shared_list == []


def test_clean_dyn_uars_skips_a_page_a_live_qp_holds() -> None:
    ctx = DynCtx()
    held = mlx5_get_qp_uar(ctx)                     # owns UAR 0's mapping
    clean_dyn_uars(ctx)
    assert ctx.freed == [] and held.length == P4K
