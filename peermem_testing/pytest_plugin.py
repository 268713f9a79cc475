"""The pytest plugin (entry point `pytest11: peermem`): peer-client conformance and race tests.

Conformance (io_peer_mem here; describe your own client the same way):

    from peermem_testing.conformance import ClientUnderTest

    def test_io_peer_mem_conforms(peer_client_conformance):
        cut = ClientUnderTest.uio_mapping("io_peer_mem")
        peer_client_conformance(cut)              # fails the test, naming each violation

Races - an ordinary test, marked; the plugin runs its body under the race
explorer (kernel_model/emu/explore.py), once per schedule, and fails it with the
explorer's report (the check, the schedule, its interleaved trace and the
command that replays it).  This one deliberately meets a known upstream bug:
nvidia-peermem 580 as released, the invalidating client (persistent_api_support=0)
without the proposed fix ClientUnderTest.nv_peer_mem() loads (issue53_fix=0), lets
cudaFree free the page table while ibv_dereg_mr's teardown still unmaps it - a
KASAN use-after-free in nvidia_p2p_dma_unmap_pages, Mellanox/nv_peer_memory issue
53 (open) - so it is marked xfail(strict=True): it passes only while the explorer
finds that bug.

    import pytest

    from peermem_testing.conformance import ClientUnderTest

    @pytest.mark.xfail(strict=True, reason="nv_peer_memory issue 53: use-after-free")
    @pytest.mark.race(strategy="dfs", bound=1)
    def test_dereg_vs_free(peermem_ladder):
        lad = peermem_ladder(ClientUnderTest.nv_peer_mem(issue53_fix=0))  # fresh each run
        dereg = lad.proc.start(lad.dereg)         # ibv_dereg_mr
        free = lad.proc.thread(lad.revoke, name="free")      # cudaFree
        dereg.join(); free.join()
        lad.teardown()

`race(...)` takes explore()'s keywords (strategy, bound, max_schedules, seed,
depth, shard) and `replay="SCHEDULE"`; `pytest --peermem-replay SCHEDULE`
reruns one schedule of the selected race tests instead of exploring.
`race(shards=N)` makes N tests of one, each exploring one of N parts of the search
(`[shard0of4]` ...), so pytest-xdist or a CI matrix runs them in parallel; the
terminal summary then adds one line for the test as a whole - the schedules of all
its shards and one verdict.  `race(jobs=N)` runs one test's schedules in N
processes instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from peermem_testing.conformance import ClientUnderTest, ConformanceReport, run_conformance
from peermem_testing.ladder import Ladder, build_ladder

RACE_KEYWORDS = ("strategy", "bound", "max_schedules", "seed", "depth", "shard", "shards",
                 "replay", "jobs", "por")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("peermem", "peermem-model race tests")
    group.addoption("--peermem-replay", metavar="SCHEDULE", default=None,
                    help="run the selected @pytest.mark.race tests with exactly this "
                         "schedule instead of exploring")
    group.addoption("--emulated-pyverbs", action="store_true", default=False,
                    help="make `import pyverbs` load the emulated face (userspace.pyverbs) "
                         "and run the emulated host's programs (rdma, ip, ls/cat of its "
                         "sysfs) for this run, so pyverbs tests run against the emulated "
                         "host")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "race(strategy='dfs', bound=2, max_schedules=None, seed=0, depth=3, "
        "shard=(0, 1), replay=None): run the test body under the peermem race explorer, "
        "once per schedule; it fails with the first failing schedule's report")
    if config.getoption("--emulated-pyverbs", default=False):
        from userspace.pyverbs import alias, programs
        alias.install()
        programs.install()  # `rdma link show`, `cat /sys/class/infiniband/...`: the host's


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """race(shards=N): one test per part of the search, for pytest-xdist to spread."""
    marker = metafunc.definition.get_closest_marker("race")
    if marker is None or "shards" not in marker.kwargs:
        return
    n = marker.kwargs["shards"]
    if not isinstance(n, int) or n < 1:
        raise pytest.UsageError(f"{metafunc.definition.nodeid}: race(shards=) wants an int >= 1")
    if "peermem_shard" not in metafunc.fixturenames:
        metafunc.fixturenames.append("peermem_shard")
    metafunc.parametrize("peermem_shard", [(i, n) for i in range(n)],
                         ids=[f"shard{i}of{n}" for i in range(n)])


def race_report(failure: Any, program: Callable[[], Any], nodeid: str, depth: int = 4) -> str:
    """The report of a failing race test: the check and its details, the schedule, the
    interleaved trace of the schedule, and the pytest command that replays it."""
    from kernel_model.emu.explore import interleaving

    return (f"race: {failure}\n"
            f"interleaving of the failing schedule (depth {depth}, its last lines):\n"
            f"{interleaving(program, failure.schedule, depth=depth)}\n"
            f"replay: pytest '{nodeid}' --peermem-replay '{failure.schedule}'")


#: each race test's one-line summary, for the terminal summary: (nodeid, line)
_RACE_RUNS = pytest.StashKey[list]()


def race_summary(runs: int, distinct: int, opts: dict[str, Any], seconds: float) -> str:
    """What a race test's exploration did: the schedules it ran, the strategy with its
    bound (dfs) or seed and depth (pct, random), the shard, and the time."""
    strategy = opts.get("strategy", "dfs")
    if strategy == "dfs":
        how = f"bound {opts.get('bound', 2)}"
    else:
        how = f"seed {opts.get('seed', 0)}" + \
            (f", depth {opts.get('depth', 3)}" if strategy == "pct" else "")
    shard = opts.get("shard", (0, 1))
    part = f", shard {shard[0] + 1}/{shard[1]}" if shard[1] > 1 else ""
    return (f"{runs} schedule(s) explored ({distinct} distinct), {strategy}, {how}{part}, "
            f"in {seconds:.1f} s")


def shards_summary(parts: list[tuple[int, int, str | None]]) -> str:
    """One verdict for a test run as shards: `parts` is (shard, schedules, failed check
    or None) of each shard that ran."""
    n = max(p[0] for p in parts) + 1 if parts else 0
    total = sum(p[1] for p in parts)
    failed = [(i, check) for i, _, check in sorted(parts) if check is not None]
    verdict = "no failure" if not failed else "FAILED (" + ", ".join(
        f"{check} in shard {i}" for i, check in failed) + ")"
    return f"{len(parts)} shard(s) of {n}: {total} schedule(s) in all: {verdict}"


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """A section listing every race test: how much of the search it ran, and how long;
    a test run as shards gets one more line, its shards' results combined."""
    runs = terminalreporter.config.stash.get(_RACE_RUNS, [])
    if runs:
        terminalreporter.section("peermem race tests")
        combined: dict[str, list[tuple[int, int, str | None]]] = {}
        for nodeid, line, *part in runs:
            terminalreporter.write_line(f"{nodeid}: {line}")
            if part and part[0] is not None:
                base = nodeid.split("[shard")[0]
                combined.setdefault(base, []).append(part[0])
        for base, parts in combined.items():
            terminalreporter.write_line(f"{base} (all shards): {shards_summary(parts)}")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    """Run a `race`-marked test's body under the explorer instead of once."""
    marker = pyfuncitem.get_closest_marker("race")
    if marker is None:
        return None
    from kernel_model.emu.explore import explore, replay

    opts = dict(marker.kwargs)
    bad = set(opts) - set(RACE_KEYWORDS)
    if opts.pop("shards", None) is not None:
        opts["shard"] = pyfuncitem.callspec.params["peermem_shard"]
    if marker.args or bad:
        raise pytest.UsageError(f"{pyfuncitem.nodeid}: race() takes keywords "
                                f"{', '.join(RACE_KEYWORDS)}; got {marker.args or sorted(bad)}")
    args = {a: pyfuncitem.funcargs[a] for a in pyfuncitem._fixtureinfo.argnames}

    def program() -> None:
        pyfuncitem.obj(**args)
    marker_replay = opts.pop("replay", None)
    schedule = pyfuncitem.config.getoption("peermem_replay") or marker_replay
    t0 = time.monotonic()
    part = None
    if schedule is not None:
        failure = replay(program, schedule).failure
        line = f"replayed schedule {schedule!r} in {time.monotonic() - t0:.1f} s"
    else:
        ex = explore(program, **opts)
        failure = ex.failure
        line = race_summary(ex.runs, len(ex.schedules), opts, time.monotonic() - t0)
        callspec = getattr(pyfuncitem, "callspec", None)
        if callspec is not None and "peermem_shard" in callspec.params:
            part = (opts["shard"][0], ex.runs, None if failure is None else failure.check)
    verdict = "no failure" if failure is None else f"FAILED ({failure.check})"
    pyfuncitem.config.stash.setdefault(_RACE_RUNS, []).append(
        (pyfuncitem.nodeid, f"{line}: {verdict}", part))
    if failure is not None:
        pytest.fail(race_report(failure, program, pyfuncitem.nodeid) + f"\n{line}",
                    pytrace=False)
    return True


@pytest.fixture
def peer_client_conformance() -> Callable[[ClientUnderTest], ConformanceReport]:
    """Run the conformance kit on a client; the test fails listing every violation.
    It takes run_conformance's keywords: `ofed=`, `release=`, `params=`."""

    def run(cut: ClientUnderTest, **options: Any) -> ConformanceReport:
        report = run_conformance(cut, **options)
        if not report.ok:
            pytest.fail(str(report), pytrace=False)
        return report

    return run


@pytest.fixture
def peermem_ladder() -> Iterator[Callable[..., Ladder]]:
    """build_ladder: machine, process, context, PD, the client's buffer and its MR.
    Call it in the test body (a race test's body runs once per schedule); it takes
    build_ladder's arguments (`ofed=`, `release=`, `params=`, `record=`).  After the
    test every machine it built and nobody checked yet is shut down and leak-checked
    (the explorer checks a race test's own), so no task of it outlives the test."""
    from kernel_model.emu.machine import Machine

    first = Machine.next_serial
    yield build_ladder
    for m in Machine.made_since(first):
        if getattr(m, "leak_check_expected", True):
            m.leak_check_expected = False      # once, even if the check raises
            m.check_leaks()
