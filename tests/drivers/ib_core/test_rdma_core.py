"""drivers/ib_core/rdma_core.py: handle lookups and the errno each kind of miss gives.

rdma_lookup_get_uobject() is ENOENT for a handle the file does not hold and EINVAL
for a handle of another type.  The destroys (uobj_perform_destroy) and the ioctl
attributes pass that errno on; the write handlers that only read an object
(uobj_get_obj_read) answer any miss with EINVAL.
"""

from __future__ import annotations

import errno

import pytest

from drivers.ib_core.rdma_core import rdma_lookup_get_uobject
from tests.drivers.mlx5_ib.ladder import (
    create_qp_raw,
    errno_of,
    host,
    modify_raw,
    open_ctx,
    qp_cmd,
    qp_ucmd,
    rc_qp,
    user_pages,
)
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v

GHOST = 77  # a handle no file in these tests ever issues


@pytest.fixture
def env():
    """(p, ctx, pd, cq, qp, mr) in one process; a second process's file is made by the
    tests that need one."""
    m = host()
    p = m.spawn("app")
    ctx = open_ctx(p)
    pd = v.ibv_alloc_pd(ctx)
    cq = v.ibv_create_cq(ctx, 16)
    qp = rc_qp(ctx, pd, cq)
    mr = v.ibv_reg_mr(pd, user_pages(p), 4096, v.IBV_ACCESS_LOCAL_WRITE)
    yield p, ctx, pd, cq, qp, mr
    p.exit(0)


def _destroy(ctx, kind: str, handle: int) -> int:
    fn = {"pd": c.ibv_cmd_dealloc_pd, "mr": c.ibv_cmd_dereg_mr,
          "cq": c.ibv_cmd_destroy_cq, "qp": c.ibv_cmd_destroy_qp}[kind]
    return errno_of(fn, ctx, handle)


@pytest.mark.parametrize("kind", ["pd", "mr", "cq", "qp"])
def test_destroying_a_handle_the_file_never_issued_is_enoent(env, kind):
    p, ctx, *_ = env
    assert _destroy(ctx, kind, GHOST) == errno.ENOENT


@pytest.mark.parametrize("kind", ["pd", "mr", "cq", "qp"])
def test_destroying_another_files_handle_is_enoent(env, kind):
    """Another process names this file's object by its number: its own file has no
    such handle, and the owner's object is untouched."""
    p, ctx, pd, cq, qp, mr = env
    obj = {"pd": pd, "cq": cq, "qp": qp, "mr": mr}[kind]
    q = p.machine.spawn("other")
    other = open_ctx(q)
    assert _destroy(other, kind, obj.handle) == errno.ENOENT
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    assert ufile.idr[obj.handle].object is not None
    q.exit(0)


@pytest.mark.parametrize("kind, other_kind", [("pd", "cq"), ("cq", "qp"), ("qp", "mr"),
                                              ("mr", "pd")])
def test_destroying_a_handle_of_another_type_is_einval(env, kind, other_kind):
    """One IDR per file numbers every type (PD 0, CQ 1, QP 2, MR 3 here): naming
    another type's handle is the type check's EINVAL, and the object survives."""
    p, ctx, pd, cq, qp, mr = env
    objs = {"pd": pd, "cq": cq, "qp": qp, "mr": mr}
    assert sorted(o.handle for o in objs.values()) == [0, 1, 2, 3]
    assert _destroy(ctx, kind, objs[other_kind].handle) == errno.EINVAL
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    assert ufile.idr[objs[other_kind].handle].object is not None


def test_lookup_of_a_handle_of_another_type_is_einval(env):
    """One IDR per file holds every type: the PD's number named as a CQ is EINVAL,
    a number no object has is ENOENT."""
    p, ctx, pd, cq, qp, mr = env
    from drivers.ib_core.uverbs_std_types import UVERBS_OBJECT_CQ
    from kernel_model.errno import KernelError
    ufile = p.task.files.fdt[ctx.cmd_fd].private_data
    assert ufile.idr[pd.handle].type.name == "PD"
    for handle, err in ((pd.handle, errno.EINVAL), (GHOST, errno.ENOENT)):
        with pytest.raises(KernelError) as e:
            rdma_lookup_get_uobject(UVERBS_OBJECT_CQ, ufile, handle, 0)
        assert e.value.errno == err


def test_write_commands_answer_a_bad_read_handle_with_einval(env):
    """uobj_get_obj_read() is NULL for any miss and the handlers say EINVAL: REG_MR's
    PD, CREATE_QP's PD / send CQ / receive CQ, MODIFY_QP's and QUERY_QP's QP - a
    handle never issued and a handle of another type alike."""
    p, ctx, pd, cq, qp, mr = env
    addr = user_pages(p)
    for bad in (GHOST, cq.handle if cq.handle != pd.handle else mr.handle):
        assert errno_of(c.ibv_cmd_reg_mr, ctx, bad, addr, 4096, addr,
                        v.IBV_ACCESS_LOCAL_WRITE) == errno.EINVAL
    for field in ("pd_handle", "send_cq_handle", "recv_cq_handle"):
        req = qp_cmd(pd, cq)
        setattr(req, field, GHOST)
        assert errno_of(create_qp_raw, ctx, req, qp_ucmd(p)) == errno.EINVAL, field
    assert modify_raw(ctx, c.uv.ib_uverbs_modify_qp(qp_handle=GHOST,
                                                    attr_mask=v.IBV_QP_STATE,
                                                    qp_state=v.IBV_QPS_INIT)) == errno.EINVAL
    assert errno_of(c.execute_write, ctx, c.uv.IB_USER_VERBS_CMD_QUERY_QP,
                    c.uv.ib_uverbs_query_qp(qp_handle=GHOST, attr_mask=0),
                    c.uv.ib_uverbs_query_qp_resp) == errno.EINVAL


def test_ioctl_pd_attribute_passes_enoent_on(env):
    """REG_DMABUF_MR's PD is an ioctl IDR attribute: its lookup's errno goes back as is
    (uverbs_process_attr), ENOENT for a handle the file does not hold."""
    p, ctx, pd, cq, qp, mr = env
    ghost = v.ibv_pd(ctx, GHOST)
    with pytest.raises(c.VerbsError) as e:
        v.ibv_reg_dmabuf_mr(ghost, 0, 4096, 0, 1000, v.IBV_ACCESS_LOCAL_WRITE)
    assert e.value.errno == errno.ENOENT
