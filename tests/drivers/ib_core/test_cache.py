"""drivers/ib_core/cache.py and ib_addr.py: the RoCE GID table - the default GIDs made
at registration, their sysfs files, ibv_query_gid, the device's copy (SET_ROCE_ADDRESS),
references, unregistration - and the GID/MAC helpers."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.cache import (
    GID_TABLE_ENTRY_PENDING_DEL,
    make_default_gid,
    rdma_get_gid_attr,
    rdma_put_gid_attr,
    rdma_query_gid,
)
from drivers.ib_core.ib_addr import (
    addrconf_ifid_eui48,
    gid_to_str,
    ip_eth_mc_map,
    ipv6_eth_mc_map,
    rdma_get_ll_mac,
    rdma_is_multicast_addr,
    rdma_link_local_addr,
)
from drivers.ib_core.ib_verbs import IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5_ifc import MLX5_ADDR_OF
from kernel_model.sysfs import list_dir, sysfs_create_file, sysfs_create_group, sysfs_remove_dir
from tests.drivers.mlx5_ib.ladder import (
    errno_of,
    fw,
    host,
    ib_dev,
    kqp,
    rc_qp,
    to_state,
)
from userspace.libc import O_RDONLY, free, posix_memalign, read_sysfs
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import Context

SYSFS = "/sys/class/infiniband/mlx5_0/ports/1"


def port_mac(m) -> bytes:
    return fw(m).vport.mac.to_bytes(6, "big")


# -- the GID / MAC helpers ----------------------------------------------------------------
def test_the_default_gid_is_link_local_with_the_macs_eui64():
    mac = bytes.fromhex("b8cef6123456")
    assert addrconf_ifid_eui48(mac) == bytes.fromhex("bacef6fffe123456")  # U/L bit flipped
    gid = make_default_gid(mac)
    assert gid_to_str(gid) == "fe80:0000:0000:0000:bace:f6ff:fe12:3456"
    assert rdma_link_local_addr(gid) and rdma_get_ll_mac(gid) == mac


def test_multicast_gids_map_to_multicast_macs():
    v6 = bytes.fromhex("ff0e0000000000000000000001020304")
    v4 = bytes(10) + b"\xff\xff" + bytes([239, 129, 2, 3])  # ::ffff:239.129.2.3
    assert rdma_is_multicast_addr(v6) and rdma_is_multicast_addr(v4)
    assert ipv6_eth_mc_map(v6) == bytes.fromhex("333301020304")
    assert ip_eth_mc_map(v4[12:]) == bytes.fromhex("01005e010203")  # 23 low bits
    unicast_v4 = bytes(10) + b"\xff\xff" + bytes([10, 0, 0, 1])
    assert not rdma_is_multicast_addr(unicast_v4) and not rdma_link_local_addr(unicast_v4)


# -- the table --------------------------------------------------------------------------
@pytest.fixture
def m():
    return host()


def test_registration_adds_a_default_gid_per_roce_version(m):
    gid = make_default_gid(port_mac(m))
    dev = ib_dev(m)
    with m.kernel():
        assert rdma_query_gid(dev, 1, 0) == rdma_query_gid(dev, 1, 1) == gid
        v1, v2 = rdma_get_gid_attr(dev, 1, 0), rdma_get_gid_attr(dev, 1, 1)
        assert (v1.gid_type, v2.gid_type) == (IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP)
        assert v1.mac == port_mac(m) and (v1.index, v1.port_num) == (0, 1)
        rdma_put_gid_attr(v1)
        rdma_put_gid_attr(v2)
    assert dev.gid_tables[1].sz == 256 and dev.gid_tables[1].default_gid_indices == 0b11


def test_lookups_of_empty_and_absent_entries(m):
    dev = ib_dev(m)
    with m.kernel():
        for fn, index, err in ((rdma_get_gid_attr, 2, errno.ENODATA),
                               (rdma_get_gid_attr, 256, errno.EINVAL),
                               (rdma_get_gid_attr, -1, errno.EINVAL),
                               (rdma_query_gid, 2, errno.EINVAL)):
            with pytest.raises(KernelError) as e:
                fn(dev, 1, index)
            assert e.value.errno == err
        with pytest.raises(KernelError) as e:
            rdma_query_gid(dev, 2, 0)               # no port 2
        assert e.value.errno == errno.EINVAL


def test_the_device_holds_a_copy_of_each_entry(m):
    table = fw(m).roce_addresses
    assert sorted(table) == [0, 1]
    gid = make_default_gid(port_mac(m))
    for index, version, l3 in ((0, 0, 0), (1, 2, 1)):  # v1; v2 over IPv6
        addr = table[index]
        assert bytes(MLX5_ADDR_OF("roce_addr_layout", addr, "source_l3_address")) == gid
        assert (addr["roce_version"], addr["roce_l3_type"]) == (version, l3)
        assert (addr["source_mac_47_32"] << 32 | addr["source_mac_31_0"]) == fw(m).vport.mac


def test_sysfs_gids_and_types(m):
    p = m.spawn("app")
    gid_text = gid_to_str(make_default_gid(port_mac(m))) + "\n"
    assert read_sysfs(p, f"{SYSFS}/gids/0") == read_sysfs(p, f"{SYSFS}/gids/1") == gid_text
    assert read_sysfs(p, f"{SYSFS}/gids/2") == "0000:" * 7 + "0000\n"  # an empty slot
    assert read_sysfs(p, f"{SYSFS}/gids/255") is not None
    assert read_sysfs(p, f"{SYSFS}/gids/256") is None
    assert read_sysfs(p, f"{SYSFS}/gid_attrs/types/0") == "IB/RoCE v1\n"
    assert read_sysfs(p, f"{SYSFS}/gid_attrs/types/1") == "RoCE v2\n"
    fd = p.open(f"{SYSFS}/gid_attrs/types/2", O_RDONLY)
    buf = posix_memalign(p, 0, 64)
    assert p.read(fd, buf, 64) == -errno.ENODATA   # the type of nothing
    free(p, buf, 64)
    p.close(fd)
    p.exit(0)


def test_a_gid_table_lists_as_numbered_files_and_nothing_else(m):
    """The table's files are a numbered group: listed in order, opened by their
    canonical decimal name only, and one more group at the same place is EEXIST."""
    p = m.spawn("app")
    assert list_dir(m, f"{SYSFS}/gids") == sorted(str(i) for i in range(256))
    assert list_dir(m, f"{SYSFS}/gid_attrs") == ["types"]
    assert {"gids", "gid_attrs", "state"} <= set(list_dir(m, SYSFS))
    for name in ("07", "+7", " 7", "7 ", "\u0667", "-1", "256", ""):
        assert read_sysfs(p, f"{SYSFS}/gids/{name}") is None, name
    assert p.getdents(f"{SYSFS}/gids") == list_dir(m, f"{SYSFS}/gids")
    with m.kernel():
        with pytest.raises(KernelError) as e:
            sysfs_create_group(f"{SYSFS}/gids", 4, lambda i: "x\n")
        assert e.value.errno == errno.EEXIST
        with pytest.raises(KernelError) as e:
            sysfs_create_file(f"{SYSFS}/gids/3", lambda: "x\n")
        assert e.value.errno == errno.EEXIST
        sysfs_remove_dir(f"{SYSFS}/gid_attrs/types")      # the group's own directory
    assert list_dir(m, f"{SYSFS}/gid_attrs") == [] and list_dir(m, f"{SYSFS}/gids")
    assert read_sysfs(p, f"{SYSFS}/gid_attrs/types/0") is None
    p.exit(0)


def test_ibv_query_gid_reads_sysfs(m):
    p = m.spawn("app")
    with Context(p) as ctx:
        assert ctx.query_gid(1, 0) == make_default_gid(port_mac(m))
        assert ctx.query_gid(1, 7) == bytes(16)
        assert errno_of(v.ibv_query_gid, ctx.ctx, 1, 256) == errno.ENOENT
        assert errno_of(v.ibv_query_gid, ctx.ctx, 2, 0) == errno.ENOENT
    p.exit(0)


def test_a_qp_holds_its_source_gid_until_destroyed(m):
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    qp = rc_qp(ctx)
    entry = ib_dev(m).gid_tables[1].data_vec[0]
    assert entry.refcnt == 1                     # the table's own
    to_state(qp, v.IBV_QPS_RTR, make_default_gid(port_mac(m)), qp.qp_num)
    assert entry.refcnt == 2 and kqp(p, ctx, qp).av_sgid_attr is entry.attr
    assert v.ibv_destroy_qp(qp) == 0
    assert entry.refcnt == 1
    p.exit(0)


def test_unregistration_deletes_the_entries_and_their_files(m):
    dev = ib_dev(m)
    entries = [e for e in dev.gid_tables[1].data_vec if e is not None]
    m.unload_module("mlx5_ib")
    assert [e.state for e in entries] == [GID_TABLE_ENTRY_PENDING_DEL] * 2
    assert [e.refcnt for e in entries] == [0, 0] and dev.gid_tables == {}
    assert fw(m).roce_addresses == {}
    assert not [path for path in m.chrdevs if "/gids/" in path or "/gid_attrs/" in path]
    assert list_dir(m, SYSFS) == [] and not m.node_groups      # the groups went too
    assert not m.bugs


def test_a_gid_still_held_at_unregistration_is_a_reference_leak(m):
    dev = ib_dev(m)
    with m.kernel():
        rdma_get_gid_attr(dev, 1, 0)          # never put
    m.panic_on_warn = False
    m.unload_module("mlx5_ib")
    assert any("GID entry ref leak" in b for b in m.bugs)
    m.bugs.clear()
