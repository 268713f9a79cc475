"""A stateful fuzzer over the whole syscall and verbs surface.

Emulator-level.  `FuzzWorld` builds two hosts on one Fabric - host-a with an
NVIDIA GPU, nv_peer_mem and mlx5_ib, host-b with mlx5_ib - and applies
operations to them the way hostile programs would: several processes open
devices, create PDs, CQs and QPs with random (also invalid) caps and
attributes, register host, GPU and dma-buf memory with random addresses,
lengths and access bits, unmap what they registered, post work requests
with their own, foreign, stale and random keys, write raw uverbs commands
naming other files' handles with response pointers into UAR, read-only or
GPU pages, mmap random offsets of the uverbs file, store bytes into their own
rings, doorbell records and UAR pages, close fds in any order and exit at any
point.

After every operation the invariants are checked (`FuzzWorld.check`):
  * the call succeeded, or failed as a process sees a failure: an errno
    (VerbsError, SysError, CudaError), a completion status on the data path,
    or SIGSEGV for a store to memory the process does not have (the
    process is then killed, and its exit must complete);
  * no WARN recorded on either host (Machine.bugs), no kernel task died
    (SCHED.failed), no deadlock, and the step ended within the watchdog's
    time (a hang is a failure);
and `finish()` exits every process and runs check_leaks() on both hosts.

An operation is `(name, kwargs)`; every argument is an int or bytes, and an
object is named by an index taken modulo the list of every object of that
kind ever made (live or gone), so stale and foreign handles come for free
and a recorded sequence replays exactly.  Two drivers use the same table:
  * the test suite's hypothesis RuleBasedStateMachine (tests/fuzz), which
    shrinks a failing sequence itself;
  * `peermem fuzz --seconds N --seed S` (`run_campaign`): seeded random
    sequences against fresh worlds, a progress line, and on a failure a
    delta-debugged minimal sequence printed as runnable Python.
"""

from __future__ import annotations

import errno
import random
import signal
import struct
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernel_model.emu.platform import rdma_host
from kernel_model.emu.process import SegmentationFault
from kernel_model.hw.fabric import Fabric
from kernel_model.mm import MAP_ANONYMOUS, MAP_FIXED, MAP_PRIVATE, MAP_SHARED
from kernel_model.sched import SCHED, DeadlockError
from kernel_model.uapi import ib_user_verbs as uv
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import CMD_BUF_SIZE, RESP_OFFSET, execute_write

# -- argument domains: one description, drawn by hypothesis or by random ---------------
U32, U64 = (1 << 32) - 1, (1 << 64) - 1


@dataclass(frozen=True)
class Num:
    """An integer: one of `special` half of the time, else uniform in [lo, hi]."""

    lo: int
    hi: int
    special: tuple[int, ...] = ()

    def draw(self, rng: random.Random) -> int:
        if self.special and rng.random() < 0.5:
            return rng.choice(self.special)
        return rng.randint(self.lo, self.hi)

    def strategy(self) -> Any:
        from hypothesis import strategies as st
        s = st.integers(self.lo, self.hi)
        return st.one_of(st.sampled_from(self.special), s) if self.special else s


@dataclass(frozen=True)
class Blob:
    """Bytes of length 0..max_len."""

    max_len: int

    def draw(self, rng: random.Random) -> bytes:
        n = rng.randint(0, self.max_len)
        if rng.random() < 0.3:
            return bytes([rng.choice((0, 0xFF))]) * n
        return rng.randbytes(n)

    def strategy(self) -> Any:
        from hypothesis import strategies as st
        return st.binary(max_size=self.max_len)


PICK = Num(0, 63)                                  # an object index (mod the kind's list)
LENGTH = Num(0, 1 << 16, (0, 1, 4095, 4096, 4097, 65536, 1 << 20, 1 << 31, 1 << 32, U32,
                          U64, -1))
OFFSET = Num(0, 1 << 14, (0, 1, 8, 64, 0x800, 0x900, 4095, 4096, 1 << 30, U64, -4096))
CAP = Num(0, 64, (0, 1, 2, 16, 255, 256, 1 << 15, 1 << 16, 1 << 31, U32))   # uint32_t
CQE = Num(-2, 64, (0, 1, 2, 16, 255, 256, 1 << 16, (1 << 31) - 1, -1,
                   -(1 << 31)))                                              # int
ACCESS = Num(0, 0x7F, (0, 1, 3, 7, 0xF, 0x20, 0x40, 1 << 20, U32))
FLAGS = Num(0, 0xF, (0, 2, 8, 10))

OPS: dict[str, dict[str, Num | Blob]] = {}


def op(**params: Num | Blob) -> Callable:
    """Register a FuzzWorld method as an operation with its argument domains."""
    def deco(fn: Callable) -> Callable:
        OPS[fn.__name__.removeprefix("op_")] = params
        return fn
    return deco


class FuzzFailure(AssertionError):
    """An invariant broke: the emulator did not survive its input.  `sig` names the
    kind of failure (operation, what broke) - what the shrinker keeps constant."""

    def __init__(self, message: str, sig: tuple = ()):
        super().__init__(message)
        self.sig = sig or (message.split(":", 1)[0],)


class StepTimeout(BaseException):
    """The watchdog fired: one operation ran longer than the step budget (a hang)."""


# an error a process sees: the errno of a failed call
_EXPECTED = (OSError,)


@dataclass(eq=False)
class Obj:
    """One thing a process made: its kind, owner, the verbs/user object, and whether it lives."""

    kind: str
    proc: Any
    ref: Any
    live: bool = True
    extra: dict = field(default_factory=dict)


class Victim:
    """A process on host-a that no operation names: two RC QPs of its own, connected to
    each other, over one MR holding a known pattern.  Whatever the other processes do,
    after every step its bytes must be as it left them and both QPs in RTS; at the end
    a WRITE between its QPs must still move bytes (process isolation, checked)."""

    def __init__(self, m: Any) -> None:
        from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr
        from userspace.tools.write_bw import Endpoint, connect
        self.m, self.p = m, m.spawn("victim")
        ctx = Context(self.p)
        pd = PD(ctx)
        cq = CQ(ctx, 16)
        self.mr = MR(pd, 8192, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
        cap = QPCap(max_send_wr=4, max_recv_wr=4, max_send_sge=1, max_recv_sge=1)
        gid = ctx.query_gid(1, 0)
        self.ends = [Endpoint(ctx, pd, cq, self.mr, QP(pd, QPInitAttr(cq, cq, cap=cap)), gid,
                              psn) for psn in (0x11, 0x22)]
        connect(self.ends[0], self.ends[1].dest())
        connect(self.ends[1], self.ends[0].dest())
        self.pattern = bytes((i * 7 + 3) & 0xFF for i in range(8192))
        self.mr.write(self.pattern)
        self.retired = False

    def retire(self) -> None:
        """The victim exits (the end of the sequence); nothing is checked after."""
        self.retired = True
        self.p.exit(0)

    def disturbed(self) -> str:
        """What changed of the victim, or ''."""
        if self.retired:
            return ""
        if not self.p.alive:
            return "died"
        if self.mr.read(8192) != self.pattern:
            return "had its memory changed"
        for e in self.ends:
            st = self.m.hcas[0].fw.qps[e.qp.qp_num].state
            if st != 3:                                        # RTS
                return f"had its QP {e.qp.qp_num:#x} moved to state {st}"
        return ""

    def round_trip(self) -> str:
        """A WRITE of the first half onto the second: '' when it completes and lands."""
        from userspace.libibverbs.pyverbs import SendWR
        a = self.ends[0]
        a.qp.post_send(SendWR(wr_id=1, opcode=v.IBV_WR_RDMA_WRITE,
                              send_flags=v.IBV_SEND_SIGNALED,
                              sg_list=[v.ibv_sge(self.mr.buf, 4096, self.mr.lkey)],
                              remote_addr=self.mr.buf + 4096, rkey=self.mr.rkey))
        wcs = a.cq.poll_until(1)
        if [wc.status for wc in wcs] != [0]:
            return f"could not WRITE: {[v.ibv_wc_status_str(wc.status) for wc in wcs]}"
        if self.mr.read(4096, 4096) != self.pattern[:4096]:
            return "WROTE, but the bytes did not arrive"
        return ""


class FuzzWorld:
    """Two hosts on a fabric and every object the operations made.  See the module docstring."""

    MAX_PROCS = 6
    STEP_SECONDS = 20.0

    def __init__(self, watchdog: bool = True, dyn_uar: int = 0, page_size: int = 4096) -> None:
        """Both hosts with `page_size` system pages and mlx5_ib's `dyn_uar`; a victim
        pair on host-a that no operation names (see check())."""
        self.fabric = Fabric()
        self.config = {"dyn_uar": dyn_uar, "page_size": page_size}
        self.hosts = [rdma_host(name="host-a", fabric=self.fabric, nr_gpus=1,
                                page_size=page_size),
                      rdma_host(name="host-b", fabric=self.fabric, page_size=page_size)]
        a, b = self.hosts
        a.load_module("mlx5_ib", dyn_uar=dyn_uar)
        a.load_module("nvidia")
        a.load_module("nv_peer_mem")
        b.load_module("mlx5_ib", dyn_uar=dyn_uar)
        self.objs: dict[str, list[Obj]] = {k: [] for k in (
            "proc", "ctx", "pd", "cq", "qp", "mr", "region", "gpu", "dom", "fimr")}
        self.watchdog = watchdog
        self.steps = 0
        self.log: list[tuple[str, dict]] = []
        self._bugs = [0, 0]
        self._actor: Any = None
        self.victim = Victim(a)
        self.spawn_count = 0

    # -- driving ---------------------------------------------------------------------
    def apply(self, name: str, kwargs: dict) -> None:
        """Run one operation, then check every invariant (FuzzFailure if one broke)."""
        self.log.append((name, dict(kwargs)))
        self.steps += 1
        fn = getattr(self, "op_" + name)
        self._actor = None                     # the process the op acts as (its first pick)
        old = None
        if self.watchdog:
            old = signal.signal(signal.SIGALRM, _alarm)
            signal.setitimer(signal.ITIMER_REAL, self.STEP_SECONDS)
        try:
            fn(**kwargs)
        except _EXPECTED:
            pass
        except SegmentationFault as e:        # SIGSEGV's default action kills the process
            if e.proc is not None:
                self._segv(e.proc)
        except StepTimeout:
            raise FuzzFailure(f"{name}: hang - still running after "
                              f"{self.STEP_SECONDS:.0f} s", (name, "hang")) from None
        except DeadlockError as e:
            raise FuzzFailure(f"{name}: deadlock\n{e}", (name, "deadlock")) from e
        except FuzzFailure:
            raise
        except Exception as e:
            raise FuzzFailure(f"{name}{kwargs}: {type(e).__name__}: {e}\n"
                              f"{traceback.format_exc()}", (name, type(e).__name__)) from e
        finally:
            if self.watchdog:
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
        self.check(name)

    def check(self, name: str = "") -> None:
        """The invariants after each step: no WARN, no dead kernel task."""
        for i, m in enumerate(self.hosts):
            if len(m.bugs) > self._bugs[i]:
                new = m.bugs[self._bugs[i]:]
                self._bugs[i] = len(m.bugs)
                raise FuzzFailure(f"{name}: {m.name}: " + "; ".join(new),
                                  (name, "WARN", new[0].split(":")[1]))
        why = self.victim.disturbed()
        if why:
            raise FuzzFailure(f"{name}: the victim, which no operation names, {why}",
                              (name, "victim"))
        if SCHED.failed:
            t = SCHED.failed[0]
            exc = "".join(traceback.format_exception(t.exc)) if t.exc else ""
            raise FuzzFailure(f"{name}: kernel task {t.name} died: {t.exc!r}\n{exc}",
                              (name, "task died", type(t.exc).__name__))

    def finish(self) -> None:
        """The victim still moves bytes; every process exits; both hosts shut down and
        must have leaked nothing."""
        why = self.victim.round_trip()
        if why:
            raise FuzzFailure(f"finish: the victim {why}", ("finish", "victim"))
        self.victim.retire()
        for o in self.objs["proc"]:
            if o.live:
                self._exit(o)
        self.check("finish")
        for m in self.hosts:
            m.check_leaks()
        self.check("finish")

    def close(self) -> None:
        """After a failure: take both hosts down as far as they go, quietly."""
        try:
            SCHED.abandon()
        except Exception:  # noqa: BLE001 - best effort after a failure already reported
            pass
        for m in self.hosts:
            m.leak_check_expected = False
            try:
                m.shutdown()
            except BaseException:  # noqa: BLE001 - best effort, see above
                pass
        SCHED.failed.clear()
        try:
            SCHED.abandon()
        except Exception:  # noqa: BLE001
            pass

    # -- object lookup ---------------------------------------------------------------
    def _pick(self, kind: str, i: int, live: bool = True) -> Obj | None:
        lst = self.objs[kind]
        if not lst:
            return None
        o = lst[i % len(lst)]
        if live and (not o.live or not o.proc.alive):
            return None
        if self._actor is None:
            self._actor = o.proc
        return o

    def _mine(self, kind: str, i: int, proc: Any, live: bool = True) -> Obj | None:
        """Like _pick, among the objects `proc` made (what a program mostly names)."""
        lst = [o for o in self.objs[kind] if o.proc is proc and (o.live or not live)]
        return lst[i % len(lst)] if lst else None

    def _add(self, kind: str, proc: Any, ref: Any, **extra: Any) -> Obj:
        o = Obj(kind, proc, ref, extra=extra)
        self.objs[kind].append(o)
        return o

    def _kill_children(self, owner: Any, kinds: tuple[str, ...]) -> None:
        for k in kinds:
            for o in self.objs[k]:
                if o.live and o.extra.get("owner") is owner:
                    o.live = False
                    self._kill_children(o, ("pd", "cq", "qp", "mr", "region"))

    def _exit(self, po: Obj) -> None:
        po.live = False
        if po.ref.alive:
            po.ref.exit(0)
        for k in self.objs:
            for o in self.objs[k]:
                if o.proc is po.ref:
                    o.live = False

    def _segv(self, proc: Any) -> None:
        """SIGSEGV's default action: the process dies (do_exit must complete)."""
        for po in self.objs["proc"]:
            if po.ref is proc and po.live:
                self._exit(po)

    # -- processes -------------------------------------------------------------------
    @op(host=Num(0, 1))
    def op_spawn(self, host: int) -> None:
        if sum(o.live for o in self.objs["proc"]) >= self.MAX_PROCS:
            return
        self.spawn_count += 1
        p = self.hosts[host % 2].spawn(f"fz{self.spawn_count}")
        self._add("proc", p, p, host=host % 2)

    @op(host=Num(0, 1), qp_type=Num(2, 4, (2, 2, 3)))
    def op_ladder(self, host: int, qp_type: int) -> None:
        """A well-behaved program's start, as one step: a process with a context, a PD,
        a CQ, a QP of `qp_type`, and 64 KiB of memory registered with every access
        (pyverbs tests' resource ladder); it keeps the world populated."""
        self.op_spawn(host)
        n = lambda kind: len(self.objs[kind]) - 1          # noqa: E731 - the newest
        self.op_open_device(n("proc"))
        self.op_alloc_pd(n("ctx"))
        self.op_create_cq(n("ctx"), 64)
        self.op_create_qp(n("pd"), 0, 0, qp_type, 16, 16, 2, 2, 64, 0)
        self.op_mmap(n("proc"), 1 << 16, 0, 0, 0, 3)
        self.op_reg_mr(n("pd"), -1, 0, 1 << 16, 0xF, 1)
        self.op_mmap(n("proc"), 1 << 12, 0, 0, 0, 1)     # a read-only page

    @op(proc=PICK)
    def op_exit(self, proc: int) -> None:
        po = self._pick("proc", proc)
        if po is not None:
            self._exit(po)

    @op(proc=PICK, fd=Num(0, 12))
    def op_close_fd(self, proc: int, fd: int) -> None:
        po = self._pick("proc", proc)
        if po is None:
            return
        po.ref.close(fd)
        for o in self.objs["ctx"]:    # the library's state names a closed fd now
            if o.proc is po.ref and o.live and o.ref.cmd_fd == fd:
                o.live = False          # the kernel destroyed everything the file held
                self._kill_children(o, ("pd", "cq"))

    # -- memory ----------------------------------------------------------------------
    @op(proc=PICK, length=LENGTH, where=PICK, off=OFFSET, fixed=Num(0, 1), prot=Num(0, 3))
    def op_mmap(self, proc: int, length: int, where: int, off: int, fixed: int,
                prot: int) -> None:
        po = self._pick("proc", proc)
        if po is None:
            return
        addr = 0
        flags = MAP_PRIVATE | MAP_ANONYMOUS
        if fixed:
            r = self._mine("region", where, po.ref, live=False)
            if r is None:
                return
            addr = (r.extra["addr"] + off) & ~0xFFF
            flags |= MAP_FIXED
        if not 0 < length <= 64 << 20 and not fixed:
            po.ref.mmap(addr, length & U64, prot, flags)   # must fail cleanly
            return
        ret = po.ref.mmap(addr, length & U64, prot, flags)
        if ret >= 0:
            self._add("region", po.ref, None, addr=ret, length=length, what="anon", prot=prot)

    @op(region=PICK, off=OFFSET, length=LENGTH)
    def op_munmap(self, region: int, off: int, length: int) -> None:
        r = self._pick("region", region, live=False)
        if r is None or not r.proc.alive:
            return
        r.proc.munmap((r.extra["addr"] + off) & U64, length & U64)

    @op(region=PICK, off=OFFSET, data=Blob(72))
    def op_store(self, region: int, off: int, data: bytes) -> None:
        """A plain CPU store into a region the process knows: anonymous memory, its SQ/RQ
        ring, its CQ ring, a doorbell record, a UAR page (doorbell and BlueFlame); one in
        eight into a region that may be gone (SIGSEGV)."""
        r = self._pick("region", region, live=region % 8 != 0)
        if r is None or not r.proc.alive:
            return
        r.proc.store((r.extra["addr"] + off % max(r.extra["length"], 1)) & U64, data)

    @op(proc=PICK, size=LENGTH)
    def op_cuda_malloc(self, proc: int, size: int) -> None:
        po = self._pick("proc", proc)
        if po is None or size <= 0 or size > 64 << 20:
            return
        from userspace.cuda.runtime import cudart
        try:
            rt = cudart(po.ref)
        except OSError:
            return
        va = rt.cudaMalloc(size)
        g = self._add("gpu", po.ref, rt, addr=va, length=size)
        self._add("region", po.ref, None, addr=va, length=size, what="gpu", gpu=g)

    @op(gpu=PICK)
    def op_cuda_free(self, gpu: int) -> None:
        g = self._pick("gpu", gpu)
        if g is None:
            return
        g.live = False
        g.ref.cudaFree(g.extra["addr"])

    # -- verbs objects ---------------------------------------------------------------
    @op(proc=PICK)
    def op_open_device(self, proc: int) -> None:
        po = self._pick("proc", proc)
        if po is None:
            return
        devs = v.ibv_get_device_list(po.ref)
        ctx = v.ibv_open_device(po.ref, devs[0])
        c = self._add("ctx", po.ref, ctx, owner=po)
        self._add("region", po.ref, None, addr=ctx.cmd_buf, length=CMD_BUF_SIZE, what="cmd")
        for uar in getattr(ctx, "uar", [])[:4]:         # its doorbell/BlueFlame pages
            self._add("region", po.ref, None, addr=uar.reg, length=4096, what="uar")
        c.extra["bufs"] = []

    @op(ctx=PICK)
    def op_close_device(self, ctx: int) -> None:
        c = self._pick("ctx", ctx)
        if c is None:
            return
        c.live = False
        self._kill_children(c, ("pd", "cq"))
        v.ibv_close_device(c.ref)

    @op(ctx=PICK)
    def op_alloc_pd(self, ctx: int) -> None:
        c = self._pick("ctx", ctx)
        if c is None:
            return
        self._add("pd", c.proc, v.ibv_alloc_pd(c.ref), owner=c)

    @op(pd=PICK)
    def op_dealloc_pd(self, pd: int) -> None:
        o = self._pick("pd", pd)
        if o is None:
            return
        if v.ibv_dealloc_pd(o.ref) == 0:
            o.live = False

    @op(ctx=PICK, cqe=CQE)
    def op_create_cq(self, ctx: int, cqe: int) -> None:
        c = self._pick("ctx", ctx)
        if c is None:
            return
        cq = v.ibv_create_cq(c.ref, cqe)
        o = self._add("cq", c.proc, cq, owner=c)
        self._add("region", c.proc, None, addr=cq.buf, length=cq.buf_size, what="cq",
                  owner=o)
        self._add("region", c.proc, None, addr=cq.dbrec, length=8, what="cq_db", owner=o)

    @op(cq=PICK)
    def op_destroy_cq(self, cq: int) -> None:
        o = self._pick("cq", cq)
        if o is None:
            return
        if v.ibv_destroy_cq(o.ref) == 0:
            o.live = False

    @op(pd=PICK, scq=PICK, rcq=PICK, qp_type=Num(0, 12, (2, 2, 3, 4)), swr=CAP, rwr=CAP,
        ssge=CAP, rsge=CAP, inline=CAP, sig_all=Num(0, 1))
    def op_create_qp(self, pd: int, scq: int, rcq: int, qp_type: int, swr: int, rwr: int,
                     ssge: int, rsge: int, inline: int, sig_all: int) -> None:
        o = self._pick("pd", pd)
        if o is None:
            return      # (a foreign CQ is another process's memory: cmd_mangle names one)
        s, r = self._mine("cq", scq, o.proc), self._mine("cq", rcq, o.proc)
        if s is None or r is None:
            return
        cap = v.ibv_qp_cap(swr, rwr, ssge, rsge, inline)
        qp = v.ibv_create_qp(o.ref, v.ibv_qp_init_attr(send_cq=s.ref, recv_cq=r.ref, cap=cap,
                                                       qp_type=qp_type, sq_sig_all=sig_all))
        q = self._add("qp", o.proc, qp, owner=o)
        if qp.buf:
            self._add("region", o.proc, None, addr=qp.buf, length=qp.buf_size, what="wq",
                      owner=q)
        if qp.db:
            self._add("region", o.proc, None, addr=qp.db, length=8, what="qp_db", owner=q)
        if getattr(qp, "bf", None) is not None and qp.bf.reg:    # its BlueFlame register
            self._add("region", o.proc, None, addr=qp.bf.reg & ~0xFFF, length=4096,
                      what="uar", owner=q)

    @op(qp=PICK)
    def op_destroy_qp(self, qp: int) -> None:
        o = self._pick("qp", qp)
        if o is None:
            return
        if v.ibv_destroy_qp(o.ref) == 0:
            o.live = False

    @op(qp=PICK, peer=PICK, psn=Num(0, 0xFFFFFF, (0,)), mtu=Num(0, 6, (3, 3)),
        access=ACCESS, port=Num(0, 3, (1, 1)))
    def op_connect(self, qp: int, peer: int, psn: int, mtu: int, access: int,
                   port: int) -> None:
        """RESET -> INIT -> RTR -> RTS against any QP (either host), as perftest does."""
        o, p = self._pick("qp", qp), self._pick("qp", peer, live=False)
        if o is None or p is None:
            return
        gid = v.ibv_query_gid(p.extra["owner"].extra["owner"].ref, 1, 0) if p.live else bytes(16)
        from userspace.libibverbs.pyverbs import QP as PyQP
        v.ibv_modify_qp(o.ref, v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE)
        shim = PyQP.__new__(PyQP)
        shim.qp = o.ref
        shim.to_rts(gid, p.ref.qp_num, sq_psn=psn, rq_psn=psn, path_mtu=mtu, access=access,
                    port_num=port, retry_cnt=1, rnr_retry=1)
        o.extra["peer"] = p

    @op(qp=PICK, state=Num(0, 7), mask=Num(0, (1 << 26) - 1, (1, 0x31, 0x39, 0x1E1, 0x12E01)),
        value=Num(0, U32, (0, 1, 7, 255, U32)))
    def op_modify_qp(self, qp: int, state: int, mask: int, value: int) -> None:
        """ibv_modify_qp with a random mask and every attribute set to one value."""
        o = self._pick("qp", qp)
        if o is None:
            return
        b = value & 0xFF
        attr = v.ibv_qp_attr(qp_state=state, cur_qp_state=state, path_mtu=b & 7,
                             qkey=value, rq_psn=value & 0xFFFFFF, sq_psn=value & 0xFFFFFF,
                             dest_qp_num=value & 0xFFFFFF, qp_access_flags=value,
                             pkey_index=value & 0xFFFF)
        for name in ("port_num", "timeout", "retry_cnt", "rnr_retry", "min_rnr_timer",
                     "max_rd_atomic", "max_dest_rd_atomic", "sq_draining",
                     "en_sqd_async_notify", "alt_port_num", "alt_timeout"):
            if hasattr(attr, name):
                setattr(attr, name, b)
        v.ibv_modify_qp(o.ref, attr, mask)

    @op(pd=PICK, region=PICK, off=OFFSET, length=LENGTH, access=ACCESS, foreign=Num(0, 7))
    def op_reg_mr(self, pd: int, region: int, off: int, length: int, access: int,
                  foreign: int) -> None:
        """ibv_reg_mr over one of the process's regions (or, 1 in 8, anyone's)."""
        o = self._pick("pd", pd)
        if o is None:
            return
        r = (self._pick("region", region, live=False) if foreign == 0
             else self._mine("region", region, o.proc, live=False))
        addr = (r.extra["addr"] + off) & U64 if r is not None else off & U64
        mr = v.ibv_reg_mr(o.ref, addr, length & U64, access & U32)
        self._add("mr", o.proc, mr, owner=o, addr=addr, length=length)

    @op(gpu=PICK, pd=PICK, off=OFFSET, length=LENGTH, access=ACCESS)
    def op_reg_dmabuf_mr(self, gpu: int, pd: int, off: int, length: int, access: int) -> None:
        g = self._pick("gpu", gpu)
        o = self._mine("pd", pd, g.proc) if g is not None else None
        if g is None or o is None:
            return
        fd = g.ref.cuMemGetHandleForAddressRange(g.extra["addr"], g.extra["length"], 1, 0)
        try:
            mr = v.ibv_reg_dmabuf_mr(o.ref, off & U64, length & U64, 0, fd, access & U32)
            self._add("mr", o.proc, mr, owner=o, addr=0, length=length)
        finally:
            o.proc.close(fd)

    @op(mr=PICK)
    def op_dereg_mr(self, mr: int) -> None:
        o = self._pick("mr", mr)
        if o is None:
            return
        if v.ibv_dereg_mr(o.ref) == 0:
            o.live = False

    # -- the data path ---------------------------------------------------------------
    @op(qp=PICK, opcode=Num(0, 6, (0, 0, 2, 4)), lmr=PICK, loff=OFFSET, length=LENGTH,
        rmr=PICK, roff=OFFSET, flags=FLAGS, keys=Num(0, 3), nsge=Num(0, 3, (1, 1)))
    def op_post_send(self, qp: int, opcode: int, lmr: int, loff: int, length: int, rmr: int,
                     roff: int, flags: int, keys: int, nsge: int) -> None:
        """A send WR with keys of any MR in the world: own, foreign, stale or random."""
        o = self._pick("qp", qp)
        if o is None:
            return
        peer = o.extra.get("peer")
        lm = (self._mine("mr", lmr, o.proc, live=False) if keys != 3
              else self._pick("mr", lmr, live=False))
        rm = (self._mine("mr", rmr, peer.proc, live=False) if peer is not None and keys != 3
              else self._pick("mr", rmr, live=False))
        lkey = lm.ref.lkey if lm else 0
        rkey = rm.ref.rkey if rm else 0
        if keys == 1:
            lkey, rkey = rkey, lkey
        elif keys == 2:
            lkey, rkey = (lkey * 0x9E3779B1) & U32, (rkey * 0x85EBCA77) & U32
        laddr = ((lm.ref.addr if lm else 0) + loff) & U64
        raddr = ((rm.ref.addr if rm else 0) + roff) & U64
        n = length & U32 if not flags & v.IBV_SEND_INLINE else min(length & U32, 1 << 20)
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=opcode, send_flags=flags,
                           sg_list=[v.ibv_sge(laddr, n, lkey)] * nsge,
                           remote_addr=raddr, rkey=rkey, imm_data=0x12345678)
        v.ibv_post_send(o.ref, wr, [])
        self._progress(o.proc)

    @op(qp=PICK, mr=PICK, off=OFFSET, length=LENGTH, nsge=Num(0, 3, (1, 1)))
    def op_post_recv(self, qp: int, mr: int, off: int, length: int, nsge: int) -> None:
        o = self._pick("qp", qp)
        if o is None:
            return
        m = self._mine("mr", mr, o.proc, live=False)
        addr = ((m.ref.addr if m else 0) + off) & U64
        wr = v.ibv_recv_wr(wr_id=self.steps,
                           sg_list=[v.ibv_sge(addr, length & U32, m.ref.lkey if m else 0)] * nsge)
        v.ibv_post_recv(o.ref, wr, [])

    @op(cq=PICK, n=Num(0, 16, (1, 16)))
    def op_poll_cq(self, cq: int, n: int) -> None:
        o = self._pick("cq", cq)
        if o is None:
            return
        self._progress(o.proc)
        for wc in v.ibv_poll_cq(o.ref, n):
            assert 0 <= wc.status <= 21, f"poll_cq: status {wc.status} out of range"

    def _progress(self, proc: Any) -> None:
        """Let the HCAs run: the process yields the CPU a few times."""
        for _ in range(8):
            if not proc.alive or proc.sched_yield() != 0:
                break

    # -- raw kernel crossings ----------------------------------------------------------
    @op(ctx=PICK, command=Num(0, 40, (4, 13, 20, 25, 26, 27, 0x80000004, 1 << 24, U32)),
        handle_of=PICK, kind=Num(0, 4), payload=Blob(96), resp=Num(0, 6), words=Num(0, 3))
    def op_raw_write(self, ctx: int, command: int, handle_of: int, kind: int, payload: bytes,
                     resp: int, words: int) -> None:
        """write() of a uverbs command built by hand: any command word, a handle of any
        object in the world (another file's, a stale one), a random payload, and the
        response pointer aimed at the scratch page, a UAR page, a read-only page, a GPU
        page, an unmapped address or NULL."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        kinds = ("pd", "mr", "cq", "qp", "ctx")
        h = self._pick(kinds[kind % 5], handle_of, live=False)
        handle = getattr(h.ref, "handle", 0) if h is not None else handle_of
        target = self._resp_target(c, resp)
        hdr_words = (2 + len(payload) // 4 + 2) if words == 0 else (words * 37) & 0xFFFF
        body = struct.pack("<QI", target, handle) + payload
        hdr = uv.ib_uverbs_cmd_hdr(command=command & U32, in_words=hdr_words & 0xFFFF,
                                   out_words=(len(payload) // 4) & 0xFFFF)
        buf = c.ref.cmd_buf
        raw = hdr.pack() + body
        c.proc.store(buf, raw[:RESP_OFFSET])
        c.proc.write(c.ref.cmd_fd, buf, len(raw) if words != 3 else (1 << 20))

    @op(ctx=PICK, cmd=Num(0, 3), handle_of=PICK, kind=Num(0, 4))
    def op_foreign_destroy(self, ctx: int, cmd: int, handle_of: int, kind: int) -> None:
        """A well-formed destroy command naming a handle this file may never have issued."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        kinds = ("pd", "mr", "cq", "qp", "ctx")
        h = self._pick(kinds[kind % 5], handle_of, live=False)
        handle = getattr(h.ref, "handle", handle_of) if h is not None else handle_of
        table = [("pd", uv.IB_USER_VERBS_CMD_DEALLOC_PD,
                  uv.ib_uverbs_dealloc_pd(pd_handle=handle), None),
                 ("mr", uv.IB_USER_VERBS_CMD_DEREG_MR, uv.ib_uverbs_dereg_mr(mr_handle=handle),
                  None),
                 ("cq", uv.IB_USER_VERBS_CMD_DESTROY_CQ,
                  uv.ib_uverbs_destroy_cq(cq_handle=handle), uv.ib_uverbs_destroy_cq_resp),
                 ("qp", uv.IB_USER_VERBS_CMD_DESTROY_QP,
                  uv.ib_uverbs_destroy_qp(qp_handle=handle), uv.ib_uverbs_destroy_qp_resp)]
        what, command, req, resp = table[cmd % 4]
        mine = [o for o in self.objs[what] if o.live and o.ref.handle == handle
                and self._ctx_of(o) is c]
        if mine or c.extra.get("untracked"):   # (a mangled create may have made it)
            return          # destroying one's own live object goes through the verbs ops
        try:
            execute_write(c.ref, command, req, resp, what="foreign destroy")
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL, errno.EBADF, errno.EIO):
                raise FuzzFailure(f"foreign destroy: unexpected errno {e.errno}",
                                  ("foreign_destroy", "errno")) from e
            return
        raise FuzzFailure(f"destroying {what} handle {handle}, which this file never issued "
                          "(or destroyed already), succeeded", ("foreign_destroy", "succeeded"))

    def _ctx_of(self, o: Obj) -> Obj | None:
        while o is not None and o.kind != "ctx":
            o = o.extra.get("owner")
        return o

    @op(ctx=PICK, which=Num(0, 3), cut=Num(0, 40), flip=Num(0, 1023), pd=PICK, cq=PICK)
    def op_cmd_mangle(self, ctx: int, which: int, cut: int, flip: int, pd: int,
                      cq: int) -> None:
        """A well-formed command (REG_MR, CREATE_CQ, CREATE_QP, MODIFY_QP) with one bit
        flipped and its in_words cut short, written as rdma-core would write it."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        p, q = self._mine("pd", pd, c.proc, live=False), self._pick("cq", cq, live=False)
        ph, qh = (p.ref.handle if p else pd), (q.ref.handle if q else cq)
        buf = c.ref.cmd_buf
        reqs = [(uv.IB_USER_VERBS_CMD_REG_MR,
                 uv.ib_uverbs_reg_mr(start=buf, length=4096, hca_va=buf, pd_handle=ph,
                                     access_flags=1)),
                (uv.IB_USER_VERBS_CMD_CREATE_CQ,
                 uv.ib_uverbs_create_cq(user_handle=0, cqe=8, comp_vector=0,
                                        comp_channel=-1)),
                (uv.IB_USER_VERBS_CMD_CREATE_QP,
                 uv.ib_uverbs_create_qp(pd_handle=ph, send_cq_handle=qh, recv_cq_handle=qh,
                                        max_send_wr=1, max_recv_wr=1, max_send_sge=1,
                                        max_recv_sge=1, qp_type=2)),
                (uv.IB_USER_VERBS_CMD_MODIFY_QP,
                 uv.ib_uverbs_modify_qp(qp_handle=qh, attr_mask=1, qp_state=1))]
        command, req = reqs[which % 4]
        if hasattr(req, "response"):
            req.response = buf + RESP_OFFSET
        body = bytearray(req.pack())
        if body:
            body[(flip >> 3) % len(body)] ^= 1 << (flip & 7)
        words = (uv.ib_uverbs_cmd_hdr.SIZE + len(body)) // 4
        hdr = uv.ib_uverbs_cmd_hdr(command=command, in_words=max(words - cut, 0),
                                   out_words=16)
        c.proc.store(buf, hdr.pack() + bytes(body))
        ret = c.proc.write(c.ref.cmd_fd, buf, max(words - cut, 0) * 4)
        if ret > 0 and which % 4 in (0, 1, 2):
            # a mangled create that succeeded made an object the library does not know:
            # the process holds it until the file closes (foreign_destroy then skips c)
            c.extra.setdefault("untracked", []).append(command)

    @op(proc=PICK, mode=Num(0, 0x3FF, (0x2C, 0x6C, 0x1FC)), hmem=Num(0, 1))
    def op_fi_domain(self, proc: int, mode: int, hmem: int) -> None:
        """fi_domain with random mr_mode bits (the cache where they allow it)."""
        po = self._pick("proc", proc)
        if po is None:
            return
        from userspace.libfabric import fi_mr
        ret, dom = fi_mr.fi_domain(po.ref, mode, fi_mr.FI_HMEM if hmem else 0)
        if ret == 0 and dom is not None:
            self._add("dom", po.ref, dom)

    @op(dom=PICK, region=PICK, off=OFFSET, length=LENGTH, access=Num(0, 0x3FFF, (0x300, 0)))
    def op_fi_mr_reg(self, dom: int, region: int, off: int, length: int, access: int) -> None:
        d = self._pick("dom", dom)
        if d is None:
            return
        r = self._mine("region", region, d.proc, live=False)
        from userspace.libfabric import fi_mr
        addr = (r.extra["addr"] + off) & U64 if r is not None else off & U64
        ret, mr = fi_mr.fi_mr_reg(d.ref, addr, length & U64, access, 0, 0, 0)
        if ret == 0 and mr is not None:
            self._add("fimr", d.proc, mr, owner=d)

    @op(fid=PICK, kind=Num(0, 1))
    def op_fi_close(self, fid: int, kind: int) -> None:
        """fi_close of an MR or a domain (twice is -FI_EINVAL; a domain with MRs EBUSY)."""
        o = self._pick(("fimr", "dom")[kind], fid)
        if o is None:
            return
        from userspace.libfabric import fi_mr
        if fi_mr.fi_close(o.ref) == 0:
            o.live = False

    def _resp_target(self, c: Obj, which: int) -> int:
        buf = c.ref.cmd_buf
        if which == 0:
            return buf + RESP_OFFSET
        if which == 1:
            uars = getattr(c.ref, "uar", [])
            return uars[0].reg if uars else 0
        if which == 2:
            g = next((o for o in self.objs["gpu"] if o.proc is c.proc and o.live), None)
            return g.extra["addr"] if g else 0x1000
        if which == 3:
            ro = [r for r in self.objs["region"] if r.proc is c.proc and r.extra.get("prot") == 1]
            return ro[-1].extra["addr"] if ro else 0xDEAD0000
        if which == 4:
            return U64 - 7
        if which == 5:
            return 0xDEAD0000                  # unmapped
        return 0

    @op(ctx=PICK, pgoff=Num(0, 64, (0, 1, 2, 3, 8, 1 << 8, 1 << 16, 0x1000, 1 << 40)),
        length=LENGTH, prot=Num(0, 3), shared=Num(0, 1))
    def op_mmap_dev(self, ctx: int, pgoff: int, length: int, prot: int, shared: int) -> None:
        """mmap of the uverbs file at a random offset (vm_pgoff) and length."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        flags = MAP_SHARED if shared else MAP_PRIVATE
        ret = c.proc.mmap(0, length & U64, prot, flags, c.ref.cmd_fd, (pgoff << 12) & U64)
        if ret >= 0:
            self._add("region", c.proc, None, addr=ret, length=length, what="dev")

    @op(ctx=PICK, cmd=Num(0, U32, (0xC0181B01, 0xC0101B01, 0x1B01, 0)), arg=Num(0, 2))
    def op_raw_ioctl(self, ctx: int, cmd: int, arg: int) -> None:
        """ioctl() on the uverbs file: a random command word, the argument pointing at
        random bytes in the scratch page, at NULL or at an unmapped address."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        target = (c.ref.cmd_buf, 0, 0xDEAD0000)[arg]
        c.proc.ioctl(c.ref.cmd_fd, cmd, target)


def _alarm(signum: int, frame: Any) -> None:
    raise StepTimeout()


# -- the campaign: random sequences, shrinking, a reproducer ---------------------------------
def draw_op(rng: random.Random) -> tuple[str, dict]:
    """One random operation, by the weights below."""
    name = rng.choice(_WEIGHTED)
    return name, {k: d.draw(rng) for k, d in OPS[name].items()}


def draw_config(rng: random.Random) -> dict:
    """The hosts a sequence runs on: mostly the default, else dynamic UARs and/or
    16 or 64 KiB system pages (whose UAR paths differ)."""
    return {"dyn_uar": rng.choice((0, 0, 1)),
            "page_size": rng.choice((4096, 4096, 4096, 16384, 65536))}


def draw_sequence(rng: random.Random, length: int) -> list[tuple[str, dict]]:
    """A sequence that starts as programs do - three ladders on both hosts, their QPs
    connected - and goes on with random operations."""
    ops = [("ladder", {"host": h, "qp_type": 2}) for h in (0, 1, 0)]
    ops += [("connect", {"qp": a, "peer": b, "psn": 0, "mtu": 3, "access": 7, "port": 1})
            for a, b in ((0, 1), (1, 0), (2, 1))]
    while len(ops) < length:
        ops.append(draw_op(rng))
    return ops


_WEIGHT = {"ladder": 3, "spawn": 1, "open_device": 3, "alloc_pd": 3, "create_cq": 3, "create_qp": 4,
           "reg_mr": 4, "connect": 4, "post_send": 5, "post_recv": 3, "poll_cq": 4,
           "mmap": 3, "store": 4, "exit": 1, "close_fd": 1, "close_device": 1}
_WEIGHTED = [n for n in OPS for _ in range(_WEIGHT.get(n, 2))]


def run_sequence(ops: list[tuple[str, dict]], watchdog: bool = True,
                 config: dict | None = None) -> FuzzFailure | None:
    """Replay `ops` on a fresh world (built with `config`); the failure it ends in, or
    None."""
    w = FuzzWorld(watchdog=watchdog, **(config or {}))
    try:
        for name, kw in ops:
            w.apply(name, kw)
        w.finish()
    except FuzzFailure as e:
        w.close()
        return e
    except Exception as e:  # noqa: BLE001 - a leak check or teardown failure is a finding
        w.close()
        return FuzzFailure(f"finish: {type(e).__name__}: {e}", ("finish", type(e).__name__))
    return None


def _same(a: FuzzFailure, b: FuzzFailure | None) -> bool:
    return b is not None and b.sig == a.sig


def shrink(ops: list[tuple[str, dict]], failure: FuzzFailure, deadline: float,
           config: dict | None = None) -> list[tuple[str, dict]]:
    """Delta debugging (ddmin) over the sequence: drop chunks while the same failure
    (same operation and first words) still happens, until one op at a time is tried."""
    n = 2
    while len(ops) >= 2 and time.monotonic() < deadline:
        chunk = max(1, len(ops) // n)
        reduced = False
        for i in range(0, len(ops), chunk):
            cand = ops[:i] + ops[i + chunk:]
            if _same(failure, run_sequence(cand, config=config)):
                ops, n, reduced = cand, max(n - 1, 2), True
                break
        if not reduced:
            if chunk == 1:
                break
            n = min(len(ops), n * 2)
    return ops


def reproducer(ops: list[tuple[str, dict]], config: dict | None = None) -> str:
    """The sequence as a runnable Python script (on hosts built with `config`)."""
    args = ", ".join(f"{k}={val!r}" for k, val in (config or {}).items())
    lines = ["from peermem_testing.fuzz import FuzzWorld", "", f"w = FuzzWorld({args})"]
    for name, kw in ops:
        args = ", ".join(f"{k}={val!r}" for k, val in kw.items())
        lines.append(f"w.apply({name!r}, dict({args}))")
    lines.append("w.finish()")
    return "\n".join(lines) + "\n"


@dataclass
class CampaignResult:
    operations: int = 0
    sequences: int = 0
    seconds: float = 0.0
    failure: FuzzFailure | None = None
    minimal: list = field(default_factory=list)
    config: dict = field(default_factory=dict)


def run_campaign(seconds: float, seed: int, length: int = 200,
                 progress: Callable[[CampaignResult], None] | None = None) -> CampaignResult:
    """`peermem fuzz`: sequences of `length` random operations on fresh worlds until
    `seconds` pass or one fails; a failure is shrunk (within a fifth of the budget,
    at least 60 s)."""
    res = CampaignResult()
    t0 = time.monotonic()
    rng = random.Random(seed)
    last = t0
    while time.monotonic() - t0 < seconds:
        ops = draw_sequence(rng, length)
        config = draw_config(rng)
        w = FuzzWorld(**config)
        done = 0
        failure = None
        try:
            for name, kw in ops:
                done += 1
                w.apply(name, kw)
            w.finish()
        except FuzzFailure as e:
            failure = e
        except Exception as e:  # noqa: BLE001 - leak check
            failure = FuzzFailure(f"finish: {type(e).__name__}: {e}",
                                  ("finish", type(e).__name__))
        if failure is not None:
            w.close()
        res.operations += done
        res.sequences += 1
        res.seconds = time.monotonic() - t0
        if failure is not None:
            res.failure = failure
            budget = max(60.0, seconds / 5)
            res.config = config
            res.minimal = shrink(ops[:done], failure, time.monotonic() + budget, config)
            return res
        if progress is not None and time.monotonic() - last >= 1.0:
            last = time.monotonic()
            progress(res)
    return res


def fuzz_main(seconds: float, seed: int, length: int, out: Any, err: Any) -> int:
    """`peermem fuzz`: run a campaign, a progress line on `err` once a second; 0 when
    nothing failed, 1 with the failure and its minimal sequence (runnable Python) on
    `out`."""
    tty = err.isatty()
    shown = [0.0]

    def progress(r: CampaignResult) -> None:
        """Each second on a terminal (one line, rewritten); every 30 s into a file."""
        if not tty and r.seconds - shown[0] < 30:
            return
        shown[0] = r.seconds
        err.write(f"{chr(13) if tty else ''}fuzz: {r.operations} operations, "
                  f"{r.sequences} sequences, {r.seconds:.0f}/{seconds:.0f} s, "
                  f"{r.operations / max(r.seconds, 1e-9):.0f} ops/s{'' if tty else chr(10)}")
        err.flush()

    r = run_campaign(seconds, seed, length, progress)
    if tty:
        err.write("\n")
    rate = r.operations / max(r.seconds, 1e-9)
    out.write(f"fuzz: seed {seed}: {r.operations} operations in {r.sequences} sequences, "
              f"{r.seconds:.1f} s, {rate:.0f} ops/s\n")
    if r.failure is None:
        out.write("no failure: every call returned or failed with an errno, no WARN, "
                  "no dead task, no leak\n")
        return 0
    out.write(f"FAILED: {str(r.failure).splitlines()[0]}\n")
    out.write(f"minimal sequence ({len(r.minimal)} operations), as Python:\n\n")
    out.write(reproducer(r.minimal, r.config))
    return 1
