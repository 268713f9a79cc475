"""Mirrors include/rdma/ib_addr.h (and the few IPv6 helpers it leans on): GIDs as IPv6
addresses, and the Ethernet MACs some of them encode.

A RoCE GID is an IPv6 address (an IPv4 one is v4-mapped, ::ffff:a.b.c.d).  The
default GID of a port is link-local: fe80::/64 with the modified EUI-64 of the
port's MAC as interface id (the 48-bit MAC split by ff:fe, universal/local bit
flipped), so the MAC can be read back out of such a GID (rdma_get_ll_mac) -
which is how the core resolves a link-local destination without a neighbour
table.  Multicast GIDs map to multicast MACs the way IPv6 and IPv4 map theirs.
"""

from __future__ import annotations

LINK_LOCAL_PREFIX = bytes.fromhex("fe80000000000000")


def ipv6_addr_v4mapped(addr: bytes) -> bool:
    """Mirrors ipv6_addr_v4mapped(): ::ffff:a.b.c.d."""
    return addr[:10] == bytes(10) and addr[10:12] == b"\xff\xff"


def rdma_link_local_addr(addr: bytes) -> bool:
    """Mirrors rdma_link_local_addr(): fe80::/64."""
    return addr[:8] == LINK_LOCAL_PREFIX


def rdma_is_multicast_addr(addr: bytes) -> bool:
    """Mirrors rdma_is_multicast_addr(): ff00::/8, or a v4-mapped 224.0.0.0/4."""
    if addr[0] == 0xFF:
        return True
    return ipv6_addr_v4mapped(addr) and addr[12] & 0xF0 == 0xE0


def addrconf_ifid_eui48(mac: bytes) -> bytes:
    """Mirrors addrconf_ifid_eui48() (net/ipv6/addrconf.c): the modified EUI-64
    interface id of a MAC - mac[0..2] ff:fe mac[3..5], universal/local bit flipped."""
    eui = bytearray(mac[:3] + b"\xff\xfe" + mac[3:6])
    eui[0] ^= 2
    return bytes(eui)


def rdma_get_ll_mac(addr: bytes) -> bytes:
    """Mirrors rdma_get_ll_mac(): the MAC inside a link-local GID's EUI-64."""
    mac = bytearray(addr[8:11] + addr[13:16])
    mac[0] ^= 2
    return bytes(mac)


def ipv6_eth_mc_map(addr: bytes) -> bytes:
    """Mirrors ipv6_eth_mc_map(): 33:33 and the group's last 32 bits."""
    return b"\x33\x33" + addr[12:16]


def ip_eth_mc_map(addr4: bytes) -> bytes:
    """Mirrors ip_eth_mc_map(): 01:00:5e and the group's low 23 bits."""
    return bytes([0x01, 0x00, 0x5E, addr4[1] & 0x7F, addr4[2], addr4[3]])


def gid_to_str(gid: bytes) -> str:
    """A GID as the kernel's %pI6 prints it: eight groups of four hex digits."""
    return ":".join(gid[i:i + 2].hex() for i in range(0, 16, 2))
