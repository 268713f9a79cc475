"""`peermem fuzz`: a clean campaign, a failing one (shrunk to a runnable script), bad values."""

from __future__ import annotations

import pytest

from peermem.cli import main
from peermem_testing import fuzz


def test_a_clean_campaign_reports_its_operations_and_exits_0(capsys):
    assert main(["fuzz", "--seconds", "1", "--seed", "3", "--length", "40"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("fuzz: seed 3: ") and "ops/s" in out[0]
    ops = int(out[0].split(": ")[2].split()[0])
    assert ops >= 40                       # at least one whole sequence ran
    assert out[1].startswith("no failure")


def test_a_failure_is_shrunk_to_a_script_that_reproduces_it(capsys, monkeypatch):
    """A planted model bug (dealloc_pd raising) is found, shrunk to the one operation
    that matters, and the printed script raises the same failure when run."""
    def broken(self, pd: int) -> None:
        if self._pick("pd", pd) is not None:
            raise KeyError("planted")

    monkeypatch.setattr(fuzz.FuzzWorld, "op_dealloc_pd", broken)
    assert main(["fuzz", "--seconds", "30", "--seed", "1", "--length", "60"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: dealloc_pd" in out and "KeyError" in out
    script = out.split("as Python:\n\n", 1)[1]
    applied = [ln for ln in script.splitlines() if ln.startswith("w.apply(")]
    assert applied[-1].startswith("w.apply('dealloc_pd'")
    assert len(applied) <= 3                 # a PD needs a process and a context at most
    with pytest.raises(fuzz.FuzzFailure, match="KeyError: 'planted'"):
        exec(compile(script, "reproducer", "exec"), {})
    fuzz.SCHED.abandon()


@pytest.mark.parametrize("argv,msg", [
    (["--seconds", "0"], "argument --seconds: must be at least 1, not 0"),
    (["--seconds", "-5"], "argument --seconds: must be at least 1, not -5"),
    (["--seed", "x"], "argument --seed: 'x' is not an integer"),
    (["--length", "0"], "argument --length: must be at least 1, not 0"),
])
def test_bad_values_get_one_line_and_exit_2(capsys, argv, msg):
    with pytest.raises(SystemExit) as e:
        main(["fuzz", *argv])
    assert e.value.code == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.strip().splitlines() == [f"peermem fuzz: error: {msg}"]
