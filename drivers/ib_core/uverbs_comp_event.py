"""Mirrors the completion-channel half of drivers/infiniband/core/uverbs_main.c
(+ uverbs_std_types_cq.c's ib_uverbs_comp_handler user): the completion event file.

CREATE_COMP_CHANNEL hands the process an anonymous "[infinibandevent]" file.  A CQ
created with that fd as its comp_channel has ib_uverbs_comp_handler as its
completion handler: each time the CQ's driver reports a completion event (an
armed CQ got a CQE) one ib_uverbs_comp_event_desc - the CQ's user_handle - is
queued on the file and a reader woken.  read() takes one event (blocking unless
O_NONBLOCK), counting it on its CQ (comp_events_reported, which DESTROY_CQ
returns so the library can wait for its acks).  Destroying the CQ drops its
events still queued (ib_uverbs_release_ucq); closing the file marks it closed
and frees what is queued.

The queue, its events and ib_uverbs_event_read() are shared with the async
event file (uverbs_std_types_async_fd.py), as in the kernel: an event is
counted on its object when read (the counter it names) and sits on the
object's list until then, so destroying the object can drop it.

Lock order: ev_queue.lock alone (taken from the completion and async interrupts).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from kernel_model.current import current
from kernel_model.errno import EAGAIN, EBADF, EFAULT, EINTR, EINVAL, EIO, KernelError
from kernel_model.fs import O_NONBLOCK, O_RDWR, cdev, file, file_operations, fput, inode
from kernel_model.locking import (
    init_waitqueue_head,
    spin_lock_init,
    wait_event_timeout,
    wake_up,
)
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced
from kernel_model.uaccess import copy_to_user
from kernel_model.uapi import ib_user_verbs as uv

# EMU: a read() with nothing queued sleeps as the kernel's does, but a task that
# nothing will ever wake (no CQ armed, no traffic) would sleep for good; after this
# many virtual jiffies (60 s) the wait ends as a signal would end it
COMP_EVENT_READ_TIMEOUT = 60_000


class ib_uverbs_event_queue:
    """Mirrors struct ib_uverbs_event_queue: the queued events and their readers."""

    def __init__(self) -> None:
        self.lock = spin_lock_init("&ev_queue->lock")
        self.is_closed = False
        self.event_list: deque[ib_uverbs_event] = deque()  # protected by lock
        self.poll_wait = init_waitqueue_head("ib_uverbs_event_queue.poll_wait")


class ib_uverbs_event:
    """Mirrors struct ib_uverbs_event: one event descriptor (completion or async);
    `counter` (object, field) is the count read() adds it to, `obj_list` the
    object's list of its events still queued (both None for an event of no object)."""

    def __init__(self, desc: Any, counter: tuple[Any, str] | None = None,
                 obj_list: list | None = None):
        self.desc = desc
        self.counter = counter
        self.obj_list = obj_list

    def __repr__(self) -> str:
        return f"ib_uverbs_event {self.desc!r}"


def ib_uverbs_queue_event(ev_queue: ib_uverbs_event_queue, event: ib_uverbs_event) -> bool:
    """The queueing half of ib_uverbs_comp_handler / ib_uverbs_async_handler: under the
    queue's lock, nothing for a closed queue (False); else the event is allocated
    (kmalloc), queued and put on its object's list; a reader is woken."""
    with ev_queue.lock:
        if ev_queue.is_closed:
            return False
        kmalloc_obj(event)
        ev_queue.event_list.append(event)
        if event.obj_list is not None:
            event.obj_list.append(event)
    wake_up(ev_queue.poll_wait)
    return True


def ib_uverbs_free_event_queue(ev_queue: ib_uverbs_event_queue) -> None:
    """Mirrors ib_uverbs_free_event_queue(): the queue is closed (readers woken: a read
    then ends with EIO) and every event still queued freed, off its object's list."""
    with ev_queue.lock:
        ev_queue.is_closed = True
    wake_up(ev_queue.poll_wait)
    with ev_queue.lock:
        for event in ev_queue.event_list:
            if event.obj_list is not None:
                event.obj_list.remove(event)
            kfree(event)
        ev_queue.event_list.clear()


def ib_uverbs_drop_obj_events(ev_queue: ib_uverbs_event_queue, obj_list: list) -> None:
    """ib_uverbs_release_ucq / ib_uverbs_release_uevent's loop: the object's events
    still queued are taken off the queue and freed."""
    with ev_queue.lock:
        for event in obj_list:
            ev_queue.event_list.remove(event)
            kfree(event)
        obj_list.clear()


class ib_uverbs_completion_event_file:
    """Mirrors struct ib_uverbs_completion_event_file: the channel's event queue."""

    def __init__(self, ufile: Any):
        self.ufile = ufile
        self.ev_queue = ib_uverbs_event_queue()
        self.filp: file | None = None

    def __repr__(self) -> str:
        return f"comp_event_file queued={len(self.ev_queue.event_list)}"


@traced
def ib_uverbs_comp_event_read(filp: file, buf: int, count: int) -> int:
    """Mirrors ib_uverbs_comp_event_read(): ib_uverbs_event_read of one
    ib_uverbs_comp_event_desc."""
    ev_file: ib_uverbs_completion_event_file = filp.private_data
    return ib_uverbs_event_read(ev_file.ev_queue, filp, buf, count,
                                uv.ib_uverbs_comp_event_desc.SIZE)


@traced
def ib_uverbs_event_read(q: ib_uverbs_event_queue, filp: file, buf: int, count: int,
                         eventsz: int) -> int:
    """Mirrors ib_uverbs_event_read(): one event descriptor of eventsz bytes; EAGAIN
    when none is queued and the file is O_NONBLOCK, else sleep until one is (EIO
    when the queue was closed and is empty, EINVAL for a buffer shorter than one
    descriptor - the event stays queued - EFAULT for one that cannot be written).
    The event read is counted on its object and freed."""
    while True:
        with q.lock:
            if q.event_list:
                break
            if q.is_closed:
                raise KernelError(EIO, "ib_uverbs_event_read: device disassociated")
        if filp.f_flags & O_NONBLOCK:
            raise KernelError(EAGAIN, "ib_uverbs_event_read: no event queued")
        if not wait_event_timeout(q.poll_wait, lambda: bool(q.event_list) or q.is_closed,
                                  COMP_EVENT_READ_TIMEOUT):
            # EMU: see COMP_EVENT_READ_TIMEOUT (-ERESTARTSYS seen as EINTR)
            raise KernelError(EINTR, "ib_uverbs_event_read: interrupted waiting for an event")
    with q.lock:
        event = q.event_list[0]
        if eventsz > count:
            raise KernelError(EINVAL, f"ib_uverbs_event_read: {count} bytes < {eventsz}")
        q.event_list.popleft()
        if event.counter is not None:
            obj, field = event.counter
            setattr(obj, field, getattr(obj, field) + 1)
            event.obj_list.remove(event)
    failed = copy_to_user(buf, event.desc.pack(), eventsz)
    kfree(event)
    if failed:
        raise KernelError(EFAULT, "ib_uverbs_event_read: copy_to_user")
    return eventsz


@traced
def ib_uverbs_comp_event_close(ino: inode, filp: file) -> None:
    """Mirrors ib_uverbs_comp_event_close(): the channel's uobject goes
    (uverbs_completion_event_file_destroy_uobj) if the uverbs file did not take it."""
    ev_file: ib_uverbs_completion_event_file = filp.private_data
    uverbs_completion_event_file_destroy_uobj(ev_file)
    files = ev_file.ufile.__dict__.get("comp_event_files")
    if files is not None and ev_file in files:
        files.remove(ev_file)


def uverbs_completion_event_file_destroy_uobj(ev_file: ib_uverbs_completion_event_file
                                              ) -> None:
    """Mirrors uverbs_completion_event_file_destroy_uobj(): ib_uverbs_free_event_queue
    (closed, every event still queued freed, readers woken: a read then ends with EIO)."""
    ib_uverbs_free_event_queue(ev_file.ev_queue)


COMP_EVENT_FOPS = file_operations(read=ib_uverbs_comp_event_read,
                                  release=ib_uverbs_comp_event_close)


@traced
def ib_uverbs_alloc_comp_event_file(ufile: Any) -> int:
    """Mirrors alloc_begin_fd_uobject() for UVERBS_OBJECT_COMP_CHANNEL: an anonymous
    "[infinibandevent]" file in the caller's fd table; returns the fd."""
    t = current()
    fd = t.files.alloc_fd()
    ev_file = ib_uverbs_completion_event_file(ufile)
    f = file(COMP_EVENT_FOPS, "anon_inode:[infinibandevent]", inode(cdev(COMP_EVENT_FOPS)),
             O_RDWR, 3, ev_file)
    ev_file.filp = f
    t.files.fd_install(fd, f)
    ufile.__dict__.setdefault("comp_event_files", []).append(ev_file)
    return fd


@traced
def ib_uverbs_close_comp_event_files(ufile: Any) -> None:
    """The uverbs file's cleanup (close, device removal) destroys its completion
    channels' uobjects too: each channel still open is closed for readers."""
    for ev_file in list(ufile.__dict__.get("comp_event_files", ())):
        uverbs_completion_event_file_destroy_uobj(ev_file)


def ib_uverbs_lookup_comp_file(fd: int, ufile: Any) -> ib_uverbs_completion_event_file:
    """Mirrors ib_uverbs_lookup_comp_file(): the channel behind fd, with a reference
    held for the CQ (EBADF: not an open completion channel of this uverbs file)."""
    try:
        f = current().files.fget(fd)
    except KernelError:
        raise KernelError(EBADF, f"ib_uverbs_lookup_comp_file: fd {fd}") from None
    if f.f_op is not COMP_EVENT_FOPS or f.private_data.ufile is not ufile:
        fput(f)
        raise KernelError(EBADF, f"ib_uverbs_lookup_comp_file: fd {fd} is no channel of "
                          "this file")
    return f.private_data


def ib_uverbs_init_ucq(uobj: Any, ev_file: ib_uverbs_completion_event_file | None,
                       event_file: Any = None) -> None:
    """create_cq()'s ib_ucq_object fields: completion events reported and queued, the
    channel; and its uevent (the async event file, async events reported/queued)."""
    uobj.comp_events_reported = 0
    uobj.comp_list = []
    uobj.ev_file = ev_file
    ib_uverbs_init_uevent(uobj, event_file)


@traced
def ib_uverbs_comp_handler(cq: Any, cq_context: Any) -> None:
    """Mirrors ib_uverbs_comp_handler(): queue the CQ's user_handle on its channel
    and wake a reader (nothing for a CQ without one, or a closed channel)."""
    ev_queue: ib_uverbs_event_queue | None = cq_context
    if ev_queue is None:
        return
    uobj = cq.uobject
    ib_uverbs_queue_event(ev_queue, ib_uverbs_event(
        uv.ib_uverbs_comp_event_desc(cq_handle=uobj.user_handle),
        (uobj, "comp_events_reported"), uobj.comp_list))


@traced
def ib_uverbs_release_ucq(uobj: Any) -> None:
    """Mirrors ib_uverbs_release_ucq(): drop the CQ's events still queued on its
    channel, and the channel reference the CQ held."""
    ev_file = getattr(uobj, "ev_file", None)
    if ev_file is not None:
        ib_uverbs_drop_obj_events(ev_file.ev_queue, uobj.comp_list)
        uobj.ev_file = None
        fput(ev_file.filp)
    ib_uverbs_release_uevent(uobj)


def ib_uverbs_init_uevent(uobj: Any, event_file: Any) -> None:
    """The ib_uevent_object fields of a CQ, QP, SRQ or WQ uobject: its async event
    file (the file's default one; the uobject holds it), the async events read()
    reported for it and its events still queued."""
    uobj.event_file = event_file
    uobj.events_reported = 0
    uobj.event_list = []


@traced
def ib_uverbs_release_uevent(uobj: Any) -> None:
    """Mirrors ib_uverbs_release_uevent(): drop the object's async events still
    queued on its async event file."""
    async_file = getattr(uobj, "event_file", None)
    if async_file is None:
        return
    ib_uverbs_drop_obj_events(async_file.ev_queue, uobj.event_list)
    uobj.event_file = None
