"""The code of docs/peer-clients.md's "Your own device" and "The race-test API"
sections, verbatim (test_conformance.py's test_the_guide_shows_the_example_as_it_is
checks every line of the page is in this file or the example): this file is also the
driver module of the card, loaded by its name (`__name__`)."""

import pytest

from kernel_model.current import current
from kernel_model.emu.platform import BarSpec, PciDeviceSpec, rdma_host
from kernel_model.errno import EINVAL, KernelError
from kernel_model.fs import cdev, cdev_add, cdev_del, file_operations
from kernel_model.memory import io_remap_pfn_range
from kernel_model.pci import (
    pci_driver,
    pci_get_device,
    pci_msix_vec_count,
    pci_register_driver,
    pci_resource_len,
    pci_resource_start,
    pci_unregister_driver,
)
from kernel_model.pgtable import pgprot_noncached
from peermem_testing.api import core_context, fire_invalidation
from peermem_testing.conformance import ClientUnderTest
from userspace.libc import MAP_SHARED, O_RDWR, PROT_READ, PROT_WRITE, check

CARD = PciDeviceSpec(0x1D0F, 0xF00D, bars=(BarSpec(2, 4 << 20),), msix_vectors=2)


def mydev_open(inode, f):
    f.private_data = inode.i_cdev.private             # the pci_dev


def mydev_mmap(f, vma):
    pdev, size = f.private_data, vma.vm_end - vma.vm_start
    if vma.vm_pgoff or size > pci_resource_len(pdev, 2):
        raise KernelError(EINVAL, "mydev_mmap: outside BAR2")
    pfn = pci_resource_start(pdev, 2) >> current().machine.page_shift
    io_remap_pfn_range(vma, vma.vm_start, pfn, size, pgprot_noncached(vma.vm_page_prot))


def module_init(mod):                                 # this file is the driver module
    fops = file_operations(owner=mod, open=mydev_open, mmap=mydev_mmap)
    nodes = {}

    def probe(pdev, ident):
        nodes[pdev] = cdev(fops, private=pdev)
        cdev_add(nodes[pdev], f"/dev/mydev{len(nodes) - 1}")

    def remove(pdev):
        cdev_del(nodes.pop(pdev))
    drv = pci_driver("mydev", [(0x1D0F, 0xF00D)], probe, remove)
    pci_register_driver(current().machine, drv)
    return drv


def module_exit(mod):
    pci_unregister_driver(current().machine, mod.state)


def test_io_peer_mem_on_my_card_conforms(peer_client_conformance):
    maps = {}

    def alloc(proc, size):
        fd = check(proc.open("/dev/mydev0", O_RDWR), "open")
        addr = check(proc.mmap(0, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0), "mmap")
        maps[addr] = fd
        return addr

    def free(proc, addr, size):
        proc.munmap(addr, size)
        proc.close(maps.pop(addr))

    cut = ClientUnderTest("io_peer_mem", alloc, free, read=lambda p, a, n: p.load(a, n),
                          host={"devices": [CARD]}, host_modules=("mlx5_ib", __name__))
    peer_client_conformance(cut)


def test_the_card_is_on_the_bus():
    CARD = PciDeviceSpec(vendor=0x1D0F, device=0xF00D,
                         bars=(BarSpec(2, 4 << 20),),      # BAR2: 4 MiB of memory
                         msix_vectors=2)
    m = rdma_host(devices=[CARD])
    card = pci_get_device(m, 0x1D0F, 0xF00D).model       # the PciDevice
    print(card, card.pdev.driver)                         # no driver bound yet
    card.memory(2)[:5] = b"hello"                         # the card writes its memory...
    with m.kernel():
        assert m.phys_read(card.bar_start(2), 5) == b"hello"   # ...the host reads the BAR
        assert pci_msix_vec_count(card.pdev) == 2
    print(card.raise_irq(1))                              # 0, IRQ_NONE: no handler yet
    m.check_leaks()


def test_the_49_core_releases_inside_the_invalidation(peermem_ladder):
    lad = peermem_ladder(ClientUnderTest.nv_peer_mem(), ofed="4.9", record=True)
    assert core_context(lad.mr) == 1                  # 4.x: tickets count from 1
    lad.recorder.clear()
    lad.proc.run(fire_invalidation, lad.mr)           # as nv_peer_mem's invalidate would
    assert lad.recorder.order("nv_mem") == ["dma_unmap", "put_pages", "release"]
    lad.teardown()


@pytest.mark.race(bound=1, max_schedules=30)
def test_rmmod_f_waits_for_the_outstanding_mr(peermem_ladder):
    lad = peermem_ladder(ClientUnderTest.nv_peer_mem(), size=64 << 10, ofed="4.9")
    rmmod = lad.machine.spawn("rmmod")
    unload = rmmod.start(lad.unload_client)           # rmmod -f nv_peer_mem: it waits
    dereg = lad.proc.thread(lad.dereg, name="dereg")  # ibv_dereg_mr, racing it
    dereg.join()
    unload.join()
    rmmod.exit(0)
    assert "nv_peer_mem" not in lad.machine.modules
    lad.teardown()
