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

Each subcommand boots a Machine, loads the modules it needs by name (as
modprobe would) and runs a user program on it through system calls only.
`peermem explore SCENARIO [--legacy]` runs a race scenario under the explorer.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

from kernel_model.machine import Machine


def _gup_test(args: argparse.Namespace) -> int:
    from userspace.tools import gup_test
    size = args.m << 20
    m = Machine(ram_size=max(4 << 30, 2 * size), page_size=args.page_size,
                backend=args.backend)
    m.load_module("gup_test")
    p = m.spawn("gup_test")
    t0 = time.perf_counter()
    r = gup_test.run(p, size, args.n, write=args.w, longterm=args.L, page_size=m.page_size)
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
    from kernel_model.platform import rdma_host
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


def _write_bw(args: argparse.Namespace) -> int:
    from kernel_model.platform import Fabric, rdma_host
    from userspace.tools import write_bw

    def host(name: str, fabric: Fabric | None) -> Machine:
        m = rdma_host(page_size=args.page_size, backend=args.backend, name=name,
                      ram_size=max(256 << 20, 4 * args.size + (64 << 20)), fabric=fabric,
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
    write_bw.main(machines, size=args.size, iters=args.iters, tx_depth=args.tx_depth,
                  cq_mod=args.cq_mod, use_gpu=args.use_gpu)
    for m in dict.fromkeys(machines):
        m.check_leaks()
    print(" leak check: clean")
    return 0


def _clients(args: argparse.Namespace) -> int:
    from userspace.tools import clients
    params: dict[str, dict[str, int]] = {}
    for spec in args.param or []:
        try:
            mod, kv = spec.split(":", 1)
            key, value = kv.split("=", 1)
            params.setdefault(mod, {})[key] = int(value, 0)
        except ValueError:
            print(f"peermem clients: --param {spec!r} is not MODULE:NAME=INT", file=sys.stderr)
            return 2
    return clients.main(params)


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
    from kernel_model.traceout import format_ftrace, format_mermaid, format_perfetto
    text = {"ftrace": format_ftrace, "perfetto": format_perfetto,
            "mermaid": format_mermaid}[fmt](trace)
    if not text.endswith("\n"):
        text += "\n"
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)


def _explore(args: argparse.Namespace) -> int:
    import time

    from kernel_model.explore import explore, interleaving, replay, schedule_trace
    from scenarios.races import RACES
    if args.list or args.scenario is None:
        for r in RACES.values():
            print(f"{r.name}\n  fixed:  {r.fixed}\n  legacy: {r.legacy}")
        return 0 if args.list else 2
    race = RACES.get(args.scenario)
    if race is None:
        print(f"peermem explore: no race scenario {args.scenario!r}; known: "
              f"{', '.join(sorted(RACES))}", file=sys.stderr)
        return 2
    config = "legacy" if args.legacy else "fixed"
    print(f"{race.name} ({config}): {race.legacy if args.legacy else race.fixed}")

    def program() -> None:
        race.run(args.legacy)
    replay_cmd = (f"peermem explore {race.name}{' --legacy' if args.legacy else ''} "
                  "--replay '{}'")
    if args.replay is not None:
        if args.trace:
            from kernel_model.tracefilter import filter_trace
            _emit(filter_trace(schedule_trace(program, args.replay), depth=args.depth),
                  args.format, args.o)
        run = replay(program, args.replay)
        if run.failure is None:
            print(f"replayed {args.replay!r}: no failure")
            return 0
        print(f"FAILED: {run.failure}")
        return 1
    t0 = time.perf_counter()
    last = [t0]

    def progress(ex) -> None:
        now = time.perf_counter()
        if now - last[0] >= 2.0:
            last[0] = now
            print(f"  ... {ex.runs} schedules ({len(ex.schedules)} distinct, up to "
                  f"{ex.decisions} decision points), {ex.runs / (now - t0):.0f}/s, "
                  f"failures: {int(ex.failure is not None)}", file=sys.stderr)
    ex = explore(program, args.strategy, bound=args.bound, max_schedules=args.max_schedules,
                 seed=args.seed, shard=args.shard, progress=progress)
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


def _trace(args: argparse.Namespace) -> int:
    from kernel_model.sched import DeadlockError, ReplayDivergence
    from kernel_model.tracefilter import filter_trace
    from scenarios import get, run_traced
    try:
        get(args.scenario)
    except KeyError as e:
        print(f"peermem trace: {e.args[0]}", file=sys.stderr)
        return 2
    try:
        report: list = []
        trace = run_traced(args.scenario, clock=args.clock, schedule=args.schedule,
                           report=report)
    except (DeadlockError, ReplayDivergence) as e:
        print(f"peermem trace: {args.scenario}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    except ValueError as e:  # a malformed --schedule
        print(f"peermem trace: {e}", file=sys.stderr)
        return 2
    try:
        trace = filter_trace(trace, function=args.function, depth=args.depth,
                             layer=args.layer, task=args.task, during=args.during)
    except ValueError as e:
        print(f"peermem trace: {e}", file=sys.stderr)
        return 2
    _emit(trace, args.format, args.o)
    if args.stats:
        if not report:
            print(f"peermem trace: {args.scenario} keeps no statistics", file=sys.stderr)
            return 2
        sys.stdout.write("".join(report))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="peermem",
        description="An emulated Linux RDMA driver stack with PeerDirect peer memory.")
    ap.add_argument("--version", action="version", version="peermem-model 0.1.0")
    sub = ap.add_subparsers(dest="command", metavar="COMMAND")
    g = sub.add_parser("gup-test", help="pin a user range with the mm selftest's benchmark",
                       description="Mirrors tools/testing/selftests/mm/gup_test: map and "
                       "touch anonymous memory, then pin and unpin it through "
                       "/sys/kernel/debug/gup_test.")
    g.add_argument("-m", type=int, default=128, metavar="MB", help="size in MiB (128)")
    g.add_argument("-n", type=int, default=0, metavar="N",
                   help="pages per pin call (default: all at once)")
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
    d.add_argument("-i", "--ib-port", dest="i", type=int, default=0, metavar="PORT",
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
    w.add_argument("--size", "-s", type=int, default=65536, metavar="BYTES",
                   help="message size (65536)")
    w.add_argument("--iters", "-n", type=int, default=1000, metavar="N",
                   help="messages (1000)")
    w.add_argument("--tx-depth", "-t", type=int, default=128, help="WRs in flight (128)")
    w.add_argument("--cq-mod", "-Q", type=int, default=100,
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
    c.add_argument("--param", action="append", metavar="MODULE:NAME=INT",
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
    x.add_argument("--bound", type=int, default=2, help="preemption bound for dfs (2)")
    x.add_argument("--max-schedules", type=int, default=None,
                   help="stop after N schedules (pct/random: 100 by default)")
    x.add_argument("--seed", type=int, default=0, help="first seed for pct/random (0)")
    x.add_argument("--shard", type=_shard, default=(0, 1), metavar="I/N",
                   help="run part I of N disjoint parts of the search (0/1)")
    x.add_argument("--replay", metavar="SCHEDULE", help="run exactly this schedule")
    x.add_argument("--trace", action="store_true",
                   help="with --replay: print the schedule's whole interleaved trace")
    x.add_argument("--depth", type=int, default=4,
                   help="call depth of the interleaved trace in reports (4)")
    x.add_argument("--format", choices=["ftrace", "perfetto", "mermaid"], default="ftrace",
                   help="with --replay --trace: the trace's format (perfetto: a track per task)")
    x.add_argument("-o", metavar="FILE", help="with --replay --trace: write it to FILE")
    x.set_defaults(func=_explore)
    s = sub.add_parser("scenarios", help="list the scenarios `trace` can run",
                       description="One line per runnable scenario.")
    s.set_defaults(func=_scenarios)
    t = sub.add_parser("trace", help="run a scenario and print its trace",
                       description="Run SCENARIO under the tracer and write its function "
                       "graph: ftrace function_graph text (default), Chrome/Perfetto JSON "
                       "(open in https://ui.perfetto.dev) or a Mermaid sequence diagram. "
                       "The filters mirror ftrace's set_graph_function and max_graph_depth.")
    t.add_argument("scenario", metavar="SCENARIO", help="see `peermem scenarios`")
    t.add_argument("--format", choices=["ftrace", "perfetto", "mermaid"], default="ftrace")
    t.add_argument("-o", metavar="FILE", help="write to FILE instead of stdout")
    t.add_argument("--function", metavar="NAME",
                   help="only the graphs under calls of NAME (set_graph_function)")
    t.add_argument("--stats", action="store_true",
                   help="after the trace, the statistics the scenario reports (the "
                   "peer-memory counters of /sys/kernel/mm/memory_peers)")
    t.add_argument("--during", metavar="NAME",
                   help="every task, but only while calls of NAME ran (what the "
                   "HCA and the other machine did meanwhile)")
    t.add_argument("--depth", type=int, metavar="N", help="nesting limit (max_graph_depth)")
    t.add_argument("--layer", action="append", metavar="NAME",
                   help="only calls of this layer (repeatable)")
    t.add_argument("--task", metavar="NAME", help="only this task (comm or comm-pid)")
    t.add_argument("--clock", choices=["virtual", "wall"], default="virtual",
                   help="durations from the virtual clock (default, identical every run) "
                   "or wall time")
    t.add_argument("--schedule", metavar="STR",
                   help="replay a recorded schedule string instead of the default order")
    t.set_defaults(func=_trace)
    return ap


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `peermem` console script."""
    args = build_parser().parse_args(argv)
    if args.command is None:
        build_parser().print_help()
        return 0
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
