"""Mirrors drivers/base/auxiliary.c and include/linux/auxiliary_bus.h: the auxiliary bus.

A core driver splits one PCI function into functional parts by creating
auxiliary devices on this bus; other modules' auxiliary drivers bind to them
by name.  mlx5_core creates "mlx5_core.rdma.<n>" per HCA and mlx5_ib's driver,
whose id_table holds "mlx5_core.rdma", binds to each:

    adev = mlx5_adev(...); adev.name = "rdma"; adev.id = idx; adev.dev.parent = ...
    auxiliary_device_init(adev)                  # device_initialize: refcount 1
    auxiliary_device_add(adev, "mlx5_core")      # "mlx5_core.rdma.0", probes drivers
    ...
    auxiliary_device_delete(adev)                # unbinds: drv.remove(adev)
    auxiliary_device_uninit(adev)                # put_device: release() at 0

A device's match name is its name without the trailing ".<id>"; a driver
matches when an id_table entry equals it.  The driver sees probe(adev, id)
and remove(adev).  A failed probe leaves the device unbound.

The bus is per machine (`machine.auxiliary_bus`).  # EMU: the kernel's bus is
global; the driver functions take the machine explicitly, or find it through
current() when called without one (module_init runs on the machine).

Lock order: none (the driver core's device_lock is not modelled; binding
happens at module load/unload and device add/delete only).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING

from kernel_model import dma
from kernel_model.current import current, current_or_none, running
from kernel_model.errno import EEXIST, EINVAL, KernelError
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine


class auxiliary_device_id:
    """Mirrors struct auxiliary_device_id: "<modname>.<device name>"."""

    def __init__(self, name: str, driver_data: int = 0):
        self.name, self.driver_data = name, driver_data

    def __repr__(self) -> str:
        return f"auxiliary_device_id {self.name}"


class auxiliary_device:
    """Mirrors struct auxiliary_device: name, id, and the embedded struct device."""

    def __init__(self, machine: Machine, name: str = "", id: int = 0,
                 parent: dma.device | None = None,
                 release: Callable[[auxiliary_device], None] | None = None):
        self.machine = machine
        self.name, self.id = name, id
        self.dev = dma.device("", machine, bus="auxiliary")
        self.dev.parent = parent
        self.release = release          # dev.release, called when the last ref drops
        self.refcount = 0               # dev.kobj.kref
        self.driver: auxiliary_driver | None = None
        self.is_added = False

    @property
    def trace_name(self) -> str:
        return self.dev.name or self.name

    def __repr__(self) -> str:
        bound = f" bound to {self.driver.name}" if self.driver else ""
        return f"auxiliary_device {self.dev.name or self.name}{bound}"


class auxiliary_driver:
    """Mirrors struct auxiliary_driver: id_table of names, probe(adev, id), remove(adev)."""

    def __init__(self, name: str, id_table: list[auxiliary_device_id | str],
                 probe: Callable[[auxiliary_device, auxiliary_device_id], object],
                 remove: Callable[[auxiliary_device], None] | None = None):
        self.name = name
        self.id_table = [i if isinstance(i, auxiliary_device_id) else auxiliary_device_id(i)
                         for i in id_table]
        self.probe, self.remove = probe, remove

    def __repr__(self) -> str:
        return f"auxiliary_driver {self.name}"


class AuxiliaryBus:
    """The machine's auxiliary bus: devices in add order and registered drivers."""

    def __init__(self) -> None:
        self.devices: list[auxiliary_device] = []
        self.drivers: list[auxiliary_driver] = []

    def find(self, dev_name: str) -> auxiliary_device | None:
        return next((d for d in self.devices if d.dev.name == dev_name), None)


def auxiliary_bus(machine: Machine) -> AuxiliaryBus:
    """The machine's bus, made on first use."""
    bus = getattr(machine, "auxiliary_bus", None)
    if bus is None:
        bus = machine.auxiliary_bus = AuxiliaryBus()
    return bus


def _in_machine(machine: Machine):
    cur = current_or_none()
    if cur is not None and cur.machine is machine:
        return nullcontext()
    return running(machine.init_task)


def auxiliary_match_id(id_table: list[auxiliary_device_id],
                       adev: auxiliary_device) -> auxiliary_device_id | None:
    """Mirrors auxiliary_match_id(): compare the device name minus ".<id>"."""
    match_name = adev.dev.name.rpartition(".")[0]
    return next((i for i in id_table if i.name == match_name), None)


def _probe(adev: auxiliary_device, drv: auxiliary_driver) -> None:
    """Mirrors auxiliary_bus_probe() under really_probe(): bind unless probe fails."""
    ident = auxiliary_match_id(drv.id_table, adev)
    if ident is None:
        return
    adev.driver = drv
    try:
        with _in_machine(adev.machine):
            drv.probe(adev, ident)
    except KernelError:
        adev.driver = None  # "probe of <dev> failed": stays unbound


def _unbind(adev: auxiliary_device) -> None:
    """Mirrors device_release_driver() -> auxiliary_bus_remove()."""
    drv, adev.driver = adev.driver, None
    if drv is not None and drv.remove is not None:
        with _in_machine(adev.machine):
            drv.remove(adev)


@traced
def auxiliary_device_init(adev: auxiliary_device) -> int:
    """Mirrors auxiliary_device_init(): check parent and name, then device_initialize()."""
    if adev.dev.parent is None:
        raise KernelError(EINVAL, "auxiliary_device_init: auxiliary_device has a NULL "
                          "dev->parent")
    if not adev.name:
        raise KernelError(EINVAL, "auxiliary_device_init: auxiliary_device has a NULL name")
    adev.refcount = 1
    return 0


@traced
def __auxiliary_device_add(adev: auxiliary_device, modname: str) -> int:
    """Mirrors __auxiliary_device_add(): name it "<modname>.<name>.<id>", add, probe."""
    if not modname:
        raise KernelError(EINVAL, "__auxiliary_device_add: auxiliary device modname is NULL")
    if adev.refcount <= 0:
        raise KernelError(EINVAL, "__auxiliary_device_add: device not initialized")
    bus = auxiliary_bus(adev.machine)
    name = f"{modname}.{adev.name}.{adev.id}"
    if bus.find(name) is not None:
        raise KernelError(EEXIST, f"__auxiliary_device_add: adding auxiliary device {name} "
                          "failed: it exists")
    adev.dev.name = name
    bus.devices.append(adev)
    adev.is_added = True
    for drv in list(bus.drivers):  # bus_probe_device()
        if adev.driver is None:
            _probe(adev, drv)
    return 0


def auxiliary_device_add(adev: auxiliary_device, modname: str) -> int:
    """Mirrors the auxiliary_device_add() macro (KBUILD_MODNAME given explicitly)."""
    return __auxiliary_device_add(adev, modname)


@traced
def auxiliary_device_delete(adev: auxiliary_device) -> None:
    """Mirrors auxiliary_device_delete(): device_del() - unbind and leave the bus."""
    if not adev.is_added:
        raise KernelError(EINVAL, f"auxiliary_device_delete: {adev.name} not added")
    _unbind(adev)
    auxiliary_bus(adev.machine).devices.remove(adev)
    adev.is_added = False


@traced
def auxiliary_device_uninit(adev: auxiliary_device) -> None:
    """Mirrors auxiliary_device_uninit(): put_device(); release() when the last ref goes."""
    if adev.refcount <= 0:
        adev.machine.report_bug("auxiliary_device_uninit", f"{adev!r}: refcount underflow")
        return
    adev.refcount -= 1
    if adev.refcount == 0 and adev.release is not None:
        adev.release(adev)


def get_device(adev: auxiliary_device) -> auxiliary_device:
    """Mirrors get_device() on the auxiliary device's struct device."""
    adev.refcount += 1
    return adev


def _resolve(machine: Machine | auxiliary_driver, drv: auxiliary_driver | None
             ) -> tuple[Machine, auxiliary_driver]:
    if drv is None:  # called as auxiliary_driver_register(drv): the current machine
        assert isinstance(machine, auxiliary_driver)
        return current().machine, machine
    return machine, drv  # type: ignore[return-value]


@traced
def auxiliary_driver_register(machine: Machine | auxiliary_driver,
                              drv: auxiliary_driver | None = None) -> int:
    """Mirrors __auxiliary_driver_register(): register, probe every matching device."""
    machine, drv = _resolve(machine, drv)
    if drv.probe is None or not drv.id_table:
        raise KernelError(EINVAL, f"__auxiliary_driver_register: {drv.name} has no probe "
                          "or id_table")
    bus = auxiliary_bus(machine)
    if drv in bus.drivers:
        raise KernelError(EEXIST, f"__auxiliary_driver_register: {drv.name} registered")
    bus.drivers.append(drv)
    for adev in list(bus.devices):
        if adev.driver is None:
            _probe(adev, drv)
    return 0


@traced
def auxiliary_driver_unregister(machine: Machine | auxiliary_driver,
                                drv: auxiliary_driver | None = None) -> None:
    """Mirrors auxiliary_driver_unregister(): remove() each bound device, forget the driver."""
    machine, drv = _resolve(machine, drv)
    bus = auxiliary_bus(machine)
    if drv not in bus.drivers:
        raise KernelError(EINVAL, f"auxiliary_driver_unregister: {drv.name} not registered")
    for adev in reversed(list(bus.devices)):
        if adev.driver is drv:
            _unbind(adev)
    bus.drivers.remove(drv)
