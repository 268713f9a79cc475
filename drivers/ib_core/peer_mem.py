"""Mirrors MLNX_OFED drivers/infiniband/core/peer_mem.c (25.x), ib_peer_mem.h and
include/rdma/peer_mem.h: PeerDirect, memory registration of device memory.

gup cannot pin a GPU's memory (its VMA is VM_IO|VM_PFNMAP), so ib_umem_get
asks the registered *peer-memory clients* instead.  A client is a table of
callbacks (peer_memory_client: acquire, get_pages, dma_map, dma_unmap,
put_pages, get_page_size, release) that the core drives:

    ib_umem_get fails in gup -> ib_peer_umem_get:
        ib_get_peer_client    under peer_memory_mutex, in registration order,
                              the first client whose acquire() says "mine"
                              (invalidating clients only for callers that can
                              take an invalidation)
        mapping_lock taken    and, for an invalidating client, a core_context
                              id from the client's cyclic xarray
        get_pages             pins; from here the client may invalidate
        dma_map               fills the sg table (64 KiB entries for a GPU)
        fix_peer_sgls         trims the first/last entry to PAGE_SIZE granularity
        MAPPED                mapping_lock stays held (invalidating client) until
                              the MR owner calls ib_umem_activate_invalidation_notifier
    invalidation: the client calls ib_invalidate_peer_memory(reg, core_context):
        the umem's owner revokes the device's access (mlx5: the mkey), then
        the core unmaps (dma_unmap + put_pages) - or, for a client that set
        PEER_MEM_INVALIDATE_UNMAPS, only marks the umem INVALIDATED and lets
        the client tear down itself
    deregistration: ib_umem_stop_invalidation_notifier (no more callbacks;
        with UNMAPS the unmap runs outside mapping_lock - the fix for the
        mapping_lock / GPU-driver lock inversion), then ib_peer_umem_release:
        release(), the client's usecnt, the pinned_vm refund

The state of a peer umem is a table (PEER_UMEM_TRANSITIONS), read by one
function (ib_unmap_peer_client).

Lock order: peer_memory_mutex -> (client acquire); umem_p.mapping_lock ->
(MR owner's invalidation func, client dma_unmap/put_pages in non-UNMAPS
mode); xa_lock is innermost.

Statistics per client (struct ib_peer_memory_statistics) are kept and
published under /sys/kernel/mm/memory_peers/<name>/ as the OFED releases
before 24.04 did.  # EMU: num_dereg_pages counts the entries that were
registered (the intended count; OFED 5.5+ reads it after zeroing the table
and so always adds 0 - peer_mem.c, ib_unmap_peer_client()).
"""

from __future__ import annotations

from typing import Any

import attrs

import c_ext
from c_ext import U64Array
from drivers.ib_core.core_priv import _core
from drivers.ib_core.ib_umem import (  # noqa: F401 - the flags re-exported
    IB_PEER_MEM_ALLOW,
    IB_PEER_MEM_INVAL_SUPP,
    ib_umem,
    ib_umem_num_pages,
)
from kernel_model import trace
from kernel_model.current import current
from kernel_model.errno import EINVAL, KernelError
from kernel_model.locking import (
    complete,
    init_completion,
    mutex_init,
    mutex_lock,
    mutex_unlock,
    spin_lock,
    spin_unlock,
    wait_for_completion,
)
from kernel_model.mm import mmdrop
from kernel_model.refcount import (
    REFCOUNT_INIT,
    kref,
    kref_get,
    kref_init,
    kref_put,
    refcount_dec_and_test,
    refcount_inc,
    refcount_read,
)
from kernel_model.scatterlist import sg_append_table, sg_free_table
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.sysfs import sysfs_create_file, sysfs_remove_dir
from kernel_model.trace import traced, tracepoint
from kernel_model.xarray import U32_MAX, xa_alloc_cyclic, xa_erase, xa_load, xarray

IB_PEER_MEMORY_NAME_MAX = 64
IB_PEER_MEMORY_VER_MAX = 16
PEER_MEM_INVALIDATE_UNMAPS = 1 << 0
PEER_NO_INVALIDATION_ID = U32_MAX
# enum ib_umem_mapped_state
UMEM_PEER_UNMAPPED, UMEM_PEER_MAPPED, UMEM_PEER_INVALIDATED = 0, 1, 2
STATE_NAMES = ("UNMAPPED", "MAPPED", "INVALIDATED")
MANDATORY = ("acquire", "get_pages", "put_pages", "dma_map", "dma_unmap")
PEER_MEMORY_CLIENT_EX_SIZE = 2   # offsetofend(struct peer_memory_client_ex, flags), in fields
STATS = ("num_alloc_mrs", "num_dealloc_mrs", "num_reg_pages", "num_dereg_pages",
         "num_reg_bytes", "num_dereg_bytes", "num_free_callbacks")

# MLNX_OFED releases where the core's design changed (ib_core's `ofed` parameter)
OFED_NEW_DESIGN = (5, 1)        # 5.1b: mapping_lock, xarray ids, stop, _ex/UNMAPS
OFED_FIX_PEER_SGLS = (5, 5)     # fix_peer_sgls, get_page_size read after dma_map
OFED_STOP_LOCK_FIXED = (25, 4)  # ib_umem_stop_invalidation_notifier's `==` (was `!=`)


def parse_ofed_release(release: str) -> tuple[int, int]:
    """"MAJOR.MINOR[-x.y.z]" (as MLNX_OFED names its releases, 5.8-3.0.7.0) ->
    (major, minor); EINVAL otherwise."""
    parts = str(release).split("-")[0].split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        raise KernelError(EINVAL, f"ib_core: ofed release {release!r} is not MAJOR.MINOR") \
            from None


trace_peer_mem_state = tracepoint("peer_umem_state", "client core_context old new",
                                  layer="ib_core")
trace_peer_invalidate = tracepoint("peer_invalidate", "client core_context found",
                                   layer="ib_core")


# -- the client's side: include/rdma/peer_mem.h ----------------------------------------------
@attrs.define(eq=False)
class peer_memory_client:
    """Mirrors struct peer_memory_client: name, version and the seven callbacks.

    `version_ex` stands for version[IB_PEER_MEMORY_VER_MAX - 1]: a client
    embedded in a peer_memory_client_ex writes 1 there, which is how the
    core tells the two apart (ib_peer_unmap_on_invalidate).
    """

    name: str
    version: str
    acquire: Any = None
    get_pages: Any = None
    dma_map: Any = None
    dma_unmap: Any = None
    put_pages: Any = None
    get_page_size: Any = None
    release: Any = None
    version_ex: int = 0
    container: Any = None          # the peer_memory_client_ex around it (container_of)

    def __attrs_post_init__(self) -> None:
        if len(self.name) >= IB_PEER_MEMORY_NAME_MAX:
            raise ValueError(f"peer_memory_client: name {self.name!r} too long")
        if len(self.version) > IB_PEER_MEMORY_VER_MAX - 1:
            raise ValueError(f"peer_memory_client: version {self.version!r} too long")


@attrs.define(eq=False)
class peer_memory_client_ex:
    """Mirrors struct peer_memory_client_ex: the client plus ex_size and flags."""

    client: peer_memory_client
    ex_size: int = PEER_MEMORY_CLIENT_EX_SIZE
    flags: int = 0

    def __attrs_post_init__(self) -> None:
        # the client's own BUG_ON(strlen(version) > IB_PEER_MEMORY_VER_MAX - 2): the last
        # byte of version[] carries the ex marker
        if len(self.client.version) > IB_PEER_MEMORY_VER_MAX - 2:
            raise ValueError(f"peer_memory_client_ex: version {self.client.version!r} leaves "
                             "no byte for the ex marker")
        self.client.version_ex = 1
        self.client.container = self


# -- the core's side: ib_peer_mem.h ---------------------------------------------------------
class ib_peer_memory_client:
    """Mirrors struct ib_peer_memory_client: one registration (the reg_handle)."""

    TRACE_NAME_OUTLIVES_FREE = True     # traces keep naming it after unregister freed it

    def __init__(self, peer_mem: peer_memory_client, invalidation_required: bool):
        self.peer_mem = peer_mem
        self.usecnt = REFCOUNT_INIT(1)
        self.usecnt_zero = init_completion(f"{peer_mem.name} usecnt_zero")
        self.stats = dict.fromkeys(STATS, 0)
        self.umem_xa = xarray(f"{peer_mem.name} xa_lock")
        self.xa_cyclic_next = [0]
        self.invalidation_required = invalidation_required
        # OFED 4.x: the ticket list under the client's lock (ib_peer_insert_context)
        self.lock = mutex_init(f"{peer_mem.name} lock")
        self.core_ticket_list: dict[int, invalidation_ctx] = {}
        self.last_ticket = 1
        # not kernel state: the client's slot the core wrote ib_invalidate_peer_memory
        # into, so a test harness (the conformance kit's Recorder) can wrap the call
        self.invalidate_slot: list | None = None

    @property
    def trace_name(self) -> str:
        return self.peer_mem.name

    def __repr__(self) -> str:
        users = max(refcount_read(self.usecnt) - 1, 0)   # the registration's own is 1
        inval = "invalidating" if self.invalidation_required else "non-invalidating"
        return f"peer client {self.peer_mem.name} {inval}, {users} umems"


class PeerMemState:
    """peer_mem.c's globals for one machine: peer_memory_list under peer_memory_mutex,
    and which OFED release's design the core follows."""

    def __init__(self, ofed: tuple[int, int] = OFED_STOP_LOCK_FIXED,
                 late_invalidate_fix: bool = True) -> None:
        self.peer_memory_mutex = mutex_init("peer_memory_mutex")
        self.peer_memory_list: list[ib_peer_memory_client] = []   # registration order
        self.ofed = ofed
        self.ticket_design = ofed < OFED_NEW_DESIGN
        # ib_core's late_invalidate_fix parameter: see ib_invalidate_peer_memory
        self.late_invalidate_fix = late_invalidate_fix


def peer_ticket_design() -> bool:
    """Is this ib_core an OFED 4.x one (tickets; no mapping_lock, no stop)?  For the
    MR owner (mlx5), whose peer path differed with it."""
    return _peer_state().ticket_design


def _peer_state() -> PeerMemState:
    return _core().peer


# -- registration ---------------------------------------------------------------------------
def ib_memory_peer_check_mandatory(peer_client: peer_memory_client) -> bool:
    """Mirrors ib_memory_peer_check_mandatory(): acquire, get_pages, put_pages, dma_map and
    dma_unmap must be there (get_page_size and release may be NULL)."""
    for name in MANDATORY:
        if getattr(peer_client, name) is None:
            current().machine.dmesg.append(
                f"ib_core: Peer memory {peer_client.name} is missing mandatory function {name}")
            return False
    return True


@traced
def ib_register_peer_memory_client(peer_client: peer_memory_client,
                                   invalidate_callback: list | None
                                   ) -> ib_peer_memory_client | None:
    """Mirrors ib_register_peer_memory_client(): the reg_handle, or None (a missing
    mandatory callback).  With `invalidate_callback` (a one-slot list standing for
    the C out-pointer) the core stores ib_invalidate_peer_memory in it and the
    client serves only callers that take invalidations."""
    if not ib_memory_peer_check_mandatory(peer_client):
        return None
    state = _peer_state()
    client = kmalloc_obj(ib_peer_memory_client(peer_client, invalidate_callback is not None))
    if invalidate_callback is not None:
        invalidate_callback[0] = ib_invalidate_peer_memory
        client.invalidate_slot = invalidate_callback
    mutex_lock(state.peer_memory_mutex)
    if any(c.peer_mem.name == peer_client.name for c in state.peer_memory_list) or \
            f"{_sysfs_dir(client)}/version" in current().machine.chrdevs:
        # the name's kobject is still there (another one, or one still unregistering)
        # kobject_add() of memory_peers/<name> fails: the registration with it
        mutex_unlock(state.peer_memory_mutex)
        current().machine.dmesg.append(f"ib_core: peer memory client {peer_client.name}: "
                                       "name already registered")
        kfree(client)
        return None
    _publish(client)
    state.peer_memory_list.append(client)
    mutex_unlock(state.peer_memory_mutex)
    return client


@traced
def ib_unregister_peer_memory_client(reg_handle: ib_peer_memory_client) -> None:
    """Mirrors ib_unregister_peer_memory_client(): no new acquires from now on, then wait
    until every umem the client backs is released; after it returns no peer op is called,
    and the client is freed.  Nothing keeps it alive for an invalidation still running:
    on a 4.x core, whose invalidation can release the last umem inside the callback
    with the client's lock held, that is a use-after-free (see unregister-client-busy)."""
    state = _peer_state()
    mutex_lock(state.peer_memory_mutex)
    state.peer_memory_list.remove(reg_handle)
    mutex_unlock(state.peer_memory_mutex)
    ib_put_peer_client_ref(reg_handle)        # the registration's own reference
    wait_for_completion(reg_handle.usecnt_zero)
    if reg_handle.umem_xa.entries or reg_handle.core_ticket_list:   # every id is gone
        current().machine.report_bug("ib_unregister_peer_memory_client",
                                     f"{reg_handle.peer_mem.name}: core_context ids "
                                     f"{sorted(reg_handle.umem_xa.entries)} "
                                     f"{sorted(reg_handle.core_ticket_list)} still allocated")
    sysfs_remove_dir(_sysfs_dir(reg_handle))
    # 4.x: kfree(ib_peer_client); 5.1+: kobject_put(), whose release frees it
    kfree(reg_handle)


def _sysfs_dir(client: ib_peer_memory_client) -> str:
    return f"/sys/kernel/mm/memory_peers/{client.peer_mem.name}"


def _publish(client: ib_peer_memory_client) -> None:
    base = _sysfs_dir(client)
    sysfs_create_file(f"{base}/version", lambda: client.peer_mem.version + "\n")
    for name in STATS:
        sysfs_create_file(f"{base}/{name}", lambda n=name: f"{client.stats[n]}\n")


def ib_put_peer_client_ref(client: ib_peer_memory_client) -> None:
    if refcount_dec_and_test(client.usecnt):
        complete(client.usecnt_zero)


def ib_peer_unmap_on_invalidate(client: ib_peer_memory_client) -> bool:
    """Mirrors ib_peer_unmap_on_invalidate(): does the client tear down on its own
    after an invalidation (PEER_MEM_INVALIDATE_UNMAPS)?"""
    pm = client.peer_mem
    if not pm.version_ex:
        return False                                 # an old-style client
    ex = pm.container
    if ex is None or ex.ex_size < PEER_MEMORY_CLIENT_EX_SIZE:
        return False
    return bool(ex.flags & PEER_MEM_INVALIDATE_UNMAPS)


# -- the umem -------------------------------------------------------------------------------
class ib_umem_peer:
    """Mirrors struct ib_umem_peer: an ib_umem backed by a peer client."""

    def __init__(self, old: ib_umem, client: ib_peer_memory_client, ctx: Any):
        # the ib_umem fields, copied from the umem gup failed on
        self.ibdev, self.owning_mm = old.ibdev, old.owning_mm
        self.iova, self.length, self.address = old.iova, old.length, old.address
        self.writable, self.is_odp, self.is_dmabuf = old.writable, False, False
        self.is_peer = True
        self.sgt_append = sg_append_table(old.sgt_append.sgt.machine)
        self.kref = kref()
        kref_init(self.kref)
        self.ib_peer_client: ib_peer_memory_client | None = client
        self.peer_client_context = ctx
        self.invalidation_func: Any = None
        self.invalidation_private: Any = None
        self.mapping_lock = mutex_init("mapping_lock")
        self.mapped_state = UMEM_PEER_UNMAPPED      # protected by mapping_lock
        self.xa_id = PEER_NO_INVALIDATION_ID
        self.saved: tuple | None = None              # first/last sg before fix_peer_sgls
        self.reg_nents = 0
        self.reg_bytes = 0                           # what num_reg_bytes counted for it
        self.invalidation_ctx: invalidation_ctx | None = None   # OFED 4.x only

    @property
    def trace_name(self) -> str:
        return f"peer umem {self.address:#x}+{self.length:#x}"

    def __repr__(self) -> str:
        name = self.ib_peer_client.peer_mem.name if self.ib_peer_client else "-"
        return (f"ib_umem_peer {self.address:#x}+{self.length:#x} {name} "
                f"{STATE_NAMES[self.mapped_state]} id {self.xa_id:#x}")


@traced
def ib_get_peer_client(addr: int, size: int, peer_mem_flags: int) -> tuple[Any, Any]:
    """Mirrors ib_get_peer_client(): the first client, in registration order, whose
    acquire() takes the whole range; (client, its context) or (None, None)."""
    state = _peer_state()
    mutex_lock(state.peer_memory_mutex)
    try:
        for client in state.peer_memory_list:
            if client.invalidation_required and not peer_mem_flags & IB_PEER_MEM_INVAL_SUPP:
                continue
            ctx: list = [None]
            if client.peer_mem.acquire(addr, size, None, None, ctx) > 0:
                refcount_inc(client.usecnt)
                return client, ctx[0]
    finally:
        mutex_unlock(state.peer_memory_mutex)
    return None, None


def ib_put_peer_client(client: ib_peer_memory_client, ctx: Any) -> None:
    """Mirrors ib_put_peer_client(): release() the context, drop the client's use."""
    if client.peer_mem.release is not None:
        client.peer_mem.release(ctx)
    ib_put_peer_client_ref(client)


@traced
def ib_peer_umem_get(old_umem: ib_umem, old_err: KernelError, peer_mem_flags: int) -> Any:
    """Mirrors ib_peer_umem_get(): back the range by a peer client, or raise old_err.

    get_pages failing undoes nothing but the id (put_pages is not called);
    dma_map failing calls put_pages.  For an invalidating client the
    mapping_lock is still held on return (see the module docstring).
    """
    client, ctx = ib_get_peer_client(old_umem.address, old_umem.length, peer_mem_flags)
    if client is None:
        raise old_err
    pm = client.peer_mem
    state = _peer_state()
    tickets = state.ticket_design
    umem_p = ib_umem_peer(old_umem, client, ctx)
    sgt = umem_p.sgt_append.sgt
    if not tickets:
        mutex_lock(umem_p.mapping_lock)
    try:
        if tickets:        # OFED 4.x: a ticket whenever the caller takes invalidations
            core_context = 0
            if peer_mem_flags & IB_PEER_MEM_INVAL_SUPP:
                core_context = ib_peer_create_invalidation_ctx(client, umem_p)
        else:
            if client.invalidation_required:
                spin_lock(client.umem_xa.xa_lock)
                try:
                    umem_p.xa_id = xa_alloc_cyclic(client.umem_xa, umem_p, (0, U32_MAX - 1),
                                                   client.xa_cyclic_next)
                finally:
                    spin_unlock(client.umem_xa.xa_lock)
            core_context = umem_p.xa_id
        ret = pm.get_pages(old_umem.address, old_umem.length, 1, int(not umem_p.writable),
                           None, ctx, core_context)
        if ret:
            # EMU: a positive return is a client bug the kernel passes on as ERR_PTR(ret),
            # not an error pointer; the model makes it EINVAL
            raise KernelError(-ret if ret < 0 else EINVAL, f"ib_peer_umem_get: {pm.name} "
                              f"get_pages returned {ret}")
        nmap: list = [0]
        ret = pm.dma_map(sgt, ctx, old_umem.ibdev.dma_device, 0, nmap)
        if ret:
            pm.put_pages(sgt, ctx)
            raise KernelError(-ret if ret < 0 else EINVAL, f"ib_peer_umem_get: {pm.name} "
                              f"dma_map returned {ret}")
        sgt.nents = nmap[0]
    except BaseException:
        _peer_umem_get_undo(umem_p, client, ctx, tickets)
        raise
    # called whether or not the client has one: the core does not check it at
    # registration, so a client without it "registers fine and crashes on first use"
    peer_page_size = pm.get_page_size(ctx)
    # EMU: the real core trusts the table: a short one leaves the MR's tail to whatever
    # the MTT holds, a page size that is not a power of two makes fix_peer_sgls's
    # ALIGN() masks garbage, and an incongruent one shifts every access.  The model
    # refuses it (EINVAL, everything unwound) so the client's bug is named, not absorbed.
    bad = ib_peer_sgt_violation(sgt.dma_addr, sgt.dma_len, sgt.nents, umem_p.address,
                                umem_p.length, peer_page_size, sgt.ops)
    if bad is not None:
        pm.dma_unmap(sgt, ctx, old_umem.ibdev.dma_device)
        pm.put_pages(sgt, ctx)
        sg_free_table(sgt)
        _peer_umem_get_undo(umem_p, client, ctx, tickets)
        raise KernelError(EINVAL, f"ib_peer_umem_get: {pm.name}: {bad}")
    page_size = sgt.machine.page_size
    if peer_page_size != page_size and state.ofed >= OFED_FIX_PEER_SGLS:
        fix_peer_sgls(umem_p, peer_page_size)
    umem_p.reg_nents = sgt.nents
    # OFED 4.x counts nmap << page_shift, later releases the umem's length (both ways)
    umem_p.reg_bytes = sgt.nents * peer_page_size if tickets else umem_p.length
    _set_state(umem_p, UMEM_PEER_MAPPED)
    client.stats["num_reg_pages"] += sgt.nents
    client.stats["num_reg_bytes"] += umem_p.reg_bytes
    client.stats["num_alloc_mrs"] += 1
    if not tickets and umem_p.xa_id == PEER_NO_INVALIDATION_ID:
        mutex_unlock(umem_p.mapping_lock)
    return umem_p


def _peer_umem_get_undo(umem_p: ib_umem_peer, client: ib_peer_memory_client, ctx: Any,
                        tickets: bool) -> None:
    """ib_peer_umem_get's error labels: the id (err_xa), then the client (err_umem)."""
    if tickets:
        ib_peer_destroy_invalidation_ctx(client, umem_p)
    else:
        _erase_id(umem_p)                             # err_xa:
        mutex_unlock(umem_p.mapping_lock)
    ib_put_peer_client(client, ctx)                   # err_umem:
    kref_put(umem_p.kref, _free_umem_p)


def ib_peer_sg_violation(entries: list[tuple[int, int]], address: int, length: int,
                         peer_page_size: int) -> str | None:
    """The rule dma_map's table must keep, or None when it does: get_page_size is a
    power of two; the entries, read from ALIGN_DOWN(address, page size) on, cover
    exactly [ALIGN_DOWN(address), ALIGN(address + length)) at that page size; and each
    entry's DMA address is congruent with the VA it maps modulo that page size.
    `entries` are (DMA address, length) pairs, as the conformance kit records them.

    # EMU: no MLNX_OFED core checks this (see ib_peer_umem_get); the conformance kit
    # reads the same rule (peermem_testing.conformance, sg-layout)."""
    n = len(entries)
    dma_addr, dma_len = U64Array(n, zero=False), U64Array(n, zero=False)
    for i, (dma, k) in enumerate(entries):
        dma_addr.view[i], dma_len.view[i] = dma, k
    return ib_peer_sgt_violation(dma_addr, dma_len, n, address, length, peer_page_size,
                                 c_ext.backend(None))


def ib_peer_sgt_violation(dma_addr: U64Array, dma_len: U64Array, nents: int, address: int,
                          length: int, peer_page_size: int, ops: Any) -> str | None:
    """ib_peer_sg_violation on a mapped table's DMA columns, the walk in C (ops)."""
    pps = peer_page_size
    if pps <= 0 or pps & (pps - 1):
        return f"page size {_size_text(pps)} is not a power of two (get_page_size)"
    lo = address & ~(pps - 1)
    hi = -(-(address + length) // pps) * pps
    bad, total = ops.sg_congruent(dma_addr, dma_len, nents, lo, pps)
    if bad < -1:
        return (f"entry {-bad - 2} of {dma_len.view[-bad - 2]:#x} bytes runs past the end "
                "of the address space")
    if bad >= 0:
        return (f"VA {lo + total:#x} and DMA address {dma_addr.view[bad]:#x} not congruent "
                f"modulo page size {_size_text(pps)}")
    if total != hi - lo:
        return (f"sg_table covers {total} bytes of the {hi - lo}-byte range "
                f"[{lo:#x}, {hi:#x}) at page size {_size_text(pps)}")
    return None


def _size_text(n: int) -> str:
    return f"{n >> 10} KiB" if n > 0 and not n & 0x3FF else f"{n} bytes"


def fix_peer_sgls(umem_p: ib_umem_peer, peer_page_size: int) -> None:
    """Mirrors fix_peer_sgls(): trim the first and last entries, given in the client's
    page size, to PAGE_SIZE granularity around [address, address + length); the
    originals are saved for the unmap."""
    sgt = umem_p.sgt_append.sgt
    if not peer_page_size or not sgt.nents:
        return
    ps = sgt.machine.page_size
    first, last = 0, sgt.nents - 1
    umem_p.saved = (sgt.dma_addr.view[first], sgt.dma_len.view[first], sgt.sg_len.view[first],
                    sgt.dma_len.view[last], sgt.sg_len.view[last])
    addr, end = umem_p.address, umem_p.address + umem_p.length
    offset = (addr & ~(ps - 1)) - (addr & ~(peer_page_size - 1))
    sgt.dma_addr.view[first] += offset
    sgt.dma_len.view[first] -= offset
    sgt.sg_len.view[first] -= offset
    trim = (-(-end // peer_page_size) * peer_page_size) - (-(-end // ps) * ps)
    sgt.dma_len.view[last] -= trim
    sgt.sg_len.view[last] -= trim


def _restore_sgls(umem_p: ib_umem_peer) -> None:
    """ib_unmap_peer_client's restore: last first, then first."""
    if umem_p.saved is None:
        return
    sgt = umem_p.sgt_append.sgt
    first, last = 0, sgt.nents - 1
    a0, dl0, l0, dl1, l1 = umem_p.saved
    sgt.dma_len.view[last], sgt.sg_len.view[last] = dl1, l1
    sgt.dma_addr.view[first], sgt.dma_len.view[first], sgt.sg_len.view[first] = a0, dl0, l0
    umem_p.saved = None


def _erase_id(umem_p: ib_umem_peer) -> None:
    client = umem_p.ib_peer_client
    if umem_p.xa_id != PEER_NO_INVALIDATION_ID:
        spin_lock(client.umem_xa.xa_lock)
        xa_erase(client.umem_xa, umem_p.xa_id)
        spin_unlock(client.umem_xa.xa_lock)


def _set_state(umem_p: ib_umem_peer, new: int, old: int | None = None) -> None:
    old = umem_p.mapped_state if old is None else old
    umem_p.mapped_state = new
    if trace.enabled:
        trace_peer_mem_state(umem_p.ib_peer_client.peer_mem.name if umem_p.ib_peer_client
                             else "-", umem_p.xa_id, STATE_NAMES[old], STATE_NAMES[new])


#: ib_unmap_peer_client's table: (cur, to) -> (unmap: call dma_unmap + put_pages,
#: dealloc: num_dealloc_mrs and the table cleared, dereg: num_dereg_* counted)
PEER_UMEM_TRANSITIONS: dict[tuple[int, int], tuple[bool, bool, bool]] = {
    (UMEM_PEER_MAPPED, UMEM_PEER_UNMAPPED): (True, True, True),
    (UMEM_PEER_MAPPED, UMEM_PEER_INVALIDATED): (False, True, False),
    (UMEM_PEER_INVALIDATED, UMEM_PEER_UNMAPPED): (False, False, True),
}


@traced
def ib_unmap_peer_client(umem_p: ib_umem_peer, cur_state: int, to_state: int) -> None:
    """Mirrors ib_unmap_peer_client(): move the umem from cur_state to to_state doing
    what PEER_UMEM_TRANSITIONS says; any other pair only records the state."""
    client = umem_p.ib_peer_client
    unmap, dealloc, dereg = PEER_UMEM_TRANSITIONS.get((cur_state, to_state),
                                                      (False, False, False))
    sgt = umem_p.sgt_append.sgt
    if dealloc:
        _restore_sgls(umem_p)
        if unmap:
            pm = client.peer_mem
            pm.dma_unmap(sgt, umem_p.peer_client_context, umem_p.ibdev.dma_device)
            pm.put_pages(sgt, umem_p.peer_client_context)
        sg_free_table(sgt)                     # memset(&umem_p->umem.sgt_append, 0)
        client.stats["num_dealloc_mrs"] += 1
    if dereg:
        client.stats["num_dereg_pages"] += umem_p.reg_nents
        client.stats["num_dereg_bytes"] += umem_p.reg_bytes
    _set_state(umem_p, to_state, cur_state)


# -- invalidation ---------------------------------------------------------------------------
@traced
def ib_invalidate_peer_memory(reg_handle: ib_peer_memory_client, core_context: int) -> int:
    """Mirrors ib_invalidate_peer_memory(): the client says the pages behind core_context
    go away.  Returns 0 always; an unknown or stale id is ignored.  When it returns
    the MR owner has revoked the device's access (mlx5: no DMA can still happen)."""
    client = reg_handle
    if _peer_state().ticket_design:
        return ib_invalidate_peer_memory_tickets(client, core_context)
    spin_lock(client.umem_xa.xa_lock)
    client.stats["num_free_callbacks"] += 1
    umem_p = xa_load(client.umem_xa, core_context)
    if umem_p is not None:
        kref_get(umem_p.kref)
    spin_unlock(client.umem_xa.xa_lock)
    if trace.enabled:
        trace_peer_invalidate(client.peer_mem.name, core_context, umem_p is not None)
    if umem_p is None:
        return 0
    mutex_lock(umem_p.mapping_lock)
    try:
        cur = umem_p.mapped_state
        if cur == UMEM_PEER_UNMAPPED and _peer_state().late_invalidate_fix:
            # EMU: the proposed fix (ib_core late_invalidate_fix=1, the default): a umem
            # stop or a failed registration left UNMAPPED has nothing to invalidate, and
            # release may have cleared its client - leave it alone.  MLNX_OFED 5.1b to
            # 25.04 (peer_mem.c, ib_invalidate_peer_memory()) go on and dereference it
            return 0
        if cur == UMEM_PEER_MAPPED and umem_p.invalidation_func is not None:
            umem_p.invalidation_func(umem_p, umem_p.invalidation_private)
        # unconditional, as in peer_mem.c: from any state it records INVALIDATED (UNMAPS)
        # or UNMAPPED - an invalidation after stop leaves INVALIDATED for release to count
        # again, and one after release dereferences ib_peer_client, which release set NULL
        if ib_peer_unmap_on_invalidate(umem_p.ib_peer_client):
            ib_unmap_peer_client(umem_p, cur, UMEM_PEER_INVALIDATED)
        else:
            ib_unmap_peer_client(umem_p, cur, UMEM_PEER_UNMAPPED)
    finally:
        mutex_unlock(umem_p.mapping_lock)
        kref_put(umem_p.kref, _free_umem_p)
    return 0


@traced
def ib_umem_activate_invalidation_notifier(umem: Any, func: Any, priv: Any) -> int | None:
    """Mirrors ib_umem_activate_invalidation_notifier(): from now on func(umem, priv)
    may be called; drops the mapping_lock ib_peer_umem_get left held.

    OFED 4.x returns int: under the client's lock, EINVAL (-22) when the peer
    invalidated the pages since get_pages; else func(priv, umem, addr, size)
    is armed and 0 returned.
    """
    if not getattr(umem, "is_peer", False):
        current().machine.report_bug("ib_umem_activate_invalidation_notifier", "not a peer umem")
        return None
    if _peer_state().ticket_design:
        return _activate_ticket(umem, func, priv)
    if umem.xa_id == PEER_NO_INVALIDATION_ID:
        return
    umem.invalidation_func = func
    umem.invalidation_private = priv
    mutex_unlock(umem.mapping_lock)
    return None


@traced
def ib_umem_stop_invalidation_notifier(umem: Any) -> None:
    """Mirrors ib_umem_stop_invalidation_notifier() (OFED 25.04+): no more invalidation
    calls; the umem is unmapped - with UNMAPS, outside mapping_lock.  The caller has
    already made sure the device does no more DMA to it."""
    umem_p = umem
    state = _peer_state()
    if state.ticket_design:
        current().machine.report_bug("ib_umem_stop_invalidation_notifier",
                                     "not in an OFED 4.x core (added in 5.1b)")
        return
    unmap_on_inval = ib_peer_unmap_on_invalidate(umem_p.ib_peer_client)
    no_id = umem_p.xa_id == PEER_NO_INVALIDATION_ID
    if state.ofed < OFED_STOP_LOCK_FIXED:
        # OFED 5.1b up to 24.10 test `!=` here (fixed in 25.04): a stop without
        # activate locks the mapping_lock it already holds, and a non-invalidating
        # umem's is never taken
        no_id = not no_id
    if umem_p.invalidation_func is not None:
        mutex_lock(umem_p.mapping_lock)
        umem_p.invalidation_func = None
    elif no_id:
        mutex_lock(umem_p.mapping_lock)
    # else: activate never ran, and ib_peer_umem_get's lock is still ours
    if not unmap_on_inval:
        ib_unmap_peer_client(umem_p, umem_p.mapped_state, UMEM_PEER_UNMAPPED)
        mutex_unlock(umem_p.mapping_lock)
        return
    cur = umem_p.mapped_state
    _set_state(umem_p, UMEM_PEER_UNMAPPED)            # blocks ib_invalidate_peer_memory
    mutex_unlock(umem_p.mapping_lock)
    ib_unmap_peer_client(umem_p, cur, UMEM_PEER_UNMAPPED)


@traced
def ib_peer_umem_release(umem: Any) -> None:
    """Mirrors ib_peer_umem_release(): unmap if still mapped, free the id, release()
    the client context, refund pinned_vm, drop the umem."""
    umem_p = umem
    client = umem_p.ib_peer_client
    if _peer_state().ticket_design:
        # OFED 4.x peer_umem_release: the ticket goes, then the pages are unmapped and
        # put whatever the peer did before - nothing records an invalidation
        # (Mellanox/nv_peer_memory issue 15)
        ib_peer_destroy_invalidation_ctx(client, umem_p)
    elif umem_p.invalidation_func is not None:
        current().machine.report_bug("ib_peer_umem_release", "invalidation still active "
                                     "(ib_umem_stop_invalidation_notifier not called)")
    ib_unmap_peer_client(umem_p, umem_p.mapped_state, UMEM_PEER_UNMAPPED)
    _erase_id(umem_p)
    ib_put_peer_client(client, umem_p.peer_client_context)
    umem_p.ib_peer_client = None
    # EMU: OFED 4.x never charged a peer umem to pinned_vm and never mmdrop()s its mm
    # (a leak, code-derived); the model keeps one accounting for every release
    mm = umem_p.owning_mm
    mm.pinned_vm -= ib_umem_num_pages(umem_p)
    mmdrop(mm)
    kref_put(umem_p.kref, _free_umem_p)


def _free_umem_p(k: kref) -> None:
    """The last reference: kfree(umem_p) and mutex_destroy (nothing to free here)."""


# -- the OFED 4.x ticket design (ib_core ofed="4.9") ----------------------------------------
# Before 5.1b the core had no mapping_lock and no stop: a peer umem that can be
# invalidated gets a ticket (core_context) on its client's list, and the
# client's one `lock` serialises the list, activation and every invalidation.
# An invalidation before the MR owner activated only marks the context
# (peer_invalidated) and the registration fails in activate; one after calls
# the owner's func(cookie, umem, 0, 0) with that lock held - mlx5 4.x tears the
# whole MR down inside it, umem and client context included - and release()
# always unmaps and puts, whatever the peer did (MLNX_OFED 4.9 umem.c,
# peer_umem_release()).
class invalidation_ctx:
    """Mirrors OFED 4.x struct invalidation_ctx: a peer umem's ticket and callback."""

    def __init__(self, umem: ib_umem_peer):
        self.umem = umem
        self.context_ticket = 0
        self.func: Any = None
        self.cookie: Any = None
        self.peer_callback = 0            # the teardown runs inside the invalidation
        self.inflight_invalidation = 0    # the owner's dereg won: wait for its teardown
        self.peer_invalidated = 0         # invalidated before activation
        self.comp: Any = None

    def __repr__(self) -> str:
        return f"invalidation_ctx ticket {self.context_ticket}"


@traced
def ib_peer_create_invalidation_ctx(client: ib_peer_memory_client,
                                    umem_p: ib_umem_peer) -> int:
    """Mirrors ib_peer_create_invalidation_ctx() + ib_peer_insert_context() (OFED 4.x):
    a context and a ticket (from 1) on the client's list, under its lock."""
    ctx = kmalloc_obj(invalidation_ctx(umem_p))
    mutex_lock(client.lock)
    ctx.context_ticket = client.last_ticket
    client.last_ticket += 1
    client.core_ticket_list[ctx.context_ticket] = ctx
    mutex_unlock(client.lock)
    umem_p.invalidation_ctx = ctx
    return ctx.context_ticket


@traced
def ib_peer_destroy_invalidation_ctx(client: ib_peer_memory_client,
                                     umem_p: ib_umem_peer) -> None:
    """Mirrors ib_peer_destroy_invalidation_ctx() (OFED 4.x): take the ticket off the
    list.  Inside the invalidation (peer_callback) the lock is the invalidator's
    already and it frees the context; an invalidation waiting on this teardown
    (inflight_invalidation) is woken, and frees it; otherwise it is freed here."""
    ctx = umem_p.invalidation_ctx
    if ctx is None:
        return
    peer_callback = ctx.peer_callback
    if not peer_callback:
        mutex_lock(client.lock)
    client.core_ticket_list.pop(ctx.context_ticket, None)
    inflight = ctx.inflight_invalidation
    if inflight:
        complete(ctx.comp)
    if not peer_callback:
        mutex_unlock(client.lock)
    umem_p.invalidation_ctx = None
    if not peer_callback and not inflight:
        kfree(ctx)


def _activate_ticket(umem: ib_umem_peer, func: Any, cookie: Any) -> int:
    """OFED 4.x ib_umem_activate_invalidation_notifier(): 0, or -EINVAL."""
    client, ctx = umem.ib_peer_client, umem.invalidation_ctx
    mutex_lock(client.lock)
    try:
        if ctx.peer_invalidated:
            current().machine.dmesg.append("ib_core: ib_umem_activate_invalidation_notifier: "
                                           "pages were invalidated by peer")
            return -EINVAL
        ctx.func, ctx.cookie = func, cookie
        return 0
    finally:
        mutex_unlock(client.lock)


@traced
def ib_invalidate_peer_memory_tickets(client: ib_peer_memory_client,
                                      core_context: int) -> int:
    """Mirrors OFED 4.x ib_invalidate_peer_memory(): 0 always.  Under the client's lock:
    an unknown ticket is ignored; one not activated yet is marked peer_invalidated;
    otherwise the owner's func runs with the lock held, and if the owner's own dereg
    won the race (inflight_invalidation) this waits for that teardown.  The context
    is freed here in both cases."""
    mutex_lock(client.lock)
    client.stats["num_free_callbacks"] += 1
    ctx = client.core_ticket_list.get(core_context)
    if trace.enabled:
        trace_peer_invalidate(client.peer_mem.name, core_context, ctx is not None)
    if ctx is None:
        mutex_unlock(client.lock)
        return 0
    if ctx.func is None:
        ctx.peer_invalidated = 1
        mutex_unlock(client.lock)
        return 0
    ctx.func(ctx.cookie, ctx.umem, 0, 0)
    if ctx.inflight_invalidation:
        ctx.comp = init_completion("invalidation_ctx comp")
        mutex_unlock(client.lock)
        wait_for_completion(ctx.comp)
        kfree(ctx)
        return 0
    kfree(ctx)
    mutex_unlock(client.lock)
    return 0


# -- queries for tools and tests (not kernel API) ----------------------------------------------
def peer_clients() -> list[ib_peer_memory_client]:
    """The registered clients, in registration order."""
    return list(_peer_state().peer_memory_list)
