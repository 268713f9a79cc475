"""The user/kernel interface of the emulated DRM render node, after include/uapi/drm/drm.h
and include/uapi/drm/amdgpu_drm.h: what a program needs to allocate a GPU buffer
object, map it for the CPU and export it as a dma-buf (rdma-core's pyverbs
dmabuf_alloc.c does exactly that).

Structs are in `struct` module notation, x86-64 layout (pointers and size_t are 8
bytes).  The AMDGPU unions are given as their largest member: the "in" half is
what the caller writes, the kernel overwrites the same bytes with "out".
"""

import struct

from kernel_model.uapi.ioctl import _IOC_READ, _IOC_WRITE, _IOW, _IOWR

DRM_DIR_NAME = "/dev/dri"
DRM_RENDER_MINOR_BASE = 128          # /dev/dri/renderD128 is the first GPU's render node
DRM_IOCTL_BASE = "d"
DRM_COMMAND_BASE = 0x40              # driver ioctls: DRM_COMMAND_BASE .. DRM_COMMAND_END
DRM_COMMAND_END = 0xA0


def render_node_path(minor_index: int) -> str:
    """/dev/dri/renderD<128 + index>."""
    return f"{DRM_DIR_NAME}/renderD{DRM_RENDER_MINOR_BASE + minor_index}"


def DRM_IOCTL_NR(cmd: int) -> int:
    """_IOC_NR(): the command's number."""
    return cmd & 0xFF


def _IOC_SIZE(cmd: int) -> int:
    return (cmd >> 16) & 0x3FFF


def _IOC_DIR(cmd: int) -> int:
    return (cmd >> 30) & 3


IOC_IN, IOC_OUT = _IOC_WRITE, _IOC_READ     # the directions as _IOC_DIR gives them

# struct drm_version { int version_major, version_minor, version_patchlevel;
#   size_t name_len; char *name; size_t date_len; char *date; size_t desc_len; char *desc }
DRM_VERSION_FMT = "<iii4xQQQQQQ"
DRM_IOCTL_VERSION = _IOWR(DRM_IOCTL_BASE, 0x00, struct.calcsize(DRM_VERSION_FMT))
# struct drm_gem_close { u32 handle; u32 pad }
DRM_GEM_CLOSE_FMT = "<II"
DRM_IOCTL_GEM_CLOSE = _IOW(DRM_IOCTL_BASE, 0x09, struct.calcsize(DRM_GEM_CLOSE_FMT))
# struct drm_gem_flink { u32 handle; u32 name } - a primary-node (DRM_AUTH) ioctl
DRM_GEM_FLINK_FMT = "<II"
DRM_IOCTL_GEM_FLINK = _IOWR(DRM_IOCTL_BASE, 0x0A, struct.calcsize(DRM_GEM_FLINK_FMT))
# struct drm_prime_handle { u32 handle; u32 flags; s32 fd }
DRM_PRIME_HANDLE_FMT = "<IIi"
DRM_IOCTL_PRIME_HANDLE_TO_FD = _IOWR(DRM_IOCTL_BASE, 0x2D,
                                     struct.calcsize(DRM_PRIME_HANDLE_FMT))
DRM_CLOEXEC = 0o2000000              # O_CLOEXEC
DRM_RDWR = 0o2                       # O_RDWR

# amdgpu_drm.h
DRM_AMDGPU_GEM_CREATE, DRM_AMDGPU_GEM_MMAP = 0x00, 0x01
# union drm_amdgpu_gem_create { in: u64 bo_size, alignment, domains, domain_flags;
#   out: u32 handle, _pad }
AMDGPU_GEM_CREATE_FMT = "<QQQQ"
DRM_IOCTL_AMDGPU_GEM_CREATE = _IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_CREATE,
                                    struct.calcsize(AMDGPU_GEM_CREATE_FMT))
# union drm_amdgpu_gem_mmap { in: u32 handle, _pad; out: u64 addr_ptr }
AMDGPU_GEM_MMAP_FMT = "<Q"
DRM_IOCTL_AMDGPU_GEM_MMAP = _IOWR(DRM_IOCTL_BASE, DRM_COMMAND_BASE + DRM_AMDGPU_GEM_MMAP,
                                  struct.calcsize(AMDGPU_GEM_MMAP_FMT))

AMDGPU_GEM_DOMAIN_CPU = 0x1
AMDGPU_GEM_DOMAIN_GTT = 0x2
AMDGPU_GEM_DOMAIN_VRAM = 0x4
AMDGPU_GEM_DOMAIN_GDS = 0x8
AMDGPU_GEM_DOMAIN_GWS = 0x10
AMDGPU_GEM_DOMAIN_OA = 0x20
AMDGPU_GEM_DOMAIN_DOORBELL = 0x40
AMDGPU_GEM_DOMAIN_MASK = 0x7F

AMDGPU_GEM_CREATE_CPU_ACCESS_REQUIRED = 1 << 0
AMDGPU_GEM_CREATE_NO_CPU_ACCESS = 1 << 1
AMDGPU_GEM_CREATE_CPU_GTT_USWC = 1 << 2
AMDGPU_GEM_CREATE_VRAM_CLEARED = 1 << 3
AMDGPU_GEM_CREATE_VM_ALWAYS_VALID = 1 << 6
AMDGPU_GEM_CREATE_EXPLICIT_SYNC = 1 << 7
AMDGPU_GEM_CREATE_ENCRYPTED = 1 << 10
AMDGPU_GEM_CREATE_DISCARDABLE = 1 << 12
AMDGPU_GEM_CREATE_GFX12_DCC = 1 << 16
