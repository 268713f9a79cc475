"""docs/tracing.md shows real output: every example is rerun and compared.

An example is an HTML comment naming what produced it, directly followed by
a fenced block holding exactly what that printed:

    <!-- peermem trace pin --function demo_pin_and_map -->
    ```text
    ...the command's stdout...
    ```

`peermem ...` markers run the CLI in-process (userspace.tools.cli.main);
`example: NAME` markers run one of the small programs in EXAMPLES (for
output the CLI does not print, such as an assert_call_flow failure).  When
the tracer, a formatter or a scenario changes, rewrite the blocks with

    python -m tests.docs.test_tracing_doc --regen

(from the repository root; `tests` is a namespace package there) and read
the diff before committing it.
"""

from __future__ import annotations

import ast
import contextlib
import difflib
import io
import json
import pathlib
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from userspace.tools.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "tracing.md"
REGEN = "python -m tests.docs.test_tracing_doc --regen"

_MARKER = re.compile(r"^<!-- (?P<cmd>peermem .+?|example: [a-z_]+) -->$")
_FENCE = "```"


@dataclass(frozen=True)
class Example:
    command: str        # "peermem trace pin ..." or "example: NAME"
    line: int           # 1-based line of the marker
    first: int          # index of the first body line
    close: int          # index of the closing fence line
    lang: str           # the opening fence's info string
    body: str           # the block's text, "" or ending in a newline


def parse(text: str) -> list[Example]:
    """Every marked example in the markdown `text`, in order."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if m is None:
            if line.startswith("<!-- peermem") or line.startswith("<!-- example"):
                raise ValueError(f"{DOC.name}:{i + 1}: malformed example marker {line!r}")
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(_FENCE):
            raise ValueError(f"{DOC.name}:{i + 1}: marker not directly followed by a fence")
        close = next((j for j in range(i + 2, len(lines)) if lines[j] == _FENCE), None)
        if close is None:
            raise ValueError(f"{DOC.name}:{i + 2}: fenced block never closed")
        body = "".join(f"{s}\n" for s in lines[i + 2:close])
        out.append(Example(m["cmd"], i + 1, i + 2, close, lines[i + 1][3:], body))
    return out


# -- the examples that are not CLI commands ---------------------------------------

#: the failing flow shown in the doc, as its source text (sets are literals too)
CALL_FLOW_FAILURE = ('["sys_mmap", "pin_user_pages_remote", '
                     '{"dma_map_sgtable", "handle_mm_fault"}, "unpin_user_pages"]')


def _call_flow_failure() -> str:
    from kernel_model.tracefilter import assert_call_flow
    from scenarios import run_traced
    trace = run_traced("pin")
    try:
        assert_call_flow(trace, ast.literal_eval(CALL_FLOW_FAILURE))
    except AssertionError as e:
        return (f'>>> trace = run_traced("pin")\n'
                f">>> assert_call_flow(trace, {CALL_FLOW_FAILURE})\n"
                f"Traceback (most recent call last):\n  ...\nAssertionError: {e}\n")
    raise AssertionError("the doc's failing call flow passed")


EXAMPLES: dict[str, Callable[[], str]] = {"call_flow_failure": _call_flow_failure}


def _argv(command: str) -> list[str]:
    argv = shlex.split(command)[1:]
    if "-o" in argv:
        raise ValueError(f"{command!r}: an example prints to stdout; drop -o")
    return argv


def produce(command: str) -> str:
    """What the example's command prints now (outside pytest: the regen path)."""
    if command.startswith("example: "):
        return EXAMPLES[command.removeprefix("example: ")]()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(_argv(command))
    if rc != 0:
        raise RuntimeError(f"{command!r} exited {rc}")
    return buf.getvalue()


def regenerate(path: pathlib.Path = DOC) -> list[str]:
    """Rewrite every example block of `path` from its command; the commands whose
    block changed."""
    text = path.read_text()
    lines = text.split("\n")
    changed = []
    for ex in reversed(parse(text)):
        new = produce(ex.command)
        if new != ex.body:
            changed.append(ex.command)
            lines[ex.first:ex.close] = new.rstrip("\n").split("\n")
    if changed:
        path.write_text("\n".join(lines))
    return changed[::-1]


# -- the tests ----------------------------------------------------------------------

_ALL = parse(DOC.read_text())


def test_the_doc_has_examples():
    cli = [ex for ex in _ALL if ex.command.startswith("peermem ")]
    assert len(cli) >= 4, f"{DOC.name}: only {len(cli)} `peermem` examples"
    empty = [ex.command for ex in _ALL if not ex.body.strip()]
    assert not empty, f"empty example blocks (regenerate with: {REGEN}): {empty}"


@pytest.mark.parametrize("ex", _ALL, ids=[ex.command for ex in _ALL])
def test_example_is_current(ex: Example, capsys):
    if ex.command.startswith("example: "):
        actual = EXAMPLES[ex.command.removeprefix("example: ")]()
    else:
        assert main(_argv(ex.command)) == 0, capsys.readouterr().err
        actual = capsys.readouterr().out
    if actual != ex.body:
        diff = difflib.unified_diff(ex.body.splitlines(keepends=True),
                                    actual.splitlines(keepends=True),
                                    f"{DOC.name}:{ex.line}", ex.command)
        pytest.fail(f"{DOC.name}:{ex.line}: the output of `{ex.command}` changed; "
                    f"regenerate with: {REGEN}\n" + "".join(diff), pytrace=False)


@pytest.mark.parametrize("ex", [ex for ex in _ALL if "--format perfetto" in ex.command],
                         ids=lambda ex: ex.command)
def test_perfetto_examples_are_json_blocks(ex: Example):
    assert ex.lang == "json"
    assert json.loads(ex.body)["traceEvents"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--regen"]:
        sys.exit(f"usage: {REGEN}")
    for cmd in regenerate():
        print(f"updated: {cmd}")
