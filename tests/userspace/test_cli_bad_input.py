"""`peermem` answers bad input with one line on stderr and a non-zero exit, never a traceback.

Each row is one bad command line and the exact line it must print.  A value
the parser refuses exits 2 by SystemExit before any Machine is built; a
refusal found when the command runs (a name that is not there, a filter
that leaves nothing, a size the device refuses) returns 2; a run that
fails (a replay that diverges) returns 1.  Either way: one line, no
traceback, and nothing on stdout that looks like a result.
"""

from __future__ import annotations

import pytest

from kernel_model.emu.machine import Machine, live_machines
from kernel_model.sched import SCHED
from peermem import cli
from peermem.cli import (
    GUP_MAX_MB,
    MAX_DECISIONS,
    MAX_ITERS,
    WRITE_BW_MAX_SIZE,
    build_parser,
    main,
)
from scenarios.races import RACES

RACE = "free-callback-vs-put-pages"


def run(capsys, argv: list[str]) -> tuple[int, str, str, bool]:
    """(exit status, stdout, stderr, whether a Machine was built) of `peermem ARGV`."""
    first = Machine.next_serial
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    out, err = capsys.readouterr()
    return rc, out, err, Machine.next_serial != first


def assert_refused(capsys, argv: list[str], line: str, *, rc: int = 2,
                   built: bool | None = False, out: str = "") -> None:
    got_rc, got_out, err, got_built = run(capsys, argv)
    assert "Traceback" not in got_out + err
    assert err.strip() == line and "\n" not in err.strip()
    assert got_rc == rc
    assert got_out == out
    if built is not None:
        assert got_built == built   # refused up front: no machine built to find out


def too_big(option: str, hi: int, n: int, why: str = "") -> str:
    return f"argument {option}: must be at most {hi}{why}, not {n}"


RAM_WHY = " (the buffers must fit in a 4096 MiB machine)"

# (argv, the line after "peermem CMD: error: ") - refused by the parser, exit 2
PARSER_ROWS = [
    # the rows of issue 18
    (["write-bw", "--size", "0"], "argument --size/-s: must be at least 1, not 0"),
    (["write-bw", "--size", "-1"], "argument --size/-s: must be at least 1, not -1"),
    (["write-bw", "--iters", "0"], "argument --iters/-n: must be at least 1, not 0"),
    (["write-bw", "--iters", "-5"], "argument --iters/-n: must be at least 1, not -5"),
    (["write-bw", "--iters", "1000000000"],
     too_big("--iters/-n", MAX_ITERS, 1000000000)),
    (["write-bw", "--size", str(WRITE_BW_MAX_SIZE + 1)],
     too_big("--size/-s", WRITE_BW_MAX_SIZE, WRITE_BW_MAX_SIZE + 1, RAM_WHY)),
    (["write-bw", "--size", str(1 << 40)], too_big("--size/-s", WRITE_BW_MAX_SIZE, 1 << 40,
                                                   RAM_WHY)),
    (["write-bw", "--tx-depth", "0"], "argument --tx-depth/-t: must be at least 1, not 0"),
    (["gup-test", "-m", "0"], "argument -m: must be at least 1, not 0"),
    (["gup-test", "-m", "-1"], "argument -m: must be at least 1, not -1"),
    (["trace", "pin", "-o", "/nonexistent-dir/pin.txt"],
     "argument -o: no directory '/nonexistent-dir'"),
    (["trace", "pin", "-o", "/"], "argument -o: '/' is a directory"),
    (["explore", RACE, "--replay", "garbage"],
     "argument --replay: bad step 'garbage' in 'garbage'"),
    (["explore", RACE, "--max-schedules", "0"],
     "argument --max-schedules: must be at least 1, not 0"),
    (["explore", RACE, "--max-schedules", "-1"],
     "argument --max-schedules: must be at least 1, not -1"),
    (["explore", RACE, "--bound", "-1"], "argument --bound: must be at least 0, not -1"),
    # and beyond: every number at 0, negative, huge, not a number, empty
    (["write-bw", "--size", "abc"], "argument --size/-s: 'abc' is not an integer"),
    (["write-bw", "--size", ""], "argument --size/-s: '' is not an integer"),
    (["write-bw", "--tx-depth", "-1"], "argument --tx-depth/-t: must be at least 1, not -1"),
    (["write-bw", "--cq-mod", "0"], "argument --cq-mod/-Q: must be at least 1, not 0"),
    (["write-bw", "--cq-mod", "-3"], "argument --cq-mod/-Q: must be at least 1, not -3"),
    (["write-bw", "--page-size", "5"],
     "argument --page-size: invalid choice: 5 (choose from 4096, 16384, 65536)"),
    (["gup-test", "-m", str(GUP_MAX_MB + 1)],
     too_big("-m", GUP_MAX_MB, GUP_MAX_MB + 1, " (half the 4096 MiB machine)")),
    (["gup-test", "-m", "x"], "argument -m: 'x' is not an integer"),
    (["gup-test", "-n", "-1"], "argument -n: must be at least 0, not -1"),
    (["gup-test", "-n", str(1 << 32)], too_big("-n", (1 << 32) - 1, 1 << 32, " (a __u32)")),
    (["devinfo", "-i", "0"], "argument -i/--ib-port: must be at least 1, not 0"),
    (["devinfo", "-i", "-1"], "argument -i/--ib-port: must be at least 1, not -1"),
    (["devinfo", "-i", "one"], "argument -i/--ib-port: 'one' is not an integer"),
    (["clients", "--param", "x"], "argument --param: 'x' is not MODULE:NAME=INT"),
    (["clients", "--param", "nv_peer_mem:a=b"],
     "argument --param: 'nv_peer_mem:a=b' is not MODULE:NAME=INT"),
    (["clients", "--param", ":a=1"], "argument --param: ':a=1' is not MODULE:NAME=INT"),
    (["explore", RACE, "--replay", "0*99999999999"],
     f"argument --replay: spells out more than {MAX_DECISIONS} steps"),
    (["explore", RACE, "--replay", "0*" + "9" * 5000],
     f"argument --replay: spells out more than {MAX_DECISIONS} steps"),
    (["explore", RACE, "--replay", "0*\u00b2"],
     "argument --replay: '0*\u00b2': steps are TASK or TASK*COUNT in ASCII digits"),
    (["explore", RACE, "--replay", "1,-2"], "argument --replay: bad step '-2' in '1,-2'"),
    (["explore", RACE, "--depth", "0"], "argument --depth: must be at least 1, not 0"),
    (["explore", RACE, "--bound", "many"], "argument --bound: 'many' is not an integer"),
    (["explore", RACE, "--seed", "x"], "argument --seed: invalid int value: 'x'"),
    (["explore", RACE, "--shard", "1/0"], "argument --shard: '1/0': need 0 <= I < N"),
    (["explore", RACE, "--shard", ""], "argument --shard: '' is not I/N"),
    (["explore", RACE, "--replay", "0", "--trace", "-o", ""], "argument -o: empty file name"),
    (["explore", RACE, "--replay", "0", "--trace", "-o", "/nonexistent-dir/x"],
     "argument -o: no directory '/nonexistent-dir'"),
    (["trace", "pin", "-o", ""], "argument -o: empty file name"),
    (["trace", "pin", "--depth", "0"], "argument --depth: must be at least 1, not 0"),
    (["trace", "pin", "--depth", "-1"], "argument --depth: must be at least 1, not -1"),
    (["trace", "pin", "--schedule", "0*2000000"],
     f"argument --schedule: spells out more than {MAX_DECISIONS} steps"),
    (["trace", "pin", "--depth", "9" * 5000], "argument --depth: 5000 digits is too many"),
    (["trace", "pin", "--format", "svg"],
     "argument --format: invalid choice: 'svg' (choose from 'ftrace', 'perfetto', 'mermaid')"),
    (["trace"], "the following arguments are required: SCENARIO"),
]


@pytest.mark.parametrize("argv, line", PARSER_ROWS,
                         ids=[" ".join(a)[:60] for a, _ in PARSER_ROWS])
def test_parser_refuses_in_one_line(capsys, argv, line):
    assert_refused(capsys, argv, f"peermem {argv[0]}: error: {line}")


def test_top_level_errors_are_one_line(capsys):
    assert_refused(capsys, ["scenarios", "extra"],
                   "peermem: error: unrecognized arguments: extra")
    assert_refused(capsys, ["nosuch"], "peermem: error: argument COMMAND: invalid choice: "
                   "'nosuch' (choose from 'gup-test', 'devinfo', 'write-bw', 'clients', "
                   "'explore', 'scenarios', 'trace', 'fuzz', 'rdma-core-tests')")


def test_help_still_prints_the_usage(capsys):
    rc, out, err, _ = run(capsys, ["write-bw", "--help"])
    assert rc == 0 and err == ""
    assert out.startswith("usage: peermem write-bw ") and "--tx-depth" in out


def test_the_largest_sizes_are_accepted():
    """The bounds are the largest values, not one below (running them would build a 4 GiB
    machine, so only the parser is asked)."""
    args = build_parser().parse_args(["write-bw", "--size", str(WRITE_BW_MAX_SIZE),
                                      "--iters", str(MAX_ITERS)])
    assert (args.size, args.iters) == (WRITE_BW_MAX_SIZE, MAX_ITERS)
    assert build_parser().parse_args(["gup-test", "-m", str(GUP_MAX_MB)]).m == GUP_MAX_MB
    assert build_parser().parse_args(["explore", RACE, "--replay", ""]).replay == ""


# (argv, the line after "peermem CMD: error: ") - refused when the command runs, exit 2,
# before anything is written on stdout
RUNTIME_ROWS = [
    (["explore", RACE, "--trace"], "--trace needs --replay SCHEDULE (it shows one schedule)"),
    (["explore", RACE, "-o", "x.json"], "-o needs --replay SCHEDULE (it shows one schedule)"),
    (["explore", RACE, "--format", "perfetto"],
     "--format needs --replay SCHEDULE (it shows one schedule)"),
    (["explore", RACE, "--replay", "0", "-o", "x.json"],
     "-o needs --trace (it formats the replay's trace)"),
    (["explore"], "which race scenario? `peermem explore --list` shows them"),
    (["explore", ""], f"no race scenario ''; known: {', '.join(sorted(RACES))}"),
    (["write-bw", "--use-gpu", "--size", str(110 * (1 << 20) + 1)],
     f"--size {110 * (1 << 20) + 1}: with --use-gpu at most {110 << 20} (BAR1 256 MiB less "
     "the driver's 36 MiB reserve, for 2 buffers per GPU)"),
    (["write-bw", "--use-gpu", "--two-machines", "--size", str(220 << 20 | 1)],
     f"--size {220 << 20 | 1}: with --use-gpu at most {220 << 20} (BAR1 256 MiB less "
     "the driver's 36 MiB reserve, for 1 buffer per GPU)"),
    (["clients", "--param", "nosuch:a=1"],
     "--param: no peer-memory client 'nosuch'; clients: amdp2p, io_peer_mem, nv_peer_mem"),
]


@pytest.mark.parametrize("argv, line", RUNTIME_ROWS, ids=[" ".join(a) for a, _ in RUNTIME_ROWS])
def test_refused_before_the_run(capsys, argv, line):
    assert_refused(capsys, argv, f"peermem {argv[0]}: error: {line}")


@pytest.mark.parametrize("args, given", [
    (["--task", "swapper", "--layer", "driver"], "--layer driver --task swapper"),
    (["--function", "demo_pin_and_map", "--task", "app"],
     "--function demo_pin_and_map --task app"),
    (["--during", "sys_exit", "--layer", "driver", "--depth", "3"],
     "--during sys_exit --layer driver --depth 3"),
])
def test_trace_filter_that_matches_nothing_says_so(capsys, args, given):
    assert_refused(capsys, ["trace", "pin", *args],
                   f"peermem trace: error: {given}: the filters together match nothing "
                   "in the pin trace", built=True)


def test_trace_stats_without_statistics_prints_no_trace(capsys):
    assert_refused(capsys, ["trace", "pin", "--stats"],
                   "peermem trace: error: --stats: pin keeps no statistics", built=True)


def test_trace_output_file_that_cannot_be_written(capsys, tmp_path, monkeypatch):
    """-o is checked before the run; what only the open finds (here: the directory goes
    away during the run) is still one line."""
    path = tmp_path / "gone" / "pin.txt"
    path.parent.mkdir()
    import scenarios
    real = scenarios.run_traced

    def run_traced(*a, **kw):
        trace = real(*a, **kw)
        path.parent.rmdir()
        return trace
    monkeypatch.setattr(scenarios, "run_traced", run_traced)
    assert_refused(capsys, ["trace", "pin", "-o", str(path)],
                   f"peermem trace: error: -o {path}: No such file or directory", built=True)


def test_write_bw_tx_depth_the_qp_cannot_hold(capsys):
    """8192 RDMA WRITE WQEs of 4 WQEBBs fill the 2^15 WQEBBs mlx5 allows; one more fails
    ibv_create_qp, before perftest's table is printed."""
    assert_refused(capsys, ["write-bw", "--size", "1", "--iters", "8193", "-t", "8193"],
                   "peermem write-bw: error: --tx-depth 8193: ibv_create_qp failed: "
                   "mlx5_calc_sq_size: 65536 WQEBBs > max_send_wqebb 32768 (EINVAL)",
                   built=True)
    assert SCHED.alive == {}


def test_clients_parameter_the_module_does_not_take(capsys):
    assert_refused(capsys, ["clients", "--param", "nv_peer_mem:nosuch=1"],
                   "peermem clients: error: --param nv_peer_mem:nosuch=1: load failed: "
                   "load_module: nv_peer_mem: unknown parameter 'nosuch' (-ENOENT)", built=True)


def test_explore_replay_that_diverges_exits_1(capsys):
    first = Machine.next_serial
    try:
        rc, out, err, _ = run(capsys, ["explore", RACE, "--replay", "99"])
        assert not SCHED.alive   # the CLI unwound the run's tasks
    finally:
        for m in live_machines:  # the run stopped half-way through loading a module
            if m.serial >= first:
                m.leak_check_expected = False
        SCHED.abandon()
        SCHED.failed.clear()
    assert rc == 1 and "Traceback" not in out + err
    assert err == ("peermem explore: --replay '99': explore: decision 0 wants task 99, "
                   "runnable: [0, 2]\n")
    assert out.startswith(f"{RACE} (fixed): ") and out.count("\n") == 1  # the title only


def test_gup_test_failing_system_call_is_one_line(capsys, monkeypatch):
    from userspace.tools import gup_test

    def run_(proc, *a, **kw):
        raise gup_test.GupTestError(12, "ioctl failed")
    monkeypatch.setattr(gup_test, "run", run_)
    rc, out, err, _ = run(capsys, ["gup-test", "-m", "1"])
    assert (rc, out) == (1, "")
    assert err == "peermem gup-test: ioctl failed: Cannot allocate memory\n"


def test_internal_error_is_one_line_and_exit_70(capsys, monkeypatch):
    """The last resort: not bad input but a bug, reported without a traceback."""
    def boom(args):
        raise RuntimeError("oops\nsecond line")
    monkeypatch.setattr(cli, "_scenarios", boom)
    rc, out, err, _ = run(capsys, ["scenarios"])
    assert (rc, out) == (70, "")
    assert err == "peermem: internal error: RuntimeError: oops (please report)\n"


def test_the_clis_bar1_reserve_is_the_drivers():
    """write-bw --use-gpu's size bound copies the nvidia driver's BAR1 reserve (a user
    tool may not import the driver): the two figures must stay equal."""
    from drivers.nvidia.rm import CLI_THIRD_PARTY_P2P_BAR1_RESERVE
    from peermem import cli
    assert cli.CLI_THIRD_PARTY_P2P_BAR1_RESERVE == CLI_THIRD_PARTY_P2P_BAR1_RESERVE
