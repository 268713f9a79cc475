"""The `peermem` command: run the emulated stack's tools and scenarios.

    peermem --help
    peermem gup-test -m 128          # the mm selftest's pin benchmark
    peermem write-bw --two-machines  # perftest's ib_write_bw across a fabric
    peermem clients                  # the peer-memory clients, and what they register
    peermem scenarios                # what `trace` can run
    peermem trace gpudirect          # ftrace function_graph text of a scenario (main job)
    peermem trace gpudirect --stats  # ... and the peer-memory statistics after it
    peermem trace pin --format perfetto -o pin.json
    peermem devinfo -v               # ibv_devinfo -v on an emulated ConnectX
    peermem explore free-callback-vs-put-pages --legacy   # the race explorer
    peermem fuzz --seconds 600 --seed 1                    # a random hostile campaign

Each subcommand boots a Machine, loads the modules it needs by name (as
modprobe would) and runs a user program on it through system calls only.
`peermem explore SCENARIO [--legacy]` runs a race scenario under the explorer.

Bad input gets one line on stderr and no traceback.  Exit statuses:

  0   done.
  1   the run itself failed: explore or fuzz found a failure, a replayed
      schedule diverged from the program or deadlocked, a write-bw completion
      failed, a gup-test system call failed.  One line `peermem CMD: ...`.
  2   bad input, refused before anything is printed on stdout: a value out of
      range or not a number, an option that needs another, a name that is not
      there (scenario, function, task, layer, client), an output file that
      cannot be written, a filter that matches nothing, a size or depth the
      emulated device refuses.  One line `peermem CMD: error: ...`, as
      argparse's own errors (without its usage block: `--help` shows it).
  70  an internal error (EX_SOFTWARE): a bug, not bad input - main()'s last
      resort prints `peermem: internal error: TYPE: MESSAGE (please report)`.

`devinfo` keeps ibv_devinfo's own statuses and messages once it runs (255
for an unknown -d, 4 for a port the device does not have), as the tool it
mirrors does.

Limits are checked when the arguments are parsed, so nothing big is built
to find out: a command's machine has at most MAX_RAM of emulated RAM (RAM is
committed lazily, but every page a buffer touches is real host memory), and
a size must fit in it; counts have the bounds their option's help gives.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any, NoReturn

from kernel_model.emu.machine import GiB, Machine, MiB

MAX_RAM = 4 * GiB           # the largest machine a command builds (Machine's default)
GUP_MAX_MB = MAX_RAM // 2 // MiB  # gup-test: half the machine; page tables need room too
WRITE_BW_SLACK = 64 * MiB   # write-bw: RAM for the kernel, queues and page tables
WRITE_BW_MAX_SIZE = (MAX_RAM - WRITE_BW_SLACK) // 4  # RAM = 4 x size + slack (two buffers)
MAX_ITERS = 1_000_000       # write-bw keeps two timestamps per message
MAX_DECISIONS = 1_000_000   # the steps a replayed schedule may spell out
MAX_JOBS = 256              # explore --jobs: processes, one schedule each at a time
MAX_PCT_DEPTH = 20          # PCT's odds per run fall as k^-(d-1): deeper finds nothing
U32_MAX = 0xFFFF_FFFF


class UsageError(Exception):
    """Bad input found after parsing (an option that needs another, a name that is
    not there): main() prints it as argparse prints its errors and exits 2."""


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, `peermem CMD: error: MESSAGE`, exit 2.

    argparse prints the usage block before the error; the block goes (`--help`
    prints it) so that a refusal is always exactly one line."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def _int_arg(lo: int, hi: int | None = None, why: str = "") -> Callable[[str], int]:
    """argparse type: a decimal integer in [lo, hi]; `why` explains the upper bound."""
    def parse(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            if text.strip().lstrip("+-").isdecimal():  # past int()'s 4300-digit limit
                raise argparse.ArgumentTypeError(f"{len(text)} digits is too many") from None
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, not {n}")
        if hi is not None and n > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi}{why}, not {n}")
        return n
    parse.__name__ = "int"
    return parse


def _schedule(text: str) -> str:
    """argparse type for a schedule string ("0*3,1,2*2", kernel_model.sched's format):
    well formed, and no longer than MAX_DECISIONS steps (checked before expanding)."""
    from kernel_model.sched import parse_schedule
    total = 0
    for part in filter(None, text.replace(" ", "").split(",")):
        _, star, n = part.partition("*")
        ok = star and n.isascii() and n.isdigit()
        total += (int(n) if len(n) <= 18 else MAX_DECISIONS + 1) if ok else 1
    if total > MAX_DECISIONS:
        raise argparse.ArgumentTypeError(f"spells out more than {MAX_DECISIONS} steps")
    if not text.isascii():  # parse_schedule's isdigit() takes '²', which int() does not
        raise argparse.ArgumentTypeError(f"{text!r}: steps are TASK or TASK*COUNT in ASCII "
                                         "digits")
    try:
        parse_schedule(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("parse_schedule: ")) from None
    return text


def _out_file(text: str) -> str:
    """argparse type for -o FILE: a file name whose directory exists (checked before the
    run, so a long run does not end in an unwritable path)."""
    if not text:
        raise argparse.ArgumentTypeError("empty file name")
    if os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    parent = os.path.dirname(text) or "."
    if not os.path.isdir(parent):
        raise argparse.ArgumentTypeError(f"no directory {parent!r}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"directory {parent!r} is not writable")
    return text


def _gup_test(args: argparse.Namespace) -> int:
    from userspace.tools import gup_test
    size = args.m << 20
    m = Machine(ram_size=MAX_RAM, page_size=args.page_size, backend=args.backend)
    m.load_module("gup_test")
    p = m.spawn("gup_test")
    t0 = time.perf_counter()
    try:
        r = gup_test.run(p, size, args.n, write=args.w, longterm=args.L,
                         page_size=m.page_size)
    except gup_test.GupTestError as e:
        p.exit(1)
        print(f"peermem gup-test: {e.strerror}: {os.strerror(e.errno)}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - t0
    kind = "PIN_LONGTERM_BENCHMARK" if args.L else "PIN_FAST_BENCHMARK"
    print(f"{kind}: {r['nr_pages']} pages of {m.page_size} B "
          f"({r['size'] >> 20} MiB), backend {m.ops.name}")
    print(f"Time: get:{r['get_delta_usec']} put:{r['put_delta_usec']} us")
    print(f"nr_foll_pin_acquired {m.vmstat['nr_foll_pin_acquired']} "
          f"nr_foll_pin_released {m.vmstat['nr_foll_pin_released']} "
          f"(whole run incl. faulting {elapsed:.2f} s)")
    m.check_leaks()
    print("leak check: clean")
    return 0


def _rdma_host(args: argparse.Namespace) -> Machine:
    """A machine with one ConnectX HCA, mlx5_core and mlx5_ib loaded (modprobe mlx5_ib)."""
    from kernel_model.emu.platform import rdma_host
    m = rdma_host(page_size=args.page_size, backend=args.backend)
    m.load_module("mlx5_ib", dyn_uar=args.dyn_uar)
    return m


def _devinfo(args: argparse.Namespace) -> int:
    from userspace.tools import devinfo
    m = _rdma_host(args)
    p = m.spawn("ibv_devinfo")
    rc = p.run(functools.partial(devinfo.main, p, ib_devname=args.d, ib_port=args.i,
                                 verbose=args.v, list_only=args.l))
    p.exit(0)
    m.check_leaks()
    return rc & 0xFF  # the exit status a shell sees (devinfo returns -1 for "not found")


#: the nvidia driver's BAR1 reserve for third-party P2P (rm.py's
#: CLI_THIRD_PARTY_P2P_BAR1_RESERVE): a tool cannot ask the driver for it, so the figure
#: is copied here (tests/userspace/test_cli_bad_input.py keeps the two equal)
CLI_THIRD_PARTY_P2P_BAR1_RESERVE = 36 << 20


def _gpu_size_check(args: argparse.Namespace) -> None:
    """--use-gpu: the buffers are registered through the GPU's BAR1, which the driver
    maps only while `bar1_size - CLI_THIRD_PARTY_P2P_BAR1_RESERVE` is left (rm.py);
    on one machine both buffers share one GPU's BAR1."""
    from kernel_model.emu.platform import GpuConfig
    from userspace.cuda.runtime import GPU_PAGE_SIZE
    room = GpuConfig().bar1_size - CLI_THIRD_PARTY_P2P_BAR1_RESERVE
    per_gpu = 1 if args.two_machines else 2
    most = room // per_gpu // GPU_PAGE_SIZE * GPU_PAGE_SIZE
    if args.size > most:
        raise UsageError(f"--size {args.size}: with --use-gpu at most {most} (BAR1 "
                         f"{GpuConfig().bar1_size >> 20} MiB less the driver's "
                         f"{CLI_THIRD_PARTY_P2P_BAR1_RESERVE >> 20} MiB reserve, for "
                         f"{per_gpu} buffer{'s' if per_gpu > 1 else ''} per GPU)")


def _write_bw(args: argparse.Namespace) -> int:
    from kernel_model.emu.platform import Fabric, rdma_host
    from userspace.tools import write_bw
    if args.use_gpu:
        _gpu_size_check(args)

    def host(name: str, fabric: Fabric | None) -> Machine:
        ram = max(256 * MiB, 4 * args.size + WRITE_BW_SLACK)
        ram = -(-ram // args.page_size) * args.page_size  # whole pages
        m = rdma_host(page_size=args.page_size, backend=args.backend, name=name,
                      ram_size=ram, fabric=fabric,
                      nr_gpus=1 if args.use_gpu else 0)
        m.load_module("mlx5_ib")
        if args.use_gpu:
            m.load_module("nvidia")
            m.load_module("nv_peer_mem")
        return m

    if args.two_machines:
        fabric = Fabric()
        machines = (host("server", fabric), host("client", fabric))
    else:
        m = host("host0", None)
        machines = (m, m)
    try:
        write_bw.main(machines, size=args.size, iters=args.iters, tx_depth=args.tx_depth,
                      cq_mod=args.cq_mod, use_gpu=args.use_gpu)
    except write_bw.SetupError as e:  # nothing printed yet: the table comes after setup
        raise UsageError(str(e)) from None
    except write_bw.RunError as e:
        print(f"peermem {e}", file=sys.stderr)
        return 1
    for m in dict.fromkeys(machines):
        m.check_leaks()
    print(" leak check: clean")
    return 0


def _client_param(text: str) -> tuple[str, str, int]:
    """argparse type for --param MODULE:NAME=INT."""
    mod, _, kv = text.partition(":")
    key, eq, value = kv.partition("=")
    try:
        if not (mod and key and eq):
            raise ValueError
        return mod, key, int(value, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MODULE:NAME=INT") from None


def _clients(args: argparse.Namespace) -> int:
    from kernel_model.emu.platform import peer_client_modules
    from peermem import clients
    params: dict[str, dict[str, int]] = {}
    for mod, key, value in args.param or []:
        params.setdefault(mod, {})[key] = value
    known = [name for name, _, _ in peer_client_modules()]
    for mod in params:
        if mod not in known:
            raise UsageError(f"--param: no peer-memory client {mod!r}; clients: "
                             f"{', '.join(known)}")
    recs = clients.list_clients(params)
    for rec in recs:
        if rec["name"] in params and "error" in rec:
            given = ",".join(f"{k}={v}" for k, v in params[rec["name"]].items())
            raise UsageError(f"--param {rec['name']}:{given}: {rec['error']}")
    clients.print_clients(recs)
    return 0


def _shard(text: str) -> tuple[int, int]:
    """argparse type for --shard I/N."""
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not I/N") from None
    if not (n >= 1 and 0 <= i < n):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= I < N")
    return i, n


def _emit(trace: object, fmt: str, path: str | None) -> None:
    """Write a Trace in format `fmt` (ftrace, perfetto, mermaid) to `path`, or stdout."""
    from kernel_model.emu.traceout import format_ftrace, format_mermaid, format_perfetto
    text = {"ftrace": format_ftrace, "perfetto": format_perfetto,
            "mermaid": format_mermaid}[fmt](trace)
    if not text.endswith("\n"):
        text += "\n"
    if path is not None:
        try:
            with open(path, "w") as f:
                f.write(text)
        except OSError as e:
            raise UsageError(f"-o {path}: {e.strerror}") from None
    else:
        sys.stdout.write(text)


def _explore_checks(args: argparse.Namespace) -> None:
    """Option combinations argparse cannot express; UsageError for the first wrong one."""
    if args.replay is None:
        for given, flag in ((args.trace, "--trace"), (args.o is not None, "-o"),
                            (args.format is not None, "--format")):
            if given:
                raise UsageError(f"{flag} needs --replay SCHEDULE (it shows one schedule)")
    elif not args.trace:
        for given, flag in ((args.o is not None, "-o"), (args.format is not None, "--format")):
            if given:
                raise UsageError(f"{flag} needs --trace (it formats the replay's trace)")
    if args.pct_depth is not None and args.strategy != "pct":
        raise UsageError(f"--pct-depth needs --strategy pct, not {args.strategy}")
    for given, flag in ((args.jobs > 1, "--jobs"), (not args.por, "--no-por")):
        if given and args.strategy != "dfs":
            raise UsageError(f"{flag} needs --strategy dfs, not {args.strategy}")
    if args.jobs > 1 and not args.por:
        raise UsageError("--jobs needs partial-order reduction (drop --no-por)")


def _explore(args: argparse.Namespace) -> int:
    from kernel_model.emu.explore import explore, interleaving, replay, schedule_trace
    from kernel_model.sched import SCHED, ReplayDivergence
    from scenarios.races import RACES
    if args.list:
        for r in RACES.values():
            print(f"{r.name}\n  fixed:  {r.fixed}\n  legacy: {r.legacy}")
        return 0
    if args.scenario is None:
        raise UsageError("which race scenario? `peermem explore --list` shows them")
    race = RACES.get(args.scenario)
    if race is None:
        raise UsageError(f"no race scenario {args.scenario!r}; known: "
                         f"{', '.join(sorted(RACES))}")
    _explore_checks(args)
    config = "legacy" if args.legacy else "fixed"
    print(f"{race.name} ({config}): {race.legacy if args.legacy else race.fixed}")

    def program() -> None:
        race.run(args.legacy)
    replay_cmd = (f"peermem explore {race.name}{' --legacy' if args.legacy else ''} "
                  "--replay '{}'")
    if args.replay is not None:
        try:
            if args.trace:
                from kernel_model.emu.tracefilter import filter_trace
                _emit(filter_trace(schedule_trace(program, args.replay), depth=args.depth),
                      args.format or "ftrace", args.o)
            run = replay(program, args.replay)
        except ReplayDivergence as e:  # the program cannot take those decisions
            SCHED.abandon()
            SCHED.failed.clear()
            print(f"peermem explore: --replay {args.replay!r}: {e}", file=sys.stderr)
            return 1
        if run.failure is None:
            print(f"replayed {args.replay!r}: no failure")
            return 0
        print(f"FAILED: {run.failure}")
        return 1
    t0 = time.perf_counter()
    last = [t0]
    tty = sys.stderr.isatty()
    shown = [False]

    def progress(ex) -> None:
        now = time.perf_counter()
        if now - last[0] < (PROGRESS_TTY_S if tty else PROGRESS_EVERY_S):
            return
        last[0] = now
        line = explore_progress_line(ex, args.strategy, now - t0, args.max_schedules)
        if tty:  # one line, rewritten in place
            print("\r" + line + "\x1b[K", end="", file=sys.stderr, flush=True)
            shown[0] = True
        else:    # CI: plain periodic lines
            print(line, file=sys.stderr, flush=True)
    ex = explore(program, args.strategy, bound=args.bound, max_schedules=args.max_schedules,
                 seed=args.seed, shard=args.shard, progress=progress,
                 depth=args.pct_depth or 3, shrink_seconds=args.shrink_seconds,
                 por=args.por, jobs=args.jobs)
    if shown[0]:
        print(file=sys.stderr)
    took = time.perf_counter() - t0
    part = f" shard {args.shard[0]}/{args.shard[1]}" if args.shard[1] > 1 else ""
    print(f"{args.strategy}{part}: {ex.runs} schedules ({len(ex.schedules)} distinct, up to "
          f"{ex.decisions} decision points) in {took:.1f} s, {ex.runs / max(took, 1e-9):.0f}/s")
    if ex.failure is None:
        print("no failure found")
        return 0
    print(f"FAILED: {ex.failure}")
    print(f"interleaving of the failing schedule (depth {args.depth}, its last lines):")
    print(interleaving(program, ex.failure.schedule, depth=args.depth))
    print(f"replay: {replay_cmd.format(ex.failure.schedule)}  (add --trace for the whole trace)")
    return 1


#: how often `peermem explore` reports its progress: on a terminal (one line rewritten
#: in place) and otherwise (CI logs: a plain line each time)
PROGRESS_TTY_S, PROGRESS_EVERY_S = 0.5, 10.0


def explore_progress_line(ex: Any, strategy: str, elapsed: float,
                          max_schedules: int | None = None) -> str:
    """One progress line: schedules run, the total (exact for pct and random; for DFS a
    lower bound, runs + the frontier of prefixes still to run, each at least one
    schedule), the rate, the time left (a lower bound for DFS), failures so far."""
    rate = ex.runs / elapsed if elapsed > 0 else 0.0
    left, exact = ex.frontier, strategy != "dfs"
    if strategy == "dfs" and max_schedules is not None and \
            ex.runs + left >= max_schedules:   # the cap ends it first: exact
        left, exact = max_schedules - ex.runs, True
    at_least = "" if exact else ">= "
    total = f"{at_least}{ex.runs + left}"
    eta = f"{at_least}{left / rate:.0f} s left" if rate else "? s left"
    return (f"explore: {ex.runs} of {total} schedules ({len(ex.schedules)} distinct), "
            f"{rate:.0f}/s, {eta}, failures: {int(ex.failure is not None)}")


def _fuzz(args: argparse.Namespace) -> int:
    from peermem_testing.fuzz import fuzz_main
    return fuzz_main(args.seconds, args.seed, args.length, sys.stdout, sys.stderr)


def _rdma_core_tests(args: argparse.Namespace) -> int:
    from peermem_testing import rdma_core_suite as rc
    if args.path is not None and not os.path.isfile(os.path.join(args.path, "base.py")):
        raise UsageError(f"{args.path}: not rdma-core's tests/ folder (no base.py in it)")
    files = [f.strip().removesuffix(".py") for f in args.files.split(",") if f.strip()] \
        if args.files else []
    if args.core:
        files += list(rc.CORE_FILES)
    try:
        path = args.path or str(rc.fetch_suite(version=args.release))
    except (ValueError, OSError) as e:  # urllib's errors are OSErrors
        print(f"peermem rdma-core-tests: cannot fetch rdma-core's tests: {e}", file=sys.stderr)
        return 1
    if files:
        present = {f[:-3] for f in os.listdir(path) if f.startswith("test_") and f.endswith(".py")}
        unknown = sorted(set(files) - present)
        if unknown:
            raise UsageError(f"--files: no {', '.join(unknown)} in {path}")
    return rc.main(path, files, args.k or [], args.verbose)


def _add_machine_options(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--backend", choices=["c", "python"], default=None,
                    help="page loops in C (default) or their Python twins")
    sp.add_argument("--page-size", type=int, default=4096, choices=[4096, 16384, 65536])


def _scenarios(args: argparse.Namespace) -> int:
    from scenarios import scenarios
    all_ = scenarios()
    width = max(len(n) for n in all_)
    for name, sc in all_.items():
        print(f"{name:<{width}}  {sc.summary}")
    return 0


#: trace's filter options: (attribute, flag), for the message when they leave nothing
_TRACE_FILTERS = (("during", "--during"), ("function", "--function"), ("layer", "--layer"),
                  ("depth", "--depth"), ("task", "--task"))


def _trace(args: argparse.Namespace) -> int:
    from kernel_model.emu.tracefilter import filter_trace
    from kernel_model.sched import DeadlockError, ReplayDivergence
    from scenarios import get, run_traced
    try:
        story = get(args.scenario).story
    except KeyError as e:
        raise UsageError(e.args[0]) from None
    given = " ".join(f"{flag} {v}" for attr, flag in _TRACE_FILTERS
                     for v in _values(getattr(args, attr)))
    if args.full and given:
        raise UsageError(f"--full: the whole graph, unfiltered; not with {given}")
    try:
        report: list = []
        trace = run_traced(args.scenario, clock=args.clock, schedule=args.schedule,
                           report=report)
    except (DeadlockError, ReplayDivergence) as e:
        print(f"peermem trace: {args.scenario}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.stats and not report:  # before the trace: no output that looks like success
        raise UsageError(f"--stats: {args.scenario} keeps no statistics")
    if story is not None and not given and not args.full:
        _emit_story(args, trace, story)
    else:
        try:
            trace = filter_trace(trace, function=args.function, depth=args.depth,
                                 layer=args.layer, task=args.task, during=args.during)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if given and not any(trace.roots):
            raise UsageError(f"{given}: the filters together match nothing in the "
                             f"{args.scenario} trace")
        _emit(trace, args.format, args.o)
    if args.stats:
        sys.stdout.write("".join(report))
    return 0


def _emit_story(args: argparse.Namespace, trace: object, story: object) -> None:
    """A scenario's default view: its story as text, or as Mermaid (every task while
    the steps ran: the HCA probe and the teardown left out)."""
    from kernel_model.emu.tracefilter import filter_trace
    from kernel_model.emu.traceout import format_ftrace, format_mermaid
    from scenarios.story import MERMAID_MESSAGES, format_story, story_trace
    if args.format == "mermaid":
        text = format_mermaid(story_trace(trace, story), max_messages=MERMAID_MESSAGES)
    elif args.format == "ftrace":
        full = format_ftrace(filter_trace(trace)).count("\n")    # what --full prints
        text = format_story(args.scenario, trace, story, full)
    else:  # perfetto: the viewer is made for the whole run
        return _emit(trace, args.format, args.o)
    if args.o is None:
        sys.stdout.write(text)
        return
    try:
        with open(args.o, "w") as f:
            f.write(text)
    except OSError as e:
        raise UsageError(f"-o {args.o}: {e.strerror}") from None


def _values(v: object) -> list:
    """An option's values: none, one, or the list of a repeatable option."""
    return [] if v is None else list(v) if isinstance(v, list) else [v]


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog="peermem",
        description="An emulated Linux RDMA driver stack with PeerDirect peer memory.")
    ap.add_argument("--version", action="version", version="peermem-model 0.1.0")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    g = sub.add_parser("gup-test", help="pin a user range with the mm selftest's benchmark",
                       description="Mirrors tools/testing/selftests/mm/gup_test: map and "
                       "touch anonymous memory, then pin and unpin it through "
                       "/sys/kernel/debug/gup_test.")
    g.add_argument("-m", type=_int_arg(1, GUP_MAX_MB, f" (half the {MAX_RAM >> 20} MiB "
                                       "machine)"), default=128, metavar="MB",
                   help=f"size in MiB, 1 to {GUP_MAX_MB} (128)")
    g.add_argument("-n", type=_int_arg(0, U32_MAX, " (a __u32)"), default=0, metavar="N",
                   help="pages per pin call (default 0: all at once)")
    g.add_argument("-w", action="store_true", help="pin with FOLL_WRITE")
    g.add_argument("-L", action="store_true",
                   help="PIN_LONGTERM_BENCHMARK (pin_user_pages + FOLL_LONGTERM)")
    _add_machine_options(g)
    g.set_defaults(func=_gup_test)
    d = sub.add_parser("devinfo", help="print the HCA's attributes, as ibv_devinfo does",
                       description="Mirrors rdma-core's ibv_devinfo: a user process opens "
                       "each RDMA device through libibverbs and prints its attributes and "
                       "ports. -v adds every device attribute and the mlx5 provider's "
                       "alloc_ucontext response (bf_reg_size, tot_bfregs, ...).")
    d.add_argument("-d", "--ib-dev", dest="d", metavar="DEV",
                   help="use IB device DEV (default all devices)")
    d.add_argument("-i", "--ib-port", dest="i", type=_int_arg(1), default=0, metavar="PORT",
                   help="use port PORT of the device (default all ports)")
    d.add_argument("-l", "--list", dest="l", action="store_true",
                   help="print only the IB devices names")
    d.add_argument("-v", "--verbose", dest="v", action="store_true",
                   help="print all the attributes of the IB device(s)")
    d.add_argument("--dyn-uar", action="store_true",
                   help="load mlx5_ib with dyn_uar=1: honour the library's dynamic-UAR "
                   "capability (tot_bfregs 0, no static UARs)")
    _add_machine_options(d)
    d.set_defaults(func=_devinfo)
    w = sub.add_parser("write-bw", help="RDMA WRITE bandwidth between two processes, "
                       "as perftest's ib_write_bw",
                       description="A server and a client process, RC QPs, RDMA WRITEs of "
                       "SIZE bytes; prints perftest's table (wall-clock rates of the "
                       "emulation) and verifies the data at the end.")
    w.add_argument("--size", "-s", type=_int_arg(1, WRITE_BW_MAX_SIZE, " (the buffers must "
                                                  f"fit in a {MAX_RAM >> 20} MiB machine)"),
                   default=65536, metavar="BYTES",
                   help=f"message size, 1 to {WRITE_BW_MAX_SIZE} (65536)")
    w.add_argument("--iters", "-n", type=_int_arg(1, MAX_ITERS), default=1000, metavar="N",
                   help=f"messages, 1 to {MAX_ITERS} (1000)")
    w.add_argument("--tx-depth", "-t", type=_int_arg(1), default=128, metavar="N",
                   help="WRs in flight (128; at most what the QP can hold)")
    w.add_argument("--cq-mod", "-Q", type=_int_arg(1), default=100, metavar="N",
                   help="signal one WR in every CQ_MOD (100)")
    w.add_argument("--use-gpu", action="store_true",
                   help="both buffers in GPU memory, as perftest's --use_cuda (each host "
                   "gets a GPU, the nvidia module and nv_peer_mem)")
    w.add_argument("--two-machines", action="store_true",
                   help="server and client on two machines joined by a Fabric "
                   "(default: both on one machine, over the HCA's loopback)")
    _add_machine_options(w)
    w.set_defaults(func=_write_bw)
    c = sub.add_parser("clients", help="the peer-memory clients and what each registers",
                       description="Every built-in or installed (entry point group "
                       "peermem.clients) peer-memory client: loaded on a host with a "
                       "ConnectX, a GPU and a CMB device, and what it registered as "
                       "/sys/kernel/mm/memory_peers shows it.")
    c.add_argument("--param", action="append", type=_client_param, metavar="MODULE:NAME=INT",
                   help="a module parameter for one client (repeatable)")
    c.set_defaults(func=_clients)
    x = sub.add_parser("explore", help="run a race scenario under many schedules",
                       description="The race explorer: run SCENARIO (see scenarios/races.py) "
                       "under bounded exhaustive search by preemptions (dfs), PCT or random "
                       "schedules, judging each run by the kernel's debug checks and the leak "
                       "check.  Exit 0 when no failure was found, 1 when one was (its report "
                       "and the command that replays it are printed).")
    x.add_argument("scenario", nargs="?", help="a race scenario (--list shows them)")
    x.add_argument("--list", action="store_true",
                   help="list the race scenarios with their two configurations")
    x.add_argument("--legacy", action="store_true",
                   help="the configuration with the real bug (an older release or design)")
    x.add_argument("--strategy", choices=["dfs", "pct", "random"], default="dfs")
    x.add_argument("--bound", type=_int_arg(0), default=2,
                   help="preemption bound for dfs (2)")
    x.add_argument("--max-schedules", type=_int_arg(1), default=None, metavar="N",
                   help="stop after N schedules (pct/random: 100 by default)")
    x.add_argument("--seed", type=int, default=0, help="first seed for pct/random (0)")
    x.add_argument("--pct-depth", type=_int_arg(1, MAX_PCT_DEPTH), default=None, metavar="D",
                   help="with --strategy pct: the bug depth d, d - 1 priority-change "
                   "points a run (3)")
    x.add_argument("--shrink-seconds", type=_int_arg(0), default=20, metavar="S",
                   help="spend at most S seconds shrinking a failure (20; 0: report it "
                   "as found)")
    x.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                   help="run part I of N parts of the search (0/1); dfs splits it by "
                   "schedule prefix, pct and random by seed")
    x.add_argument("--jobs", type=_int_arg(1, MAX_JOBS), default=1, metavar="N",
                   help="dfs: run the schedules in N processes (1)")
    x.add_argument("--no-por", dest="por", action="store_false",
                   help="dfs: every interleaving within the bound, without partial-order "
                   "reduction (much slower; for checking the reduction itself)")
    x.add_argument("--replay", type=_schedule, metavar="SCHEDULE",
                   help="run exactly this schedule")
    x.add_argument("--trace", action="store_true",
                   help="with --replay: print the schedule's whole interleaved trace")
    x.add_argument("--depth", type=_int_arg(1), default=4, metavar="N",
                   help="call depth of the interleaved trace in reports (4)")
    x.add_argument("--format", choices=["ftrace", "perfetto", "mermaid"], default=None,
                   help="with --replay --trace: the trace's format (ftrace; perfetto: a "
                   "track per task)")
    x.add_argument("-o", type=_out_file, metavar="FILE",
                   help="with --replay --trace: write it to FILE")
    x.set_defaults(func=_explore)
    s = sub.add_parser("scenarios", help="list the scenarios `trace` can run",
                       description="One line per runnable scenario.")
    s.set_defaults(func=_scenarios)
    t = sub.add_parser("trace", help="run a scenario and print its trace",
                       description="Run SCENARIO under the tracer and write its function "
                       "graph: ftrace function_graph text (default), Chrome/Perfetto JSON "
                       "(open in https://ui.perfetto.dev) or a Mermaid sequence diagram. "
                       "The filters mirror ftrace's set_graph_function and max_graph_depth. "
                       "A scenario with a story (gpudirect) prints the story by default: its "
                       "user-visible steps a few calls deep, each step's outcome and a summary "
                       "line (Mermaid: from the story's first step); --full or any filter "
                       "gives the whole graph.")
    t.add_argument("scenario", metavar="SCENARIO", help="see `peermem scenarios`")
    t.add_argument("--format", choices=["ftrace", "perfetto", "mermaid"], default="ftrace")
    t.add_argument("-o", type=_out_file, metavar="FILE",
                   help="write to FILE instead of stdout")
    t.add_argument("--full", action="store_true",
                   help="the whole function graph, not the scenario's story")
    t.add_argument("--function", metavar="NAME",
                   help="only the graphs under calls of NAME (set_graph_function)")
    t.add_argument("--stats", action="store_true",
                   help="after the trace, the statistics the scenario reports (the "
                   "peer-memory counters of /sys/kernel/mm/memory_peers)")
    t.add_argument("--during", metavar="NAME",
                   help="every task, but only while calls of NAME ran (what the "
                   "HCA and the other machine did meanwhile)")
    t.add_argument("--depth", type=_int_arg(1), metavar="N",
                   help="nesting limit (max_graph_depth)")
    t.add_argument("--layer", action="append", metavar="NAME",
                   help="only calls of this layer (repeatable)")
    t.add_argument("--task", metavar="NAME", help="only this task (comm or comm-pid)")
    t.add_argument("--clock", choices=["virtual", "wall"], default="virtual",
                   help="durations from the virtual clock (default, identical every run) "
                   "or wall time")
    t.add_argument("--schedule", type=_schedule, metavar="STR",
                   help="replay a recorded schedule string instead of the default order")
    t.set_defaults(func=_trace)
    f = sub.add_parser("fuzz", help="a random campaign over the syscall and verbs surface",
                       description="Run seeded random operation sequences (processes on two "
                       "hosts, verbs, memory, raw commands, stores into rings and UARs, exit "
                       "anywhere) against fresh hosts, checking after every step that the "
                       "call returned or failed with an errno, no WARN, no dead task, and at "
                       "the end no leak. A failure is shrunk and printed as Python (exit 1).")
    f.add_argument("--seconds", type=_int_arg(1, 7 * 24 * 3600), default=60, metavar="N",
                   help="how long to run (default 60)")
    f.add_argument("--seed", type=_int_arg(0, (1 << 64) - 1), default=0, metavar="S",
                   help="the random seed: the same seed draws the same sequences")
    f.add_argument("--length", type=_int_arg(1, 100_000), default=200, metavar="N",
                   help="operations per sequence, each on fresh hosts (default 200)")
    f.set_defaults(func=_fuzz)
    r = sub.add_parser("rdma-core-tests", help="run rdma-core's own pyverbs test suite",
                       description="Run an unmodified copy of rdma-core's tests/ (the "
                       "pyverbs suite) against the emulated stack, with `pyverbs` mapped to "
                       "the emulated face, and print each test that did not pass, each "
                       "skip's reason and the counts. Without PATH the suite is fetched once "
                       "from Debian's python3-pyverbs package (downloaded from Debian's pool, "
                       "sha256-checked, unpacked; no root) into ~/.cache/peermem. Exit 1 if a "
                       "test failed or errored.")
    r.add_argument("path", nargs="?", metavar="PATH",
                   help="rdma-core's tests/ folder (default: fetch it)")
    r.add_argument("-k", action="append", metavar="EXPR",
                   help="only tests whose name contains EXPR (repeatable)")
    r.add_argument("--files", metavar="LIST",
                   help="only these test files, comma separated (test_device,test_qp)")
    r.add_argument("--core", action="store_true",
                   help="only the core files: " + ", ".join(
                       ("test_device", "test_pd", "test_mr", "test_cq", "test_qp", "test_addr",
                        "test_mlx5_uar")))
    r.add_argument("--release", default="56.1-1", choices=("56.1-1", "44.0-2"),
                   help="the Debian release of python3-pyverbs to fetch the suite from: "
                   "56.1-1 (Debian 13, the default) or 44.0-2 (Debian 12)")
    r.add_argument("-v", "--verbose", action="store_true", help="print every test's outcome")
    r.set_defaults(func=_rdma_core_tests)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `peermem` console script; the exit status (module docstring)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return args.func(args)
    except UsageError as e:
        print(f"peermem {args.command}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - the last resort; each input path has its check
        first = next(iter(str(e).splitlines()), "")
        print(f"peermem: internal error: {type(e).__name__}: {first} (please report)",
              file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
