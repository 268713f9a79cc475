"""On-demand paging end to end: RC traffic into and out of ODP MRs whose pages the
HCA faults in on first touch (PAGE_FAULT EQE -> mlx5_ib's page-fault work ->
ib_umem_odp_map_dma_and_lock -> the MTT by UMR -> PAGE_FAULT_RESUME), and munmap
under an ODP MR: the notifier zaps the MTT, the next access faults and - with
nothing mapped there any more - completes in error.  Nothing is ever pinned."""

from __future__ import annotations

import pytest

from kernel_model.page_alloc import page
from tests.flows.test_data_path import (
    ALL_ACCESS,
    BUF,
    LINKS,
    PAGE,
    SIG,
    Link,
    make_link,
    pattern,
    settle,
    status,
    wc_fields,
)
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import SendWR

ODP = ALL_ACCESS | v.IBV_ACCESS_ON_DEMAND


@pytest.fixture(params=LINKS)
def link(request) -> Link:
    return make_link(request.param, a_kw={"mr_access": ODP}, b_kw={"mr_access": ODP})


def resumes(side) -> int:
    """PAGE_FAULT_RESUME commands the side's HCA has executed."""
    return sum(1 for e in side.hca.fw.cmd_log if e[0] == "PAGE_FAULT_RESUME")


def present(side, off: int) -> bool:
    return bool(side.p.mm.pgtable.get(side.mr.buf + off) & 1)


def mr_pins(side) -> int:
    """Pins on the MR's pages that are present (an ODP MR takes none)."""
    m = side.m
    n = 0
    for off in range(0, BUF, PAGE):
        pte = side.p.mm.pgtable.get(side.mr.buf + off)
        if pte & 1:
            n += page(m.zone, (pte & 0x000F_FFFF_FFFF_F000) >> m.page_shift)._pincount
    return n


def test_odp_mrs_pin_nothing_and_start_unmapped(link):
    a, b = link.a, link.b
    for s in (a, b):
        assert mr_pins(s) == 0 and not present(s, 0)
        odp = s.hca.fw.mkeys[s.mr.lkey >> 8]
        assert odp.pg_access and odp.pf_absent


def test_rdma_write_faults_the_responders_pages_in(link):
    a, b = link.a, link.b
    a.mr.write(pattern(BUF))                   # the CPU touches a's pages: no fault there
    assert not present(b, 0)
    before = resumes(b)
    a.qp.post_send(link.write(1, 0, 100, 2 * PAGE))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert resumes(b) > before                 # the responder faulted, was resumed
    assert present(b, 0) and present(b, 2 * PAGE) and not present(b, 3 * PAGE)
    assert mr_pins(b) == 0
    assert b.mr.read(2 * PAGE, 100) == pattern(BUF)[:2 * PAGE]
    assert settle(b) == []


def test_rdma_read_faults_the_requesters_destination_in(link):
    a, b = link.a, link.b
    b.mr.write(pattern(BUF, 5))
    before = resumes(a)
    a.qp.post_send(SendWR(wr_id=8, sg_list=[a.sge(10, 3000)], opcode=v.IBV_WR_RDMA_READ,
                          send_flags=SIG, remote_addr=b.mr.buf + 5000, rkey=b.mr.rkey))
    (wc,) = a.cq.poll_until(1)
    assert wc_fields(wc) == (8, "SUCCESS", v.IBV_WC_RDMA_READ, 3000, a.qp.qp_num)
    assert resumes(a) > before                 # the requester's sge faulted first
    assert a.mr.read(3000, 10) == pattern(BUF, 5)[5000:8000]


def test_send_into_an_unfaulted_receive_buffer(link):
    a, b = link.a, link.b
    b.recv(7, 2 * PAGE, 600)
    a.mr.write(pattern(600, 3))
    a.qp.post_send(SendWR(wr_id=2, sg_list=[a.sge(0, 600)], opcode=v.IBV_WR_SEND,
                          send_flags=SIG))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    (wc,) = b.cq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status), wc.byte_len) == (7, "SUCCESS", 600)
    assert b.mr.read(600, 2 * PAGE) == pattern(600, 3)


def test_gather_from_unfaulted_pages_sends_zeros(link):
    """A's pages were never touched: the HCA's read faults them in, as zero pages."""
    a, b = link.a, link.b
    b.mr.write(b"\xee" * 64)
    a.qp.post_send(link.write(3, PAGE, 0, 64))
    assert status(a.cq.poll_until(1)) == [(3, "SUCCESS")]
    assert b.mr.read(64) == bytes(64) and present(a, PAGE)


def test_munmap_under_the_responders_mr_then_a_write_fails(link):
    a, b = link.a, link.b
    a.mr.write(pattern(64))
    a.qp.post_send(link.write(1, 0, PAGE, 64))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    mkey = b.hca.fw.mkeys[b.mr.rkey >> 8]
    assert b.p.munmap(b.mr.buf + PAGE, PAGE) == 0          # the notifier zaps the MTT
    assert mkey.pf_absent and not present(b, PAGE)
    a.qp.post_send(link.write(2, 0, PAGE, 64))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert mr_pins(b) == 0


def test_munmap_under_the_requesters_mr_then_its_send_fails(link):
    a = link.a
    assert a.p.munmap(a.mr.buf, PAGE) == 0
    a.qp.post_send(link.write(4, 0, 0, 64))
    assert status(a.cq.poll_until(1)) == [(4, "LOC_PROT_ERR")]


def test_munmap_of_the_whole_mr_drops_every_dma_mapping(link):
    a, b = link.a, link.b
    dev = b.hca.pdev.dev
    n0 = dev.nr_dma_mappings
    a.qp.post_send(link.write(1, 0, 0, 2 * PAGE))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    same = a.hca is b.hca                          # loopback: a's gathered pages too
    assert dev.nr_dma_mappings == n0 + (4 if same else 2)   # the pages faulted in
    assert b.p.munmap(b.mr.buf, BUF) == 0
    assert dev.nr_dma_mappings == n0 + (2 if same else 0)


@pytest.mark.parametrize("kind", LINKS)
def test_atomics_fault_the_target_in(kind):
    from tests.flows.test_atomic_qpex_flow import ATOMIC_ACCESS, atomic_wr, make_pair
    acc = ATOMIC_ACCESS | v.IBV_ACCESS_ON_DEMAND
    a, b = make_pair(kind, a_mr=acc, b_mr=acc)
    a.qp.post_send(atomic_wr(a, b, 7, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=0x10,
                             roffset=PAGE))
    (wc,) = a.cq.poll_until(1)
    assert v.ibv_wc_status_str(wc.status) == "SUCCESS"
    assert a.word() == 0 and b.word(PAGE) == 0x10        # an untouched page: zero, then +0x10


def test_a_fault_that_never_resolves_ends_in_an_error_not_a_hang(link, monkeypatch):
    """The driver resumes without mapping anything: the engine retries each fault at
    most ODP_FAULT_CAP times, then completes the access in error."""
    import drivers.mlx5_ib.odp as odp
    monkeypatch.setattr(odp, "pagefault_single_data_segment",
                        lambda dev, key, va, n: (n + PAGE - 1) // PAGE)   # claims, maps none
    a = link.a
    a.qp.post_send(link.write(1, 0, 0, 64))               # a's gather faults first
    assert status(a.cq.poll_until(1)) == [(1, "LOC_PROT_ERR")]


def test_a_responder_fault_that_never_resolves_is_a_remote_access_error(link, monkeypatch):
    import drivers.mlx5_ib.odp as odp
    a = link.a
    assert v.ibv_advise_mr(a.ep.pd.pd, 1, 1, [a.sge(0, 64)]) == 0   # a's page: prefetched
    monkeypatch.setattr(odp, "pagefault_single_data_segment",
                        lambda dev, key, va, n: (n + PAGE - 1) // PAGE)
    a.qp.post_send(link.write(1, 0, 0, 64))
    assert status(a.cq.poll_until(1)) == [(1, "REM_ACCESS_ERR")]


def test_madvise_dontneed_under_the_responder_then_the_next_write_faults_again(link):
    from kernel_model.madvise import MADV_DONTNEED
    a, b = link.a, link.b
    a.mr.write(pattern(64))
    a.qp.post_send(link.write(1, 0, PAGE, 64))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert b.p.madvise(b.mr.buf + PAGE, PAGE, MADV_DONTNEED) == 0
    assert not present(b, PAGE) and b.hca.fw.mkeys[b.mr.rkey >> 8].pf_absent
    before = resumes(b)
    a.qp.post_send(link.write(2, 0, PAGE + 8, 64))
    assert status(a.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert resumes(b) > before                          # faulted in again, a new page
    assert b.mr.read(72, PAGE) == bytes(8) + pattern(64)


def test_more_read_faults_than_the_cap_each_resolved_all_succeed(link):
    """Each READ the responder takes ends its fault count: ODP_FAULT_CAP limits the
    retries of one request, not the faults over the QP's life (rdma-core's
    test_odp_rc_rdma_read drops the pages before each of 100 READs)."""
    from kernel_model.hw.mlx5_engine import ODP_FAULT_CAP
    from kernel_model.madvise import MADV_DONTNEED
    a, b = link.a, link.b
    for i in range(ODP_FAULT_CAP + 3):
        b.mr.write(pattern(64, i))
        assert b.p.madvise(b.mr.buf + PAGE, PAGE, MADV_DONTNEED) == 0   # b's 2nd page: gone
        before = resumes(b)
        a.qp.post_send(SendWR(wr_id=i, sg_list=[a.sge(0, 64)], opcode=v.IBV_WR_RDMA_READ,
                              send_flags=SIG, remote_addr=b.mr.buf + PAGE, rkey=b.mr.rkey))
        assert status(a.cq.poll_until(1)) == [(i, "SUCCESS")]
        assert resumes(b) > before                          # it faulted, and was resumed
        assert a.mr.read(64) == bytes(64)                   # a fresh zero page each time


@pytest.mark.parametrize("kind", LINKS)
def test_more_atomic_faults_than_the_cap_each_resolved_all_succeed(kind):
    from kernel_model.hw.mlx5_engine import ODP_FAULT_CAP
    from kernel_model.madvise import MADV_DONTNEED
    from tests.flows.test_atomic_qpex_flow import ATOMIC_ACCESS, atomic_wr, make_pair
    acc = ATOMIC_ACCESS | v.IBV_ACCESS_ON_DEMAND
    a, b = make_pair(kind, a_mr=acc, b_mr=acc)
    for i in range(ODP_FAULT_CAP + 3):
        assert b.p.madvise(b.mr.buf, PAGE, MADV_DONTNEED) == 0
        a.qp.post_send(atomic_wr(a, b, i, v.IBV_WR_ATOMIC_FETCH_AND_ADD, compare_add=5))
        (wc,) = a.cq.poll_until(1)
        assert v.ibv_wc_status_str(wc.status) == "SUCCESS"
        assert a.word() == 0 and b.word() == 5              # a zero page each time, +5
