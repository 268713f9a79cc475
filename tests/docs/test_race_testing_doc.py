"""docs/race-testing.md: its worked example is the test that runs, and its claims hold.

The race test shown is the one between the `--8<--` markers in
tests/peermem_testing/test_race_cmb_peer.py, character for character; the
CLI reports it quotes come from the explorer as it is (the first lines of
each, which are deterministic - the timings are not).
"""

from __future__ import annotations

import re

from peermem.cli import main
from tests.docs.docblocks import ROOT

DOC = (ROOT / "docs" / "race-testing.md").read_text()
TEST = (ROOT / "tests" / "peermem_testing" / "test_race_cmb_peer.py").read_text()


def test_the_worked_example_is_the_test_that_runs():
    shown = re.search(r"<!-- race-example -->\n```python\n(.*?)```", DOC, re.S).group(1)
    real = TEST.split("# --8<-- [start:race]\n")[1].split("# --8<-- [end:race]")[0]
    assert shown == real


def test_the_quoted_legacy_report_is_what_the_explorer_prints(capsys):
    assert main(["explore", "free-callback-vs-put-pages", "--legacy"]) == 1
    out = capsys.readouterr().out
    for line in out.splitlines():
        if line.startswith(("free-callback-vs-put-pages (legacy):", "FAILED:", "  schedule",
                            "replay:")):
            assert line in DOC, line


def test_the_quoted_deadlock_report_is_what_the_explorer_prints(capsys):
    assert main(["explore", "dereg-vs-invalidate", "--legacy", "--bound", "1"]) == 1
    out = capsys.readouterr().out.splitlines()
    block = re.search(r"```text\n\$ peermem explore dereg-vs-invalidate --legacy --bound 1\n"
                      r"(.*?)```", DOC, re.S).group(1)
    quoted = [ln for ln in block.splitlines() if ln.strip() != "..."]
    assert len(quoted) >= 5
    for line in quoted:
        assert line in out, line
