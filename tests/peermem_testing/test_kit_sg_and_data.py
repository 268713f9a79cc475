"""The kit's sg-layout and data checks on broken variants of the example client.

sg-layout: the table dma_map returns must cover exactly the registered range at the
page size get_page_size declares, with each DMA address congruent with its VA
modulo that page size; the core refuses a table that does not (EINVAL), and the
check names the rule.  data: RDMA WRITEs at the first bytes, an unaligned offset
and the last bytes, on a host with a translating IOMMU - a DMA outside the
client's pages is an IOMMU fault the check reports, not a silent write.
"""

from __future__ import annotations

import pytest

from drivers.ib_core import peer_mem
from peermem_testing.conformance import ClientUnderTest
from tests.peermem_testing.kit_broken_clients import broken, cmb, one_check


def _short_table(state, mod):
    real = state.dma_map

    def dma_map(sg_head, ctx, dma_device, dmasync, nmap):   # maps all pages but the last
        last = ctx.pfns.pop()
        try:
            return real(sg_head, ctx, dma_device, dmasync, nmap)
        finally:
            ctx.pfns.append(last)
    state.dma_map = dma_map


def test_a_short_table_is_named(monkeypatch):
    broken(monkeypatch, "short_peer", _short_table)
    r = one_check(cmb("short_peer"), "sg-layout")
    assert r.ok is False
    assert "sg_table covers 241664 bytes of the 245760-byte range" in r.detail
    assert "errno 22" in r.detail


def test_a_48k_page_size_is_named(monkeypatch):
    def patch(state, mod):
        state.get_page_size = lambda ctx: 48 << 10
    broken(monkeypatch, "page48k_peer", patch)
    r = one_check(cmb("page48k_peer"), "sg-layout")
    assert r.ok is False and "page size 48 KiB is not a power of two (get_page_size)" \
        in r.detail


def test_a_page_size_the_addresses_disagree_with_is_named(monkeypatch):
    """64 KiB declared, PAGE_SIZE entries at BAR addresses: the range's first VA, at a
    64 KiB boundary, and the first entry's DMA address are not congruent."""
    def patch(state, mod):
        state.get_page_size = lambda ctx: 64 << 10
    broken(monkeypatch, "page64k_peer", patch)
    r = one_check(cmb("page64k_peer"), "sg-layout")
    assert r.ok is False
    assert "not congruent modulo page size 64 KiB" in r.detail and "DMA address 0x" in r.detail


@pytest.mark.parametrize("cut", [ClientUnderTest.nv_peer_mem(),
                                 ClientUnderTest.uio_mapping("io_peer_mem"), cmb()],
                         ids=["nv_peer_mem", "io_peer_mem", "cmb_peer"])
def test_correct_clients_pass_sg_layout_and_data(cut):
    for check in ("sg-layout", "data"):
        r = one_check(cut, check)
        assert r.ok is True, r
    assert "translating IOMMU" in r.detail


def test_a_short_table_the_core_let_through_fails_the_data_check(monkeypatch):
    """With the core's check bypassed (as on a real MLNX_OFED core, which trusts the
    table), the MR's last page has no translation: a WRITE to the MR's last bytes
    fails (the MTT entry there is not present) and the data check says where."""
    monkeypatch.setattr(peer_mem, "ib_peer_sgt_violation", lambda *a: None)
    broken(monkeypatch, "short_peer", _short_table)
    r = one_check(cmb("short_peer"), "data")
    assert r.ok is False
    assert r.detail.startswith(f"an RDMA WRITE at offset {(256 << 10) - 2048:#x} of the "
                               "memory completed REM_ACCESS_ERR: the MR does not reach")


def test_a_client_handing_out_physical_addresses_faults_in_the_data_check(monkeypatch):
    """dma_map giving the BAR's physical addresses (io_peer_mem's original way) instead of
    mapping them for the HCA: fine under the identity mapping, a fault under an IOMMU."""
    def patch(state, mod):
        real = state.dma_map

        def dma_map(sg_head, ctx, dma_device, dmasync, nmap):
            ret = real(sg_head, ctx, dma_device, dmasync, nmap)
            ps = dma_device.machine.page_size
            for i, pfn in enumerate(ctx.pfns):
                sg_head.dma_addr.view[i] = pfn * ps
            return ret
        state.dma_map = dma_map
    broken(monkeypatch, "phys_peer", patch)
    r = one_check(cmb("phys_peer"), "data")
    assert r.ok is False and "IOMMU fault" in r.detail and "offset 0x0 " in r.detail
