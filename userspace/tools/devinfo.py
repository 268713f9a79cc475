"""Mirrors rdma-core libibverbs/examples/devinfo.c: `ibv_devinfo`, an HCA's attributes.

    p = m.spawn("ibv_devinfo")
    rc = p.run(devinfo.main, p)                      # like `ibv_devinfo`
    rc = p.run(devinfo.main, p, verbose=True)        # like `ibv_devinfo -v`

The program runs in a user process and learns everything through
libibverbs, as the real tool does: the device list from sysfs
(ibv_get_device_list), ibv_open_device, ibv_query_device, ibv_query_port,
the `board_id` sysfs file, then ibv_close_device.  The output has the real
tool's labels, tabs and value formats, so it can be compared line by line
with `ibv_devinfo` on a machine with a ConnectX card.

Two deliberate differences, both marked EMU below:

* `-v` prints the part of ibv_devinfo -v that comes from struct
  ibv_device_attr (the legacy QUERY_DEVICE answer); the extended attributes
  (ODP caps, timestamp mask, TSO/RSS caps ...) need ibv_query_device_ex,
  which the model's libibverbs does not issue.
* `-v` also prints what the mlx5 provider got back from the kernel when it
  opened the device - the mlx5_ib_alloc_ucontext_resp, field by field, in
  the order of the gdb dump in the UAR seed document - because that
  response is what this project is about.  The real tool has no such
  section; with gdb one would `p *resp` in mlx5_set_context().
"""

from __future__ import annotations

import sys
from typing import TextIO

from kernel_model.trace import traced
from userspace.libc import read_sysfs
from userspace.libibverbs import verbs as v

# enum ibv_transport_type / ibv_node_type
IBV_TRANSPORT_IB, IBV_TRANSPORT_IWARP = 0, 1
IBV_NODE_CA, IBV_NODE_RNIC = 1, 4
# enum ibv_port_state
_PORT_STATES = {0: "PORT_NOP", 1: "PORT_DOWN", 2: "PORT_INIT", 3: "PORT_ARMED",
                4: "PORT_ACTIVE", 5: "PORT_ACTIVE_DEFER"}
_MTUS = {1: "256", 2: "512", 3: "1024", 4: "2048", 5: "4096"}
_LINK_LAYERS = {0: "InfiniBand", 1: "InfiniBand", 2: "Ethernet"}
_ATOMIC_CAPS = {0: "ATOMIC_NONE", 1: "ATOMIC_HCA", 2: "ATOMIC_GLOB"}
_VLS = {1: "1", 2: "2", 3: "4", 4: "8", 5: "15"}
_WIDTHS = {1: "1", 2: "4", 4: "8", 8: "12", 16: "2"}
_SPEEDS = {1: "2.5 Gbps", 2: "5.0 Gbps", 4: "10.0 Gbps", 8: "10.0 Gbps", 16: "14.0 Gbps",
           32: "25.0 Gbps", 64: "50.0 Gbps", 128: "100.0 Gbps", 256: "200.0 Gbps"}
_PHYS_STATES = {1: "SLEEP", 2: "POLLING", 3: "DISABLED", 4: "PORT_CONFIGURATION TRAINNING",
                5: "LINK_UP", 6: "LINK_ERROR_RECOVERY", 7: "PHY TEST"}
# enum ibv_device_cap_flags, in the order devinfo.c prints them
_DEVICE_CAP_FLAGS = (
    (1 << 0, "RESIZE_MAX_WR"), (1 << 1, "BAD_PKEY_CNTR"), (1 << 2, "BAD_QKEY_CNTR"),
    (1 << 3, "RAW_MULTI"), (1 << 4, "AUTO_PATH_MIG"), (1 << 5, "CHANGE_PHY_PORT"),
    (1 << 6, "UD_AV_PORT_ENFORCE"), (1 << 7, "CURR_QP_STATE_MOD"), (1 << 8, "SHUTDOWN_PORT"),
    (1 << 9, "INIT_TYPE"), (1 << 10, "PORT_ACTIVE_EVENT"), (1 << 11, "SYS_IMAGE_GUID"),
    (1 << 12, "RC_RNR_NAK_GEN"), (1 << 13, "SRQ_RESIZE"), (1 << 14, "N_NOTIFY_CQ"),
    (1 << 17, "MEM_WINDOW"), (1 << 18, "UD_IP_CSUM"), (1 << 20, "XRC"),
    (1 << 21, "MEM_MGT_EXTENSIONS"), (1 << 23, "MEM_WINDOW_TYPE_2A"),
    (1 << 24, "MEM_WINDOW_TYPE_2B"), (1 << 25, "RC_IP_CSUM"), (1 << 26, "RAW_IP_CSUM"),
    (1 << 29, "MANAGED_FLOW_STEERING"))

#: mlx5_ib_alloc_ucontext_resp fields in the order of the seed's gdb dump
UCONTEXT_RESP_FIELDS = (
    "bf_reg_size", "tot_bfregs", "num_dyn_bfregs", "num_uars_per_page", "log_uar_size",
    "qp_tab_size", "cache_line_size", "max_sq_desc_sz", "max_rq_desc_sz", "max_send_wqebb",
    "max_recv_wr", "max_srq_recv_wr", "num_ports", "flow_action_flags", "comp_mask",
    "response_length", "cqe_version", "cmds_supp_uhw", "eth_min_inline",
    "clock_info_versions", "hca_core_clock_offset", "dump_fill_mkey")


def guid_str(guid: int) -> str:
    """devinfo.c guid_str(): four groups of 16 bits in hex."""
    return ":".join(f"{(guid >> s) & 0xFFFF:04x}" for s in (48, 32, 16, 0))


def fw_ver_str(raw: int) -> str:
    """The fw_ver string of struct ibv_device_attr.

    EMU: in rdma-core the provider turns the kernel's raw fw_ver into this
    string (mlx5_query_device: major.minor.subminor, "%d.%d.%04d"); the
    model's ibv_query_device hands back the raw uverbs response, so the
    tool does the provider's formatting here.
    """
    return f"{(raw >> 32) & 0xFFFF}.{(raw >> 16) & 0xFFFF}.{raw & 0xFFFF:04d}"


def transport_of(proc, dev: v.ibv_device) -> int:
    """The device's transport, from its sysfs node_type as libibverbs derives it."""
    text = (read_sysfs(proc, f"{dev.ibdev_path}/node_type") or "").strip()
    node_type = int(text.split(":")[0]) if text[:1].isdigit() else 0
    return IBV_TRANSPORT_IWARP if node_type == IBV_NODE_RNIC else IBV_TRANSPORT_IB


def _named(table: dict[int, str], value: int, default: str) -> str:
    return f"{table.get(value, default)} ({value})"


def _print_device(out: TextIO, a, verbose: bool) -> None:
    """The device part of print_hca_cap() after board_id."""
    w = out.write
    w(f"\tphys_port_cnt:\t\t\t{a.phys_port_cnt}\n")
    if not verbose:
        return
    w(f"\tmax_mr_size:\t\t\t{a.max_mr_size:#x}\n")
    w(f"\tpage_size_cap:\t\t\t{a.page_size_cap:#x}\n")
    w(f"\tmax_qp:\t\t\t\t{a.max_qp}\n")
    w(f"\tmax_qp_wr:\t\t\t{a.max_qp_wr}\n")
    w(f"\tdevice_cap_flags:\t\t0x{a.device_cap_flags:08x}\n")
    known = 0
    for bit, name in _DEVICE_CAP_FLAGS:
        known |= bit
        if a.device_cap_flags & bit:
            w(f"\t\t\t\t\t{name}\n")
    if a.device_cap_flags & ~known:
        w(f"\t\t\t\t\tUnknown flags: 0x{a.device_cap_flags & ~known:X}\n")
    for name, tabs in (("max_sge", 3), ("max_sge_rd", 3), ("max_cq", 4), ("max_cqe", 3),
                       ("max_mr", 4), ("max_pd", 4), ("max_qp_rd_atom", 3),
                       ("max_ee_rd_atom", 3), ("max_res_rd_atom", 2),
                       ("max_qp_init_rd_atom", 2), ("max_ee_init_rd_atom", 2)):
        w(f"\t{name}:{chr(9) * tabs}{getattr(a, name)}\n")
    w(f"\tatomic_cap:\t\t\t{_named(_ATOMIC_CAPS, a.atomic_cap, 'invalid atomic capability')}\n")
    for name, tabs in (("max_ee", 4), ("max_rdd", 3), ("max_mw", 4), ("max_raw_ipv6_qp", 2),
                       ("max_raw_ethy_qp", 2), ("max_mcast_grp", 3),
                       ("max_mcast_qp_attach", 2), ("max_total_mcast_qp_attach", 1),
                       ("max_ah", 4), ("max_fmr", 3)):
        w(f"\t{name}:{chr(9) * tabs}{getattr(a, name)}\n")
    if a.max_fmr:
        w(f"\tmax_map_per_fmr:\t\t{a.max_map_per_fmr}\n")
    w(f"\tmax_srq:\t\t\t{a.max_srq}\n")
    if a.max_srq:
        w(f"\tmax_srq_wr:\t\t\t{a.max_srq_wr}\n")
        w(f"\tmax_srq_sge:\t\t\t{a.max_srq_sge}\n")
    w(f"\tmax_pkeys:\t\t\t{a.max_pkeys}\n")
    w(f"\tlocal_ca_ack_delay:\t\t{a.local_ca_ack_delay}\n")
    # EMU: the ibv_query_device_ex part of -v (ODP, timestamps, TSO, RSS ...) is not modelled


def _print_ucontext_resp(out: TextIO, ctx: v.ibv_context) -> None:
    """-v only: the provider's alloc_ucontext response (see the module docstring)."""
    resp = getattr(ctx, "resp", None)
    if resp is None:
        return
    out.write(f"\tmlx5 alloc_ucontext response ({type(resp).__name__}):\n")
    names = list(UCONTEXT_RESP_FIELDS)
    names += [n for n, _ in resp.FIELDS if n not in names and not n.startswith("reserved")]
    for name in names:
        out.write(f"\t\t{name}: {getattr(resp, name)}\n")


def _print_port(out: TextIO, port: int, pa, transport: int, verbose: bool) -> None:
    """The per-port part of print_hca_cap()."""
    w = out.write
    w(f"\t\tport:\t{port}\n")
    w(f"\t\t\tstate:\t\t\t{_named(_PORT_STATES, pa.state, 'invalid state')}\n")
    w(f"\t\t\tmax_mtu:\t\t{_named(_MTUS, pa.max_mtu, 'invalid MTU')}\n")
    w(f"\t\t\tactive_mtu:\t\t{_named(_MTUS, pa.active_mtu, 'invalid MTU')}\n")
    w(f"\t\t\tsm_lid:\t\t\t{pa.sm_lid}\n")
    w(f"\t\t\tport_lid:\t\t{pa.lid}\n")
    w(f"\t\t\tport_lmc:\t\t0x{pa.lmc:02x}\n")
    w(f"\t\t\tlink_layer:\t\t{_LINK_LAYERS.get(pa.link_layer, 'Unknown')}\n")
    if verbose:
        w(f"\t\t\tmax_msg_sz:\t\t{pa.max_msg_sz:#x}\n")
        w(f"\t\t\tport_cap_flags:\t\t0x{pa.port_cap_flags:08x}\n")
        # EMU: port_cap_flags2 travels only in the ioctl QUERY_PORT; the write() answer has none
        w("\t\t\tport_cap_flags2:\t0x0000\n")
        w(f"\t\t\tmax_vl_num:\t\t{_named(_VLS, pa.max_vl_num, 'invalid value')}\n")
        w(f"\t\t\tbad_pkey_cntr:\t\t{pa.bad_pkey_cntr:#x}\n")
        w(f"\t\t\tqkey_viol_cntr:\t\t{pa.qkey_viol_cntr:#x}\n")
        w(f"\t\t\tsm_sl:\t\t\t{pa.sm_sl}\n")
        w(f"\t\t\tpkey_tbl_len:\t\t{pa.pkey_tbl_len}\n")
        w(f"\t\t\tgid_tbl_len:\t\t{pa.gid_tbl_len}\n")
        w(f"\t\t\tsubnet_timeout:\t\t{pa.subnet_timeout}\n")
        w(f"\t\t\tinit_type_reply:\t{pa.init_type_reply}\n")
        width = _WIDTHS.get(pa.active_width, "invalid width")
        w(f"\t\t\tactive_width:\t\t{width}X ({pa.active_width})\n")
        w(f"\t\t\tactive_speed:\t\t{_named(_SPEEDS, pa.active_speed, 'invalid speed')}\n")
        if transport == IBV_TRANSPORT_IB:
            phys = _named(_PHYS_STATES, pa.phys_state, "invalid physical state")
            w(f"\t\t\tphys_state:\t\t{phys}\n")
        # EMU: print_all_port_gids (the GID[i] lines) is not reproduced; see ibv_query_gid
    w("\n")


@traced
def print_hca_cap(proc, dev: v.ibv_device, ib_port: int, verbose: bool,
                  out: TextIO, err: TextIO) -> int:
    """Mirrors devinfo.c print_hca_cap(): open, query device and ports, close.

    Returns devinfo's codes: 0, 1 (open failed), 2 (query failed), 4 (no such
    port), 3 (close failed).
    """
    try:
        ctx = v.ibv_open_device(proc, dev)
    except OSError:
        err.write("Failed to open device\n")
        return 1
    try:
        rc = _print_open_device(proc, dev, ctx, ib_port, verbose, out, err)
    except BaseException:
        v.ibv_close_device(ctx)
        raise
    # cleanup:
    if v.ibv_close_device(ctx):
        err.write("Failed to close device")
        rc = 3
    return rc


def _print_open_device(proc, dev: v.ibv_device, ctx: v.ibv_context, ib_port: int,
                       verbose: bool, out: TextIO, err: TextIO) -> int:
    try:
        a = v.ibv_query_device(ctx)
    except OSError:
        err.write("Failed to query device props\n")
        return 2
    if ib_port and ib_port > a.phys_port_cnt:
        err.write("Invalid port requested for device\n")
        return 4
    transport = transport_of(proc, dev)
    w = out.write
    w(f"hca_id:\t{dev.name}\n")
    tname = {IBV_TRANSPORT_IB: "InfiniBand", IBV_TRANSPORT_IWARP: "iWARP"}[transport]
    w(f"\ttransport:\t\t\t{tname} ({transport})\n")
    w(f"\tfw_ver:\t\t\t\t{fw_ver_str(a.fw_ver)}\n")
    w(f"\tnode_guid:\t\t\t{guid_str(a.node_guid)}\n")
    w(f"\tsys_image_guid:\t\t\t{guid_str(a.sys_image_guid)}\n")
    w(f"\tvendor_id:\t\t\t0x{a.vendor_id:04x}\n")
    w(f"\tvendor_part_id:\t\t\t{a.vendor_part_id}\n")
    w(f"\thw_ver:\t\t\t\t0x{a.hw_ver:X}\n")
    board_id = read_sysfs(proc, f"{dev.ibdev_path}/board_id")
    if board_id:
        w(f"\tboard_id:\t\t\t{board_id.rstrip(chr(10))}\n")
    _print_device(out, a, verbose)
    if verbose:
        _print_ucontext_resp(out, ctx)
    for port in range(1, a.phys_port_cnt + 1):
        if ib_port and port != ib_port:
            continue
        try:
            pa = v.ibv_query_port(ctx, port)
        except OSError:
            err.write(f"Failed to query port {port} props\n")
            return 1
        _print_port(out, port, pa, transport, verbose)
    return 0


def main(proc, *, ib_devname: str | None = None, ib_port: int = 0, verbose: bool = False,
         list_only: bool = False, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Mirrors devinfo.c main(): every device, or the one named -d; the exit status."""
    out = out or sys.stdout
    err = err or sys.stderr
    devs = v.ibv_get_device_list(proc)
    if list_only:
        out.write(f"{len(devs)} HCA{'s' if len(devs) != 1 else ''} found:\n")
        out.write("".join(f"\t{d.name}\n" for d in devs) + "\n")
        return 0
    if ib_devname is not None:
        devs = [d for d in devs if d.name == ib_devname][:1]
        if not devs:
            err.write(f"IB device '{ib_devname}' wasn't found\n")
            return -1
    elif not devs:
        err.write("No IB devices found\n")
        return -1
    rc = 0
    for dev in devs:
        rc |= print_hca_cap(proc, dev, ib_port, verbose, out, err)
    return rc
