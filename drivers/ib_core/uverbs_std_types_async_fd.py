"""Mirrors drivers/infiniband/core/uverbs_std_types_async_fd.c and the async half of
uverbs_main.c: the async event file.

GET_CONTEXT hands the process a second file besides uverbsN: the anonymous
"[infinibandevent]" file its async events are read from; UVERBS_METHOD_ASYNC_EVENT_ALLOC
(ioctl) makes another (a context imported from another process has no GET_CONTEXT
of its own).  The first one becomes the uverbs file's default_async_file, which
every CQ, QP and SRQ created through write() reports to (ib_uverbs_get_async_event).

An object's driver raises an ib_event (an SRQ's limit reached, ...): the
object's event_handler (ib_uverbs_srq_event_handler, ..._qp_..., ..._cq_...)
-> uverbs_uobj_event -> ib_uverbs_async_handler queues one
ib_uverbs_async_event_desc {element = the uobject's user_handle, event_type} on
the file and wakes a reader; the event sits on the uobject's event_list and,
once read, counts in its events_reported, which the DESTROY command returns so
the library can wait for its acknowledgements.  read() is the completion
channel's ib_uverbs_event_read (uverbs_comp_event.py) on this file's queue.
Destroying the object drops its events still queued (ib_uverbs_release_uevent);
closing the file frees what is queued.  On device removal the file gets
IB_EVENT_DEVICE_FATAL (element 0), the end of its event stream.

# EMU: the file is no fd uobject of the uverbs file (UVERBS_OBJECT_ASYNC_EVENT):
# the uverbs file and the objects reporting to it keep a plain reference to
# their file, and the file's queue lives until the file is released.  Port
# events (ib_register_event_handler) are not raised by the emulated devices.

Lock order: ev_queue.lock alone (taken from the async interrupt).
"""

from __future__ import annotations

from typing import Any

from drivers.ib_core.ib_verbs import IB_EVENT_DEVICE_FATAL, ib_event
from drivers.ib_core.rdma_core import RDMA_REMOVE_DRIVER_REMOVE, ib_uverbs_get_ucontext_file
from drivers.ib_core.uverbs_comp_event import (
    ib_uverbs_event,
    ib_uverbs_event_queue,
    ib_uverbs_event_read,
    ib_uverbs_free_event_queue,
    ib_uverbs_queue_event,
)
from drivers.ib_core.uverbs_ioctl import uverbs_api_ioctl_method
from kernel_model.current import current
from kernel_model.errno import KernelError
from kernel_model.fs import O_RDWR, cdev, file, file_operations, inode
from kernel_model.trace import traced
from kernel_model.uaccess import put_user_u64
from kernel_model.uapi import ib_user_ioctl_cmds as ioc
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.rdma_user_ioctl import ib_uverbs_attr


class ib_uverbs_async_event_file:
    """Mirrors struct ib_uverbs_async_event_file: the event queue of one async fd."""

    def __init__(self, ufile: Any):
        self.ufile = ufile
        self.ev_queue = ib_uverbs_event_queue()
        self.filp: file | None = None

    def __repr__(self) -> str:
        return f"async_event_file queued={len(self.ev_queue.event_list)}"


@traced
def ib_uverbs_async_event_read(filp: file, buf: int, count: int) -> int:
    """Mirrors ib_uverbs_async_event_read(): ib_uverbs_event_read of one
    ib_uverbs_async_event_desc (EAGAIN non-blocking with none queued, EINVAL for a
    shorter buffer, EIO once the queue is closed and empty)."""
    async_file: ib_uverbs_async_event_file = filp.private_data
    return ib_uverbs_event_read(async_file.ev_queue, filp, buf, count,
                                uv.ib_uverbs_async_event_desc.SIZE)


@traced
def uverbs_async_event_release(ino: inode, filp: file) -> None:
    """Mirrors uverbs_async_event_release(): the queue is freed (closed, what is
    queued dropped) when the file goes; the objects that report to it find it
    closed from then on."""
    async_file: ib_uverbs_async_event_file = filp.private_data
    ib_uverbs_free_event_queue(async_file.ev_queue)


ASYNC_EVENT_FOPS = file_operations(read=ib_uverbs_async_event_read,
                                   release=uverbs_async_event_release)


@traced
def ib_uverbs_alloc_async_event_file(ufile: Any) -> int:
    """Mirrors uverbs_alloc_async_event_file() + the fd GET_CONTEXT returns: an
    anonymous "[infinibandevent]" file installed in the caller's fd table
    (ib_uverbs_init_async_event_file: the first one is the default)."""
    t = current()
    fd = t.files.alloc_fd()
    async_file = ib_uverbs_async_event_file(ufile)
    f = file(ASYNC_EVENT_FOPS, "anon_inode:[infinibandevent]", inode(cdev(ASYNC_EVENT_FOPS)),
             O_RDWR, 3, async_file)
    async_file.filp = f
    t.files.fd_install(fd, f)
    if getattr(ufile, "default_async_file", None) is None:
        ufile.default_async_file = async_file
    return fd


def ib_uverbs_get_async_event(attrs_: Any) -> ib_uverbs_async_event_file | None:
    """Mirrors ib_uverbs_get_async_event() for the write() commands: the uverbs file's
    default async event file (the uobject holds on to it)."""
    return getattr(attrs_.ufile, "default_async_file", None)


@traced
def ib_uverbs_async_handler(async_file: ib_uverbs_async_event_file | None, element: int,
                            event: int, obj_list: list | None,
                            counter: tuple[Any, str] | None) -> None:
    """Mirrors ib_uverbs_async_handler(): queue {element, event_type} on the file and
    wake a reader; nothing without a file or on a closed one."""
    if async_file is None:
        return
    ib_uverbs_queue_event(async_file.ev_queue, ib_uverbs_event(
        uv.ib_uverbs_async_event_desc(element=element, event_type=event),
        counter, obj_list))


def uverbs_uobj_event(uobj: Any, event: ib_event) -> None:
    """Mirrors uverbs_uobj_event(): the event under the uobject's user_handle,
    counted in its events_reported once read (nothing for an object made without
    an async event file)."""
    if getattr(uobj, "event_file", None) is None:
        return
    ib_uverbs_async_handler(uobj.event_file, uobj.user_handle, event.event,
                            uobj.event_list, (uobj, "events_reported"))


@traced
def ib_uverbs_cq_event_handler(event: ib_event, context_ptr: Any) -> None:
    """Mirrors ib_uverbs_cq_event_handler()."""
    uverbs_uobj_event(event.element.uobject, event)


@traced
def ib_uverbs_qp_event_handler(event: ib_event, context_ptr: Any) -> None:
    """Mirrors ib_uverbs_qp_event_handler(): nothing for a QP with no uobject (an
    XRC target QP's shared QP)."""
    if event.element.uobject is None:
        return
    uverbs_uobj_event(event.element.uobject, event)


@traced
def ib_uverbs_srq_event_handler(event: ib_event, context_ptr: Any) -> None:
    """Mirrors ib_uverbs_srq_event_handler()."""
    uverbs_uobj_event(event.element.uobject, event)


@traced
def uverbs_async_event_destroy_uobj(async_file: ib_uverbs_async_event_file, why: int) -> None:
    """Mirrors uverbs_async_event_destroy_uobj(): on device removal the file gets
    IB_EVENT_DEVICE_FATAL (element 0) - what tells the reader its events ended."""
    if why == RDMA_REMOVE_DRIVER_REMOVE:
        ib_uverbs_async_handler(async_file, 0, IB_EVENT_DEVICE_FATAL, None, None)


@traced
def UVERBS_HANDLER_UVERBS_METHOD_ASYNC_EVENT_ALLOC(attrs_: Any) -> None:
    """Mirrors UVERBS_HANDLER(UVERBS_METHOD_ASYNC_EVENT_ALLOC) with its fd uobject's
    allocation: EINVAL before GET_CONTEXT (EIO once the device is gone); a new
    async event file (the uverbs file's default if it has none yet) whose fd is
    written back into the FD_HANDLE attribute (EFAULT: the fd is closed again)."""
    ufile = attrs_.ufile
    ib_uverbs_get_ucontext_file(ufile)
    had_default = getattr(ufile, "default_async_file", None) is not None
    fd = ib_uverbs_alloc_async_event_file(ufile)
    ia = attrs_.ioctl
    index = ia.by_id[ioc.UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE][0]
    try:
        put_user_u64(fd, ia.user_base + index * ib_uverbs_attr.SIZE
                     + ib_uverbs_attr.offsetof("data"))
    except KernelError:
        if not had_default:
            ufile.default_async_file = None
        current().files.close_fd(fd)
        raise


ASYNC_EVENT_METHODS = {
    (ioc.UVERBS_OBJECT_ASYNC_EVENT, ioc.UVERBS_METHOD_ASYNC_EVENT_ALLOC): uverbs_api_ioctl_method(
        UVERBS_HANDLER_UVERBS_METHOD_ASYNC_EVENT_ALLOC,
        mandatory=(ioc.UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE,)),
}
