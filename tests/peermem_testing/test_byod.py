"""Bring your own device: a user's PCI card (kernel_model/hw/pci_device.py) put on a host
with rdma_host(devices=...), probed by the user's own driver module loaded by name,
and a peer client serving its memory registered as an MR - end to end, through the
ladder and the conformance kit."""

from __future__ import annotations

import errno

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.errno import KernelError
from kernel_model.hw.pci_device import BarSpec, PciDevice, PciDeviceSpec
from kernel_model.interrupt import IRQ_NONE
from kernel_model.pci import for_each_pci_dev, pci_get_device, pci_msix_vec_count
from peermem_testing.conformance import ACCESS, ClientUnderTest, run_conformance
from peermem_testing.ladder import build_ladder
from tests.peermem_testing import byod_card
from userspace.libc import MAP_SHARED, O_RDWR, PROT_READ, PROT_WRITE, check
from userspace.libibverbs import verbs as v
from userspace.libibverbs.pyverbs import MR, SendWR
from userspace.tools.write_bw import connect, setup

DRIVER = "tests.peermem_testing.byod_card"     # loaded by its import name


def _card(m):
    return pci_get_device(m, byod_card.VENDOR, byod_card.DEVICE).model


def test_the_card_is_on_the_bus_before_its_driver_loads():
    m = rdma_host(ram_size=64 << 20, devices=[byod_card.spec()], modules=())
    dev = _card(m)
    assert isinstance(dev, PciDevice) and dev.pdev.driver is None
    assert dev.bar_size(2) == 4 << 20 and dev.bar_size(0) == 4096
    assert pci_msix_vec_count(dev.pdev) == 2
    dev.memory(2)[:4] = b"card"                       # the card's own memory...
    with m.kernel():
        assert m.phys_read(dev.bar_start(2), 4) == b"card"   # ...seen at the BAR
        m.phys_write(dev.bar_start(0), b"\x01\x02\x03\x04")  # a register BAR's callbacks
        assert m.phys_read(dev.bar_start(0), 4) == b"\x01\x02\x03\x04"
    assert dev.raise_irq(0) == IRQ_NONE                # no driver, no handler: spurious
    m.load_module(DRIVER)                              # probes it (pci_register_driver)
    state = m.modules[DRIVER].state
    assert dev.pdev.driver is state.driver and "/dev/mydev0" in m.chrdevs
    dev.raise_irq(0)
    assert state.devices[0].irqs == 1
    with pytest.raises(ValueError, match="vector 2 not in its MSI-X table of 2"):
        dev.raise_irq(2)
    with pytest.raises(ValueError, match="registers, not memory"):
        dev.memory(0)
    m.unload_module(DRIVER)                            # remove(): handler freed
    assert dev.pdev.driver is None and "/dev/mydev0" not in m.chrdevs
    m.check_leaks()


def test_a_card_without_msix_fails_the_drivers_probe():
    m = rdma_host(ram_size=64 << 20, modules=(),
                  devices=[PciDeviceSpec(byod_card.VENDOR, byod_card.DEVICE,
                                         bars=(BarSpec(2, 1 << 20),))])
    assert pci_msix_vec_count(_card(m).pdev) == -errno.EINVAL
    m.load_module(DRIVER)
    assert _card(m).pdev.driver is None and _card(m).pdev.probe_error == -errno.EINVAL
    m.check_leaks()


@pytest.mark.parametrize("spec, message", [
    (PciDeviceSpec(0xFFFF, 1), "not 16-bit IDs"),
    (PciDeviceSpec(1, 0x10000), "not 16-bit IDs"),
    (PciDeviceSpec(1, 1, msix_vectors=2049), "msix_vectors 2049"),
    (PciDeviceSpec(1, 1, bars=(BarSpec(5, 4096),)), "BAR index 5"),
    (PciDeviceSpec(1, 1, bars=(BarSpec(0, 3 << 12),)), "not a power of two"),
    (PciDeviceSpec(1, 1, bars=(BarSpec(0, 2048),)), "not a power of two"),
    (PciDeviceSpec(1, 1, bars=(BarSpec(0, 4096, read=lambda o, n: b""),)), "both read"),
], ids=["vendor", "device", "msix", "index", "size", "small", "half-registers"])
def test_a_bad_spec_is_refused_naming_the_field(spec, message):
    m = rdma_host(ram_size=64 << 20, modules=())
    with pytest.raises(ValueError, match=message):
        PciDevice(m, spec)
    assert not list(for_each_pci_dev(m))[1:]          # only the HCA: nothing half-added
    m.check_leaks()


def test_a_64bit_bar_takes_the_next_register():
    m = rdma_host(ram_size=64 << 20, modules=())
    with pytest.raises(KernelError) as e:
        PciDevice(m, PciDeviceSpec(1, 1, bars=(BarSpec(0, 4096), BarSpec(1, 4096))))
    assert e.value.errno == errno.EINVAL and "BAR1" in str(e.value)
    m.check_leaks()


def _mydev_client() -> ClientUnderTest:
    """io_peer_mem serving /dev/mydev0 mappings of the card."""
    maps: dict[int, int] = {}

    def alloc(proc, size):
        fd = check(proc.open("/dev/mydev0", O_RDWR), "open /dev/mydev0")
        addr = check(proc.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), "mmap")
        maps[addr] = fd
        return addr

    def free(proc, addr, size):
        fd = maps.pop(addr, None)
        if fd is not None:
            proc.munmap(addr, size)
            proc.close(fd)

    return ClientUnderTest("io_peer_mem", alloc, free, read=lambda p, a, n: p.load(a, n),
                           host={"ram_size": 64 << 20, "devices": [byod_card.spec()]},
                           host_modules=("mlx5_ib", DRIVER))


@pytest.mark.parametrize("ofed", ["25.04", "4.9"])
def test_an_rdma_write_lands_in_the_cards_memory(ofed):
    lad = build_ladder(_mydev_client(), size=64 << 10, ofed=ofed, record=True)
    assert lad.recorder.order("io_peer_mem")[:3] == ["acquire", "get_pages", "dma_map"]
    p = lad.proc
    src = p.run(setup, p, 4096, 4, 0x20)
    tgt = p.run(setup, p, 4096, 4, 0x10)
    p.run(connect, src, tgt.dest())
    p.run(connect, tgt, src.dest())
    mr = p.run(MR, tgt.pd, lad.size, ACCESS, lad.addr)     # on the target QP's PD

    def write() -> str:
        src.mr.write(b"peer" * 8)
        src.qp.post_send(SendWR(wr_id=1, sg_list=[v.ibv_sge(src.mr.buf, 32, src.mr.lkey)],
                                opcode=v.IBV_WR_RDMA_WRITE, send_flags=v.IBV_SEND_SIGNALED,
                                remote_addr=lad.addr + 0x100, rkey=mr.rkey))
        return v.ibv_wc_status_str(src.cq.poll_until(1)[0].status)
    assert p.run(write) == "SUCCESS"
    assert bytes(_card(lad.machine).memory(2)[0x100:0x120]) == b"peer" * 8
    p.run(mr.close)
    p.run(src.ctx.close)
    p.run(tgt.ctx.close)
    lad.teardown()


def test_the_kit_passes_a_client_on_the_card():
    report = run_conformance(_mydev_client())
    assert report.ok, str(report)
    assert {r.name: r.ok for r in report.results}["data"] is True


def test_hot_unplug_unbinds_the_driver_and_stops_decoding():
    m = rdma_host(ram_size=64 << 20, devices=[byod_card.spec()], modules=(DRIVER,))
    dev = _card(m)
    start = dev.bar_start(2)
    dev.remove()                                       # the driver's remove() runs
    assert dev.pdev.driver is None and "/dev/mydev0" not in m.chrdevs
    assert pci_get_device(m, byod_card.VENDOR, byod_card.DEVICE) is None
    assert m.find_mmio(start) is None
    m.check_leaks()
