"""The user/kernel interface of the emulated amdkfd (/dev/kfd ioctls), after
include/uapi/linux/kfd_ioctl.h: the two memory ioctls a HIP allocation needs.

# EMU: the real interface has dozens more (queues, events, GPUVM mapping,
# SVM); ROCr reserves the virtual address itself and maps VRAM for the CPU
# through the DRM render node.  Here ALLOC_MEMORY_OF_GPU takes the VA as the
# real one does, and an mmap of /dev/kfd at the returned mmap_offset binds it.
"""

import struct

from kernel_model.uapi.ioctl import _IOW, _IOWR

KFD_DEVICE_PATH = "/dev/kfd"
AMDKFD_IOCTL_BASE = "K"

# struct kfd_ioctl_alloc_memory_of_gpu_args {
#     u64 va_addr; u64 size; u64 handle (out); u64 mmap_offset (in/out);
#     u32 gpu_id; u32 flags }
KFD_ALLOC_FMT = "<QQQQII"
AMDKFD_IOC_ALLOC_MEMORY_OF_GPU = _IOWR(AMDKFD_IOCTL_BASE, 0x16, struct.calcsize(KFD_ALLOC_FMT))
# struct kfd_ioctl_free_memory_of_gpu_args { u64 handle }
KFD_FREE_FMT = "<Q"
AMDKFD_IOC_FREE_MEMORY_OF_GPU = _IOW(AMDKFD_IOCTL_BASE, 0x17, struct.calcsize(KFD_FREE_FMT))

KFD_IOC_ALLOC_MEM_FLAGS_VRAM = 1 << 0
