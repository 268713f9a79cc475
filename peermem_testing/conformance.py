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
                     aligned addresses, nmap counts them, they cover the range
  data               an RDMA WRITE into the registered memory lands there
  invalidation       (with revoke) the client invalidates the right
                     core_context, the mkey stops answering, the core's
                     dma_unmap/put_pages are (UNMAPS) not called or (else)
                     called once, release once, no device fault
  exit-teardown      a process exiting with the MR registered tears down clean
  unload-busy        the client cannot go while an MR is outstanding (EBUSY, or
                     unregistration waiting) and goes cleanly after
  leaks              every check leaves no page, pin, object, DMA mapping or
                     BAR window behind

Checks that need something the description lacks are skipped and say so.
The pytest fixture `peer_client_conformance` (peermem_testing.pytest_plugin,
registered through the pytest11 entry point) hands a test this function.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Any

import attrs

from drivers.ib_core.peer_mem import (
    MANDATORY,
    ib_peer_unmap_on_invalidate,
    peer_clients,
)
from kernel_model.current import current_or_none
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.sched import SCHED
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
    """What the kit needs to know about a client.  See the module docstring."""

    module: str
    alloc: Callable[[Any, int], int]                   # (proc, size) -> address
    free: Callable[[Any, int, int], None]              # (proc, address, size)
    revoke: Callable[[Any, Any, int, int], None] | None = None  # (machine, proc, addr, size)
    read: Callable[[Any, int, int], bytes] | None = None        # (proc, addr, n) -> bytes
    params: dict[str, Any] = attrs.Factory(dict)
    host: dict[str, Any] = attrs.Factory(dict)          # rdma_host keyword arguments
    host_modules: tuple[str, ...] = ("mlx5_ib",)

    @classmethod
    def nv_peer_mem(cls, **params: Any) -> ClientUnderTest:
        """nv_peer_mem serving cudaMalloc'd memory; cudaFree revokes it."""
        p = {"persistent_api_support": 0, **params}

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
class Recorder:
    """Wraps the registered clients' callbacks: every call, in order, with its context."""

    def __init__(self, m: Any):
        self.calls: list[tuple[str, str, Any]] = []   # (client name, callback, detail)
        self.clients = []
        with m.kernel():
            self.clients = peer_clients()
        for client in self.clients:
            pm = client.peer_mem
            for name in CALLBACKS:
                fn = getattr(pm, name)
                if fn is not None:
                    setattr(pm, name, self._wrap(pm.name, name, fn))

    def _wrap(self, client: str, name: str, fn: Callable) -> Callable:
        def shim(*args: Any) -> Any:
            ret = fn(*args)
            task = current_or_none()
            detail: Any = None
            if name == "dma_map" and ret == 0:
                sgt, nmap = args[0], args[4][0]
                detail = (nmap, sgt.dma_entries()[:nmap] if hasattr(sgt, "dma_entries") else [])
            elif name == "acquire":
                detail = ret
            elif name == "get_pages":
                detail = args[6]              # the core_context
            self.calls.append((client, name, (detail, task.comm if task else "?")))
            return ret
        return shim

    def names(self, client: str | None = None) -> list[str]:
        return [n for c, n, _ in self.calls if client is None or c == client]


# -- the host and the checks ----------------------------------------------------------------
def build_host(cut: ClientUnderTest) -> Any:
    """A fresh machine with the client's host (rdma_host arguments), the modules it
    needs and the client itself loaded."""
    m = rdma_host(**cut.host)
    for mod in cut.host_modules:
        m.load_module(mod)
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


def check_sg_layout(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    p = m.spawn("conform")
    ps = m.page_size
    ep = p.run(setup, p, 4096, 4, 1)
    addr = p.run(cut.alloc, p, SIZE)
    rec.calls.clear()
    off = 3 * ps if SIZE > 4 * ps else 0
    mr = _reg(p, ep.pd, addr + off, SIZE - off - ps)
    (nmap, entries) = next(d for c, n, (d, _) in rec.calls if n == "dma_map")
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


def check_data(cut: ClientUnderTest, m: Any, rec: Recorder) -> str:
    if cut.read is None:
        raise _Skip("no read hook")
    p = m.spawn("conform")
    tgt, src = _link(p)
    addr = p.run(cut.alloc, p, SIZE)
    mr = _reg(p, tgt.pd, addr, SIZE)
    data = bytes((i * 29 + 3) & 0xFF for i in range(2048))
    status = _write(p, src, addr + 0x1234, mr.rkey, data)
    if status != "SUCCESS":
        raise Violation(f"an RDMA WRITE into the memory completed {status}")
    got = p.run(cut.read, p, addr + 0x1234, len(data))
    if got != data:
        raise Violation("the bytes written are not in the memory")
    p.run(mr.close)
    p.run(cut.free, p, addr, SIZE)
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    p.exit(0)
    return "2 KiB written at an unaligned offset read back"


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
    during = _lifecycle_order(rec, owner)
    want = [] if unmaps else ["dma_unmap", "put_pages"]
    if during != want:
        raise Violation(f"during invalidation the core called {during}, want {want}")
    status = _write(p, src, addr, mr.rkey, b"late" * 16)
    if status == "SUCCESS":
        raise Violation("the MR still accepts RDMA after the memory was revoked")
    rec.calls.clear()
    p.run(mr.close)
    after = _lifecycle_order(rec, owner)
    if after != ["release"]:
        raise Violation(f"deregistration after invalidation called {after}, want release")
    gpus = getattr(m, "gpus", [])
    if any(g.bar1_faults for g in gpus):
        raise Violation("a device accessed revoked memory")
    p.run(cut.free, p, addr, SIZE)
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    p.exit(0)
    return f"{owner}: invalidated, mkey refused RDMA ({status}), released once"


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
    ("exit-teardown", check_exit_teardown),
    ("unload-busy", check_unload_busy),
]


def run_conformance(cut: ClientUnderTest) -> ConformanceReport:
    """Run every check on a fresh host each; the report names what was violated."""
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
            result = CheckResult(name, True, detail)
        except _Skip as e:
            result = CheckResult(name, None, str(e))
        except Violation as e:
            result = CheckResult(name, False, str(e))
        except Exception as e:  # noqa: BLE001 - any crash of the client is a violation
            result = CheckResult(name, False, f"{type(e).__name__}: {e}")
            _unwind(m)
        report.results.append(result)
        try:
            _finish(m)
        except Exception as e:  # noqa: BLE001 - the leak check's report
            report.results.append(CheckResult("leaks", False, f"after {name}: {e}"))
    if not any(r.name == "leaks" for r in report.results):
        report.results.append(CheckResult("leaks", True, "every check ended clean"))
    return report
