"""The `peermem` console script."""

from __future__ import annotations

import subprocess
import sys

import pytest

from peermem.cli import main


def test_help_lists_the_subcommands(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "gup-test" in capsys.readouterr().out


def test_gup_test_runs_and_leak_checks(capsys):
    assert main(["gup-test", "-m", "4", "-w", "-n", "100"]) == 0
    out = capsys.readouterr().out
    assert "PIN_FAST_BENCHMARK: 1024 pages of 4096 B (4 MiB), backend c" in out
    assert "nr_foll_pin_acquired 1024 nr_foll_pin_released 1024" in out
    assert "leak check: clean" in out


def test_gup_test_python_backend_longterm_64k_pages(capsys):
    assert main(["gup-test", "-m", "2", "-L", "--backend", "python",
                 "--page-size", "65536"]) == 0
    out = capsys.readouterr().out
    assert "PIN_LONGTERM_BENCHMARK: 32 pages of 65536 B (2 MiB), backend python" in out


def test_console_script_is_installed():
    r = subprocess.run([sys.executable, "-m", "peermem", "--version"],
                       capture_output=True, text=True, check=True)
    assert "peermem-model" in r.stdout
