"""The `peermem` command: run the emulated stack's tools and scenarios.

    peermem --help
    peermem gup-test -m 128          # the mm selftest's pin benchmark

Each subcommand boots a Machine, loads the modules it needs by name (as
modprobe would) and runs a user program on it through system calls only.
Later issues add subcommands (trace, scenarios, devinfo, write-bw, explore).
"""

from __future__ import annotations

import argparse
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
    g.add_argument("--backend", choices=["c", "python"], default=None,
                   help="page loops in C (default) or their Python twins")
    g.add_argument("--page-size", type=int, default=4096, choices=[4096, 16384, 65536])
    g.set_defaults(func=_gup_test)
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
