"""A fake PeerDirect peer-memory client for the peer_mem and mlx5 peer-MR tests.

FakePeer is a table of callbacks (the methods named like the fields of struct
peer_memory_client) that "owns" ranges of a process's address space - in the
tests, cudaMalloc'd GPU addresses, which gup refuses (VM_IO|VM_PFNMAP) - and
backs them with host RAM it allocates itself: one naturally aligned block of
`page_size` bytes per client page.  Its DMA addresses are the blocks' physical
addresses (the tests' machines use the identity IOMMU), so the HCA really moves
bytes into and out of that RAM, and a test reads or writes it with read()/write().

Every callback call is recorded in order (Call: the name, the core_context, the
task, whether the umem's mapping_lock was held and by whom, what the sg table
held); `fail[name] = errno` makes a callback fail with -errno, `hooks[name]` runs
a function inside it (before the failure check), `claim = False` makes acquire
answer "not mine".  get_pages takes a page reference on every backing block and
put_pages drops it, so a missing put_pages shows as a page leak; a client with
PEER_MEM_INVALIDATE_UNMAPS drops them itself after its invalidate callback returns.
"""

from __future__ import annotations

from typing import Any

import attrs

from drivers.ib_core.peer_mem import (
    PEER_MEM_INVALIDATE_UNMAPS,
    PEER_MEMORY_CLIENT_EX_SIZE,
    ib_register_peer_memory_client,
    ib_unregister_peer_memory_client,
    peer_memory_client,
    peer_memory_client_ex,
)
from kernel_model.current import current_or_none, running
from kernel_model.page_alloc import __GFP_ZERO as GFP_ZERO
from kernel_model.page_alloc import alloc_pages, get_page, page_to_phys, put_page
from kernel_model.scatterlist import sg_alloc_table
from kernel_model.sched import SCHED
from kernel_model.xarray import U32_MAX, xa_load

K64 = 1 << 16
CALLBACKS = ("acquire", "get_pages", "dma_map", "dma_unmap", "put_pages", "get_page_size",
             "release")


@attrs.define(eq=False)
class Call:
    """One recorded callback call."""

    name: str
    ctx: Any
    core_context: int | None
    task: str
    lock_held: bool | None          # the umem's mapping_lock held at the time (None: no umem)
    lock_mine: bool | None          # ... and held by the calling task
    args: tuple = ()
    sg: list = attrs.Factory(list)  # (dma_addr, dma_len, sg_len) of every entry, for DMA calls


class FakeCtx:
    """The client_context acquire hands out: one registration's state."""

    def __init__(self, addr: int, size: int, page_size: int):
        self.addr, self.size = addr, size
        self.start = addr & ~(page_size - 1)
        self.end = -(-(addr + size) // page_size) * page_size
        self.core_context: int | None = None
        self.umem: Any = None
        self.pinned: list = []
        self.mapped = False
        self.invalidated = False
        self.released = False
        self.sg_head: Any = None

    def __repr__(self) -> str:
        return f"FakeCtx [{self.start:#x}, {self.end:#x}) id {self.core_context}"


class FakePeer:
    """A peer client; see the module docstring.

    invalidating: register with an invalidate callback (the client serves only
    callers with IB_PEER_MEM_INVAL_SUPP).  ex: wrap it in a peer_memory_client_ex
    with ex_size/flags (unmaps=True is ex with PEER_MEM_INVALIDATE_UNMAPS).
    omit: callbacks left NULL.
    """

    def __init__(self, m: Any, name: str = "fake_peer", *, page_size: int = K64,
                 invalidating: bool = True, unmaps: bool = False, ex: bool | None = None,
                 ex_size: int = PEER_MEMORY_CLIENT_EX_SIZE, ex_flags: int | None = None,
                 version: str = "1.0", omit: tuple[str, ...] = ()):
        self.m = m
        self.name = name
        self.page_size = page_size
        self.order = (page_size // m.page_size).bit_length() - 1
        self.invalidating = invalidating
        self.unmaps = unmaps
        self.calls: list[Call] = []
        self.fail: dict[str, int] = {}
        self.hooks: dict[str, Any] = {}
        self.claim = True
        self.backing: dict[int, Any] = {}        # client-page VA -> head page of its block
        self.live_ctx: list[FakeCtx] = []
        self.inval_cb: list = [None]
        self.reg: Any = None
        cbs = {n: getattr(self, n) for n in CALLBACKS if n not in omit}
        self.client = peer_memory_client(name, version, **cbs)
        if ex or unmaps or (ex is None and ex_flags is not None):
            flags = ex_flags if ex_flags is not None else (
                PEER_MEM_INVALIDATE_UNMAPS if unmaps else 0)
            self.client_ex = peer_memory_client_ex(self.client, ex_size=ex_size, flags=flags)

    def __repr__(self) -> str:
        return f"FakePeer {self.name} {len(self.live_ctx)} contexts"

    # -- setup --------------------------------------------------------------------------
    def _kernel(self):
        return running(current_or_none() or self.m.init_task)

    def register(self) -> Any:
        """ib_register_peer_memory_client(); the reg_handle (None if refused)."""
        with self._kernel():
            self.reg = ib_register_peer_memory_client(
                self.client, self.inval_cb if self.invalidating else None)
        return self.reg

    def unregister(self) -> None:
        with self._kernel():
            ib_unregister_peer_memory_client(self.reg)
        self.reg = None

    def own(self, va: int, size: int) -> None:
        """Back [va, va + size) (widened to client pages) with zeroed host RAM."""
        with self._kernel():
            start = va & ~(self.page_size - 1)
            for pva in range(start, va + size, self.page_size):
                if pva not in self.backing:
                    self.backing[pva] = alloc_pages(GFP_ZERO, self.order, owner="fake_peer")

    def free_backing(self) -> None:
        with self._kernel():
            for pg in self.backing.values():
                put_page(pg, self.order)
        self.backing.clear()

    def phys(self, va: int) -> int:
        base = va & ~(self.page_size - 1)
        return page_to_phys(self.backing[base]) + (va - base)

    def read(self, va: int, n: int) -> bytes:
        out = b""
        while n:
            k = min(n, self.page_size - (va & (self.page_size - 1)))
            out += self.m.phys_read(self.phys(va), k)
            va, n = va + k, n - k
        return out

    def write(self, va: int, data: bytes) -> None:
        off = 0
        while off < len(data):
            k = min(len(data) - off, self.page_size - (va & (self.page_size - 1)))
            self.m.phys_write(self.phys(va), data[off:off + k])
            va, off = va + k, off + k

    # -- what happened ------------------------------------------------------------------
    def names(self, ctx: FakeCtx | None = None) -> list[str]:
        return [c.name for c in self.calls if ctx is None or c.ctx is ctx]

    def called(self, name: str) -> list[Call]:
        return [c for c in self.calls if c.name == name]

    def _record(self, name: str, ctx: FakeCtx | None, args: tuple = (), sg_head: Any = None
                ) -> None:
        umem = ctx.umem if ctx is not None else None
        lock = umem.mapping_lock if umem is not None else None
        sg = []
        if sg_head is not None:
            sg = [(sg_head.dma_addr.view[i], sg_head.dma_len.view[i], sg_head.sg_len.view[i])
                  for i in range(sg_head.nents)]
        self.calls.append(Call(
            name, ctx, ctx.core_context if ctx is not None else None, SCHED.current.label,
            None if lock is None else lock.owner is not None,
            None if lock is None else lock.owner is SCHED.current, args, sg))
        hook = self.hooks.get(name)
        if hook is not None:
            hook(ctx)

    def _err(self, name: str) -> int:
        return -self.fail[name] if name in self.fail else 0

    # -- invalidation -------------------------------------------------------------------
    def invalidate(self, ctx_or_id: FakeCtx | int) -> int:
        """The memory behind a registration goes: call ib_core's invalidate callback (on
        the current task), then - for an UNMAPS client - tear the mapping down ourselves."""
        core_context = ctx_or_id if isinstance(ctx_or_id, int) else ctx_or_id.core_context
        with self._kernel():
            ret = self.inval_cb[0](self.reg, core_context)
            if self.unmaps and not isinstance(ctx_or_id, int):
                ctx = ctx_or_id
                ctx.invalidated = True
                ctx.mapped = False
                self._unpin(ctx)
        return ret

    def _unpin(self, ctx: FakeCtx) -> None:
        for pg in ctx.pinned:
            put_page(pg, self.order)
        ctx.pinned = []

    # -- the callbacks ------------------------------------------------------------------
    def acquire(self, addr: int, size: int, peer_mem_private_data: Any, peer_mem_name: Any,
                client_context: list) -> int:
        self._record("acquire", None, (addr, size, peer_mem_private_data, peer_mem_name))
        if "acquire" in self.fail:
            return self._err("acquire")
        start = addr & ~(self.page_size - 1)
        mine = self.claim and all(pva in self.backing
                                  for pva in range(start, addr + size, self.page_size))
        if not mine:
            return 0
        ctx = FakeCtx(addr, size, self.page_size)
        self.live_ctx.append(ctx)
        client_context[0] = ctx
        return 1

    def get_pages(self, addr: int, size: int, write: int, force: int, sg_head: Any,
                  ctx: FakeCtx, core_context: int) -> int:
        ctx.core_context = core_context
        if self.reg is not None and core_context != U32_MAX:
            ctx.umem = xa_load(self.reg.umem_xa, core_context)
        self._record("get_pages", ctx, (addr, size, write, force, sg_head))
        if "get_pages" in self.fail:
            return self._err("get_pages")
        for pva in range(ctx.start, ctx.end, self.page_size):
            pg = self.backing[pva]
            get_page(pg)
            ctx.pinned.append(pg)
        return 0

    def dma_map(self, sg_head: Any, ctx: FakeCtx, dma_device: Any, dmasync: int,
                nmap: list) -> int:
        self._record("dma_map", ctx, (dma_device, dmasync))
        if "dma_map" in self.fail:
            return self._err("dma_map")
        n = (ctx.end - ctx.start) // self.page_size
        sg_alloc_table(sg_head, n)
        for i in range(n):
            sg_head.dma_addr.view[i] = self.phys(ctx.start + i * self.page_size)
            sg_head.dma_len.view[i] = self.page_size
            sg_head.sg_len.view[i] = self.page_size
        ctx.sg_head = sg_head
        ctx.mapped = True
        nmap[0] = n
        return 0

    def dma_unmap(self, sg_head: Any, ctx: FakeCtx, dma_device: Any) -> int:
        self._record("dma_unmap", ctx, (dma_device,), sg_head)
        ctx.mapped = False
        return 0

    def put_pages(self, sg_head: Any, ctx: FakeCtx) -> None:
        self._record("put_pages", ctx)
        self._unpin(ctx)

    def get_page_size(self, ctx: FakeCtx) -> int:
        self._record("get_page_size", ctx)
        return self.page_size

    def release(self, ctx: FakeCtx) -> None:
        self._record("release", ctx)
        ctx.released = True
        self.live_ctx.remove(ctx)


# -- the test bed ---------------------------------------------------------------------------
ALL_ACCESS = 0x1 | 0x2 | 0x4          # IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ


class PeerEnv:
    """An RDMA host with a GPU (ib_core of MLNX_OFED `ofed`, mlx5_ib and nvidia loaded),
    a process `p` with mlx5_0
    open and a PD, and the fake peers a test registers.  close() exits the process
    (uverbs tears down what it still holds), unregisters the peers still registered
    and frees their backing RAM - so the suite's leak check finds nothing."""

    def __init__(self, ram_size: int = 128 << 20, ofed: str = "25.04"):
        from kernel_model.emu.platform import rdma_host
        from userspace.cuda.runtime import cudart
        from userspace.libibverbs.pyverbs import PD, Context
        m = rdma_host(ram_size=ram_size, nr_gpus=1, modules=())
        m.load_module("ib_core", ofed=ofed)          # which MLNX_OFED's peer-memory core
        m.load_module("mlx5_ib")
        m.load_module("nvidia")
        self.m = m
        self.p = m.spawn("app")
        self.cu = cudart(self.p)
        self.peers: list[FakePeer] = []
        self.ctx = self.p.run(Context, self.p)
        self.pd = self.p.run(PD, self.ctx)

    @property
    def hca(self) -> Any:
        return self.m.hcas[0]

    def peer(self, name: str = "fake_peer", **kw: Any) -> FakePeer:
        """A FakePeer, registered."""
        fp = FakePeer(self.m, name, **kw)
        self.peers.append(fp)
        fp.register()
        return fp

    def gpu(self, size: int, *owners: FakePeer) -> int:
        """cudaMalloc(size) (an address gup refuses), backed by each of `owners`."""
        va = self.p.run(self.cu.cudaMalloc, size)
        for fp in owners:
            fp.own(va, size)
        return va

    def reg_mr(self, addr: int, length: int, access: int = ALL_ACCESS) -> Any:
        """ibv_reg_mr as the process (pyverbs MR); raises VerbsError."""
        from userspace.libibverbs.pyverbs import MR
        return self.p.run(MR, self.pd, length, access, addr)

    def dereg(self, mr: Any) -> None:
        self.p.run(mr.close)

    def sysfs(self, path: str) -> str | None:
        from userspace.libc import read_sysfs
        return self.p.run(read_sysfs, self.p, path)

    def close(self) -> None:
        if self.p.alive:
            self.p.exit(0)
        for fp in self.peers:
            if fp.reg is not None:
                fp.unregister()
            fp.free_backing()
