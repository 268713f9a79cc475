"""Mirrors drivers/infiniband/core/uverbs_ioctl.c: the uverbs ioctl() method calls.

ioctl(fd, RDMA_VERBS_IOCTL, hdr) names (object_id, method_id) and carries an
array of attributes.  ib_uverbs_ioctl() checks the header, finds the method
in the device's method table, copies the attributes in, and runs the
handler with a bundle that reads inputs (uverbs_get_const) and writes
outputs (uverbs_copy_to).  A method that creates an object has an IDR
attribute of access NEW: the core reserves the handle before the handler
and commits it (writing the handle back into the attribute) after; one
that destroys names the handle with access DESTROY and the core destroys it.

    EINVAL        header length != sizeof + num_attrs * 16, a missing
                  mandatory attribute, an unknown handle
    EPROTONOSUPPORT  reserved header fields set, or no such method
    ENOTTY        any other ioctl number (the kernel's -ENOIOCTLCMD)

# EMU: the method table is built per device by uverbs_uapi.uverbs_alloc_api
# (the core's methods and ib_device_ops.uapi_methods, keyed by (object_id,
# method_id)).  Only the attribute kinds the model's methods use (const in,
# ptr out, IDR new and destroy) are handled.

Lock order: ufile.hw_destroy_rwsem (read) around the handler, as in write().
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from drivers.ib_core.rdma_core import (
    rdma_alloc_abort_uobject,
    rdma_alloc_begin_uobject,
    rdma_alloc_commit_uobject,
    uobj_perform_destroy,
    uverbs_attr_bundle,
    uverbs_obj_type,
)
from kernel_model.errno import EFAULT, EINVAL, EIO, ENOSPC, ENOTTY, EPROTONOSUPPORT, KernelError
from kernel_model.fs import file
from kernel_model.trace import traced
from kernel_model.uaccess import copy_from_user, copy_to_user, put_user_u64
from kernel_model.uapi.rdma_user_ioctl import (
    RDMA_VERBS_IOCTL,
    UVERBS_ATTR_F_VALID_OUTPUT,
    ib_uverbs_attr,
    ib_uverbs_ioctl_hdr,
)

UVERBS_MAX_ATTRS = 128


@attrs.frozen
class uverbs_api_ioctl_method:
    """Mirrors struct uverbs_api_ioctl_method: the handler and its IDR attributes."""

    handler: Callable[[uverbs_attr_bundle], None]
    mandatory: tuple[int, ...] = ()
    new_idr: tuple[int, uverbs_obj_type] | None = None       # UVERBS_ACCESS_NEW
    destroy_idr: tuple[int, uverbs_obj_type] | None = None   # UVERBS_ACCESS_DESTROY


class ioctl_attrs:
    """The copied-in attribute array and where each lives in user memory."""

    def __init__(self, user_base: int, raw: list[ib_uverbs_attr]):
        self.user_base = user_base
        self.by_id = {a.attr_id: (i, a) for i, a in enumerate(raw)}


def _attrs(bundle: uverbs_attr_bundle) -> ioctl_attrs:
    return bundle.ioctl


def uverbs_attr_is_valid(bundle: uverbs_attr_bundle, attr_id: int) -> bool:
    """Mirrors uverbs_attr_is_valid()."""
    return attr_id in _attrs(bundle).by_id


def uverbs_get_const(bundle: uverbs_attr_bundle, attr_id: int) -> int:
    """Mirrors uverbs_get_const(): an inline input value; EINVAL if absent."""
    found = _attrs(bundle).by_id.get(attr_id)
    if found is None:
        raise KernelError(EINVAL, f"uverbs_get_const: attribute {attr_id:#x} missing")
    attr = found[1]
    if attr.len > 8:
        raise KernelError(EINVAL, f"uverbs_get_const: attribute {attr_id:#x} not inline")
    return attr.data & ((1 << (8 * attr.len)) - 1)


def uverbs_copy_to(bundle: uverbs_attr_bundle, attr_id: int, value: int, size: int) -> None:
    """Mirrors uverbs_copy_to(): write an output to the attribute's user buffer
    (min of its length and `size` bytes) and mark it valid; an absent optional
    output is skipped, a short buffer is ENOSPC, a bad pointer EFAULT."""
    ia = _attrs(bundle)
    found = ia.by_id.get(attr_id)
    if found is None:
        return
    index, attr = found
    if attr.len < size and attr.len < 8:
        raise KernelError(ENOSPC, f"uverbs_copy_to: attribute {attr_id:#x} of {attr.len} bytes")
    n = min(attr.len, size)
    if copy_to_user(attr.data, value.to_bytes(size, "little")[:n], n):
        raise KernelError(EFAULT, f"uverbs_copy_to: attribute {attr_id:#x}")
    attr.flags |= UVERBS_ATTR_F_VALID_OUTPUT
    flags_at = ia.user_base + index * ib_uverbs_attr.SIZE + ib_uverbs_attr.offsetof("flags")
    if copy_to_user(flags_at, attr.flags.to_bytes(2, "little"), 2):
        raise KernelError(EFAULT, "uverbs_copy_to: attribute flags")


def uverbs_get_flags32(bundle: uverbs_attr_bundle, attr_id: int, allowed_bits: int) -> int:
    """Mirrors uverbs_get_flags32(): an absent flags attribute is 0; a bit outside
    allowed_bits is EINVAL."""
    if not uverbs_attr_is_valid(bundle, attr_id):
        return 0
    flags = uverbs_get_const(bundle, attr_id)
    if flags & ~allowed_bits or flags >> 32:
        raise KernelError(EINVAL, f"uverbs_get_flags32: flags {flags:#x} outside "
                          f"{allowed_bits:#x}")
    return flags


def uverbs_attr_ptr_len(bundle: uverbs_attr_bundle, attr_id: int, min_len: int,
                        max_len: int | None = None) -> int:
    """The length of a PTR attribute, checked as uverbs_process_attr() checks it
    against the method's spec: below min_len, or above its struct's size (max_len,
    None for UVERBS_ATTR_MIN_SIZE), is EINVAL."""
    found = _attrs(bundle).by_id.get(attr_id)
    if found is None:
        raise KernelError(EINVAL, f"uverbs_process_attr: attribute {attr_id:#x} missing")
    length = found[1].len
    if length < min_len or (max_len is not None and length > max_len):
        raise KernelError(EINVAL, f"uverbs_process_attr: attribute {attr_id:#x} of "
                          f"{length} bytes (spec {min_len}..{max_len})")
    return length


def uverbs_attr_ptr_get_array_size(bundle: uverbs_attr_bundle, attr_id: int,
                                   elem_size: int) -> int:
    """Mirrors uverbs_attr_ptr_get_array_size(): how many elem_size elements the
    attribute's buffer holds; EINVAL when its length is not a multiple."""
    length = uverbs_attr_ptr_len(bundle, attr_id, 0)
    if length % elem_size:
        raise KernelError(EINVAL, f"uverbs_attr_ptr_get_array_size: {length} bytes are not "
                          f"a multiple of {elem_size}")
    return length // elem_size


def uverbs_copy_to_buf(bundle: uverbs_attr_bundle, attr_id: int, raw: bytes,
                       zero_tail: bool = False) -> None:
    """Mirrors uverbs_copy_to() for a buffer (min of the attribute's length and the
    data), or with zero_tail uverbs_copy_to_struct_or_zero() (the rest of a longer
    buffer cleared); marks the output valid.  EFAULT for a bad user pointer."""
    ia = _attrs(bundle)
    found = ia.by_id.get(attr_id)
    if found is None:
        return
    index, attr = found
    n = min(attr.len, len(raw))
    if n and copy_to_user(attr.data, raw[:n], n):
        raise KernelError(EFAULT, f"uverbs_copy_to: attribute {attr_id:#x}")
    if zero_tail and attr.len > n and copy_to_user(attr.data + n, bytes(attr.len - n),
                                                   attr.len - n):
        raise KernelError(EFAULT, f"uverbs_copy_to_struct_or_zero: attribute {attr_id:#x}")
    attr.flags |= UVERBS_ATTR_F_VALID_OUTPUT
    flags_at = ia.user_base + index * ib_uverbs_attr.SIZE + ib_uverbs_attr.offsetof("flags")
    if copy_to_user(flags_at, attr.flags.to_bytes(2, "little"), 2):
        raise KernelError(EFAULT, "uverbs_copy_to: attribute flags")


def _read_attrs(hdr: ib_uverbs_ioctl_hdr, user_attrs: int) -> list[ib_uverbs_attr]:
    size = hdr.num_attrs * ib_uverbs_attr.SIZE
    raw = bytearray(size)
    if copy_from_user(raw, user_attrs, size):
        raise KernelError(EFAULT, "ib_uverbs_cmd_verbs: copy_from_user of the attributes")
    return [ib_uverbs_attr.unpack(raw[i:i + ib_uverbs_attr.SIZE])
            for i in range(0, size, ib_uverbs_attr.SIZE)]


@traced
def ib_uverbs_run_method(bundle: uverbs_attr_bundle, method: uverbs_api_ioctl_method) -> None:
    """Mirrors ib_uverbs_run_method(): IDR attributes around the handler."""
    ia = _attrs(bundle)
    for attr_id in method.mandatory:
        if attr_id not in ia.by_id:
            raise KernelError(EINVAL, f"uverbs_process_attr: mandatory attribute "
                              f"{attr_id:#x} missing")
    if method.destroy_idr is not None:
        attr_id, type_ = method.destroy_idr
        uobj_perform_destroy(type_, ia.by_id[attr_id][1].data, bundle)
        return
    if method.new_idr is None:
        method.handler(bundle)
        return
    attr_id, type_ = method.new_idr
    uobj = rdma_alloc_begin_uobject(type_, bundle)
    bundle.uobject = uobj
    try:
        method.handler(bundle)
        index = ia.by_id[attr_id][0]
        put_user_u64(uobj.id, ia.user_base + index * ib_uverbs_attr.SIZE
                     + ib_uverbs_attr.offsetof("data"))
    except BaseException:
        rdma_alloc_abort_uobject(uobj, bundle)
        raise
    rdma_alloc_commit_uobject(uobj, bundle)


@traced
def ib_uverbs_ioctl(filp: file, cmd: int, arg: int) -> int:
    """Mirrors ib_uverbs_ioctl() -> ib_uverbs_cmd_verbs(): one method call."""
    if cmd != RDMA_VERBS_IOCTL:
        raise KernelError(ENOTTY, f"ib_uverbs_ioctl: ioctl {cmd:#x} is not RDMA_VERBS_IOCTL")
    raw = bytearray(ib_uverbs_ioctl_hdr.SIZE)
    if copy_from_user(raw, arg, len(raw)):
        raise KernelError(EFAULT, "ib_uverbs_ioctl: copy_from_user of the header")
    hdr = ib_uverbs_ioctl_hdr.unpack(raw)
    if hdr.num_attrs > UVERBS_MAX_ATTRS or \
            hdr.length != ib_uverbs_ioctl_hdr.SIZE + hdr.num_attrs * ib_uverbs_attr.SIZE:
        raise KernelError(EINVAL, f"ib_uverbs_ioctl: header length {hdr.length} for "
                          f"{hdr.num_attrs} attributes")
    if hdr.reserved1 or hdr.reserved2:
        raise KernelError(EPROTONOSUPPORT, "ib_uverbs_ioctl: reserved header fields set")
    ufile = filp.private_data
    uapi = ufile.device.uapi  # uverbs_uapi.uverbs_api, built at ib_uverbs_add_one
    key = (hdr.object_id, hdr.method_id)
    method = uapi.methods.get(key)
    if method is None:
        raise KernelError(EPROTONOSUPPORT, f"uapi_get_method: object {hdr.object_id:#x} "
                          f"method {hdr.method_id:#x} not supported")
    if key in uapi.disabled:
        raise KernelError(EIO, f"ib_uverbs_run_method: object {hdr.object_id:#x} method "
                          f"{hdr.method_id:#x}: the driver is disassociated")
    user_attrs = arg + ib_uverbs_ioctl_hdr.SIZE
    bundle = uverbs_attr_bundle(ufile)
    bundle.ioctl = ioctl_attrs(user_attrs, _read_attrs(hdr, user_attrs))
    ib_uverbs_run_method(bundle, method)
    return 0
