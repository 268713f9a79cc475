"""Every ```python block in README.md and docs/*.md runs as pasted, and so do the
examples in the pytest plugin's docstring.

A block runs in a fresh namespace, as a reader pastes it into a new session
(machines numbered from 0, stdout captured).  A block that defines a pytest
test (a top-level `def test_...`) runs instead as a test file of its own, all
such files in one pytest subprocess (test_blocks_run), where the plugin's fixtures
are what the page says they are; its tests must pass (an `xfail(strict=True)` one only
while it still fails).  `examples/cmb_peer` is on the path there, as after
`pip install ./examples/cmb_peer`.

Two HTML comments, directly before a block's fence, change that:

    <!-- continues: the block above -->     run it together with the block before
                                           (which then does not run alone)
    <!-- not-runnable: REASON -->          do not run it; the reason is reported

Nothing else skips a block.
"""

from __future__ import annotations

import ast
import contextlib
import io
import pathlib
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from xml.etree import ElementTree

import pytest

from tests.docs.docblocks import ROOT, fresh_process

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLUGIN = ROOT / "peermem_testing" / "pytest_plugin.py"
CMB_PEER = ROOT / "examples" / "cmb_peer"

# Not a skip: pages another change of issue 19 is rewriting right
# now; their blocks run and report, but do not fail the suite until that change lands.
# Remove the entry with it.
PENDING: dict[str, str] = {}    # page -> why its blocks may fail for now (none today)

_COMMENT = re.compile(r"^<!-- (?P<kind>[a-z-]+): (?P<text>.+?) -->$")


@dataclass(frozen=True)
class Block:
    where: str              # "docs/x.md:12", the line of its (first) fence
    code: str
    skip: str | None        # the not-runnable reason, or None


def doc_blocks(path, text: str) -> list[Block]:
    """The runnable units of one markdown text: each block, or a chain of
    `continues` blocks joined, in order."""
    lines = text.split("\n")
    name = str(path.relative_to(ROOT))
    out: list[Block] = []
    i = 0
    while i < len(lines):
        if lines[i] != "```python":
            i += 1
            continue
        close = lines.index("```", i + 1)
        code = "".join(f"{s}\n" for s in lines[i + 1:close])
        notes = {}
        j = i - 1
        while j >= 0 and lines[j].startswith("<!--"):
            m = _COMMENT.match(lines[j])
            if m:
                notes[m["kind"]] = m["text"]
            j -= 1
        if "not-runnable" in notes:
            out.append(Block(f"{name}:{i + 1}", code, notes["not-runnable"]))
        elif "continues" in notes:
            assert out and out[-1].skip is None, f"{name}:{i + 1}: continues no runnable block"
            out[-1] = Block(out[-1].where, out[-1].code + "\n\n" + code, None)
        else:
            out.append(Block(f"{name}:{i + 1}", code, None))
        i = close + 1
    return out


def plugin_blocks() -> list[Block]:
    """The indented examples of the pytest plugin's module docstring."""
    doc = ast.get_docstring(ast.parse(PLUGIN.read_text()))
    chunks = re.findall(r"(?:^(?: {4}.*|)\n)+", doc + "\n", re.M)
    out = []
    for chunk in chunks:
        code = textwrap.dedent(chunk).strip("\n")
        if code:
            out.append(Block(f"{PLUGIN.relative_to(ROOT)} docstring", code + "\n", None))
    return out


BLOCKS = [b for path in DOCS for b in doc_blocks(path, path.read_text())] + plugin_blocks()


def _defines_tests(code: str) -> bool:
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return False                    # exec() then reports it, with the doc's line
    return any(isinstance(n, ast.FunctionDef) and n.name.startswith("test")
               for n in body)


def test_the_docs_have_python_blocks_and_the_markers_are_known():
    assert len([b for b in BLOCKS if b.skip is None]) >= 10
    for path in DOCS:
        for n, line in enumerate(path.read_text().split("\n"), 1):
            m = _COMMENT.match(line)
            if m and m["kind"] in ("not-runnable", "continues", "not-runable", "continue"):
                assert m["kind"] in ("not-runnable", "continues"), f"{path.name}:{n}: {line}"


def test_the_plugin_docstring_examples_are_found():
    assert len(plugin_blocks()) == 2


def _block_file(block: Block) -> str:
    """The test file a block that defines tests runs as (by its place in BLOCKS)."""
    return f"test_block_{BLOCKS.index(block)}.py"


@pytest.fixture(scope="module")
def test_blocks_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict]:
    """Every block that defines tests, each a test file of its own, run by one pytest
    in a subprocess (one interpreter start for them all; a subprocess: an in-process
    run would drop the modules it imported from sys.modules afterwards, and the next
    test would import second copies): the run's output, and per file its counts of
    passed (an xfailed test counts: its strict xfail still fails) and failed (a failure,
    an error - a collection error too - or a strict xfail that passed)."""
    d = tmp_path_factory.mktemp("blocks")
    for b in BLOCKS:
        if b.skip is None and _defines_tests(b.code):
            (d / _block_file(b)).write_text(b.code)
    (d / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(CMB_PEER)!r})\n")
    xml = d / "report.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        f"--junitxml={xml}", "-o", "junit_family=xunit1", str(d)],
                       cwd=d, capture_output=True, text=True, timeout=600)
    report: dict[str, dict[str, int]] = {}
    if xml.exists():
        for case in ElementTree.parse(xml).iter("testcase"):
            where = case.get("file") or case.get("classname", "").replace(".", "/") + ".py"
            got = report.setdefault(pathlib.PurePath(where).name,
                                    {"passed": 0, "failed": 0})
            kinds = {child.tag for child in case}
            if kinds & {"failure", "error"}:
                got["failed"] += 1
            elif "skipped" in kinds and case.find("skipped").get("type") != "pytest.xfail":
                continue
            else:
                got["passed"] += 1
    return r.stdout + r.stderr, report


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_python_block_runs(block: Block, request: pytest.FixtureRequest):
    if block.skip is not None:
        pytest.skip(f"not-runnable: {block.skip}")
    pending = PENDING.get(block.where.split(":")[0])
    try:
        run_block(block, request)
    except (Exception, pytest.fail.Exception) as e:
        if pending is None:
            raise
        pytest.xfail(f"{pending}: {type(e).__name__}: {e}")


def run_block(block: Block, request: pytest.FixtureRequest) -> None:
    """Run one block as the module docstring says; fail the calling test if it fails."""
    if _defines_tests(block.code):
        output, report = request.getfixturevalue("test_blocks_run")
        got = report.get(_block_file(block))
        assert got is not None and not got["failed"] and got["passed"] >= 1, \
            f"{block.where} ({_block_file(block)}): {got}\n" + "\n".join(output.splitlines()[-40:])
        return
    out = io.StringIO()
    with contextlib.redirect_stdout(out), fresh_process():
        exec(compile(block.code, block.where, "exec"), {"__name__": "docblock"})  # noqa: S102
