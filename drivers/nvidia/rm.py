"""The resource manager's side of GPU memory and third-party P2P (nvidia.ko's RM).

Mirrors, in behaviour, src/nvidia/src/kernel/gpu/bus/p2p.c and
third_party_p2p.c of open-gpu-kernel-modules: video memory allocations and
the BAR1 mappings RM makes for third parties.  The nv-p2p API
(nv_p2p.py) and the device file (nv.py) sit on top of it.

    NvDevice   one GPU (nv_state_t + OBJGPU): the vidmem page allocator, the
               BAR1 windows in use, the clients
    NvClient   one open /dev/nvidiaN (an RM client with one VA space: what a
               CUDA context is); its P2P tokens
    NvMemory   one allocation (cudaMalloc): its GPU pages, unified virtual
               address, buffer ID and the third-party mappings of it

BAR1 space: a third-party mapping needs a BAR1 window per 64 KiB GPU page.
A page already mapped for another third-party mapping is reused (a window
refcount), as _reuseThirdPartyP2PMappingExtent does; a new window is taken
only if `bar1_size - mapped >= CLI_THIRD_PARTY_P2P_BAR1_RESERVE + length`,
else NV_ERR_INSUFFICIENT_RESOURCES (-ENOMEM from nvidia_p2p_get_pages).

Freeing memory that a third party has mapped (cudaFree, or the process's
GPU file closing) runs every mapping's free callback first - on the
driver's own thread (the `nv_queue` workqueue), the freeing thread waiting
for it - and only then unmaps the BAR1 windows and frees the pages
(CliDelThirdPartyP2PVidmemInfo: callback, then nv_p2p_free_platform_data).

Lock order: NvDevice.rm_lock (the RM API lock) is held for allocation
state changes only; it is dropped before the free callbacks run, so a
callback may take any lock the third party holds across
nvidia_p2p_get_pages/put_pages (see nv_p2p.py for how put_pages waits for
an in-flight callback instead).

# EMU: RM calls the free callbacks synchronously in the freeing task, with its
# own locks held (GPUDirect RDMA guide, "Unpin Callback"); the model runs them
# on nv_queue - the GPU driver's own task, so a trace shows them on their own
# track - with the freeing task waiting and rm_lock not held.  BAR1 windows are
# reused per GPU page (a use count each); RM reuses whole mapping extents, so
# partially overlapping pins keep different windows mapped after one is put.

# EMU: RM's object model (handles, classes, memory descriptors, GMMU page
# tables) is reduced to these three objects; allocations are placed in
# whole 64 KiB pages, lowest free pages first; tokens come from a PRNG
# seeded by the machine, so runs repeat.
"""

from __future__ import annotations

import random
from array import array
from typing import TYPE_CHECKING, Any

from c_ext import U64Array
from kernel_model.errno import EINVAL, ENOMEM, KernelError
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.hw.page_stack import PageStack
from kernel_model.locking import mutex_init, mutex_lock, mutex_unlock
from kernel_model.sched import touch
from kernel_model.trace import traced
from kernel_model.workqueue import INIT_WORK, flush_work, queue_work

if TYPE_CHECKING:
    from kernel_model.hw.nvgpu import NvGpu
    from kernel_model.mm import mm_struct
    from kernel_model.workqueue import workqueue_struct

CLI_THIRD_PARTY_P2P_BAR1_RESERVE = 36 << 20   # g_third_party_p2p_nvoc.h


_ALL_WINDOWS: dict[int, array] = {}


def _all_windows(n: int) -> array:
    """The free-window stack of a BAR1 of n windows, every one free (0 on top): made
    once per size and copied, as a machine is made per schedule when exploring."""
    stack = _ALL_WINDOWS.get(n)
    if stack is None:
        stack = _ALL_WINDOWS[n] = array("Q", range(n - 1, -1, -1))
    return stack


class NvDevice:
    """One GPU as the driver sees it.  See the module docstring."""

    def __init__(self, gpu: NvGpu, minor: int, release: tuple[int, int], nv_queue: Any):
        self.gpu = gpu
        self.pdev = gpu.pdev
        self.minor = minor
        self.release = release                # (branch, build): the driver's version
        self.latency_per_call_us = 0          # the p2p_latency_us module parameter
        self.p2p_latency_us = 0               # modelled RM latency so far (see __init__.py)
        self.nv_queue: workqueue_struct = nv_queue
        self.rm_lock = mutex_init("rm_lock")
        # protected by rm_lock:
        self.free_pages = PageStack(gpu.nr_pages)   # lowest on top
        # BAR1 bookkeeping, as arrays the C loop (c_ext bar1_map/bar1_unmap) walks:
        # per GPU page its window + 1 and how many mappings use it; the free windows
        # as a stack (popped in ascending order) with its top in a one-slot array
        self.win_of_page = U64Array(gpu.nr_pages, lazy=True)
        self.page_refs = U64Array(gpu.nr_pages, lazy=True)
        self.free_stack = U64Array(gpu.bar1_windows, zero=False)
        self.free_stack.view[:] = _all_windows(gpu.bar1_windows)
        self.free_top = U64Array(1)
        self.free_top.view[0] = gpu.bar1_windows
        self.ops = gpu.machine.ops
        self.clients: list[NvClient] = []
        self.p2p_infos: dict[int, Any] = {}   # id(page table) -> nv_p2p_mem_info (RM's list)
        self.next_buffer_id = 1
        self.next_handle = 1
        self.rng = random.Random(gpu.machine.serial * 1000 + minor)

    def __repr__(self) -> str:
        return (f"nvidia{self.minor} {self.gpu.name} free {len(self.free_pages)} pages, "
                f"BAR1 {self.bar1_mapped_bytes() >> 20} MiB mapped")

    def bar1_mapped_bytes(self) -> int:
        return (self.gpu.bar1_windows - self.free_top.view[0]) << GPU_PAGE_SHIFT

    @property
    def bar1_refs(self) -> dict[int, list[int]]:
        """{GPU page: [window, mappings using it]} (a copy, for tools and tests)."""
        refs = self.page_refs.view
        return {p: [w - 1, refs[p]] for p, w in enumerate(self.win_of_page.view.tolist()) if w}

    @property
    def bar1_free(self) -> list[int]:
        """The free windows, the next to be taken last (a copy)."""
        return self.free_stack.view[:self.free_top.view[0]].tolist()


class NvClient:
    """One open GPU file: an RM client with one VA space."""

    def __init__(self, dev: NvDevice, mm: mm_struct | None, va_space: int):
        self.dev = dev
        self.mm = mm                   # the opener's address space (token-less pins)
        self.p2p_token = dev.rng.getrandbits(64) | 1
        self.va_space = va_space
        self.memory: dict[int, NvMemory] = {}   # handle -> allocation

    def __repr__(self) -> str:
        return f"NvClient va_space {self.va_space} {len(self.memory)} allocations"

    def lookup(self, va: int, length: int = 1) -> NvMemory | None:
        """The allocation holding [va, va + length), if one holds all of it."""
        for mem in self.memory.values():
            if mem.va and not mem.freed and mem.va <= va and va + length <= mem.va + mem.size:
                return mem
        return None


class NvMemory:
    """A video memory allocation (cudaMalloc)."""

    def __init__(self, client: NvClient, size: int, pages: list[int], buffer_id: int,
                 handle: int):
        self.client = client
        self.size = size               # whole GPU pages
        self.pages = pages             # GPU page numbers, in VA order
        self.buffer_id = buffer_id
        self.handle = handle           # the mmap offset that binds its VA
        self.va = 0                    # the unified virtual address, once mmapped
        self.sync_memops = False
        self.mem_infos: list[Any] = []  # live third-party mappings (nv_p2p_mem_info)
        self.dmabuf_refs = 0           # dma-bufs exported from it (nv_dmabuf.py) still open
        self.freed = False             # cudaFree'd: no new mappings, no new lookups
        self.released = False          # its pages are back in the free list

    def __repr__(self) -> str:
        return (f"NvMemory {self.va:#x}+{self.size:#x} id {self.buffer_id} "
                f"{len(self.mem_infos)} p2p mappings")

    def gpu_addr(self, va: int) -> int:
        """The GPU physical address behind a unified virtual address in the allocation."""
        off = va - self.va
        return (self.pages[off >> GPU_PAGE_SHIFT] << GPU_PAGE_SHIFT) + (off & (GPU_PAGE_SIZE - 1))


# -- allocation --------------------------------------------------------------------------
@traced
def rm_alloc_memory(client: NvClient, size: int) -> NvMemory:
    """Allocate vidmem for a client: whole 64 KiB pages; ENOMEM when the GPU is full."""
    dev = client.dev
    if size <= 0:
        raise KernelError(EINVAL, "rm_alloc_memory: size 0")
    npages = -(-size // GPU_PAGE_SIZE)
    mutex_lock(dev.rm_lock)
    try:
        if npages > len(dev.free_pages):
            raise KernelError(ENOMEM, f"rm_alloc_memory: {npages} pages wanted, "
                              f"{len(dev.free_pages)} free")
        # the driver clears what it hands out (RM scrubs vidmem before reuse)
        pages = dev.free_pages.pop_scrubbed(npages, dev.gpu.vidmem, GPU_PAGE_SHIFT)
        mem = NvMemory(client, npages << GPU_PAGE_SHIFT, pages, dev.next_buffer_id,
                       dev.next_handle)
        mem.page_array = U64Array(npages, zero=False)
        mem.page_array.view[:] = array("Q", pages)
        dev.next_buffer_id += 1
        dev.next_handle += 1
        client.memory[mem.handle] = mem
    finally:
        mutex_unlock(dev.rm_lock)
    return mem


@traced
def rm_free_memory(mem: NvMemory) -> None:
    """Free an allocation: the third-party mappings' free callbacks first, then the
    pages.  Persistent mappings have no callback: they keep the pages until their
    put (the allocation is gone for everything else at once).  EINVAL if freed."""
    dev = mem.client.dev
    mutex_lock(dev.rm_lock)
    if mem.freed:
        mutex_unlock(dev.rm_lock)
        raise KernelError(EINVAL, "rm_free_memory: already freed")
    mem.freed = True
    infos = [i for i in mem.mem_infos if not i.persistent]
    for info in infos:
        mem.mem_infos.remove(info)
        info.state = "teardown"          # unlinked: put_pages from now on waits, then no-op
    mutex_unlock(dev.rm_lock)
    for info in infos:
        rm_p2p_run_free_callback(dev, info)
    if not mem.mem_infos and not mem.dmabuf_refs:   # a dma-buf keeps the pages
        rm_release_pages(mem)


def rm_release_pages(mem: NvMemory) -> None:
    """The allocation's pages go back to the GPU (once; after its last mapping)."""
    dev = mem.client.dev
    mutex_lock(dev.rm_lock)
    if not mem.released:
        mem.released = True
        del mem.client.memory[mem.handle]
        dev.free_pages.extend(reversed(mem.pages))
    mutex_unlock(dev.rm_lock)


def rm_free_client(client: NvClient) -> None:
    """The client goes (its file's last close): free everything it still holds (memory
    freed already but kept by a persistent pin goes back at that pin's put)."""
    for mem in list(client.memory.values()):
        if not mem.freed:
            rm_free_memory(mem)
    client.dev.clients.remove(client)


# -- third-party P2P ---------------------------------------------------------------------
def find_memory(dev: NvDevice, va: int, length: int, token: int, va_space: int,
                mm: mm_struct | None) -> NvMemory:
    """The allocation a third party names: by tokens, or - tokens 0 - in the calling
    process's own VA spaces only.  EINVAL when no single allocation holds the range."""
    for client in dev.clients:
        if token or va_space:
            if client.p2p_token != token or client.va_space != va_space:
                continue
        elif client.mm is None or client.mm is not mm:
            continue
        mem = client.lookup(va, length)
        if mem is not None:
            return mem
    who = "those tokens" if token or va_space else "the calling process"
    raise KernelError(EINVAL, f"rm_p2p_get_pages: [{va:#x}, +{length:#x}) is not one "
                      f"allocation of {who}")


@traced
def rm_p2p_get_pages(mem: NvMemory, va: int, length: int) -> U64Array:
    """Map the range's GPU pages into BAR1 windows; each page's window.

    Called with rm_lock held.  Pages already mapped reuse their window (a use
    count per page, as RM reuses an overlapping extent); ENOMEM
    (NV_ERR_INSUFFICIENT_RESOURCES) when the new windows would eat into the
    reserve, with nothing mapped.  The per-page work is c_ext's bar1_map loop.
    """
    dev = mem.client.dev
    gpu = dev.gpu
    first, n = (va - mem.va) >> GPU_PAGE_SHIFT, length >> GPU_PAGE_SHIFT
    room = (gpu.config.bar1_size - dev.bar1_mapped_bytes() - CLI_THIRD_PARTY_P2P_BAR1_RESERVE
            ) >> GPU_PAGE_SHIFT
    windows = U64Array(n, zero=False)
    touch(gpu.bar1)               # the BAR1 page table the c_ext loop writes
    got = dev.ops.bar1_map(mem.page_array, first, n, dev.win_of_page, dev.page_refs,
                           dev.free_stack, dev.free_top, gpu.bar1_pte, max(room, 0), windows)
    if got < 0:
        need = (-got - 1) << GPU_PAGE_SHIFT
        raise KernelError(ENOMEM, f"rm_p2p_get_pages: no space for BAR1 mappings "
                          f"({need >> 10} KiB wanted, {dev.bar1_mapped_bytes() >> 20} MiB of "
                          f"{gpu.config.bar1_size >> 20} MiB mapped)")
    return windows


@traced
def rm_p2p_put_pages(dev: NvDevice, mem: NvMemory, first: int, n: int) -> None:
    """Drop a mapping's use of its BAR1 windows; unmap those nobody uses any more."""
    touch(dev.gpu.bar1)
    dev.ops.bar1_unmap(mem.page_array, first, n, dev.win_of_page, dev.page_refs,
                       dev.free_stack, dev.free_top, dev.gpu.bar1_pte)


def rm_p2p_latency(dev: NvDevice) -> None:
    """One nv-p2p call reached RM: account its modelled latency (not spent)."""
    dev.p2p_latency_us += dev.latency_per_call_us


def rm_p2p_run_free_callback(dev: NvDevice, info: Any) -> None:
    """Run a mapping's free callback on nv_queue and wait; then free its platform data
    through the pointer nv-p2p gave the mapping (nv_p2p_free_platform_data): RM sits
    below the nv-p2p API and calls up only through what it was handed."""
    if info.free_callback is not None:
        work = INIT_WORK(_free_callback_work)
        work.info = info
        queue_work(dev.nv_queue, work)
        flush_work(work)
    info.free_platform_data(info)


@traced
def nv_p2p_mem_info_free_callback(info: Any) -> None:
    """Mirrors nv_p2p_mem_info_free_callback(): the third party's free_callback(data)."""
    info.free_callback(info.data)


def _free_callback_work(work: Any) -> None:
    nv_p2p_mem_info_free_callback(work.info)
