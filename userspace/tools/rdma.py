"""Mirrors iproute2's `rdma` tool (rdma/rdma.c, link.c, dev.c): `rdma link show` and
`rdma dev show`, as text or JSON (-j), on the emulated host.

    rc = rdma.main(proc, ["link", "show", "-j"], out, err)

rdma-core's test suite (v50+) asks `rdma link show -j` which netdev belongs to a
device's port before it picks a GID; `rdma dev show` lists the devices with their
node type, firmware and GUIDs.  Objects and commands may be abbreviated, as
iproute2 allows ("rdma l", "rdma dev sh"); a name selects one device ("mlx5_0") or
one port ("mlx5_0/1").  Unknown input gets iproute2's message on `err` and exit 1.

# EMU: the real tool asks the kernel over the RDMA netlink family (RDMA_NLDEV_CMD_GET
# and RDMA_NLDEV_CMD_PORT_GET, answered by nldev_get_dumpit and nldev_port_get_dumpit);
# the emulated host has no netlink sockets, so the tool reads the same facts from the
# sysfs files the core publishes for each device and port (sysfs.c shows them from the
# same ib_query_port).  The device index is the device's place in that listing, which
# is the order the devices registered in, as ib_device.index is.
"""

from __future__ import annotations

import json
from typing import Any, TextIO

from userspace.libc import read_sysfs

SYSFS_IB = "/sys/class/infiniband"
#: rdma/link.c's names for the port and physical states
_LINK_STATES = ("NOP", "DOWN", "INIT", "ARMED", "ACTIVE", "ACTIVE_DEFER")
_PHYS_STATES = ("UNKNOWN", "SLEEP", "POLLING", "DISABLED", "ARMED", "LINK_UP",
                "LINK_ERROR_RECOVERY", "PHY_TEST")
#: node_type's number (sysfs "1: CA") to rdma/dev.c's name
_NODE_TYPES = {1: "ca", 2: "switch", 3: "router", 4: "rnic", 5: "usnic", 6: "usnic_udp",
               7: "unspecified"}


def _number(text: str | None) -> int:
    """The number in front of a sysfs "4: ACTIVE" line (0 if there is none)."""
    try:
        return int((text or "0").split(":")[0])
    except ValueError:
        return 0


def _devices(proc: Any) -> list[tuple[int, str]]:
    names = proc.getdents(SYSFS_IB)
    return [] if isinstance(names, int) else list(enumerate(names))


def _links(proc: Any, dev: str, index: int) -> list[dict[str, Any]]:
    ports = proc.getdents(f"{SYSFS_IB}/{dev}/ports")
    rows = []
    for port in sorted(int(p) for p in ([] if isinstance(ports, int) else ports)):
        base = f"{SYSFS_IB}/{dev}/ports/{port}"
        state = _number(read_sysfs(proc, f"{base}/state"))
        phys = _number(read_sysfs(proc, f"{base}/phys_state"))
        # EMU: no netdev is ever listed: the emulated host has no net devices
        rows.append({"ifindex": index, "ifname": dev, "port": port,
                     "state": _LINK_STATES[state] if state < len(_LINK_STATES) else "UNKNOWN",
                     "physical_state":
                         _PHYS_STATES[phys] if phys < len(_PHYS_STATES) else "UNKNOWN"})
    return rows


def _dev(proc: Any, dev: str, index: int) -> dict[str, Any]:
    def attr(name: str) -> str:
        return (read_sysfs(proc, f"{SYSFS_IB}/{dev}/{name}") or "").strip()
    return {"ifindex": index, "ifname": dev,
            "node_type": _NODE_TYPES.get(_number(attr("node_type")), "unknown"),
            "fw": attr("fw_ver"), "node_guid": attr("node_guid"),
            "sys_image_guid": attr("sys_image_guid")}


def _matches(word: str, full: str) -> bool:
    """iproute2's matches(): `word` is a non-empty prefix of `full`."""
    return bool(word) and full.startswith(word)


def main(proc: Any, argv: list[str], out: TextIO, err: TextIO) -> int:
    """`rdma [-j] [-d] OBJECT [show|list] [DEV[/PORT]]`: 0, or 1 with iproute2's message."""
    as_json = False
    args = []
    for a in argv:  # GNU getopt permutes: options may follow the object ("link show -j")
        if not a.startswith("-"):
            args.append(a)
        elif a in ("-j", "-json", "--json"):
            as_json = True
        elif a not in ("-d", "-details", "--details", "-p", "-pretty", "--pretty"):
            print(f'Unknown option "{a}"', file=err)
            return 1
    obj = args.pop(0) if args else "dev"
    if _matches(obj, "link"):
        kind = "link"
    elif _matches(obj, "dev"):
        kind = "dev"
    else:
        print(f'Object "{obj}" is unknown, try "rdma help"', file=err)
        return 1
    devices = _devices(proc)               # the listing, once
    names = [name for _, name in devices]
    if args and (_matches(args[0], "show") or _matches(args[0], "list")):
        args.pop(0)
    elif args and args[0] in names:
        pass
    elif args:
        print(f'Command "{args[0]}" is unknown, try "rdma {kind} help"', file=err)
        return 1
    want_dev, want_port = None, None
    if args:
        want_dev, _, port = args.pop(0).partition("/")
        if want_dev not in names:
            print("Wrong device name", file=err)
            return 1
        if port:
            if not port.isdigit():
                print("Wrong port number", file=err)
                return 1
            want_port = int(port)
    rows: list[dict[str, Any]] = []
    for index, dev in devices:
        if want_dev is not None and dev != want_dev:
            continue
        if kind == "dev":
            rows.append(_dev(proc, dev, index))
        else:
            rows.extend(r for r in _links(proc, dev, index)
                        if want_port is None or r["port"] == want_port)
    if want_port is not None and not rows:
        print("Wrong port number", file=err)
        return 1
    if as_json:
        print(json.dumps(rows, separators=(",", ":")), file=out)
    elif kind == "link":
        for r in rows:
            print(f"link {r['ifname']}/{r['port']} state {r['state']} "
                  f"physical_state {r['physical_state']} ", file=out)
    else:
        for r in rows:
            print(f"{r['ifindex']}: {r['ifname']}: node_type {r['node_type']} fw {r['fw']} "
                  f"node_guid {r['node_guid']} sys_image_guid {r['sys_image_guid']} ",
                  file=out)
    return 0
