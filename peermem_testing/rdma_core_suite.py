"""Run rdma-core's own Python test suite, unmodified, against the emulated stack.

rdma-core ships its tests (`tests/` in its source tree: test_device.py, test_qp.py,
test_mr.py, ... on tests/base.py) written against pyverbs.  This module loads a copy
of that folder the way its run_tests.py does (the folder is the package `tests`,
args_parser reads the command line), with the name `pyverbs` mapped to the emulated
face (userspace.pyverbs.alias), runs it with unittest, and reports every test's
outcome, each skip with its reason.

Nothing of rdma-core is kept in this repository.  fetch_suite() obtains the suite
when needed from Debian's python3-pyverbs package, which ships it under
/usr/share/doc/rdma-core/tests/ (some files gzipped): `apt-get download` and
`dpkg -x` need no root.  Or point at a git checkout of rdma-core (its tests/ folder).

    peermem rdma-core-tests                       # fetch (once) and run everything
    peermem rdma-core-tests --files test_device,test_pd -k query
    peermem rdma-core-tests /path/to/rdma-core/tests
"""

from __future__ import annotations

import collections
import gzip
import importlib
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
from collections.abc import Iterable
from importlib.machinery import SourceFileLoader
from typing import Any, TextIO

from kernel_model.emu.leakcheck import LeakError
from userspace.pyverbs import host

#: the Debian package and version the suite is fetched from (bookworm's rdma-core)
DEBIAN_PACKAGE = "python3-pyverbs"
DEBIAN_VERSION = "44.0-2"
SUITE_DOC_DIR = "usr/share/doc/rdma-core/tests"
#: the files the issue calls the core of the suite
CORE_FILES = ("test_device", "test_pd", "test_mr", "test_cq", "test_qp", "test_addr",
              "test_mlx5_uar")


def cache_dir() -> pathlib.Path:
    """Where a fetched suite is kept: $PEERMEM_CACHE or ~/.cache/peermem."""
    base = os.environ.get("PEERMEM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "peermem")
    return pathlib.Path(base)


def fetch_suite(dest: pathlib.Path | None = None, version: str = DEBIAN_VERSION) -> pathlib.Path:
    """The suite's folder, fetched from Debian's python3-pyverbs once and kept in the
    cache: apt-get download + dpkg -x, then the gzipped files unpacked."""
    dest = dest or cache_dir() / f"rdma-core-tests-{version}"
    if (dest / "base.py").exists():
        return dest
    for tool in ("apt-get", "dpkg"):
        if shutil.which(tool) is None:
            raise RuntimeError(f"fetching rdma-core's tests needs {tool} (Debian's package "
                               f"{DEBIAN_PACKAGE}); or pass the path of rdma-core's tests/")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(["apt-get", "download", f"{DEBIAN_PACKAGE}={version}"], cwd=tmp,
                       check=True, capture_output=True)
        deb = next(pathlib.Path(tmp).glob("*.deb"))
        subprocess.run(["dpkg", "-x", str(deb), f"{tmp}/x"], check=True, capture_output=True)
        src = pathlib.Path(tmp) / "x" / SUITE_DOC_DIR
        staging = dest.with_name(dest.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        for f in src.iterdir():
            if f.name.endswith(".gz"):
                (staging / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
            elif f.is_file():
                shutil.copy(f, staging / f.name)
        staging.rename(dest)
    return dest


#: a test that runs longer than this is stopped and counted as an error: a suite test
#: that waits on something that never comes (a child process that died, say) must not
#: hang the run
TEST_TIMEOUT_S = 120


class TestTimeout(Exception):
    """A test ran past TEST_TIMEOUT_S."""


def _on_alarm(signum: int, frame: Any) -> None:
    raise TestTimeout(f"the test ran for more than {TEST_TIMEOUT_S} s; stopped")


class _Recorder(unittest.TestResult):
    """Every test's outcome, printed as it ends: ok, FAIL, ERROR or skip (reason)."""

    def __init__(self, out: TextIO, verbose: bool) -> None:
        super().__init__()
        self.out, self.verbose = out, verbose
        self.outcomes: list[tuple[str, str, str]] = []  # (test id, outcome, detail)
        self._alarm = threading.current_thread() is threading.main_thread()

    def startTest(self, test: unittest.TestCase) -> None:
        super().startTest(test)
        if self._alarm:
            signal.signal(signal.SIGALRM, _on_alarm)
            signal.setitimer(signal.ITIMER_REAL, TEST_TIMEOUT_S)

    def stopTest(self, test: unittest.TestCase) -> None:
        if self._alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
        super().stopTest(test)

    def _note(self, test: unittest.TestCase, outcome: str, detail: str = "") -> None:
        self.outcomes.append((test.id(), outcome, detail))
        if self.verbose or outcome not in ("ok", "skip"):
            line = f"{outcome:5} {test.id()}"
            if outcome == "skip":
                line += f"  ({detail})"
            elif detail:
                line += f"\n      {detail.strip().splitlines()[-1]}"
            print(line, file=self.out, flush=True)

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._note(test, "ok")

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._note(test, "FAIL", self.failures[-1][1])

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._note(test, "ERROR", self.errors[-1][1])

    def addSkip(self, test: unittest.TestCase, reason: str) -> None:
        super().addSkip(test, reason)
        self._note(test, "skip", reason)

    def addExpectedFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._note(test, "xfail")

    def addUnexpectedSuccess(self, test: unittest.TestCase) -> None:
        super().addUnexpectedSuccess(test)
        self._note(test, "XPASS")

    def counts(self) -> dict[str, int]:
        c = collections.Counter(o for _, o, _ in self.outcomes)
        return {"collected": len(self.outcomes), "passed": c["ok"], "failed": c["FAIL"],
                "errored": c["ERROR"], "skipped": c["skip"]}

    def skip_reasons(self) -> list[tuple[int, str]]:
        c = collections.Counter(d for _, o, d in self.outcomes if o == "skip")
        return sorted(((n, r) for r, n in c.items()), key=lambda x: (-x[0], x[1]))


def _load_package(path: pathlib.Path) -> Any:
    """Load the suite folder as the package `tests`, as rdma-core's run_tests.py does."""
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))  # its modules import args_parser as a top-level name
    for name in [n for n in sys.modules if n == "tests" or n.startswith("tests.")]:
        del sys.modules[name]  # a `tests` package imported before is not the suite
    return SourceFileLoader("tests", str(path / "__init__.py")).load_module()


def run_suite(path: pathlib.Path, files: Iterable[str] = (), patterns: Iterable[str] = (),
              out: TextIO = sys.stdout, verbose: bool = False) -> _Recorder:
    """Run the suite in `path` (only `files`, e.g. "test_device", if given; only tests
    matching a `-k` pattern, if given) against the emulated pyverbs."""
    from userspace.pyverbs.alias import install
    install()
    saved_argv = sys.argv[:]
    sys.argv = ["run_tests.py"]
    try:
        pkg = _load_package(path)
        parser = importlib.import_module("args_parser").parser
        parser.parse_args()
        loader = unittest.TestLoader()
        pats = [p if "*" in p else f"*{p}*" for p in patterns]
        if pats:
            loader.testNamePatterns = pats
        wanted = set(files)
        suite = unittest.TestSuite()
        for mod in pkg.__test_modules__:
            if not wanted or mod.__name__.rsplit(".", 1)[-1] in wanted:
                suite.addTests(loader.loadTestsFromModule(mod))
        result = _Recorder(out, verbose)
        suite.run(result)
        return result
    finally:
        sys.argv = saved_argv


def report(result: _Recorder, seconds: float, out: TextIO = sys.stdout) -> None:
    """The counts, then the skips grouped by reason."""
    c = result.counts()
    print(f"\n{c['collected']} collected: {c['passed']} passed, {c['failed']} failed, "
          f"{c['errored']} errored, {c['skipped']} skipped in {seconds:.1f} s", file=out)
    reasons = result.skip_reasons()
    if reasons:
        print("skipped, by reason:", file=out)
        for n, reason in reasons:
            print(f"  {n:4}  {reason}", file=out)


def main(path: str | None, files: list[str], patterns: list[str], verbose: bool,
         out: TextIO = sys.stdout) -> int:
    """`peermem rdma-core-tests`: 0 when nothing failed or errored, else 1."""
    suite = pathlib.Path(path) if path else fetch_suite()
    if not (suite / "base.py").exists():
        raise FileNotFoundError(f"{suite}: not rdma-core's tests/ folder (no base.py)")
    t0 = time.monotonic()
    result = run_suite(suite, files, patterns, out, verbose)
    report(result, time.monotonic() - t0, out)
    c = result.counts()
    try:  # the host's process exits and the machine is shut down and leak-checked
        host.shutdown(check_leaks=True)
    except LeakError as e:
        print(f"leak check after the suite: {str(e).splitlines()[0]}", file=out)
        return 1
    return 0 if c["failed"] == 0 and c["errored"] == 0 else 1
