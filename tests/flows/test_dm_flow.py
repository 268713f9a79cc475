"""Device memory end to end through libibverbs: the responder allocates on-chip memory
(ibv_alloc_dm over the ConnectX's MEMIC), fills it with ibv_memcpy_to_dm and registers
a zero-based DM MR over it; the requester's RDMA WRITE from a normal MR lands in the
MEMIC and its RDMA READ fetches from it - the bytes checked with ibv_memcpy_from_dm
and in the emulated device's on-chip memory.  On one machine and across a fabric."""

from __future__ import annotations

import pytest

from kernel_model.hw.mlx5_fw_memic import memic_window
from tests.flows.test_data_path import BUF, LINKS, SIG, Link, make_link, pattern, settle, status
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR

DM_LEN = 4096
DM_ACCESS = (v.IBV_ACCESS_ZERO_BASED | v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
             | v.IBV_ACCESS_REMOTE_READ)


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param)


@pytest.fixture
def dm(link):
    """The responder's DM (DM_LEN bytes, filled with 0xee) and its DM MR: (dm, mr)."""
    b = link.b
    dm = v.ibv_alloc_dm(b.ep.ctx.ctx, DM_LEN)
    assert v.ibv_memcpy_to_dm(dm, 0, b"\xee" * DM_LEN, DM_LEN) == 0
    mr = v.ibv_reg_dm_mr(b.ep.pd.pd, dm, 0, DM_LEN, DM_ACCESS)
    assert mr.addr == 0
    yield dm, mr
    assert v.ibv_dereg_mr(mr) == 0
    assert v.ibv_free_dm(dm) == 0
    assert b.hca.fw.memics == {}


def onchip(link: Link, offset: int, length: int) -> bytes:
    """The responder device's on-chip bytes of the (only) MEMIC allocation."""
    fw = link.b.hca.fw
    (start,) = fw.memics
    at = start - memic_window(fw)[0] + offset
    return bytes(fw.memic_data[at:at + length])


def test_rdma_write_into_a_dm_mr_lands_in_the_memic(link, dm):
    a, b = link.a, link.b
    dmem, mr = dm
    a.mr.write(pattern(BUF))
    wr = SendWR(wr_id=1, sg_list=[a.sge(100, 300)], opcode=v.IBV_WR_RDMA_WRITE,
                send_flags=SIG, remote_addr=1000, rkey=mr.rkey)   # zero-based: an offset
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    rc, got = v.ibv_memcpy_from_dm(dmem, 0, DM_LEN)
    assert rc == 0
    assert got[1000:1300] == pattern(BUF)[100:400]
    assert got[:1000] == b"\xee" * 1000 and got[1300:] == b"\xee" * (DM_LEN - 1300)
    assert onchip(link, 0, DM_LEN) == got
    assert settle(b) == []


def test_rdma_read_from_a_dm_mr_fetches_what_memcpy_to_dm_put(link, dm):
    a = link.a
    dmem, mr = dm
    assert v.ibv_memcpy_to_dm(dmem, 2048, pattern(1024, 9), 1024) == 0
    assert onchip(link, 2048, 1024) == pattern(1024, 9)
    a.mr.write(b"\x55" * BUF)
    wr = SendWR(wr_id=2, sg_list=[a.sge(10, 1000)], opcode=v.IBV_WR_RDMA_READ,
                send_flags=SIG, remote_addr=2048 + 24, rkey=mr.rkey)
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    got = a.mr.read(BUF)
    assert got[10:1010] == pattern(1024, 9)[24:1024]
    assert got[:10] == b"\x55" * 10 and got[1010:] == b"\x55" * (BUF - 1010)


def test_a_write_beyond_the_dm_mr_is_a_remote_access_error(link, dm):
    a = link.a
    dmem, mr = dm
    wr = SendWR(wr_id=3, sg_list=[a.sge(0, 64)], opcode=v.IBV_WR_RDMA_WRITE,
                send_flags=SIG, remote_addr=DM_LEN - 32, rkey=mr.rkey)
    a.qp.post_send(wr)
    assert status(a.cq.poll_until(1)) == [(3, "REM_ACCESS_ERR")]
    assert onchip(link, 0, DM_LEN) == b"\xee" * DM_LEN       # nothing landed


def test_a_dm_mr_over_part_of_the_dm_starts_at_its_offset(link):
    """A DM MR from offset 512: remote address 0 is the DM's byte 512."""
    a, b = link.a, link.b
    dmem = v.ibv_alloc_dm(b.ep.ctx.ctx, DM_LEN)
    assert v.ibv_memcpy_to_dm(dmem, 0, bytes(DM_LEN), DM_LEN) == 0
    mr = v.ibv_reg_dm_mr(b.ep.pd.pd, dmem, 512, 1024, DM_ACCESS)
    a.mr.write(pattern(BUF, 3))
    a.qp.post_send(SendWR(wr_id=4, sg_list=[a.sge(0, 256)], opcode=v.IBV_WR_RDMA_WRITE,
                          send_flags=SIG, remote_addr=0, rkey=mr.rkey))
    assert status(a.cq.poll_until(1)) == [(4, "SUCCESS")]
    rc, got = v.ibv_memcpy_from_dm(dmem, 0, DM_LEN)
    assert got[512:768] == pattern(BUF, 3)[:256]
    assert got[:512] == bytes(512) and got[768:] == bytes(DM_LEN - 768)
    assert v.ibv_dereg_mr(mr) == 0 and v.ibv_free_dm(dmem) == 0
    assert b.hca.fw.memics == {}
