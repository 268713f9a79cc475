"""docs/differences.md is generated from the code's EMU notes and must match it.

The page lists every deliberate difference from the real kernel and libraries
(`# EMU:` comments and `EMU:` docstring notes); tools/gen_differences.py builds
it.  This test builds it again in memory, so a note added, changed or removed in
the code without regenerating the page fails here, with the command to run.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import sys
import textwrap

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _generator():
    spec = importlib.util.spec_from_file_location("gen_differences",
                                                  ROOT / "tools" / "gen_differences.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_differences", mod)
    spec.loader.exec_module(mod)
    return mod


gen = _generator()


@functools.cache
def _code_notes() -> list:
    """The code's EMU notes, collected once for both tests (a parse of every file)."""
    return gen.collect()


def test_committed_page_matches_the_code() -> None:
    fresh = gen.render(_code_notes())
    committed = (ROOT / "docs" / "differences.md").read_text()
    assert committed == fresh, (
        f"docs/differences.md is out of date with the EMU notes in the code; "
        f"regenerate it with: {gen.REGENERATE}")


def test_every_marked_line_is_on_the_page() -> None:
    """Each file with an EMU: marker in a comment or docstring has its notes listed."""
    notes = _code_notes()
    assert len(notes) > 150
    by_file: dict[str, int] = {}
    for note in notes:
        by_file[note.path] = by_file.get(note.path, 0) + 1
    for pkg in gen.PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            rel = path.relative_to(ROOT).as_posix()
            marked = [ln for ln in path.read_text().splitlines()
                      if gen.MARK.search(ln) and "marked #" not in ln
                      and not ln.lstrip().startswith(("f\"", "f'"))]
            if marked:
                assert by_file.get(rel, 0) >= 1, f"{rel}: EMU notes missing from the page"
    assert all(n.text and "\"\"\"" not in n.text for n in notes)


def _notes(tmp_path: pathlib.Path, source: str) -> list:
    pkg = tmp_path / "kernel_model"
    pkg.mkdir(exist_ok=True)
    path = pkg / "x.py"
    path.write_text(textwrap.dedent(source))
    old = gen.ROOT
    gen.ROOT = tmp_path
    try:
        return gen.notes_in(path)
    finally:
        gen.ROOT = old


def test_comment_note_takes_its_continuation_lines(tmp_path: pathlib.Path) -> None:
    notes = _notes(tmp_path, '''\
        def f():
            # EMU: the first line
            # and its continuation.
            # out_unmap: a label starts another comment
            return 1
        ''')
    assert [(n.path, n.anchor, n.text) for n in notes] == [
        ("kernel_model/x.py", "f", "the first line and its continuation.")]


def test_docstring_and_trailing_notes(tmp_path: pathlib.Path) -> None:
    notes = _notes(tmp_path, '''\
        """Module.

        Lock order: a -> b (EMU: the rest
        of the note) and more prose.
        """
        X = 1  # EMU: fixed, so traces repeat


        class C:
            def m(self):
                """Mirrors m(). EMU: no signals."""
                print("# EMU: output text, not a note")
        ''')
    assert [(n.anchor, n.text) for n in notes] == [
        ("module", "Lock order: a -> b (EMU: the rest of the note)"),
        ("module", "`X = 1` - fixed, so traces repeat"),
        ("C.m", "no signals."),
    ]
