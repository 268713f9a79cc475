"""dma-buf MRs: the dma-buf core, the NVIDIA exporter, ib_umem_dmabuf, mlx5's
reg_user_mr_dmabuf and its move_notify, ibv_reg_dmabuf_mr and fi_mr's FI_MR_DMABUF -
and the contrast with peer memory: cudaFree does not revoke a dma-buf MR, the
memory stays until the MR and the fd let go of it."""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.device import ib_device_get_by_name
from drivers.ib_core.umem_dmabuf import ib_umem_dmabuf_get
from drivers.mlx5_ib.mr import mlx5_ib_dmabuf_attach_ops
from kernel_model.dma import DMA_BIDIRECTIONAL
from kernel_model.dma_buf import (
    dma_buf_attach_ops,
    dma_buf_detach,
    dma_buf_dynamic_attach,
    dma_buf_export,
    dma_buf_fd,
    dma_buf_get,
    dma_buf_map_attachment,
    dma_buf_move_notify,
    dma_buf_ops,
    dma_buf_put,
)
from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.kthread import kthread_run
from kernel_model.locking import mutex_lock, mutex_unlock
from kernel_model.page_alloc import alloc_pages, page_to_phys, put_page
from kernel_model.scatterlist import sg_table
from kernel_model.slab import kfree, kmalloc_obj
from tests.nvidia_host import nvdev
from userspace.cuda.runtime import CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, CudaError, cudart
from userspace.libfabric.fi_errno import FI_ENOKEY
from userspace.libfabric.fi_mr import (
    FI_HMEM,
    FI_HMEM_CUDA,
    FI_MR_ALLOCATED,
    FI_MR_DMABUF,
    FI_MR_PROV_KEY,
    FI_MR_VIRT_ADDR,
    FI_REMOTE_WRITE,
    fi_close,
    fi_domain,
    fi_mr_attr,
    fi_mr_dmabuf,
    fi_mr_regattr,
)
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError

MiB, K64 = 1 << 20, 1 << 16
RW = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE
DMABUF = CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD


@pytest.fixture
def host():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    p = m.spawn("app")
    yield m, p
    if p.alive:
        p.exit(0)


def verbs(p):
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    return ctx, v.ibv_alloc_pd(ctx)


def close_verbs(ctx, pd):
    v.ibv_dealloc_pd(pd)
    v.ibv_close_device(ctx)


def kernel_mr(m, key):
    return m.hcas[0].fw.mkeys.get(key >> 8)


def test_a_gpu_dmabuf_mr_maps_bar1_and_outlives_cudafree(host):
    m, p = host
    dev = nvdev(m)

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        fd = cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        ctx, pd = verbs(p)
        mr = v.ibv_reg_dmabuf_mr(pd, 4096, 2 * K64, d + 4096, fd, RW)
        mkey = kernel_mr(m, mr.lkey)
        assert mkey is not None and mkey.mkc["start_addr"] == d + 4096
        assert dev.bar1_mapped_bytes() == MiB             # the exporter mapped the range
        free_before = len(dev.free_pages)
        cu.cudaFree(d)                                    # no free callback, no revoke
        assert len(dev.free_pages) == free_before         # the dma-buf holds the pages
        assert not mkey.mkc["free"]
        v.ibv_dereg_mr(mr)
        assert dev.bar1_mapped_bytes() == 0 and len(dev.free_pages) == free_before
        p.close(fd)                                       # the last reference
        assert len(dev.free_pages) == free_before + MiB // K64
        close_verbs(ctx, pd)
    p.run(go)


def test_dmabuf_registration_errors(host):
    m, p = host

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        with pytest.raises(CudaError) as e:
            cu.cuMemGetHandleForAddressRange(d + 4096, K64, DMABUF)     # not whole pages
        assert e.value.errno == errno.EINVAL
        with pytest.raises(CudaError):
            cu.cuMemGetHandleForAddressRange(d, 2 * MiB, DMABUF)        # past the allocation
        with pytest.raises(CudaError):
            cu.cuMemGetHandleForAddressRange(d, MiB, 2)                 # another handle type
        fd = cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        ctx, pd = verbs(p)
        cases = [((0, MiB + 4096, 0, fd), errno.EINVAL),   # past the buffer's end
                 ((0, 0, 0, fd), errno.EINVAL),            # empty
                 ((100, K64, 0, fd), errno.EINVAL),        # offset and iova page offsets
                 ((0, K64, 0, 99), errno.EBADF),           # no such fd
                 ((0, K64, 0, ctx.cmd_fd), errno.EINVAL)]  # a file that is not a dma-buf
        for (offset, length, iova, f), want in cases:
            with pytest.raises(VerbsError) as e:
                v.ibv_reg_dmabuf_mr(pd, offset, length, iova, f, RW)
            assert e.value.errno == want, (offset, length, iova, f)
        for access, want in ((v.IBV_ACCESS_ON_DEMAND | RW, errno.EINVAL),  # not a dma-buf's
                             (v.IBV_ACCESS_REMOTE_WRITE, errno.EINVAL),    # no LOCAL_WRITE
                             (1 << 30, errno.EINVAL)):                     # unknown bit
            with pytest.raises(VerbsError) as e:
                v.ibv_reg_dmabuf_mr(pd, 0, K64, 0, fd, access)
            assert e.value.errno == want
        ops = ib_device_get_by_name("mlx5_0").ops      # a driver without dma-buf MRs
        saved, ops.reg_user_mr_dmabuf = ops.reg_user_mr_dmabuf, None
        try:
            with pytest.raises(VerbsError) as e:
                v.ibv_reg_dmabuf_mr(pd, 0, K64, 0, fd, RW)
            assert e.value.errno == errno.EOPNOTSUPP
        finally:
            ops.reg_user_mr_dmabuf = saved
        assert not m.hcas[0].fw.mkeys and nvdev(m).bar1_mapped_bytes() == 0
        p.close(fd)
        close_verbs(ctx, pd)
        cu.cudaFree(d)
    p.run(go)


def test_the_gpu_exporter_wants_a_peer_to_peer_importer(host):
    m, p = host

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        fd = cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        if True:                               # the process's own kernel context
            dmabuf = dma_buf_get(fd)
            no_p2p = dma_buf_attach_ops(move_notify=lambda a: None, allow_peer2peer=False)
            with pytest.raises(KernelError) as e:
                dma_buf_dynamic_attach(dmabuf, m.hcas[0].pdev, no_p2p, None)
            assert e.value.errno == errno.EOPNOTSUPP
            with pytest.raises(KernelError) as e:                   # importer without
                dma_buf_dynamic_attach(dmabuf, m.hcas[0].pdev,  # move_notify
                                       dma_buf_attach_ops(), None)
            assert e.value.errno == errno.EINVAL
            m.bugs.clear()
            dma_buf_put(dmabuf)
        p.close(fd)
        cu.cudaFree(d)
    p.run(go)


# -- a dynamic exporter: the buffer can move, importers hear of it --------------------------
class MovingBuffer:
    """A test exporter of host pages that can move (has pin): dma_buf_move_notify."""

    def __init__(self, m, npages):
        self.m = m
        self.pages = [alloc_pages(0, 0, "moving buffer") for _ in range(npages)]
        self.maps = 0
        ops = dma_buf_ops(map_dma_buf=self.map, unmap_dma_buf=self.unmap,
                          release=self.release, pin=lambda a: None, unpin=lambda a: None)
        self.dmabuf = dma_buf_export("moving", ops, npages * 4096, self)

    def map(self, attach, direction):
        sgt = kmalloc_obj(sg_table(self.m))
        sgt.ensure_capacity(len(self.pages))
        for i, pg in enumerate(self.pages):
            sgt.dma_addr.view[i], sgt.dma_len.view[i] = page_to_phys(pg), 4096
        sgt.nents = sgt.orig_nents = len(self.pages)
        self.maps += 1
        return sgt

    def unmap(self, attach, sgt, direction):
        self.maps -= 1
        kfree(sgt)

    def release(self, dmabuf):
        for pg in self.pages:
            put_page(pg)


def test_move_notify_zaps_the_mtt_and_unmaps_and_a_fault_maps_again(host):
    m, p = host

    def go():
        ctx, pd = verbs(p)
        buf = MovingBuffer(m, 4)
        fd = dma_buf_fd(buf.dmabuf, 0)               # into the process's fd table
        mr = v.ibv_reg_dmabuf_mr(pd, 0, 4 * 4096, 0x100000, fd, RW)
        mkey = kernel_mr(m, mr.lkey)
        assert buf.maps == 1 and not mkey.mkc["free"] and not mkey.pf_absent
        mutex_lock(buf.dmabuf.resv)
        dma_buf_move_notify(buf.dmabuf)              # the exporter moves the buffer
        mutex_unlock(buf.dmabuf.resv)
        # zapped (entries not present: the next access faults), the mapping given back;
        # the mkey stays on
        assert mkey.pf_absent and buf.maps == 0 and not mkey.mkc["free"]
        # a fault (here a prefetch: the same pagefault_mr) maps the buffer again
        assert v.ibv_advise_mr(pd, 1, 1, [v.ibv_sge(0x100000, 4096, mr.lkey)]) == 0
        assert buf.maps == 1 and not mkey.pf_absent
        v.ibv_dereg_mr(mr)
        assert buf.maps == 0
        mutex_lock(buf.dmabuf.resv)
        dma_buf_move_notify(buf.dmabuf)              # no importer left to tell
        mutex_unlock(buf.dmabuf.resv)
        p.close(fd)                                  # the exporter's release
        close_verbs(ctx, pd)
    p.run(go)


def test_mapping_needs_the_reservation_lock(host):
    m, p = host
    with m.kernel():
        buf = MovingBuffer(m, 1)
        attach = dma_buf_dynamic_attach(buf.dmabuf, m.hcas[0].pdev,
                                        mlx5_ib_dmabuf_attach_ops, None)
        sgt = dma_buf_map_attachment(attach, DMA_BIDIRECTIONAL)   # resv not held: WARN
        assert any("dma_resv" in b for b in m.bugs)
        m.bugs.clear()
        buf.unmap(attach, sgt, DMA_BIDIRECTIONAL)
        dma_buf_detach(buf.dmabuf, attach)
        dma_buf_put(buf.dmabuf)
        with pytest.raises(KernelError) as e:
            dma_buf_export("bad", dma_buf_ops(), 4096, None)
        assert e.value.errno == errno.EINVAL
        with pytest.raises(KernelError):
            ib_umem_dmabuf_get(ib_device_get_by_name("mlx5_0"), 0, 4096, 3,
                               v.IBV_ACCESS_LOCAL_WRITE, dma_buf_attach_ops())


# -- fi_mr(3): FI_MR_DMABUF -----------------------------------------------------------------
def test_fi_mr_regattr_with_a_dmabuf(host):
    m, p = host

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        fd = cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        _, dom = fi_domain(p, FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY, FI_HMEM)
        attr = fi_mr_attr(access=FI_REMOTE_WRITE, iface=FI_HMEM_CUDA,
                          dmabuf=fi_mr_dmabuf(fd, K64, K64, d))
        ret, mr = fi_mr_regattr(dom, attr, FI_MR_DMABUF)
        assert ret == 0 and mr.addr == d + K64 and mr.key == mr.ibv_mr.rkey
        assert kernel_mr(m, mr.ibv_mr.lkey).mkc["start_addr"] == d + K64
        assert fi_mr_regattr(dom, fi_mr_attr(access=FI_REMOTE_WRITE), FI_MR_DMABUF) == (
            -errno.EINVAL, None)                              # no fi_mr_dmabuf
        bad = fi_mr_attr(access=FI_REMOTE_WRITE, dmabuf=fi_mr_dmabuf(fd, 0, 2 * MiB, d))
        assert fi_mr_regattr(dom, bad, FI_MR_DMABUF) == (-errno.EINVAL, None)
        assert fi_close(mr) == 0 and fi_close(dom) == 0
        # requested keys (no FI_MR_PROV_KEY) are checked as on the regular path
        _, dom = fi_domain(p, FI_MR_VIRT_ADDR | FI_MR_ALLOCATED, FI_HMEM)
        wide = fi_mr_attr(access=FI_REMOTE_WRITE, requested_key=1 << 32,
                          dmabuf=fi_mr_dmabuf(fd, 0, K64, d))
        assert fi_mr_regattr(dom, wide, FI_MR_DMABUF) == (-errno.EKEYREJECTED, None)
        ok = fi_mr_attr(access=FI_REMOTE_WRITE, requested_key=5,
                        dmabuf=fi_mr_dmabuf(fd, 0, K64, d))
        ret, mr = fi_mr_regattr(dom, ok, FI_MR_DMABUF)
        assert ret == 0 and mr.key == 5
        assert fi_mr_regattr(dom, ok, FI_MR_DMABUF) == (-FI_ENOKEY, None)   # in use
        assert fi_close(mr) == 0 and fi_close(dom) == 0
        p.close(fd)
        cu.cudaFree(d)
    p.run(go)


def test_dmabuf_fd_minus_one_is_ebadf_and_the_mkey_goes_before_the_mapping(host):
    from kernel_model.trace import Tracer
    m, p = host

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        fd = cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        ctx, pd = verbs(p)
        with pytest.raises(VerbsError) as e:
            v.ibv_reg_dmabuf_mr(pd, 0, K64, 0, -1, RW)
        assert e.value.errno == errno.EBADF
        mr = v.ibv_reg_dmabuf_mr(pd, 0, MiB, d, fd, RW)
        with Tracer() as t:
            v.ibv_dereg_mr(mr)
        names = [c.func for c in t.trace.calls() if c.func in
                 ("mlx5_core_destroy_mkey", "nv_dma_buf_unmap")]
        assert names == ["mlx5_core_destroy_mkey", "nv_dma_buf_unmap"]   # DMA stops first
        p.close(fd)
        close_verbs(ctx, pd)
        cu.cudaFree(d)
    p.run(go)


def test_a_failed_export_holds_nothing(host):
    m, p = host
    dev = nvdev(m)

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(MiB)
        files = p.task.files
        saved, files.max_fds = files.max_fds, len(files.fdt)    # the next fd: EMFILE
        try:
            with pytest.raises(CudaError) as e:
                cu.cuMemGetHandleForAddressRange(d, MiB, DMABUF)
        finally:
            files.max_fds = saved
        assert e.value.errno == errno.EMFILE
        free = len(dev.free_pages)
        cu.cudaFree(d)
        assert len(dev.free_pages) == free + MiB // K64       # no dma-buf kept them
    p.run(go)


# -- registration racing a move: every interleaving, by the explorer ------------------------
def _reg_while_the_exporter_moves() -> None:
    """One thread registers a dma-buf MR while the exporter moves the buffer.  Whatever
    the interleaving, an MR whose MTT is loaded must not be built on a mapping from
    before the move (a move after the load zaps it)."""
    m = rdma_host(ram_size=32 << 20)
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    ctx, pd = p.run(verbs, p)
    buf = p.run(lambda: MovingBuffer(m, 2))
    fd = p.run(dma_buf_fd, buf.dmabuf, 0)
    moved = []

    def mover():
        mutex_lock(buf.dmabuf.resv)
        moved.append(buf.maps)                  # mappings alive at the move
        dma_buf_move_notify(buf.dmabuf)
        mutex_unlock(buf.dmabuf.resv)

    reg = p.start(v.ibv_reg_dmabuf_mr, pd, 0, 2 * 4096, 0x100000, fd, RW)
    with m.kernel():
        exporter = kthread_run(mover, name="exporter")
    mr = reg.join()
    exporter.join()
    mkey = kernel_mr(m, mr.lkey)
    assert not mkey.mkc["free"]
    if not mkey.pf_absent:                      # loaded: its mapping must postdate the move
        assert buf.maps == 1 and moved == [0], (moved, buf.maps)
    else:                                       # zapped by the move: nothing mapped
        assert buf.maps == 0, (moved, buf.maps)
    p.run(v.ibv_dereg_mr, mr)
    p.run(p.close, fd)
    p.run(close_verbs, ctx, pd)
    p.exit(0)


def test_no_interleaving_builds_a_live_mr_on_a_moved_buffer():
    from kernel_model.emu.explore import explore
    ex = explore(_reg_while_the_exporter_moves, "dfs", bound=2, max_schedules=300)
    assert ex.failure is None, ex.failure
    assert ex.runs > 1
