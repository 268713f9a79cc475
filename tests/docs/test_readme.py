"""README.md's Python examples run as written (each in its own namespace).

The Quick-start commands are checked by CI itself (.ci/run runs the test
command); these are the library examples a reader copies into a session.
Each block builds its own machines; the suite's autouse fixture then runs
the leak check on them.
"""

from __future__ import annotations

import contextlib
import io
import re

import pytest

from tests.docs.docblocks import ROOT, fresh_process

README = ROOT / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("code", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_python_example_runs(code: str):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), fresh_process():
        exec(compile(code, str(README), "exec"), {"__name__": "readme"})  # noqa: S102
    # an example that says what it prints must print it
    for expected in re.findall(r"# (\d+ b'[^']*')$", code, re.M):
        assert expected in out.getvalue()
