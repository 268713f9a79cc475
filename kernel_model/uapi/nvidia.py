"""The user/kernel interface of the emulated NVIDIA driver (/dev/nvidiaN ioctls).

# EMU: the real driver's interface is RM's: NV_ESC_RM_ALLOC / NV_ESC_RM_CONTROL
# escapes on /dev/nvidiactl carrying class numbers and control parameters,
# plus UVM on /dev/nvidia-uvm, all private to the closed CUDA library.  This
# model keeps the shape (one device file, ioctl escapes with fixed structs,
# an mmap that reserves the allocation's unified virtual address) with a
# handful of escapes that do what the CUDA calls need.
"""

import struct

from kernel_model.uapi.ioctl import _IOW, _IOWR

NV_IOCTL_MAGIC = "F"
NV_DEVICE_PATH = "/dev/nvidia{minor}"

# struct nv_alloc_memory { u64 size; u64 handle (out: the mmap offset) }
NV_ALLOC_FMT = "<QQ"
NV_ESC_ALLOC_MEMORY = _IOWR(NV_IOCTL_MAGIC, 0x40, struct.calcsize(NV_ALLOC_FMT))
# struct nv_free_memory { u64 va }
NV_FREE_FMT = "<Q"
NV_ESC_FREE_MEMORY = _IOW(NV_IOCTL_MAGIC, 0x41, struct.calcsize(NV_FREE_FMT))
# struct nv_memcpy { u64 dst; u64 src; u64 count; u32 kind; u32 pad }
NV_MEMCPY_FMT = "<QQQII"
NV_ESC_MEMCPY = _IOW(NV_IOCTL_MAGIC, 0x42, struct.calcsize(NV_MEMCPY_FMT))
# struct nv_pointer_attr { u64 va; u32 attribute; u32 value (set); u64 out[2] }
NV_ATTR_FMT = "<QII2Q"
NV_ESC_GET_POINTER_ATTR = _IOWR(NV_IOCTL_MAGIC, 0x43, struct.calcsize(NV_ATTR_FMT))
NV_ESC_SET_POINTER_ATTR = _IOW(NV_IOCTL_MAGIC, 0x44, struct.calcsize(NV_ATTR_FMT))
# struct nv_export_dmabuf { u64 va; u64 size; s64 fd (out) }
NV_EXPORT_DMABUF_FMT = "<QQq"

# cudaMemcpyKind
cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost = 1, 2
# CUpointer_attribute (cuda.h)
CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
CU_POINTER_ATTRIBUTE_P2P_TOKENS = 5
CU_POINTER_ATTRIBUTE_SYNC_MEMOPS = 6
CU_POINTER_ATTRIBUTE_BUFFER_ID = 7
CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
# CUmemorytype
CU_MEMORYTYPE_HOST, CU_MEMORYTYPE_DEVICE = 1, 2

NV_ESC_EXPORT_DMABUF = _IOWR(NV_IOCTL_MAGIC, 0x45, struct.calcsize(NV_EXPORT_DMABUF_FMT))
