"""rdma-core's core test files, run unmodified against the emulated stack (issue 20's
figure: the core files in under 2 minutes).

`peermem rdma-core-tests --core` in a subprocess, on the suite fetched into the cache
(.ci/run fetches it before the tests; without it the benchmark skips).  The run is the
whole command: interpreter start, the implicit host's boot, every test, the host's
shutdown and leak check.  Asserted: the run's own verdict (nothing failed, errored or
leaked) and that it ran the core files; its time is the benchmark's figure.

In the suite's smoke run (benchmarks disabled) the command runs two of the core
files (test_device, test_pd): the benchmark's own plumbing is what the smoke run
checks, and .ci/run has run the whole suite just before.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from peermem_testing.rdma_core_suite import CORE_FILES, DEBIAN_VERSION, cache_dir

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUITE = cache_dir() / f"rdma-core-tests-{DEBIAN_VERSION}"


@pytest.mark.skipif(not (SUITE / "base.py").exists(),
                    reason=f"rdma-core's tests are not fetched ({SUITE}): "
                    "run `peermem rdma-core-tests` once")
def test_rdma_core_core_files(benchmark):
    which = ["--files", "test_device,test_pd"] if benchmark.disabled else ["--core"]

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "peermem", "rdma-core-tests", str(SUITE),
                               *which], capture_output=True, text=True, cwd=ROOT, timeout=600)

    r = benchmark.pedantic(run, rounds=1, iterations=1)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    summary = next(line for line in r.stdout.splitlines() if " collected: " in line)
    assert int(summary.split()[0]) >= (20 if benchmark.disabled else 80)
    assert len(CORE_FILES) == 7
