"""Tests for kernel_model/auxiliary.py: device lifetime, naming, binding by name."""

from __future__ import annotations

import pytest

from kernel_model.auxiliary import (
    auxiliary_bus,
    auxiliary_device,
    auxiliary_device_add,
    auxiliary_device_delete,
    auxiliary_device_id,
    auxiliary_device_init,
    auxiliary_device_uninit,
    auxiliary_driver,
    auxiliary_driver_register,
    auxiliary_driver_unregister,
    get_device,
)
from kernel_model.dma import device
from kernel_model.errno import EEXIST, EINVAL, ENODEV, KernelError


class Driver:
    def __init__(self, names, fail=False):
        self.events: list[tuple[str, str, str | None]] = []
        self.fail = fail
        self.drv = auxiliary_driver("rec", names, self.probe, self.remove)

    def probe(self, adev, ident):
        self.events.append(("probe", adev.dev.name, ident.name))
        if self.fail:
            raise KernelError(ENODEV, "rec_probe: refusing")

    def remove(self, adev):
        self.events.append(("remove", adev.dev.name, None))


def _adev(m, name="rdma", id=0, released=None):
    parent = device("0000:01:00.0", m, bus="pci")
    return auxiliary_device(m, name, id, parent=parent,
                            release=(lambda a: released.append(a.dev.name)) if released
                            is not None else None)


def test_init_checks_parent_and_name(m):
    with m.kernel():
        with pytest.raises(KernelError) as e:
            auxiliary_device_init(auxiliary_device(m, "rdma", 0))
        assert e.value.errno == EINVAL and "parent" in e.value.message
        with pytest.raises(KernelError) as e:
            auxiliary_device_init(_adev(m, name=""))
        assert e.value.errno == EINVAL and "name" in e.value.message
        with pytest.raises(KernelError) as e:
            auxiliary_device_add(_adev(m), "mlx5_core")  # never initialised
        assert e.value.errno == EINVAL


def test_add_names_the_device_and_binds_a_registered_driver(m):
    drv = Driver(["mlx5_core.rdma"])
    other = Driver(["mlx5_core.eth"])
    with m.kernel():
        auxiliary_driver_register(m, drv.drv)
        auxiliary_driver_register(other.drv)  # machine taken from current()
        a, b = _adev(m, id=0), _adev(m, id=1)
        for adev in (a, b):
            auxiliary_device_init(adev)
            auxiliary_device_add(adev, "mlx5_core")
    assert [d.dev.name for d in auxiliary_bus(m).devices] == ["mlx5_core.rdma.0",
                                                               "mlx5_core.rdma.1"]
    assert drv.events == [("probe", "mlx5_core.rdma.0", "mlx5_core.rdma"),
                          ("probe", "mlx5_core.rdma.1", "mlx5_core.rdma")]
    assert other.events == [] and a.driver is drv.drv
    with m.kernel():
        dup = _adev(m, id=1)
        auxiliary_device_init(dup)
        with pytest.raises(KernelError) as e:
            auxiliary_device_add(dup, "mlx5_core")
        assert e.value.errno == EEXIST
        auxiliary_driver_unregister(m, drv.drv)
        auxiliary_driver_unregister(other.drv)
    assert drv.events[2:] == [("remove", "mlx5_core.rdma.1", None),
                              ("remove", "mlx5_core.rdma.0", None)]
    assert a.driver is None and b.is_added


def test_register_after_add_probes_existing_devices_and_delete_unbinds(m):
    released: list[str] = []
    drv = Driver([auxiliary_device_id("mlx5_core.rdma")])
    with m.kernel():
        adev = _adev(m, released=released)
        auxiliary_device_init(adev)
        auxiliary_device_add(adev, "mlx5_core")
        assert adev.driver is None
        auxiliary_driver_register(m, drv.drv)
        assert adev.driver is drv.drv
        get_device(adev)  # someone else holds a reference
        auxiliary_device_delete(adev)
        assert drv.events[-1] == ("remove", "mlx5_core.rdma.0", None)
        assert auxiliary_bus(m).devices == [] and not adev.is_added
        auxiliary_device_uninit(adev)
        assert released == []  # the other reference keeps it
        auxiliary_device_uninit(adev)
        assert released == ["mlx5_core.rdma.0"]
        with pytest.raises(KernelError) as e:
            auxiliary_device_delete(adev)
        assert e.value.errno == EINVAL
        auxiliary_driver_unregister(m, drv.drv)
        auxiliary_device_uninit(adev)  # underflow: a WARN
    assert m.bugs and "refcount underflow" in m.bugs[0]
    m.bugs.clear()


def test_failed_probe_leaves_the_device_unbound(m):
    drv = Driver(["mlx5_core.rdma"], fail=True)
    with m.kernel():
        auxiliary_driver_register(m, drv.drv)
        adev = _adev(m)
        auxiliary_device_init(adev)
        auxiliary_device_add(adev, "mlx5_core")
        assert drv.events == [("probe", "mlx5_core.rdma.0", "mlx5_core.rdma")]
        assert adev.driver is None
        auxiliary_device_delete(adev)  # no remove for an unbound device
        auxiliary_driver_unregister(m, drv.drv)
        with pytest.raises(KernelError) as e:
            auxiliary_driver_unregister(m, drv.drv)
        assert e.value.errno == EINVAL
    assert [ev[0] for ev in drv.events] == ["probe"]


def test_driver_registration_checks(m):
    with m.kernel():
        with pytest.raises(KernelError) as e:
            auxiliary_driver_register(m, auxiliary_driver("x", [], lambda a, i: 0))
        assert e.value.errno == EINVAL
        drv = auxiliary_driver("x", ["a.b"], lambda a, i: 0)
        auxiliary_driver_register(m, drv)
        with pytest.raises(KernelError) as e:
            auxiliary_driver_register(m, drv)
        assert e.value.errno == EEXIST
        auxiliary_driver_unregister(m, drv)
