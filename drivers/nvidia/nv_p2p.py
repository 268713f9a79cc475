"""Mirrors kernel-open/nvidia/nv-p2p.c and nv-p2p.h: the GPUDirect RDMA kernel API.

A third-party driver (nv_peer_mem, gdrdrv, an NVMe driver) pins GPU memory
for its device's DMA with this API:

    pt  = nvidia_p2p_get_pages(0, 0, va, len, free_callback, data)
    map = nvidia_p2p_dma_map_pages(peer_pdev, pt)     # bus addresses for the peer
    ... the peer DMAs to map.dma_addresses[i] (64 KiB each) ...
    nvidia_p2p_dma_unmap_pages(peer_pdev, pt, map)
    nvidia_p2p_put_pages(0, 0, va, pt)

The rules (nv-p2p.c and nv-p2p.h; BAR1 in RM's gpu/bus/p2p.c):
  * va and len must both be 64 KiB aligned (EINVAL), and lie in one
    allocation of the calling process - or of the VA space the tokens name;
  * a get_pages maps the pages into BAR1; ENOMEM when BAR1 is exhausted;
  * when the owner frees the memory (cudaFree) or its GPU file closes, the
    driver calls free_callback(data) on its own thread and, after it
    returns, frees the page table and any DMA mapping still there: the
    callback must call only nvidia_p2p_free_page_table (and
    nvidia_p2p_free_dma_mapping), never put_pages;
  * put_pages on a mapping whose callback is in flight waits for the
    callback and then does nothing; put_pages after it is a no-op (0);
  * persistent mappings (get_pages_persistent) have no callback.

Errors are KernelError(-errno) raised with the function's name, as the
kernel-side callers test `ret < 0` (nvidia_p2p_map_status's mapping: EINVAL,
ENOMEM, ENOTSUPP as EOPNOTSUPP, EBUSY, EIO).

Driver releases: the module parameter `release` picks the branch.  From
535.14 (and 525.105.17 on R525) get_pages refuses a NULL callback and the
persistent calls exist.  From R515 up to those releases put_pages does not
wait for an in-flight free callback: both free the page table, which is the
null-pointer dereference of the GPUDirect RDMA guide's "Changes in CUDA 12.2"
(here a KASAN report: the teardown touching the mem_info put_pages freed -
UseAfterFree - or freeing it again - DoubleFree).  Before R515: not modelled.

Lock order: rm_lock (rm.py) -> nothing; a mapping's teardown_done
completion is what put_pages waits on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from c_ext import U64Array
from drivers.nvidia.rm import (
    NvDevice,
    find_memory,
    rm_p2p_get_pages,
    rm_p2p_latency,
    rm_p2p_put_pages,
    rm_release_pages,
)
from kernel_model.current import current
from kernel_model.dma import (
    DMA_BIDIRECTIONAL,
    dma_map_resource,
    dma_mapping_error,
    dma_unmap_resource,
)
from kernel_model.errno import EINVAL, EIO, EOPNOTSUPP, KernelError
from kernel_model.hw.nvgpu import GPU_PAGE_SHIFT, GPU_PAGE_SIZE
from kernel_model.locking import (
    complete_all,
    init_completion,
    mutex_lock,
    mutex_unlock,
    wait_for_completion,
)
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.pci import pci_dev

NVIDIA_P2P_PAGE_TABLE_VERSION = 0x00020000      # 580+: with flags
NVIDIA_P2P_PAGE_TABLE_VERSION_575 = 0x00010002  # up to 575
NVIDIA_P2P_DMA_MAPPING_VERSION = 0x00020003
NVIDIA_P2P_PAGE_SIZE_4KB, NVIDIA_P2P_PAGE_SIZE_64KB, NVIDIA_P2P_PAGE_SIZE_128KB = 0, 1, 2
NVIDIA_P2P_FLAGS_DEFAULT, NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING = 0, 1
FIXED_RELEASES = {535: (14, 0), 525: (105, 17)}  # first fixed (build, patch) per branch
FIRST_REGISTER_PATH_FIX = (550, 0, 0)   # see _nulls_scratch_on_register_failure


def NVIDIA_P2P_VERSION_COMPATIBLE(p: Any, v: int) -> bool:
    """Mirrors NVIDIA_P2P_VERSION_COMPATIBLE(): same major, minor at least v's."""
    return (p.version >> 16) == (v >> 16) and (p.version & 0xFFFF) >= (v & 0xFFFF)


class nvidia_p2p_page:
    """Mirrors struct nvidia_p2p_page: one 64 KiB page's BAR1 bus address."""

    __slots__ = ("physical_address",)

    def __init__(self, physical_address: int):
        self.physical_address = physical_address


class _p2p_pages(Sequence):
    """page_table->pages: each page's BAR1 bus address as an nvidia_p2p_page, made when
    read (# EMU: a 1 GiB table holds 16,384 of them; the model keeps the windows)."""

    __slots__ = ("base", "windows")

    def __init__(self, base: int, windows: U64Array):
        self.base, self.windows = base, windows

    def __len__(self) -> int:
        return self.windows.n

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [nvidia_p2p_page(self.base + (w << GPU_PAGE_SHIFT))
                    for w in self.windows.view[i].tolist()]
        if not -self.windows.n <= i < self.windows.n:
            raise IndexError(i)
        return nvidia_p2p_page(self.base + (self.windows.view[i] << GPU_PAGE_SHIFT))


class nvidia_p2p_page_table:
    """Mirrors struct nvidia_p2p_page_table (embedded in the driver's mem_info): version
    0x00020000 with `flags` from 580 on, 0x00010002 without it before."""

    def __init__(self, pages: Sequence[nvidia_p2p_page], gpu_uuid: bytes,
                 release: tuple[int, ...] = (580, 0)):
        self.version = NVIDIA_P2P_PAGE_TABLE_VERSION if release >= (580, 0) else \
            NVIDIA_P2P_PAGE_TABLE_VERSION_575
        self.page_size = NVIDIA_P2P_PAGE_SIZE_64KB
        self.pages = pages
        self.entries = len(pages)
        self.gpu_uuid = gpu_uuid
        if release >= (580, 0):
            self.flags = 0

    def __repr__(self) -> str:
        return f"nvidia_p2p_page_table {self.entries} x 64 KiB"


class nvidia_p2p_dma_mapping:
    """Mirrors struct nvidia_p2p_dma_mapping: the peer's DMA address of each page
    (kept as a U64Array, `dma_addr_array`, that a client can copy in one go)."""

    def __init__(self, dma_addr_array: U64Array, entries: int, pci_dev_: pci_dev):
        self.version = NVIDIA_P2P_DMA_MAPPING_VERSION
        self.page_size_type = NVIDIA_P2P_PAGE_SIZE_64KB
        self.entries = entries
        self.dma_addr_array = dma_addr_array
        self.private = None
        self.pci_dev = pci_dev_
        self.runs: list[tuple[int, int]] = []   # (dma address, bytes) mapped, to unmap

    @property
    def dma_addresses(self) -> list[int]:
        """dma_addresses[i]: page i's address for the peer."""
        return self.dma_addr_array.view[:self.entries].tolist()

    def __repr__(self) -> str:
        return f"nvidia_p2p_dma_mapping {self.entries} x 64 KiB for {self.pci_dev.name}"


class nv_p2p_mem_info:
    """Mirrors nv-p2p.c's nv_p2p_mem_info_t: the page table, its DMA mappings, the callback."""

    def __init__(self, dev: NvDevice, memory: Any, first: int, n: int, free_callback: Any,
                 data: Any, persistent: bool):
        self.dev = dev
        self.memory = memory
        self.first, self.n = first, n      # the allocation's GPU pages it maps
        self.va = memory.va + (first << GPU_PAGE_SHIFT)   # the address it was pinned at
        self.free_callback = free_callback
        self.data = data
        # RM's teardown (rm_p2p_run_free_callback) calls this after free_callback: a
        # function pointer the mapping carries, so rm.py, below this file, never imports it
        self.free_platform_data = nv_p2p_free_platform_data
        self.persistent = persistent
        self.page_table: nvidia_p2p_page_table | None = None
        self.dma_mappings: list[nvidia_p2p_dma_mapping] = []
        # protected by dev.rm_lock: "live" -> "teardown" (owner freeing it) / "put"
        self.state = "live"
        self.teardown_done = init_completion("nv_p2p_teardown")

    def __repr__(self) -> str:
        return f"nv_p2p_mem_info {self.n} pages {self.state}"

    @property
    def gpu_pages(self) -> list[int]:
        return self.memory.pages[self.first:self.first + self.n]


def _devices() -> list[NvDevice]:
    mod = current().machine.modules.get("nvidia")
    return mod.state.devices if mod is not None else []


def _api_fixed(dev: NvDevice) -> bool:
    """The GPUDirect RDMA guide's "Changes in CUDA 12.2": 535.14 on, 525.105.17 on
    R525 (NULL callbacks refused, the persistent calls exported, put_pages waits)."""
    branch, build, patch = (tuple(dev.release) + (0,))[:3]
    if branch == 525:
        return (build, patch) >= FIXED_RELEASES[525]
    return (branch, build, patch) >= (535,) + FIXED_RELEASES[535]


def _legacy(dev: NvDevice) -> bool:
    """A release with the put_pages/free-callback race: R515 up to the fix.  (Earlier
    drivers serialise put_pages with the callback through RM's locks: no race.)"""
    return dev.release[0] >= 515 and not _api_fixed(dev)


def _has_persistent_api(dev: NvDevice) -> bool:
    return _api_fixed(dev)


def NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API() -> bool:
    """Mirrors the NVIDIA_P2P_CAP_GET_PAGES_PERSISTENT_API macro (nv-p2p.h, 535.14+):
    does the loaded driver export the persistent calls?  (A build-time macro in C;
    here a question to the loaded module.)"""
    devs = _devices()
    return bool(devs) and _has_persistent_api(devs[0])


def _lookup(pt: Any) -> tuple[NvDevice, nv_p2p_mem_info] | None:
    """RM's lookup of a page table it handed out (by identity: never dereferences it).

    Returns with the device's rm_lock HELD when it found one: the mem_info
    stays valid only while the lock keeps its teardown out.
    """
    for dev in _devices():
        mutex_lock(dev.rm_lock)
        info = dev.p2p_infos.get(id(pt))
        if info is not None and info.page_table is pt:
            return dev, info
        mutex_unlock(dev.rm_lock)
    return None


# -- get / put -----------------------------------------------------------------------------
class nv_p2p_scratch:
    """The per-page arrays nv_p2p_get_pages allocates for RM to fill (physical_addresses,
    wreqmb_h, rreqmb_h - one object here): freed before the callback is registered."""

    def __init__(self, windows: U64Array):
        self.physical_addresses = windows

    def __repr__(self) -> str:
        return f"nv_p2p_scratch {len(self.physical_addresses)} entries"


def _nulls_scratch_on_register_failure(dev: NvDevice) -> bool:
    """Does this release skip the already-freed arrays when rm_p2p_register_callback
    fails (open-gpu-kernel-modules HEAD: a separate `failed_nofree` label, the fix
    proposed in PR #557)?  # EMU: the first release with it is not on record; PR
    #557 was filed against 535.104.05 (2023-09), and the model takes 550 as fixed."""
    return tuple(dev.release) >= FIRST_REGISTER_PATH_FIX


def nv_p2p_get_pages(persistent: bool, p2p_token: int, va_space: int, virtual_address: int,
                     length: int, free_callback: Any, data: Any,
                     what: str) -> nvidia_p2p_page_table:
    """Mirrors nv_p2p_get_pages(): the common path of both get_pages calls.

    Two separate calls into RM, as in the real driver: rm_p2p_get_pages pins
    and BAR1-maps (RM now tracks the mapping, with no callback yet), then -
    after the scratch arrays are freed - rm_p2p_register_callback attaches
    the free callback.  A free of the same range between the two (another
    CPU's cudaFree) makes the registration fail with OBJECT_NOT_FOUND; the
    error path then hands the mapping back through nv_p2p_put_pages (a no-op:
    the teardown already took it).  Releases before the fix of
    NVIDIA/open-gpu-kernel-modules PR #557 take the common `failed` label
    there and free the scratch arrays a second time - KASAN's double-free.
    """
    if virtual_address % GPU_PAGE_SIZE or length % GPU_PAGE_SIZE:
        raise KernelError(EINVAL, f"{what}: Invalid argument in nv_p2p_get_pages, address "
                          f"or length are not aligned ({virtual_address:#x}, {length:#x})")
    if length == 0:
        raise KernelError(EINVAL, f"{what}: length 0")
    if persistent and (p2p_token or va_space):
        raise KernelError(EINVAL, f"{what}: persistent mappings take no tokens")
    task = current()
    err: KernelError | None = None
    for dev in _devices():
        mutex_lock(dev.rm_lock)
        try:
            mem = find_memory(dev, virtual_address, length, p2p_token, va_space, task.mm)
            rm_p2p_latency(dev)
            scratch = kmalloc_obj(nv_p2p_scratch(rm_p2p_get_pages(mem, virtual_address,
                                                                  length)))
            first = (virtual_address - mem.va) >> GPU_PAGE_SHIFT
            info = kmalloc_obj(nv_p2p_mem_info(dev, mem, first, length >> GPU_PAGE_SHIFT,
                                               None, None, persistent))
            pt = kmalloc_obj(nvidia_p2p_page_table(
                _p2p_pages(dev.gpu.bar1.start, scratch.physical_addresses), dev.gpu.uuid,
                dev.release))
            info.page_table = pt
            mem.mem_infos.append(info)
            dev.p2p_infos[id(pt)] = info
        except KernelError as e:
            err = err if err is not None and e.errno == EINVAL else e
            continue
        finally:
            mutex_unlock(dev.rm_lock)
        kfree(scratch)                   # the pages are built: the arrays go
        if free_callback is not None:
            status = rm_p2p_register_callback(dev, pt, info, free_callback, data)
            if status is not None:
                if not _nulls_scratch_on_register_failure(dev):
                    kfree(scratch)       # `goto failed`: these were freed above
                page_table: nvidia_p2p_page_table | None = pt
                nvidia_p2p_put_pages(p2p_token, va_space, virtual_address, page_table)
                raise KernelError(EINVAL, f"{what}: rm_p2p_register_callback: {status}")
        return pt
    if err is None:
        err = KernelError(EINVAL, f"{what}: no GPU")
    raise KernelError(err.errno, f"{what}: {err}")


@traced
def rm_p2p_register_callback(dev: NvDevice, page_table: nvidia_p2p_page_table,
                             info: nv_p2p_mem_info, free_callback: Any,
                             data: Any) -> str | None:
    """RM attaches the free callback to the mapping rm_p2p_get_pages made; None, or
    "NV_ERR_OBJECT_NOT_FOUND" when the memory was freed in between (the teardown
    took the mapping, and freed it, without a callback to call).  Looked up by
    the page table's identity in RM's tracker, never through the pointer."""
    mutex_lock(dev.rm_lock)
    try:
        if dev.p2p_infos.get(id(page_table)) is not info or info.state != "live":
            return "NV_ERR_OBJECT_NOT_FOUND"
        info.free_callback, info.data = free_callback, data
        return None
    finally:
        mutex_unlock(dev.rm_lock)


@traced
def nvidia_p2p_get_pages(p2p_token: int, va_space: int, virtual_address: int, length: int,
                         free_callback: Any, data: Any) -> nvidia_p2p_page_table:
    """Mirrors nvidia_p2p_get_pages(): pin and BAR1-map; free_callback(data) on revocation.

    EINVAL for a NULL callback (535.14+; before, NULL meant persistent),
    unaligned or empty ranges, or a range not in one allocation the caller
    may pin; ENOMEM when BAR1 is exhausted.
    """
    devs = _devices()
    fixed = not devs or _api_fixed(devs[0])
    if free_callback is None and fixed:
        raise KernelError(EINVAL, "nvidia_p2p_get_pages: NULL free_callback (use "
                          "nvidia_p2p_get_pages_persistent)")
    if free_callback is not None and data is None:   # RmP2PGetPages: INVALID_ARGUMENT
        raise KernelError(EINVAL, "nvidia_p2p_get_pages: NULL data")
    return nv_p2p_get_pages(free_callback is None, p2p_token, va_space, virtual_address,
                            length, free_callback, data, "nvidia_p2p_get_pages")


@traced
def nvidia_p2p_get_pages_persistent(virtual_address: int, length: int,
                                    flags: int = 0) -> nvidia_p2p_page_table:
    """Mirrors nvidia_p2p_get_pages_persistent() (535.14+): a mapping with no callback."""
    devs = _devices()
    if devs and not _has_persistent_api(devs[0]):
        raise KernelError(EOPNOTSUPP, "nvidia_p2p_get_pages_persistent: not in this release")
    pt = nv_p2p_get_pages(True, 0, 0, virtual_address, length, None, None,
                          "nvidia_p2p_get_pages_persistent")
    if flags & NVIDIA_P2P_FLAGS_FORCE_BAR1_MAPPING:   # only this bit is looked at
        pt.force_bar1 = True
    return pt


@traced
def nvidia_p2p_put_pages(p2p_token: int, va_space: int, virtual_address: int,
                         page_table: nvidia_p2p_page_table | None) -> int:
    """Mirrors nvidia_p2p_put_pages(): unpin; 0.

    A page table the owner's teardown already took is a no-op - after
    waiting for its free callback if that is still running (the fix; see
    the module docstring for the legacy releases).
    """
    if page_table is None:
        return 0
    found = _lookup(page_table)          # rm_lock held if found
    if found is None:
        return 0                         # NV_ERR_OBJECT_NOT_FOUND: torn down already
    dev, info = found
    mem = info.memory
    owner = mem.client
    va = info.va
    if virtual_address != va or ((p2p_token or va_space) and
                                 (owner.p2p_token, owner.va_space) != (p2p_token, va_space)):
        # RmP2PPutPages looks the mapping up by (tokens, address): another address or
        # tokens find nothing - NV_ERR_OBJECT_NOT_FOUND, 0 - and the pin stays until the
        # owner frees the memory.  # EMU: without tokens RM also matches the calling
        # process; the model does not (a process's exit path has no mm to compare)
        mutex_unlock(dev.rm_lock)
        return 0
    if info.state == "teardown" and not _legacy(dev):
        done = info.teardown_done
        mutex_unlock(dev.rm_lock)
        wait_for_completion(done)       # the callback finishes, RM frees it: nothing to do
        return 0
    _unlink(dev, info)
    rm_p2p_latency(dev)
    mutex_unlock(dev.rm_lock)
    mem = info.memory
    nv_p2p_free_platform_data(info)
    if mem.freed and not mem.mem_infos and not mem.dmabuf_refs:   # the last hold: pages go
        rm_release_pages(mem)
    return 0


@traced
def nvidia_p2p_put_pages_persistent(virtual_address: int,
                                    page_table: nvidia_p2p_page_table | None,
                                    flags: int = 0) -> int:
    """Mirrors nvidia_p2p_put_pages_persistent(): EINVAL for flags; NULL is a no-op."""
    if flags:
        raise KernelError(EINVAL, f"nvidia_p2p_put_pages_persistent: flags {flags:#x}")
    return nvidia_p2p_put_pages(0, 0, virtual_address, page_table)


def _unlink(dev: NvDevice, info: nv_p2p_mem_info) -> None:
    """Under rm_lock: take the mapping off its allocation (put_pages' atomic unlink)."""
    if info in info.memory.mem_infos:
        info.memory.mem_infos.remove(info)
    info.state = "put"


@traced
def nv_p2p_free_platform_data(info: nv_p2p_mem_info) -> None:
    """Mirrors nv_p2p_free_platform_data(): unmap what DMA mappings remain, release the
    BAR1 windows, free the page table and the mem_info; wake put_pages waiters."""
    dev, done = info.dev, info.teardown_done
    mutex_lock(dev.rm_lock)
    dev.p2p_infos.pop(id(info.page_table), None)   # from here nobody can look it up
    mappings, info.dma_mappings = info.dma_mappings, []
    rm_p2p_put_pages(dev, info.memory, info.first, info.n)
    mutex_unlock(dev.rm_lock)
    for mapping in mappings:
        _dma_unmap(mapping)
    kfree(info.page_table)
    kfree(info)
    complete_all(done)


@traced
def nvidia_p2p_free_page_table(page_table: nvidia_p2p_page_table) -> int:
    """Mirrors nvidia_p2p_free_page_table(): a no-op returning 0 in the open driver (RM
    frees the table after the free callback returns)."""
    return 0


# -- DMA mappings ------------------------------------------------------------------------------
@traced
def nvidia_p2p_dma_map_pages(peer: pci_dev, page_table: nvidia_p2p_page_table
                             ) -> nvidia_p2p_dma_mapping:
    """Mirrors nvidia_p2p_dma_map_pages(): each page's bus address as `peer` must use it
    (dma_map_resource: through the IOMMU when one translates).  EINVAL for NULL or a
    page table the driver no longer has; EIO when a mapping fails (all undone)."""
    if peer is None or page_table is None:
        raise KernelError(EINVAL, "nvidia_p2p_dma_map_pages: NULL peer or page table")
    # container_of(page_table, mem_info): a table the driver already freed is a
    # use-after-free here, as in nv-p2p.c (KASAN reports it)
    if getattr(page_table, "force_bar1", False):
        raise KernelError(EOPNOTSUPP, "nvidia_p2p_dma_map_pages: a FORCE_BAR1 persistent "
                          "mapping is for the CPU only")
    found = _lookup(page_table)          # rm_lock held if found
    if found is None:
        raise KernelError(EINVAL, "nvidia_p2p_dma_map_pages: page table not found")
    dev, info = found
    try:
        return _dma_map(peer, page_table, dev, info)
    finally:
        mutex_unlock(dev.rm_lock)


def map_window_runs(dma_dev: Any, base: int, windows: U64Array, n: int
                    ) -> list[tuple[int, int]] | None:
    """DMA-map n BAR1 windows (numbers from `base`) for a peer device: one
    dma_map_resource per run of consecutive windows (c_ext's coalescing loop), as
    (dma address, bytes); None, with nothing left mapped, if one cannot be mapped."""
    ops = dma_dev.machine.ops
    run_win, run_off, run_len = (U64Array(n, zero=False) for _ in range(3))
    nruns = ops.sg_append(GPU_PAGE_SHIFT, windows, 0, n, 0, n << GPU_PAGE_SHIFT, 1 << 62,
                          run_win, run_off, run_len, 0)
    runs: list[tuple[int, int]] = []
    for i in range(nruns):
        start, size = base + (int(run_win.view[i]) << GPU_PAGE_SHIFT), int(run_len.view[i])
        a = dma_map_resource(dma_dev, start, size, DMA_BIDIRECTIONAL)
        if dma_mapping_error(dma_dev, a):
            unmap_window_runs(dma_dev, runs)
            return None
        runs.append((a, size))
    return runs


def unmap_window_runs(dma_dev: Any, runs: list[tuple[int, int]]) -> None:
    """Undo map_window_runs."""
    for a, size in runs:
        dma_unmap_resource(dma_dev, a, size, DMA_BIDIRECTIONAL)


def _dma_map(peer: pci_dev, page_table: nvidia_p2p_page_table, dev: NvDevice,
             info: nv_p2p_mem_info) -> nvidia_p2p_dma_mapping:
    """nvidia_p2p_dma_map_pages() with rm_lock held: the mappings, added to the mem_info."""
    rm_p2p_latency(dev)
    # EMU: one dma_map_resource per run of consecutive BAR1 windows (the driver maps
    # page by page); the peer gets the same address for every page either way.  The
    # runs come from c_ext's coalescing loop, the per-page addresses from its block loop.
    ops = peer.machine.ops
    pages = page_table.pages
    n = len(pages)
    if isinstance(pages, _p2p_pages):
        windows, base = pages.windows, pages.base
    else:                                 # a table some test built by hand
        base = 0
        windows = U64Array(n, zero=False)
        for i, pg in enumerate(pages):
            windows.view[i] = pg.physical_address >> GPU_PAGE_SHIFT
    runs = map_window_runs(peer.dev, base, windows, n)
    if runs is None:
        raise KernelError(EIO, f"nvidia_p2p_dma_map_pages: {peer.name} cannot reach the "
                          "BAR1 windows")
    nruns = len(runs)
    run_dma, run_len = U64Array(nruns, zero=False), U64Array(nruns, zero=False)
    for i, (a, size) in enumerate(runs):
        run_dma.view[i], run_len.view[i] = a, size
    addrs = U64Array(n, zero=False)
    ops.dma_blocks(run_dma, run_len, nruns, 0, GPU_PAGE_SIZE, n, addrs)
    mapping = kmalloc_obj(nvidia_p2p_dma_mapping(addrs, n, peer))
    mapping.runs = runs
    info.dma_mappings.append(mapping)
    return mapping


@traced
def nvidia_p2p_dma_unmap_pages(peer: pci_dev, page_table: nvidia_p2p_page_table,
                               dma_mapping: nvidia_p2p_dma_mapping) -> int:
    """Mirrors nvidia_p2p_dma_unmap_pages(): 0, also when the owner's teardown already
    unmapped it (the mapping is looked up, not trusted)."""
    if peer is None or page_table is None or dma_mapping is None:
        raise KernelError(EINVAL, "nvidia_p2p_dma_unmap_pages: NULL argument")
    _ = page_table.page_size             # container_of(): use-after-free once RM freed it
    found = _lookup(page_table)          # rm_lock held if found
    if found is None:
        return 0
    dev, info = found
    if not any(m is dma_mapping for m in info.dma_mappings):
        mutex_unlock(dev.rm_lock)
        return 0
    info.dma_mappings.remove(dma_mapping)    # ours now: the teardown cannot take it
    rm_p2p_latency(dev)
    mutex_unlock(dev.rm_lock)
    if dma_mapping.pci_dev is not peer:
        current().machine.report_bug("nvidia_p2p_dma_unmap_pages",
                                     f"peer {peer.name} is not the mapping's "
                                     f"{dma_mapping.pci_dev.name}")
    _dma_unmap(dma_mapping)
    return 0


def _dma_unmap(mapping: nvidia_p2p_dma_mapping) -> None:
    """Unmap a DMA mapping nobody else can reach any more, and free it."""
    unmap_window_runs(mapping.pci_dev.dev, mapping.runs)
    kfree(mapping)


@traced
def nvidia_p2p_free_dma_mapping(dma_mapping: nvidia_p2p_dma_mapping) -> int:
    """Mirrors nvidia_p2p_free_dma_mapping(): a no-op returning 0 in the open driver."""
    return 0
