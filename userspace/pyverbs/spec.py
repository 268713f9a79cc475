"""pyverbs.spec: flow specs for flow steering: not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct


class EthSpec(AttrStruct):
    """Mirrors pyverbs' EthSpec."""

    _FIELDS = ('dst_mac', 'dst_mac_mask', 'src_mac', 'src_mac_mask', 'ether_type',
               'ether_type_mask', 'vlan_tag', 'vlan_tag_mask', 'is_inner')


class Ipv4ExtSpec(AttrStruct):
    """Mirrors pyverbs' Ipv4ExtSpec."""

    _FIELDS = ('dst_ip', 'dst_ip_mask', 'src_ip', 'src_ip_mask', 'proto', 'proto_mask',
               'tos', 'tos_mask', 'ttl', 'ttl_mask', 'flags', 'flags_mask', 'is_inner')


class Ipv6Spec(AttrStruct):
    """Mirrors pyverbs' Ipv6Spec."""

    _FIELDS = ('dst_ip', 'dst_ip_mask', 'src_ip', 'src_ip_mask', 'flow_label',
               'flow_label_mask', 'next_hdr', 'next_hdr_mask', 'traffic_class',
               'traffic_class_mask', 'hop_limit', 'hop_limit_mask', 'is_inner')


class Spec(AttrStruct):
    """Mirrors pyverbs' Spec."""

    _FIELDS = ()


class TcpUdpSpec(AttrStruct):
    """Mirrors pyverbs' TcpUdpSpec."""

    _FIELDS = ('spec_type', 'dst_port', 'dst_port_mask', 'src_port', 'src_port_mask',
               'is_inner')
