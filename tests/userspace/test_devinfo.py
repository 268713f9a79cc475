"""`peermem devinfo` (userspace/tools/devinfo.py): ibv_devinfo on the emulated ConnectX.

The CLI builds the machine (mlx5_core + mlx5_ib), a user process prints
through libibverbs only, closes the device and exits, and the CLI runs the
leak check - so every test here also checks that nothing leaked.
"""

from __future__ import annotations

import re

from peermem.cli import main
from userspace.tools import devinfo

#: the seed's gdb dump of the alloc_ucontext response (UAR seed document)
SEED_RESP = {
    "bf_reg_size": 512, "tot_bfregs": 16, "num_dyn_bfregs": 1024, "num_uars_per_page": 1,
    "log_uar_size": 12, "qp_tab_size": 262144, "cache_line_size": 64,
    "max_sq_desc_sz": 1024, "max_rq_desc_sz": 512, "max_send_wqebb": 32768,
    "max_recv_wr": 32768, "max_srq_recv_wr": 32768, "num_ports": 1, "flow_action_flags": 0,
    "comp_mask": 3, "response_length": 72, "cqe_version": 1, "cmds_supp_uhw": 3,
    "eth_min_inline": 2, "clock_info_versions": 1, "hca_core_clock_offset": 0,
    "dump_fill_mkey": 1792,
}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(["devinfo", *argv])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def _resp_section(out: str) -> dict[str, int]:
    """The `name: value` lines of -v's alloc_ucontext section."""
    lines = out.split("\n")
    start = next(i for i, s in enumerate(lines) if "alloc_ucontext response" in s)
    resp = {}
    for s in lines[start + 1:]:
        m = re.fullmatch(r"\t\t(\w+): (\d+)", s)
        if m is None:
            break
        resp[m[1]] = int(m[2])
    return resp


# -- pure helpers ----------------------------------------------------------------------

def test_guid_str_groups_16_bits():
    assert devinfo.guid_str(0x0C42A10300AB0001) == "0c42:a103:00ab:0001"


def test_fw_ver_str_is_the_providers_format():
    assert devinfo.fw_ver_str(22 << 32 | 39 << 16 | 1002) == "22.39.1002"
    assert devinfo.fw_ver_str(16 << 32 | 35 << 16 | 12) == "16.35.0012"


# -- the CLI end to end ------------------------------------------------------------------

def test_verbose_prints_the_seed_response_field_by_field(capsys):
    rc, out, err = _run(capsys, "-v")
    assert rc == 0 and err == ""
    assert _resp_section(out) == SEED_RESP
    assert "hca_id:\tmlx5_0" in out
    assert re.search(r"\tfw_ver:\t+22\.39\.1002\n", out)
    assert re.search(r"\tmax_qp:\t+262144\n", out)
    assert re.search(r"\tmax_sge:\t+30\n", out)      # min(send 30, recv 32)
    assert re.search(r"\tmax_cqe:\t+4194303\n", out)
    assert re.search(r"\t\t\tstate:\t+PORT_ACTIVE \(4\)\n", out)
    assert re.search(r"\t\t\tactive_mtu:\t+1024 \(3\)\n", out)  # 1500-byte netdev MTU


def test_plain_output_has_no_response_section(capsys):
    rc, out, _ = _run(capsys)
    assert rc == 0
    assert "alloc_ucontext response" not in out
    assert "max_qp:" not in out
    assert re.search(r"\tphys_port_cnt:\t+1\n", out)


def test_dyn_uar_reports_no_static_bfregs(capsys):
    rc, out, _ = _run(capsys, "-v", "--dyn-uar")
    assert rc == 0
    resp = _resp_section(out)
    assert resp["tot_bfregs"] == 0
    assert resp["num_dyn_bfregs"] == 0


def test_list_only(capsys):
    rc, out, _ = _run(capsys, "-l")
    assert rc == 0
    assert out == "1 HCA found:\n\tmlx5_0\n\n"


def test_unknown_device_is_an_error(capsys):
    rc, out, err = _run(capsys, "-d", "mlx5_9")
    assert rc == 255            # devinfo returns -1: the shell sees 255
    assert err == "IB device 'mlx5_9' wasn't found\n"


def test_port_beyond_the_device_is_an_error(capsys):
    rc, _, err = _run(capsys, "-i", "2")
    assert rc == 4
    assert err == "Invalid port requested for device\n"
