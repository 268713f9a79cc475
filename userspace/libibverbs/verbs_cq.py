"""Mirrors the completion-queue verbs of rdma-core's libibverbs beyond create/poll/destroy:
verbs.c (ibv_create_comp_channel, ibv_destroy_comp_channel, ibv_resize_cq,
__lib_ibv_create_cq_ex, verbs_init_cq), device.c (ibv_get_cq_event,
ibv_ack_cq_events) and verbs.h's inline extended-CQ API (ibv_req_notify_cq,
ibv_start_poll, ibv_next_poll, ibv_end_poll, ibv_wc_read_*).

A completion channel is a file descriptor of the kernel's completion event
file; a CQ created on it is armed with ibv_req_notify_cq (the provider rings
the CQ's arm doorbell) and its next completion queues one event there, which
ibv_get_cq_event reads (blocking) and ibv_ack_cq_events acknowledges.  The
event names the CQ by the user_handle the CQ was created with - in C its
address; here a number `verbs_init_cq` registers.

Errors follow the C conventions: functions returning int return 0 or the errno
(ibv_req_notify_cq, ibv_resize_cq, ibv_destroy_comp_channel, the poll calls);
functions returning a pointer raise VerbsError (NULL with errno set).
"""

from __future__ import annotations

import errno
import itertools
import struct
import weakref
from collections.abc import Iterator
from typing import Any

from kernel_model.trace import traced
from kernel_model.uapi import ib_user_verbs as uv
from userspace.libibverbs import cmd as c
from userspace.libibverbs.cmd import VerbsError
from userspace.libibverbs.verbs_types import (
    IBV_CQ_INIT_ATTR_MASK_RESERVED,
    IBV_CREATE_CQ_SUP_WC_FLAGS,
    ibv_comp_channel,
    ibv_context,
    ibv_cq,
    ibv_cq_ex,
    ibv_cq_init_attr_ex,
    ibv_poll_cq_attr,
)

# user_handle -> CQ, per process: what the kernel's events name.  EMU: C passes the
# CQ's address; here each process numbers its CQs from 0x1000, so a run's trace is the
# same every time (a counter shared by all processes and runs was not)
_handles: weakref.WeakKeyDictionary[Any, tuple[Iterator[int], weakref.WeakValueDictionary]] = \
    weakref.WeakKeyDictionary()


def _handle_table(proc: Any) -> tuple[Iterator[int], weakref.WeakValueDictionary]:
    if proc not in _handles:
        _handles[proc] = (itertools.count(0x1000), weakref.WeakValueDictionary())
    return _handles[proc]


def verbs_init_cq(cq: ibv_cq, context: ibv_context, channel: ibv_comp_channel | None,
                  cq_context: Any) -> None:
    """Mirrors verbs_init_cq(): the CQ's channel (whose refcnt counts it) and context."""
    cq.context, cq.channel, cq.cq_context = context, channel, cq_context
    cq.comp_events_completed = cq.async_events_completed = 0
    if channel is not None:
        channel.refcnt += 1


def verbs_cq_handle(cq: ibv_cq) -> int:
    """The user_handle to create a CQ with, registered for ibv_get_cq_event."""
    numbers, by_handle = _handle_table(cq.context.proc)
    uh = next(numbers)
    by_handle[uh] = cq
    return uh


# -- completion channels ------------------------------------------------------------------
@traced
def ibv_create_comp_channel(context: ibv_context) -> ibv_comp_channel:
    """Mirrors ibv_create_comp_channel(): CREATE_COMP_CHANNEL; the new event file's fd."""
    return ibv_comp_channel(context, c.ibv_cmd_create_comp_channel(context))


@traced
def ibv_destroy_comp_channel(channel: ibv_comp_channel) -> int:
    """Mirrors ibv_destroy_comp_channel(): EBUSY while CQs use it, else close(fd)."""
    if channel.refcnt:
        return errno.EBUSY
    channel.context.proc.close(channel.fd)
    return 0


@traced
def ibv_get_cq_event(channel: ibv_comp_channel) -> tuple[ibv_cq, Any]:
    """Mirrors ibv_get_cq_event(): read() one event (blocking unless the fd is
    O_NONBLOCK), the CQ it names and its cq_context; the provider's cq_event hook
    runs (libmlx5: arm_sn + 1).  A failed or short read raises with its errno."""
    proc = channel.context.proc
    size = uv.ib_uverbs_comp_event_desc.SIZE
    buf = channel.context.cmd_buf + c.RESP_OFFSET
    ret = proc.read(channel.fd, buf, size)
    if ret != size:
        raise VerbsError(-ret if ret < 0 else errno.EIO, "ibv_get_cq_event")
    handle = struct.unpack("<Q", proc.load(buf, size))[0]
    cq = _handle_table(proc)[1].get(handle)
    if cq is None:
        raise VerbsError(errno.EINVAL, "ibv_get_cq_event: event for an unknown CQ")
    if cq.context.ops.cq_event is not None:
        cq.context.ops.cq_event(cq)
    return cq, cq.cq_context


@traced
def ibv_ack_cq_events(cq: ibv_cq, nevents: int) -> None:
    """Mirrors ibv_ack_cq_events(): count nevents more events acknowledged."""
    cq.comp_events_completed += nevents


@traced
def ibv_req_notify_cq(cq: ibv_cq, solicited_only: int = 0) -> int:
    """Mirrors ibv_req_notify_cq(): the provider arms the CQ; 0 or the errno."""
    try:
        return cq.context.ops.req_notify_cq(cq, solicited_only)
    except OSError as e:
        return e.errno


@traced
def ibv_resize_cq(cq: ibv_cq, cqe: int) -> int:
    """Mirrors ibv_resize_cq(): the provider's resize_cq (EOPNOTSUPP without one)."""
    if cq.context.ops.resize_cq is None:
        return errno.EOPNOTSUPP
    try:
        cq.context.ops.resize_cq(cq, cqe)
    except OSError as e:
        return e.errno
    return 0


def ibv_destroy_cq_wait(cq: ibv_cq, resp: uv.ib_uverbs_destroy_cq_resp) -> None:
    """ibv_cmd_destroy_cq()'s wait: until every event the kernel reported for the CQ
    has been acknowledged (comp_events_completed).

    # EMU: the wait is for another thread's ibv_ack_cq_events; a process of one
    # thread would wait forever, so an unacknowledged event is EDEADLK instead.
    """
    if cq.comp_events_completed != resp.comp_events_reported or \
            cq.async_events_completed != resp.async_events_reported:
        raise VerbsError(errno.EDEADLK, "ibv_destroy_cq: waiting for unacknowledged events")


# -- the extended CQ ------------------------------------------------------------------------
@traced
def ibv_create_cq_ex(context: ibv_context, attr: ibv_cq_init_attr_ex) -> ibv_cq_ex:
    """Mirrors ibv_create_cq_ex() + __lib_ibv_create_cq_ex(): EINVAL for a reserved
    comp_mask bit, EOPNOTSUPP for wc_flags libibverbs does not know or a provider
    without create_cq_ex; then verbs_init_cq with the channel and cq_context."""
    if attr.comp_mask & ~(IBV_CQ_INIT_ATTR_MASK_RESERVED - 1):
        raise VerbsError(errno.EINVAL, "ibv_create_cq_ex: comp_mask")
    if context.ops.create_cq_ex is None:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_create_cq_ex")
    if attr.wc_flags & ~IBV_CREATE_CQ_SUP_WC_FLAGS:
        raise VerbsError(errno.EOPNOTSUPP, "ibv_create_cq_ex: wc_flags")
    cq = context.ops.create_cq_ex(context, attr)
    verbs_init_cq(cq, context, attr.channel, attr.cq_context)
    return cq


def ibv_start_poll(cq: ibv_cq_ex, attr: ibv_poll_cq_attr) -> int:
    """Mirrors ibv_start_poll(): 0 with the first completion current, ENOENT when the
    CQ is empty (then no ibv_end_poll), or another errno."""
    return cq.start_poll(cq, attr)


def ibv_next_poll(cq: ibv_cq_ex) -> int:
    """Mirrors ibv_next_poll(): 0 with the next completion current, or ENOENT."""
    return cq.next_poll(cq)


def ibv_end_poll(cq: ibv_cq_ex) -> None:
    """Mirrors ibv_end_poll(): the completions taken are released to the device."""
    cq.end_poll(cq)


def ibv_wc_read(cq: ibv_cq_ex, what: str) -> Any:
    """ibv_wc_read_<what>(): the provider's reader of the current completion.
    # EMU: calling a reader the CQ was not created with is undefined in C (a NULL
    # function pointer); here it is EOPNOTSUPP."""
    fn = getattr(cq, "read_" + what)
    if fn is None:
        raise VerbsError(errno.EOPNOTSUPP, f"ibv_wc_read_{what}")
    return fn(cq)
