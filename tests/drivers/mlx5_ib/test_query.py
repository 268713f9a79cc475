"""Tests for drivers/mlx5_ib/query.py: query_device, query_port, immutable data, fw string."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.ib_verbs import (
    IB_ATOMIC_HCA,
    IB_MTU_256,
    IB_MTU_1024,
    IB_MTU_2048,
    IB_MTU_4096,
    IB_PORT_ACTIVE,
    IB_PORT_DOWN,
    IB_SPEED_EDR,
    IB_SPEED_SDR,
    IB_WIDTH_1X,
    IB_WIDTH_4X,
    ib_device_attr,
    ib_port_immutable,
    ib_udata,
)
from drivers.mlx5_ib.query import (
    RDMA_CORE_PORT_IBA_ROCE,
    RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP,
    iboe_get_mtu,
    mlx5_get_dev_fw_str,
    mlx5_ib_query_device,
    mlx5_port_roce_immutable,
)
from kernel_model.errno import KernelError
from kernel_model.hw.mlx5 import Mlx5Config
from tests.drivers.mlx5_ib.ladder import host, ib_dev, open_ctx
from userspace.libc import read_sysfs
from userspace.libibverbs import verbs as v


@pytest.fixture(scope="module")
def m():
    return host()


@pytest.fixture
def ctx(m):
    p = m.spawn("app")
    ctx = open_ctx(p)
    yield ctx
    p.exit(0)


def test_query_device_reports_the_capabilities(m, ctx):
    r = v.ibv_query_device(ctx)
    assert (r.fw_ver >> 32, r.fw_ver >> 16 & 0xFFFF, r.fw_ver & 0xFFFF) == (22, 39, 1002)
    # the IEEE OUI from QUERY_ADAPTER (mlx5_query_vendor_id), while sysfs keeps the PCI
    # vendor that libibverbs matched libmlx5 by
    assert (r.vendor_id, r.vendor_part_id) == (0x02C9, 0x101D)
    sysfs = "/sys/class/infiniband_verbs/uverbs0/device/"
    assert (read_sysfs(ctx.proc, sysfs + "vendor"), read_sysfs(ctx.proc, sysfs + "device")) \
        == ("0x15b3\n", "0x101d\n")
    assert r.node_guid == ib_dev(m).node_guid and r.sys_image_guid == r.node_guid
    assert (r.max_qp, r.max_qp_wr, r.max_cq, r.max_cqe) == (1 << 18, 1 << 15, 1 << 24,
                                                           (1 << 22) - 1)
    assert (r.max_mr, r.max_pd, r.max_srq, r.max_srq_wr) == (1 << 24, 1 << 24, 1 << 23,
                                                             (1 << 15) - 1)
    # SQ SGEs: min(max_wqe_sz_sq 1024, 512) minus ctrl+raddr, 16 bytes each; RQ: 512 / 16
    assert (r.max_sge, r.max_srq_sge) == (30, 31)
    assert (r.max_qp_rd_atom, r.max_qp_init_rd_atom, r.max_res_rd_atom) == (16, 16, 16 << 18)
    assert r.page_size_cap == (1 << 64) - 4096 and r.atomic_cap == IB_ATOMIC_HCA
    assert (r.max_pkeys, r.local_ca_ack_delay, r.phys_port_cnt) == (1, 16, 1)
    assert (r.max_mcast_grp, r.max_mcast_qp_attach) == (1 << 21, 240)


def test_query_device_refuses_driver_input(m):
    with m.kernel(), pytest.raises(KernelError) as e:
        mlx5_ib_query_device(ib_dev(m), ib_device_attr(), ib_udata(inlen=8))
    assert e.value.errno == errno.EINVAL


def test_query_port_of_a_100g_roce_port(ctx):
    r = v.ibv_query_port(ctx, 1)
    assert (r.state, r.phys_state) == (IB_PORT_ACTIVE, 5)  # LINK_UP
    assert (r.active_speed, r.active_width) == (IB_SPEED_EDR, IB_WIDTH_4X)
    # hardware MTU 9978 -> 4096; the netdev's 1500 (+ headers) -> 1024
    assert (r.max_mtu, r.active_mtu) == (IB_MTU_4096, IB_MTU_1024)
    assert (r.gid_tbl_len, r.pkey_tbl_len, r.max_msg_sz) == (256, 1, 1 << 30)


def test_port_without_link_is_down_at_sdr_1x():
    m = host(hca=Mlx5Config(eth_proto_oper=0, mtu=4200))
    p = m.spawn("app")
    r = v.ibv_query_port(open_ctx(p), 1)
    assert (r.state, r.phys_state) == (IB_PORT_DOWN, 3)  # DISABLED
    assert (r.active_speed, r.active_width) == (IB_SPEED_SDR, IB_WIDTH_1X)
    assert r.active_mtu == IB_MTU_4096
    p.exit(0)


@pytest.mark.parametrize("mtu,ib", [
    (1500, IB_MTU_1024), (4192, IB_MTU_4096), (4191, IB_MTU_2048), (2144, IB_MTU_2048),
    (2143, IB_MTU_1024), (352, IB_MTU_256), (351, 0), (9000, IB_MTU_4096)])
def test_iboe_get_mtu(mtu, ib):
    assert iboe_get_mtu(mtu) == ib


def test_port_immutable_is_roce_v1_and_v2(m):
    imm = ib_port_immutable()
    with m.kernel():
        mlx5_port_roce_immutable(ib_dev(m), 1, imm)
    assert (imm.pkey_tbl_len, imm.gid_tbl_len, imm.max_mad_size) == (1, 256, 256)
    assert imm.core_cap_flags == RDMA_CORE_PORT_IBA_ROCE | RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP


def test_fw_string_pads_the_subminor(m):
    with m.kernel():
        assert mlx5_get_dev_fw_str(ib_dev(m)) == "22.39.1002"
    m2 = host(hca=Mlx5Config(fw_version="16.35.7"))
    with m2.kernel():
        assert mlx5_get_dev_fw_str(ib_dev(m2)) == "16.35.0007"
