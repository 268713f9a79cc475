"""drivers/ib_core/uverbs_ioctl.py: the RDMA_VERBS_IOCTL header and attribute checks,
driven by raw ioctl() calls on a dynamic-UAR context (whose UAR-object methods
are the driver methods that exist only as ioctls)."""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.uapi import rdma_user_ioctl as ui
from userspace.libibverbs import verbs as v


@pytest.fixture
def ctx():
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib", dyn_uar=True)
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    uars = len(m.hcas[0].fw.uars)
    yield ctx
    assert len(m.hcas[0].fw.uars) == uars  # no failed call left a UAR behind
    assert v.ibv_close_device(ctx) == 0
    p.exit(0)


def _alloc_attrs(out_len: int = 8, out_ptr: int | None = None,
                 base: int = 0) -> list[ui.ib_uverbs_attr]:
    """UAR_OBJ_ALLOC's attributes: handle, type NC, three outputs at base+0x100..."""
    out = base + 0x100 if out_ptr is None else out_ptr
    return [ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_HANDLE, len=8),
            ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_TYPE, len=4, data=1),
            ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_OFFSET, len=out_len,
                              data=out),
            ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_MMAP_LENGTH, len=4,
                              data=base + 0x110),
            ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_ALLOC_PAGE_ID, len=4,
                              data=base + 0x118)]


def _ioctl(ctx, attrs, **hdr) -> int:
    buf = ctx.cmd_buf
    fields = dict(length=ui.ib_uverbs_ioctl_hdr.SIZE + len(attrs) * ui.ib_uverbs_attr.SIZE,
                  object_id=ui.MLX5_IB_OBJECT_UAR, method_id=ui.MLX5_IB_METHOD_UAR_OBJ_ALLOC,
                  num_attrs=len(attrs), driver_id=1)
    fields.update(hdr)
    ctx.proc.store(buf, ui.ib_uverbs_ioctl_hdr(**fields).pack()
                   + b"".join(a.pack() for a in attrs))
    return ctx.proc.ioctl(ctx.cmd_fd, ui.RDMA_VERBS_IOCTL, buf)


def test_a_good_call_returns_the_handle_and_marks_outputs_valid(ctx):
    base = ctx.cmd_buf + 0x800
    assert _ioctl(ctx, _alloc_attrs(base=base)) == 0
    raw = ctx.proc.load(ctx.cmd_buf + ui.ib_uverbs_ioctl_hdr.SIZE, 5 * ui.ib_uverbs_attr.SIZE)
    attrs = [ui.ib_uverbs_attr.unpack(raw[i:i + 16]) for i in range(0, len(raw), 16)]
    handle = attrs[0].data
    assert all(a.flags & ui.UVERBS_ATTR_F_VALID_OUTPUT for a in attrs[2:])
    assert int.from_bytes(ctx.proc.load(base + 0x110, 4), "little") == 4096  # one page
    destroy = [ui.ib_uverbs_attr(attr_id=ui.MLX5_IB_ATTR_UAR_OBJ_DESTROY_HANDLE, len=8,
                                 data=handle)]
    assert _ioctl(ctx, destroy, method_id=ui.MLX5_IB_METHOD_UAR_OBJ_DESTROY) == 0


def test_header_length_must_match_the_attributes(ctx):
    attrs = _alloc_attrs(base=ctx.cmd_buf + 0x800)
    assert _ioctl(ctx, attrs, length=ui.ib_uverbs_ioctl_hdr.SIZE) == -errno.EINVAL


def test_reserved_header_fields_are_eprotonosupport(ctx):
    attrs = _alloc_attrs(base=ctx.cmd_buf + 0x800)
    assert _ioctl(ctx, attrs, reserved1=1) == -errno.EPROTONOSUPPORT
    assert _ioctl(ctx, attrs, reserved2=1) == -errno.EPROTONOSUPPORT


def test_an_output_too_short_for_its_value_is_enospc(ctx):
    assert _ioctl(ctx, _alloc_attrs(out_len=2, base=ctx.cmd_buf + 0x800)) == -errno.ENOSPC


def test_an_output_pointer_into_nothing_is_efault(ctx):
    assert _ioctl(ctx, _alloc_attrs(out_ptr=8, base=ctx.cmd_buf + 0x800)) == -errno.EFAULT


def test_a_header_outside_the_process_is_efault(ctx):
    assert ctx.proc.ioctl(ctx.cmd_fd, ui.RDMA_VERBS_IOCTL, 8) == -errno.EFAULT


def test_after_device_removal_a_driver_method_is_eio_and_an_unknown_one_eprotonosupport():
    """uverbs_disassociate_api_pre: removal takes the handler from every driver method
    (EIO), while a method the table never had stays EPROTONOSUPPORT."""
    m = rdma_host(ram_size=64 << 20)
    m.load_module("mlx5_ib", dyn_uar=True)
    p = m.spawn("app")
    ctx = v.ibv_open_device(p, v.ibv_get_device_list(p)[0])
    attrs = _alloc_attrs(base=ctx.cmd_buf + 0x800)
    m.unload_module("mlx5_ib")
    assert _ioctl(ctx, attrs) == -errno.EIO
    assert "disassociated" in str(p.task.last_error)
    assert _ioctl(ctx, attrs, method_id=0x7f) == -errno.EPROTONOSUPPORT
    v.ibv_close_device(ctx)
    p.exit(0)
    m.check_leaks()
