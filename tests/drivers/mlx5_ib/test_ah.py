"""Tests for drivers/mlx5_ib/ah.py and the core's CREATE_AH / DESTROY_AH
(ib_uverbs_create_ah -> rdma_create_user_ah -> mlx5_ib_create_ah).

Each command is written raw, as libmlx5 writes it, so every errno of the kernel
path is reached without the provider's own checks in front: the port, the PD
handle, the GRH a RoCE port requires, the source GID index, an unresolvable
destination, a driver response with no room for the MAC.  What an AH holds
while it lives (its PD's count, its source GID entry) is checked to go with it.
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.cache import _table
from drivers.mlx5_ib.ah import mlx5_ib_ah
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import mlx5_ib_create_ah_resp
from tests.drivers.mlx5_ib.ladder import ib_dev
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError


def create_ah(ctx, pd_handle: int, *, dgid: bytes | None = None, sgid_index: int = 0,
              is_global: int = 1, port_num: int = 1, flow_label: int = 0,
              drv_resp: bool = True):
    """One raw CREATE_AH; (core response, driver response)."""
    cmd = uv.ib_uverbs_create_ah(
        pd_handle=pd_handle, user_handle=0x1234,
        attr=uv.ib_uverbs_ah_attr(
            grh=uv.ib_uverbs_global_route(dgid=dgid if dgid is not None else bytes(16),
                                          flow_label=flow_label, sgid_index=sgid_index,
                                          hop_limit=64, traffic_class=0),
            is_global=is_global, port_num=port_num))
    return c.execute_write(ctx, uv.IB_USER_VERBS_CMD_CREATE_AH, cmd, uv.ib_uverbs_create_ah_resp,
                           None, mlx5_ib_create_ah_resp if drv_resp else None, "create_ah")


def destroy_ah(ctx, handle: int) -> None:
    c.ibv_cmd_destroy_ah(ctx, handle)


def uobj(p, ctx, handle: int):
    return p.task.files.fdt[ctx.cmd_fd].private_data.idr[handle]


def errno_of(fn, *args, **kw) -> int:
    with pytest.raises(VerbsError) as e:
        fn(*args, **kw)
    return e.value.errno


@pytest.fixture
def pd(app):
    p, ctx = app
    pd = v.ibv_alloc_pd(ctx)
    yield pd
    v.ibv_dealloc_pd(pd)


def test_create_ah_returns_the_port_mac_and_holds_pd_and_gid(m, app, pd):
    p, ctx = app
    dev = ib_dev(m)
    gid0 = v.ibv_query_gid(ctx, 1, 0)
    entry = _table(dev, 1).data_vec[1]
    before = entry.refcnt
    resp, drv = create_ah(ctx, pd.handle, dgid=gid0, sgid_index=1)
    ah = uobj(p, ctx, resp.ah_handle).object
    assert isinstance(ah, mlx5_ib_ah) and ah.pd.uobject.id == pd.handle
    # the destination is this port's own link-local GID: its MAC is the port's
    mac = m.hcas[0].fw.vport.mac.to_bytes(6, "big")
    assert drv.response_length == 10 and drv.dmac == mac
    assert uobj(p, ctx, resp.ah_handle).user_handle == 0x1234
    # the kernel's AV: the GRH bit, sgid index, MAC, a RoCE v2 UDP source port
    assert ah.av.grh_gid_fl == 1 << 30 | 1 << 20 and ah.av.rmac == mac
    assert ah.av.rgid == gid0 and ah.av.hop_limit == 64
    assert 0xC000 <= ah.av.rlid <= 0xFFFF
    assert ah.pd.usecnt.counter == 1 and entry.refcnt == before + 1
    # the PD is busy while the AH lives
    assert v.ibv_dealloc_pd(pd) == errno.EBUSY
    destroy_ah(ctx, resp.ah_handle)
    assert ah.pd.usecnt.counter == 0 and entry.refcnt == before
    assert resp.ah_handle not in p.task.files.fdt[ctx.cmd_fd].private_data.idr


def test_roce_v2_udp_sport_comes_from_the_flow_label(m, app, pd):
    p, ctx = app
    resp, _drv = create_ah(ctx, pd.handle, dgid=v.ibv_query_gid(ctx, 1, 0), sgid_index=1,
                           flow_label=0x12345)
    ah = uobj(p, ctx, resp.ah_handle).object
    fl = 0x12345
    assert ah.av.rlid == ((fl & 0x3FFF) ^ ((fl & 0xFC000) >> 14)) | 0xC000
    destroy_ah(ctx, resp.ah_handle)
    # a RoCE v1 source GID has no UDP header
    resp, _drv = create_ah(ctx, pd.handle, dgid=v.ibv_query_gid(ctx, 1, 0), sgid_index=0)
    assert uobj(p, ctx, resp.ah_handle).object.av.rlid == 0
    destroy_ah(ctx, resp.ah_handle)


def test_multicast_dgid_maps_to_a_multicast_mac(app, pd):
    _p, ctx = app
    dgid = bytes.fromhex("ff020000000000000000000000000001")
    resp, drv = create_ah(ctx, pd.handle, dgid=dgid)
    assert drv.dmac == bytes.fromhex("333300000001")
    destroy_ah(ctx, resp.ah_handle)


@pytest.mark.parametrize("kw,err", [
    ({"is_global": 0}, errno.EINVAL),                 # RoCE requires a GRH
    ({"port_num": 2}, errno.EINVAL),                  # no such port
    ({"port_num": 0}, errno.EINVAL),
    ({"sgid_index": 7}, errno.ENODATA),               # an empty slot of the GID table
    ({"sgid_index": 255}, errno.ENODATA),             # (a u8 index never leaves the table)
    ({"dgid": bytes.fromhex("20010db8000000000000000000000001")}, errno.EINVAL),  # unresolvable
    ({"drv_resp": False}, errno.EINVAL),              # no room for mlx5_ib_create_ah_resp
])
def test_create_ah_errors_leave_nothing(app, pd, kw, err):
    p, ctx = app
    kw.setdefault("dgid", v.ibv_query_gid(ctx, 1, 0))
    idr = p.task.files.fdt[ctx.cmd_fd].private_data.idr
    before = dict(idr)
    assert errno_of(create_ah, ctx, pd.handle, **kw) == err
    assert idr == before
    assert uobj(p, ctx, pd.handle).object.usecnt.counter == 0


def test_create_ah_bad_pd_handle_is_einval(app, pd):
    _p, ctx = app
    assert errno_of(create_ah, ctx, pd.handle + 100, dgid=v.ibv_query_gid(ctx, 1, 0)) == \
        errno.EINVAL


def test_destroy_ah_bad_handle(app, pd):
    _p, ctx = app
    assert errno_of(destroy_ah, ctx, 4242) == errno.ENOENT
    # a PD's handle is not an AH's
    assert errno_of(destroy_ah, ctx, pd.handle) == errno.EINVAL


def test_closing_the_file_destroys_the_ah_before_its_pd(m, app):
    p, ctx = app
    pd = v.ibv_alloc_pd(ctx)
    create_ah(ctx, pd.handle, dgid=v.ibv_query_gid(ctx, 1, 0))
    entry = _table(ib_dev(m), 1).data_vec[0]
    held = entry.refcnt
    v.ibv_close_device(ctx)      # the PD and AH are left to the teardown
    assert entry.refcnt == held - 1
