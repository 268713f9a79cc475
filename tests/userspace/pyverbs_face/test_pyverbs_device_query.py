"""userspace/pyverbs/device.py: Context.query_device_ex, query_pkey, query_gid_table and
query_gid_ex - their shapes (pyverbs' classes and properties), values and errors
(pyverbs' messages and error codes, -EINVAL for the GID table's)."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


@pytest.fixture
def ctx():
    with d.Context(name="mlx5_0") as c:
        yield c


def test_query_device_ex_has_pyverbs_shape(ctx):
    attr = ctx.query_device_ex()
    assert isinstance(attr, d.DeviceAttrEx)
    assert isinstance(attr.orig_attr, d.DeviceAttr)
    assert attr.orig_attr.max_qp == ctx.query_device().max_qp
    assert attr.phys_port_cnt_ex == attr.orig_attr.phys_port_cnt == 1
    assert attr.comp_mask == 0 and attr.max_dm_size == 256 << 10  # MEMIC
    assert attr.hca_core_clock == 156250
    assert attr.completion_timestamp_mask == 0x7FFFFFFFFFFFFFFF
    odp = attr.odp_caps
    assert isinstance(odp, d.ODPCaps)
    assert (odp.general_caps, odp.rc_odp_caps, odp.uc_odp_caps, odp.ud_odp_caps,
            odp.xrc_odp_caps) == (e.IBV_ODP_SUPPORT | e.IBV_ODP_SUPPORT_IMPLICIT, 0x3F, 0,
                                  e.IBV_ODP_SUPPORT_SEND, 0x3D)   # RC, XRC, UD send ODP
    assert "ODP General caps" in str(odp)
    assert isinstance(attr.tso_caps, d.TSOCaps) and attr.tso_caps.max_tso == 0
    assert attr.rss_caps.supported_qpts == 1 << e.IBV_QPT_RAW_PACKET
    assert attr.max_wq_type_rq == 1 << 20
    assert attr.raw_packet_caps & e.IBV_RAW_PACKET_CAP_CVLAN_STRIPPING
    assert attr.device_cap_flags_ex & e._IBV_DEVICE_RAW_SCATTER_FCS
    assert attr.device_cap_flags_ex & e._IBV_DEVICE_PCI_WRITE_END_PADDING
    assert isinstance(attr.cq_mod_caps, d.CQModerationCaps)
    assert (attr.cq_mod_caps.max_cq_count, attr.cq_mod_caps.max_cq_period) == (0xFFFF, 0xFFF)
    assert isinstance(attr.tm_caps, d.TMCaps) and attr.tm_caps.flags == 0
    assert isinstance(attr.packet_pacing_caps, d.PacketPacingCaps)
    assert isinstance(attr.pci_atomic_caps, d.PCIAtomicCaps)


def test_query_device_ex_with_an_input_comp_mask_is_einval(ctx):
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_device_ex(d.QueryDeviceExInput(1))
    assert ex.value.error_code == errno.EINVAL
    assert "Failed to query EX device mlx5_0" in ex.value.args[0]


def test_query_pkey(ctx):
    assert ctx.query_pkey(port_num=1, index=0) == 0xFFFF
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_pkey(port_num=1, index=1)
    assert "Failed to query pkey 1 of port 1" in ex.value.args[0]


def test_query_gid_table(ctx):
    entries = ctx.query_gid_table(256)
    assert [(g.port_num, g.gid_index) for g in entries] == [(1, 0), (1, 1)]
    assert [g.gid_type for g in entries] == [e.IBV_GID_TYPE_ROCE_V1, e.IBV_GID_TYPE_ROCE_V2]
    for g in entries:
        assert isinstance(g, d.GIDEntry)
        assert g.gid_str() == ctx.query_gid(1, g.gid_index).gid
        assert g.gid_str() in str(g) and g.ndev_ifindex == 0


@pytest.mark.parametrize("max_entries, flags", [(0, 0), (1, 0), (4, 1)])
def test_query_gid_table_errors_carry_minus_einval(ctx, max_entries, flags):
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_gid_table(max_entries, flags)
    assert ex.value.error_code == -errno.EINVAL
    assert "Failed to query gid tables of the device" in ex.value.args[0]


def test_query_gid_ex(ctx):
    g = ctx.query_gid_ex(port_num=1, gid_index=1)
    assert (g.port_num, g.gid_index, g.gid_type) == (1, 1, e.IBV_GID_TYPE_ROCE_V2)
    assert g.gid_str() == ctx.query_gid(1, 1).gid


@pytest.mark.parametrize("port, index, err", [
    (1, 5, errno.ENODATA), (1, 256, errno.EINVAL), (2, 0, errno.EINVAL)])
def test_query_gid_ex_errors(ctx, port, index, err):
    with pytest.raises(PyverbsRDMAError) as ex:
        ctx.query_gid_ex(port_num=port, gid_index=index)
    assert ex.value.error_code == err
    assert f"Failed to query gid table of port {port} in index {index}" in ex.value.args[0]
