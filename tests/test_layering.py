"""Imports point down only (DESIGN.md): userspace -> syscalls -> drivers -> kernel_model -> c_ext.

Static imports are read with ast from every module, including imports inside
functions; run-time module loading by name (kernel_model.module, like
modprobe) is the one sanctioned way upward.

Within a package imports point down too: the import graph of product code has no circle
(strongly connected component), and between the folders no import goes up a floor (FLOORS).
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
USERSPACE_KERNEL_OK = ("kernel_model.uapi", "kernel_model.emu.machine", "kernel_model.emu.process",
                       "kernel_model.emu.platform", "kernel_model.emu.explore",
                       "kernel_model.errno", "kernel_model.trace", "kernel_model.sched")


#: (path, mtime, size) -> what _file_imports read from it: each file is parsed once per
#: session (three checks read its imports), and only the lists are kept, not the tree
_READ: dict[tuple[pathlib.Path, int, int], tuple[list[str], list, list]] = {}


def _file_imports(path: pathlib.Path) -> tuple[list[str], list, list]:
    """A file's imports: every dotted name (_imports), and its (module, name) pairs with
    and without those inside functions (_raw_imports)."""
    st = path.stat()
    key = (path, st.st_mtime_ns, st.st_size)
    got = _READ.get(key)
    if got is None:
        tree = ast.parse(path.read_text(), str(path))
        out = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                out += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                # `from kernel_model import trace` imports kernel_model.trace
                out += [f"{node.module}.{a.name}" for a in node.names]
        got = _READ[key] = (out, _raw_imports(tree, False), _raw_imports(tree, True))
    return got


def _imports(path: pathlib.Path) -> list[str]:
    return _file_imports(path)[0]


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


# --- import circles ----------------------------------------------------------------------
# A circle means no module in it can be read, tested or replaced without all the others.
# Every import statement counts wherever it stands (a function-level import is still a
# dependency, only a deferred one); an import under `if TYPE_CHECKING:` does not, since it
# never runs and only serves annotations.
CYCLE_PACKAGES = PACKAGES + ("peermem_testing", "scenarios", "peermem")

def _module_name(root: pathlib.Path, path: pathlib.Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _raw_imports(tree: ast.AST, module_level_only: bool) -> list[tuple[str, str | None]]:
    """(module, name) pairs: `import a.b` gives ("a.b", None), `from a import b` ("a", "b")."""
    out: list[tuple[str, str | None]] = []

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:
                    visit_stmt(sub)
                continue
            if module_level_only and isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                        ast.Lambda)):
                continue
            visit_stmt(child)

    def visit_stmt(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            out.extend((a.name, None) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.extend((node.module, a.name) for a in node.names)
        visit(node)

    visit(tree)
    return out


def import_graph(root: pathlib.Path, packages: tuple[str, ...],
                 module_level_only: bool = False) -> dict[str, set[str]]:
    """module -> the project modules it imports (`from pkg import name` is pkg.name when
    that is a module, else pkg; `import a.b.c` is the longest prefix that is a module)."""
    paths = {_module_name(root, p): p
             for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}

    def resolve(dotted: str) -> str | None:
        parts = dotted.split(".")
        while parts and ".".join(parts) not in paths:
            parts.pop()
        return ".".join(parts) or None

    graph: dict[str, set[str]] = {}
    for mod, path in paths.items():
        edges = set()
        for module, name in _file_imports(path)[2 if module_level_only else 1]:
            target = resolve(f"{module}.{name}" if name and f"{module}.{name}" in paths
                             else module)
            if target is not None and target != mod:
                edges.add(target)
        graph[mod] = edges
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[frozenset[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(frozenset(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return circles


def cycle_path(graph: dict[str, set[str]], circle: frozenset[str]) -> str:
    """One concrete cycle through the circle's first module, as "a -> b -> c -> a"."""
    start = min(circle)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:  # breadth first, so the cycle printed is a shortest one through start
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & circle):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return " -> ".join([*reversed(path), start])
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{sorted(circle)} is not a circle")


def _describe(graph: dict[str, set[str]], circles: list[frozenset[str]]) -> str:
    return "\n".join(f"  {len(c)} modules: {cycle_path(graph, c)}" for c in circles)


def test_no_import_circles() -> None:
    graph = import_graph(ROOT, CYCLE_PACKAGES)
    circles = import_circles(graph)
    assert not circles, ("import circle(s) in product code; make the imports point down "
                         "(a definition module below, an ops table for the upward call, or "
                         "a TYPE_CHECKING import for annotations):\n" + _describe(graph, circles))


def test_the_finder_reports_a_planted_cycle(tmp_path: pathlib.Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg import b\n")
    (pkg / "b.py").write_text("import os\n\n\ndef f():\n    from pkg.c import x\n")
    (pkg / "c.py").write_text("from pkg.a import y\nx = 1\n")
    # an annotation-only import closes no circle
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from pkg import e\n")
    (pkg / "e.py").write_text("from pkg import d\n")
    graph = import_graph(tmp_path, ("pkg",))
    assert graph["pkg.a"] == {"pkg.b"} and graph["pkg.d"] == set()
    circles = import_circles(graph)
    assert circles == [frozenset({"pkg.a", "pkg.b", "pkg.c"})]
    assert cycle_path(graph, circles[0]) == "pkg.a -> pkg.b -> pkg.c -> pkg.a"
    # the function-level import is what closes it
    assert import_circles(import_graph(tmp_path, ("pkg",), module_level_only=True)) == []


# --- floors ------------------------------------------------------------------------------
# The folders are floors of one stack, bottom first.  A module may import from its own
# floor and the floors below; an import to a floor above fails, wherever the statement
# stands (an import under `if TYPE_CHECKING:` is an annotation, not a dependency).  The
# kernel's primitives are the bottom floors, the emulated silicon sits on them (it uses
# the bus, the IOMMU and the scheduler to model itself), the drivers know the silicon's
# interface (its PRM and register headers) but the silicon never knows a driver, and the
# test bench (kernel_model/emu: Machine, Process, platform, explore, the leak check and
# the trace reader) sits above everything the kernel has: no kernel, device or driver
# code reaches into it.  The front door, `peermem`, is the top floor.
FLOORS: tuple[str, ...] = (
    "c_ext",
    "kernel_model",          # the kernel's primitives (and its uapi headers, its tracer)
    "kernel_model.hw",       # the emulated silicon
    "drivers",
    "peermem_clients",
    "kernel_model.emu",      # the test bench
    "userspace",             # what a process runs (and the harness that boots it)
    "scenarios",             # the stories `peermem trace` tells
    "peermem_testing",       # the pytest plugin, the conformance kit, the fuzzer
    "peermem",               # the command line
)


def floor_of(module: str) -> int:
    """The index in FLOORS of the longest floor name that is module or a package of it."""
    best = -1
    for i, floor in enumerate(FLOORS):
        if (module == floor or module.startswith(floor + ".")) and (
                best < 0 or len(floor) > len(FLOORS[best])):
            best = i
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import from a module to one on a higher floor, as "a (floor) -> b (floor)"."""
    out = []
    for mod in sorted(graph):
        for target in sorted(graph[mod]):
            if floor_of(target) > floor_of(mod):
                out.append(f"{mod} ({FLOORS[floor_of(mod)]}) -> {target} "
                           f"({FLOORS[floor_of(target)]})")
    return out


def test_imports_never_go_up_a_floor() -> None:
    graph = import_graph(ROOT, CYCLE_PACKAGES)
    assert all(floor_of(m) >= 0 for m in graph), [m for m in graph if floor_of(m) < 0]
    bad = upward_imports(graph)
    assert not bad, "imports that go up a floor:\n  " + "\n  ".join(bad)


def test_the_floor_check_catches_an_upward_import() -> None:
    assert floor_of("kernel_model.emu.machine") > floor_of("kernel_model.hw.mlx5") > \
        floor_of("kernel_model.pci")
    graph = {"kernel_model.pci": {"kernel_model.emu.machine"},
             "kernel_model.hw.nvgpu": {"kernel_model.pci"},
             "userspace.tools.x": {"scenarios.story"}}
    assert upward_imports(graph) == [
        "kernel_model.pci (kernel_model) -> kernel_model.emu.machine (kernel_model.emu)",
        "userspace.tools.x (userspace) -> scenarios.story (scenarios)"]
