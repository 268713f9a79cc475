"""Mirrors drivers/infiniband/core/rdma_core.c: uobjects, handles and their teardown.

Every verbs object a process creates through uverbs is wrapped in an
`ib_uobject` and numbered in its file's IDR: the number is the handle
userspace passes back (pd_handle, cq_handle ...).  Handles are per open
file, so one process cannot name another's objects - a lookup of a handle
this file never issued is ENOENT (a handle of another type: EINVAL).  The
write handlers that only read an object (the PD of CREATE_QP, the QP of
MODIFY_QP) see a failed lookup as NULL and answer EINVAL themselves
(uobj_get_obj_read); the destroys and the ioctl attributes pass the
lookup's errno on.

Lifecycle of a new object (what the write handlers do):
    uobj = rdma_alloc_begin_uobject(type, ufile)   # handle reserved, usecnt -1
    ... create the HW object, uobj.object = obj ...
    uobj_finalize_uobj_create(uobj, attrs)        # the write path commits it
    (failure before that: the write path aborts - destroy_hw(RDMA_REMOVE_ABORT))

Teardown on close, process exit or device removal (uverbs_destroy_ufile_hw):
objects sit on `ufile.uobjects` newest first (list_add at the head), and the
walk destroys them in that order.  An object still in use - a PD with MRs,
a CQ with QPs - refuses (EBUSY) while `cleanup_retryable` is set and is
retried on the next pass; when a pass destroys nothing, a last pass forces
the rest.  Then the ucontext goes (ops.dealloc_ucontext).

Lock order: ufile.hw_destroy_rwsem (read for create/destroy of one object,
write for the file-wide teardown) -> ucontext_lock; uobj.usecnt is the
per-object lookup lock (-1 exclusive, >0 shared), never waited on: a busy
object is EBUSY.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from drivers.ib_core.ib_core_uverbs import uverbs_user_mmap_disassociate
from drivers.ib_core.ib_verbs import (
    RDMA_REMOVE_ABORT,
    RDMA_REMOVE_CLOSE,
    RDMA_REMOVE_DESTROY,
    RDMA_REMOVE_DRIVER_REMOVE,
    ib_udata,
)
from kernel_model.errno import EBUSY, EINVAL, EIO, ENOENT, KernelError
from kernel_model.rwsem import down_read, down_write, init_rwsem, up_read, up_write
from kernel_model.trace import traced

UVERBS_LOOKUP_READ, UVERBS_LOOKUP_WRITE, UVERBS_LOOKUP_DESTROY = 0, 1, 2


@attrs.define(eq=False)
class uverbs_obj_type:
    """Mirrors struct uverbs_obj_idr_type: a handle type and how to destroy one."""

    name: str
    destroy_hw: Callable[[Any, int, Any], None]


class ib_uobject:
    """Mirrors struct ib_uobject: the handle-side wrapper of one verbs object."""

    def __init__(self, type_: uverbs_obj_type, ufile: Any, context: Any):
        self.type = type_
        self.ufile = ufile
        self.context = context
        self.object: Any = None
        self.id = -1
        self.user_handle = 0
        self.usecnt = -1  # exclusive until committed (alloc_uobj)

    def __repr__(self) -> str:
        return f"uobject {self.type.name} handle={self.id} usecnt={self.usecnt}"


@attrs.define(eq=False)
class uverbs_attr_bundle:
    """Mirrors struct uverbs_attr_bundle: one command's file, core and driver udata."""

    ufile: Any
    ucore: ib_udata = attrs.Factory(ib_udata)
    driver_udata: ib_udata = attrs.Factory(ib_udata)
    uobject: ib_uobject | None = None
    context: Any = None
    ioctl: Any = None  # the ioctl path's attributes (uverbs_ioctl.ioctl_attrs)


def ufile_init_uobjects(ufile: Any) -> None:
    """setup_ufile_idr_uobject() and the list/locks ib_uverbs_open() initialises."""
    ufile.idr = {}
    ufile.uobjects = []  # index 0 is the list head: newest first
    ufile.hw_destroy_rwsem = init_rwsem("ib_uverbs_file.hw_destroy_rwsem")


def _idr_alloc(ufile: Any, uobj: ib_uobject) -> int:
    """xa_alloc(xa_limit_32b): the lowest free handle."""
    i = 0
    while i in ufile.idr:
        i += 1
    ufile.idr[i] = None  # reserved: lookups fail until commit
    return i


def ib_uverbs_get_ucontext_file(ufile: Any) -> Any:
    """Mirrors ib_uverbs_get_ucontext_file(): EINVAL before GET_CONTEXT, EIO once
    the device is gone (disassociated)."""
    if ufile.ucontext is None:
        if ufile.disassociated:
            raise KernelError(EIO, "ib_uverbs_get_ucontext_file: device removed")
        raise KernelError(EINVAL, "ib_uverbs_get_ucontext_file: no ucontext "
                          "(GET_CONTEXT first)")
    return ufile.ucontext


@traced
def rdma_alloc_begin_uobject(type_: uverbs_obj_type, attrs_: uverbs_attr_bundle) -> ib_uobject:
    """Mirrors rdma_alloc_begin_uobject(): reserve a handle; hw_destroy_rwsem held
    for read until commit or abort."""
    ufile = attrs_.ufile
    down_read(ufile.hw_destroy_rwsem)
    try:
        ucontext = ib_uverbs_get_ucontext_file(ufile)
    except KernelError:
        up_read(ufile.hw_destroy_rwsem)
        raise
    uobj = ib_uobject(type_, ufile, ucontext)
    uobj.id = _idr_alloc(ufile, uobj)
    attrs_.context = ucontext
    return uobj


def uobj_finalize_uobj_create(uobj: ib_uobject, attrs_: uverbs_attr_bundle) -> None:
    """Mirrors uobj_finalize_uobj_create(): the write path commits it when the
    handler succeeds (rdma_alloc_commit_uobject) and aborts it otherwise."""
    attrs_.uobject = uobj


@traced
def rdma_alloc_commit_uobject(uobj: ib_uobject, attrs_: uverbs_attr_bundle) -> None:
    """Mirrors rdma_alloc_commit_uobject(): the handle becomes visible."""
    ufile = uobj.ufile
    ufile.idr[uobj.id] = uobj
    ufile.uobjects.insert(0, uobj)  # list_add(): at the head
    uobj.usecnt = 0
    up_read(ufile.hw_destroy_rwsem)


@traced
def rdma_alloc_abort_uobject(uobj: ib_uobject, attrs_: uverbs_attr_bundle) -> None:
    """Mirrors rdma_alloc_abort_uobject(): undo the HW object if there is one
    (destroy_hw with RDMA_REMOVE_ABORT), release the handle."""
    ufile = uobj.ufile
    try:
        if uobj.object is not None:
            uobj.type.destroy_hw(uobj, RDMA_REMOVE_ABORT, attrs_)
    finally:
        ufile.idr.pop(uobj.id, None)
        up_read(ufile.hw_destroy_rwsem)


@traced
def rdma_lookup_get_uobject(type_: uverbs_obj_type, ufile: Any, id_: int, mode: int,
                            attrs_: uverbs_attr_bundle | None = None) -> ib_uobject:
    """Mirrors rdma_lookup_get_uobject(): the uobject behind a handle, locked
    shared (READ) or exclusive (WRITE/DESTROY).

    A handle this file does not hold (never issued, destroyed, still being
    created): ENOENT, as lookup_get_idr_uobject()'s xa_load miss.  A handle of
    another type: EINVAL.  Locked the other way: EBUSY.  No ucontext check: a
    file without one has an empty table, so every lookup misses (ENOENT).
    """
    uobj = ufile.idr.get(id_)
    if uobj is None:
        raise KernelError(ENOENT, f"rdma_lookup_get_uobject: no handle {id_} in this file")
    if uobj.type is not type_:
        raise KernelError(EINVAL, f"rdma_lookup_get_uobject: handle {id_} is a "
                          f"{uobj.type.name}, not a {type_.name}")
    if mode == UVERBS_LOOKUP_READ:
        if uobj.usecnt < 0:
            raise KernelError(EBUSY, f"rdma_lookup_get_uobject: {uobj} locked exclusively")
        uobj.usecnt += 1
    else:
        if uobj.usecnt != 0:
            raise KernelError(EBUSY, f"rdma_lookup_get_uobject: {uobj} in use")
        uobj.usecnt = -1
    if attrs_ is not None:
        attrs_.context = uobj.context
    return uobj


def rdma_lookup_put_uobject(uobj: ib_uobject, mode: int) -> None:
    """Mirrors rdma_lookup_put_uobject(): drop the lookup lock."""
    if mode == UVERBS_LOOKUP_READ:
        uobj.usecnt -= 1
    else:
        uobj.usecnt = 0


def uverbs_destroy_uobject(uobj: ib_uobject, why: int, attrs_: uverbs_attr_bundle) -> None:
    """Mirrors uverbs_destroy_uobject(): destroy_hw, then drop the handle.

    A destroy_hw failure (EBUSY for an object in use) leaves everything as it was.
    """
    ufile = uobj.ufile
    if uobj.object is not None:
        uobj.type.destroy_hw(uobj, why, attrs_)
        uobj.object = None
    ufile.idr.pop(uobj.id, None)
    if uobj in ufile.uobjects:
        ufile.uobjects.remove(uobj)


@traced
def uobj_perform_destroy(type_: uverbs_obj_type, id_: int,
                         attrs_: uverbs_attr_bundle) -> ib_uobject:
    """Mirrors uobj_perform_destroy() (uobj_get_destroy): look up for destroy, destroy,
    or unlock on error; returns the destroyed uobject (its fields still readable, as
    until uobj_put_destroy)."""
    ufile = attrs_.ufile
    uobj = rdma_lookup_get_uobject(type_, ufile, id_, UVERBS_LOOKUP_DESTROY, attrs_)
    down_read(ufile.hw_destroy_rwsem)
    try:
        uverbs_destroy_uobject(uobj, RDMA_REMOVE_DESTROY, attrs_)
    except KernelError:
        rdma_lookup_put_uobject(uobj, UVERBS_LOOKUP_DESTROY)
        raise
    finally:
        up_read(ufile.hw_destroy_rwsem)
    return uobj


def swap_idr_uobjects(obj_old: ib_uobject, obj_new: ib_uobject) -> None:
    """Mirrors swap_idr_uobjects(): obj_new (allocated, not committed) takes obj_old's
    handle; obj_old stays in the table under obj_new's reserved one, so it can be
    destroyed as usual.  obj_new must still be committed."""
    ufile = obj_old.ufile
    ufile.idr[obj_old.id] = None            # xa_cmpxchg(old -> XA_ZERO_ENTRY): reserved
    obj_old.id, obj_new.id = obj_new.id, obj_old.id
    ufile.idr[obj_old.id] = obj_old


@traced
def rdma_assign_uobject(to_uobj: ib_uobject, new_uobj: ib_uobject,
                        attrs_: uverbs_attr_bundle) -> None:
    """Mirrors rdma_assign_uobject(): new_uobj replaces to_uobj behind its handle, then
    to_uobj (and its hardware object) is destroyed.  If that destroy fails the old
    uobject stays valid under its new handle until the file is closed."""
    swap_idr_uobjects(to_uobj, new_uobj)
    try:
        uverbs_destroy_uobject(to_uobj, RDMA_REMOVE_DESTROY, attrs_)
    except KernelError:
        pass            # "we leak it until context close"


def _cleanup_pass(ufile: Any, reason: int) -> bool:
    """Mirrors __uverbs_cleanup_ufile(): one walk, newest first; True if any went."""
    attrs_ = uverbs_attr_bundle(ufile)
    progress = False
    for uobj in list(ufile.uobjects):
        attrs_.context = uobj.context
        try:
            uverbs_destroy_uobject(uobj, reason, attrs_)
            progress = True
        except KernelError:
            uobj.usecnt = 0  # still there: retried on the next pass
    return progress


@traced
def uverbs_destroy_ufile_hw(ufile: Any, reason: int) -> None:
    """Mirrors uverbs_destroy_ufile_hw(): destroy every object, then the ucontext.

    Runs on close (RDMA_REMOVE_CLOSE) and on device removal
    (RDMA_REMOVE_DRIVER_REMOVE, which also zaps the user's mmaps).
    """
    down_write(ufile.hw_destroy_rwsem)
    try:
        ucontext = ufile.ucontext
        if ucontext is None:
            return
        ucontext.cleanup_retryable = True
        while ufile.uobjects:
            if not _cleanup_pass(ufile, reason):
                break  # no object went this pass: the driver refuses; force below
        ucontext.cleanup_retryable = False
        if ufile.uobjects:
            _cleanup_pass(ufile, reason)
        if ufile.uobjects:
            ufile.device.machine.report_bug("uverbs_destroy_ufile_hw",
                                            f"objects left after cleanup: {ufile.uobjects}")
        ufile_destroy_ucontext(ufile, reason)
    finally:
        up_write(ufile.hw_destroy_rwsem)


def ufile_destroy_ucontext(ufile: Any, reason: int) -> None:
    """Mirrors ufile_destroy_ucontext(): on device removal zap the mmaps first
    (uverbs_user_mmap_disassociate), then ops.dealloc_ucontext."""
    ucontext = ufile.ucontext
    if reason == RDMA_REMOVE_DRIVER_REMOVE:
        uverbs_user_mmap_disassociate(ufile)
    ucontext.device.ops.dealloc_ucontext(ucontext)
    ufile.ucontext = None


__all__ = ["RDMA_REMOVE_CLOSE", "RDMA_REMOVE_DESTROY", "RDMA_REMOVE_DRIVER_REMOVE"]
