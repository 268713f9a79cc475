"""The amdgpu module (amdgpu.ko with amdkfd): AMD GPUs for compute, reduced to memory.

module_init registers a PCI driver for AMD GPUs (vendor 0x1002) and makes
/dev/kfd, the compute interface every ROCm process opens.  What a HIP
process does through it (kernel_model/uapi/kfd.py):

    open                  the process's kfd_process (one per mm, as
                          kfd_create_process keeps it)
    ALLOC_MEMORY_OF_GPU   a VRAM buffer object at the VA the caller chose, in
                          64 KiB pages; returns its handle and mmap offset
    mmap(mmap_offset)     binds the VA for the CPU: VM_IO | VM_PFNMAP with no
                          PTEs, so gup cannot pin it and ibv_reg_mr needs a
                          peer-memory client (amdp2p)
    FREE_MEMORY_OF_GPU    kfd_ioctl_free_memory_of_gpu: under the process's
                          mutex, run_rdma_free_callback (every third party's
                          free callback, then their pins dropped), then the
                          pages go back
    close                 the process's remaining buffers are freed the same way

The third-party interface (amd_rdma_interface: get_pages, put_pages,
is_gpu_address, get_page_size) is in kfd_rdma.py; each GPU's DRM render node
(GEM buffer objects, their CPU mappings and dma-buf export) in amdgpu_drm.py -
its VRAM comes from the same page pool as KFD's.

Lock order: kfd_process.mutex, then whatever a free callback takes (ib_core's
client lock, mlx5's MR teardown).

# EMU: the kfd_process lives as long as its /dev/kfd file, not its mm; GPU
# page tables and queues are not modelled; the render node has only what
# amdgpu_drm.py lists.
"""

from __future__ import annotations

from typing import Any

from drivers.amdgpu.amdgpu_drm import amdgpu_drm_dev_register, amdgpu_drm_dev_unregister
from drivers.amdgpu.kfd_rdma import run_rdma_free_callback
from kernel_model.current import current
from kernel_model.errno import EINVAL, ENOMEM, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations
from kernel_model.hw.amdgpu import PCI_VENDOR_ID_ATI
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.hw.page_stack import PageStack
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.mm import VM_DONTDUMP, VM_DONTEXPAND, VM_IO, VM_PFNMAP, vm_operations_struct
from kernel_model.pci import PCI_ANY_ID, pci_driver, pci_register_driver, pci_unregister_driver
from kernel_model.trace import traced
from kernel_model.uaccess import ioctl_copy_struct
from kernel_model.uapi import kfd as uapi


class kfd_dev:
    """Mirrors struct kfd_dev (one GPU): its VRAM pages and gpu_id."""

    def __init__(self, gpu: Any, gpu_id: int):
        self.gpu = gpu
        self.gpu_id = gpu_id
        self.free_pages = PageStack(gpu.nr_pages)   # lowest on top

    def __repr__(self) -> str:
        return f"kfd_dev {self.gpu.name} gpu_id {self.gpu_id:#x}"


class kgd_mem:
    """Mirrors struct kgd_mem (a VRAM buffer object) with amd_rdma's cb_data_head."""

    def __init__(self, process: kfd_process, dev: kfd_dev, va: int, size: int,
                 pages: list[int], handle: int):
        self.process, self.dev = process, dev
        self.va, self.size, self.pages, self.handle = va, size, pages, handle
        self.cb_data_head: list[Any] = []      # rdma_cb: third parties' pins
        self.bound = False                     # the CPU mapping (mmap) exists

    def __repr__(self) -> str:
        return f"kgd_mem {self.va:#x}+{self.size:#x} {len(self.cb_data_head)} rdma pins"

    def bus_address(self, va: int) -> int:
        """The BAR0 address behind a VA of the buffer (the window maps its page 1:1)."""
        off = va - self.va
        page = self.pages[off >> GPU_PAGE_SHIFT]
        return self.dev.gpu.bar1_bus_address(page) + (off & (GPU_PAGE_SIZE - 1))


class kfd_process:
    """Mirrors struct kfd_process: one per mm; its buffers, under its mutex."""

    def __init__(self, mm: Any, task: Any):
        self.mm = mm
        self.lead_thread = task
        self.mutex = mutex_init("kfd_process.mutex")
        self.bos: dict[int, kgd_mem] = {}      # handle -> buffer
        self.next_handle = 1
        self.users = 0                         # open /dev/kfd files

    def __repr__(self) -> str:
        return f"kfd_process of {self.lead_thread.comm} {len(self.bos)} buffers"

    def find_bo_from_interval(self, start: int, last: int) -> kgd_mem | None:
        """kfd_process_find_bo_from_interval(): the buffer holding [start, last]."""
        for bo in self.bos.values():
            if bo.va <= start and last < bo.va + bo.size:
                return bo
        return None


class AmdgpuState:
    """The module's globals: its GPUs, its processes, the PCI driver, /dev/kfd."""

    def __init__(self, mod: Any):
        self.mod = mod
        self.devices: list[kfd_dev] = []
        self.processes: list[kfd_process] = []
        self.driver = pci_driver("amdgpu", [(PCI_VENDOR_ID_ATI, PCI_ANY_ID)], self.probe,
                                 self.remove)
        self.cdev = cdev(file_operations(owner=mod, open=kfd_open, release=kfd_release,
                                         unlocked_ioctl=kfd_ioctl, mmap=kfd_mmap),
                         private=self)

    @traced
    def probe(self, pdev: Any, ident: tuple[int, int]) -> None:
        """amdgpu_pci_probe() + kgd2kfd_device_init(): a kfd_dev for the board."""
        gpu = getattr(pdev, "model", None)
        if gpu is None:
            raise KernelError(EINVAL, f"amdgpu_pci_probe: {pdev.name} is not a GPU")
        dev = kfd_dev(gpu, 0x1000 + len(self.devices))
        # drm_dev_register(): the render node, /dev/dri/renderD(128 + n)
        dev.ddev = amdgpu_drm_dev_register(dev, len(self.devices), self.mod)
        pdev.dev.driver_data = dev
        self.devices.append(dev)

    @traced
    def remove(self, pdev: Any) -> None:
        """amdgpu_pci_remove(): every buffer must be gone."""
        dev = pdev.dev.driver_data
        amdgpu_drm_dev_unregister(dev.ddev)
        self.devices.remove(dev)
        if len(dev.free_pages) != dev.gpu.nr_pages:
            current().machine.report_bug("amdgpu_pci_remove", f"{dev!r}: "
                                         f"{dev.gpu.nr_pages - len(dev.free_pages)} "
                                         "VRAM pages not freed")


def _state() -> AmdgpuState:
    return current().machine.modules["amdgpu"].state


# -- /dev/kfd -----------------------------------------------------------------------------------
@traced
def kfd_open(inode: Any, f: Any) -> None:
    """Mirrors kfd_open() -> kfd_create_process(): the caller's kfd_process (one per
    mm: a second open by the same process shares it)."""
    st: AmdgpuState = inode.i_cdev.private
    task = current()
    p = next((q for q in st.processes if q.mm is task.mm), None)
    if p is None:
        p = kfd_process(task.mm, task)
        st.processes.append(p)
    p.users += 1
    f.private_data = p


@traced
def kfd_release(inode: Any, f: Any) -> None:
    """The last file of the process: its buffers are freed (kfd_process_free_outstanding_
    kfd_bos - third parties' free callbacks first), then the process goes."""
    p: kfd_process = f.private_data
    p.users -= 1
    if p.users:
        return
    for bo in list(p.bos.values()):
        mutex_lock(p.mutex)
        try:
            kfd_free_bo(p, bo)
        finally:
            mutex_unlock(p.mutex)
    inode.i_cdev.private.processes.remove(p)
    f.private_data = None


def _vma_close(vma: Any) -> None:
    bo = vma.vm_private_data
    if bo is not None:
        bo.bound = False


def _no_split(vma: Any, addr: int) -> None:
    # EMU: a buffer's CPU mapping is bound whole; a partial munmap is refused rather
    # than leaving half a buffer bound
    raise KernelError(EINVAL, "kfd_mmap: a buffer's mapping cannot be split")


_KFD_VM_OPS = vm_operations_struct(close=_vma_close, may_split=_no_split)


@traced
def kfd_mmap(f: Any, vma: Any) -> None:
    """Bind a buffer's VA for the CPU (# EMU: the real mapping goes through the DRM
    render node).  EINVAL for an unknown handle, or a VMA that is not exactly the
    buffer's range."""
    p: kfd_process = f.private_data
    bo = p.bos.get(vma.vm_pgoff)
    if bo is None or bo.bound or vma.vm_start != bo.va or vma.vm_end - vma.vm_start != bo.size:
        raise KernelError(EINVAL, f"kfd_mmap: offset {vma.vm_pgoff} does not bind a buffer "
                          f"at [{vma.vm_start:#x}, {vma.vm_end:#x})")
    vma.vm_flags |= VM_IO | VM_PFNMAP | VM_DONTEXPAND | VM_DONTDUMP
    vma.vm_ops = _KFD_VM_OPS
    vma.vm_private_data = bo
    bo.bound = True


@traced
def kfd_ioctl(f: Any, cmd: int, arg: int) -> int:
    """Mirrors kfd_ioctl(): copy the args in, run the handler, copy them back (ENOTTY
    for an unknown ioctl, EFAULT for a bad argument)."""
    return ioctl_copy_struct(_IOCTLS, f.private_data, cmd, arg, "kfd_ioctl")


@traced
def kfd_ioctl_alloc_memory_of_gpu(p: kfd_process, args: list[int]) -> list[int]:
    """Mirrors kfd_ioctl_alloc_memory_of_gpu() for VRAM: EINVAL for a size or VA that
    is not whole 64 KiB pages, an unknown gpu_id, other memory kinds, or a VA range
    already taken; ENOMEM when VRAM is full.  The pages are cleared."""
    va, size, _handle, _off, gpu_id, flags = args
    dev = next((d for d in _state().devices if d.gpu_id == gpu_id), None)
    if dev is None or flags != uapi.KFD_IOC_ALLOC_MEM_FLAGS_VRAM:
        raise KernelError(EINVAL, f"kfd_ioctl_alloc_memory_of_gpu: gpu_id {gpu_id:#x} "
                          f"flags {flags:#x}")
    if not size or size % GPU_PAGE_SIZE or va % GPU_PAGE_SIZE:
        raise KernelError(EINVAL, f"kfd_ioctl_alloc_memory_of_gpu: [{va:#x}, +{size:#x}) "
                          "not 64 KiB pages")
    mutex_lock(p.mutex)
    try:
        if any(bo.va < va + size and va < bo.va + bo.size for bo in p.bos.values()):
            raise KernelError(EINVAL, f"kfd_ioctl_alloc_memory_of_gpu: {va:#x} in use")
        n = size >> GPU_PAGE_SHIFT
        if n > len(dev.free_pages):
            raise KernelError(ENOMEM, f"kfd_ioctl_alloc_memory_of_gpu: {n} pages wanted, "
                              f"{len(dev.free_pages)} free")
        pages = dev.free_pages.pop_scrubbed(n, dev.gpu.vidmem, GPU_PAGE_SHIFT)
        bo = kgd_mem(p, dev, va, size, pages, p.next_handle)
        p.next_handle += 1
        p.bos[bo.handle] = bo
        for page in pages:                 # the board's aperture reaches it (see the EMU)
            dev.gpu.bar1_map(page, page)
    finally:
        mutex_unlock(p.mutex)
    args[2] = bo.handle
    args[3] = bo.handle << current().machine.page_shift     # the mmap offset
    return args


@traced
def kfd_ioctl_free_memory_of_gpu(p: kfd_process, args: list[int]) -> None:
    """Mirrors kfd_ioctl_free_memory_of_gpu(): EINVAL for an unknown handle; under the
    process's mutex, third parties first (run_rdma_free_callback), then the pages."""
    mutex_lock(p.mutex)
    try:
        bo = p.bos.get(args[0])
        if bo is None:
            raise KernelError(EINVAL, f"kfd_ioctl_free_memory_of_gpu: handle {args[0]}")
        kfd_free_bo(p, bo)
    finally:
        mutex_unlock(p.mutex)


def kfd_free_bo(p: kfd_process, bo: kgd_mem) -> None:
    """One buffer goes, p->mutex held: its rdma users are told and unpinned, then its
    windows are unmapped and its pages freed."""
    run_rdma_free_callback(bo)
    del p.bos[bo.handle]
    for page in bo.pages:
        bo.dev.gpu.bar1_unmap(page)
    bo.dev.free_pages.extend(reversed(bo.pages))


_IOCTLS = {
    uapi.AMDKFD_IOC_ALLOC_MEMORY_OF_GPU: (uapi.KFD_ALLOC_FMT, kfd_ioctl_alloc_memory_of_gpu),
    uapi.AMDKFD_IOC_FREE_MEMORY_OF_GPU: (uapi.KFD_FREE_FMT, kfd_ioctl_free_memory_of_gpu),
}


def module_init(mod: Any) -> AmdgpuState:
    """amdgpu_init(): /dev/kfd (kfd_chardev_init), then the PCI driver (probing every
    AMD GPU)."""
    state = AmdgpuState(mod)
    cdev_add(state.cdev, uapi.KFD_DEVICE_PATH)
    pci_register_driver(current().machine, state.driver)
    return state


def module_exit(mod: Any) -> None:
    """amdgpu_exit()."""
    pci_unregister_driver(current().machine, mod.state.driver)
    cdev_del(mod.state.cdev)
