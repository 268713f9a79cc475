"""kernel_model/hw/mlx5_ifc.py: raw PRM mailboxes (prm_pack / prm_unpack) - the
big-endian bit layout of mlx5_ifc.h, MSB first within each dword."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5_ifc import (
    LAYOUTS,
    MLX5_ADDR_OF,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    MLX5_ST_SZ_BYTES,
    PRM_LAYOUTS,
    IfcStruct,
    prm_pack,
    prm_unpack,
)

GEN = {"hca_cap_union": "cmd_hca_cap"}
DEVMEM = {"hca_cap_union": "device_mem_cap"}


def test_sizes_are_the_prm_sizes():
    assert MLX5_ST_SZ_BYTES("query_hca_cap_in") == 0x10
    assert MLX5_ST_SZ_BYTES("query_hca_cap_out") == 0x1010
    assert MLX5_ST_SZ_BYTES("cmd_hca_cap") == MLX5_ST_SZ_BYTES("device_mem_cap") == 0x100
    with pytest.raises(TypeError, match="no PRM offsets"):
        MLX5_ST_SZ_BYTES("create_qp_in")


def test_the_header_is_big_endian_at_its_prm_offsets():
    in_ = IfcStruct("query_hca_cap_in")
    MLX5_SET("mbox_in", in_, "opcode", 0x100)
    MLX5_SET("mbox_in", in_, "uid", 0x1234)
    MLX5_SET("mbox_in", in_, "op_mod", 0xF << 1 | 1)
    MLX5_SET("query_hca_cap_in", in_, "other_function", 1)
    MLX5_SET("query_hca_cap_in", in_, "function_id", 0xabcd)
    raw = prm_pack(in_)
    assert raw == bytes.fromhex("0100 1234 0000 001f 8000 abcd 00000000".replace(" ", ""))
    back = prm_unpack("query_hca_cap_in", raw)
    assert [back[f] for f in ("opcode", "uid", "op_mod", "other_function", "function_id")] \
        == [0x100, 0x1234, 0x1f, 1, 0xabcd]


def test_capability_fields_land_at_their_bits():
    out = IfcStruct("query_hca_cap_out")
    MLX5_SET("mbox_out", out, "status", 0x51)
    MLX5_SET("mbox_out", out, "syndrome", 0xdeadbeef)
    cap = MLX5_ADDR_OF("query_hca_cap_out", out, "capability")
    MLX5_SET("cmd_hca_cap", cap, "log_max_ra_req_dc", 4)   # bits 0x12a..0x12f
    MLX5_SET("cmd_hca_cap", cap, "log_max_ra_res_dc", 5)   # bits 0x13a..0x13f
    MLX5_SET("cmd_hca_cap", cap, "num_lag_ports", 2)       # bits 0x27c..0x27f
    MLX5_SET64("cmd_hca_cap", cap, "general_obj_types", 0x0102030405060708)
    raw = prm_pack(out, GEN)
    assert len(raw) == 0x1010
    assert raw[:8] == bytes.fromhex("51000000deadbeef")
    c = raw[0x10:]
    assert c[0x24:0x28] == bytes.fromhex("00040005")
    assert c[0x4f] == 0x02
    assert c[0x80:0x88] == bytes.fromhex("0102030405060708")
    assert sum(map(bool, raw)) == 1 + 4 + 2 + 1 + 8  # nothing else set


@pytest.mark.parametrize("unions,typ", [(GEN, "cmd_hca_cap"), (DEVMEM, "device_mem_cap")])
def test_every_known_field_round_trips(unions, typ):
    out = IfcStruct("query_hca_cap_out")
    cap = MLX5_ADDR_OF("query_hca_cap_out", out, "capability")
    for i, (name, (_, width)) in enumerate(PRM_LAYOUTS[typ][1].items()):
        value = (0x5A5A5A5A5A5A5A5A + i) & ((1 << width) - 1) or 1
        (MLX5_SET64 if width == 64 else MLX5_SET)(typ, cap, name, value)
    raw = prm_pack(out, unions)
    back = prm_unpack("query_hca_cap_out", raw, unions)
    assert back.subs["capability"].vals == cap.vals
    assert prm_pack(back, unions) == raw


def test_offsets_do_not_overlap_and_fit():
    for typ, (nbits, table) in PRM_LAYOUTS.items():
        taken: set[int] = set()
        for name, (off, kind) in table.items():
            width = PRM_LAYOUTS[kind[1:]][0] if isinstance(kind, str) else kind
            bits = set(range(off, off + width))
            assert not bits & taken and off + width <= nbits, (typ, name)
            taken |= bits
            if isinstance(kind, int) and typ in LAYOUTS:
                assert LAYOUTS[typ][name] == width, (typ, name)


def test_a_short_mailbox_reads_as_zeros_and_values_are_masked():
    got = prm_unpack("query_hca_cap_in", bytes.fromhex("0100"))
    assert got["opcode"] == 0x100 and got["op_mod"] == 0
    in_ = IfcStruct("mbox_in")
    in_.vals["opcode"] = 0x1_0100  # wider than the field: masked as MLX5_SET would
    assert prm_pack(in_) == bytes.fromhex("0100000000000000")


def test_a_union_needs_a_member_with_offsets():
    out = IfcStruct("query_hca_cap_out")
    with pytest.raises(TypeError, match="needs one of its members"):
        prm_pack(out)
    with pytest.raises(TypeError, match="no PRM offsets"):
        prm_pack(out, {"hca_cap_union": "roce_cap"})
    with pytest.raises(TypeError, match="no PRM offsets"):
        prm_pack(IfcStruct("create_cq_in"))


def test_a_device_memory_page_reads_where_rdma_core_tests_read_it():
    """test_mlx5_dm_ops reads memic_operations at bytes 80..84 of the output."""
    out = IfcStruct("query_hca_cap_out")
    cap = MLX5_ADDR_OF("query_hca_cap_out", out, "capability")
    MLX5_SET("device_mem_cap", cap, "memic_operations", 0x3)
    MLX5_SET("device_mem_cap", cap, "memic", 1)
    raw = prm_pack(out, DEVMEM)
    assert int.from_bytes(raw[80:84], "big") == 3 and raw[16] == 0x80
    assert MLX5_GET("device_mem_cap", prm_unpack("query_hca_cap_out", raw, DEVMEM)
                    .subs["capability"], "memic_operations") == 3
