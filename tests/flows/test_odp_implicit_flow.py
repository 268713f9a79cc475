"""Implicit on-demand paging end to end: ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND) is a KSM
mkey over the whole address space whose 1 GiB entries start on the null mkey; the first
access to a slice faults on the parent key, mlx5_ib makes the slice's child (an ODP MTT
mkey over a child umem) and points the KSM entry at it.  munmap of every page a child
mapped destroys the child (from a work) and puts the entry back on the null mkey;
deregistration and exit destroy what is left.  Also UD through ODP: a send's gather
faults and is retried; a receive into an unfaulted page drops that datagram and faults."""

from __future__ import annotations

import struct

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.fabric import Fabric
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_engine import MKC_ACCESS_MODE_KSM
from kernel_model.hw.mlx5_fw_port import NULL_MKEY
from kernel_model.hw.mlx5_ifc import MLX5_MKC_ACCESS_MODE_MTT
from kernel_model.workqueue import flush_workqueue, system_wq
from tests.flows.test_data_path import (
    ALL_ACCESS,
    LINKS,
    PAGE,
    SIG,
    Link,
    make_link,
    pattern,
    status,
)
from tests.flows.test_odp_flow import resumes
from tests.flows.test_ud_flow import GRH, QKEY, ud_side
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, PD, Context, SendWR, VerbsError

SIZE_MAX = (1 << 64) - 1
IBV_ACCESS_HUGETLB, IBV_ODP_SUPPORT = 128, 1     # verbs.h
IMPLICIT = ALL_ACCESS | v.IBV_ACCESS_ON_DEMAND
SLICE = 1 << 30


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param)


def reg_implicit(side, access: int = IMPLICIT) -> v.ibv_mr:
    return v.ibv_reg_mr(side.ep.pd.pd, 0, SIZE_MAX, access)


def mode(mk) -> int:
    return mk.mkc["access_mode_4_2"] << 2 | mk.mkc["access_mode_1_0"]


def ksm_key(side, imr: v.ibv_mr, va: int) -> int:
    """The key the parent's KSM entry for va's slice names."""
    mk = side.hca.fw.mkeys[imr.lkey >> 8]
    i = va // SLICE
    _r, key, addr = struct.unpack(">IIQ", mk.pas.view[2 * i:2 * i + 2].tobytes())
    assert addr == i * SLICE
    return key


def flush(side) -> None:
    """Let the children bounced to system_wq be destroyed."""
    with side.p.kernel():
        flush_workqueue(system_wq(side.m))


def write_to(link: Link, wr_id: int, raddr: int, rkey: int, length: int = 64) -> None:
    link.a.qp.post_send(SendWR(wr_id=wr_id, sg_list=[link.a.sge(0, length)],
                               opcode=v.IBV_WR_RDMA_WRITE, send_flags=SIG,
                               remote_addr=raddr, rkey=rkey))


def test_the_parent_is_a_ksm_mkey_on_the_null_mkey(link):
    b = link.b
    imr = reg_implicit(b)
    mk = b.hca.fw.mkeys[imr.lkey >> 8]
    assert imr.lkey == imr.rkey and mode(mk) == MKC_ACCESS_MODE_KSM
    assert mk.mkc["length64"] and not mk.mkc["free"] and mk.pg_access
    assert mk.pas.n == 2 * (1 << 17)                       # 2^47 / 1 GiB entries of 16 bytes
    assert ksm_key(b, imr, b.mr.buf) == NULL_MKEY == ksm_key(b, imr, 0)
    v.ibv_dereg_mr(imr)
    assert imr.lkey >> 8 not in b.hca.fw.mkeys


def test_a_send_between_implicit_mrs_makes_each_sides_child(link):
    a, b = link.a, link.b
    ia, ib = reg_implicit(a), reg_implicit(b)
    a.mr.write(pattern(300))
    b.qp.post_recv(v.ibv_recv_wr(wr_id=1, sg_list=[v.ibv_sge(b.mr.buf + 100, 300, ib.lkey)]))
    a.qp.post_send(SendWR(wr_id=2, sg_list=[v.ibv_sge(a.mr.buf, 300, ia.lkey)],
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert status(b.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(400)[100:] == pattern(300)
    for side, imr in ((a, ia), (b, ib)):
        child = ksm_key(side, imr, side.mr.buf)
        mk = side.hca.fw.mkeys[child >> 8]
        assert mode(mk) == MLX5_MKC_ACCESS_MODE_MTT and mk.pg_access
        assert mk.mkc["start_addr"] == side.mr.buf // SLICE * SLICE and mk.mkc["len"] == SLICE
        assert resumes(side) >= 1
    v.ibv_dereg_mr(ia)
    v.ibv_dereg_mr(ib)
    assert child >> 8 not in b.hca.fw.mkeys               # the dereg took the children


def test_rdma_write_and_read_through_an_implicit_rkey(link):
    a, b = link.a, link.b
    ib = reg_implicit(b)
    a.mr.write(pattern(5000))
    write_to(link, 1, b.mr.buf + 3000, ib.rkey, 5000)          # two pages, one slice
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.mr.read(8000)[3000:] == pattern(5000)
    a.qp.post_send(SendWR(wr_id=2, sg_list=[a.sge(PAGE * 2, 100)], opcode=v.IBV_WR_RDMA_READ,
                          send_flags=SIG, remote_addr=b.mr.buf + 3000, rkey=ib.rkey))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert a.mr.read(PAGE * 2 + 100)[PAGE * 2:] == pattern(100)
    v.ibv_dereg_mr(ib)


def test_munmap_under_a_child_destroys_it_and_the_slice_faults_again(link):
    a, b = link.a, link.b
    ib = reg_implicit(b)
    region = b.p.mmap(0, 2 * PAGE)
    a.mr.write(pattern(64))
    write_to(link, 1, region, ib.rkey)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.p.load(region, 64) == pattern(64)
    child = ksm_key(b, ib, region)
    assert child != NULL_MKEY
    assert b.p.munmap(region, 2 * PAGE) == 0       # the child's only page: the child goes
    flush(b)
    assert ksm_key(b, ib, region) == NULL_MKEY and child >> 8 not in b.hca.fw.mkeys
    n = resumes(b)
    write_to(link, 2, region, ib.rkey)             # faults: a new child, nothing there
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert resumes(b) > n and ksm_key(b, ib, region) not in (NULL_MKEY, child)
    v.ibv_dereg_mr(ib)


def test_prefetch_of_an_implicit_mr_sync_and_async(link):
    a, b = link.a, link.b
    ib = reg_implicit(b)
    assert v.ibv_advise_mr(b.ep.pd.pd, 1, 1, [v.ibv_sge(b.mr.buf, 64, ib.lkey)]) == 0
    child = ksm_key(b, ib, b.mr.buf)
    entry = (b.mr.buf % SLICE) // PAGE
    assert child != NULL_MKEY and b.hca.fw.mkeys[child >> 8].pas.view[entry] != 0
    far = b.p.mmap(0, PAGE)
    assert v.ibv_advise_mr(b.ep.pd.pd, 1, 0, [v.ibv_sge(far, 64, ib.lkey)]) == 0
    flush(b)
    n = resumes(b)
    a.mr.write(pattern(64))
    write_to(link, 1, b.mr.buf, ib.rkey)
    write_to(link, 2, far, ib.rkey)
    assert status(a.cq.poll_until(2)) == [(1, "SUCCESS"), (2, "SUCCESS")]
    assert resumes(b) == n                          # both prefetched: no page fault
    assert b.p.load(far, 64) == pattern(64)
    v.ibv_dereg_mr(ib)


def test_exit_with_an_implicit_mr_live_leaves_nothing(link):
    a, b = link.a, link.b
    ib = reg_implicit(b)
    a.mr.write(pattern(64))
    write_to(link, 1, b.mr.buf, ib.rkey)
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    child = ksm_key(b, ib, b.mr.buf)
    b.p.exit()
    flush(a)
    assert ib.lkey >> 8 not in b.hca.fw.mkeys and child >> 8 not in b.hca.fw.mkeys
    assert not [k for k in b.hca.fw.mkeys.values()
                if mode(k) == MKC_ACCESS_MODE_KSM or k.mkc["len"] == SLICE]


def test_implicit_mr_errnos(link):
    b = link.b
    pd = b.ep.pd.pd
    for args, why in (((pd, 0, SIZE_MAX, ALL_ACCESS), "not ON_DEMAND"),
                      ((pd, 0, SIZE_MAX, IMPLICIT | IBV_ACCESS_HUGETLB), "HUGETLB")):
        with pytest.raises(VerbsError) as e:
            v.ibv_reg_mr(*args)
        assert e.value.errno == 22, why                    # EINVAL
    with pytest.raises(VerbsError) as e:                    # an implicit MR has iova 0
        v.ibv_reg_mr_iova(pd, 0, SIZE_MAX, PAGE, IMPLICIT)
    assert e.value.errno == 22
    ib = reg_implicit(b)
    beyond = 1 << 47                                        # past the KSM's 2^17 GiB
    assert v.ibv_advise_mr(pd, 1, 1, [v.ibv_sge(beyond, 64, ib.lkey)]) == 14    # EFAULT
    n = resumes(b)
    write_to(link, 1, beyond, ib.rkey)                      # no fault: an access error
    assert status(link.a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")] and resumes(b) == n
    v.ibv_dereg_mr(ib)


def test_no_implicit_caps_no_implicit_mr():
    m = rdma_host(ram_size=64 << 20, hca=Mlx5Config(caps={"null_mkey": 0}))
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    ctx = Context(p)
    pd = PD(ctx)
    caps = v.ibv_query_device_ex(ctx.ctx).odp_caps
    assert caps.general_caps == IBV_ODP_SUPPORT                 # ODP, not implicit
    with pytest.raises(VerbsError) as e:
        v.ibv_reg_mr(pd.pd, 0, SIZE_MAX, IMPLICIT)
    assert e.value.errno == 22                                      # EINVAL, as upstream
    pd.close()
    ctx.close()


# -- UD through ODP ----------------------------------------------------------------------------
@pytest.fixture(params=["loopback", "fabric"])
def pair(request) -> tuple:
    """A UD sender and receiver (test_ud_flow's sides), on one machine or two."""
    if request.param == "loopback":
        ma = mb = rdma_host(ram_size=128 << 20)
    else:
        fabric = Fabric()
        ma, mb = (rdma_host(ram_size=128 << 20, name=n, fabric=fabric) for n in ("a", "b"))
    for m in dict.fromkeys((ma, mb)):
        m.load_module("mlx5_ib")
    return ud_side(ma, "sender"), ud_side(mb, "receiver")


def ud_resumes(side) -> int:
    return sum(1 for e in side.m.hcas[0].fw.cmd_log if e[0] == "PAGE_FAULT_RESUME")


def test_the_device_reports_ud_send_odp(pair):
    a, _b = pair
    assert v.ibv_query_device_ex(a.ctx.ctx).odp_caps.ud_odp_caps == 1     # SEND only


def test_a_ud_send_gathering_unfaulted_odp_pages_faults_and_lands(pair):
    a, b = pair
    odp = MR(a.pd, 2 * PAGE, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_ON_DEMAND)
    odp.write(pattern(200), PAGE - 100)                  # the CPU's pages; the MTT has none
    n = ud_resumes(a)
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    b.recv(1)
    a.qp.post_send(v.ibv_send_wr(wr_id=2, sg_list=[v.ibv_sge(odp.buf + PAGE - 100, 200,
                                                             odp.lkey)],
                                 send_flags=SIG, ah=ah, remote_qpn=b.qp.qp_num,
                                 remote_qkey=QKEY))
    assert [(wc.wr_id, wc.status) for wc in a.cq.poll_until(1)] == [(2, 0)]
    assert [(wc.wr_id, wc.status, wc.byte_len) for wc in b.cq.poll_until(1)] == \
        [(1, 0, GRH + 200)]
    assert b.mr.read(GRH + 200)[GRH:] == pattern(200) and ud_resumes(a) > n
    assert v.ibv_destroy_ah(ah) == 0


def test_a_ud_receive_into_an_unfaulted_odp_page_drops_that_datagram_and_faults(pair):
    a, b = pair
    odp = MR(b.pd, 2 * PAGE, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_ON_DEMAND)
    ah = a.ah(b.ctx.query_gid(1, 1), 1)
    b.qp.post_recv(v.ibv_recv_wr(wr_id=1, sg_list=[v.ibv_sge(odp.buf, 512, odp.lkey)]))
    n = ud_resumes(b)
    a.mr.write(pattern(64, seed=1), 2048)
    a.send(10, ah, b.qp.qp_num)                          # dropped: the page is not there
    assert [wc.wr_id for wc in a.cq.poll_until(1)] == [10]
    assert b.settle() == [] and ud_resumes(b) > n        # ... and faulted in meanwhile
    a.mr.write(pattern(64, seed=2), 2048)
    a.send(11, ah, b.qp.qp_num)                          # the same receive takes this one
    assert [wc.wr_id for wc in a.cq.poll_until(1)] == [11]
    assert [(wc.wr_id, wc.status) for wc in b.cq.poll_until(1)] == [(1, 0)]
    assert odp.read(GRH + 64)[GRH:] == pattern(64, seed=2)
    assert v.ibv_destroy_ah(ah) == 0
