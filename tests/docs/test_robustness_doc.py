"""docs/robustness.md: its fuzzer example runs as pasted, and what it claims of it holds."""

from __future__ import annotations

import re

from tests.docs.docblocks import ROOT

DOC = (ROOT / "docs" / "robustness.md").read_text()


def _example() -> str:
    return re.search(r"<!-- fuzz-example -->\n```python\n(.*?)```", DOC, re.S).group(1)


def test_the_example_runs_and_its_garbage_lands_in_the_senders_own_sq():
    env: dict = {}
    code = _example().replace("w.finish()", "")
    exec(compile(code, "robustness.md", "exec"), env)
    w = env["w"]
    region = w.objs["region"][7]
    assert region.extra["what"] == "wq" and region.proc is w.objs["qp"][0].proc
    assert region.proc.load(region.extra["addr"], 64) == b"\xff" * 64
    w.finish()


def test_the_documented_profile_is_the_suites():
    from tests.fuzz.test_fuzz import FuzzMachine
    s = FuzzMachine.TestCase.settings
    assert f"with {s.max_examples} derandomized" in DOC.replace("\n", " ")
    assert f"examples of {s.stateful_step_count} steps" in DOC.replace("\n", " ")
