"""The machinery behind the docs' checked excerpts, shared by every tests/docs/test_*_doc.py.

An excerpt is an HTML comment naming what produced it, directly followed by
a fenced block holding exactly what that printed:

    <!-- peermem trace pin --function demo_pin_and_map -->
    ```text
    ...the command's stdout...
    ```

`peermem ...` markers run the CLI in-process (peermem.cli.main);
`example: NAME` markers run one of the small programs a doc's test module
lists in its EXAMPLES (for output the CLI does not print).  A test module
wires a document to this with a `DocBlocks` and three lines:

    BLOCKS = DocBlocks(ROOT / "docs" / "x.md", EXAMPLES, "python -m tests.docs.test_x_doc --regen")
    @pytest.mark.parametrize("ex", BLOCKS.blocks, ids=BLOCKS.ids)
    def test_example_is_current(ex): BLOCKS.check(ex)

and ends with `if __name__ == "__main__": BLOCKS.regen_main()`.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import pathlib
import re
import shlex
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

_MARKER = re.compile(r"^<!-- (?P<cmd>peermem .+?|example: [a-z0-9_]+) -->$")
_FENCE = "```"


@dataclass(frozen=True)
class Example:
    command: str        # "peermem trace pin ..." or "example: NAME"
    line: int           # 1-based line of the marker
    first: int          # index of the first body line
    close: int          # index of the closing fence line
    lang: str           # the opening fence's info string
    body: str           # the block's text, "" or ending in a newline


def parse(text: str, name: str = "doc") -> list[Example]:
    """Every marked example in the markdown `text` (called `name` in errors), in order."""
    lines = text.split("\n")
    out = []
    for i, line in enumerate(lines):
        m = _MARKER.match(line)
        if m is None:
            if line.startswith("<!-- peermem") or line.startswith("<!-- example"):
                raise ValueError(f"{name}:{i + 1}: malformed example marker {line!r}")
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith(_FENCE):
            raise ValueError(f"{name}:{i + 1}: marker not directly followed by a fence")
        close = next((j for j in range(i + 2, len(lines)) if lines[j] == _FENCE), None)
        if close is None:
            raise ValueError(f"{name}:{i + 2}: fenced block never closed")
        body = "".join(f"{s}\n" for s in lines[i + 2:close])
        out.append(Example(m["cmd"], i + 1, i + 2, close, lines[i + 1][3:], body))
    return out


def cli_argv(command: str) -> list[str]:
    """The argv of a `peermem ...` marker (without the program name)."""
    argv = shlex.split(command)[1:]
    if "-o" in argv:
        raise ValueError(f"{command!r}: an example prints to stdout; drop -o")
    return argv


@contextlib.contextmanager
def fresh_process() -> Iterator[None]:
    """Number the Machines built inside from 0, as in a new `peermem` process.

    What a machine derives from its serial (its default name, the HCA's MAC
    and GUIDs) then reads as it does when the command is typed in a shell,
    whatever the test run built before.  The counter is put back afterwards
    so serials stay unique for the leak check of the tests that follow.
    """
    from kernel_model.emu.machine import Machine
    saved = Machine.next_serial
    Machine.next_serial = 0
    try:
        yield
    finally:
        Machine.next_serial = max(saved, Machine.next_serial)


def run_cli(command: str) -> str:
    """What `peermem ...` prints on stdout, run in-process as if in a fresh process;
    RuntimeError unless it exits 0."""
    from peermem.cli import main
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), fresh_process():
        rc = main(cli_argv(command))
    if rc != 0:
        raise RuntimeError(f"{command!r} exited {rc}: {err.getvalue()}")
    return out.getvalue()


class DocBlocks:
    """One document's excerpts, the programs behind its `example:` markers, and
    the command that rewrites them."""

    def __init__(self, path: pathlib.Path, examples: Mapping[str, Callable[[], str]],
                 regen: str):
        self.path, self.examples, self.regen = path, examples, regen
        self.blocks = parse(path.read_text(), path.name)

    @staticmethod
    def ids(ex: Example) -> str:
        return ex.command

    def produce(self, command: str) -> str:
        """What the example's command prints now."""
        if command.startswith("example: "):
            return self.examples[command.removeprefix("example: ")]()
        return run_cli(command)

    def regenerate(self) -> list[str]:
        """Rewrite every example block from its command; the commands whose block changed."""
        text = self.path.read_text()
        lines = text.split("\n")
        changed = []
        for ex in reversed(parse(text, self.path.name)):
            new = self.produce(ex.command)
            if new != ex.body:
                changed.append(ex.command)
                lines[ex.first:ex.close] = new.rstrip("\n").split("\n")
        if changed:
            self.path.write_text("\n".join(lines))
        return changed[::-1]

    def check(self, ex: Example) -> None:
        """Fail the calling test with a diff when the example's output changed."""
        actual = self.produce(ex.command)
        if actual != ex.body:
            name = self.path.name
            diff = difflib.unified_diff(ex.body.splitlines(keepends=True),
                                        actual.splitlines(keepends=True),
                                        f"{name}:{ex.line}", ex.command)
            pytest.fail(f"{name}:{ex.line}: the output of `{ex.command}` changed; "
                        f"regenerate with: {self.regen}\n" + "".join(diff), pytrace=False)

    def check_nonempty(self, min_cli: int) -> None:
        """At least `min_cli` `peermem` examples, and no empty block."""
        cli = [ex for ex in self.blocks if ex.command.startswith("peermem ")]
        assert len(cli) >= min_cli, f"{self.path.name}: only {len(cli)} `peermem` examples"
        empty = [ex.command for ex in self.blocks if not ex.body.strip()]
        assert not empty, f"empty example blocks (regenerate with: {self.regen}): {empty}"

    def regen_main(self) -> None:
        """The `python -m tests.docs.test_x_doc --regen` entry point."""
        if sys.argv[1:] != ["--regen"]:
            sys.exit(f"usage: {self.regen}")
        for cmd in self.regenerate():
            print(f"updated: {cmd}")
