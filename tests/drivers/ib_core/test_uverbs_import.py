"""The kernel side of sharing a context (ibv_import_device/_pd/_mr/_dm): the methods
that describe what a uverbs file already holds - UVERBS_METHOD_QUERY_CONTEXT (with
mlx5's alloc_ucontext answer), UVERBS_METHOD_ASYNC_EVENT_ALLOC, UVERBS_METHOD_QUERY_MR,
MLX5_IB_METHOD_PD_QUERY, MLX5_IB_METHOD_DM_QUERY - driven by ioctl() on the fd, and the
uverbs node's dev_t (sysfs `dev`, fstat)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.uapi import ib_user_ioctl_cmds as ioc
from kernel_model.uapi import rdma_user_ioctl as ui
from kernel_model.uapi.mlx5_abi import mlx5_ib_alloc_ucontext_resp
from kernel_model.uapi.stat import S_IFMT, S_IFREG, S_ISCHR, makedev, stat
from tests.drivers.mlx5_ib.ladder import ib_dev
from userspace.libc import O_RDONLY, O_RDWR, posix_memalign, read_sysfs
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import CMD_BUF_SIZE, VerbsError

RESP = mlx5_ib_alloc_ucontext_resp


@pytest.fixture
def rig():
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib", dyn_uar=True)
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    yield m, p, ctx
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


def query_context(ctx, resp_len: int | None = RESP.SIZE) -> tuple[int, RESP, bytes]:
    """QUERY_CONTEXT with mlx5's answer buffer of resp_len bytes (None: left out)."""
    buf = posix_memalign(ctx.proc, 8, 4096)
    ctx.proc.store(buf, b"\xee" * 4096)
    drv = [] if resp_len is None else \
        [(ui.MLX5_IB_ATTR_QUERY_CONTEXT_RESP_UCTX, (buf, resp_len), "ptr_out")]
    core = c.ibv_cmd_query_context(ctx, drv)
    return core, RESP.unpack(ctx.proc.load(buf, RESP.SIZE)), ctx.proc.load(buf, 4096)


def test_query_context_answers_what_get_context_did(rig):
    m, p, ctx = rig
    ctx.num_comp_vectors = 0
    core, resp, raw = query_context(ctx, RESP.SIZE + 8)
    assert core == ioc.IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS
    assert ctx.num_comp_vectors == ib_dev(m).num_comp_vectors
    assert resp.response_length == RESP.SIZE
    assert resp.pack()[:RESP.offsetof("response_length")] == \
        ctx.resp.pack()[:RESP.offsetof("response_length")]
    assert (resp.num_dyn_bfregs, resp.tot_bfregs) == (ctx.resp.num_dyn_bfregs, 0)
    assert raw[RESP.SIZE:RESP.SIZE + 8] == bytes(8)          # a longer buffer: zeroed
    assert raw[RESP.SIZE + 8:RESP.SIZE + 16] == b"\xee" * 8   # and nothing beyond it


@pytest.mark.parametrize("resp_len", [None, RESP.SIZE - 4])
def test_query_context_needs_mlx5s_answer_buffer(rig, resp_len):
    _, _, ctx = rig
    with pytest.raises(VerbsError) as ex:
        query_context(ctx, resp_len)
    assert ex.value.errno == errno.EINVAL


def test_query_context_of_a_file_without_a_context_is_einval(rig):
    _, p, ctx = rig
    fd = p.open(ctx.device.dev_path, O_RDWR)
    bare = v.ibv_context(ctx.device, p, fd, ctx.ops, posix_memalign(p, 4096, CMD_BUF_SIZE))
    for fn in (query_context, c.ibv_cmd_alloc_async_fd):
        with pytest.raises(VerbsError) as ex:
            fn(bare)
        assert ex.value.errno == errno.EINVAL
    assert p.close(fd) == 0


def test_query_context_of_a_driver_without_query_ucontext(rig, monkeypatch):
    m, _, ctx = rig
    monkeypatch.setattr(ib_dev(m).ops, "query_ucontext", None)
    with pytest.raises(VerbsError) as ex:
        query_context(ctx)
    assert ex.value.errno == errno.EOPNOTSUPP


def test_async_event_alloc_gives_a_new_event_file(rig):
    _, p, ctx = rig
    first = ctx.async_fd
    c.ibv_cmd_alloc_async_fd(ctx)
    assert ctx.async_fd not in (first, ctx.cmd_fd)
    f = p.task.files.fdt[ctx.async_fd]
    assert f.f_path == "anon_inode:[infinibandevent]" and f.private_data.ufile is \
        p.task.files.fdt[ctx.cmd_fd].private_data
    assert p.close(ctx.async_fd) == 0
    ctx.async_fd = first


def query_mr(ctx, handle: int, iova: bool = False) -> dict[int, int]:
    attrs = [(ioc.UVERBS_ATTR_QUERY_MR_HANDLE, handle, "in8"),
             (ioc.UVERBS_ATTR_QUERY_MR_RESP_LKEY, 0, "out4"),
             (ioc.UVERBS_ATTR_QUERY_MR_RESP_RKEY, 0, "out4"),
             (ioc.UVERBS_ATTR_QUERY_MR_RESP_LENGTH, 0, "out8")]
    if iova:
        attrs.append((ioc.UVERBS_ATTR_QUERY_MR_RESP_IOVA, 0, "out8"))
    return c.execute_ioctl(ctx, ioc.UVERBS_OBJECT_MR, ioc.UVERBS_METHOD_QUERY_MR, attrs)


def test_query_mr_keys_length_iova_and_lookup_errors(rig):
    _, p, ctx = rig
    pd = v.ibv_alloc_pd(ctx)
    buf = posix_memalign(p, 4096, 8192)
    mr = v.ibv_reg_mr_iova(pd, buf, 5000, 0x7000, v.IBV_ACCESS_LOCAL_WRITE)
    out = query_mr(ctx, mr.handle, iova=True)
    assert [out[a] for a in (1, 2, 3, 4)] == [mr.lkey, mr.rkey, 5000, 0x7000]
    for handle, err in ((mr.handle + 100, errno.ENOENT), (pd.handle, errno.EINVAL)):
        with pytest.raises(VerbsError) as ex:
            query_mr(ctx, handle)
        assert ex.value.errno == err
    assert v.ibv_dereg_mr(mr) == 0
    with pytest.raises(VerbsError) as ex:                # gone: its handle too
        query_mr(ctx, mr.handle)
    assert ex.value.errno == errno.ENOENT
    assert v.ibv_dealloc_pd(pd) == 0


def query_pd(ctx, handle: int) -> int:
    return c.execute_ioctl(ctx, ioc.UVERBS_OBJECT_PD, ui.MLX5_IB_METHOD_PD_QUERY,
                           [(ui.MLX5_IB_ATTR_QUERY_PD_HANDLE, handle, "in8"),
                            (ui.MLX5_IB_ATTR_QUERY_PD_RESP_PDN, 0, "out4")])[
        ui.MLX5_IB_ATTR_QUERY_PD_RESP_PDN]


def test_pd_query_gives_the_pdn(rig):
    _, p, ctx = rig
    pds = [v.ibv_alloc_pd(ctx) for _ in range(2)]
    assert [query_pd(ctx, pd.handle) for pd in pds] == [pd.pdn for pd in pds]
    cq = v.ibv_create_cq(ctx, 4)
    for handle, err in ((99, errno.ENOENT), (cq.handle, errno.EINVAL)):
        with pytest.raises(VerbsError) as ex:
            query_pd(ctx, handle)
        assert ex.value.errno == err
    assert v.ibv_destroy_cq(cq) == 0
    assert [v.ibv_dealloc_pd(pd) for pd in pds] == [0, 0]


def query_dm(ctx, handle: int) -> dict[int, int]:
    return c.execute_ioctl(ctx, ioc.UVERBS_OBJECT_DM, ui.MLX5_IB_METHOD_DM_QUERY, [
        (ui.MLX5_IB_ATTR_QUERY_DM_REQ_HANDLE, handle, "in8"),
        (ui.MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET, 0, "out8"),
        (ui.MLX5_IB_ATTR_QUERY_DM_RESP_PAGE_INDEX, 0, "out4"),
        (ui.MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH, 0, "out8")])


def test_dm_query_tells_where_the_dm_is(rig):
    _, p, ctx = rig
    dms = [v.ibv_alloc_dm(ctx, n) for n in (100, 4096)]
    for dm in dms:
        out = query_dm(ctx, dm.handle)
        assert out[ui.MLX5_IB_ATTR_QUERY_DM_RESP_LENGTH] == dm.length
        assert dm.mmap_va + out[ui.MLX5_IB_ATTR_QUERY_DM_RESP_START_OFFSET] == dm.start_va
    pd = v.ibv_alloc_pd(ctx)
    for handle, err in ((99, errno.ENOENT), (pd.handle, errno.EINVAL)):
        with pytest.raises(VerbsError) as ex:
            query_dm(ctx, handle)
        assert ex.value.errno == err
    assert [v.ibv_free_dm(dm) for dm in dms] == [0, 0]
    assert v.ibv_dealloc_pd(pd) == 0


def test_the_uverbs_node_has_a_dev_t(rig):
    _, p, ctx = rig
    assert read_sysfs(p, "/sys/class/infiniband_verbs/uverbs0/dev") == "231:192\n"
    buf = posix_memalign(p, 8, stat.SIZE)
    assert p.fstat(ctx.cmd_fd, buf) == 0
    st = stat.unpack(p.load(buf, stat.SIZE))
    assert S_ISCHR(st.st_mode) and st.st_rdev == makedev(231, 192) == ctx.device.sysfs_cdev
    fd = p.open("/sys/class/infiniband_verbs/uverbs0/dev", O_RDONLY)
    assert p.fstat(fd, buf) == 0                            # a sysfs attribute: regular
    assert stat.unpack(p.load(buf, stat.SIZE)).st_mode & S_IFMT == S_IFREG
    assert p.close(fd) == 0
