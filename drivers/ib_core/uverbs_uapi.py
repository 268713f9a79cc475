"""Mirrors drivers/infiniband/core/uverbs_uapi.c: the method table a uverbs device answers.

ib_uverbs_add_one() builds one table per uverbsN (uverbs_alloc_api): the core's
ioctl methods (uverbs_core_api - here the DEVICE object's GID queries, from
uverbs_std_types_device, and the MR object's, from uverbs_std_types_mr)
merged with the driver's own (ib_device_ops.uapi_methods), keyed by (object_id,
method_id).  ib_uverbs_ioctl() looks a call up there, so it never has to know
where a method was defined.  On device removal uverbs_disassociate_api_pre() takes
the handler from every driver method first: a later call of one is EIO, while the
core's methods stay and fail on the device that is gone.

# EMU: the kernel's table is a radix tree built from chained uapi_definition
# arrays, with attribute specs per method; here it is a dict of the methods the
# model has, and a disabled driver method is kept in a set instead of a NULL handler.
"""

from __future__ import annotations

from typing import Any

import attrs

from drivers.ib_core.uverbs_ioctl import uverbs_api_ioctl_method
from drivers.ib_core.uverbs_std_types_async_fd import ASYNC_EVENT_METHODS
from drivers.ib_core.uverbs_std_types_device import DEVICE_METHODS
from drivers.ib_core.uverbs_std_types_dm import DM_METHODS
from drivers.ib_core.uverbs_std_types_mr import CORE_METHODS

MethodKey = tuple[int, int]  # (object_id, method_id)


@attrs.define(eq=False)
class uverbs_api:
    """Mirrors struct uverbs_api: every ioctl method of one uverbs device."""

    methods: dict[MethodKey, uverbs_api_ioctl_method]
    driver_methods: frozenset[MethodKey]
    disabled: set[MethodKey] = attrs.field(factory=set)  # handler NULL after disassociate


def uverbs_alloc_api(ib_dev: Any) -> uverbs_api:
    """Mirrors uverbs_alloc_api(): the core's definitions, then the driver's."""
    driver = dict(ib_dev.ops.uapi_methods or {})
    return uverbs_api({**DEVICE_METHODS, **CORE_METHODS, **DM_METHODS, **ASYNC_EVENT_METHODS,
                       **driver},
                      frozenset(driver))


def uverbs_disassociate_api_pre(uapi: uverbs_api) -> None:
    """Mirrors uverbs_disassociate_api_pre(): every driver method loses its handler,
    so no call reaches the driver once the device is being removed."""
    uapi.disabled.update(uapi.driver_methods)
