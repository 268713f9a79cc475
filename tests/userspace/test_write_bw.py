"""`peermem write-bw` (userspace/tools/write_bw.py): perftest's ib_write_bw on the emulated stack.

The CLI builds the machine(s), a server and a client process bring RC QPs to
RTS against each other, the client RDMA-WRITEs, the server verifies every
byte, both processes tear down and exit, and the CLI runs the leak check -
so every run here also checks that nothing leaked.
"""

from __future__ import annotations

import re

import pytest

from kernel_model.sched import SCHED
from peermem.cli import main
from userspace.tools import write_bw

HEADER = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"


def _run(capsys, *argv: str) -> str:
    assert main(["write-bw", *argv]) == 0
    return capsys.readouterr().out


def _result_row(out: str) -> list[str]:
    lines = out.split("\n")
    i = lines.index(HEADER)
    assert re.fullmatch(r"-{87}", lines[i + 2])
    return lines[i + 1].split()


@pytest.mark.parametrize("two", [False, True], ids=["loopback", "two-machines"])
def test_write_bw_reports_and_verifies(capsys, two):
    out = _run(capsys, "--size", "4096", "--iters", "50", *(["--two-machines"] if two else []))
    assert "RDMA_Write BW Test" in out
    assert " Connection type : RC" in out
    assert " TX depth        : 50" in out              # min(tx_depth 128, iters)
    row = _result_row(out)
    assert row[:2] == ["4096", "50"]
    peak, avg, rate = (float(x) for x in row[2:])
    assert peak >= avg > 0 and rate > 0
    # MsgRate and BW average come from the same total time
    assert abs(avg * (1 << 20) / 4096 / 1e6 - rate) <= 1e-5 + 0.01 * rate
    assert " data verified: 4096 bytes at the server match the client's buffer" in out
    assert out.rstrip().endswith("leak check: clean")
    addrs = re.findall(r" (local|remote) address: LID 0000 QPN (0x[0-9a-f]+) PSN (0x[0-9a-f]+)",
                       out)
    assert [(who, psn) for who, _, psn in addrs] == [("local", "0x4d5e6f"),
                                                   ("remote", "0x1a2b3c")]
    assert addrs[0][1] != addrs[1][1] or two   # one machine: two distinct QPNs
    assert re.search(r" GID: (\d{2,3}:){15}\d{2,3}\n", out)
    assert SCHED.alive == {}


def test_write_bw_small_tx_depth_and_moderation(capsys):
    """Four in flight, one signalled in three: the unsignalled ones retire with it."""
    out = _run(capsys, "--size", "100", "--iters", "10", "-t", "4", "-Q", "3")
    assert " TX depth        : 4" in out and " CQ Moderation   : 3" in out
    assert _result_row(out)[:2] == ["100", "10"]
    assert " data verified: 100 bytes" in out


def test_write_bw_python_backend(capsys):
    out = _run(capsys, "--size", "8192", "--iters", "5", "--backend", "python")
    assert _result_row(out)[:2] == ["8192", "5"]
    assert "data verified" in out


@pytest.mark.parametrize("kw", [{"size": 0}, {"iters": 0}, {"size": -5}])
def test_write_bw_bad_sizes_are_refused(capsys, kw):
    """The tool refuses them itself (the CLI's parser refuses them before: test_cli_bad_input)."""
    from kernel_model.emu.platform import rdma_host
    m = rdma_host()
    m.load_module("mlx5_ib")
    with pytest.raises(ValueError, match="must be at least 1"):
        write_bw.main((m, m), **kw)
    assert HEADER not in capsys.readouterr().out
    assert SCHED.alive == {}


def test_report_line_format():
    line, peak, avg, rate = write_bw.report(1000, 4, 2, [0.0, 0.5, 1.0, 1.5],
                                            [0.5, 1.0, 1.5, 2.0])
    assert avg == pytest.approx(4000 / 2.0 / (1 << 20))
    assert rate == pytest.approx(4 / 2.0 / 1e6)
    # the best span of 2 consecutive completions: 1.0 s for 2 messages
    assert peak == pytest.approx(1000 / 0.5 / (1 << 20))
    assert line.split() == ["1000", "4", f"{peak:.2f}", f"{avg:.2f}", f"{rate:.6f}"]
