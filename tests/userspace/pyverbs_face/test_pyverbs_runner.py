"""The `pyverbs` alias and `peermem rdma-core-tests`, on a small suite laid out as
rdma-core's tests/ is (a package that loads its test_*.py modules, an args_parser
module that reads the command line, tests importing pyverbs)."""

from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import pytest

from userspace.pyverbs import alias

ROOT = pathlib.Path(__file__).resolve().parents[3]

INIT = '''
import importlib, os
from args_parser import parser
__test_modules__ = [importlib.import_module("." + f[:-3], __name__)
                    for f in sorted(os.listdir(os.path.dirname(__file__)))
                    if f.startswith("test_") and f.endswith(".py")]
'''
ARGS = '''
import argparse, sys
class ArgsParser:
    args = None
    def get_config(self):
        return self.args
    def parse_args(self):
        p = argparse.ArgumentParser()
        p.add_argument("--dev")
        ns, rest = p.parse_known_args()
        self.args = vars(ns)
        sys.argv[1:] = rest
parser = ArgsParser()
'''
TESTS = '''
import errno, unittest
import pyverbs.device as d
from pyverbs.pyverbs_error import PyverbsRDMAError
from pyverbs.pd import PD
from pyverbs.flow import Flow, FlowAttr
from args_parser import parser

class Mini(unittest.TestCase):
    def test_query(self):
        assert parser.get_config()["dev"] is None
        with d.Context(name=d.get_device_list()[0].name.decode()) as ctx:
            self.assertEqual(ctx.query_device().vendor_id, 0x02c9)

    def test_flow(self):
        with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
            try:
                Flow(pd, FlowAttr(port=1))
            except PyverbsRDMAError as ex:
                if ex.error_code == errno.EOPNOTSUPP:
                    raise unittest.SkipTest("Flow is not supported")
                raise

    def test_wrong(self):
        self.assertEqual(1, 2)
'''


@pytest.fixture
def suite(tmp_path: pathlib.Path) -> pathlib.Path:
    for name, text in (("__init__.py", INIT), ("args_parser.py", ARGS), ("base.py", ""),
                       ("test_mini.py", TESTS)):
        (tmp_path / name).write_text(textwrap.dedent(text))
    return tmp_path


def peermem(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "peermem", *args], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_the_runner_reports_each_outcome_and_the_skip_reasons(suite):
    r = peermem("rdma-core-tests", str(suite))
    assert r.returncode == 1, r.stderr  # test_wrong failed
    assert "FAIL  tests.test_mini.Mini.test_wrong" in r.stdout
    assert "3 collected: 1 passed, 1 failed, 0 errored, 1 skipped" in r.stdout
    assert "1  Flow is not supported" in r.stdout
    assert "Traceback" not in r.stderr


def test_k_selects_tests_and_a_clean_run_exits_0(suite):
    r = peermem("rdma-core-tests", str(suite), "-k", "query", "-v")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok    tests.test_mini.Mini.test_query" in r.stdout
    assert "1 collected: 1 passed, 0 failed, 0 errored, 0 skipped" in r.stdout


@pytest.mark.parametrize("args,message", [
    (("/nonexistent",), "not rdma-core's tests/ folder"),
    (("{suite}", "--files", "test_nope"), "--files: no test_nope in"),
])
def test_bad_input_is_one_line_and_exit_2(suite, args, message):
    r = peermem("rdma-core-tests", *(a.format(suite=suite) for a in args))
    assert r.returncode == 2 and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and r.stdout == ""


def test_the_alias_maps_pyverbs_only_when_installed():
    assert not alias.installed()
    try:
        alias.install()
        import pyverbs.device  # noqa: PLC0415 - the point: the aliased import

        import userspace.pyverbs.device as ours
        assert pyverbs.device is ours
        from pyverbs.enums import IBV_QPT_RC
        assert IBV_QPT_RC == 2
    finally:
        alias.uninstall()
    assert "pyverbs" not in sys.modules and "pyverbs.device" not in sys.modules
    with pytest.raises(ImportError):
        import pyverbs.qp  # noqa: F401


def test_the_alias_refuses_to_mix_with_another_pyverbs(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyverbs", type(sys)("pyverbs"))
    sys.modules["pyverbs"].__file__ = "/usr/lib/python3/dist-packages/pyverbs/__init__.py"
    with pytest.raises(RuntimeError, match="another pyverbs"):
        alias.install()
    assert not alias.installed()


def _fetch(tmp_path: pathlib.Path, mirror: str, *args: str) -> subprocess.CompletedProcess:
    import os
    env = dict(os.environ, PEERMEM_DEBIAN_MIRROR=mirror, PEERMEM_CACHE=str(tmp_path / "cache"))
    return subprocess.run([sys.executable, "-m", "peermem", "rdma-core-tests", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300, env=env)


def test_an_unreachable_pool_fails_the_fetch_with_one_line(tmp_path):
    """No path and no way to Debian's pool: one line naming the failure, exit 1."""
    r = _fetch(tmp_path, "http://127.0.0.1:9/debian")
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.startswith("peermem rdma-core-tests: cannot fetch rdma-core's tests: ")
    assert len(r.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "cache" / "rdma-core-tests-56.1-1").exists()


def test_a_package_whose_sha256_is_wrong_is_refused(tmp_path):
    from peermem_testing.rdma_core_suite import DEBIAN_PACKAGE
    pool = tmp_path / "mirror" / "pool" / "main" / "r" / "rdma-core"
    pool.mkdir(parents=True)
    (pool / f"{DEBIAN_PACKAGE}_44.0-2_amd64.deb").write_bytes(b"!<arch>\nnot the package")
    r = _fetch(tmp_path, (tmp_path / "mirror").as_uri(), "--release", "44.0-2")
    assert r.returncode == 1 and "is not python3-pyverbs 44.0-2's" in r.stderr
    assert not any((tmp_path / "cache").glob("rdma-core-tests-*"))


def _deb(files: dict[str, bytes]) -> bytes:
    """A Debian package (ar: debian-binary, control.tar.xz, data.tar.xz) holding files."""
    import io
    import tarfile

    def tar(entries: dict[str, bytes]) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:xz") as t:
            for name, data in entries.items():
                info = tarfile.TarInfo(name)
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
        return out.getvalue()

    def member(name: str, data: bytes) -> bytes:
        head = f"{name:<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n".encode()
        return head + data + (b"\n" if len(data) & 1 else b"")

    return b"!<arch>\n" + member("debian-binary", b"2.0\n") + \
        member("control.tar.xz", tar({"./control": b"Package: x\n"})) + \
        member("data.tar.xz", tar(files))


def test_extract_suite_unpacks_the_tests_folder_and_gunzips(tmp_path):
    import gzip

    from peermem_testing.rdma_core_suite import extract_suite
    doc = "./usr/share/doc/rdma-core/tests/"
    deb = _deb({doc + "base.py": b"# base", doc + "utils.py.gz": gzip.compress(b"# utils"),
                doc + "sub/x.py": b"# not taken", "./usr/lib/other.py": b"# not taken"})
    extract_suite(deb, tmp_path / "suite")
    assert sorted(p.name for p in (tmp_path / "suite").iterdir()) == ["base.py", "utils.py"]
    assert (tmp_path / "suite" / "utils.py").read_bytes() == b"# utils"
    with pytest.raises(ValueError, match="no ar header"):
        extract_suite(b"PK\x03\x04", tmp_path / "zip")
    with pytest.raises(ValueError, match="base.py"):
        extract_suite(_deb({doc + "x.py": b""}), tmp_path / "nobase")


def test_the_cli_offers_the_known_releases():
    from peermem.cli import build_parser
    from peermem_testing.rdma_core_suite import DEBIAN_VERSION, KNOWN_RELEASES
    action = next(a for a in build_parser()._subparsers._group_actions[0].choices[
        "rdma-core-tests"]._actions if a.dest == "release")
    assert set(action.choices) == set(KNOWN_RELEASES) and action.default == DEBIAN_VERSION
