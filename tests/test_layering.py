"""Imports point down only (DESIGN.md): userspace -> syscalls -> drivers -> kernel_model -> c_ext.

Static imports are read with ast from every module, including imports inside
functions; run-time module loading by name (kernel_model.module, like
modprobe) is the one sanctioned way upward.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("c_ext", "kernel_model", "drivers", "peermem_clients", "userspace")
# package -> the project packages it may import
ALLOWED = {
    "c_ext": {"c_ext"},
    "kernel_model": {"c_ext", "kernel_model"},
    "drivers": {"c_ext", "kernel_model", "drivers"},
    "peermem_clients": {"c_ext", "kernel_model", "drivers", "peermem_clients"},
    "userspace": {"kernel_model", "userspace"},
}
# userspace reaches the kernel through a Process (system calls) and shares only
# the uapi headers; the harness modules that boot a machine are listed here, and
# the tracer's reading side (like trace-cmd reading /sys/kernel/tracing), with the
# scheduler's exceptions a traced run may end in, and the race explorer that runs
# programs under many schedules (a harness, like the platform).
USERSPACE_KERNEL_OK = ("kernel_model.uapi", "kernel_model.machine", "kernel_model.process",
                       "kernel_model.platform", "kernel_model.explore",
                       "kernel_model.errno", "kernel_model.trace", "kernel_model.sched")


def _imports(path: pathlib.Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from kernel_model import trace` imports kernel_model.trace
            out += [f"{node.module}.{a.name}" for a in node.names]
    return out


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            yield pkg, path


@pytest.mark.parametrize("pkg,path", list(_modules()),
                         ids=lambda v: str(v.relative_to(ROOT)) if isinstance(v, pathlib.Path)
                         else v)
def test_imports_point_down(pkg: str, path: pathlib.Path) -> None:
    bad = []
    for name in _imports(path):
        top = name.split(".")[0]
        if top not in PACKAGES:
            continue
        if top not in ALLOWED[pkg]:
            bad.append(name)
        elif pkg == "userspace" and top == "kernel_model" and not name.startswith(
                USERSPACE_KERNEL_OK):
            bad.append(name)
    assert not bad, f"{path.relative_to(ROOT)} imports {bad} against the layering"


def test_the_check_catches_an_upward_import(tmp_path: pathlib.Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from drivers import gup_test\n")
    assert _imports(f) == ["drivers.gup_test"]
