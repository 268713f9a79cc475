"""Mirrors drivers/pci (probe.c, setup-res.c, pci.c) and include/linux/pci.h: PCI functions.

A `pci_dev` is one PCI function on the machine's bus: vendor/device IDs, a
name like "0000:03:00.0", six BAR resources and an embedded `struct device`
for DMA.  Firmware/pci_assign_resource places each BAR in the MMIO window
above RAM (Machine.alloc_mmio_window: naturally aligned, never overlapping)
and the device model decodes it through an MmioRegion with read/write
callbacks.  `MemoryBar` is a BAR that behaves as plain memory (an NVMe CMB, a
GPU BAR1 aperture's backing), committed lazily.

Emulator-level pieces (the device model side) are pci_register_bar,
pci_add_device/pci_remove_device and MemoryBar; the rest mirrors the kernel's
accessors.

Drivers (drivers/pci/pci-driver.c, drivers/base/dd.c): a `pci_driver` names
the (vendor, device) pairs it handles; pci_register_driver() probes every
matching device that has no driver yet, and a device added later is probed
by the registered drivers (bus_probe_device).  A probe that fails leaves the
device unbound - the driver stays registered, as in the kernel.  Removing a
device or unregistering its driver calls the driver's remove() first.

MMIO accessors (include/asm-generic/io.h): ioread32be/iowrite32be/
memcpy_toio on an address ioremap() returned.
# EMU: ioremap is the identity: the kernel's __iomem address of a BAR is its
# physical address, and every access goes through machine.phys_read/write
# (a scheduling point), so a device sees each register access as it happens.

Lock order: none (pci_bus_sem is not modelled; the bus list changes only
from test or machine setup code, module load and unload).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import nullcontext
from typing import TYPE_CHECKING

from c_ext import anon_map
from kernel_model import dma
from kernel_model.current import current, current_or_none, running
from kernel_model.errno import EEXIST, EINVAL, ENOMEM, KernelError
from kernel_model.ioport import MmioRegion
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

PCI_STD_NUM_BARS = 6
IORESOURCE_MEM = 0x00000200
IORESOURCE_PREFETCH = 0x00002000
IORESOURCE_MEM_64 = 0x00100000


def PCI_DEVFN(slot: int, func: int) -> int:
    """Mirrors PCI_DEVFN()."""
    return ((slot & 0x1F) << 3) | (func & 0x07)


def PCI_SLOT(devfn: int) -> int:
    """Mirrors PCI_SLOT()."""
    return (devfn >> 3) & 0x1F


def PCI_FUNC(devfn: int) -> int:
    """Mirrors PCI_FUNC()."""
    return devfn & 0x07


class resource:
    """Mirrors struct resource: [start, end] inclusive, flags, name."""

    def __init__(self, start: int = 0, end: int = 0, flags: int = 0, name: str = ""):
        self.start, self.end, self.flags, self.name = start, end, flags, name

    def __repr__(self) -> str:
        return f"resource {self.name} [{self.start:#x}-{self.end:#x}] flags {self.flags:#x}"


def resource_size(res: resource) -> int:
    """Mirrors resource_size(): end - start + 1."""
    return res.end - res.start + 1


class pci_dev:
    """Mirrors struct pci_dev."""

    def __init__(self, machine: Machine, vendor: int, device: int, bus: int | None = None,
                 devfn: int = 0, domain: int = 0):
        self.machine = machine
        self.vendor = vendor
        self.device = device
        self.bus = _next_bus(machine) if bus is None else bus
        self.devfn = devfn
        self.name = f"{domain:04x}:{self.bus:02x}:{PCI_SLOT(devfn):02x}.{PCI_FUNC(devfn)}"
        self.resource = [resource() for _ in range(PCI_STD_NUM_BARS)]
        self.regions: dict[int, MmioRegion] = {}  # bar -> decoder (device model side)
        self.dev = dma.device(self.name, machine, bus="pci")
        self.dev.pci_dev = self      # container_of(dev, struct pci_dev, dev)
        # pci_setup_device(): 32-bit DMA masks until the driver's dma_set_mask,
        # 64 KiB segments, 4 GiB segment boundary
        self.dev.dma_mask = dma.DMA_BIT_MASK(32)
        self.dev.coherent_dma_mask = dma.DMA_BIT_MASK(32)
        self.dev.dma_parms = dma.device_dma_parameters(0x10000, 0xFFFFFFFF)
        self.enable_cnt = 0
        self.is_busmaster = False
        self.is_added = False
        self.driver: pci_driver | None = None   # bound driver (dev->driver)
        self.probe_error = 0                     # -errno of the last failed probe
        # device model: what powering the function off does (a hot-unplug reset)
        self.remove_hooks: list[Callable[[pci_dev], None]] = []
        self.msix_vec_count = 0   # device model: the MSI-X capability's table size (0: none)

    @property
    def trace_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"pci {self.name} [{self.vendor:04x}:{self.device:04x}]"


def to_pci_dev(dev: dma.device | None) -> pci_dev | None:
    """Mirrors to_pci_dev(): the PCI function a struct device is embedded in (None for
    a device that is not a PCI function)."""
    return getattr(dev, "pci_dev", None)


def _next_bus(machine: Machine) -> int:
    """One bus per device, as behind its own root port: the next free bus number."""
    used = {p.bus for p in _bus_list(machine)}
    return next(b for b in range(1, 256) if b not in used)


def _bus_list(machine: Machine) -> list[pci_dev]:
    """The machine's bus list (pci_root_buses flattened), created on first use."""
    devs = getattr(machine, "pci_devices", None)
    if devs is None:
        devs = machine.pci_devices = []
    return devs


def for_each_pci_dev(machine: Machine) -> Iterator[pci_dev]:
    """Mirrors for_each_pci_dev(): every function on the machine's bus, in add order."""
    yield from list(_bus_list(machine))


# -- resources --------------------------------------------------------------
def pci_resource_start(pdev: pci_dev, bar: int) -> int:
    """Mirrors pci_resource_start()."""
    return pdev.resource[bar].start


def pci_resource_end(pdev: pci_dev, bar: int) -> int:
    """Mirrors pci_resource_end()."""
    return pdev.resource[bar].end


def pci_resource_flags(pdev: pci_dev, bar: int) -> int:
    """Mirrors pci_resource_flags()."""
    return pdev.resource[bar].flags


def pci_resource_len(pdev: pci_dev, bar: int) -> int:
    """Mirrors pci_resource_len(): 0 for an unassigned BAR."""
    res = pdev.resource[bar]
    return resource_size(res) if res.end else 0


@traced
def pci_register_bar(pdev: pci_dev, bar: int, size: int, read: Callable[[int, int], bytes],
                     write: Callable[[int, bytes], None], prefetch: bool = False) -> resource:
    """Give `pdev` a 64-bit memory BAR of `size` bytes decoded by read/write(offset, ...).

    Device-model side (what config space plus pci_assign_resource produce).  A
    64-bit BAR takes two BAR registers, so `bar + 1` stays empty (pci_read_bases).
    """
    if not 0 <= bar < PCI_STD_NUM_BARS - 1 or pdev.resource[bar].flags or (
            bar and pdev.resource[bar - 1].flags & IORESOURCE_MEM_64):
        raise KernelError(EINVAL, f"pci_register_bar: {pdev.name}: BAR{bar} unavailable")
    if pdev.resource[bar + 1].flags:
        raise KernelError(EINVAL, f"pci_register_bar: {pdev.name}: BAR{bar + 1} in use")
    start = pdev.machine.alloc_mmio_window(size)
    flags = IORESOURCE_MEM | IORESOURCE_MEM_64 | (IORESOURCE_PREFETCH if prefetch else 0)
    res = pdev.resource[bar]
    res.start, res.end, res.flags, res.name = start, start + size - 1, flags, pdev.name
    region = MmioRegion(f"{pdev.name} BAR{bar}", start, size, read, write)
    pdev.regions[bar] = region
    if pdev.is_added:
        pdev.machine.register_mmio(region)
    return res


def pci_msix_vec_count(pdev: pci_dev) -> int:
    """Mirrors pci_msix_vec_count(): the vectors of the function's MSI-X capability,
    -EINVAL when it has none."""
    return pdev.msix_vec_count or -EINVAL


# -- drvdata, enable --------------------------------------------------------
def pci_set_drvdata(pdev: pci_dev, data: object) -> None:
    """Mirrors pci_set_drvdata()."""
    pdev.dev.driver_data = data


def pci_get_drvdata(pdev: pci_dev) -> object:
    """Mirrors pci_get_drvdata()."""
    return pdev.dev.driver_data


@traced
def pci_enable_device(pdev: pci_dev) -> int:
    """Mirrors pci_enable_device(): count enables (memory decoding is always on here)."""
    pdev.enable_cnt += 1
    return 0


@traced
def pci_disable_device(pdev: pci_dev) -> None:
    """Mirrors pci_disable_device()."""
    if pdev.enable_cnt <= 0:
        pdev.machine.report_bug("pci_disable_device", f"{pdev.name}: disabling disabled device")
        return
    pdev.enable_cnt -= 1
    if not pdev.enable_cnt:
        pdev.is_busmaster = False


def pci_set_master(pdev: pci_dev) -> None:
    """Mirrors pci_set_master(): allow the function to initiate DMA."""
    pdev.is_busmaster = True


def pci_clear_master(pdev: pci_dev) -> None:
    """Mirrors pci_clear_master()."""
    pdev.is_busmaster = False


# -- the bus ----------------------------------------------------------------
@traced
def pci_add_device(machine: Machine, pdev: pci_dev) -> pci_dev:
    """Mirrors pci_device_add() + pci_bus_add_device(): put pdev on the bus, decode BARs."""
    devs = _bus_list(machine)
    if pdev.machine is not machine or any(p.name == pdev.name for p in devs):
        raise KernelError(EEXIST, f"pci_device_add: {pdev.name} already on the bus")
    for region in pdev.regions.values():
        machine.register_mmio(region)
    devs.append(pdev)
    pdev.is_added = True
    for drv in list(_driver_list(machine)):  # bus_probe_device()
        if pdev.driver is None:
            _driver_probe(pdev, drv)
    return pdev


@traced
def pci_remove_device(pdev: pci_dev) -> None:
    """Mirrors pci_stop_and_remove_bus_device(): stop decoding BARs, leave the bus.

    Live DMA mappings are not torn down: the dma-debug leak check reports them.
    """
    if not pdev.is_added:
        raise KernelError(EINVAL, f"pci_stop_and_remove_bus_device: {pdev.name} not added")
    if pdev.driver is not None:
        _driver_release(pdev)  # device_release_driver()
    for region in pdev.regions.values():
        pdev.machine.unregister_mmio(region)
    _bus_list(pdev.machine).remove(pdev)
    pdev.is_added = False
    for hook in pdev.remove_hooks:
        hook(pdev)


def pci_get_device(machine: Machine, vendor: int, device: int) -> pci_dev | None:
    """Mirrors pci_get_device(vendor, device, NULL): the first match on the bus.

    # EMU: no reference is taken, so there is no pci_dev_put().
    """
    return next((p for p in _bus_list(machine)
                 if p.vendor == vendor and p.device == device), None)


# -- device-model helper ------------------------------------------------------
class MemoryBar:
    """A BAR that reads and writes as memory, backed by a lazily committed mapping.

    `buf` is the backing store as the device itself sees it (e.g. GPU memory
    behind a BAR1 aperture); the host reaches it through machine.phys_read/write.
    """

    def __init__(self, pdev: pci_dev, bar: int, size: int, prefetch: bool = True):
        self.pdev, self.bar, self.size = pdev, bar, size
        self._buf: memoryview | None = None
        self.res = pci_register_bar(pdev, bar, size, self.read, self.write, prefetch)

    @property
    def start(self) -> int:
        return self.res.start

    @property
    def buf(self) -> memoryview:
        if self._buf is None:
            self._buf = memoryview(anon_map(self.size))
        return self._buf

    def read(self, off: int, n: int) -> bytes:
        return bytes(self.buf[off:off + n])

    def write(self, off: int, data: bytes) -> None:
        self.buf[off:off + len(data)] = data

    def __repr__(self) -> str:
        return f"MemoryBar {self.pdev.name} BAR{self.bar} [{self.start:#x}+{self.size:#x}]"


# -- drivers (pci-driver.c, base/dd.c) -------------------------------------------------
class pci_driver:
    """Mirrors struct pci_driver: a name, the (vendor, device) IDs, probe and remove."""

    def __init__(self, name: str, id_table: list[tuple[int, int]],
                 probe: Callable[[pci_dev, tuple[int, int]], object],
                 remove: Callable[[pci_dev], None]):
        self.name, self.id_table = name, list(id_table)
        self.probe, self.remove = probe, remove

    @property
    def trace_name(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"pci_driver {self.name}"


PCI_ANY_ID = 0xFFFFFFFF


def pci_match_id(ids: list[tuple[int, int]], pdev: pci_dev) -> tuple[int, int] | None:
    """Mirrors pci_match_id(): the first (vendor, device) entry matching pdev
    (PCI_ANY_ID matches any value)."""
    return next((i for i in ids if i[0] in (pdev.vendor, PCI_ANY_ID)
                 and i[1] in (pdev.device, PCI_ANY_ID)), None)


def _driver_list(machine: Machine) -> list[pci_driver]:
    drvs = getattr(machine, "pci_drivers", None)
    if drvs is None:
        drvs = machine.pci_drivers = []
    return drvs


def _in_machine(machine: Machine):
    """Run driver callbacks as the caller, or as the machine's init task (a hotplug)."""
    cur = current_or_none()
    if cur is not None and cur.machine is machine:
        return nullcontext()
    return running(machine.init_task)


def _driver_probe(pdev: pci_dev, drv: pci_driver) -> None:
    """Mirrors driver_probe_device() -> pci_device_probe(): bind on success."""
    ident = pci_match_id(drv.id_table, pdev)
    if ident is None:
        return
    pdev.driver = drv  # dev->driver is set while probe runs (really_probe)
    try:
        with _in_machine(pdev.machine):
            drv.probe(pdev, ident)
    except KernelError as e:
        # really_probe(): "probe of <dev> failed with error -N"; the device stays unbound
        pdev.driver = None
        pdev.probe_error = -e.errno
        return
    pdev.probe_error = 0


def _driver_release(pdev: pci_dev) -> None:
    """Mirrors device_release_driver() -> pci_device_remove()."""
    drv, pdev.driver = pdev.driver, None
    with _in_machine(pdev.machine):
        drv.remove(pdev)


@traced
def pci_register_driver(machine: Machine, drv: pci_driver) -> int:
    """Mirrors pci_register_driver(): register, then probe every matching unbound device."""
    drvs = _driver_list(machine)
    if drv in drvs:
        raise KernelError(EEXIST, f"pci_register_driver: {drv.name} already registered")
    drvs.append(drv)
    for pdev in for_each_pci_dev(machine):
        if pdev.driver is None:
            _driver_probe(pdev, drv)
    return 0


@traced
def pci_unregister_driver(machine: Machine, drv: pci_driver) -> None:
    """Mirrors pci_unregister_driver(): remove() every device bound to drv, forget it."""
    drvs = _driver_list(machine)
    if drv not in drvs:
        raise KernelError(EINVAL, f"pci_unregister_driver: {drv.name} not registered")
    for pdev in reversed(list(for_each_pci_dev(machine))):
        if pdev.driver is drv:
            _driver_release(pdev)
    drvs.remove(drv)


# -- MMIO accessors (asm-generic/io.h) ------------------------------------------------
def ioremap(phys_addr: int, size: int) -> int:
    """Mirrors ioremap(): an __iomem address for a decoded MMIO range (identity here)."""
    region = current().machine.find_mmio(phys_addr)
    if region is None or phys_addr + size > region.end:
        raise KernelError(ENOMEM, f"ioremap: {phys_addr:#x}+{size:#x} is not device memory")
    return phys_addr


def iounmap(addr: int) -> None:
    """Mirrors iounmap() (nothing to undo for an identity mapping)."""


def ioread32be(addr: int) -> int:
    """Mirrors ioread32be(): a 32-bit big-endian register read."""
    return int.from_bytes(current().machine.phys_read(addr, 4), "big")


def iowrite32be(value: int, addr: int) -> None:
    """Mirrors iowrite32be(): a 32-bit big-endian register write."""
    current().machine.phys_write(addr, (value & 0xFFFFFFFF).to_bytes(4, "big"))


def memcpy_toio(addr: int, data: bytes) -> None:
    """Mirrors memcpy_toio()/__iowrite64_copy(): one burst of bytes into MMIO."""
    current().machine.phys_write(addr, bytes(data))
