"""Mirrors drivers/iommu/dma-iommu.c and drivers/iommu/iova.c: DMA through an IOMMU.

Two modes, chosen per Machine (`Machine(iommu=...)`):

* identity - no translation (iommu=off/pt): a DMA address is the physical
  address, dma_map_* uses the direct mapping (kernel/dma/direct.c).
* translating - every device gets its own DMA domain (default domain per
  group): an IOVA allocator (iova.c: top-down below the device's DMA mask,
  size-aligned, 32-bit space first for PCI devices) and an IO page table.
  A device's DMA address is looked up there; an address nothing maps is an
  IommuFault (a DMAR fault on real hardware), never a silent access.

# EMU: the IO page table is kept as extents (one record per map call, holding
the sg columns and each entry's IOVA), not radix pages; translate() bisects
over records, then over the entries' IOVAs.  Granule = the machine's page size.

Lock order: none; callers serialise (the kernel's iova_rbtree_lock and the
page-table lock are leaves).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.errno import EINVAL, ENOMEM, KernelError

if TYPE_CHECKING:
    from kernel_model.dma import device
    from kernel_model.emu.machine import Machine
    from kernel_model.scatterlist import sg_table

DMA_BIT_MASK_32 = 0xFFFFFFFF
APERTURE_END = (1 << 48) - 1  # domain->geometry.aperture_end: a 48-bit (4-level) IOMMU
IOVA_RANGE_CACHE_MAX_SIZE = 6  # iova.c: sizes below 2^(6-1) granules are rounded up


class IommuFault(Exception):
    """A device access to an IOVA its domain does not map (DMAR / SMMU fault)."""


def _roundup_pow_of_two(n: int) -> int:
    return 1 << (n - 1).bit_length()


class iova_domain:
    """Mirrors struct iova_domain: allocated IOVA ranges in granules [start, end).

    # EMU: sorted lists instead of the rbtree, no per-CPU rcache (the rounding
    the rcache forces is kept, since it decides the addresses).
    """

    def __init__(self, granule_shift: int, start_pfn: int = 1):
        self.granule_shift = granule_shift
        self.start_pfn = start_pfn
        self._starts: list[int] = []
        self._ends: list[int] = []

    def alloc_iova(self, size: int, limit_pfn: int) -> int:
        """Mirrors alloc_iova(size_aligned=true): highest fit at or below limit_pfn, or 0."""
        align_mask = ~((1 << (size - 1).bit_length()) - 1)
        high = limit_pfn + 1
        idx = bisect_left(self._starts, high) - 1
        while True:
            low = self._ends[idx] if idx >= 0 else self.start_pfn
            new = (high - size) & align_mask
            if high >= size and new >= low:
                self._insert(new, new + size)
                return new
            if idx < 0:
                return 0
            high = min(high, self._starts[idx])
            idx -= 1

    def _insert(self, start: int, end: int) -> None:
        i = bisect_left(self._starts, start)
        self._starts.insert(i, start)
        self._ends.insert(i, end)

    def free_iova(self, pfn: int) -> int:
        """Mirrors free_iova(): release the range starting at pfn; return its size or 0."""
        i = bisect_left(self._starts, pfn)
        if i == len(self._starts) or self._starts[i] != pfn:
            return 0
        size = self._ends[i] - self._starts[i]
        del self._starts[i], self._ends[i]
        return size

    def ranges(self) -> list[tuple[int, int]]:
        """[(start_pfn, end_pfn)] of every allocated range."""
        return list(zip(self._starts, self._ends, strict=True))


class IoMapping:
    """One extent of the IO page table: an sg_table mapping or a resource mapping."""

    __slots__ = ("iova", "size", "alloc_pfn", "kind", "write", "read", "sgt", "n",
                 "seg_iova", "phys")

    def __init__(self, iova: int, size: int, alloc_pfn: int, kind: str, dir: int):
        self.iova, self.size, self.alloc_pfn, self.kind = iova, size, alloc_pfn, kind
        # dma-iommu.c dma_info_to_prot(): TO_DEVICE is read-only, FROM_DEVICE write-only
        self.read = dir in (0, 1)
        self.write = dir in (0, 2)
        self.sgt: sg_table | None = None
        self.n = 0
        self.seg_iova: U64Array | None = None
        self.phys = 0

    @property
    def end(self) -> int:
        return self.iova + self.size

    def lookup(self, addr: int, gmask: int) -> tuple[int, int]:
        """(phys, bytes mapped contiguously from there) for addr inside this extent."""
        if self.kind == "resource":
            return self.phys + (addr - self.iova), self.end - addr
        sgt, seg = self.sgt, self.seg_iova.view[:self.n]
        i = bisect_right(seg, addr) - 1
        phys = (sgt.sg_pfn.view[i] << sgt.page_shift) + sgt.sg_off.view[i]
        s_off = phys & gmask
        span = (s_off + sgt.sg_len.view[i] + gmask) & ~gmask
        return (phys - s_off) + (addr - seg[i]), seg[i] + span - addr

    def __repr__(self) -> str:
        return f"IOVA [{self.iova:#x}-{self.end - 1:#x}] {self.kind}"


class iommu_domain:
    """Mirrors struct iommu_domain (IOMMU_DOMAIN_DMA) of one device."""

    def __init__(self, dev: device, granule_shift: int):
        self.dev = dev
        self.iovad = iova_domain(granule_shift)
        self.maps: list[IoMapping] = []  # sorted by iova
        self.pci_32bit_workaround = True  # dev->iommu->pci_32bit_workaround
        self._starts: list[int] = []

    def add(self, m: IoMapping) -> None:
        i = bisect_left(self._starts, m.iova)
        self.maps.insert(i, m)
        self._starts.insert(i, m.iova)

    def remove_at(self, iova: int) -> IoMapping | None:
        i = bisect_right(self._starts, iova) - 1
        if i < 0 or iova >= self.maps[i].end:
            return None
        del self._starts[i]
        return self.maps.pop(i)

    def find(self, addr: int) -> IoMapping | None:
        i = bisect_right(self._starts, addr) - 1
        if i >= 0 and addr < self.maps[i].end:
            return self.maps[i]
        return None


class IdentityIommu:
    """No translation: DMA address == physical address (iommu=pt / no IOMMU)."""

    translating = False

    def __init__(self, machine: Machine):
        self.machine = machine

    def translate(self, dev: device, dma_addr: int, length: int,
                  write: bool | None = None) -> list[tuple[int, int]]:
        """The bus address is the physical address."""
        return [(dma_addr, length)]

    def live_ranges(self, dev: device) -> list[str]:
        return []


class TranslatingIommu:
    """A DMA-API IOMMU: per-device IOVA space and IO page table."""

    translating = True

    def __init__(self, machine: Machine):
        self.machine = machine
        self.granule_shift = machine.page_shift
        self.domains: dict[device, iommu_domain] = {}

    def domain(self, dev: device) -> iommu_domain:
        """Mirrors iommu_get_dma_domain(): created on first use (iommu_probe_device)."""
        d = self.domains.get(dev)
        if d is None:
            d = self.domains[dev] = iommu_domain(dev, self.granule_shift)
        return d

    def _alloc_iova(self, dev: device, size: int, func: str) -> tuple[int, int]:
        """Mirrors iommu_dma_alloc_iova(): (iova, allocated granules) or ENOMEM."""
        shift = self.granule_shift
        iova_len = size >> shift
        if iova_len < 1 << (IOVA_RANGE_CACHE_MAX_SIZE - 1):
            iova_len = _roundup_pow_of_two(iova_len)
        d = self.domain(dev)
        iovad = d.iovad
        limit = min(dev.dma_mask, APERTURE_END)
        pfn = 0
        # try the 32-bit PCI space first (SAC before DAC), then, for good, the full mask
        if limit > DMA_BIT_MASK_32 and dev.bus == "pci" and d.pci_32bit_workaround:
            pfn = iovad.alloc_iova(iova_len, DMA_BIT_MASK_32 >> shift)
            d.pci_32bit_workaround = bool(pfn)
        if not pfn:
            pfn = iovad.alloc_iova(iova_len, limit >> shift)
        if not pfn:
            raise KernelError(ENOMEM, f"{func}: {dev.name}: IOVA space exhausted "
                              f"for {size:#x} bytes below {limit:#x}")
        return pfn << shift, pfn

    def map_sg(self, dev: device, sgt: sg_table, dir: int, max_seg: int) -> int:
        """Mirrors iommu_dma_map_sg(): one IOVA range for all entries, then __finalise_sg.

        Returns the DMA segment count; ops.dma_map_iova lays the entries out
        granule-aligned and merges them.  A first pass at IOVA 0 sizes the range.
        """
        n, ps, gs = sgt.orig_nents, sgt.page_shift, self.granule_shift
        seg_iova = U64Array(n)
        args = (sgt.sg_pfn, sgt.sg_off, sgt.sg_len, n)
        sgt.ops.dma_map_iova(ps, gs, *args, 0, max_seg, seg_iova, sgt.dma_addr, sgt.dma_len)
        gmask = (1 << gs) - 1
        last = (sgt.sg_pfn.view[n - 1] << ps) + sgt.sg_off.view[n - 1]
        size = seg_iova.view[n - 1] + (((last & gmask) + sgt.sg_len.view[n - 1] + gmask)
                                       & ~gmask)
        iova, pfn = self._alloc_iova(dev, size, "iommu_dma_map_sg")
        count = sgt.ops.dma_map_iova(ps, gs, *args, iova, max_seg, seg_iova, sgt.dma_addr,
                                     sgt.dma_len)
        m = IoMapping(iova, size, pfn, "sg", dir)
        m.sgt, m.n, m.seg_iova = sgt, n, seg_iova
        self.domain(dev).add(m)
        return count

    def unmap_sg(self, dev: device, sgt: sg_table) -> None:
        """Mirrors iommu_dma_unmap_sg(): unmap and free the IOVA range of a mapped table."""
        gmask = (1 << self.granule_shift) - 1
        self._unmap(dev, sgt.dma_addr.view[0] & ~gmask, "iommu_dma_unmap_sg", sgt)

    def map_resource(self, dev: device, phys: int, size: int, dir: int) -> int:
        """Mirrors iommu_dma_map_resource() -> __iommu_dma_map(..., IOMMU_MMIO)."""
        gmask = (1 << self.granule_shift) - 1
        off = phys & gmask
        span = (off + size + gmask) & ~gmask
        iova, pfn = self._alloc_iova(dev, span, "iommu_dma_map_resource")
        m = IoMapping(iova, span, pfn, "resource", dir)
        m.phys = phys - off
        self.domain(dev).add(m)
        return iova + off

    def unmap_resource(self, dev: device, dma_addr: int) -> None:
        """Mirrors iommu_dma_unmap_resource()."""
        gmask = (1 << self.granule_shift) - 1
        self._unmap(dev, dma_addr & ~gmask, "iommu_dma_unmap_resource", None)

    def _unmap(self, dev: device, iova: int, func: str, sgt: sg_table | None) -> None:
        d = self.domain(dev)
        m = d.find(iova)
        if m is None or m.iova != iova or (sgt is not None and m.sgt is not sgt):
            # iommu_unmap() unmapping less than asked: WARN_ON(unmapped != size)
            self.machine.report_bug(func, f"{dev.name}: no mapping at IOVA {iova:#x}")
            return
        d.remove_at(iova)
        d.iovad.free_iova(m.alloc_pfn)

    def translate(self, dev: device, dma_addr: int, length: int,
                  write: bool | None = None) -> list[tuple[int, int]]:
        """Walk the device's IO page table: [(phys, len)] pieces, merged when contiguous.

        `write` True/False checks the mapping's permission; None skips the check.
        """
        d = self.domains.get(dev)
        gmask = (1 << self.granule_shift) - 1
        pieces: list[tuple[int, int]] = []
        addr, left = dma_addr, length
        while left > 0:
            m = d.find(addr) if d is not None else None
            if m is None:
                raise IommuFault(f"{dev.name}: DMA to unmapped IOVA {addr:#x} "
                                 f"(access {dma_addr:#x}+{length:#x})")
            if write is not None and not (m.write if write else m.read):
                raise IommuFault(f"{dev.name}: DMA {'write' if write else 'read'} at IOVA "
                                 f"{addr:#x} denied by {m}")
            phys, run = m.lookup(addr, gmask)
            run = min(run, left)
            if pieces and pieces[-1][0] + pieces[-1][1] == phys:
                pieces[-1] = (pieces[-1][0], pieces[-1][1] + run)
            else:
                pieces.append((phys, run))
            addr += run
            left -= run
        return pieces

    def live_ranges(self, dev: device) -> list[str]:
        """The IOVA extents still mapped for dev, for leak reports."""
        d = self.domains.get(dev)
        return [repr(m) for m in d.maps] if d is not None else []


def make_iommu(machine: Machine, mode: str) -> IdentityIommu | TranslatingIommu:
    """Build the machine's IOMMU (what intel_iommu=on / iommu.passthrough pick)."""
    if mode == "identity":
        return IdentityIommu(machine)
    if mode == "translating":
        return TranslatingIommu(machine)
    raise KernelError(EINVAL, f"make_iommu: unknown mode {mode!r}")


def dma_to_phys(dev: device, dma_addr: int, length: int,
                write: bool | None = None) -> list[tuple[int, int]]:
    """Where a device's DMA of `length` bytes at `dma_addr` lands: [(phys, len)].

    Raises IommuFault for an IOVA the device's domain does not map.
    # EMU: the kernel's dma_to_phys() only undoes the direct mapping; the IOMMU
    # walk here is what the hardware does when the device issues the access.
    """
    return dev.machine.iommu.translate(dev, dma_addr, length, write)
