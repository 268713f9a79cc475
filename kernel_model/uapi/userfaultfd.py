"""Mirrors include/uapi/linux/userfaultfd.h (the parts the unmap monitor uses)."""

from __future__ import annotations

import struct

from kernel_model.uapi.ioctl import _IOR, _IOWR

UFFD_API = 0xAA
UFFDIO = chr(0xAA)
UFFD_USER_MODE_ONLY = 1

# struct uffdio_api { __u64 api; __u64 features; __u64 ioctls; }
UFFDIO_API_FMT = "<QQQ"
# struct uffdio_register { struct uffdio_range { __u64 start, len; } range; __u64 mode;
#                          __u64 ioctls; }
UFFDIO_REGISTER_FMT = "<QQQQ"
# struct uffdio_range { __u64 start; __u64 len; }
UFFDIO_RANGE_FMT = "<QQ"
# struct uffd_msg { __u8 event; __u8 reserved1; __u16 reserved2; __u32 reserved3;
#                   union { ... struct { __u64 start; __u64 end; } remove; } arg; }
UFFD_MSG_FMT = "<BBHIQQQ"
UFFD_MSG_SIZE = struct.calcsize(UFFD_MSG_FMT)          # 32

UFFDIO_API = _IOWR(UFFDIO, 0x3F, struct.calcsize(UFFDIO_API_FMT))
UFFDIO_REGISTER = _IOWR(UFFDIO, 0x00, struct.calcsize(UFFDIO_REGISTER_FMT))
UFFDIO_UNREGISTER = _IOR(UFFDIO, 0x01, struct.calcsize(UFFDIO_RANGE_FMT))

UFFD_FEATURE_EVENT_FORK = 1 << 1
UFFD_FEATURE_EVENT_REMAP = 1 << 2
UFFD_FEATURE_EVENT_REMOVE = 1 << 3
UFFD_FEATURE_EVENT_UNMAP = 1 << 6
UFFD_EVENT_REMAP, UFFD_EVENT_REMOVE, UFFD_EVENT_UNMAP = 0x14, 0x15, 0x16

UFFDIO_REGISTER_MODE_MISSING = 1 << 0
UFFDIO_REGISTER_MODE_WP = 1 << 1
_UFFDIO_REGISTER, _UFFDIO_UNREGISTER, _UFFDIO_API = 0x00, 0x01, 0x3F
UFFD_API_IOCTLS = (1 << _UFFDIO_REGISTER) | (1 << _UFFDIO_UNREGISTER) | (1 << _UFFDIO_API)
