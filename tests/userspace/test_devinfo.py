"""`peermem devinfo` (userspace/tools/devinfo.py): ibv_devinfo on the emulated ConnectX.

The CLI builds the machine (mlx5_core + mlx5_ib), a user process prints
through libibverbs only, closes the device and exits, and the CLI runs the
leak check - so every test here also checks that nothing leaked.
"""

from __future__ import annotations

import re

from userspace.tools import devinfo
from userspace.tools.cli import main

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
