"""userspace/pyverbs: DmaBuf and DmaBufMR end to end - a GEM object of the implicit
host's amdgpu render node exported as a dma-buf and registered (ibv_reg_dmabuf_mr ->
UVERBS_METHOD_REG_DMABUF_MR -> mlx5_ib_reg_user_mr_dmabuf), bytes moved by RDMA WRITE
and READ into and out of it, the object moved VRAM -> GTT under a live MR (the MTT
zapped, the next access faulting the pages back in where they are then), the
registration errnos, and the close order and lifetime of the buffer and the MR."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from drivers.amdgpu.amdgpu_drm import TTM_PL_TT, TTM_PL_VRAM, amdgpu_bo_evict
from drivers.ib_core.device import ib_device_get_by_name
from drivers.mlx5_ib.mlx5_ib import to_mdev
from userspace.pyverbs import host
from userspace.pyverbs.addr import AHAttr, GlobalRoute
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.dmabuf import DmaBuf
from userspace.pyverbs.mr import MR, DmaBufMR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from userspace.pyverbs.wr import SGE, SendWR

LW, RW, RR = e.IBV_ACCESS_LOCAL_WRITE, e.IBV_ACCESS_REMOTE_WRITE, e.IBV_ACCESS_REMOTE_READ


def machine():
    return host.host().machine


def drm():
    return machine().modules["amdgpu"].state.devices[0].ddev


def bo_of(buf: DmaBuf):
    return host.current_process().task.files.fdt[buf.drm_fd].private_data.object_idr[
        buf.handle]


def resumes() -> int:
    return sum(1 for c in machine().hcas[0].fw.cmd_log if c[0] == "PAGE_FAULT_RESUME")


def rdma(qp, cq, opcode: int, local: MR, length: int, rkey: int, addr: int) -> None:
    wr = SendWR(wr_id=1, opcode=opcode, num_sge=1, sg=[SGE(local.buf, length, local.lkey)],
                send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(rkey, addr)
    qp.post_send(wr)
    for _ in range(10_000):
        n, wcs = cq.poll(1)
        if n:
            assert wcs[0].status == e.IBV_WC_SUCCESS, wcs[0].status
            return
    raise AssertionError("no completion")


def _rc_pair(ctx: d.Context, pd: PD, cq: CQ) -> tuple[QP, QP]:
    """Two connected RC QPs taking remote writes and reads."""
    init = QPAttr()
    init.qp_access_flags = LW | RW | RR          # set at INIT (pyverbs' QP(..., qp_attr))
    qps = [QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(4, 4)), init)
           for _ in range(2)]
    gid = ctx.query_gid(1, 0)
    for me, peer in ((qps[0], qps[1]), (qps[1], qps[0])):
        attr = QPAttr()
        attr.dest_qp_num, attr.max_dest_rd_atomic, attr.max_rd_atomic = peer.qp_num, 1, 1
        attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 14, 7, 7
        attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=gid))
        me.to_rts(attr)
    return qps[0], qps[1]


def test_dmabuf_allocates_through_the_render_node():
    buf = DmaBuf(5000)
    assert buf.fd >= 0 and buf.drm_fd >= 0 and buf.handle == 1 and buf.size == 5000
    assert buf.map_offset == 1 << 32
    bo = bo_of(buf)
    assert bo.mem_type == TTM_PL_VRAM and bo.size == 8192
    gtt = DmaBuf(4096, gtt=1)
    assert bo_of(gtt).mem_type == TTM_PL_TT
    buf.close()
    buf.close()
    gtt.close()
    assert drm().objects == []
    with pytest.raises(PyverbsRDMAError) as ei:
        DmaBuf(1, gpu=1)                          # no /dev/dri/renderD129
    assert ei.value.error_code == errno.ENOENT
    assert "Failed to allocate dmabuf of size 1 on gpu 1" in str(ei.value)


def test_rdma_write_and_read_move_bytes_into_and_out_of_gpu_memory():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16, None, None, 0)
        a, b = _rc_pair(ctx, pd, cq)
        src, dst = MR(pd, 8192, LW), MR(pd, 8192, LW)
        gmr = DmaBufMR(pd, 3 * 4096, LW | RW | RR, offset=4096)
        assert gmr.buf == 0 and gmr.offset == 4096 and gmr.dmabuf.size == 4 * 4096
        src.write(b"into the GPU over RDMA", 22)
        rdma(a, cq, e.IBV_WR_RDMA_WRITE, src, 22, gmr.rkey, 4096 + 5000)
        assert gmr.read(22, 5000) == b"into the GPU over RDMA"
        bo = bo_of(gmr.dmabuf)
        vram = (bo.vram_pages[0] << 16) + 4096 + 5000            # offset 4096 + 5000
        assert machine().gpus[0].vidmem_read(vram, 22) == b"into the GPU over RDMA"
        gmr.write(b"out of the GPU", 14, 100)
        rdma(a, cq, e.IBV_WR_RDMA_READ, dst, 14, gmr.rkey, 4096 + 100)
        assert dst.read(14, 0) == b"out of the GPU"
        gmr.close()
        assert drm().objects == []                # the internal DmaBuf went with it


def test_a_move_zaps_the_mr_and_the_next_access_faults_it_back_in():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        cq = CQ(ctx, 16, None, None, 0)
        a, b = _rc_pair(ctx, pd, cq)
        src = MR(pd, 4096, LW)
        gmr = DmaBufMR(pd, 2 * 4096, LW | RW)
        bo = bo_of(gmr.dmabuf)
        mkey = machine().hcas[0].fw.mkeys[gmr.lkey >> 8]
        assert not mkey.pf_absent and bo.mem_type == TTM_PL_VRAM
        src.write(b"before", 6)
        rdma(a, cq, e.IBV_WR_RDMA_WRITE, src, 6, gmr.rkey, 0)
        with machine().kernel():
            amdgpu_bo_evict(bo)                   # the exporter moves it: move_notify
        assert bo.mem_type == TTM_PL_TT and mkey.pf_absent and not mkey.mkc["free"]
        assert machine().gpus[0].windows_mapped() == 0
        before = resumes()
        src.write(b"after", 5)
        rdma(a, cq, e.IBV_WR_RDMA_WRITE, src, 5, gmr.rkey, 4096)
        assert resumes() > before and not mkey.pf_absent      # faulted, mapped again
        assert gmr.read(6, 0) == b"before" and gmr.read(5, 4096) == b"after"
        phys = bo.pages[1].pfn << machine().page_shift        # the bytes are in GTT now
        assert machine().phys_read(phys, 5) == b"after"
        gmr.close()


def test_registration_errnos():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        buf = DmaBuf(2 * 4096)

        def err(**kw) -> int:
            args = {"length": 4096, "access": LW, "dmabuf": buf, "offset": 0} | kw
            with pytest.raises(PyverbsRDMAError) as ei:
                DmaBufMR(pd, args.pop("length"), args.pop("access"), **args)
            assert "Failed to register a dma-buf MR" in str(ei.value)
            return ei.value.error_code
        assert err(length=3 * 4096) == errno.EINVAL             # past the buffer's end
        assert err(offset=4096, length=2 * 4096) == errno.EINVAL
        assert err(dmabuf=-1) == errno.EBADF
        assert err(dmabuf=buf.drm_fd) == errno.EINVAL           # not a dma-buf
        assert err(access=RW) == errno.EINVAL                   # remote write without local
        assert err(access=LW | e.IBV_ACCESS_ON_DEMAND) == errno.EINVAL   # not a dma-buf flag
        assert err(access=LW | e.IBV_ACCESS_MW_BIND) == errno.EINVAL      # (uverbs' mask)
        # without ODP the HCA cannot fault a moved buffer back in: EOPNOTSUPP
        with machine().kernel():
            ib = to_mdev(ib_device_get_by_name("mlx5_0"))
        saved = ib.odp_caps.general_caps
        ib.odp_caps.general_caps = 0
        try:
            assert err() == errno.EOPNOTSUPP
        finally:
            ib.odp_caps.general_caps = saved
        # an MR over a given fd: the buffer is the caller's to close
        mr = DmaBufMR(pd, 4096, LW, dmabuf=buf.fd, offset=4096)
        assert mr.dmabuf == buf.fd                # (read/write need a DmaBuf, as in pyverbs)
        mr.close()
        assert bo_of(buf) is not None
        buf.close()
        assert drm().objects == []


def test_closing_the_dmabuf_closes_its_mrs_and_the_fd_can_go_before_dereg():
    with d.Context(name="mlx5_0") as ctx, PD(ctx) as pd:
        buf = DmaBuf(4096)
        mr = DmaBufMR(pd, 4096, LW, dmabuf=buf)
        assert mr.dmabuf is buf
        buf.close()                               # the MR first, then the buffer
        assert mr._closed and drm().objects == []
        mr.close()
        # the dma-buf fd closed under a live MR: the MR's reference keeps the object
        buf = DmaBuf(4096)
        bo = bo_of(buf)
        mr = DmaBufMR(pd, 4096, LW, dmabuf=buf.fd)
        proc = host.current_process()
        assert proc.close(buf.fd) == 0
        buf.dmabuf.fd = -1
        buf.close()                               # handle and node go; the MR holds it
        assert drm().objects == [bo]
        mr.close()
        assert drm().objects == []
