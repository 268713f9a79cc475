"""Mirrors the asynchronous-event verbs of rdma-core's libibverbs (device.c:
ibv_get_async_event, ibv_ack_async_event) and the destroy verbs' wait for them.

The kernel queues an async event - an SRQ's limit reached, a QP gone to error, a
port change - on the context's async event file (ctx.async_fd, made by
GET_CONTEXT).  ibv_get_async_event read()s one ib_uverbs_async_event_desc
(blocking unless the fd is O_NONBLOCK) and turns its element back into the
object: for CQ, QP, SRQ and WQ events the user_handle the object was created
with (in C its address; here the number `verbs_obj_handle` registered), for
the others the port number.  ibv_ack_async_event counts the event on its object;
a destroy verb's response says how many events the kernel reported for the
object, and the library waits until that many are acknowledged.

# EMU: libibverbs waits on the object's condition variable for another thread's
# ibv_ack_async_event and so hangs for good when nobody will acknowledge; here the
# wait (ibv_destroy_wait_events) fails with EDEADLK instead, after the object is
# destroyed and its memory freed (as the CQ's wait in verbs_cq does).
"""

from __future__ import annotations

import errno
from typing import Any

import attrs

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_cq import _handle_table
from userspace.libibverbs.verbs_types import ibv_context

# enum ibv_event_type
(IBV_EVENT_CQ_ERR, IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
 IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG, IBV_EVENT_PATH_MIG_ERR,
 IBV_EVENT_DEVICE_FATAL, IBV_EVENT_PORT_ACTIVE, IBV_EVENT_PORT_ERR, IBV_EVENT_LID_CHANGE,
 IBV_EVENT_PKEY_CHANGE, IBV_EVENT_SM_CHANGE, IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED,
 IBV_EVENT_QP_LAST_WQE_REACHED, IBV_EVENT_CLIENT_REREGISTER, IBV_EVENT_GID_CHANGE,
 IBV_EVENT_WQ_FATAL) = range(20)

#: the events whose element is a CQ, a QP, an SRQ, a WQ (the rest: a port number)
CQ_EVENTS = frozenset({IBV_EVENT_CQ_ERR})
QP_EVENTS = frozenset({IBV_EVENT_QP_FATAL, IBV_EVENT_QP_REQ_ERR, IBV_EVENT_QP_ACCESS_ERR,
                       IBV_EVENT_COMM_EST, IBV_EVENT_SQ_DRAINED, IBV_EVENT_PATH_MIG,
                       IBV_EVENT_PATH_MIG_ERR, IBV_EVENT_QP_LAST_WQE_REACHED})
SRQ_EVENTS = frozenset({IBV_EVENT_SRQ_ERR, IBV_EVENT_SRQ_LIMIT_REACHED})
WQ_EVENTS = frozenset({IBV_EVENT_WQ_FATAL})

#: the field of each kind of object that ibv_ack_async_event counts
_ACK_FIELD = {**dict.fromkeys(CQ_EVENTS, "async_events_completed"),
              **dict.fromkeys(QP_EVENTS, "events_completed"),
              **dict.fromkeys(SRQ_EVENTS, "events_completed"),
              **dict.fromkeys(WQ_EVENTS, "events_completed")}


@attrs.define(eq=False)
class ibv_async_event:
    """Mirrors struct ibv_async_event: the element (a CQ, QP, SRQ or WQ object, or a
    port number) and the event type."""

    element: Any
    event_type: int


def verbs_obj_handle(obj: Any) -> int:
    """The user_handle to create a QP or SRQ (or CQ) with, registered so the async
    events that name it find the object (C passes the object's address)."""
    numbers, by_handle = _handle_table(obj.context.proc)
    uh = next(numbers)
    by_handle[uh] = obj
    return uh


@traced
def ibv_get_async_event(context: ibv_context) -> ibv_async_event:
    """Mirrors ibv_get_async_event(): read() one event from the async fd (a failed or
    short read raises with its errno - EAGAIN on an O_NONBLOCK fd with nothing
    queued); the element as the object its user_handle names, or the port number."""
    proc = context.proc
    size = uv.ib_uverbs_async_event_desc.SIZE
    buf = context.cmd_buf + c.RESP_OFFSET
    ret = proc.read(context.async_fd, buf, size)
    if ret != size:
        raise VerbsError(-ret if ret < 0 else errno.EIO, "ibv_get_async_event")
    ev = uv.ib_uverbs_async_event_desc.unpack(proc.load(buf, size))
    if ev.event_type in _ACK_FIELD:
        element = _handle_table(proc)[1].get(ev.element)
        if element is None:  # EMU: C would hand back the stale pointer
            raise VerbsError(errno.EINVAL, f"ibv_get_async_event: event {ev.event_type} for "
                             f"an unknown object {ev.element:#x}")
    else:
        element = ev.element
    return ibv_async_event(element, ev.event_type)


@traced
def ibv_ack_async_event(event: ibv_async_event) -> None:
    """Mirrors ibv_ack_async_event(): one more event acknowledged on its CQ, QP, SRQ
    or WQ (what the destroy verbs wait for); nothing for a port or device event."""
    field = _ACK_FIELD.get(event.event_type)
    if field is None:
        return
    obj = event.element
    setattr(obj, field, getattr(obj, field) + 1)


def ibv_destroy_wait_events(obj: Any, field: str, reported: int, what: str) -> None:
    """The destroy verbs' wait (ibv_cmd_destroy_srq, _qp, _wq): until `reported` events
    of the object are acknowledged.  EDEADLK instead of waiting (the module's EMU)."""
    if getattr(obj, field) != reported:
        raise VerbsError(errno.EDEADLK, f"{what}: waiting for {reported - getattr(obj, field)} "
                         "unacknowledged async events")
