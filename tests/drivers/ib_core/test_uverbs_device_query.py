"""The device queries through the system-call boundary: the extended write() command
IB_USER_VERBS_EX_CMD_QUERY_DEVICE (uverbs_main's extended path, ib_uverbs_ex_query_device,
mlx5_ib_query_device's extended capabilities), the DEVICE object's QUERY_GID_TABLE /
QUERY_GID_ENTRY ioctls (uverbs_std_types_device), and the P_Key table in sysfs
(ports/N/pkeys/<i>, ib_query_pkey, mlx5_ib_query_pkey) - each with its errno paths.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from typing import Any

import pytest

from drivers.ib_core.device import ib_query_pkey
from drivers.ib_core.ib_verbs import IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP
from drivers.mlx5_ib.query import (
    IB_RAW_PACKET_CAP_CVLAN_STRIPPING,
    IB_RAW_PACKET_CAP_IP_CSUM,
    IB_RAW_PACKET_CAP_SCATTER_FCS,
    mlx5_ib_query_pkey,
)
from kernel_model.errno import KernelError
from kernel_model.uapi import ib_user_ioctl_cmds as ic
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.rdma_user_ioctl import (
    RDMA_VERBS_IOCTL,
    UVERBS_ATTR_F_VALID_OUTPUT,
    ib_uverbs_attr,
    ib_uverbs_ioctl_hdr,
)
from tests.drivers.mlx5_ib.ladder import host, ib_dev, open_ctx, raw_ctx
from userspace.libc import read_sysfs
from userspace.libibverbs import verbs as v

R = uv.ib_uverbs_ex_query_device_resp
RESP_AT = 0x800
SYSFS = "/sys/class/infiniband/mlx5_0/ports/1"


@pytest.fixture
def m() -> Iterator[Any]:
    yield host()


@pytest.fixture
def ctx(m) -> Iterator[Any]:
    p = m.spawn("app")
    ctx = open_ctx(p)
    yield ctx
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


# -- the extended write() ------------------------------------------------------------------
def write_ex(ctx: Any, req: bytes = bytes(8), in_words: int | None = None,
             out_words: int = R.SIZE // 8, response: int | None = None,
             provider_in: bytes = b"", provider_out_words: int = 0,
             reserved: int = 0, command: int = uv.IB_USER_VERBS_EX_CMD_QUERY_DEVICE) -> int:
    """One hand-made extended command; the write()'s return (count or -errno)."""
    buf = ctx.cmd_buf
    hdr = uv.ib_uverbs_cmd_hdr(command=command | uv.IB_USER_VERBS_CMD_FLAG_EXTENDED,
                               in_words=len(req) // 8 if in_words is None else in_words,
                               out_words=out_words)
    ex = uv.ib_uverbs_ex_cmd_hdr(response=buf + RESP_AT if response is None else response,
                                 provider_in_words=len(provider_in) // 8,
                                 provider_out_words=provider_out_words,
                                 cmd_hdr_reserved=reserved)
    raw = hdr.pack() + ex.pack() + req + provider_in
    ctx.proc.store(buf + RESP_AT, b"\xee" * 512)   # what the kernel does not write shows
    ctx.proc.store(buf, raw)
    return ctx.proc.write(ctx.cmd_fd, buf, len(raw))


def test_ex_query_device_answers_the_base_and_the_extended_caps(ctx):
    assert write_ex(ctx) == 8 + 16 + 8                    # the whole write: its count
    resp = R.unpack(ctx.proc.load(ctx.cmd_buf + RESP_AT, R.SIZE))
    assert resp.base == v.ibv_query_device(ctx)      # copy_query_dev_fields, as QUERY_DEVICE
    assert resp.response_length == R.SIZE == 304
    assert resp.comp_mask == 0
    assert resp.hca_core_clock == 156250            # device_frequency_khz
    assert resp.timestamp_mask == 0x7FFFFFFFFFFFFFFF
    # ODP (IB_ODP_SUPPORT, not implicit) for RC (SEND, RECV, WRITE, READ, ATOMIC,
    # SRQ_RECV) and XRC (all but RECV), none for UD
    assert resp.odp_caps == uv.ib_uverbs_odp_caps(general_caps=3, rc_odp_caps=0x3F,  # +IMPLICIT
                                              ud_odp_caps=1)                    # UD SEND
    assert resp.xrc_odp_caps == 0x3D
    assert resp.max_dm_size == 256 << 10            # max_memic_size
    assert resp.raw_packet_caps == (IB_RAW_PACKET_CAP_CVLAN_STRIPPING
                                    | IB_RAW_PACKET_CAP_SCATTER_FCS | IB_RAW_PACKET_CAP_IP_CSUM)
    assert resp.rss_caps.supported_qpts == 1 << uv.IB_UVERBS_QPT_RAW_PACKET
    assert resp.rss_caps.max_rwq_indirection_tables == 1 << 16       # log_max_rqt
    assert resp.rss_caps.max_rwq_indirection_table_size == 1 << 11   # log_max_rqt_size
    assert resp.max_wq_type_rq == 1 << 20                            # log_max_rq
    assert resp.cq_moderation_caps.max_cq_moderation_count == 0xFFFF
    assert resp.cq_moderation_caps.max_cq_moderation_period == 0xFFF
    assert resp.tm_caps == uv.ib_uverbs_tm_caps()
    assert resp.device_cap_flags_ex & 0xFFFFFFFF == resp.base.device_cap_flags
    assert resp.device_cap_flags_ex >> 32 == (1 << 2 | 1 << 4)  # RAW_SCATTER_FCS, END_PADDING


def test_a_shorter_response_buffer_gets_what_fits_and_says_so(ctx):
    assert write_ex(ctx, out_words=24) > 0                 # 192 bytes: through response_length
    raw = ctx.proc.load(ctx.cmd_buf + RESP_AT, 200)
    assert R.unpack(raw[:192]).response_length == 192
    assert raw[192:] == b"\xee" * 8                        # nothing past the buffer


def test_a_longer_response_buffer_is_zero_filled(ctx):
    assert write_ex(ctx, out_words=R.SIZE // 8 + 2) > 0
    raw = ctx.proc.load(ctx.cmd_buf + RESP_AT, R.SIZE + 16)
    assert R.unpack(raw).response_length == R.SIZE and raw[R.SIZE:] == bytes(16)


@pytest.mark.parametrize("kw, err", [
    (dict(req=(1).to_bytes(4, "little") + bytes(4)), errno.EINVAL),          # comp_mask
    (dict(req=bytes(4) + (1).to_bytes(4, "little")), errno.EINVAL),          # reserved
    (dict(out_words=22), errno.ENOSPC),                   # below offsetofend(response_length)
    (dict(in_words=0), errno.EINVAL),                     # words do not cover the write
    (dict(req=b"", in_words=0), errno.ENOSPC),            # below the 8-byte request
    (dict(reserved=1), errno.EINVAL),                     # cmd_hdr_reserved
    (dict(response=0), errno.EINVAL),                     # out words, no response pointer
    (dict(out_words=0), errno.EINVAL),                    # response pointer, no out words
    (dict(req=bytes(8) + b"\x01" + bytes(7)), errno.EOPNOTSUPP),   # non-zero past the struct
    (dict(provider_in=b"\x01" + bytes(7)), errno.EINVAL),  # mlx5_ib_query_device's input
    (dict(command=0x7F), errno.EOPNOTSUPP),               # no such extended command
])
def test_ex_query_device_errnos(ctx, kw, err):
    assert write_ex(ctx, **kw) == -err


def test_zero_bytes_past_the_request_and_a_zero_provider_input_are_accepted(ctx):
    assert write_ex(ctx, req=bytes(16), provider_in=bytes(8)) > 0


def test_ex_query_device_before_get_context_is_einval(m):
    p = m.spawn("app")
    assert write_ex(raw_ctx(p)) == -errno.EINVAL
    p.exit(0)


def test_ibv_query_device_ex_fills_the_attr_and_counts_the_ports(ctx):
    attr = v.ibv_query_device_ex(ctx)
    assert attr.orig_attr == v.ibv_query_device(ctx)
    assert attr.phys_port_cnt_ex == attr.orig_attr.phys_port_cnt == 1
    assert attr.hca_core_clock == 156250 and attr.max_dm_size == 256 << 10
    assert attr.cq_mod_caps.max_cq_count == 0xFFFF
    assert attr.tso_caps.max_tso == 0                    # no mlx5 driver response
    with pytest.raises(v.VerbsError) as e:
        v.ibv_query_device_ex(ctx, comp_mask=1)
    assert e.value.errno == errno.EINVAL


# -- the GID ioctls ------------------------------------------------------------------------
def gid_ioctl(ctx: Any, method: int, attrs: list[ib_uverbs_attr]) -> int:
    buf = ctx.cmd_buf
    hdr = ib_uverbs_ioctl_hdr(length=ib_uverbs_ioctl_hdr.SIZE + len(attrs) * ib_uverbs_attr.SIZE,
                              object_id=ic.UVERBS_OBJECT_DEVICE, method_id=method,
                              num_attrs=len(attrs), driver_id=1)
    ctx.proc.store(buf, hdr.pack() + b"".join(a.pack() for a in attrs))
    return ctx.proc.ioctl(ctx.cmd_fd, RDMA_VERBS_IOCTL, buf)


def table_attrs(ctx: Any, entries_len: int, entry_size: int = 32, flags: int | None = None,
                num_len: int = 8) -> list[ib_uverbs_attr]:
    at = ctx.cmd_buf + RESP_AT
    attrs = [ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, len=8,
                            data=entry_size),
             ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
                            len=entries_len, data=at + 16),
             ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES,
                            len=num_len, data=at)]
    if flags is not None:
        attrs.append(ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_TABLE_FLAGS, len=4,
                                    data=flags))
    return attrs


def test_query_gid_table_lists_every_valid_gid(ctx):
    n, entries = v.ibv_query_gid_table(ctx, 256)
    assert n == len(entries) == 2                          # the default GID, v1 and v2
    for i, e in enumerate(entries):
        assert (e.gid_index, e.port_num, e.ndev_ifindex) == (i, 1, 0)
        assert e.gid == v.ibv_query_gid(ctx, 1, i)
    assert [e.gid_type for e in entries] == [IB_GID_TYPE_ROCE, IB_GID_TYPE_ROCE_UDP_ENCAP]
    assert v.ibv_query_gid_table(ctx, 2)[0] == 2           # exactly enough room


def test_query_gid_table_in_a_caller_entry_size(ctx):
    at = ctx.cmd_buf + RESP_AT
    ctx.proc.store(at, b"\xee" * 256)
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_TABLE, table_attrs(ctx, 80, 40)) == 0
    raw = ctx.proc.load(at + 16, 96)
    assert int.from_bytes(ctx.proc.load(at, 8), "little") == 2
    assert raw[:16] == v.ibv_query_gid(ctx, 1, 0) and raw[32:40] == bytes(8)  # zero-filled
    assert raw[40:56] == v.ibv_query_gid(ctx, 1, 1) and raw[80:] == b"\xee" * 16
    ctx.proc.store(at, b"\xee" * 256)
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_TABLE, table_attrs(ctx, 32, 16)) == 0
    raw = ctx.proc.load(at + 16, 48)                       # truncated to 16 bytes each
    assert raw[:16] == v.ibv_query_gid(ctx, 1, 0) and raw[16:32] == v.ibv_query_gid(ctx, 1, 1)
    assert raw[32:] == b"\xee" * 16


def test_query_gid_table_marks_its_outputs_valid(ctx):
    attrs = table_attrs(ctx, 64)
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_TABLE, attrs) == 0
    back = ctx.proc.load(ctx.cmd_buf + ib_uverbs_ioctl_hdr.SIZE, 3 * ib_uverbs_attr.SIZE)
    flags = [ib_uverbs_attr.unpack(back[i * 16:(i + 1) * 16]).flags for i in range(3)]
    assert flags[1] & UVERBS_ATTR_F_VALID_OUTPUT and flags[2] & UVERBS_ATTR_F_VALID_OUTPUT


@pytest.mark.parametrize("kw, err", [
    (dict(entries_len=0), errno.EINVAL),                   # max_entries 0
    (dict(entries_len=32), errno.EINVAL),                  # room for 1 of 2
    (dict(entries_len=48), errno.EINVAL),                  # not a multiple of 32
    (dict(entries_len=64, entry_size=0), errno.EINVAL),
    (dict(entries_len=64, flags=1), errno.EINVAL),         # no flag is defined
    (dict(entries_len=64, num_len=4), errno.EINVAL),       # NUM_ENTRIES is a u64
])
def test_query_gid_table_errnos(ctx, kw, err):
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_TABLE, table_attrs(ctx, **kw)) == -err


def test_ibv_query_gid_table_returns_minus_errno(ctx):
    assert v.ibv_query_gid_table(ctx, 0) == (-errno.EINVAL, [])
    assert v.ibv_query_gid_table(ctx, 1) == (-errno.EINVAL, [])
    assert v.ibv_query_gid_table(ctx, 4, flags=1) == (-errno.EINVAL, [])


def test_query_gid_entry(ctx):
    rc, e = v.ibv_query_gid_ex(ctx, 1, 1)
    assert rc == 0 and e is not None
    assert (e.gid, e.gid_index, e.port_num, e.gid_type, e.ndev_ifindex) == \
        (v.ibv_query_gid(ctx, 1, 1), 1, 1, IB_GID_TYPE_ROCE_UDP_ENCAP, 0)


@pytest.mark.parametrize("port, index, flags, err", [
    (1, 2, 0, errno.ENODATA),           # an empty slot
    (1, 255, 0, errno.ENODATA),
    (1, 256, 0, errno.EINVAL),          # outside the 256-entry table
    (2, 0, 0, errno.EINVAL),            # no port 2
    (0, 0, 0, errno.EINVAL),
    (1, 0, 1, errno.EINVAL),            # flags
])
def test_query_gid_entry_errnos(ctx, port, index, flags, err):
    assert v.ibv_query_gid_ex(ctx, port, index, flags) == (err, None)


@pytest.mark.parametrize("length", [16, 40])
def test_query_gid_entry_wants_exactly_the_struct(ctx, length):
    attrs = [ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_ENTRY_PORT, len=4, data=1),
             ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX, len=4, data=0),
             ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, len=4, data=0),
             ib_uverbs_attr(attr_id=ic.UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY, len=length,
                            data=ctx.cmd_buf + RESP_AT)]
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_ENTRY, attrs) == -errno.EINVAL


def test_gid_ioctls_before_get_context_are_einval(m):
    p = m.spawn("app")
    ctx = raw_ctx(p)
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_QUERY_GID_TABLE, table_attrs(ctx, 64)) \
        == -errno.EINVAL
    p.exit(0)


def test_an_unknown_device_method_is_eprotonosupport(ctx):
    assert gid_ioctl(ctx, ic.UVERBS_METHOD_INFO_HANDLES, []) == -errno.EPROTONOSUPPORT  # none here


# -- the P_Key table -----------------------------------------------------------------------
def test_sysfs_publishes_the_default_pkey(ctx):
    assert read_sysfs(ctx.proc, f"{SYSFS}/pkeys/0") == "0xffff\n"
    assert ctx.proc.getdents(f"{SYSFS}/pkeys") == ["0"]   # pkey_tbl_len 1
    assert v.ibv_query_pkey(ctx, 1, 0) == 0xFFFF
    assert v.ibv_get_pkey_index(ctx, 1, 0xFFFF) == 0
    assert v.ibv_get_pkey_index(ctx, 1, 0x0180) == -1     # not in the table


@pytest.mark.parametrize("port, index", [(1, 1), (2, 0)])
def test_ibv_query_pkey_without_the_file_fails(ctx, port, index):
    with pytest.raises(v.VerbsError) as e:
        v.ibv_query_pkey(ctx, port, index)
    assert e.value.errno == errno.ENOENT


def test_ib_query_pkey_errnos(m):
    dev = ib_dev(m)
    with m.kernel():
        assert ib_query_pkey(dev, 1, 0) == 0xFFFF
        for port, index, err in ((2, 0, errno.EINVAL), (1, 1, errno.EINVAL)):
            with pytest.raises(KernelError) as e:
                ib_query_pkey(dev, port, index)
            assert e.value.errno == err
        with pytest.raises(KernelError) as e:
            mlx5_ib_query_pkey(dev, 1, -1)
        assert e.value.errno == errno.EINVAL
        op, dev.ops.query_pkey = dev.ops.query_pkey, None
        try:
            with pytest.raises(KernelError) as e:
                ib_query_pkey(dev, 1, 0)
            assert e.value.errno == errno.EOPNOTSUPP
        finally:
            dev.ops.query_pkey = op
