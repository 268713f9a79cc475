"""The implicit host's programs and the queries rdma-core v56's suite added:
userspace/pyverbs/programs.py (subprocess runs `rdma`, `cat`, `ls`, `ip` on the
emulated host), userspace/tools/rdma.py (iproute2's `rdma link/dev show`), the port
state files in sysfs, UVERBS_METHOD_QUERY_PORT (active_speed_ex), get_pkey_index,
speed_to_str with two arguments, mem_alloc.madvise and the v56 enum members."""

from __future__ import annotations

import errno
import io
import json
import subprocess

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.libc import read_sysfs
from userspace.libibverbs import cmd
from userspace.libibverbs.cmd import VerbsError
from userspace.pyverbs import host, mem_alloc, programs
from userspace.pyverbs.providers.mlx5 import mlx5_enums as dve
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.tools import rdma

PORT = "/sys/class/infiniband/mlx5_0/ports/1"


@pytest.fixture
def installed():
    programs.install()
    try:
        yield
    finally:
        programs.uninstall()


def run_rdma(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = rdma.main(host.current_process(), list(argv), out, err)
    return rc, out.getvalue(), err.getvalue()


# -- sysfs: the port attribute group -----------------------------------------------------
def test_the_port_state_files_show_what_query_port_answers():
    p = host.current_process()
    assert read_sysfs(p, f"{PORT}/state") == "4: ACTIVE\n"
    assert read_sysfs(p, f"{PORT}/phys_state") == "5: LinkUp\n"
    assert read_sysfs(p, f"{PORT}/link_layer") == "Ethernet\n"
    assert read_sysfs(p, "/sys/class/infiniband/mlx5_0/ports/2/state") is None


# -- iproute2's rdma ----------------------------------------------------------------------
def test_rdma_link_show_json_lists_each_port_without_a_netdev():
    rc, out, err = run_rdma("link", "show", "-j")   # options after the object, as GNU getopt
    assert (rc, err) == (0, "")
    assert json.loads(out) == [{"ifindex": 0, "ifname": "mlx5_0", "port": 1, "state": "ACTIVE",
                                "physical_state": "LINK_UP"}]


def test_rdma_link_and_dev_as_text_and_abbreviated():
    assert run_rdma("l") == (0, "link mlx5_0/1 state ACTIVE physical_state LINK_UP \n", "")
    assert run_rdma("link", "sh", "mlx5_0/1")[1] == run_rdma("link")[1]
    rc, out, _ = run_rdma("dev")
    assert rc == 0 and out.startswith("0: mlx5_0: node_type ca fw 22.")
    (dev,) = json.loads(run_rdma("-j", "dev", "show", "mlx5_0")[1])
    assert dev["node_type"] == "ca" and dev["node_guid"].count(":") == 3


@pytest.mark.parametrize("argv,message", [
    (("foo",), 'Object "foo" is unknown, try "rdma help"'),
    (("link", "zap"), 'Command "zap" is unknown, try "rdma link help"'),
    (("link", "show", "mlx9_0"), "Wrong device name"),
    (("link", "show", "mlx5_0/2"), "Wrong port number"),
    (("link", "show", "mlx5_0/x"), "Wrong port number"),
    (("-x", "link"), 'Unknown option "-x"'),
])
def test_rdma_bad_input_is_iproute2s_message_and_exit_1(argv, message):
    assert run_rdma(*argv) == (1, "", message + "\n")


# -- subprocess: the emulated host's programs run there -----------------------------------
def test_check_output_runs_the_hosts_rdma_and_cat(installed):
    out = subprocess.check_output(["rdma", "link", "show", "-j"])
    assert json.loads(out.decode())[0]["ifname"] == "mlx5_0"
    pkey = subprocess.check_output(["cat", f"{PORT}/pkeys/0"], universal_newlines=True)
    assert pkey == "0xffff\n"
    assert subprocess.check_output(["ls", "/sys/class/infiniband/"]) == b"mlx5_0\n"
    r = subprocess.run(["ls", f"{PORT}/nope"], capture_output=True, text=True)
    assert r.returncode == 2 and "No such file or directory" in r.stderr


def test_the_host_has_no_net_devices(installed):
    with pytest.raises(subprocess.CalledProcessError) as ex:
        subprocess.check_output(["ip", "-j", "addr", "show", "eth0"], stderr=subprocess.STDOUT)
    assert ex.value.returncode == 1 and b'Device "eth0" does not exist.' in ex.value.output
    assert subprocess.check_output(["ip", "-j", "addr", "show"]) == b"[]\n"
    with pytest.raises(subprocess.CalledProcessError):
        subprocess.check_output(["cat", "/sys/class/infiniband/mlx5_0/device/net/x"])


def test_other_commands_run_on_the_real_machine_and_uninstall_restores(installed):
    assert subprocess.check_output(["echo", "real"]) == b"real\n"
    assert subprocess.check_output(["cat", "/proc/self/comm"]) == b"cat\n"  # not the host's
    programs.uninstall()
    assert subprocess.run is not programs._run
    programs.install()
    assert subprocess.run is programs._run


# -- the queries v56's suite uses ------------------------------------------------------------
def test_query_port_carries_active_speed_ex_from_the_ioctl():
    with d.Context(name="mlx5_0") as ctx:
        attr = ctx.query_port(1)
        assert attr.active_speed_ex == attr.active_speed == 32      # 25 Gb/s per lane
        assert d.speed_to_str(attr.active_speed, attr.active_speed_ex) == "25.0 Gbps"
        assert d.speed_to_str(attr.active_speed) == "25.0 Gbps"         # v44's one argument
        with pytest.raises(PyverbsRDMAError) as ex:
            ctx.query_port(3)
        assert ex.value.error_code == errno.EINVAL


def test_query_port_falls_back_to_the_write_command(monkeypatch):
    """A kernel without UVERBS_METHOD_QUERY_PORT (EPROTONOSUPPORT): the write command
    answers, without active_speed_ex; other ioctl errors are the verb's."""
    with d.Context(name="mlx5_0") as ctx:
        def no_method(*a, **k):
            raise VerbsError(errno.EPROTONOSUPPORT, "ibv_cmd_query_port")
        monkeypatch.setattr(cmd, "execute_ioctl", no_method)
        resp = cmd.ibv_cmd_query_port(ctx.ctx, 1)
        assert resp.active_speed == 32 and resp.active_speed_ex == 0 and resp.state == 4

        def eio(*a, **k):
            raise VerbsError(errno.EIO, "ibv_cmd_query_port")
        monkeypatch.setattr(cmd, "execute_ioctl", eio)
        with pytest.raises(VerbsError) as ex:
            cmd.ibv_cmd_query_port(ctx.ctx, 1)
        assert ex.value.errno == errno.EIO


def test_get_pkey_index():
    with d.Context(name="mlx5_0") as ctx:
        assert ctx.get_pkey_index(port_num=1, pkey=0xFFFF) == 0
        with pytest.raises(PyverbsRDMAError,
                           match="Failed to get pkey index of pkey = 4660 of port 1"):
            ctx.get_pkey_index(port_num=1, pkey=0x1234)


def test_madvise_drops_pages_and_reports_errno():
    addr = mem_alloc.mmap(length=8192)
    mem_alloc.write(addr, b"xyz", 3)
    mem_alloc.madvise(addr, 8192)
    assert mem_alloc.read(addr, 3) == bytes(3)           # a fresh zero page
    with pytest.raises(PyverbsRDMAError) as ex:
        mem_alloc.madvise(addr + 1, 10)
    assert ex.value.error_code == errno.EINVAL and "Failed to madvise memory" in str(ex.value)
    assert mem_alloc.munmap(addr, 8192) == 0


def test_v56_enum_members_have_the_header_values():
    assert (e.IBV_WR_FLUSH, e.IBV_WC_FLUSH, e.IBV_QP_EX_WITH_FLUSH) == (14, 8, 1 << 11)
    assert (e.IBV_ACCESS_FLUSH_GLOBAL, e.IBV_ACCESS_FLUSH_PERSISTENT) == (1 << 8, 1 << 9)
    assert (e.IBV_FLUSH_GLOBAL, e.IBV_FLUSH_PERSISTENT, e.IBV_FLUSH_RANGE, e.IBV_FLUSH_MR) == \
        (1, 2, 0, 1)
    assert e.ibv_query_qp_data_in_order_caps.IBV_QUERY_QP_DATA_IN_ORDER_ALIGNED_128_BYTES == 2
    assert (dve.MLX5DV_QP_CREATE_OOO_DP, dve.MLX5DV_CONTEXT_MASK_OOO_RECV_WRS) == \
        (1 << 7, 1 << 16)
