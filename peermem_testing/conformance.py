"""The peer-memory client conformance kit: run any client through the contract.

    from peermem_testing.conformance import ClientUnderTest, run_conformance
    report = run_conformance(ClientUnderTest.nv_peer_mem())
    assert report.ok, report

A client is described by a ClientUnderTest: the module to load (by name,
with its parameters), the host it needs (a GPU, a CMB device, the driver
modules), and how a process gets memory the client serves (`alloc`),
frees it (`free`), and - for an invalidating client - how the memory is
taken away (`revoke`: cudaFree, a device reset).  Each check runs on a
fresh host, with the client's seven callbacks wrapped so every call is
recorded (which callback, on which task, with the umem's mapping_lock held
or not), and ends with the host's leak check.  A violated rule is
reported by its name:

  registers          loading registers a client with every mandatory callback
  declines-foreign   acquire says 0 for memory that is not the client's (host
                     memory, a range running past its allocation); nothing kept
  lifecycle          registration calls acquire, get_pages, dma_map (and maybe
                     get_page_size) once each, in order; deregistration calls
                     dma_unmap, put_pages, release once each, in order
  sg-layout          dma_map's entries are PAGE_SIZE multiples at PAGE_SIZE-
                     aligned addresses, nmap counts them; at the page size
                     get_page_size gives (a power of two) they cover exactly the
                     range, each DMA address congruent with its VA (the core's
                     rule, ib_peer_sg_violation; the message names the part broken)
  data               on a host with a translating IOMMU, RDMA WRITEs at the first
                     bytes, an unaligned offset and the last bytes of the memory
                     land there; a DMA outside the client's mappings is an IOMMU
                     fault, reported
  invalidation       (with revoke) the client invalidates the right
                     core_context, the mkey stops answering, the core's
                     dma_unmap/put_pages are (UNMAPS) not called or (else)
                     called once, release once, no device fault
  core-context       (with revoke) after a deregistration, and with the next
                     registration live, revoking the old memory names no stale
                     core_context (the Recorder checks every invalidate call: only
                     an id the core gave and has not taken back by put_pages/release)
  quiet-acquire      (with revoke) a registration racing the revoke (RACE_SEEDS
                     random schedules): no invalidation from inside acquire, none
                     naming an id the client does not hold while acquire runs
  invalidate-once    (with revoke) the revoke racing `reset` (a device reset) or the
                     MR's deregistration: each core_context invalidated at most once
  exit-teardown      a process exiting with the MR registered tears down clean
  unload-busy        the client cannot go while an MR is outstanding (EBUSY, or
                     unregistration waiting) and goes cleanly after
  module-refs        with each callback in flight (held at its entry; the free
                     callback inside its invalidate call, the MR deregistered
                     meanwhile), rmmod fails or waits: it never unloads the client
                     under a callback (a host per probe, MODULE_REF_PROBES)
  leaks              every check leaves no page, pin, object, DMA mapping or
                     BAR window behind

Checks that need something the description lacks are skipped and say so.
The pytest fixture `peer_client_conformance` (peermem_testing.pytest_plugin,
registered through the pytest11 entry point) hands a test this function.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from drivers.ib_core.peer_mem import (
    MANDATORY,
    ib_peer_sg_violation,
    ib_peer_unmap_on_invalidate,
    peer_clients,
    peer_ticket_design,
)
from kernel_model.current import current_or_none
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.locking import complete, init_completion, wait_for_completion
from kernel_model.sched import SCHED, DeadlockError, RandomStrategy
from peermem_testing.gpu import gpu_load
from userspace.cuda.runtime import cudart
from userspace.libc import MAP_SHARED, O_RDWR, PROT_READ, PROT_WRITE, check
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.pyverbs import MR, SendWR
from userspace.tools.write_bw import connect, setup

CALLBACKS = ("acquire", "get_pages", "dma_map", "dma_unmap", "put_pages", "get_page_size",
             "release")
ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
SIZE = 256 << 10


@attrs.define
class ClientUnderTest:
    """What the kit, the ladder and the race fixtures need to know about a client.

    module        the client module's name, loaded by name (machine.load_module)
    alloc         (proc, size) -> address: give `proc` `size` bytes of memory the client
                  serves (cudaMalloc, an mmap of the device); runs in a task of proc
    free          (proc, address, size): free it again; must accept memory `revoke`
                  already took away
    revoke        (machine, proc, address, size) or None: take the memory away as its
                  owner would (cudaFree, a device reset), so the client invalidates;
                  runs in a task of proc.  None: the client never invalidates
    read          (proc, address, n) -> bytes or None: read the memory back (the data check)
    params        the client module's parameters (insmod name=value ...)
    host          rdma_host() keyword arguments: the devices its memory lives on
                  (nr_gpus=1, cmb_size=..., devices=[PciDeviceSpec(...)]), ofed=...
    host_modules  modules to load, in order, before the client (mlx5_ib and the driver of
                  the client's device)
    host_params   {module: {parameter: value}} for those modules (nvidia's release=...)
    reset         (machine) or None: a device reset that invalidates every registration
                  of the device (the invalidate-once check races it with `revoke`);
                  runs in a task of the process

    `configured(ofed=, release=, params=)` gives a copy on another core release, GPU
    driver release or client parameters - what run_conformance and build_ladder take.
    """

    module: str
    alloc: Callable[[Any, int], int]                   # (proc, size) -> address
    free: Callable[[Any, int, int], None]              # (proc, address, size)
    revoke: Callable[[Any, Any, int, int], None] | None = None  # (machine, proc, addr, size)
    read: Callable[[Any, int, int], bytes] | None = None        # (proc, addr, n) -> bytes
    params: dict[str, Any] = attrs.Factory(dict)
    host: dict[str, Any] = attrs.Factory(dict)          # rdma_host keyword arguments
    host_modules: tuple[str, ...] = ("mlx5_ib",)
    host_params: dict[str, dict[str, Any]] = attrs.Factory(dict)   # module -> parameters
    reset: Callable[[Any], None] | None = None         # (machine): a device reset

    def configured(self, ofed: str | None = None, release: str | None = None,
                   params: dict[str, Any] | None = None) -> ClientUnderTest:
        """A copy with ib_core's peer-memory core of MLNX_OFED `ofed` ("4.9", "5.1" ...
        "25.04"), the GPU driver (`nvidia`, which must be among host_modules) of
        `release` ("535.104.05"), and `params` merged over the client's parameters.
        None leaves a setting as it is."""
        host, host_params = dict(self.host), {k: dict(v) for k, v in self.host_params.items()}
        if ofed is not None:
            host["ofed"] = ofed
        if release is not None:
            if "nvidia" not in self.host_modules:
                raise ValueError(f"{self.module}: release= sets the nvidia driver's release, "
                                 f"and this client's host loads no nvidia "
                                 f"({self.host_modules})")
            host_params.setdefault("nvidia", {})["release"] = release
        return attrs.evolve(self, params={**self.params, **(params or {})}, host=host,
                            host_params=host_params)

    @classmethod
    def nv_peer_mem(cls, **params: Any) -> ClientUnderTest:
        """nv_peer_mem serving cudaMalloc'd memory; cudaFree revokes it.  The
        invalidating client (persistent_api_support=0) with the proposed fix for
        nv_peer_memory issue 53 (issue53_fix=1): a clean baseline for race tests;
        issue53_fix=0 is nvidia-peermem 580.65.06 as released."""
        p = {"persistent_api_support": 0, "issue53_fix": 1, **params}

        def alloc(proc: Any, size: int) -> int:
            return cudart(proc).cudaMalloc(size)

        def free(proc: Any, addr: int, size: int) -> None:
            rt = cudart(proc)
            if addr in rt.allocations:
                rt.cudaFree(addr)

        def revoke(m: Any, proc: Any, addr: int, size: int) -> None:
            cudart(proc).cudaFree(addr)

        return cls("nv_peer_mem", alloc, free,
                   revoke if p["persistent_api_support"] == 0 else None, gpu_load, p,
                   {"nr_gpus": 1}, ("mlx5_ib", "nvidia"))

    @classmethod
    def amdp2p(cls, **params: Any) -> ClientUnderTest:
        """amdp2p serving hipMalloc'd VRAM; hipFree revokes it."""
        from peermem_testing.gpu import amd_load
        from userspace.hip.runtime import hiprt

        def alloc(proc: Any, size: int) -> int:
            return hiprt(proc).hipMalloc(size)

        def free(proc: Any, addr: int, size: int) -> None:
            rt = hiprt(proc)
            if addr in rt.allocations:
                rt.hipFree(addr)

        def revoke(m: Any, proc: Any, addr: int, size: int) -> None:
            hiprt(proc).hipFree(addr)

        return cls("amdp2p", alloc, free, revoke, amd_load, dict(params),
                   {"nr_amd_gpus": 1}, ("mlx5_ib", "amdgpu"))

    @classmethod
    def uio_mapping(cls, module: str, revoke: Callable | None = None,
                    **params: Any) -> ClientUnderTest:
        """A client serving /dev/uio0 mappings of a CMB device (io_peer_mem, cmb_peer)."""
        maps: dict[int, int] = {}

        def alloc(proc: Any, size: int) -> int:
            fd = check(proc.open("/dev/uio0", O_RDWR), "open /dev/uio0")
            addr = check(proc.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), "mmap")
            maps[addr] = fd
            return addr

        def free(proc: Any, addr: int, size: int) -> None:
            fd = maps.pop(addr, None)
            if fd is not None:
                proc.munmap(addr, size)
                proc.close(fd)

        return cls(module, alloc, free, revoke, lambda p, a, n: p.load(a, n), params,
                   {"cmb_size": 4 << 20}, ("mlx5_ib", "uio_cmb"))


@attrs.define
class CheckResult:
    name: str
    ok: bool | None                # None: skipped
    detail: str = ""


@attrs.define
class ConformanceReport:
    client: str
    results: list[CheckResult] = attrs.Factory(list)

    @property
    def violations(self) -> list[CheckResult]:
        return [r for r in self.results if r.ok is False]

    @property
    def ok(self) -> bool:
        return not self.violations

    def __str__(self) -> str:
        lines = [f"conformance of {self.client}:"]
        for r in self.results:
            mark = {True: "ok  ", False: "FAIL", None: "skip"}[r.ok]
            lines.append(f"  {mark} {r.name:18} {r.detail}")
        return "\n".join(lines)


class Violation(Exception):
    """A rule of the contract the client broke (the check's name says which)."""


# -- the recording shims ------------------------------------------------------------------
@attrs.define
class CoreContextIds:
    """One invalidating client's core_context ids, as the Recorder saw the core hand them
    out (get_pages) and take them back (the dereg's put_pages, release)."""

    live: dict[int, Any] = attrs.Factory(dict)     # id -> the client context it came with
    gone: dict[int, str] = attrs.Factory(dict)     # id -> where the core took it back
    given: list[int] = attrs.Factory(list)         # every id handed out, in order
    invalidated: set[int] = attrs.Factory(set)     # live ids the client invalidated

    def hand_out(self, cc: int, ctx: Any) -> bool:
        """Record get_pages(core_context=cc); True if cc was handed out before."""
        reused = cc in self.given
        self.live[cc] = ctx
        self.gone.pop(cc, None)
        self.invalidated.discard(cc)
        self.given.append(cc)
        return reused

    def id_of(self, ctx: Any) -> int | None:
        return next((cc for cc, c in self.live.items() if c is ctx), None)

    def take_back(self, ctx: Any, how: str) -> None:
        cc = self.id_of(ctx)
        if cc is not None:
            del self.live[cc]
            self.gone[cc] = how
            self.invalidated.discard(cc)


class Recorder:
    """Wraps the registered clients' callbacks: every call, in order, with its context;
    and the ib_invalidate_peer_memory the core gave each invalidating client, judging
    every call by the core_context rules (core-context, quiet-acquire, invalidate-once)
    into `violations`."""

    def __init__(self, m: Any):
        self.calls: list[tuple[str, str, Any]] = []   # (client name, callback, detail)
        self.clients = []
        #: broken core_context rules (core-context, quiet-acquire, invalidate-once), each
        #: message starting with the rule's name; run_conformance fails the check with them
        self.violations: list[str] = []
        #: each invalidate_peer_memory call: (client name, core_context, task label)
        self.invalidations: list[tuple[str, int, str]] = []
        self.ids: dict[str, CoreContextIds] = {}      # invalidating clients only
        self.acquiring: dict[str, list[Any]] = {}     # client -> tasks inside its acquire
        self.invalidating: list[tuple[Any, str, int]] = []   # (task, client, id) in flight
        with m.kernel():
            self.clients = peer_clients()
        for client in self.clients:
            pm = client.peer_mem
            for name in CALLBACKS:
                fn = getattr(pm, name)
                if fn is not None:
                    setattr(pm, name, self._wrap(pm.name, name, fn))
            self._wrap_invalidate(client)

    def _wrap(self, client: str, name: str, fn: Callable) -> Callable:
        def shim(*args: Any) -> Any:
            self._enter(client, name, args)
            try:
                ret = fn(*args)
            finally:
                self._leave(client, name, args)
            task = current_or_none()
            detail: Any = None
            if name == "dma_map" and ret == 0:
                sgt, nmap = args[0], args[4][0]
                detail = (nmap, sgt.dma_entries()[:nmap] if hasattr(sgt, "dma_entries") else [])
            elif name in ("acquire", "get_page_size"):
                detail = ret
            elif name == "get_pages":
                detail = args[6]              # the core_context
            self.calls.append((client, name, (detail, task.comm if task else "?")))
            return ret
        return shim

    def names(self, client: str | None = None) -> list[str]:
        return [n for c, n, _ in self.calls if client is None or c == client]

    # -- the core_context rules -------------------------------------------------------------
    def _enter(self, client: str, name: str, args: tuple) -> None:
        ids = self.ids.get(client)
        if name == "acquire":
            self.acquiring.setdefault(client, []).append(SCHED.current)
        elif ids is not None and name == "get_pages":
            reused = ids.hand_out(args[6], args[5])      # (core_context, client context)
            if reused:
                self._violate(f"core-context: the core gave {client} core_context "
                              f"{args[6]:#x} again: a reused id, which a client still "
                              "holding the old one invalidates for the new registration")
        elif ids is not None and name == "release":
            ids.take_back(args[0], "release")             # the core erased the id first

    def _leave(self, client: str, name: str, args: tuple) -> None:
        ids = self.ids.get(client)
        if name == "acquire":
            self.acquiring[client].remove(SCHED.current)
        elif ids is not None and name == "put_pages":
            cc = ids.id_of(args[1])
            # inside the client's own invalidation of it (the core's non-UNMAPS unmap) the
            # id is still the client's; after the dereg's put_pages it must not be named
            if cc is not None and (SCHED.current, client, cc) not in self.invalidating:
                ids.take_back(args[1], "put_pages")

    def _wrap_invalidate(self, client: Any) -> None:
        """Wrap the ib_invalidate_peer_memory the core stored in the client's slot."""
        slot = client.invalidate_slot
        if slot is None or slot[0] is None or getattr(slot[0], "recorder", None) is self:
            return
        self.ids[client.peer_mem.name] = CoreContextIds()
        fn = slot[0]

        def invalidate_shim(reg_handle: Any, core_context: int) -> int:
            name = getattr(getattr(reg_handle, "peer_mem", None), "name", "?")
            task = SCHED.current
            self._judge_invalidate(name, core_context, task)
            self.invalidations.append((name, core_context, task.label))
            self.invalidating.append((task, name, core_context))
            try:
                return fn(reg_handle, core_context)
            finally:
                self.invalidating.remove((task, name, core_context))
        invalidate_shim.recorder = self
        slot[0] = invalidate_shim

    def _judge_invalidate(self, client: str, cc: int, task: Any) -> None:
        ids = self.ids.get(client)
        if ids is None:
            return
        who = f"{client} (task {task.label}) invalidated core_context {cc:#x}"
        acquiring = self.acquiring.get(client, [])
        if task in acquiring:
            self._violate(f"quiet-acquire: {who} from inside its own acquire: no invalidation "
                          "may come while acquire runs (its probe must not call it)")
        elif cc not in ids.live and acquiring:
            self._violate(f"quiet-acquire: {who}, which it does not hold, while acquire ran "
                          f"on {', '.join(t.label for t in acquiring)}: no invalidation may "
                          "come from acquire's probe")
        elif cc in ids.gone:
            self._violate(f"core-context: {who} after the core took it back "
                          f"({ids.gone[cc]}): a stale id, which the core may give to another "
                          "registration")
        elif cc not in ids.live:
            self._violate(f"core-context: {who}, which the core never gave it (only "
                          "get_pages's core_context may be named)")
        elif cc in ids.invalidated:
            self._violate(f"invalidate-once: {who} a second time: each core_context is "
                          "invalidated at most once")
        else:
            ids.invalidated.add(cc)

    def _violate(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    def raise_violations(self) -> None:
        """Violation naming every rule broken so far, if any was."""
        if self.violations:
            raise Violation("; ".join(self.violations))

    def explain(self, message: str) -> str:
        """A failed check's message, after the rules broken on the way to it."""
        text = "; ".join(self.violations)
        return message if not text or message == text else f"{text}; {message}"


# -- the host and the checks ----------------------------------------------------------------
def build_host(cut: ClientUnderTest) -> Any:
    """A fresh machine with the client's host (rdma_host arguments), the modules it
    needs and the client itself loaded."""
    m = rdma_host(**cut.host)
    for mod in cut.host_modules:
        m.load_module(mod, **cut.host_params.get(mod, {}))
    m.load_module(cut.module, **cut.params)
    return m


def _finish(m: Any) -> None:
    m.leak_check_expected = False       # checked here, once
    m.check_leaks()


def _reg(proc: Any, pd: Any, addr: int, size: int) -> MR:
    return proc.run(MR, pd, size, ACCESS, addr)


def check_registers(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    if not rec.clients:
        raise Violation(f"loading {cut.module} registered no peer-memory client")
    for c in rec.clients:
        missing = [n for n in MANDATORY if getattr(c.peer_mem, n) is None]
        if missing:
            raise Violation(f"{c.peer_mem.name} lacks {missing}")
    return ", ".join(c.peer_mem.name for c in rec.clients)


def check_declines_foreign(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    host = p.run(lambda: check(p.mmap(0, SIZE, PROT_READ | PROT_WRITE, 0x22, -1, 0), "mmap"))
    mr = _reg(p, ep.pd, host, SIZE)              # gup pins it: no client is even asked
    if "acquire" in rec.names():
        raise Violation("a client was asked about host memory gup could pin")
    p.run(mr.close)
    addr = p.run(cut.alloc, p, SIZE)
    try:
        _reg(p, ep.pd, addr, 2 * SIZE)          # runs past the allocation
        raise Violation("a range past the client's memory was registered")
    except VerbsError as e:
        if e.errno != errno.EFAULT:
            raise Violation(f"a range past the client's memory gave errno {e.errno}, "
                            "not gup's EFAULT") from None
    took = [d for c, n, (d, _) in rec.calls if n == "acquire" and d]
    if took:
        raise Violation(f"acquire said 'mine' for a range past its memory ({took})")
    p.run(cut.free, p, addr, SIZE)
    p.run(ep.ctx.close)
    p.exit(0)
    return "host memory and an overlong range were left to gup"


def _lifecycle_order(rec: Recorder, client: str) -> list[str]:
    return [n for n in rec.names(client) if n != "get_page_size"]


def check_lifecycle(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    rec.calls.clear()
    mr = _reg(p, ep.pd, addr, SIZE)
    owner = next(c for c, n, (d, _) in rec.calls if n == "acquire" and d)
    # an acquire may probe (nv_peer_mem's does) but the registration calls are one each
    seq = _lifecycle_order(rec, owner)
    if seq != ["acquire", "get_pages", "dma_map"]:
        raise Violation(f"registration called {seq}, want acquire, get_pages, dma_map")
    rec.calls.clear()
    p.run(mr.close)
    seq = _lifecycle_order(rec, owner)
    if seq != ["dma_unmap", "put_pages", "release"]:
        raise Violation(f"deregistration called {seq}, want dma_unmap, put_pages, release")
    p.run(cut.free, p, addr, SIZE)
    p.run(ep.ctx.close)
    p.exit(0)
    return f"{owner}: acquire, get_pages, dma_map / dma_unmap, put_pages, release"


def _sg_rule(rec: Recorder, addr: int, length: int) -> str | None:
    """The layout rule (ib_peer_sg_violation) on the table dma_map last returned, read at
    the page size get_page_size gave: which part is broken, or None."""
    maps = [d for c, n, (d, _) in rec.calls if n == "dma_map" and d is not None]
    sizes = [d for c, n, (d, _) in rec.calls if n == "get_page_size"]
    if not maps or not sizes:
        return None
    return ib_peer_sg_violation(maps[-1][1], addr, length, sizes[-1])


def check_sg_layout(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ps = m.page_size
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    rec.calls.clear()
    off = 3 * ps if SIZE > 4 * ps else 0
    try:
        mr = _reg(p, ep.pd, addr + off, SIZE - off - ps)
    except VerbsError as e:
        # the core refuses a table that breaks the rule: name the rule it broke
        rule = _sg_rule(rec, addr + off, SIZE - off - ps)
        if rule is None:
            raise
        raise Violation(f"{rule} (the registration failed, errno {e.errno})") from None
    (nmap, entries) = next(d for c, n, (d, _) in rec.calls if n == "dma_map")
    rule = _sg_rule(rec, addr + off, SIZE - off - ps)
    if rule is not None:
        raise Violation(rule)
    if nmap != len(entries) or not nmap:
        raise Violation(f"nmap {nmap} but {len(entries)} entries")
    for a, n in entries:
        if a % ps or n % ps or not n:
            raise Violation(f"entry {a:#x}+{n:#x} is not PAGE_SIZE aligned")
    total = sum(n for _, n in entries)
    if total < SIZE - off - ps:
        raise Violation(f"entries cover {total:#x} bytes, the range is {SIZE - off - ps:#x}")
    p.run(mr.close)
    p.run(cut.free, p, addr, SIZE)
    p.run(ep.ctx.close)
    p.exit(0)
    return f"{nmap} entries for an unaligned range"


def _link(p: Any) -> tuple[Any, Any]:
    tgt = p.run(setup, p, 4096, 4, 0x10)
    src = p.run(setup, p, 4096, 4, 0x20)
    p.run(connect, tgt, src.dest())
    p.run(connect, src, tgt.dest())
    return tgt, src


def _write(p: Any, src: Any, raddr: int, rkey: int, data: bytes) -> str:
    def go() -> str:
        src.mr.write(data)
        src.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(src.mr.buf, len(data),
                                                            src.mr.lkey)],
                                opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                                remote_addr=raddr, rkey=rkey))
        return v.ibv_wc_status_str(src.cq.poll_until(1)[0].status)
    return p.run(go)


#: where check_data writes 2 KiB: the first bytes, an unaligned offset, the last bytes
DATA_OFFSETS = (0, 0x1234, SIZE - 2048)


def check_data(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    """RDMA WRITEs land in the memory, on a host of its own with a translating IOMMU:
    only what the client mapped through the DMA API is reachable, so a DMA outside
    its pages (a short table, a wrong address) is an IOMMU fault reported here, not
    a silent write into host RAM as under the identity mapping."""
    if cut.read is None:
        raise _Skip("no read hook")
    h = build_host(attrs.evolve(cut, host={**cut.host, "iommu": "translating"}))
    Recorder(h)
    p = h.spawn("conform")
    try:
        _data_writes(cut, h, p)
    except Violation:
        _unwind(h)
        h.leak_check_expected = False          # the check failed part way: not checked
        raise
    _finish(h)
    return (f"2 KiB at offsets {', '.join(hex(o) for o in DATA_OFFSETS)} read back, "
            "through a translating IOMMU")


def _data_writes(cut: ClientUnderTest, h: Any, p: Any) -> None:
    tgt, src = _link(p)
    addr = p.run(cut.alloc, p, SIZE)
    mr = _reg(p, tgt.pd, addr, SIZE)
    for off in DATA_OFFSETS:
        data = bytes((i * 29 + 3 + off) & 0xFF for i in range(2048))
        faults = sum(len(hca.device_errors) for hca in h.hcas)
        status = _write(p, src, addr + off, mr.rkey, data)
        fault = [e for hca in h.hcas for e in hca.device_errors][faults:]
        if fault:
            raise Violation(f"an RDMA WRITE at offset {off:#x} of the MR was an IOMMU fault "
                            f"(completion {status}): {fault[0]} - the HCA was sent outside "
                            "the pages the client mapped")
        if status != "SUCCESS":
            raise Violation(f"an RDMA WRITE at offset {off:#x} of the memory completed "
                            f"{status}: the MR does not reach the memory there (does "
                            "dma_map's table cover the whole range?)")
        got = p.run(cut.read, p, addr + off, len(data))
        if got != data:
            raise Violation(f"the bytes written at offset {off:#x} are not in the memory")
    p.run(mr.close)
    p.run(cut.free, p, addr, SIZE)
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    p.exit(0)


def check_invalidation(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    if cut.revoke is None:
        raise _Skip("the client never invalidates (no revoke hook)")
    p = m.spawn("conform")
    tgt, src = _link(p)
    addr = p.run(cut.alloc, p, SIZE)
    rec.calls.clear()
    mr = _reg(p, tgt.pd, addr, SIZE)
    owner = next(c for c, n, (d, _) in rec.calls if n == "acquire" and d)
    client = next(c for c in rec.clients if c.peer_mem.name == owner)
    if not client.invalidation_required:
        raise _Skip(f"{owner} registered without an invalidate callback")
    before = client.stats["num_free_callbacks"]
    rec.calls.clear()
    p.run(cut.revoke, m, p, addr, SIZE)
    if client.stats["num_free_callbacks"] != before + 1:
        raise Violation("revoking the memory did not call the invalidate callback once")
    unmaps = ib_peer_unmap_on_invalidate(client)
    with m.kernel():
        tickets = peer_ticket_design()   # a 4.x core deregisters the MR inside the call
    during = _lifecycle_order(rec, owner)
    want = (["dma_unmap", "put_pages", "release"] if tickets else
            [] if unmaps else ["dma_unmap", "put_pages"])
    if during != want:
        raise Violation(f"during invalidation the core called {during}, want {want}")
    status = _write(p, src, addr, mr.rkey, b"late" * 16)
    if status == "SUCCESS":
        raise Violation("the MR still accepts RDMA after the memory was revoked")
    rec.calls.clear()
    p.run(mr.close)
    after = _lifecycle_order(rec, owner)
    if after != ([] if tickets else ["release"]):
        raise Violation(f"deregistration after invalidation called {after}, want "
                        f"{'nothing (released inside the invalidation)' if tickets else 'release'}")
    gpus = getattr(m, "gpus", [])
    if any(g.bar1_faults for g in gpus):
        raise Violation("a device accessed revoked memory")
    p.run(cut.free, p, addr, SIZE)
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    p.exit(0)
    return f"{owner}: invalidated, mkey refused RDMA ({status}), released once"


#: how many random schedules the race checks (quiet-acquire, invalidate-once) try
RACE_SEEDS = 24


class _HoldBack(RandomStrategy):
    """Seeded random decisions, except that the tasks in `held` do not run while
    `ready()` is false and another task can, and after that run at a pace the seed
    picks (every time they can, or with odds 1/2, 1/4, 1/8 against the others)."""

    def __init__(self, seed: int, ready: Callable[[], bool]):
        super().__init__(seed)
        self.ready = ready
        self.held: list[Any] = []
        self.pace = 0.5 ** (seed % 4)

    def choose(self, sched: Any, candidates: list, reason: str) -> Any:
        held = [t for t in candidates if t in self.held]
        others = [t for t in candidates if t not in self.held]
        if not held or not others:
            return self.rng.choice(candidates)
        if not self.ready() or self.rng.random() >= self.pace:
            return self.rng.choice(others)
        return self.rng.choice(held)


@contextlib.contextmanager
def _random_schedules(seed: int, ready: Callable[[], bool] | None = None
                      ) -> Iterator[_HoldBack]:
    """Seeded random scheduling decisions for the body (the decisions stay replayable);
    tasks put in the strategy's `held` wait until `ready()`."""
    prev = SCHED.strategy
    strategy = _HoldBack(seed, ready or (lambda: True))
    SCHED.use(strategy)
    try:
        yield strategy
    finally:
        SCHED.strategy = prev


def _owner(rec: Recorder) -> str:
    return next(c for c, n, (d, _) in rec.calls if n == "acquire" and d)


def check_core_context(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    """Register, deregister (put_pages, release: the core takes the id back), register
    other memory, then take the first memory away: a client that still names the old
    core_context is reported by the Recorder (core-context)."""
    if cut.revoke is None:
        raise _Skip("the client never invalidates (no revoke hook)")
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    old = p.run(cut.alloc, p, SIZE)
    rec.calls.clear()
    mr = _reg(p, ep.pd, old, SIZE)
    owner = _owner(rec)
    ids = rec.ids.get(owner)
    if ids is None:
        raise _Skip(f"{owner} registered without an invalidate callback")
    first = ids.given[-1]
    p.run(mr.close)
    new = p.run(cut.alloc, p, SIZE)
    mr2 = _reg(p, ep.pd, new, SIZE)
    second = ids.given[-1]
    p.run(cut.revoke, m, p, old, SIZE)       # nothing registered holds it any more
    p.run(mr2.close)
    p.run(cut.free, p, new, SIZE)
    p.run(cut.free, p, old, SIZE)
    p.run(ep.ctx.close)
    p.exit(0)
    return (f"{owner}: core_context {first:#x} taken back, the next registration got "
            f"{second:#x}; revoking the deregistered memory named no stale id")


def _try_reg(pd: Any, addr: int, mrs: list) -> None:
    try:
        mrs.append(MR(pd, SIZE, ACCESS, addr))
    except VerbsError:
        pass                                 # the memory went first: refused, fine


def check_quiet_acquire(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    """A registration racing the memory's revoke, over RACE_SEEDS random schedules: no
    invalidation may come from inside acquire (its probe) or name an id the client does
    not hold while acquire runs (quiet-acquire)."""
    if cut.revoke is None:
        raise _Skip("the client never invalidates (no revoke hook)")
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    registered = 0
    for seed in range(RACE_SEEDS):
        addr = p.run(cut.alloc, p, SIZE)
        mrs: list = []
        # the revoke waits until the registration is inside acquire, then both run at random
        with _random_schedules(seed, lambda: any(rec.acquiring.values())) as strategy:
            reg = p.thread(_try_reg, ep.pd, addr, mrs, name="reg")
            rev = p.thread(cut.revoke, m, p, addr, SIZE, name="revoke")
            strategy.held.append(rev)
            m.conformance_tasks = [reg, rev]
            reg.join()
            rev.join()
        registered += len(mrs)
        for mr in mrs:
            p.run(mr.close)
        p.run(cut.free, p, addr, SIZE)
        if rec.violations:
            rec.violations[0] += f" (seed {seed} of the registration-vs-revoke race)"
            break
    p.run(ep.ctx.close)
    p.exit(0)
    return (f"{RACE_SEEDS} registrations raced a revoke ({registered} registered): no "
            "invalidation while acquire ran")


def check_invalidate_once(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    """The memory's revoke (its free) racing a device reset (`reset`) - or, without one,
    the MR's deregistration - over RACE_SEEDS random schedules: each core_context is
    invalidated at most once (invalidate-once)."""
    if cut.revoke is None:
        raise _Skip("the client never invalidates (no revoke hook)")
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    rival = "a device reset" if cut.reset is not None else "the MR's deregistration"
    for seed in range(RACE_SEEDS):
        addr = p.run(cut.alloc, p, SIZE)
        rec.calls.clear()
        mr = _reg(p, ep.pd, addr, SIZE)
        if rec.ids.get(_owner(rec)) is None:
            p.run(mr.close)
            p.run(cut.free, p, addr, SIZE)
            p.run(ep.ctx.close)
            p.exit(0)
            raise _Skip(f"{_owner(rec)} registered without an invalidate callback")
        with _random_schedules(seed):
            free = p.thread(cut.revoke, m, p, addr, SIZE, name="free")
            other = (p.thread(cut.reset, m, name="reset") if cut.reset is not None
                     else p.thread(mr.close, name="dereg"))
            m.conformance_tasks = [free, other]
            free.join()
            other.join()
        if cut.reset is not None:
            p.run(mr.close)
        p.run(cut.free, p, addr, SIZE)
        if rec.violations:
            rec.violations[0] += (f" (seed {seed} of the free-vs-"
                                  f"{'reset' if cut.reset is not None else 'dereg'} race)")
            break
    p.run(ep.ctx.close)
    p.exit(0)
    return f"{RACE_SEEDS} frees raced {rival}: each core_context invalidated at most once"


def check_exit_teardown(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    _reg(p, ep.pd, addr, SIZE)
    rec.calls.clear()
    p.exit(0)
    if rec.names().count("release") != 1:
        raise Violation(f"exit called {rec.names()}: release not exactly once")
    return "do_exit released the registration"


def check_unload_busy(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    mr = _reg(p, ep.pd, addr, SIZE)
    rmmod = m.spawn("rmmod")
    t = rmmod.start(m.unload_module, cut.module)
    p.run(p.sched_yield)                        # rmmod runs until it fails or waits
    m.conformance_tasks = [t]
    if t.done:
        try:
            t.join()
        except KernelError as e:
            if e.errno != errno.EBUSY:
                raise Violation(f"unloading with an MR outstanding gave errno {e.errno}") \
                    from None
            outcome = "EBUSY while an MR was outstanding"
        else:
            raise Violation("the client unloaded with an MR outstanding")
        p.run(mr.close)
        m.unload_module(cut.module)
    else:
        outcome = "unregistration waited for the MR"
        p.run(mr.close)
        t.join()
    rmmod.exit(0)
    if cut.module in m.modules:
        raise Violation("the client is still loaded after its MR went")
    p.run(cut.free, p, addr, SIZE)
    p.run(ep.ctx.close)
    p.exit(0)
    return outcome + "; unloaded after dereg"


# -- module references across rmmod (module-refs) -------------------------------------------
#: what is in flight while the kit tries `rmmod`, and how the kit gets it there: each
#: callback the core calls (on a registration or a deregistration), and the client's
#: free callback (the revoke hook) inside its call of ib_invalidate_peer_memory - held on
#: the way in and on the way back, while the MR is deregistered under it
MODULE_REF_PROBES: tuple[tuple[str, str], ...] = (
    ("acquire", "reg"), ("get_pages", "reg"), ("dma_map", "reg"), ("get_page_size", "reg"),
    ("dma_unmap", "dereg"), ("put_pages", "dereg"), ("release", "dereg"),
    ("invalidate", "revoke"), ("invalidated", "revoke"),
)
_PROBE_TEXT = {"invalidate": "the free callback, calling ib_invalidate_peer_memory",
               "invalidated": "the free callback, back from ib_invalidate_peer_memory"}


class _Gate:
    """Puts the first call of one callback, once armed, to sleep at its entry (for the
    free callback: inside its call of ib_invalidate_peer_memory, before or after the
    core's work) until opened: the callback in flight for as long as the kit needs."""

    def __init__(self, rec: Recorder):
        self.armed: str | None = None
        self.held: Any = None                   # the task asleep in the gate
        self.gate = init_completion("conformance gate")
        for client in rec.clients:
            pm = client.peer_mem
            for name in CALLBACKS:
                fn = getattr(pm, name)
                if fn is not None:
                    setattr(pm, name, self._gated(name, fn))
            slot = getattr(client, "invalidate_slot", None)
            if slot is not None and slot[0] is not None:
                slot[0] = self._gated_invalidate(slot[0])

    def _gated(self, name: str, fn: Callable) -> Callable:
        def gated(*args: Any) -> Any:
            self._hold(name)
            return fn(*args)
        return gated

    def _gated_invalidate(self, fn: Callable) -> Callable:
        def gated(reg_handle: Any, core_context: int) -> int:
            self._hold("invalidate")
            ret = fn(reg_handle, core_context)
            self._hold("invalidated")
            return ret
        return gated

    def _hold(self, name: str) -> None:
        if self.armed != name:
            return
        self.armed = None
        self.held = SCHED.current
        wait_for_completion(self.gate)
        self.held = None

    def open(self) -> None:
        complete(self.gate)


def _settle(helper: Any, until: Callable[[], bool]) -> None:
    """Let the host's tasks run until `until()` holds or none can run."""
    def loop() -> None:
        for _ in range(10_000):
            if until() or not SCHED.yield_("conformance"):
                return
    helper.run(loop)


def _module_ref_probe(cut: ClientUnderTest, what: str, how: str, m: Any) -> str | None:
    """One probe on a host of its own: `what` held in flight, the MR deregistered under a
    held free callback, `rmmod` tried.  The violation's text, "unreached" when the
    callback never ran on that path, or None.  (`m`: the check's own, idle host.)"""
    h = build_host(cut)
    gate = _Gate(Recorder(h))
    p, helper, rm = h.spawn("conform"), h.spawn("settle"), h.spawn("rmmod")
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    mr = None if how == "reg" else _reg(p, ep.pd, addr, SIZE)
    gate.armed = what
    if how == "reg":
        t = p.thread(MR, ep.pd, SIZE, ACCESS, addr)
    elif how == "dereg":
        t = p.thread(mr.close)
    else:
        t = p.thread(cut.revoke, h, p, addr, SIZE)
    tasks, rmt = [t], None
    _settle(helper, lambda: gate.held is not None or t.done)
    held = gate.held
    inflight = _PROBE_TEXT.get(what, what) + (", its MR deregistered meanwhile"
                                              if how == "revoke" else "")
    outcome: str | None = "unreached" if held is None else None
    errors: list[str] = []
    try:
        if held is not None:
            if how == "revoke":                   # the MR goes while the callback runs
                tasks.append(p.thread(mr.close))
                _settle(helper, lambda: tasks[-1].done)
            rmt = rm.start(h.unload_module, cut.module)
            _settle(helper, lambda: rmt.done)
            if cut.module not in h.modules and gate.held is held:
                outcome = (f"{inflight}: rmmod {cut.module} went through while it was in "
                           f"flight (task {held.label}) - nothing held the module; take a "
                           "module reference for as long as the callback can run "
                           "(__module_get ... module_put)")
            helper.run(gate.open)
        gate.armed = None
        for task in tasks:
            try:
                ret = task.join()
            except Exception as e:  # noqa: BLE001 - the client's crash, reported below
                errors.append(f"{type(e).__name__}: {e}")
            else:
                if how == "reg" and task is t:
                    mr = ret
        if (how == "reg" or how == "revoke" and len(tasks) == 1) and mr is not None \
                and not errors:
            p.run(mr.close)                       # (a waiting rmmod can finish now)
        if rmt is not None:
            try:
                rmt.join()
            except KernelError as e:
                if e.errno != errno.EBUSY:
                    errors.append(f"rmmod: {e}")
    except DeadlockError as e:
        errors.append(f"DeadlockError: {e}")
    if outcome is not None and outcome != "unreached" or errors:
        h.leak_check_expected = False            # left as it broke
        if any(not t.done for t in tasks + [rmt] if t is not None) and \
                all(t.machine in (h, m) for t in SCHED.alive.values()):
            SCHED.abandon()                       # unwind the stuck tasks
        return outcome if outcome not in (None, "unreached") else \
            f"{inflight}, rmmod tried: {errors[0]}"
    p.run(cut.free, p, addr, SIZE)
    p.run(ep.ctx.close)
    for proc in (p, helper, rm):
        proc.exit(0)
    try:
        _finish(h)
    except Exception as e:  # noqa: BLE001 - the leak check's report (a task's crash too)
        return f"{inflight}, rmmod tried: {type(e).__name__}: {e}"
    return outcome


def check_module_refs(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    """No callback can be unloaded under: with each callback in flight (held asleep at
    its entry; the free callback inside its ib_invalidate_peer_memory call, with the MR
    deregistered meanwhile), `rmmod` of the client must fail (EBUSY: a module
    reference) or wait (ib_unregister_peer_memory_client waiting for the umem) until
    the callback returned.  Each probe runs on a host of its own."""
    unreached = []
    for what, how in MODULE_REF_PROBES:
        if how == "revoke" and cut.revoke is None:
            unreached.append(_PROBE_TEXT[what])
            continue
        outcome = _module_ref_probe(cut, what, how, m)
        if outcome == "unreached":
            unreached.append(_PROBE_TEXT.get(what, what))
        elif outcome is not None:
            raise Violation(outcome)
    tried = len(MODULE_REF_PROBES) - len(unreached)
    return (f"rmmod refused or waited with each of {tried} callbacks in flight"
            + (f"; not reached: {', '.join(unreached)}" if unreached else ""))


class _Skip(Exception):
    pass


def _unwind(m: Any) -> None:
    """A check crashed part way: collect what its helper tasks ended with, and unwind
    any still blocked (only when every live task is this host's)."""
    for t in getattr(m, "conformance_tasks", []):
        if t.done:
            try:
                t.join()
            except Exception:  # noqa: BLE001 - its outcome no longer matters
                pass
    if all(t.machine is m for t in SCHED.alive.values()):
        SCHED.abandon()


CHECKS: list[tuple[str, Callable[[ClientUnderTest, Any, Recorder], str]]] = [
    ("registers", check_registers),
    ("declines-foreign", check_declines_foreign),
    ("lifecycle", check_lifecycle),
    ("sg-layout", check_sg_layout),
    ("data", check_data),
    ("invalidation", check_invalidation),
    ("core-context", check_core_context),
    ("quiet-acquire", check_quiet_acquire),
    ("invalidate-once", check_invalidate_once),
    ("exit-teardown", check_exit_teardown),
    ("unload-busy", check_unload_busy),
    ("module-refs", check_module_refs),
]


def run_conformance(cut: ClientUnderTest, *, ofed: str | None = None,
                    release: str | None = None,
                    params: dict[str, Any] | None = None) -> ConformanceReport:
    """Run every check on a fresh host each; the report names what was violated.
    `ofed`, `release` and `params` select the core, the GPU driver release and the
    client's parameters (ClientUnderTest.configured)."""
    cut = cut.configured(ofed, release, params)
    report = ConformanceReport(cut.module)
    for name, fn in CHECKS:
        try:
            m = build_host(cut)
        except KernelError as e:
            report.results.append(CheckResult(name, False, f"the client does not load: {e}"))
            continue
        rec = Recorder(m)
        try:
            detail = fn(cut, m, rec)
            rec.raise_violations()
            result = CheckResult(name, True, detail)
        except _Skip as e:
            result = CheckResult(name, None, str(e))
        except Violation as e:
            result = CheckResult(name, False, rec.explain(str(e)))
        except Exception as e:  # noqa: BLE001 - any crash of the client is a violation
            result = CheckResult(name, False, rec.explain(f"{type(e).__name__}: {e}"))
            _unwind(m)
        report.results.append(result)
        try:
            _finish(m)
        except Exception as e:  # noqa: BLE001 - the leak check's report
            report.results.append(CheckResult("leaks", False, f"after {name}: {e}"))
    if not any(r.name == "leaks" for r in report.results):
        report.results.append(CheckResult("leaks", True, "every check ended clean"))
    return report
