"""Run rdma-core's own Python test suite, unmodified, against the emulated stack.

rdma-core ships its tests (`tests/` in its source tree: test_device.py, test_qp.py,
test_mr.py, ... on tests/base.py) written against pyverbs.  This module loads a copy
of that folder the way its run_tests.py does (the folder is the package `tests`,
args_parser reads the command line), with the name `pyverbs` mapped to the emulated
face (userspace.pyverbs.alias), runs it with unittest, and reports every test's
outcome, each skip with its reason.

Nothing of rdma-core is kept in this repository.  fetch_suite() obtains the suite
when needed from Debian's python3-pyverbs package, which ships it under
/usr/share/doc/rdma-core/tests/ (some files gzipped): the package is downloaded from
Debian's pool, checked against its sha256 and unpacked with the standard library (no
apt, dpkg or root).  By default that is rdma-core 56.1 (Debian 13); `--release 44.0-2`
takes Debian 12's.  Or point at a git checkout of rdma-core (its tests/ folder).

    peermem rdma-core-tests                       # fetch (once) and run everything
    peermem rdma-core-tests --files test_device,test_pd -k query
    peermem rdma-core-tests /path/to/rdma-core/tests
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import importlib
import io
import os
import pathlib
import shutil
import signal
import sys
import tarfile
import threading
import time
import unittest
import urllib.request
from collections.abc import Iterable
from importlib.machinery import SourceFileLoader
from typing import Any, TextIO

from kernel_model.emu.leakcheck import LeakError
from userspace.pyverbs import host

#: the Debian package the suite is fetched from, and the release fetched by default:
#: rdma-core 56.1, Debian 13 (trixie)'s
DEBIAN_PACKAGE = "python3-pyverbs"
DEBIAN_VERSION = "56.1-1"
#: the releases the fetch knows: the sha256 of Debian's amd64 package of each (the suite
#: in it is the same on every architecture)
KNOWN_RELEASES = {
    "56.1-1": "46fcf3364052cc84a7b97813ade8cb6acb84cc9dd33b2b7c2e3993bec9ef8bcf",
    "44.0-2": "92cc7388a134837a89ebe3f231203ff4d4d863be1db7ba112b06e0a0af3fd263",
}
#: where Debian's pool is; $PEERMEM_DEBIAN_MIRROR names another (http://, file://)
DEBIAN_MIRROR = "http://deb.debian.org/debian"
SUITE_DOC_DIR = "usr/share/doc/rdma-core/tests"
#: the files the issue calls the core of the suite
CORE_FILES = ("test_device", "test_pd", "test_mr", "test_cq", "test_qp", "test_addr",
              "test_mlx5_uar")


def cache_dir() -> pathlib.Path:
    """Where a fetched suite is kept: $PEERMEM_CACHE or ~/.cache/peermem."""
    base = os.environ.get("PEERMEM_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "peermem")
    return pathlib.Path(base)


def package_url(version: str) -> str:
    """The address of python3-pyverbs `version` (amd64) in Debian's pool."""
    mirror = os.environ.get("PEERMEM_DEBIAN_MIRROR") or DEBIAN_MIRROR
    return (f"{mirror.rstrip('/')}/pool/main/r/rdma-core/"
            f"{DEBIAN_PACKAGE}_{version}_amd64.deb")


def _deb_members(deb: bytes) -> dict[str, bytes]:
    """The members of a .deb (an `ar` archive: debian-binary, control.tar.*,
    data.tar.*) by name."""
    if not deb.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar header)")
    members, at = {}, 8
    while at + 60 <= len(deb):
        name = deb[at:at + 16].decode().strip().rstrip("/")
        size = int(deb[at + 48:at + 58])
        members[name] = deb[at + 60:at + 60 + size]
        at += 60 + size + (size & 1)
    return members


def extract_suite(deb: bytes, dest: pathlib.Path) -> None:
    """Unpack the suite's folder from the package into dest, the gzipped files
    decompressed (what `dpkg -x` and gunzip do, in the standard library)."""
    members = _deb_members(deb)
    data = next((members[n] for n in members if n.startswith("data.tar")), None)
    if data is None:
        raise ValueError("the package has no data.tar member")
    prefix = "./" + SUITE_DOC_DIR + "/"
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        for m in tar.getmembers():
            name = m.name if m.name.startswith("./") else "./" + m.name
            rel = name[len(prefix):]
            if not name.startswith(prefix) or not m.isfile() or "/" in rel:
                continue
            raw = tar.extractfile(m).read()
            if rel.endswith(".gz"):
                rel, raw = rel[:-3], gzip.decompress(raw)
            (dest / rel).write_bytes(raw)
    if not (dest / "base.py").exists():
        raise ValueError(f"the package has no {SUITE_DOC_DIR}/base.py")


def fetch_suite(dest: pathlib.Path | None = None, version: str = DEBIAN_VERSION) -> pathlib.Path:
    """The suite's folder, fetched once from Debian's pool and kept in the cache: the
    package python3-pyverbs `version` is downloaded, checked against its known sha256
    and its /usr/share/doc/rdma-core/tests/ unpacked (no apt, dpkg or root needed)."""
    if version not in KNOWN_RELEASES:
        raise ValueError(f"unknown release {version}; known: {', '.join(KNOWN_RELEASES)}")
    dest = dest or cache_dir() / f"rdma-core-tests-{version}"
    if (dest / "base.py").exists():
        return dest
    url = package_url(version)
    with urllib.request.urlopen(url, timeout=120) as r:
        deb = r.read()
    digest = hashlib.sha256(deb).hexdigest()
    if digest != KNOWN_RELEASES[version]:
        raise ValueError(f"{url}: sha256 {digest[:16]}... is not {DEBIAN_PACKAGE} {version}'s")
    staging = dest.with_name(dest.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    extract_suite(deb, staging)
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
    from userspace.pyverbs import alias, programs
    alias.install()
    programs.install()  # the suite's `rdma link show -j` and `cat` see the emulated host
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
