"""Process isolation end to end: nothing one process names reaches another's objects.

Two processes on one host: a victim with its verbs objects, MRs, UAR mappings
and GPU memory, and an attacker that names them every way the uverbs ABI and
the wire let it - another file's handles in every command, another context's
mmap offsets, another PD's lkeys and rkeys, another process's GPU virtual
address, an rkey whose GPU pages were freed, more pinned memory than its
RLIMIT_MEMLOCK.  Each attempt must fail the way the kernel fails it (the
errno of the command, the completion status of the work request) and leave
the victim as it was: its objects still work (its PD takes a new MR, its QP
moves bytes, its doorbells ring its own UAR), its MR bytes are what they
were, its pinned_vm and page pins are unchanged.  The suite's autouse
fixture runs the leak check after each test.

Handles are per open file, numbered from 0 in one table shared by every
object type (rdma_core.c: one xarray per ufile), so the attacker's own
handles coincide with the victim's.  A handle "the attacker's file never
issued" is therefore a number above the attacker's highest that the victim
holds; a number the attacker also holds names the attacker's own object, of
whatever type it is there.
"""

from __future__ import annotations

import errno

import attrs
import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.mm import MAP_SHARED, PROT_READ, PROT_WRITE
from kernel_model.page_alloc import page
from kernel_model.pgtable import pte_addr, pte_present
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi import nvidia as nv_uapi
from peermem_testing.gpu import gpu_load, gpu_store
from userspace.cuda.runtime import CudaError, cudart
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import CQ, MR, PD, QP, Context, QPCap, QPInitAttr, SendWR
from userspace.providers.mlx5.uar import get_uar_mmap_offset
from userspace.tools.write_bw import Endpoint, connect

PAGE = 4096
BUF = 4 * PAGE
GPU_BUF = 4 * GPU_PAGE_SIZE
ALL_ACCESS = (v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
              | v.IBV_ACCESS_REMOTE_READ)
QPS_RTS, QPS_ERR = 3, 6                      # qpc.state
SIG = v.IBV_SEND_SIGNALED
MLX5_MMAP_CMDS = range(16)                   # every command mlx5_ib_mmap knows, and more


# -- helpers -----------------------------------------------------------------------------------
def host(*, dyn_uar: int = 0, gpu: bool = False):
    """One host with mlx5_ib (dyn_uar: honour rdma-core's dynamic UARs); with a GPU, the
    nvidia driver and nv_peer_mem (invalidatable MRs) as well."""
    m = rdma_host(ram_size=128 << 20, nr_gpus=1 if gpu else 0)
    m.load_module("mlx5_ib", dyn_uar=dyn_uar)
    if gpu:
        m.load_module("nvidia")
        m.load_module("nv_peer_mem", persistent_api_support=0)
    return m


def cap() -> QPCap:
    return QPCap(max_send_wr=16, max_recv_wr=16, max_send_sge=1, max_recv_sge=1)


def endpoint(p, psn: int = 0, ctx: Context | None = None) -> Endpoint:
    """Context (or the given one), PD, CQ, a BUF-byte MR and an RC QP in RESET."""
    ctx = ctx or Context(p)
    pd = PD(ctx)
    cq = CQ(ctx, 64)
    mr = MR(pd, BUF, ALL_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, cap=cap()))
    return Endpoint(ctx, pd, cq, mr, qp, ctx.query_gid(1, 0), psn)


def new_qp(ep: Endpoint) -> None:
    """Replace the endpoint's QP (after an error moved it to ERR) by a fresh one."""
    ep.qp.close()
    ep.qp = QP(ep.pd, QPInitAttr(ep.cq, ep.cq, cap=cap()))


def wire(a: Endpoint, b: Endpoint) -> None:
    """Connect two endpoints' QPs to each other (RESET -> RTS both)."""
    connect(b, a.dest())
    connect(a, b.dest())


def write_wr(wr_id: int, src: Endpoint, dst_addr: int, rkey: int, length: int = 256,
             lkey: int | None = None, src_addr: int | None = None,
             opcode: int = v.IBV_WR_RDMA_WRITE) -> SendWR:
    """An RDMA WRITE (or READ) of src's MR (or src_addr/lkey) to dst_addr/rkey."""
    sge = v.ibv_sge(src.mr.buf if src_addr is None else src_addr, length,
                    src.mr.lkey if lkey is None else lkey)
    return SendWR(wr_id=wr_id, sg_list=[sge], opcode=opcode, send_flags=SIG,
                  remote_addr=dst_addr, rkey=rkey)


def status(wcs) -> list[tuple[int, str]]:
    return [(wc.wr_id, v.ibv_wc_status_str(wc.status)) for wc in wcs]


def pattern(n: int, seed: int = 1) -> bytes:
    return bytes((i * 11 + seed * 29) & 0xFF for i in range(n))


def fw_state(m, ep: Endpoint) -> int:
    return m.hcas[0].fw.qps[ep.qp.qp_num].state


def fw_objects(m) -> dict[str, set[int]]:
    """The firmware's objects by kind (PDs, CQs, QPs, mkeys, UARs): what a command may
    have created or destroyed."""
    fw = m.hcas[0].fw
    return {k: set(getattr(fw, k)) for k in ("pds", "cqs", "qps", "mkeys", "uars")}


def err(fn, *args) -> int:
    """0, or the errno the verb failed with."""
    try:
        fn(*args)
    except OSError as e:
        return e.errno
    return 0


def phys(p, va: int) -> int:
    """The physical address behind va in p's page tables (-1: nothing mapped)."""
    pte = p.mm.pgtable.get(va)
    return pte_addr(pte) + va % p.machine.page_size if pte_present(pte) else -1


def uverbs_pages(p) -> dict[int, int]:
    """The process's file mappings (its UAR mmaps of the uverbs file, in the tests that
    call this): user page -> physical page."""
    ps = p.machine.page_size
    return {va: phys(p, va) for vma in p.mm.vmas if vma.vm_file is not None
            for va in range(vma.vm_start, vma.vm_end, ps)}


def pins(p, mr: MR) -> tuple[int, list[int]]:
    """(pinned_vm, each MR page's pin count): what a pin or an unpin changes."""
    m = p.machine
    pfns = [phys(p, va) >> m.page_shift for va in range(mr.buf, mr.buf + mr.length, m.page_size)]
    return p.mm.pinned_vm, [page(m.zone, pfn)._pincount for pfn in pfns]


def victim_works(m, a: Endpoint, b: Endpoint, seed: int) -> None:
    """One process's own traffic: a WRITE from a to b (two endpoints of its own, wired to
    each other) completes and moves its bytes; both QPs stay in RTS."""
    a.mr.write(pattern(512, seed))
    a.qp.post_send(write_wr(seed, a, b.mr.buf + 1024, b.mr.rkey, 512))
    assert status(a.cq.poll_until(1)) == [(seed, "SUCCESS")]
    assert b.mr.read(512, 1024) == pattern(512, seed)
    assert fw_state(m, a) == fw_state(m, b) == QPS_RTS


# -- 1 & 2: another file's handles -----------------------------------------------------------
@attrs.define(eq=False)
class Handles:
    """A victim with two endpoints wired to each other (handles 0-3 in each context) and,
    in the first context, a second PD/CQ/MR/QP whose handles (4-7) the attacker's file
    (one endpoint: 0-3) never issued."""

    m: object
    victim: object
    attacker: object
    v1: Endpoint
    v2: Endpoint
    extra: dict
    a: Endpoint


def make_handles() -> Handles:
    m = host()
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    v1, v2 = endpoint(victim, 0x10), endpoint(victim, 0x20)
    wire(v1, v2)
    pd = PD(v1.ctx)
    cq = CQ(v1.ctx, 16)
    mr = MR(pd, BUF, ALL_ACCESS)
    qp = QP(pd, QPInitAttr(cq, cq, cap=cap()))
    a = endpoint(attacker, 0x30)
    extra = {"pd": pd.pd.handle, "cq": cq.cq.handle, "mr": mr.mr.handle, "qp": qp.qp.handle,
             "objs": (pd, cq, mr, qp)}
    mine = [a.pd.pd.handle, a.cq.cq.handle, a.mr.mr.handle, a.qp.qp.handle]
    assert sorted(mine) == [0, 1, 2, 3]                  # the shared table, from 0
    assert min(extra[k] for k in ("pd", "cq", "mr", "qp")) > max(mine)
    return Handles(m, victim, attacker, v1, v2, extra, a)


def victim_intact(h: Handles, before: dict, seed: int) -> None:
    """The victim's second PD takes a new MR, its second MR keeps its bytes, its second
    QP still answers QUERY_QP, and its wired pair still moves bytes."""
    pd, cq, mr, qp = h.extra["objs"]
    assert mr.read(BUF) == pattern(BUF, 9)
    extra_mr = MR(pd, PAGE, ALL_ACCESS)
    extra_mr.close()
    attr, _init = qp.query(v.IBV_QP_STATE)
    assert attr.qp_state == v.IBV_QPS_RESET
    assert fw_objects(h.m) == before
    victim_works(h.m, h.v1, h.v2, seed)


DESTROYS = {  # command, request builder, response
    "pd": (uv.IB_USER_VERBS_CMD_DEALLOC_PD, lambda x: uv.ib_uverbs_dealloc_pd(pd_handle=x),
           None),
    "mr": (uv.IB_USER_VERBS_CMD_DEREG_MR, lambda x: uv.ib_uverbs_dereg_mr(mr_handle=x), None),
    "cq": (uv.IB_USER_VERBS_CMD_DESTROY_CQ, lambda x: uv.ib_uverbs_destroy_cq(cq_handle=x),
           uv.ib_uverbs_destroy_cq_resp),
    "qp": (uv.IB_USER_VERBS_CMD_DESTROY_QP, lambda x: uv.ib_uverbs_destroy_qp(qp_handle=x),
           uv.ib_uverbs_destroy_qp_resp),
}


def destroy(ep: Endpoint, kind: str, handle: int) -> int:
    """The raw destroy command of `kind` naming `handle` on ep's uverbs file: its errno."""
    command, req, resp = DESTROYS[kind]
    return err(c.execute_write, ep.ctx.ctx, command, req(handle), resp)


@pytest.mark.parametrize("kind", ["pd", "mr", "cq", "qp"])
def test_destroy_of_another_file_s_handle_is_enoent(kind):
    """DEALLOC_PD / DEREG_MR / DESTROY_CQ / DESTROY_QP of a handle the victim holds and
    the attacker's file never issued: rdma_lookup_get_uobject misses (ENOENT), for the
    victim's handle of that kind and for every other handle of the victim's."""
    h = make_handles()
    h.extra["objs"][2].write(pattern(BUF, 9))
    before = fw_objects(h.m)
    for k in ("pd", "cq", "mr", "qp"):
        assert destroy(h.a, kind, h.extra[k]) == errno.ENOENT, (kind, k)
    assert destroy(h.a, kind, 0xFFFFFFFF) == errno.ENOENT
    victim_intact(h, before, 1)


@pytest.mark.parametrize("kind", ["pd", "mr", "cq", "qp"])
def test_destroy_naming_a_handle_of_another_type_is_einval(kind):
    """A handle the attacker's file holds, but of another type (the victim's number for a
    PD is the attacker's own MR, say): uapi_object mismatch, EINVAL - and nothing of the
    attacker's own is destroyed either."""
    h = make_handles()
    h.extra["objs"][2].write(pattern(BUF, 9))
    before = fw_objects(h.m)
    own = {"pd": h.a.pd.pd.handle, "cq": h.a.cq.cq.handle, "mr": h.a.mr.mr.handle,
           "qp": h.a.qp.qp.handle}
    for other, handle in own.items():
        if other != kind:
            assert destroy(h.a, kind, handle) == errno.EINVAL, (kind, other)
    assert fw_objects(h.m) == before
    victim_intact(h, before, 2)
    # the attacker's objects are all still there and work (its MR takes bytes over its QP)
    peer = endpoint(h.attacker, 0x40, h.a.ctx)
    wire(h.a, peer)
    victim_works(h.m, h.a, peer, 7)


def test_commands_reading_another_file_s_objects_are_einval():
    """REG_MR naming the victim's PD, CREATE_QP naming its PD / send CQ / recv CQ,
    MODIFY_QP and QUERY_QP naming its QP: the handler's lookup (uobj_get_obj_read)
    returns NULL and the handler answers EINVAL.  The same calls with the attacker's own
    handles succeed (the control: what fails is the handle, nothing else)."""
    h = make_handles()
    h.extra["objs"][2].write(pattern(BUF, 9))
    a, x = h.a, h.extra
    foreign_pd = attrs.evolve(a.pd.pd, handle=x["pd"])
    foreign_cq = attrs.evolve(a.cq.cq, handle=x["cq"])
    foreign_qp = attrs.evolve(a.qp.qp, handle=x["qp"])
    before = fw_objects(h.m)
    pinned = h.attacker.mm.pinned_vm
    # REG_MR
    assert err(v.ibv_reg_mr, foreign_pd, a.mr.buf, PAGE, ALL_ACCESS) == errno.EINVAL
    assert h.attacker.mm.pinned_vm == pinned                  # nothing pinned, or refunded
    # CREATE_QP: the PD, the send CQ, the receive CQ
    qp_attr = lambda s, r: v.ibv_qp_init_attr(s, r, cap=v.ibv_qp_cap(4, 4, 1, 1, 0))  # noqa: E731
    assert err(v.ibv_create_qp, foreign_pd, qp_attr(a.cq.cq, a.cq.cq)) == errno.EINVAL
    assert err(v.ibv_create_qp, a.pd.pd, qp_attr(foreign_cq, a.cq.cq)) == errno.EINVAL
    assert err(v.ibv_create_qp, a.pd.pd, qp_attr(a.cq.cq, foreign_cq)) == errno.EINVAL
    # MODIFY_QP (to INIT: what a real attacker would try first) and QUERY_QP
    init = v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, pkey_index=0, port_num=1,
                         qp_access_flags=ALL_ACCESS)
    mask = (v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT | v.IBV_QP_ACCESS_FLAGS)
    assert v.ibv_modify_qp(foreign_qp, init, mask) == errno.EINVAL
    assert err(v.ibv_query_qp, foreign_qp, v.IBV_QP_STATE) == errno.EINVAL
    # the ioctl path (REG_DMABUF_MR's PD attribute): the lookup's own errno, ENOENT for a
    # handle this file does not hold, EINVAL for its own handle of another type; its own
    # PD gets past the lookup to the dma-buf fd (-1: EBADF)
    for pd, want in ((foreign_pd, errno.ENOENT), (attrs.evolve(a.pd.pd, handle=a.cq.cq.handle),
                                                  errno.EINVAL), (a.pd.pd, errno.EBADF)):
        assert err(v.ibv_reg_dmabuf_mr, pd, 0, PAGE, 0, -1, ALL_ACCESS) == want
    assert fw_objects(h.m) == before
    assert h.attacker.mm.pinned_vm == pinned
    victim_intact(h, before, 3)
    assert h.m.hcas[0].fw.qps[x["objs"][3].qp_num].state == 0   # its QP is still in RESET
    # the control: the same calls with the attacker's own handles
    mr = v.ibv_reg_mr(a.pd.pd, a.mr.buf, PAGE, ALL_ACCESS)
    assert v.ibv_dereg_mr(mr) == 0
    qp = v.ibv_create_qp(a.pd.pd, qp_attr(a.cq.cq, a.cq.cq))
    assert v.ibv_modify_qp(qp, init, mask) == 0
    assert v.ibv_query_qp(qp, v.IBV_QP_STATE)[0].qp_state == v.IBV_QPS_INIT
    assert v.ibv_destroy_qp(qp) == 0


# -- 3: another context's mmap offsets --------------------------------------------------------
def victim_offsets(ctx) -> set[int]:
    """The byte offsets the victim's provider mmapped its uverbs file at: the static UAR
    pages (mlx5_map_legacy_uars) or the dynamic UAR objects' mmap offsets."""
    ps = ctx.page_size
    out = {get_uar_mmap_offset(i, ps, 0) for i in range(len(ctx.uar))}
    bfs = (ctx.bfs + ctx.dyn_uar_bf_list + ctx.dyn_uar_qp_dedicated_list
           + ctx.dyn_uar_qp_shared_list + ([ctx.nc_uar] if ctx.nc_uar else []))
    out |= {bf.uar_mmap_offset for bf in bfs if bf.dyn_alloc_uar}
    return out


def probe_offsets(ps: int, victim: set[int]) -> list[int]:
    """The victim's offsets and a spread of others: every mlx5_ib_mmap command with the
    low, middle and top index bytes, and a run of mmap-entry offsets from the first
    (MLX5_IB_MMAP_OFFSET_START) on."""
    pgoffs = {cmd << 8 | idx for cmd in MLX5_MMAP_CMDS for idx in (0, 1, 2, 7, 8, 0x80, 0xFF)}
    pgoffs |= {0x900 + i for i in range(16)} | {0x9FF, 0x1000, 0xFF00}
    return sorted(victim | {pg * ps for pg in pgoffs})


@pytest.mark.parametrize("dyn_uar", [0, 1], ids=["static", "dyn_uar"])
def test_mmap_at_another_context_s_offsets_never_reaches_its_uars(dyn_uar):
    """The attacker mmaps its own uverbs file at every offset the victim's mappings use
    and at a spread of others (one page, shared, read-write and read-only): each mmap
    fails, or maps a page that is none of the victim's UAR pages (its own UAR, the
    read-only clock pages everybody may map).  The victim's mappings stay where they
    were, and its doorbells still ring its QP - before and after the attacker exits."""
    m = host(dyn_uar=dyn_uar)
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    v1, v2 = endpoint(victim, 0x10), endpoint(victim, 0x20)
    wire(v1, v2)
    victim_works(m, v1, v2, 1)              # every UAR the victim uses is mapped by now
    # the read-only clock pages (init-segment timer, clock info) are everybody's
    clocks = {va for c in (v1.ctx.ctx, v2.ctx.ctx)
              for va in (c.hca_core_clock & ~(PAGE - 1), c.clock_info_page)}
    mine = {va: pa for va, pa in uverbs_pages(victim).items() if va not in clocks}
    victim_phys = {pa for pa in mine.values() if pa >= 0}
    offsets = victim_offsets(v1.ctx.ctx) | victim_offsets(v2.ctx.ctx)
    vma_offsets = {vma.vm_pgoff * PAGE for vma in victim.mm.vmas if vma.vm_file is not None
                   and vma.vm_start in mine}
    assert offsets == vma_offsets and victim_phys and len(victim_phys) == len(mine)
    a = endpoint(attacker, 0x30)
    fd = a.ctx.ctx.cmd_fd
    mapped, refused = [], set()
    for off in probe_offsets(PAGE, offsets):
        for prot in (PROT_WRITE, PROT_READ):
            va = attacker.mmap(0, PAGE, prot, MAP_SHARED, fd, off)
            if va < 0:
                refused.add(-va)
                continue
            pa = phys(attacker, va)
            assert pa >= 0, hex(off)             # io_remap_pfn_range / vm_insert_page
            assert pa not in victim_phys, (hex(off), hex(pa))
            mapped.append((off, pa))
            assert attacker.munmap(va, PAGE) == 0
    assert refused <= {errno.EINVAL, errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS}
    assert errno.EINVAL in refused and mapped
    if dyn_uar:  # the victim's NC offset names the attacker's own NC UAR object there
        assert {off for off, _ in mapped} & offsets
    assert {va: pa for va, pa in uverbs_pages(victim).items() if va not in clocks} == mine
    victim_works(m, v1, v2, 2)
    a.ctx.close()
    attacker.exit(0)
    assert {va: pa for va, pa in uverbs_pages(victim).items() if va not in clocks} == mine
    victim_works(m, v1, v2, 3)


# -- 4: foreign lkeys and rkeys ------------------------------------------------------------------
@pytest.fixture
def keys():
    """The victim: two endpoints wired to each other (v1 <-> v2).  The attacker: two
    endpoints wired to each other (a1 <-> a2)."""
    m = host()
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    v1, v2 = endpoint(victim, 0x10), endpoint(victim, 0x20)
    a1, a2 = endpoint(attacker, 0x30), endpoint(attacker, 0x40)
    wire(v1, v2)
    wire(a1, a2)
    v1.mr.write(pattern(BUF, 5))
    a1.mr.write(pattern(BUF, 6))
    a2.mr.write(pattern(BUF, 7))
    return m, victim, attacker, v1, v2, a1, a2


@pytest.mark.parametrize("op", ["write", "send", "read"])
def test_foreign_lkey_is_a_local_protection_error(keys, op):
    """The attacker's own connected QP posts a WR whose SGE names the victim's lkey and
    exactly the victim's MR range: the victim's mkey is in another PD than the QP's, so
    the WR completes IBV_WC_LOC_PROT_ERR and the QP goes to ERR.  Nothing of the victim's
    MR is read out (the attacker's target keeps its bytes) or written (a READ into it)."""
    m, victim, attacker, v1, v2, a1, a2 = keys
    pins_before = pins(victim, v1.mr)
    src = v1.mr.buf
    if op == "send":
        a2.qp.post_recv(v.ibv_recv_wr(wr_id=9, sg_list=[v.ibv_sge(a2.mr.buf, 512,
                                                                     a2.mr.lkey)]))
        wr = SendWR(wr_id=1, sg_list=[v.ibv_sge(src, 256, v1.mr.lkey)], opcode=v.IBV_WR_SEND,
                    send_flags=SIG)
    else:
        opcode = v.IBV_WR_RDMA_WRITE if op == "write" else v.IBV_WR_RDMA_READ
        wr = write_wr(1, a1, a2.mr.buf, a2.mr.rkey, 256, lkey=v1.mr.lkey, src_addr=src,
                      opcode=opcode)
    a1.qp.post_send(wr)
    (wc,) = a1.cq.poll_until(1)
    assert (wc.wr_id, v.ibv_wc_status_str(wc.status)) == (1, "LOC_PROT_ERR")
    assert fw_state(m, a1) == QPS_ERR
    assert a2.mr.read(BUF) == pattern(BUF, 7)        # nothing of the victim's got out
    assert v1.mr.read(BUF) == pattern(BUF, 5)        # nothing got in
    assert pins(victim, v1.mr) == pins_before
    victim_works(m, v1, v2, 4)
    # the control: the attacker's own lkey on a fresh pair moves the bytes
    new_qp(a1)
    new_qp(a2)
    wire(a1, a2)
    a1.qp.post_send(write_wr(2, a1, a2.mr.buf, a2.mr.rkey, 256))
    assert status(a1.cq.poll_until(1)) == [(2, "SUCCESS")]
    assert a2.mr.read(256) == pattern(BUF, 6)[:256]


@pytest.mark.parametrize("op", ["write", "read"])
def test_rkey_of_another_pd_is_a_remote_access_error(op):
    """The attacker's QP is connected to the victim's QP (in the victim's PD 1).  An rkey
    of the victim's MR in PD 1 works (the control); the rkey of the victim's MR in its
    other PD, and of a third process's MR, complete IBV_WC_REM_ACCESS_ERR, with their
    bytes untouched (WRITE) or not read out (READ)."""
    m = host()
    victim, attacker, other = m.spawn("victim"), m.spawn("attacker"), m.spawn("bystander")
    vic = endpoint(victim, 0x10)
    pd2 = PD(vic.ctx)
    mr2 = MR(pd2, BUF, ALL_ACCESS)
    third = endpoint(other, 0x50)
    a = endpoint(attacker, 0x30)
    for mr, seed in ((vic.mr, 1), (mr2, 2), (third.mr, 3)):
        mr.write(pattern(BUF, seed))
    a.mr.write(pattern(BUF, 4))
    opcode = v.IBV_WR_RDMA_WRITE if op == "write" else v.IBV_WR_RDMA_READ
    cases = [(vic.mr, "SUCCESS"), (mr2, "REM_ACCESS_ERR"), (third.mr, "REM_ACCESS_ERR")]
    for i, (mr, expect) in enumerate(cases):
        if i:
            new_qp(a)
            new_qp(vic)
        wire(a, vic)
        before = pins(mr.proc, mr)
        a.qp.post_send(write_wr(i, a, mr.buf + 512, mr.rkey, 1024, opcode=opcode))
        assert status(a.cq.poll_until(1)) == [(i, expect)]
        if expect == "SUCCESS":
            assert fw_state(m, a) == fw_state(m, vic) == QPS_RTS
            if op == "write":
                assert vic.mr.read(1024, 512) == pattern(BUF, 4)[:1024]
                vic.mr.write(pattern(BUF, 1))
            else:
                assert a.mr.read(1024) == pattern(BUF, 1)[512:1536]
                a.mr.write(pattern(BUF, 4))
            continue
        assert fw_state(m, a) == QPS_ERR
        assert fw_state(m, vic) == QPS_ERR       # the responder's QP takes the error too
        assert pins(mr.proc, mr) == before
    assert vic.mr.read(BUF) == pattern(BUF, 1)
    assert mr2.read(BUF) == pattern(BUF, 2)
    assert third.mr.read(BUF) == pattern(BUF, 3)
    assert a.mr.read(BUF) == pattern(BUF, 4)     # a READ brought nothing back
    # the victim and the bystander still work: a fresh pair moves bytes
    new_qp(vic)
    new_qp(third)
    wire(vic, third)
    vic.qp.post_send(write_wr(7, vic, third.mr.buf, third.mr.rkey, 256))
    assert status(vic.cq.poll_until(1)) == [(7, "SUCCESS")]
    assert third.mr.read(256) == pattern(BUF, 1)[:256]


def test_a_qp_aimed_at_another_connection_s_qpn_cannot_disturb_it():
    """The attacker connects its own RC QP to the victim's QPN (QPNs are easy to guess)
    without the connection's PSN, and WRITEs with a junk rkey: the victim's responder
    drops the out-of-sequence request (found by review: before the PSN check the victim's
    QP took the remote access error and went to ERR, and its peer then failed with
    RETRY_EXC_ERR).  The attacker's QP times out; the victim pair moves bytes as before."""
    m = host()
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    va, vb = endpoint(victim, 0x111), endpoint(victim, 0x222)
    wire(va, vb)
    a = endpoint(attacker, 0x99)
    connect(a, {"qpn": vb.qp.qp_num, "psn": 0x123, "gid": vb.gid})
    vb.mr.write(pattern(BUF, 5))
    a.qp.post_send(write_wr(1, a, vb.mr.buf, 0xDEAD, 64))
    a.qp.post_send(write_wr(2, a, vb.mr.buf, vb.mr.rkey, 64))     # even with the real rkey
    assert status(a.cq.poll_until(2)) == [(1, "RETRY_EXC_ERR"), (2, "WR_FLUSH_ERR")]
    assert fw_state(m, vb) == QPS_RTS and vb.mr.read(BUF) == pattern(BUF, 5)
    victim_works(m, va, vb, seed=6)


# -- 5 & 6: another process's GPU memory ---------------------------------------------------------
def gpu_memory(m, va: int):
    """The driver's allocation object behind a cudaMalloc'd VA (any client)."""
    (dev,) = m.modules["nvidia"].state.devices
    (mem,) = [mem for cl in dev.clients for mem in cl.memory.values() if mem.va == va]
    return mem


def test_another_process_s_gpu_allocation_cannot_be_registered_or_freed():
    """The victim cudaMallocs; the attacker names that VA: ibv_reg_mr fails EFAULT
    (nothing mapped there in its address space; nv_mem takes only the caller's own
    allocations), before and after it opened the GPU itself; FREE_MEMORY and mmap of the
    victim's allocation handle on its own GPU file are EINVAL.  The victim's buffer still
    registers and an RDMA WRITE into it arrives."""
    m = host(gpu=True)
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    v1, v2 = endpoint(victim, 0x10), endpoint(victim, 0x20)
    a = endpoint(attacker, 0x30)
    d = victim.run(cudart(victim).cudaMalloc, GPU_BUF)
    gpu_store(victim, d, pattern(GPU_BUF, 1))
    assert attacker.mm.vma_lookup(d) is None and attacker.mm.vma_lookup(d + GPU_BUF - 1) is None
    pinned = attacker.mm.pinned_vm
    windows = m.gpus[0].windows_mapped()

    def reg(length: int) -> int:
        return attacker.run(err, v.ibv_reg_mr, a.pd.pd, d, length, ALL_ACCESS)

    assert reg(GPU_BUF) == errno.EFAULT
    assert reg(GPU_PAGE_SIZE) == errno.EFAULT
    rt = cudart(attacker)                       # now the attacker has a GPU client too
    assert reg(GPU_BUF) == errno.EFAULT
    assert attacker.mm.pinned_vm == pinned and m.gpus[0].windows_mapped() == windows
    # RM's escapes on the attacker's own file: not its allocation
    with pytest.raises(CudaError) as e:
        rt._escape(nv_uapi.NV_ESC_FREE_MEMORY, nv_uapi.NV_FREE_FMT, [d], "cudaFree")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(CudaError) as e:
        rt.cudaFree(d)
    assert e.value.errno == errno.EINVAL
    with pytest.raises(CudaError) as e:         # nor its P2P tokens
        rt.cuPointerGetAttribute(nv_uapi.CU_POINTER_ATTRIBUTE_P2P_TOKENS, d)
    assert e.value.errno == errno.EINVAL
    handle = gpu_memory(m, d).handle
    va = attacker.mmap(0, GPU_BUF, PROT_READ | PROT_WRITE, MAP_SHARED, rt.fd,
                       handle << m.page_shift)
    assert va == -errno.EINVAL
    # the victim's allocation is whole: same bytes, registers, takes a WRITE
    assert gpu_load(victim, d, GPU_BUF) == pattern(GPU_BUF, 1)
    gmr = victim.run(MR, v2.pd, GPU_BUF, ALL_ACCESS, d)
    wire(v1, v2)
    v1.mr.write(pattern(BUF, 2))
    v1.qp.post_send(write_wr(1, v1, d + GPU_PAGE_SIZE - 100, gmr.rkey, 1000))
    assert status(v1.cq.poll_until(1)) == [(1, "SUCCESS")]
    got = gpu_load(victim, d, GPU_BUF)
    want = bytearray(pattern(GPU_BUF, 1))
    want[GPU_PAGE_SIZE - 100:GPU_PAGE_SIZE + 900] = pattern(BUF, 2)[:1000]
    assert got == bytes(want)
    assert m.gpus[0].bar1_faults == []
    gmr.close()
    victim.run(cudart(victim).cudaFree, d)


def test_stale_rkey_after_cuda_free_reaches_nothing():
    """The victim registers GPU memory; the attacker, connected to it, WRITEs with the
    rkey (it works); the victim cudaFrees, the free callback revokes the MR, and the
    attacker's next WRITE completes IBV_WC_REM_ACCESS_ERR: no BAR1 fault, the freed pages
    and the victim's next allocation (on those pages again) keep their bytes."""
    m = host(gpu=True)
    victim, attacker = m.spawn("victim"), m.spawn("attacker")
    vic, a = endpoint(victim, 0x10), endpoint(attacker, 0x30)
    d = victim.run(cudart(victim).cudaMalloc, GPU_BUF)
    gmr = victim.run(MR, vic.pd, GPU_BUF, ALL_ACCESS, d)
    wire(a, vic)
    a.mr.write(pattern(BUF, 3))
    a.qp.post_send(write_wr(1, a, d + 0x100, gmr.rkey, 1024))
    assert status(a.cq.poll_until(1)) == [(1, "SUCCESS")]
    assert gpu_load(victim, d + 0x100, 1024) == pattern(BUF, 3)[:1024]
    gpu = m.gpus[0]
    old_pages = list(gpu_memory(m, d).pages)
    victim.run(cudart(victim).cudaFree, d)

    def vidmem() -> list[bytes]:
        return [bytes(gpu.vidmem[pg << GPU_PAGE_SHIFT:(pg + 1) << GPU_PAGE_SHIFT])
                for pg in old_pages]

    d2 = victim.run(cudart(victim).cudaMalloc, GPU_BUF)
    assert sorted(gpu_memory(m, d2).pages) == sorted(old_pages)   # the same pages again
    gpu_store(victim, d2, pattern(GPU_BUF, 8))
    freed = vidmem()
    a.mr.write(pattern(BUF, 4))
    a.qp.post_send(write_wr(2, a, d + 0x100, gmr.rkey, 1024))
    assert status(a.cq.poll_until(1)) == [(2, "REM_ACCESS_ERR")]
    assert fw_state(m, a) == QPS_ERR
    assert gpu.bar1_faults == []
    assert vidmem() == freed
    assert gpu_load(victim, d2, GPU_BUF) == pattern(GPU_BUF, 8)
    assert vic.mr.read(BUF) == bytes(BUF)       # nor into the victim's host memory
    gmr.close()
    victim.run(cudart(victim).cudaFree, d2)


# -- 7: RLIMIT_MEMLOCK ------------------------------------------------------------------------
def test_rlimit_memlock_bounds_the_attacker_only():
    """An attacker with a 64 KiB RLIMIT_MEMLOCK fills it exactly (an MR of the pages its
    CQ, QP and doorbells left), then one page more is ENOMEM with its pinned_vm back where
    it was and no page left pinned; the victim's pinned_vm and page pins never move.  A
    process with CAP_IPC_LOCK and the same limit registers past it (ib_umem_get checks
    capable(CAP_IPC_LOCK))."""
    limit = 64 << 10
    m = host()
    victim = m.spawn("victim")
    attacker = m.spawn("attacker", rlimit_memlock=limit)
    capped = m.spawn("admin", rlimit_memlock=limit, cap_ipc_lock=True)
    vic = endpoint(victim, 0x10)
    vic.mr.write(pattern(BUF, 1))
    victim_pins = pins(victim, vic.mr)
    a = endpoint(attacker, 0x30)
    room = limit // PAGE - attacker.mm.pinned_vm
    assert 1 < room < limit // PAGE
    size = (room + 4) * PAGE
    buf = attacker.mmap(0, size)
    attacker.store(buf, bytes(size))            # fault every page in: pins would show
    m_ = attacker.machine

    def pincounts() -> list[int]:
        return [page(m_.zone, phys(attacker, buf + i) >> m_.page_shift)._pincount
                for i in range(0, size, PAGE)]

    before = attacker.mm.pinned_vm
    for extra in (1, 4):
        assert err(v.ibv_reg_mr, a.pd.pd, buf, (room + extra) * PAGE,
                   ALL_ACCESS) == errno.ENOMEM
        assert attacker.mm.pinned_vm == before and set(pincounts()) == {0}
    mr = v.ibv_reg_mr(a.pd.pd, buf, room * PAGE, ALL_ACCESS)   # exactly the limit
    assert attacker.mm.pinned_vm == limit // PAGE
    assert err(v.ibv_reg_mr, a.pd.pd, buf, PAGE, ALL_ACCESS) == errno.ENOMEM
    assert attacker.mm.pinned_vm == limit // PAGE
    assert pins(victim, vic.mr) == victim_pins
    assert v.ibv_dereg_mr(mr) == 0
    assert attacker.mm.pinned_vm == before and set(pincounts()) == {0}
    # CAP_IPC_LOCK: the same limit does not bind
    adm = endpoint(capped, 0x50)
    big = adm.ctx.proc.mmap(0, 2 * limit)
    mr = v.ibv_reg_mr(adm.pd.pd, big, 2 * limit, ALL_ACCESS)
    assert capped.mm.pinned_vm > limit // PAGE
    assert v.ibv_dereg_mr(mr) == 0
    assert pins(victim, vic.mr) == victim_pins
    assert vic.mr.read(BUF) == pattern(BUF, 1)
    extra = MR(vic.pd, PAGE, ALL_ACCESS)       # the victim still registers
    extra.close()
    assert pins(victim, vic.mr) == victim_pins


def test_rlimit_memlock_zero_is_eperm_without_cap_ipc_lock():
    """RLIMIT_MEMLOCK 0: ib_umem_get refuses any pin (can_do_mlock: EPERM) - an MR and the
    CQ buffer alike - unless the process has CAP_IPC_LOCK."""
    m = host()
    p = m.spawn("nolock", rlimit_memlock=0)
    ctx = Context(p)
    pd = PD(ctx)
    buf = p.mmap(0, 2 * PAGE)
    assert err(v.ibv_reg_mr, pd.pd, buf, 2 * PAGE, ALL_ACCESS) == errno.EPERM
    assert err(v.ibv_create_cq, ctx.ctx, 16) == errno.EPERM
    assert p.mm.pinned_vm == 0
    q = m.spawn("admin", rlimit_memlock=0, cap_ipc_lock=True)
    ep = endpoint(q)
    assert q.mm.pinned_vm >= BUF // PAGE
    ep.ctx.close()
    assert q.mm.pinned_vm == 0
