"""Mirrors the UAR / bfreg parts of rdma-core providers/mlx5/mlx5.c and verbs.c.

A UAR is a 4 KiB page of the HCA's BAR that a process maps to ring
doorbells; at offset 0x800 it holds BlueFlame registers ("bfregs", "uuars")
of bf_reg_size bytes each, every one split into two halves that post_send
writes alternately.  libmlx5 describes each register by a `struct mlx5_bf`.
Two ways of getting them, chosen by the kernel's alloc_ucontext response:

* **legacy** (resp.tot_bfregs != 0, a kernel without dynamic UARs): the
  kernel allocated static UARs; mlx5_set_context maps all of them
  (mlx5_map_legacy_uars) and builds bfs[] with 4 entries per UAR
  (build_legacy_bfs).  create_qp lets the kernel choose a bfreg and picks
  bfs[resp.bfreg_index] (bf_for_bfreg_index, rdma-core's map_uuar).
* **dynamic** (tot_bfregs == 0): nothing is mapped at open; create_qp calls
  mlx5_get_qp_uar, which allocates UAR objects lazily - first low_lat_uuars
  dedicated registers (one QP each, no lock), then tot - low shared ones (a
  lock each), then reuses the shared register with the fewest QPs.
  mlx5_put_qp_uar gives a register back; UARs are freed only by
  clean_dyn_uars at context close.  With MLX5_SHUT_UP_BF or no
  write-combining (bf_reg_size 0) every QP uses the one non-cached UAR.

The mmap offset helpers encode vm_pgoff as the kernel's mlx5_ib_mmap decodes
it: bits 0-7 index, 8-15 command, 16-23 the high byte of an extended index.

I/O is injected: mmap_page(offset) -> user address and munmap_page(addr) for
the legacy pages; ctx.alloc_uar_obj(kind) -> (user address of the mapped page,
page_id, mmap_offset) and ctx.free_uar_obj(bf) for the UAR objects (the
MLX5_IB_METHOD_UAR_OBJ_ALLOC/DESTROY ioctls plus the mmap/munmap).  The
injected callables raise ProviderError (or OSError) on failure, after undoing
their own partial work (alloc_uar_obj destroys the object if the mmap fails,
as mlx5_alloc_dyn_uar does).

Lock: rdma-core holds ctx->dyn_bfregs_mutex around the dynamic lists and
counters; the provider runs in one emulated thread per context, so there is
no lock here.  Each shared register's spinlock is represented by need_lock.
"""

from __future__ import annotations

import errno
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from kernel_model.trace import traced

# kernel-headers/rdma/mlx5-abi.h (enum mlx5_ib_mmap_cmd), shared with the kernel side
from kernel_model.uapi.mlx5_abi import (  # noqa: F401 - re-exported for the provider
    MLX5_IB_MMAP_ALLOC_WC,
    MLX5_IB_MMAP_CLOCK_INFO,
    MLX5_IB_MMAP_CORE_CLOCK,
    MLX5_IB_MMAP_DEVICE_MEM,
    MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES,
    MLX5_IB_MMAP_NC_PAGE,
    MLX5_IB_MMAP_REGULAR_PAGE,
    MLX5_IB_MMAP_WC_PAGE,
)
from userspace.providers.mlx5.env import need_uuar_lock
from userspace.providers.mlx5.errors import ProviderError
from userspace.providers.mlx5.mlx5dv import (
    MLX5_ADAPTER_PAGE_SIZE,
    MLX5_BF_OFFSET,
    MLX5_CTX_FLAGS_NO_KERN_DYN_UAR,
    MLX5_NUM_NON_FP_BFREGS_PER_UAR,
    NUM_BFREGS_PER_UAR,
)

# mlx5.h
MLX5_IB_MMAP_CMD_SHIFT = 8
MLX5_IB_MMAP_CMD_MASK = 0xFF
# mlx5-abi.h: the commands libmlx5 names itself
MLX5_MMAP_GET_REGULAR_PAGES_CMD = 0
MLX5_MMAP_GET_NC_PAGES_CMD = 3
# kernel-headers/rdma/mlx5_user_ioctl_verbs.h: UAR object types
MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF = 0
MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC = 1
# mlx5.h: enum mlx5_uar_type
MLX5_UAR_TYPE_REGULAR = 0
MLX5_UAR_TYPE_NC = 1
MLX5_UAR_TYPE_REGULAR_DYN = 2


# -- mmap offsets --------------------------------------------------------------------

def set_command(command: int, offset: int = 0) -> int:
    """Mirrors set_command(): the command goes to bits 8-15 of the page offset."""
    return offset | (command << MLX5_IB_MMAP_CMD_SHIFT)


def set_index(index: int, offset: int = 0) -> int:
    """Mirrors set_index() (set_arg): OR-ed in unmasked, as rdma-core does."""
    return offset | index


def set_extended_index(index: int, offset: int = 0) -> int:
    """Mirrors set_extended_index(): low byte to bits 0-7, the rest from bit 16."""
    return offset | (index & 0xFF) | ((index >> 8) << 16)


def get_uar_mmap_offset(idx: int, page_size: int, cmd: int) -> int:
    """Mirrors get_uar_mmap_offset(): the byte offset to mmap UAR page `idx` with.

    Only ALLOC_WC indexes can pass 255, so only they use the extended form.
    """
    offset = set_command(cmd)
    if cmd == MLX5_IB_MMAP_ALLOC_WC and idx >= (1 << MLX5_IB_MMAP_CMD_SHIFT):
        offset = set_extended_index(idx, offset)
    else:
        offset = set_index(idx, offset)
    return offset * page_size


def uar_type_to_cmd(uar_type: int) -> int:
    """Mirrors uar_type_to_cmd(): the command a mapped page's type was mapped with."""
    if uar_type == MLX5_UAR_TYPE_NC:
        return MLX5_MMAP_GET_NC_PAGES_CMD
    return MLX5_MMAP_GET_REGULAR_PAGES_CMD


@attrs.define
class mlx5_uar_info:
    """Mirrors struct mlx5_uar_info: one mapped static UAR page."""

    reg: int                    # user address of the page
    type: int = MLX5_UAR_TYPE_REGULAR

    def __repr__(self) -> str:
        kind = {MLX5_UAR_TYPE_NC: "NC", MLX5_UAR_TYPE_REGULAR_DYN: "REGULAR_DYN"}
        return f"uar {self.reg:#x} {kind.get(self.type, 'REGULAR')}"


MmapPage = Callable[[int], int]


@traced
def mlx5_mmap(mmap_page: MmapPage, index: int, page_size: int,
              uar_type: int) -> mlx5_uar_info:
    """Mirrors mlx5_mmap(): map one UAR page, NC first if asked for.

    A kernel that does not know MLX5_MMAP_GET_NC_PAGES_CMD fails the first
    try; the page is then mapped with REGULAR (ALLOC_WC for the legacy
    dynamic type) and its type records what was really mapped.
    """
    if uar_type == MLX5_UAR_TYPE_NC:
        try:
            return mlx5_uar_info(mmap_page(get_uar_mmap_offset(
                index, page_size, MLX5_MMAP_GET_NC_PAGES_CMD)), MLX5_UAR_TYPE_NC)
        except OSError:
            pass                # legacy kernels: fall back to a regular page
    cmd = (MLX5_IB_MMAP_ALLOC_WC if uar_type == MLX5_UAR_TYPE_REGULAR_DYN
           else MLX5_MMAP_GET_REGULAR_PAGES_CMD)
    return mlx5_uar_info(mmap_page(get_uar_mmap_offset(index, page_size, cmd)),
                         MLX5_UAR_TYPE_REGULAR)


# -- the legacy bfs[] table -----------------------------------------------------------

class UcontextResp(Protocol):
    """The mlx5_ib_alloc_ucontext_resp fields the UAR code reads."""

    tot_bfregs: int
    bf_reg_size: int
    log_uar_size: int
    num_uars_per_page: int


@attrs.define(eq=False)
class mlx5_bf:
    """Mirrors struct mlx5_bf: one BlueFlame register as libmlx5 sees it.

    reg is the user address post_send writes to (plus offset, which
    alternates between the two halves of buf_size bytes); uuarn 0 means "never
    BlueFlame" (bfreg 0, or a non-cached UAR).  The rest describes a
    dynamically allocated register: the page it lives on, which list it
    belongs to and, for a shared one, how many QPs use it.
    """

    reg: int
    offset: int = 0
    buf_size: int = 0
    uuarn: int = 0
    need_lock: bool = False
    uar_mmap_offset: int = 0
    # dynamic UARs
    uar: int = 0                # user address of the whole UAR page
    bfreg_dyn_index: int = 0
    dyn_alloc_uar: bool = False
    mmaped_entry: bool = False
    nc_mode: bool = False
    qp_dedicated: bool = False
    qp_shared: bool = False
    count: int = 0              # QPs on a shared register
    length: int = 0             # mapping length; non-zero only on the page's owner
    page_id: int = 0            # the firmware UAR index

    def __repr__(self) -> str:
        kind = ("dedicated" if self.qp_dedicated else f"shared count={self.count}"
                if self.qp_shared else "static")
        return (f"bf uuarn={self.uuarn} reg={self.reg:#x} buf_size={self.buf_size} "
                f"lock={'yes' if self.need_lock else 'no'} {kind}")


def adjust_uar_info(page_size: int, resp: UcontextResp) -> tuple[int, int]:
    """Mirrors adjust_uar_info(): (uar_size, num_uars_per_page) from the response.

    A kernel that fills in neither field is an old one: one UAR per system page.
    """
    if not resp.log_uar_size and not resp.num_uars_per_page:
        return page_size, 1
    return 1 << resp.log_uar_size, resp.num_uars_per_page


def legacy_num_sys_pages(resp: UcontextResp, page_size: int) -> int:
    """The num_sys_page_map of mlx5_set_context: static system pages to map."""
    _, per_page = adjust_uar_info(page_size, resp)
    return resp.tot_bfregs // (per_page * MLX5_NUM_NON_FP_BFREGS_PER_UAR)


def mlx5_map_legacy_uars(resp: UcontextResp, page_size: int, shut_up_bf: bool,
                         mmap_page: MmapPage,
                         munmap_page: Callable[[int], None]) -> list[mlx5_uar_info]:
    """Mirrors the mmap loop of mlx5_set_context for a legacy kernel.

    Maps static page i with command REGULAR (NC under MLX5_SHUT_UP_BF, falling
    back to REGULAR); if one fails, the pages already mapped are unmapped
    (err_free) and the error propagates.
    """
    uars: list[mlx5_uar_info] = []
    uar_type = MLX5_UAR_TYPE_NC if shut_up_bf else MLX5_UAR_TYPE_REGULAR
    try:
        for i in range(legacy_num_sys_pages(resp, page_size)):
            uars.append(mlx5_mmap(mmap_page, i, page_size, uar_type))
    except OSError:
        # err_free:
        for u in uars:
            munmap_page(u.reg)
        raise
    return uars


@attrs.define
class _LockClasses:
    tot_uuars: int
    low_lat_uuars: int
    single_threaded: bool


def build_legacy_bfs(resp: UcontextResp, uars: Sequence[mlx5_uar_info | int], *,
                     low_lat_uuars: int, page_size: int,
                     single_threaded: bool = False) -> list[mlx5_bf]:
    """Mirrors the bfs[] loop of mlx5_set_context: 4 entries per mapped UAR.

    For system page i, UAR j in it and register k of that UAR:
    bfi = (i*uars_per_page + j)*4 + k, reg = page + 4096*j + 0x800 +
    k*bf_reg_size.  Every entry but bfi 0 gets buf_size bf_reg_size/2 (bfi 0
    never does BlueFlame); the lock follows need_uuar_lock with the kernel's
    tot_bfregs.  `uars` are the mapped pages (a bare address counts as a
    REGULAR page).
    """
    _, per_page = adjust_uar_info(page_size, resp)
    pages = [u if isinstance(u, mlx5_uar_info) else mlx5_uar_info(u) for u in uars]
    if len(pages) != legacy_num_sys_pages(resp, page_size):
        raise ValueError(f"build_legacy_bfs: {len(pages)} pages mapped, "
                         f"{legacy_num_sys_pages(resp, page_size)} expected")
    classes = _LockClasses(resp.tot_bfregs, low_lat_uuars, single_threaded)
    bfs = [mlx5_bf(reg=0) for _ in range(resp.tot_bfregs // MLX5_NUM_NON_FP_BFREGS_PER_UAR
                                         * NUM_BFREGS_PER_UAR)]
    for i, page in enumerate(pages):
        mmap_offset = get_uar_mmap_offset(i, page_size, uar_type_to_cmd(page.type))
        for j in range(per_page):
            for k in range(NUM_BFREGS_PER_UAR):
                bfi = (i * per_page + j) * NUM_BFREGS_PER_UAR + k
                bf = bfs[bfi]
                bf.reg = (page.reg + MLX5_ADAPTER_PAGE_SIZE * j + MLX5_BF_OFFSET
                          + k * resp.bf_reg_size)
                bf.need_lock = need_uuar_lock(classes, bfi)
                bf.buf_size = resp.bf_reg_size // 2 if bfi else 0
                bf.uuarn = bfi
                bf.uar_mmap_offset = mmap_offset
    return bfs


def bf_for_bfreg_index(bfs: Sequence[mlx5_bf], bfreg_index: int) -> mlx5_bf:
    """Mirrors map_uuar() without a dynamic bf: the QP uses bfs[resp.bfreg_index]."""
    if not 0 <= bfreg_index < len(bfs):
        # EMU: rdma-core indexes bfs[] unchecked; a bad index from the kernel is an error here
        raise ProviderError(errno.EINVAL,
                            f"map_uuar: bfreg_index {bfreg_index} outside bfs[{len(bfs)}]")
    return bfs[bfreg_index]


# -- dynamic UARs ---------------------------------------------------------------------

AllocUarObj = Callable[[int], tuple[int, int, int]]


class DynUarContext(Protocol):
    """The mlx5_context fields the dynamic UAR allocator reads and writes."""

    page_size: int              # rdma-core: to_mdev(ibdev)->page_size
    num_uars_per_page: int
    bf_reg_size: int
    shut_up_bf: bool
    single_threaded: bool       # rdma-core: the process-wide mlx5_single_threaded
    flags: int
    nc_uar: mlx5_bf | None
    # protected by dyn_bfregs_mutex (see the module docstring):
    dyn_uar_bf_list: list[mlx5_bf]
    dyn_uar_qp_shared_list: list[mlx5_bf]
    dyn_uar_qp_dedicated_list: list[mlx5_bf]
    qp_max_dedicated_uuars: int
    qp_alloc_dedicated_uuars: int
    qp_max_shared_uuars: int
    qp_alloc_shared_uuars: int
    # EMU: the UAR object ioctls and their mmap/munmap, injected
    alloc_uar_obj: AllocUarObj
    free_uar_obj: Callable[[mlx5_bf], None]


@traced
def mlx5_alloc_dyn_uar(ctx: DynUarContext, flags: int) -> mlx5_bf:
    """Mirrors mlx5_alloc_dyn_uar(): allocate and map one UAR object.

    The returned bf owns the page (length != 0).  A legacy kernel has no UAR
    objects: NC fails with EOPNOTSUPP.
    """
    if ctx.flags & MLX5_CTX_FLAGS_NO_KERN_DYN_UAR:
        # EMU: the legacy ALLOC_WC path (used by thread domains only) is not modelled
        raise ProviderError(errno.EOPNOTSUPP,
                            "mlx5_alloc_dyn_uar: kernel without dynamic UAR objects")
    addr, page_id, mmap_offset = ctx.alloc_uar_obj(flags)
    return mlx5_bf(reg=0, uar=addr, page_id=page_id, uar_mmap_offset=mmap_offset,
                   length=ctx.page_size, dyn_alloc_uar=True, mmaped_entry=True,
                   nc_mode=flags == MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC)


def mlx5_insert_dyn_uuars(ctx: DynUarContext, bf_uar: mlx5_bf) -> None:
    """Mirrors mlx5_insert_dyn_uuars(): split a new UAR page into its registers.

    num_uars_per_page * 2 registers go to the tail of the list the page was
    allocated for; the first is bf_uar itself.  Dedicated ones are lock-free,
    shared ones need the lock unless single-threaded.
    """
    per_page = ctx.num_uars_per_page * MLX5_NUM_NON_FP_BFREGS_PER_UAR
    if bf_uar.qp_dedicated:
        head = ctx.dyn_uar_qp_dedicated_list
    elif bf_uar.qp_shared:
        head = ctx.dyn_uar_qp_shared_list
    else:
        head = ctx.dyn_uar_bf_list
    for j in range(per_page):
        bf = bf_uar if j == 0 else mlx5_bf(reg=0)
        uar_in_page, in_uar = j // MLX5_NUM_NON_FP_BFREGS_PER_UAR, j % 2
        bf.reg = (bf_uar.uar + uar_in_page * MLX5_ADAPTER_PAGE_SIZE + MLX5_BF_OFFSET
                  + in_uar * ctx.bf_reg_size)
        bf.buf_size = 0 if bf_uar.nc_mode else ctx.bf_reg_size // 2
        bf.uuarn = 0 if bf_uar.nc_mode else 1    # non-zero: post_send may BlueFlame
        head.append(bf)
        bf.dyn_alloc_uar = bf_uar.dyn_alloc_uar
        bf.need_lock = bf_uar.qp_shared and not ctx.single_threaded
        if j:
            bf.uar = bf_uar.uar
            bf.page_id = bf_uar.page_id + uar_in_page
            bf.nc_mode = bf_uar.nc_mode
            if bf_uar.dyn_alloc_uar:
                bf.uar_mmap_offset = bf_uar.uar_mmap_offset
        if bf_uar.qp_dedicated:
            ctx.qp_alloc_dedicated_uuars += 1
            bf.qp_dedicated = True
        elif bf_uar.qp_shared:
            ctx.qp_alloc_shared_uuars += 1
            bf.qp_shared = True


def mlx5_alloc_qp_uar(ctx: DynUarContext, dedicated: bool) -> None:
    """Mirrors mlx5_alloc_qp_uar(): one more BF UAR for the QP lists."""
    bf = mlx5_alloc_dyn_uar(ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_BF)
    bf.qp_dedicated, bf.qp_shared = dedicated, not dedicated
    mlx5_insert_dyn_uuars(ctx, bf)


def _least_used_shared(ctx: DynUarContext) -> mlx5_bf:
    """The shared register with the fewest QPs, the first of them on a tie."""
    best = None
    for bf in ctx.dyn_uar_qp_shared_list:
        if best is None or bf.count < best.count:
            best = bf
    assert best is not None, "mlx5_get_qp_uar: no shared register to fall back on"
    return best


@traced
def mlx5_get_qp_uar(ctx: DynUarContext) -> mlx5_bf | None:
    """Mirrors mlx5_get_qp_uar(): the register a new QP rings its doorbell on.

    A free dedicated register if any; else a new dedicated UAR while fewer
    than qp_max_dedicated_uuars exist; else (after allocating one more shared
    UAR while fewer than qp_max_shared_uuars exist) the least used shared
    register, whose count goes up.  A failed allocation propagates and leaves
    the lists as they were.  Without BlueFlame every QP gets the singleton NC
    UAR, which is None if it could not be allocated (create_qp then fails).
    """
    if ctx.shut_up_bf or not ctx.bf_reg_size:
        return ctx.nc_uar
    while True:
        if ctx.dyn_uar_qp_dedicated_list:
            return ctx.dyn_uar_qp_dedicated_list.pop(0)
        if ctx.qp_alloc_dedicated_uuars < ctx.qp_max_dedicated_uuars:
            mlx5_alloc_qp_uar(ctx, dedicated=True)
            continue
        if ctx.qp_alloc_shared_uuars < ctx.qp_max_shared_uuars:
            mlx5_alloc_qp_uar(ctx, dedicated=False)
        bf = _least_used_shared(ctx)
        bf.count += 1
        return bf


@traced
def mlx5_put_qp_uar(ctx: DynUarContext, bf: mlx5_bf | None) -> None:
    """Mirrors mlx5_put_qp_uar(): a destroyed QP gives its register back.

    Dedicated registers go to the tail of the free list; a shared one just
    loses a user.  Static and NC registers are not tracked.
    """
    if bf is None or not (bf.qp_dedicated or bf.qp_shared):
        return
    if bf.qp_dedicated:
        ctx.dyn_uar_qp_dedicated_list.append(bf)
    else:
        bf.count -= 1


@traced
def mlx5_set_singleton_nc_uar(ctx: DynUarContext) -> None:
    """Mirrors mlx5_set_singleton_nc_uar(): the context's one non-cached UAR.

    Used for CQ doorbells and, without BlueFlame, by every QP.  A failure is
    harmless (legacy kernels have no UAR objects): nc_uar stays None.
    """
    try:
        bf = mlx5_alloc_dyn_uar(ctx, MLX5_IB_UAPI_UAR_ALLOC_TYPE_NC)
    except OSError:
        ctx.nc_uar = None
        return
    bf.reg = bf.uar + MLX5_BF_OFFSET
    ctx.nc_uar = bf


def mlx5_free_uar(ctx: DynUarContext, bf: mlx5_bf) -> None:
    """Mirrors mlx5_free_uar(): only the register owning the mapping frees the UAR."""
    if bf.length:
        ctx.free_uar_obj(bf)


@traced
def clean_dyn_uars(ctx: DynUarContext) -> None:
    """Mirrors clean_dyn_uars() at context close: free every dynamic UAR.

    Walks the thread-domain, shared and dedicated lists, then the NC UAR.  A
    dedicated register still held by a live QP is on no list, so its page is
    not freed - as in rdma-core, where QPs are destroyed before the context.
    """
    for head in (ctx.dyn_uar_bf_list, ctx.dyn_uar_qp_shared_list,
                 ctx.dyn_uar_qp_dedicated_list):
        for bf in head:
            mlx5_free_uar(ctx, bf)
        head.clear()
    if ctx.nc_uar is not None:
        mlx5_free_uar(ctx, ctx.nc_uar)
        ctx.nc_uar = None
