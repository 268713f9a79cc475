"""Tests for kernel_model/pci.py's drivers (pci_driver, register/unregister, binding) and MMIO."""

from __future__ import annotations

import pytest

from kernel_model.current import current
from kernel_model.errno import EEXIST, EINVAL, ENODEV, ENOMEM, KernelError
from kernel_model.pci import (
    MemoryBar,
    ioread32be,
    ioremap,
    iowrite32be,
    memcpy_toio,
    pci_add_device,
    pci_dev,
    pci_driver,
    pci_get_drvdata,
    pci_match_id,
    pci_register_bar,
    pci_register_driver,
    pci_remove_device,
    pci_set_drvdata,
    pci_unregister_driver,
)

MLX = (0x15B3, 0x101D)
GPU = (0x10DE, 0x2330)


class Recorder:
    """A driver whose probe/remove log what they see; probe fails for `fail` devices."""

    def __init__(self, ids, fail=()):
        self.events: list[tuple[str, str]] = []
        self.fail = set(fail)
        self.drv = pci_driver("rec", ids, self.probe, self.remove)

    def probe(self, pdev, ident):
        self.events.append(("probe", pdev.name))
        assert pdev.driver is self.drv  # dev->driver is set while probe runs
        assert ident == (pdev.vendor, pdev.device)
        assert current().machine is pdev.machine
        if pdev.name in self.fail:
            raise KernelError(ENODEV, "rec_probe: no such device")
        pci_set_drvdata(pdev, ("state", pdev.name))
        return 0

    def remove(self, pdev):
        self.events.append(("remove", pdev.name))
        assert pci_get_drvdata(pdev) == ("state", pdev.name)
        pci_set_drvdata(pdev, None)


def _dev(machine, ids):
    return pci_add_device(machine, pci_dev(machine, *ids))


def test_register_probes_matching_unbound_devices(machine):
    a, gpu, b = _dev(machine, MLX), _dev(machine, GPU), _dev(machine, MLX)
    rec = Recorder([MLX])
    with machine.kernel():
        assert pci_register_driver(machine, rec.drv) == 0
    assert rec.events == [("probe", a.name), ("probe", b.name)]
    assert a.driver is rec.drv and b.driver is rec.drv and gpu.driver is None
    assert pci_match_id(rec.drv.id_table, gpu) is None
    other = Recorder([MLX, GPU])
    with machine.kernel():
        pci_register_driver(machine, other.drv)  # only the unbound GPU is left for it
    assert other.events == [("probe", gpu.name)]
    with machine.kernel():
        pci_unregister_driver(machine, other.drv)
        pci_unregister_driver(machine, rec.drv)
    assert rec.events[2:] == [("remove", b.name), ("remove", a.name)]  # newest first
    assert a.driver is None and pci_get_drvdata(a) is None


def test_a_device_added_later_is_probed_in_the_machines_init_task(machine):
    rec = Recorder([MLX])
    with machine.kernel():
        pci_register_driver(machine, rec.drv)
    pdev = _dev(machine, MLX)  # no task is current here: probe runs as init_task
    assert rec.events == [("probe", pdev.name)] and pdev.driver is rec.drv
    pci_remove_device(pdev)  # the driver's remove runs before the device leaves
    assert rec.events[-1] == ("remove", pdev.name) and pdev.driver is None
    with machine.kernel():
        pci_unregister_driver(machine, rec.drv)
    assert rec.events[-1] == ("remove", pdev.name)  # nothing more


def test_failed_probe_leaves_the_device_unbound_and_the_driver_registered(machine):
    bad, good = _dev(machine, MLX), _dev(machine, MLX)
    rec = Recorder([MLX], fail=[bad.name])
    with machine.kernel():
        assert pci_register_driver(machine, rec.drv) == 0
    assert bad.driver is None and bad.probe_error == -ENODEV
    assert good.driver is rec.drv and good.probe_error == 0
    assert rec.drv in machine.pci_drivers
    with machine.kernel():
        pci_unregister_driver(machine, rec.drv)
    assert ("remove", bad.name) not in rec.events


def test_register_twice_and_unregister_unknown_fail(machine):
    rec = Recorder([MLX])
    with machine.kernel():
        pci_register_driver(machine, rec.drv)
        with pytest.raises(KernelError) as e:
            pci_register_driver(machine, rec.drv)
        assert e.value.errno == EEXIST
        pci_unregister_driver(machine, rec.drv)
        with pytest.raises(KernelError) as e:
            pci_unregister_driver(machine, rec.drv)
        assert e.value.errno == EINVAL


def test_remove_hooks_run_after_the_driver_is_gone(machine):
    pdev = pci_dev(machine, *MLX)
    seen = []
    pdev.remove_hooks.append(lambda p: seen.append((p.name, p.driver, p.is_added)))
    rec = Recorder([MLX])
    with machine.kernel():
        pci_register_driver(machine, rec.drv)
    pci_add_device(machine, pdev)
    pci_remove_device(pdev)
    assert seen == [(pdev.name, None, False)]
    with machine.kernel():
        pci_unregister_driver(machine, rec.drv)


class Regs:
    def __init__(self):
        self.writes: list[tuple[int, bytes]] = []

    def read(self, off, n):
        return bytes(range(off & 0xFF, (off & 0xFF) + n))

    def write(self, off, data):
        self.writes.append((off, data))


def test_mmio_accessors_are_big_endian_and_check_the_mapping(machine):
    pdev = pci_dev(machine, *GPU)
    regs = Regs()
    res = pci_register_bar(pdev, 0, 1 << 20, regs.read, regs.write)
    mem = MemoryBar(pdev, 2, 1 << 20)
    pci_add_device(machine, pdev)
    with machine.kernel():
        base = ioremap(res.start, 0x100)
        assert base == res.start  # identity
        assert ioread32be(base + 0x10) == 0x10111213
        iowrite32be(0xAABBCCDD, base + 0x18)
        memcpy_toio(mem.start + 8, b"\x01\x02\x03")
        with pytest.raises(KernelError) as e:
            ioremap(machine.ram_size - 4096, 8192)  # RAM, not device memory
        assert e.value.errno == ENOMEM
        with pytest.raises(KernelError):
            ioremap(res.start, 2 << 20)  # beyond the BAR
    assert regs.writes == [(0x18, b"\xaa\xbb\xcc\xdd")]
    assert bytes(mem.buf[8:11]) == b"\x01\x02\x03"
    pci_remove_device(pdev)
