"""userspace/libibverbs ibv_import_device / ibv_import_pd / ibv_import_mr / ibv_import_dm
and their unimports, with libmlx5's import ops: a second context on a dup of the
command fd shares the first one's objects by handle; the errnos of each step."""

from __future__ import annotations

import errno

import pytest

from kernel_model.current import running
from kernel_model.emu.platform import rdma_host
from kernel_model.fs import MKDEV, O_CREAT, O_RDWR, cdev, cdev_add, file_operations
from userspace.libc import posix_memalign
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_types import IBV_MR_TYPE_IMPORTED_MR


def open_host(dyn_uar: bool = True):
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib", dyn_uar=dyn_uar)
    p = m.spawn("app")
    return m, p, v.ibv_open_device(p, v.ibv_get_device_list(p)[0])


@pytest.fixture
def rig():
    m, p, ctx = open_host()
    yield m, p, ctx
    p.exit(0)


def import_error(p, fd: int) -> int:
    with pytest.raises(OSError) as ex:        # VerbsError, or libmlx5's ProviderError
        v.ibv_import_device(p, fd)
    return ex.value.errno


def test_an_imported_context_shares_the_objects(rig):
    m, p, ctx = rig
    pd = v.ibv_alloc_pd(ctx)
    buf = posix_memalign(p, 4096, 8192)
    mr = v.ibv_reg_mr(pd, buf, 8192, v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE)
    ictx = v.ibv_import_device(p, p.dup(ctx.cmd_fd))
    assert ictx.imported and ictx.num_comp_vectors == ctx.num_comp_vectors
    assert ictx.async_fd not in (-1, ctx.async_fd)
    assert p.task.files.fdt[ictx.cmd_fd].private_data is \
        p.task.files.fdt[ctx.cmd_fd].private_data          # one uverbs file, one ucontext
    ipd = v.ibv_import_pd(ictx, pd.handle)
    assert (ipd.context, ipd.handle, ipd.pdn) == (ictx, pd.handle, pd.pdn)
    imr = v.ibv_import_mr(ipd, mr.handle)
    assert (imr.lkey, imr.rkey, imr.length, imr.addr, imr.handle, imr.mr_type) == \
        (mr.lkey, mr.rkey, 8192, 0, mr.handle, IBV_MR_TYPE_IMPORTED_MR)
    # an object made through the imported context is the original's too
    pd2 = v.ibv_alloc_pd(ictx)
    assert v.ibv_import_pd(ctx, pd2.handle).pdn == pd2.pdn
    assert v.ibv_dealloc_pd(pd2) == 0
    v.ibv_unimport_mr(imr)
    v.ibv_unimport_pd(ipd)
    assert v.ibv_close_device(ictx) == 0                   # the objects stay
    assert v.ibv_import_pd(ctx, pd.handle).pdn == pd.pdn
    assert v.ibv_dereg_mr(mr) == 0 and v.ibv_dealloc_pd(pd) == 0
    assert v.ibv_close_device(ctx) == 0


def test_closing_the_first_context_leaves_the_imported_one_working(rig):
    m, p, ctx = rig
    pds = set(m.hcas[0].fw.pds)
    pd = v.ibv_alloc_pd(ctx)
    ictx = v.ibv_import_device(p, p.dup(ctx.cmd_fd))
    assert v.ibv_close_device(ctx) == 0                    # the dup keeps the file open
    assert pd.pdn in m.hcas[0].fw.pds
    ipd = v.ibv_import_pd(ictx, pd.handle)
    assert ipd.pdn == pd.pdn
    cq = v.ibv_create_cq(ictx, 4)
    assert v.ibv_destroy_cq(cq) == 0
    v.ibv_unimport_pd(ipd)
    assert v.ibv_close_device(ictx) == 0                   # last fd: every object goes
    assert set(m.hcas[0].fw.pds) == pds - {pd.pdn}


def test_import_of_an_fd_that_is_no_uverbs_file(rig):
    m, p, ctx = rig
    assert import_error(p, 42) == errno.EINVAL                       # not open
    reg = p.open("/tmp/file", O_RDWR | O_CREAT)
    assert import_error(p, reg) == errno.EINVAL                      # not a char device
    with running(m.init_task):
        cdev_add(cdev(file_operations(), dev=MKDEV(1, 3)), "/dev/null")
    null = p.open("/dev/null", O_RDWR)
    assert import_error(p, null) == errno.ENODEV                     # no uverbs device
    assert p.close(reg) == 0 and p.close(null) == 0   # the fds stay the caller's
    assert v.ibv_close_device(ctx) == 0


def test_import_without_the_providers_import_context(rig, monkeypatch):
    m, p, ctx = rig
    monkeypatch.setattr(ctx.device.ops, "import_context", None)
    fd = p.dup(ctx.cmd_fd)
    assert import_error(p, fd) == errno.EOPNOTSUPP
    assert p.close(fd) == 0                                # still the caller's
    assert v.ibv_close_device(ctx) == 0


def test_import_of_a_context_with_static_uars_is_einval_and_closes_the_fd():
    m, p, ctx = open_host(dyn_uar=False)           # a kernel without dynamic UARs
    assert ctx.resp.tot_bfregs
    fd = p.dup(ctx.cmd_fd)
    fds = p.task.files.open_fds()
    assert import_error(p, fd) == errno.EINVAL
    assert p.task.files.open_fds() == [f for f in fds if f != fd]  # the library closed it
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


def test_import_pd_and_mr_lookup_errors(rig):
    m, p, ctx = rig
    pd = v.ibv_alloc_pd(ctx)
    buf = posix_memalign(p, 4096, 4096)
    mr = v.ibv_reg_mr(pd, buf, 4096, v.IBV_ACCESS_LOCAL_WRITE)
    ictx = v.ibv_import_device(p, p.dup(ctx.cmd_fd))
    ipd = v.ibv_import_pd(ictx, pd.handle)
    cases = [(v.ibv_import_pd, ictx, 77, errno.ENOENT),
             (v.ibv_import_pd, ictx, mr.handle, errno.EINVAL),
             (v.ibv_import_mr, ipd, 77, errno.ENOENT),
             (v.ibv_import_mr, ipd, pd.handle, errno.EINVAL)]
    for fn, owner, handle, err in cases:
        with pytest.raises(VerbsError) as ex:
            fn(owner, handle)
        assert ex.value.errno == err, (fn.__name__, handle)
    # a handle of another file (another open of the device) is not this one's
    other = v.ibv_open_device(p, ctx.device)
    with pytest.raises(VerbsError) as ex:
        v.ibv_import_pd(other, v.ibv_alloc_pd(ctx).handle)
    assert ex.value.errno == errno.ENOENT
    assert v.ibv_close_device(other) == 0
    v.ibv_unimport_pd(ipd)
    assert v.ibv_close_device(ictx) == 0
    assert v.ibv_close_device(ctx) == 0


def test_unimport_of_a_parent_domain_or_a_pd_a_parent_domain_uses(rig):
    m, p, ctx = rig
    pd = v.ibv_alloc_pd(ctx)
    ictx = v.ibv_import_device(p, p.dup(ctx.cmd_fd))
    ipd = v.ibv_import_pd(ictx, pd.handle)
    pad = v.ibv_alloc_parent_domain(ictx, v.ibv_parent_domain_init_attr(pd=ipd))
    for obj, err in ((pad, errno.EINVAL), (ipd, errno.EBUSY)):
        with pytest.raises(VerbsError) as ex:
            v.ibv_unimport_pd(obj)
        assert ex.value.errno == err
    assert v.ibv_dealloc_pd(pad) == 0
    v.ibv_unimport_pd(ipd)
    assert v.ibv_close_device(ictx) == 0
    assert v.ibv_close_device(ctx) == 0


def test_an_imported_dm_maps_the_same_memory(rig):
    m, p, ctx = rig
    dm = v.ibv_alloc_dm(ctx, 200)
    ictx = v.ibv_import_device(p, p.dup(ctx.cmd_fd))
    idm = v.ibv_import_dm(ictx, dm.handle)
    assert (idm.handle, idm.length) == (dm.handle, 200) and idm.start_va != dm.start_va
    assert v.ibv_memcpy_to_dm(dm, 64, b"shared!!", 8) == 0
    assert v.ibv_memcpy_from_dm(idm, 64, 8) == (0, b"shared!!")
    pd = v.ibv_alloc_pd(ctx)
    for handle, err in ((77, errno.ENOENT), (pd.handle, errno.EINVAL)):
        with pytest.raises(VerbsError) as ex:
            v.ibv_import_dm(ictx, handle)
        assert ex.value.errno == err
    v.ibv_unimport_dm(idm)
    assert v.ibv_free_dm(dm) == 0 and v.ibv_dealloc_pd(pd) == 0
    assert m.hcas[0].fw.memics == {}                 # nothing maps the MEMIC any more
    assert v.ibv_close_device(ictx) == 0 and v.ibv_close_device(ctx) == 0
