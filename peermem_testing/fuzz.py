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
point.  The verbs added for rdma-core's suite have their operations too:
address handles and UD sends (GRH, Q_Key), SRQs and QPs on them, XRC domains,
SRQs and both QP roles with XRC sends, memory windows of both types (bind,
invalidate, access through the window's rkey), device memory, ODP MRs with
munmap / MADV_DONTNEED racing the traffic over them, completion channels and CQ
events, resize_cq, rereg_mr and the extended QP's ibv_wr_* batches - with the
hostile variants: destroys in the wrong order or twice, stale windows, AHs and
SRQ numbers, garbage stored over a posted BIND_MW / XRC / UD WQE before the HCA
reads it and into an SRQ's ring and doorbell record, and a process exiting (or
closing its device or fd) with one of everything live.  The data-path operations
of these newer verbs keep their QPs moving as programs do: they post receives
for what they send, poll what completes and bring a QP found in ERR back to RTS
half the time.

After every operation the invariants are checked (`FuzzWorld.check`):
  * the call succeeded, or failed as a process sees a failure: an errno
    (VerbsError, SysError, CudaError), a completion status on the data path,
    or SIGSEGV for a store to memory the process does not have (the
    process is then killed, and its exit must complete);
  * no WARN recorded on either host (Machine.bugs), no kernel task died
    (SCHED.failed), no deadlock, and the step ended within the watchdog's
    time (a hang is a failure);
and `finish()` lets the HCAs run until no RC work request of a QP in RTS still waits
for its answer (a data-path stall is a failure: every retry budget of the device is
finite), exits every process and runs check_leaks() on both hosts.

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
from userspace.libibverbs import verbs_cq as vcq
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
QKEY = 0x11111111                                  # the Q_Key UD QPs are given

WR = Num(0, 64, (1, 16, 16, 1 << 16, U32))           # a queue's size: mostly fits
SGE = Num(0, 8, (1, 1, 2, 64, U32))
OPS: dict[str, dict[str, Num | Blob]] = {}
# what a closed device or file takes with it (an object's "owner" chain leads to its ctx)
_CHILD_KINDS = ("pd", "cq", "qp", "mr", "region", "ah", "srq", "xrcd", "mw", "dm", "chan")


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
            "proc", "ctx", "pd", "cq", "qp", "mr", "region", "gpu", "dom", "fimr",
            "ah", "srq", "xrcd", "mw", "dm", "chan")}
        self.watchdog = watchdog
        self.steps = 0
        self.log: list[tuple[str, dict]] = []
        self._bugs = [0, 0]
        self._actor: Any = None
        self.victim = Victim(a)
        self.spawn_count = 0
        self.completions: dict[tuple[int, int], int] = {}   # (opcode, status): reaped

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
        self._check_drained()
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

    DRAIN_YIELDS = 400

    def _check_drained(self) -> None:
        """No data-path stall: every RC work request a QP in RTS has on the wire gets its
        answer - the fuzz connects with retry_cnt and rnr_retry 1, and every limit of the
        device (RNR retries, page-fault retries, the transport timeout) is finite - so
        after the HCAs had their turns no QP still waits.  A QP someone set to retry an
        RNR NAK forever (rnr_retry 7) is left out."""
        from kernel_model.hw.mlx5_engine import engine_of

        def stuck() -> list[str]:
            out = []
            for m in self.hosts:
                eng = engine_of(m.hcas[0])
                for qpn, hw in eng.qps.items():
                    qp = m.hcas[0].fw.qps.get(qpn)
                    if qp is None or qp.state != 3 or not hw.outstanding or \
                            eng._c(qp)["rnr_retry"] == 7:
                        continue
                    out.append(f"{m.name} QP {qpn:#x}: {len(hw.outstanding)} WQEs outstanding")
            return out

        for _ in range(self.DRAIN_YIELDS):
            if not stuck() or not self.victim.p.alive:
                return
            self.victim.p.sched_yield()
        left = stuck()
        if left:
            raise FuzzFailure("finish: the data path stalled: " + "; ".join(left),
                              ("finish", "stalled"))

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
                    self._kill_children(o, _CHILD_KINDS)

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
                self._kill_children(o, _CHILD_KINDS)

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
        self._kill_children(c, _CHILD_KINDS)
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

    # -- the verbs rdma-core's suite added: AHs and UD, SRQs, XRC, MWs, DM, ODP, ------
    # -- completion channels, resize_cq, rereg_mr, the extended QP's ibv_wr_* posting --
    def _ctx_obj(self, o: Obj) -> Any:
        c = self._ctx_of(o)
        return c.ref if c is not None else None

    def _to_rts(self, qp: Any, dgid: bytes, dqpn: int, psn: int, mtu: int, access: int,
                port: int, qkey: int) -> None:
        """RESET -> INIT -> RTR -> RTS with the attributes each step needs for the QP's
        type (the kernel's qp_state_table: UD takes a Q_Key, XRC_RECV is RC-like without
        a send side, XRC_SEND has no responder attributes)."""
        t = qp.qp_type
        ud = t == v.IBV_QPT_UD
        v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RESET), v.IBV_QP_STATE)
        init = v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT
        init |= v.IBV_QP_QKEY if ud else v.IBV_QP_ACCESS_FLAGS
        if v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, pkey_index=0,
                                             port_num=port, qp_access_flags=access,
                                             qkey=qkey), init):
            return
        rtr = v.IBV_QP_STATE
        if not ud:
            rtr |= v.IBV_QP_AV | v.IBV_QP_PATH_MTU | v.IBV_QP_DEST_QPN | v.IBV_QP_RQ_PSN
        if t in (v.IBV_QPT_RC, v.IBV_QPT_XRC_RECV):
            rtr |= v.IBV_QP_MAX_DEST_RD_ATOMIC | v.IBV_QP_MIN_RNR_TIMER
        ah = v.ibv_ah_attr(grh=v.ibv_global_route(dgid=dgid, sgid_index=0, hop_limit=1),
                           is_global=1, port_num=port)
        if v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTR, path_mtu=mtu,
                                             dest_qp_num=dqpn, rq_psn=psn,
                                             max_dest_rd_atomic=1, min_rnr_timer=12,
                                             ah_attr=ah), rtr):
            return
        if t == v.IBV_QPT_XRC_RECV:
            return                                   # a target has no send side
        rts = v.IBV_QP_STATE | v.IBV_QP_SQ_PSN
        if t in (v.IBV_QPT_RC, v.IBV_QPT_XRC_SEND):
            rts |= v.IBV_QP_TIMEOUT | v.IBV_QP_RETRY_CNT | v.IBV_QP_RNR_RETRY | \
                v.IBV_QP_MAX_QP_RD_ATOMIC
        v.ibv_modify_qp(qp, v.ibv_qp_attr(qp_state=v.IBV_QPS_RTS, sq_psn=psn, timeout=14,
                                          retry_cnt=1, rnr_retry=1, max_rd_atomic=1), rts)

    def _reap(self, *qps: Obj | None) -> None:
        """The QPs' processes run and poll their CQs, as a program does after posting (so
        the queues keep moving); every status must be one ibv_wc_status has."""
        for o in qps:
            if o is None or not o.live or not o.proc.alive:
                continue
            self._progress(o.proc)
            for cq in {id(c): c for c in (o.ref.send_cq, o.ref.recv_cq) if c is not None}.values():
                for wc in v.ibv_poll_cq(cq, 16):
                    assert 0 <= wc.status <= 21, f"poll_cq: status {wc.status} out of range"
                    k = (wc.opcode, wc.status)
                    self.completions[k] = self.completions.get(k, 0) + 1

    def _ctx_mine(self, kind: str, i: int, like: Obj, live: bool = True) -> Obj | None:
        """Like _mine, among the objects of `like`'s own context (file): what a program
        hands a verb together - the library keeps the object, so one of the process's
        other context would be a misuse that confuses only the library (found by
        `peermem fuzz --seed 93`: a QP on another context's CQ object left its CQEs
        uncleaned at destroy, and a later QP reusing its user index got them)."""
        c = self._ctx_of(like)
        lst = [o for o in self.objs[kind] if o.proc is like.proc and (o.live or not live)
               and self._ctx_of(o) is c]
        return lst[i % len(lst)] if lst else None

    def _recover(self, o: Obj | None, i: int) -> None:
        """Half the time (i odd) a QP ibv_query_qp finds in ERR is brought back to RTS
        against its peer, as a program recovers; so traffic keeps reaching the device."""
        if o is None or not i & 1 or not o.live or not o.proc.alive:
            return
        attr, _ = v.ibv_query_qp(o.ref, v.IBV_QP_STATE)
        peer = o.extra.get("peer")
        if attr.qp_state != v.IBV_QPS_ERR or (peer is None and o.ref.qp_type != v.IBV_QPT_UD):
            return
        self._to_rts(o.ref, self._gid_of(peer), peer.ref.qp_num if peer else 0, 0, 3, 7, 1,
                     QKEY)

    def _recv_on(self, o: Obj | None, n: int = 1) -> None:
        """n receives of 4 KiB into the QP's (or SRQ's) process's first MR, as the receiving
        program keeps posting them."""
        if o is None or not o.live or not o.proc.alive:
            return
        m = self._mine("mr", 0, o.proc)
        if m is None:
            return
        wr = v.ibv_recv_wr(wr_id=self.steps, sg_list=[v.ibv_sge(m.ref.addr, 4096, m.ref.lkey)])
        for _ in range(n):
            if o.kind == "srq":
                v.ibv_post_srq_recv(o.ref, wr, [])
            elif o.ref.srq is None and o.ref.qp_type in (v.IBV_QPT_UD, v.IBV_QPT_RC,
                                                         v.IBV_QPT_UC):
                v.ibv_post_recv(o.ref, wr, [])

    def _qp_of(self, i: int, types: tuple[int, ...], proc: Any = None) -> Obj | None:
        """A live QP of one of `types` (of `proc`, if given) - what a program posts such a
        WR on; 1 in 8 (i % 8 == 7) any live QP, the hostile mix."""
        if i % 8 == 7 and proc is None:
            return self._pick("qp", i)
        lst = [o for o in self.objs["qp"] if o.live and o.proc.alive
               and o.ref.qp_type in types and (proc is None or o.proc is proc)]
        if not lst:
            return None
        o = lst[i % len(lst)]
        if self._actor is None:
            self._actor = o.proc
        return o

    def _gid_of(self, o: Obj | None, index: int = 0) -> bytes:
        """The GID a QP's (or any object's) device answers at index, or zeros."""
        ctx = self._ctx_obj(o) if o is not None and o.live and o.proc.alive else None
        if ctx is None:
            return bytes(16)
        try:
            return v.ibv_query_gid(ctx, 1, index % 2)
        except OSError:
            return bytes(16)

    @op(qp=PICK, peer=PICK, psn=Num(0, 0xFFFFFF, (0,)), mtu=Num(0, 6, (3, 3)),
        access=ACCESS, port=Num(0, 3, (1, 1)), qkey=Num(0, U32, (QKEY, QKEY, 0x80000000)))
    def op_connect_any(self, qp: int, peer: int, psn: int, mtu: int, access: int, port: int,
                       qkey: int) -> None:
        """Any QP (UD, XRC send or receive, one on an SRQ) to RTS against any other."""
        o = self._pick("qp", qp)
        if o is None:
            return
        match = {v.IBV_QPT_XRC_SEND: (v.IBV_QPT_XRC_RECV,),
                 v.IBV_QPT_XRC_RECV: (v.IBV_QPT_XRC_SEND,)}.get(o.ref.qp_type, (o.ref.qp_type,))
        p = self._qp_of(peer, match) if peer % 4 else self._pick("qp", peer, live=False)
        if p is None:
            return
        self._to_rts(o.ref, self._gid_of(p), p.ref.qp_num, psn, mtu, access, port, qkey)
        o.extra["peer"] = p

    # address handles and UD
    @op(pd=PICK, peer=PICK, sgid=Num(0, 255, (0, 1, 1)), is_global=Num(0, 1, (1, 1)),
        port=Num(0, 3, (1, 1)), hop=Num(0, 255, (0, 1, 64, 255)),
        fl=Num(0, 0xFFFFF, (0,)), tclass=Num(0, 255, (0,)), sl=Num(0, 15, (0,)),
        dlid=Num(0, 0xFFFF, (0,)), gid=Num(0, 2))
    def op_create_ah(self, pd: int, peer: int, sgid: int, is_global: int, port: int,
                     hop: int, fl: int, tclass: int, sl: int, dlid: int, gid: int) -> None:
        """ibv_create_ah toward a QP's device (its GID), a random GID or zeros."""
        o = self._pick("pd", pd)
        if o is None:
            return
        p = self._pick("qp", peer, live=False)
        dgid = (self._gid_of(p, sgid) if gid == 0 else
                random.Random(peer).randbytes(16) if gid == 1 else bytes(16))
        attr = v.ibv_ah_attr(grh=v.ibv_global_route(dgid=dgid, flow_label=fl, sgid_index=sgid,
                                                    hop_limit=hop, traffic_class=tclass),
                             dlid=dlid, sl=sl, is_global=is_global, port_num=port)
        self._add("ah", o.proc, v.ibv_create_ah(o.ref, attr), owner=o)

    @op(ah=PICK)
    def op_destroy_ah(self, ah: int) -> None:
        o = self._pick("ah", ah)
        if o is not None and v.ibv_destroy_ah(o.ref) == 0:
            o.live = False

    @op(qp=PICK, ah=PICK, dst=PICK, qkey=Num(0, U32, (QKEY, QKEY, 0x80000000, 0)),
        lmr=PICK, loff=Num(0, 1 << 15, (0, 64, 4096, -1)),
        length=Num(0, 1 << 12, (0, 1, 64, 1024, 4096, 8192, U32)),
        opcode=Num(2, 3), flags=FLAGS, stale=Num(0, 7))
    def op_ud_send(self, qp: int, ah: int, dst: int, qkey: int, lmr: int, loff: int,
                   length: int, opcode: int, flags: int, stale: int) -> None:
        """A UD SEND addressed by (AH, remote QPN, Q_Key) on a UD QP (1 in 8 any QP): the
        AH one of the process's (1 in 8 anyone's, destroyed or not), the QPN a UD QP's
        (1 in 4 any QP's)."""
        o = self._qp_of(qp, (v.IBV_QPT_UD,))
        if o is None:
            return
        if not stale:
            opcode = qkey % 10                 # the hostile mix: any opcode
        a = (self._mine("ah", ah, o.proc) if stale else self._pick("ah", ah, live=False))
        d = (self._qp_of(dst, (v.IBV_QPT_UD,)) if dst % 4 else None) or \
            self._pick("qp", dst, live=False)
        if a is None and stale and d is not None:       # as a program does: an AH first
            pd = o.extra["owner"] if o.extra["owner"].kind == "pd" else None
            if pd is not None and pd.live:
                attr = v.ibv_ah_attr(grh=v.ibv_global_route(dgid=self._gid_of(d, stale),
                                                            sgid_index=stale % 2, hop_limit=64),
                                     is_global=1, port_num=1)
                a = self._add("ah", o.proc, v.ibv_create_ah(pd.ref, attr), owner=pd)
        lm = self._mine("mr", lmr, o.proc, live=False)
        laddr = ((lm.ref.addr if lm else 0) + loff) & U64
        n = length & U32 if not flags & v.IBV_SEND_INLINE else min(length & U32, 1 << 12)
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=opcode, send_flags=flags,
                           sg_list=[v.ibv_sge(laddr, n, lm.ref.lkey if lm else 0)],
                           imm_data=0x1234, ah=a.ref if a is not None else None,
                           remote_qpn=d.ref.qp_num if d is not None else dst,
                           remote_qkey=qkey)
        if wr.ah is None:
            return                  # (C would pass NULL: the process's own crash)
        if d is not None and d.live and stale % 4:
            self._recover(o, stale)
            self._recover(d, stale)
            self._recv_on(d)
        v.ibv_post_send(o.ref, wr, [])
        self._reap(o, d)

    # shared receive queues
    @op(pd=PICK, max_wr=WR, max_sge=SGE, limit=Num(0, 64, (0, 0, 0, 1, U32)))
    def op_create_srq(self, pd: int, max_wr: int, max_sge: int, limit: int) -> None:
        o = self._pick("pd", pd)
        if o is None:
            return
        srq = v.ibv_create_srq(o.ref, v.ibv_srq_init_attr(attr=v.ibv_srq_attr(
            max_wr & U32, max_sge & U32, limit & U32)))
        self._add_srq(o, srq)

    def _add_srq(self, owner: Obj, srq: Any) -> None:
        s = self._add("srq", owner.proc, srq, owner=owner)
        if getattr(srq, "buf", 0):
            self._add("region", owner.proc, None, addr=srq.buf, length=srq.buf_size,
                      what="srq", owner=s)
        if getattr(srq, "db", 0):
            self._add("region", owner.proc, None, addr=srq.db, length=8, what="srq_db",
                      owner=s)

    @op(srq=PICK, mr=PICK, off=OFFSET, length=LENGTH, nsge=Num(0, 4, (1, 1)),
        count=Num(1, 4, (1,)))
    def op_post_srq_recv(self, srq: int, mr: int, off: int, length: int, nsge: int,
                         count: int) -> None:
        o = self._pick("srq", srq)
        if o is None:
            return
        m = self._mine("mr", mr, o.proc, live=False)
        addr = ((m.ref.addr if m else 0) + off) & U64
        wr = None
        for i in range(count):
            wr = v.ibv_recv_wr(wr_id=self.steps * 8 + i, next=wr, sg_list=[
                v.ibv_sge(addr, length & U32, m.ref.lkey if m else 0)] * nsge)
        v.ibv_post_srq_recv(o.ref, wr, [])

    @op(srq=PICK, mask=Num(0, 7, (1, 2, 3)), max_wr=CAP, limit=CAP)
    def op_modify_srq(self, srq: int, mask: int, max_wr: int, limit: int) -> None:
        """ibv_modify_srq: the limit (arming the limit event), a resize (EINVAL on mlx5)."""
        o = self._pick("srq", srq)
        if o is None:
            return
        v.ibv_modify_srq(o.ref, v.ibv_srq_attr(max_wr & U32, 0, limit & U32), mask)
        v.ibv_query_srq(o.ref)

    @op(srq=PICK)
    def op_destroy_srq(self, srq: int) -> None:
        """ibv_destroy_srq, also while QPs still take their receives from it."""
        o = self._pick("srq", srq)
        if o is not None and v.ibv_destroy_srq(o.ref) == 0:
            o.live = False

    @op(pd=PICK, cq=PICK, srq=PICK, qp_type=Num(0, 10, (2, 2, 4, 9)), swr=WR, ssge=SGE,
        rwr=Num(0, 4, (0, 0, 0)))
    def op_create_qp_srq(self, pd: int, cq: int, srq: int, qp_type: int, swr: int, ssge: int,
                         rwr: int) -> None:
        """A QP taking its receives from one of the process's SRQs (any kind: an XRC
        SRQ is EINVAL for it)."""
        o = self._pick("pd", pd)
        if o is None:
            return
        c, s = self._ctx_mine("cq", cq, o), self._ctx_mine("srq", srq, o)
        if c is None or s is None:
            return
        qp = v.ibv_create_qp(o.ref, v.ibv_qp_init_attr(
            send_cq=c.ref, recv_cq=c.ref, srq=s.ref, qp_type=qp_type,
            cap=v.ibv_qp_cap(swr, rwr, ssge, 1, 0)))
        self._add_qp(o, qp)

    def _add_qp(self, owner: Obj, qp: Any) -> Obj:
        q = self._add("qp", owner.proc, qp, owner=owner)
        if getattr(qp, "buf", 0):
            self._add("region", owner.proc, None, addr=qp.buf, length=qp.buf_size, what="wq",
                      owner=q)
        if getattr(qp, "db", 0):
            self._add("region", owner.proc, None, addr=qp.db, length=8, what="qp_db",
                      owner=q)
        return q

    # XRC
    @op(ctx=PICK, file=Num(0, 3), oflags=Num(0, 0o300, (0o100, 0o100, 0, 0o300)),
        mask=Num(0, 7, (3, 3, 1)))
    def op_open_xrcd(self, ctx: int, file: int, oflags: int, mask: int) -> None:
        """ibv_open_xrcd: private (fd -1), shared through a file every process may open,
        or on a bad fd."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        fd, opened = -1, False
        if file in (1, 2):
            fd = c.proc.open(f"/tmp/fuzz-xrc-{file}", 0o100)      # O_RDONLY | O_CREAT
            opened = fd >= 0
        elif file == 3:
            fd = 77
        try:
            x = v.ibv_open_xrcd(c.ref, v.ibv_xrcd_init_attr(mask, fd, oflags))
        finally:
            if opened:
                c.proc.close(fd)
        self._add("xrcd", c.proc, x, owner=c)

    @op(xrcd=PICK)
    def op_close_xrcd(self, xrcd: int) -> None:
        o = self._pick("xrcd", xrcd)
        if o is not None and v.ibv_close_xrcd(o.ref) == 0:
            o.live = False

    @op(xrcd=PICK, pd=PICK, cq=PICK, max_wr=WR, max_sge=SGE, mask=Num(0, 31, (15, 15)))
    def op_create_xrc_srq(self, xrcd: int, pd: int, cq: int, max_wr: int, max_sge: int,
                          mask: int) -> None:
        x = self._pick("xrcd", xrcd)
        if x is None:
            return
        p = self._ctx_mine("pd", pd, x, live=False)
        c = self._ctx_mine("cq", cq, x, live=False)        # (destroyed ones too: stale handles)
        if p is None or c is None:
            return                  # C dereferences attr->pd and attr->cq: NULL is a crash
        srq = v.ibv_create_srq_ex(self._ctx_obj(x), v.ibv_srq_init_attr_ex(
            attr=v.ibv_srq_attr(max_wr & U32, max_sge & U32), pd=p.ref, xrcd=x.ref, cq=c.ref,
            srq_type=v.IBV_SRQT_XRC, comp_mask=mask))
        self._add_srq(x, srq)           # (in the domain's file: the PD may be another's)

    @op(xrcd=PICK, pd=PICK, cq=PICK, role=Num(0, 1), swr=WR, ssge=SGE)
    def op_create_xrc_qp(self, xrcd: int, pd: int, cq: int, role: int, swr: int,
                         ssge: int) -> None:
        """An XRC target (receive) QP in a domain, or an XRC initiator (send) QP."""
        x = self._pick("xrcd", xrcd)
        if x is None:
            return
        ctx = self._ctx_obj(x)
        if role == 0:
            qp = v.ibv_create_qp_ex(ctx, v.ibv_qp_init_attr_ex(
                qp_type=v.IBV_QPT_XRC_RECV, comp_mask=v.IBV_QP_INIT_ATTR_XRCD, xrcd=x.ref))
            self._add("qp", x.proc, qp, owner=x)
            return
        p = self._mine("pd", pd, x.proc)
        c = self._ctx_mine("cq", cq, p) if p is not None else None
        if p is None or c is None:
            return
        ctx = self._ctx_obj(p)          # an initiator needs no domain: the PD's file
        qp = v.ibv_create_qp_ex(ctx, v.ibv_qp_init_attr_ex(
            c.ref, c.ref, None, v.ibv_qp_cap(swr, 0, ssge, 0), v.IBV_QPT_XRC_SEND,
            comp_mask=v.IBV_QP_INIT_ATTR_PD, pd=p.ref))
        self._add_qp(p, qp)

    @op(qp=PICK, srq=PICK, opcode=Num(0, 9, (0, 2, 2, 4)), lmr=PICK, loff=OFFSET,
        length=Num(0, 1 << 16, (0, 1, 64, 4096, U32)), rmr=PICK, roff=OFFSET, flags=FLAGS,
        any_srq=Num(0, 3))
    def op_xrc_send(self, qp: int, srq: int, opcode: int, lmr: int, loff: int, length: int,
                    rmr: int, roff: int, flags: int, any_srq: int) -> None:
        """A send WR with an XRC segment naming a remote SRQ number: an XRC SRQ's, any
        SRQ's (stale, basic, another domain's) or a random one; on an XRC send QP (1 in
        8 any QP)."""
        o = self._qp_of(qp, (v.IBV_QPT_XRC_SEND,))
        if o is None:
            return
        s = self._pick("srq", srq, live=any_srq != 0)
        srqn = getattr(s.ref, "srqn", 0) if s is not None else srq * 0x9E37
        if any_srq == 3:
            srqn = (srqn + srq) & 0xFFFFFF
        peer = o.extra.get("peer")
        lm = self._mine("mr", lmr, o.proc, live=False)
        rm = self._mine("mr", rmr, peer.proc, live=False) if peer is not None else None
        n = length & U32 if not flags & v.IBV_SEND_INLINE else min(length & U32, 1 << 12)
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=opcode, send_flags=flags, sg_list=[
            v.ibv_sge(((lm.ref.addr if lm else 0) + loff) & U64, n, lm.ref.lkey if lm else 0)],
            remote_addr=((rm.ref.addr if rm else 0) + roff) & U64,
            rkey=rm.ref.rkey if rm else 0, remote_srqn=srqn)
        if s is not None and s.live and any_srq != 3:
            self._recover(o, qp)
            self._recv_on(s)
        v.ibv_post_send(o.ref, wr, [])
        self._reap(o, peer)

    # memory windows
    @op(pd=PICK, mw_type=Num(0, 3, (1, 2, 2)))
    def op_alloc_mw(self, pd: int, mw_type: int) -> None:
        o = self._pick("pd", pd)
        if o is not None:
            self._add("mw", o.proc, v.ibv_alloc_mw(o.ref, mw_type), owner=o)

    @op(mw=PICK)
    def op_dealloc_mw(self, mw: int) -> None:
        """ibv_dealloc_mw, also of a window still bound."""
        o = self._pick("mw", mw)
        if o is not None and v.ibv_dealloc_mw(o.ref) == 0:
            o.live = False

    @op(qp=PICK, mw=PICK, mr=PICK, off=OFFSET, length=LENGTH,
        access=Num(0, 0x3F, (2, 6, 0xE, 0, 0x20)), how=Num(0, 3), stale=Num(0, 7))
    def op_bind_mw(self, qp: int, mw: int, mr: int, off: int, length: int, access: int,
                   how: int, stale: int) -> None:
        """Bind a window over an MR range through a QP: ibv_bind_mw (type 1), a BIND_MW
        work request (type 2; wrong type either way is the device's MW_BIND_ERR), or
        ibv_wr_bind_mw on an extended QP.  The window one of the process's (1 in 8 a
        deallocated or anyone's), the MR any of its own, the QP any of its own."""
        if stale:
            w = self._pick("mw", mw)
            o = self._qp_of(qp, (v.IBV_QPT_RC, v.IBV_QPT_UC, v.IBV_QPT_XRC_SEND),
                            w.proc) if w is not None else None
        else:
            o = self._pick("qp", qp)
            w = self._pick("mw", mw, live=False)
        if o is None or w is None:
            return
        mwref = w.ref
        if w.proc is not o.proc:        # another process's window: its handle and key, as
            mwref = v.ibv_mw(o.ref.context, None, w.ref.rkey, w.ref.handle, w.ref.type)  # bytes
        self._recover(o, qp)
        m = self._mine("mr", mr, o.proc, live=False)
        info = v.ibv_mw_bind_info(m.ref if m else None,
                                  ((m.ref.addr if m else 0) + off) & U64 if how != 3 else 0,
                                  length & U64 if how != 3 else 0, access)
        rkey = v.ibv_inc_rkey(mwref.rkey)
        w.extra["addr"] = info.addr           # where op_mw_access aims through it
        if how == 0:
            v.ibv_bind_mw(o.ref, mwref, v.ibv_mw_bind(self.steps, v.IBV_SEND_SIGNALED, info))
        elif how == 2 and v.ibv_qp_to_qp_ex(o.ref) is not None:
            qpx = v.ibv_qp_to_qp_ex(o.ref)
            v.ibv_wr_start(qpx)
            qpx.wr_id, qpx.wr_flags = self.steps, v.IBV_SEND_SIGNALED
            v.ibv_wr_bind_mw(qpx, mwref, rkey, info)
            v.ibv_wr_complete(qpx)
        else:
            wr = v.ibv_send_wr(wr_id=self.steps, opcode=v.IBV_WR_BIND_MW,
                               send_flags=v.IBV_SEND_SIGNALED,
                               bind_mw=v.ibv_bind_mw_wr(mwref, rkey, info))
            if v.ibv_post_send(o.ref, wr, []) == 0 and mwref.type == v.IBV_MW_TYPE_2:
                w.extra["rkey"] = rkey
        self._reap(o, o.extra.get("peer"))

    @op(qp=PICK, mw=PICK, how=Num(0, 2), rkey=Num(0, U32, (0,)))
    def op_invalidate_mw(self, qp: int, mw: int, how: int, rkey: int) -> None:
        """LOCAL_INV of a window's key on a QP, or SEND_WITH_INV of it to the QP's peer;
        the key a window's (any), or random."""
        o = self._pick("qp", qp)
        if o is None:
            return
        w = self._pick("mw", mw, live=False)
        key = (w.extra.get("rkey", w.ref.rkey) if w is not None and rkey == 0 else rkey)
        op_ = v.IBV_WR_LOCAL_INV if how == 0 else v.IBV_WR_SEND_WITH_INV
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=op_, send_flags=v.IBV_SEND_SIGNALED)
        wr.invalidate_rkey = key & U32
        if how == 2:
            qpx = v.ibv_qp_to_qp_ex(o.ref)
            if qpx is None:
                return
            v.ibv_wr_start(qpx)
            qpx.wr_id, qpx.wr_flags = self.steps, v.IBV_SEND_SIGNALED
            v.ibv_wr_local_inv(qpx, key & U32)
            v.ibv_wr_complete(qpx)
        else:
            v.ibv_post_send(o.ref, wr, [])
        self._reap(o, o.extra.get("peer"))

    @op(qp=PICK, mw=PICK, opcode=Num(0, 6, (0, 4, 5, 6)), lmr=PICK, off=OFFSET,
        length=Num(0, 1 << 13, (0, 8, 64, 4096)), roff=OFFSET)
    def op_mw_access(self, qp: int, mw: int, opcode: int, lmr: int, off: int, length: int,
                     roff: int) -> None:
        """RDMA WRITE / READ / atomic through a window's rkey (bound, unbound, invalidated
        or deallocated), at the range of the MR it was bound over."""
        w = self._pick("mw", mw, live=False)
        if w is None:
            return
        near = [q for q in self.objs["qp"] if q.live and q.proc.alive
                and q.extra.get("peer") is not None and q.extra["peer"].proc is w.proc]
        o = near[qp % len(near)] if near and qp % 8 != 7 else self._pick("qp", qp)
        if o is None:
            return
        self._recover(o, qp)
        self._recover(o.extra.get("peer"), qp)
        lm = self._mine("mr", lmr, o.proc, live=False)
        rkey = w.extra.get("rkey", w.ref.rkey)
        base = w.extra.get("addr", 0)
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=opcode, send_flags=v.IBV_SEND_SIGNALED,
                           sg_list=[v.ibv_sge(lm.ref.addr if lm else 0, length,
                                              lm.ref.lkey if lm else 0)],
                           remote_addr=(base + roff) & U64, rkey=rkey)
        v.ibv_post_send(o.ref, wr, [])
        self._reap(o, o.extra.get("peer"))

    # device memory
    @op(ctx=PICK, length=Num(0, 1 << 17, (0, 1, 64, 4096, 1 << 17, 1 << 20, U32)),
        align=Num(0, 64, (0, 3, 12, 63)))
    def op_alloc_dm(self, ctx: int, length: int, align: int) -> None:
        c = self._pick("ctx", ctx)
        if c is None:
            return
        dm = v.ibv_alloc_dm(c.ref, length, align)
        d = self._add("dm", c.proc, dm, owner=c)
        if getattr(dm, "mmap_va", 0):
            self._add("region", c.proc, None, addr=dm.mmap_va, length=max(dm.mmap_len, 1),
                      what="dm", owner=d)

    @op(dm=PICK, off=Num(0, 1 << 17, (0, 4, 3, 4096, U64)), length=Num(0, 1 << 13,
        (0, 4, 3, 8, 4096, U32)), out=Num(0, 1))
    def op_copy_dm(self, dm: int, off: int, length: int, out: int) -> None:
        """ibv_memcpy_to_dm / _from_dm at any offset and length (unaligned, past the end)."""
        o = self._pick("dm", dm)
        if o is None:
            return
        if out:
            v.ibv_memcpy_from_dm(o.ref, off, length & U32)
        else:
            v.ibv_memcpy_to_dm(o.ref, off, bytes(min(length, 1 << 13)) , length & U32)

    @op(pd=PICK, dm=PICK, off=Num(0, 1 << 17, (0, 64, 4096)), length=Num(0, 1 << 17,
        (0, 64, 4096, U64)), access=ACCESS, foreign=Num(0, 7))
    def op_reg_dm_mr(self, pd: int, dm: int, off: int, length: int, access: int,
                     foreign: int) -> None:
        """ibv_reg_dm_mr: the process's DM (1 in 8 anyone's, freed or not)."""
        o = self._pick("pd", pd)
        if o is None:
            return
        d = self._mine("dm", dm, o.proc) if foreign else self._pick("dm", dm, live=False)
        if d is None:
            return
        mr = v.ibv_reg_dm_mr(o.ref, d.ref, off, length & U64, access | v.IBV_ACCESS_ZERO_BASED
                             if access & 1 else access)
        self._add("mr", o.proc, mr, owner=o, addr=0, length=length)

    @op(dm=PICK)
    def op_free_dm(self, dm: int) -> None:
        """ibv_free_dm, also while an MR is registered over it (EBUSY)."""
        o = self._pick("dm", dm)
        if o is not None and v.ibv_free_dm(o.ref) == 0:
            o.live = False

    # ODP under traffic
    @op(pd=PICK, region=PICK, off=OFFSET, length=LENGTH, access=ACCESS, implicit=Num(0, 7))
    def op_reg_odp_mr(self, pd: int, region: int, off: int, length: int, access: int,
                      implicit: int) -> None:
        """An ON_DEMAND MR over one of the process's regions (1 in 8 implicit: all of
        the address space)."""
        o = self._pick("pd", pd)
        if o is None:
            return
        r = self._mine("region", region, o.proc, live=False)
        addr = (r.extra["addr"] + off) & U64 if r is not None else off & U64
        if implicit == 0:
            addr, length = 0, U64
        mr = v.ibv_reg_mr(o.ref, addr, length & U64, (access | v.IBV_ACCESS_ON_DEMAND) & U32)
        self._add("mr", o.proc, mr, owner=o, addr=addr, length=length, odp=True)

    @op(qp=PICK, mr=PICK, off=Num(0, 1 << 16, (0, 4096)), length=Num(0, 1 << 16,
        (64, 4096, 8192)), opcode=Num(0, 6, (0, 2, 4)), cut=Num(0, 2), coff=OFFSET,
        clen=LENGTH, order=Num(0, 2))
    def op_odp_race(self, qp: int, mr: int, off: int, length: int, opcode: int, cut: int,
                    coff: int, clen: int, order: int) -> None:
        """Traffic over an ODP MR of the QP's peer (or its own) while the process unmaps
        or MADV_DONTNEEDs part of it: before the doorbell, between doorbell and the
        HCA's run, or after the first yield."""
        o = self._pick("qp", qp)
        if o is None:
            return
        peer = o.extra.get("peer")
        odp = [m for m in self.objs["mr"] if m.live and m.extra.get("odp")]
        if not odp:
            return
        m = odp[mr % len(odp)]
        if m.proc is not o.proc and (peer is None or m.proc is not peer.proc):
            return
        own = self._mine("mr", mr, o.proc)
        base = m.ref.addr if m.ref.addr else m.extra["addr"]
        mlen = m.extra["length"] & U64
        if 0 < mlen < 1 << 32:                 # inside the MR: the cut is what races
            off %= mlen
            length = min(length, mlen - off)
        self._recover(o, qp)
        if peer is not None:
            self._recover(peer, qp)
        if m.proc is o.proc:
            sge, raddr, rkey = v.ibv_sge((base + off) & U64, length, m.ref.lkey), 0, 0
            if peer is not None:
                pm = self._mine("mr", mr, peer.proc)
                raddr, rkey = (pm.ref.addr, pm.ref.rkey) if pm is not None else (0, 0)
        else:
            sge = v.ibv_sge(own.ref.addr if own else 0, length, own.ref.lkey if own else 0)
            raddr, rkey = (base + off) & U64, m.ref.rkey
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=opcode, send_flags=v.IBV_SEND_SIGNALED,
                           sg_list=[sge], remote_addr=raddr, rkey=rkey)

        def cut_it() -> None:
            if not m.proc.alive:
                return
            at = (base + off + coff) & ~0xFFF & U64
            if cut == 0:
                m.proc.munmap(at, clen & U64)
            else:
                m.proc.madvise(at, clen & U64, 4 if cut == 1 else clen & 0xFF)  # DONTNEED

        if order == 0:
            cut_it()
        v.ibv_post_send(o.ref, wr, [])
        if order == 1:
            cut_it()
        self._progress(o.proc)
        if order == 2:
            cut_it()
        self._reap(o, peer)

    @op(region=PICK, off=OFFSET, length=LENGTH, advice=Num(0, 20, (4, 4, 0)))
    def op_madvise(self, region: int, off: int, length: int, advice: int) -> None:
        r = self._pick("region", region, live=False)
        if r is None or not r.proc.alive:
            return
        r.proc.madvise((r.extra["addr"] + off) & ~0xFFF & U64, length & U64, advice)

    @op(pd=PICK, mr=PICK, advice=Num(0, 3), flags=Num(0, 3), off=OFFSET, length=LENGTH)
    def op_advise_mr(self, pd: int, mr: int, advice: int, flags: int, off: int,
                     length: int) -> None:
        """ibv_advise_mr (prefetch) over an MR of the process (ODP or not)."""
        o = self._pick("pd", pd)
        if o is None:
            return
        m = self._mine("mr", mr, o.proc, live=False)
        addr = ((m.ref.addr if m else 0) + off) & U64
        v.ibv_advise_mr(o.ref, advice, flags, [v.ibv_sge(addr, length & U32,
                                                         m.ref.lkey if m else 0)])

    # completion channels and CQ events
    @op(ctx=PICK)
    def op_create_comp_channel(self, ctx: int) -> None:
        c = self._pick("ctx", ctx)
        if c is not None:
            self._add("chan", c.proc, vcq.ibv_create_comp_channel(c.ref), owner=c)

    @op(chan=PICK, close=Num(0, 3))
    def op_destroy_comp_channel(self, chan: int, close: int) -> None:
        """ibv_destroy_comp_channel (EBUSY with CQs on it), or 1 in 4 close() of its fd
        whatever uses it."""
        o = self._pick("chan", chan)
        if o is None:
            return
        if close == 0:
            o.proc.close(o.ref.fd)
            o.live = False
        elif vcq.ibv_destroy_comp_channel(o.ref) == 0:
            o.live = False

    @op(ctx=PICK, chan=PICK, cqe=CQE, vector=Num(0, 64, (0, 0, 1, 63)))
    def op_create_cq_chan(self, ctx: int, chan: int, cqe: int, vector: int) -> None:
        """A CQ reporting to a completion channel of the process (its fd maybe closed)."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        ch = self._ctx_mine("chan", chan, c, live=False)
        cq = v.ibv_create_cq(c.ref, cqe, None, ch.ref if ch else None, vector)
        o = self._add("cq", c.proc, cq, owner=c)
        self._add("region", c.proc, None, addr=cq.buf, length=cq.buf_size, what="cq", owner=o)
        self._add("region", c.proc, None, addr=cq.dbrec, length=8, what="cq_db", owner=o)

    @op(cq=PICK, solicited=Num(0, 1))
    def op_req_notify(self, cq: int, solicited: int) -> None:
        o = self._pick("cq", cq)
        if o is not None:
            vcq.ibv_req_notify_cq(o.ref, solicited)
            self._progress(o.proc)

    @op(chan=PICK, ack=Num(0, 3, (1, 1)))
    def op_get_cq_event(self, chan: int, ack: int) -> None:
        """ibv_get_cq_event (it blocks until an event or the wait ends: EINTR), then
        ack 0..3 events (more than read is the library's count, not the kernel's)."""
        o = self._pick("chan", chan)
        if o is None:
            return
        cq, _ = vcq.ibv_get_cq_event(o.ref)
        if ack:
            vcq.ibv_ack_cq_events(cq, ack)

    @op(cq=PICK, cqe=CQE)
    def op_resize_cq(self, cq: int, cqe: int) -> None:
        """ibv_resize_cq to any size, with completions queued or not; the ring moves."""
        o = self._pick("cq", cq)
        if o is None:
            return
        old = o.ref.buf
        if vcq.ibv_resize_cq(o.ref, cqe) == 0 and o.ref.buf != old:
            self._add("region", o.proc, None, addr=o.ref.buf, length=o.ref.buf_size, what="cq",
                      owner=o)

    @op(mr=PICK, flags=Num(0, 15, (1, 2, 4, 7)), pd=PICK, region=PICK, off=OFFSET,
        length=LENGTH, access=ACCESS)
    def op_rereg_mr(self, mr: int, flags: int, pd: int, region: int, off: int, length: int,
                    access: int) -> None:
        """ibv_rereg_mr: new translation over a region of the process, a PD of it
        (1 in 8 another process's), new access - any combination."""
        o = self._pick("mr", mr)
        if o is None:
            return
        p = self._mine("pd", pd, o.proc) if pd % 8 else self._pick("pd", pd, live=False)
        if p is None and flags & v.IBV_REREG_MR_CHANGE_PD:
            return                      # C dereferences the PD: NULL is the process's crash
        pdref = p.ref if p is not None else None
        mine = self._ctx_of(o)
        if p is not None and self._ctx_of(p) is not mine:
            # another process's PD, or one of this process's other device contexts: its
            # handle, as bytes this process holds, which the kernel looks up in the MR's
            # own file - the PD that handle names there, if any, is the one it takes
            # (found by peermem fuzz, seed 9502: the owner was set to the other
            # context's PD, and a later destroy through the MR's own file "succeeded")
            pdref = v.ibv_pd(o.ref.context, p.ref.handle)
            p = next((q for q in self.objs["pd"] if q.live and q.ref.handle == p.ref.handle
                      and self._ctx_of(q) is mine), None)
        r = self._mine("region", region, o.proc, live=False)
        addr = (r.extra["addr"] + off) & U64 if r is not None else off & U64
        rc, _err = v.ibv_rereg_mr(o.ref, flags, pdref, addr, length & U64,
                                  access & U32 if flags & 4 else 0)
        if rc == 0 and flags & 1:
            o.extra.update(addr=addr, length=length)
        if rc == 0 and flags & 2 and p is not None:
            o.extra["owner"] = p

    # the extended QP: ibv_create_qp_ex with send ops, and ibv_wr_* batches
    @op(pd=PICK, cq=PICK, qp_type=Num(0, 10, (2, 2, 3, 4, 9)), ops=Num(0, 0x7FF,
        (0x1FF, 0x3FF, 0x0C, 0x7FF)), swr=WR, ssge=SGE, inline=CAP, srq=PICK,
        use_srq=Num(0, 3))
    def op_create_qp_ex(self, pd: int, cq: int, qp_type: int, ops: int, swr: int, ssge: int,
                        inline: int, srq: int, use_srq: int) -> None:
        o = self._pick("pd", pd)
        if o is None:
            return
        c = self._ctx_mine("cq", cq, o)
        s = self._ctx_mine("srq", srq, o) if use_srq == 0 else None
        if c is None:
            return
        attr = v.ibv_qp_init_attr_ex(
            c.ref, c.ref, s.ref if s else None, v.ibv_qp_cap(swr, 0 if s else 8, ssge, 1, inline),
            qp_type, 0, comp_mask=v.IBV_QP_INIT_ATTR_PD | v.IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
            pd=o.ref, send_ops_flags=ops)
        self._add_qp(o, v.ibv_create_qp_ex(self._ctx_obj(o), attr))

    @op(qp=PICK, script=Num(0, U32), lmr=PICK, loff=OFFSET, length=LENGTH, rmr=PICK,
        roff=OFFSET, ah=PICK, srq=PICK, flags=FLAGS, count=Num(1, 4, (1, 1)))
    def op_wr_post(self, qp: int, script: int, lmr: int, loff: int, length: int, rmr: int,
                   roff: int, ah: int, srq: int, flags: int, count: int) -> None:
        """An ibv_wr_* batch on an extended QP: wr_start, `count` WRs of any builder
        with any setters (none, two, the UD address on an RC QP, the XRC SRQ on UD ...),
        then wr_complete - or wr_abort, or (1 in 16) nothing and the next batch starts."""
        ex = [q for q in self.objs["qp"] if q.live and q.proc.alive
              and v.ibv_qp_to_qp_ex(q.ref) is not None]
        o = ex[qp % len(ex)] if ex else None
        if o is None:
            return
        self._actor = o.proc
        self._recover(o, qp)
        qpx = v.ibv_qp_to_qp_ex(o.ref)
        peer = o.extra.get("peer")
        lm = self._mine("mr", lmr, o.proc, live=False)
        rm = self._mine("mr", rmr, peer.proc, live=False) if peer is not None else None
        lkey, laddr = (lm.ref.lkey, (lm.ref.addr + loff) & U64) if lm else (0, loff)
        rkey, raddr = (rm.ref.rkey, (rm.ref.addr + roff) & U64) if rm else (0, roff)
        a = self._mine("ah", ah, o.proc, live=False)
        s = self._pick("srq", srq, live=False)
        n = length & U32
        bits = script
        v.ibv_wr_start(qpx)
        for i in range(count):
            qpx.wr_id, qpx.wr_flags = self.steps * 8 + i, flags
            b, bits = bits % 10, bits // 10
            (lambda: v.ibv_wr_send(qpx), lambda: v.ibv_wr_send_imm(qpx, 0x1234),
             lambda: v.ibv_wr_send_inv(qpx, rkey), lambda: v.ibv_wr_rdma_write(qpx, rkey, raddr),
             lambda: v.ibv_wr_rdma_write_imm(qpx, rkey, raddr, 7),
             lambda: v.ibv_wr_rdma_read(qpx, rkey, raddr),
             lambda: v.ibv_wr_atomic_cmp_swp(qpx, rkey, raddr & ~7, 0, 1),
             lambda: v.ibv_wr_atomic_fetch_add(qpx, rkey, raddr & ~7, 1),
             lambda: v.ibv_wr_local_inv(qpx, rkey),
             lambda: v.ibv_wr_send(qpx))[b]()
            for _ in range(bits % 3):
                bits //= 3
                st, bits = bits % 6, bits // 6
                if st == 0:
                    v.ibv_wr_set_sge(qpx, lkey, laddr, n)
                elif st == 1:
                    v.ibv_wr_set_sge_list(qpx, 2, [v.ibv_sge(laddr, n, lkey)] * 2)
                elif st == 2:
                    v.ibv_wr_set_inline_data(qpx, laddr, min(n, 1 << 12))
                elif st == 3:
                    v.ibv_wr_set_inline_data_list(qpx, 2, [v.ibv_data_buf(laddr, min(n, 256))]
                                                  * 2)
                elif st == 4 and a is not None:
                    pq = peer.ref.qp_num if peer is not None else 0
                    v.ibv_wr_set_ud_addr(qpx, a.ref, pq, QKEY)
                elif st == 5:
                    v.ibv_wr_set_xrc_srqn(qpx, getattr(s.ref, "srqn", 0) if s else srq)
        end = bits % 16
        if end == 0:
            return                          # the batch left open; the next wr_start drops it
        if end == 1:
            v.ibv_wr_abort(qpx)
        else:
            v.ibv_wr_complete(qpx)
        self._reap(o, o.extra.get("peer"))

    @op(ctx=PICK, kind=Num(0, 3), handle_of=PICK)
    def op_foreign_destroy2(self, ctx: int, kind: int, handle_of: int) -> None:
        """foreign_destroy for the newer objects: DESTROY_SRQ, DESTROY_AH, DEALLOC_MW,
        CLOSE_XRCD naming a handle (of any file's object of that kind, stale or not)
        this file does not hold live: ENOENT/EINVAL/EBADF, never success."""
        c = self._pick("ctx", ctx)
        if c is None:
            return
        what = ("srq", "ah", "mw", "xrcd")[kind]
        h = self._pick(what, handle_of, live=False)
        handle = getattr(h.ref, "handle", handle_of) if h is not None else handle_of
        mine = [o for o in self.objs[what] if o.live and o.ref.handle == handle
                and self._ctx_of(o) is c]
        if mine or c.extra.get("untracked"):
            return
        command, req, resp = (
            (uv.IB_USER_VERBS_CMD_DESTROY_SRQ, uv.ib_uverbs_destroy_srq(srq_handle=handle),
             uv.ib_uverbs_destroy_srq_resp),
            (uv.IB_USER_VERBS_CMD_DESTROY_AH, uv.ib_uverbs_destroy_ah(ah_handle=handle), None),
            (uv.IB_USER_VERBS_CMD_DEALLOC_MW, uv.ib_uverbs_dealloc_mw(mw_handle=handle), None),
            (uv.IB_USER_VERBS_CMD_CLOSE_XRCD, uv.ib_uverbs_close_xrcd(xrcd_handle=handle),
             None))[kind]
        try:
            execute_write(c.ref, command, req, resp, what="foreign destroy")
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.EINVAL, errno.EBADF, errno.EIO):
                raise FuzzFailure(f"foreign destroy {what}: unexpected errno {e.errno}",
                                  ("foreign_destroy2", "errno")) from e
            return
        raise FuzzFailure(f"destroying {what} handle {handle}, which this file never issued "
                          "(or destroyed already), succeeded", ("foreign_destroy2", "succeeded"))

    @op(proc=PICK, how=Num(0, 3))
    def op_exit_everything(self, proc: int, how: int) -> None:
        """A process with one of everything live - SRQ with QPs on it, XRC domain with its
        SRQ and both QP roles, a bound window, DM with an MR, an ODP MR, a channel with
        an armed CQ and an unread event - exits (or closes its device, or the uverbs fd)."""
        po = self._pick("proc", proc)
        if po is None:
            return
        n = lambda kind: len(self.objs[kind]) - 1          # noqa: E731 - the newest
        nc = len(self.objs["ctx"])
        self.op_open_device(proc)
        if len(self.objs["ctx"]) == nc:
            return
        c = n("ctx")
        self.op_alloc_pd(c)
        self.op_create_comp_channel(c)
        try:
            self.op_create_cq_chan(c, n("chan"), 32, 0)
            cqo = self.objs["cq"][-1]
            self.op_create_srq(n("pd"), 16, 1, 0)
            self.op_create_qp_srq(n("pd"), 0, 0, 2, 4, 1, 0)
            self.op_mmap(proc, 1 << 16, 0, 0, 0, 3)
            self.op_reg_mr(n("pd"), -1, 0, 1 << 16, 0x1F, 1)
            self.op_reg_odp_mr(n("pd"), -1, 0, 1 << 16, 0xF, 1)
            self.op_alloc_mw(n("pd"), 2)
            self.op_alloc_dm(c, 4096, 0)
            self.op_reg_dm_mr(n("pd"), -1, 0, 4096, 0x27, 1)
            self.op_open_xrcd(c, 0, 0o100, 3)
            self.op_create_xrc_srq(n("xrcd"), -1, -1, 8, 1, 15)
            self.op_create_xrc_qp(n("xrcd"), -1, -1, 0, 4, 1)
            self.op_create_xrc_qp(n("xrcd"), -1, -1, 1, 4, 1)
            self.op_req_notify(self.objs["cq"].index(cqo), 0)
        finally:
            o = self.objs["ctx"][c]
            if how == 0:
                self._exit(po)
            elif how == 1 and o.live:
                self.op_close_device(c)
            elif how == 2 and o.live:
                self.op_close_fd(proc, o.ref.cmd_fd)
    @op(qp=PICK, kind=Num(0, 4), off=Num(0, 255, (0, 4, 8, 16, 32, 48, 64)), data=Blob(32),
        obj=PICK)
    def op_wqe_scribble(self, qp: int, kind: int, off: int, data: bytes, obj: int) -> None:
        """Post a WQE of the newer kinds - a BIND_MW (its UMR segments), an XRC send (its
        SRQ segment), a UD send (its datagram segment), a LOCAL_INV - and, after the
        doorbell but before the HCA runs, store garbage over it: the device reads what
        the ring holds when it gets to it."""
        o = self._qp_of(qp, ((v.IBV_QPT_RC,), (v.IBV_QPT_XRC_SEND,), (v.IBV_QPT_UD,),
                             (v.IBV_QPT_RC, v.IBV_QPT_UC), (v.IBV_QPT_RC,))[kind])
        if o is None or not hasattr(o.ref, "sq") or not o.ref.sq.wqe_cnt:
            return
        idx = o.ref.sq.cur_post & (o.ref.sq.wqe_cnt - 1)
        wr = v.ibv_send_wr(wr_id=self.steps, send_flags=v.IBV_SEND_SIGNALED)
        m = self._mine("mr", obj, o.proc, live=False)
        sge = [v.ibv_sge(m.ref.addr, 64, m.ref.lkey)] if m else []
        if kind == 0:
            w = self._mine("mw", obj, o.proc, live=False)
            if w is None:
                return
            wr.opcode = v.IBV_WR_BIND_MW
            wr.bind_mw = v.ibv_bind_mw_wr(w.ref, v.ibv_inc_rkey(w.ref.rkey), v.ibv_mw_bind_info(
                m.ref if m else None, m.ref.addr if m else 0, 4096 if m else 0, 2))
        elif kind == 1:
            s = self._pick("srq", obj, live=False)
            wr.opcode, wr.sg_list, wr.remote_srqn = v.IBV_WR_SEND, sge, \
                getattr(s.ref, "srqn", 0) if s else obj
        elif kind == 2:
            a = self._mine("ah", obj, o.proc, live=False)
            d = self._pick("qp", obj, live=False)
            if a is None:
                return
            wr.opcode, wr.sg_list, wr.ah, wr.remote_qpn, wr.remote_qkey = \
                v.IBV_WR_SEND, sge, a.ref, d.ref.qp_num if d else obj, QKEY
        elif kind == 3:
            wr.opcode, wr.sg_list = v.IBV_WR_RDMA_WRITE, sge
        else:
            wr.opcode, wr.imm_data = v.IBV_WR_LOCAL_INV, obj
        if v.ibv_post_send(o.ref, wr, []) != 0:
            return
        from userspace.providers.mlx5.qp import mlx5_get_send_wqe
        bb = (idx + off // 64) & (o.ref.sq.wqe_cnt - 1)
        o.proc.store(mlx5_get_send_wqe(o.ref, bb) + off % 64, data[:64 - off % 64])
        self._reap(o, o.extra.get("peer"))

    @op(srq=PICK, slot=Num(0, 64, (0, 1)), off=Num(0, 63, (0, 2, 4, 16, 24)), data=Blob(16),
        db=Num(0, 3), length=Num(0, 4096, (64,)))
    def op_srq_scribble(self, srq: int, slot: int, off: int, data: bytes, db: int,
                        length: int) -> None:
        """Garbage into an SRQ's ring (a WQE's next link, its scatter entry) or, 1 in 4,
        its doorbell record - after posting receives - then a SEND to a QP on the SRQ
        from that QP's peer: the HCA follows what the ring says."""
        o = self._pick("srq", srq)
        if o is None or not getattr(o.ref, "buf", 0):
            return
        s = o.ref
        m = self._mine("mr", slot, o.proc)
        if m is not None:
            wr = v.ibv_recv_wr(wr_id=self.steps, sg_list=[v.ibv_sge(m.ref.addr, 256,
                                                                     m.ref.lkey)])
            v.ibv_post_srq_recv(s, wr, [])
        if db == 0:
            o.proc.store(s.db, data[:4].ljust(4, b"\xff"))
        else:
            o.proc.store(s.buf + ((slot % max(s.max, 1)) << s.wqe_shift) + off % (1 << s.wqe_shift),
                         data[:(1 << s.wqe_shift) - off % (1 << s.wqe_shift)])
        on = [q for q in self.objs["qp"] if q.live and q.proc.alive and q.ref.srq is s]
        senders = [q for q in self.objs["qp"] if q.live and q.proc.alive
                   and q.extra.get("peer") in on]
        if not senders and on:          # connect one: an RC QP on the SRQ and any other
            q = on[slot % len(on)]
            rc = [p for p in self.objs["qp"] if p.live and p.proc.alive and p is not q
                  and p.ref.qp_type == v.IBV_QPT_RC and p.ref.srq is None]
            if q.ref.qp_type != v.IBV_QPT_RC or not rc:
                return
            p = rc[slot % len(rc)]
            self._to_rts(q.ref, self._gid_of(p), p.ref.qp_num, 0, 3, 7, 1, QKEY)
            self._to_rts(p.ref, self._gid_of(q), q.ref.qp_num, 0, 3, 7, 1, QKEY)
            q.extra["peer"], p.extra["peer"] = p, q
            senders = [p]
        if not senders:
            return
        snd = senders[slot % len(senders)]
        sm = self._mine("mr", slot, snd.proc)
        wr = v.ibv_send_wr(wr_id=self.steps, opcode=v.IBV_WR_SEND,
                           send_flags=v.IBV_SEND_SIGNALED,
                           sg_list=[v.ibv_sge(sm.ref.addr, length, sm.ref.lkey)] if sm else [])
        v.ibv_post_send(snd.ref, wr, [])
        self._reap(snd, snd.extra["peer"])

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
           "mmap": 3, "store": 4, "exit": 1, "close_fd": 1, "close_device": 1,
           # the newer verbs: about a third of the draws together, so the older surface
           # keeps most of its share
           "create_ah": 2, "ud_send": 2, "connect_any": 2, "create_srq": 2,
           "post_srq_recv": 2, "create_qp_srq": 2, "bind_mw": 2, "mw_access": 2,
           "odp_race": 2, "wr_post": 2, "create_qp_ex": 2, "exit_everything": 1,
           "wqe_scribble": 2, "srq_scribble": 2}
_NEW_OPS = ("connect_any", "create_ah", "destroy_ah", "ud_send", "create_srq", "post_srq_recv",
            "modify_srq", "destroy_srq", "create_qp_srq", "open_xrcd", "close_xrcd",
            "create_xrc_srq", "create_xrc_qp", "xrc_send", "alloc_mw", "dealloc_mw", "bind_mw",
            "invalidate_mw", "mw_access", "alloc_dm", "copy_dm", "reg_dm_mr", "free_dm",
            "reg_odp_mr", "odp_race", "madvise", "advise_mr", "create_comp_channel",
            "destroy_comp_channel", "create_cq_chan", "req_notify", "get_cq_event",
            "resize_cq", "rereg_mr", "create_qp_ex", "wr_post", "foreign_destroy2",
            "exit_everything", "wqe_scribble", "srq_scribble")
_WEIGHT.update({n: _WEIGHT.get(n, 1) for n in _NEW_OPS})
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
