"""Mirrors kernel/dma/mapping.c and kernel/dma/direct.c: the streaming DMA API.

A driver maps memory for its device and gets DMA addresses to hand to the
hardware: dma_map_sgtable() for a table of RAM pages (an MR's umem),
dma_map_resource() for another device's MMIO (a peer BAR).  The machine's
IOMMU decides what a DMA address is:

* identity (kernel/dma/direct.c): the physical address, refused (EIO) when it
  lies beyond the device's dma_mask;
* translating (drivers/iommu/dma-iommu.c, kernel_model.iommu): an IOVA from
  the device's own domain; contiguous IOVA may merge entries into fewer segments.

`struct device` lives here too (include/linux/device.h), reduced to what DMA
needs: name, DMA masks, dma_parms, drvdata.

Every live mapping is recorded per device, as CONFIG_DMA_API_DEBUG does
(kernel/dma/debug.c): unmapping something never mapped is a reported bug, and
the machine's leak check names every mapping still live.

Lock order: none; a driver serialises its own map/unmap calls.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model import trace
from kernel_model.errno import EINVAL, EIO, ENOMEM, KernelError
from kernel_model.trace import traced, tracepoint

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine
    from kernel_model.scatterlist import sg_table

DMA_BIDIRECTIONAL = 0
DMA_TO_DEVICE = 1
DMA_FROM_DEVICE = 2
DMA_NONE = 3
_DIR_NAMES = ("DMA_BIDIRECTIONAL", "DMA_TO_DEVICE", "DMA_FROM_DEVICE", "DMA_NONE")

DMA_ATTR_WEAK_ORDERING = 1 << 1
DMA_ATTR_SKIP_CPU_SYNC = 1 << 5

# trace/events/dma.h
trace_dma_map_sg = tracepoint("dma_map_sg", "device dir ents nents first_dma")
trace_dma_unmap_sg = tracepoint("dma_unmap_sg", "device dir nents")

DMA_MAPPING_ERROR = (1 << 64) - 1
SZ_64K = 0x10000
ZONE_DMA_LIMIT = (1 << 24) - 1  # x86 ZONE_DMA: the lowest mask dma_direct_supported takes


def DMA_BIT_MASK(n: int) -> int:
    """Mirrors DMA_BIT_MASK(n): the n low bits set (all 64 for n == 64)."""
    return (1 << n) - 1 if n < 64 else (1 << 64) - 1


class device_dma_parameters:
    """Mirrors struct device_dma_parameters."""

    def __init__(self, max_segment_size: int = SZ_64K, segment_boundary_mask: int = 0xFFFFFFFF):
        self.max_segment_size = max_segment_size
        self.segment_boundary_mask = segment_boundary_mask


class dma_debug_entry:
    """Mirrors struct dma_debug_entry: one live mapping (`size` = entries for an sg_table)."""

    __slots__ = ("type", "obj", "dma_addr", "size", "dir")

    def __init__(self, type: str, obj: object, dma_addr: int, size: int, dir: int):
        self.type, self.obj, self.dma_addr, self.size, self.dir = type, obj, dma_addr, size, dir

    def __repr__(self) -> str:
        if self.type == "sg":
            what = f"sg_table of {self.size} entries at dma {self.dma_addr:#x}"
        else:
            what = f"resource dma {self.dma_addr:#x}+{self.size:#x}"
        return f"{what} {_DIR_NAMES[self.dir]}"


class device:
    """Mirrors struct device (the DMA-relevant part)."""

    def __init__(self, name: str, machine: Machine, bus: str | None = None):
        self.name = name
        self.machine = machine
        self.bus = bus  # "pci" for a PCI function (dev_is_pci)
        self.dma_mask = DMA_BIT_MASK(64)
        self.coherent_dma_mask = DMA_BIT_MASK(64)
        self.dma_parms = device_dma_parameters()
        self.driver_data: object = None
        # dma-debug: live mappings keyed by (type, id(obj) or dma_addr)
        self.dma_entries: dict[tuple, list[dma_debug_entry]] = {}

    @property
    def nr_dma_mappings(self) -> int:
        return sum(len(v) for v in self.dma_entries.values())

    @property
    def trace_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"device {self.name} mask {self.dma_mask:#x} live dma {self.nr_dma_mappings}"


def dev_name(dev: device) -> str:
    """Mirrors dev_name()."""
    return dev.name


def dev_set_drvdata(dev: device, data: object) -> None:
    """Mirrors dev_set_drvdata()."""
    dev.driver_data = data


def dev_get_drvdata(dev: device) -> object:
    """Mirrors dev_get_drvdata()."""
    return dev.driver_data


# -- masks and parameters (mapping.c) ---------------------------------------
def dma_supported(dev: device, mask: int) -> bool:
    """Mirrors dma_supported(): an IOMMU takes any mask; direct needs ZONE_DMA reach."""
    if dev.machine.iommu.translating:
        return True
    # dma_direct_supported(): 32-bit masks always work; below, ZONE_DMA must be reachable
    if mask >= DMA_BIT_MASK(32):
        return True
    return mask >= min(dev.machine.ram_size - 1, ZONE_DMA_LIMIT)


@traced
def dma_set_mask(dev: device, mask: int) -> int:
    """Mirrors dma_set_mask(): -EIO when the platform cannot honour the mask."""
    if not dma_supported(dev, mask):
        raise KernelError(EIO, f"dma_set_mask: {dev.name}: mask {mask:#x} unsupported")
    dev.dma_mask = mask
    return 0


def dma_set_coherent_mask(dev: device, mask: int) -> int:
    """Mirrors dma_set_coherent_mask()."""
    if not dma_supported(dev, mask):
        raise KernelError(EIO, f"dma_set_coherent_mask: {dev.name}: mask {mask:#x} unsupported")
    dev.coherent_dma_mask = mask
    return 0


@traced
def dma_set_mask_and_coherent(dev: device, mask: int) -> int:
    """Mirrors dma_set_mask_and_coherent()."""
    dma_set_mask(dev, mask)
    return dma_set_coherent_mask(dev, mask)


def dma_get_mask(dev: device) -> int:
    """Mirrors dma_get_mask()."""
    return dev.dma_mask


def dma_set_max_seg_size(dev: device, size: int) -> int:
    """Mirrors dma_set_max_seg_size()."""
    dev.dma_parms.max_segment_size = size
    return 0


def dma_get_max_seg_size(dev: device) -> int:
    """Mirrors dma_get_max_seg_size(): dma_parms, or 64 KiB when unset."""
    return dev.dma_parms.max_segment_size or SZ_64K


# -- dma-debug (kernel/dma/debug.c) -----------------------------------------
class DmaDebug:
    """The machine's registry of devices holding live DMA mappings, for the leak check."""

    def __init__(self, machine: Machine):
        self.machine = machine
        self.devices: dict[device, None] = {}  # strong refs: a leaked device still reports
        machine.leak_checks.append(self.check)

    def check(self, machine: Machine) -> list[str]:
        out = []
        for dev in self.devices:
            entries = [e for v in dev.dma_entries.values() for e in v]
            ranges = machine.iommu.live_ranges(dev)
            text = "; ".join(repr(e) for e in entries)
            if ranges:
                text += " | " + ", ".join(ranges)
            out.append(f"dma: {dev.name}: {len(entries)} live DMA mapping(s): {text}")
        return out


def _debug(machine: Machine) -> DmaDebug:
    dbg = getattr(machine, "dma_debug", None)
    if dbg is None:
        dbg = machine.dma_debug = DmaDebug(machine)
    return dbg


def _debug_add(dev: device, key: tuple, entry: dma_debug_entry) -> None:
    dev.dma_entries.setdefault(key, []).append(entry)
    _debug(dev.machine).devices[dev] = None


def _debug_remove(dev: device, key: tuple, dir: int, func: str) -> bool:
    """check_unmap(): drop one entry; report an unmap of something never mapped."""
    entries = dev.dma_entries.get(key)
    if not entries:
        dev.machine.report_bug(func, f"{dev.name}: device driver tries to free DMA memory "
                               f"it has not allocated {key[1:]}")
        return False
    e = entries.pop()
    if e.dir != dir:
        dev.machine.report_bug(func, f"{dev.name}: DMA memory mapped {_DIR_NAMES[e.dir]} "
                               f"freed with {_DIR_NAMES[dir]}")
    if not entries:
        del dev.dma_entries[key]
    if not dev.dma_entries:
        _debug(dev.machine).devices.pop(dev, None)
    return True


# -- streaming mappings -----------------------------------------------------
def _check_dir(dir: int, func: str) -> None:
    # EMU: the kernel BUG_ON()s an invalid direction; here it is an EINVAL.
    if dir not in (DMA_BIDIRECTIONAL, DMA_TO_DEVICE, DMA_FROM_DEVICE):
        raise KernelError(EINVAL, f"{func}: invalid DMA direction {dir}")


@traced
def dma_direct_map_sg(dev: device, sgt: sg_table) -> int:
    """Mirrors dma_direct_map_sg(): DMA address = physical, each within the mask."""
    n = sgt.orig_nents
    r = sgt.ops.dma_map_direct(sgt.page_shift, sgt.sg_pfn, sgt.sg_off, sgt.sg_len, n,
                               dev.dma_mask, sgt.dma_addr, sgt.dma_len)
    if r < 0:
        i = -r - 1
        phys = (sgt.sg_pfn.view[i] << sgt.page_shift) + sgt.sg_off.view[i]
        # EMU: no swiotlb bounce buffering; the kernel would bounce when swiotlb is active.
        # out_unmap: the entries before i need no unmapping under the direct mapping.
        raise KernelError(EIO, f"dma_direct_map_sg: {dev.name}: DMA addr {phys:#x}+"
                          f"{sgt.sg_len.view[i]:#x} overflows mask {dev.dma_mask:#x}")
    return r


@traced
def dma_map_sgtable(dev: device, sgt: sg_table, dir: int, attrs: int = 0) -> None:
    """Mirrors dma_map_sgtable(): map every CPU entry; set sgt.nents to the DMA count."""
    _check_dir(dir, "dma_map_sgtable")
    if not sgt.orig_nents:
        # EMU: the kernel WARNs and returns -EIO for a map of 0 entries.
        raise KernelError(EINVAL, "dma_map_sgtable: empty table")
    iommu = dev.machine.iommu
    if iommu.translating:
        nents = iommu.map_sg(dev, sgt, dir, dma_get_max_seg_size(dev))
    else:
        nents = dma_direct_map_sg(dev, sgt)
    sgt.nents = nents
    if trace.enabled:
        trace_dma_map_sg(dev.name, _DIR_NAMES[dir], sgt.orig_nents, nents,
                         sgt.dma_addr.view[0])
    _debug_add(dev, ("sg", id(sgt)),
               dma_debug_entry("sg", sgt, sgt.dma_addr.view[0], sgt.orig_nents, dir))


@traced
def dma_unmap_sgtable(dev: device, sgt: sg_table, dir: int, attrs: int = 0) -> None:
    """Mirrors dma_unmap_sgtable(): release what dma_map_sgtable set up."""
    _check_dir(dir, "dma_unmap_sgtable")
    if not _debug_remove(dev, ("sg", id(sgt)), dir, "dma_unmap_sgtable"):
        return
    if trace.enabled:
        trace_dma_unmap_sg(dev.name, _DIR_NAMES[dir], sgt.orig_nents)
    iommu = dev.machine.iommu
    if iommu.translating:
        iommu.unmap_sg(dev, sgt)


@traced
def dma_map_resource(dev: device, phys_addr: int, size: int, dir: int,
                     attrs: int = 0) -> int:
    """Mirrors dma_map_resource(): map MMIO (a peer BAR); DMA_MAPPING_ERROR on failure."""
    _check_dir(dir, "dma_map_resource")
    m = dev.machine
    if 0 <= phys_addr < m.ram_size:  # WARN_ON_ONCE(pfn_valid(PHYS_PFN(phys_addr)))
        m.report_bug("dma_map_resource", f"{dev.name}: {phys_addr:#x} is RAM, not MMIO")
        return DMA_MAPPING_ERROR
    if m.iommu.translating:
        try:
            addr = m.iommu.map_resource(dev, phys_addr, size, dir)
        except KernelError:
            return DMA_MAPPING_ERROR
    else:
        addr = phys_addr  # dma_direct_map_resource()
        if addr + size - 1 > dev.dma_mask:
            return DMA_MAPPING_ERROR
    _debug_add(dev, ("resource", addr, size),
               dma_debug_entry("resource", None, addr, size, dir))
    return addr


@traced
def dma_unmap_resource(dev: device, addr: int, size: int, dir: int, attrs: int = 0) -> None:
    """Mirrors dma_unmap_resource()."""
    _check_dir(dir, "dma_unmap_resource")
    if not _debug_remove(dev, ("resource", addr, size), dir, "dma_unmap_resource"):
        return
    if dev.machine.iommu.translating:
        dev.machine.iommu.unmap_resource(dev, addr)


def dma_mapping_error(dev: device, dma_addr: int) -> int:
    """Mirrors dma_mapping_error(): -ENOMEM for DMA_MAPPING_ERROR, else 0."""
    return -ENOMEM if dma_addr == DMA_MAPPING_ERROR else 0
