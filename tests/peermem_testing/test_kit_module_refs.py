"""The kit's module-refs check: with each client callback in flight (held asleep at its
entry; the free callback inside its call of ib_invalidate_peer_memory, before and
after the core's work, while the MR is deregistered), rmmod of the client must fail
(a module reference) or wait (the core's unregistration waiting for the umem).  On the
default core, not only the 4.9 one that the race corpus's unregister-client-busy uses.
"""

from __future__ import annotations

import pytest

from kernel_model.current import current
from kernel_model.locking import mutex_lock, mutex_unlock, wake_up
from kernel_model.module import module_put, try_module_get
from peermem_testing.conformance import MODULE_REF_PROBES, ClientUnderTest
from tests.peermem_testing.kit_broken_clients import broken, cmb, example, one_check, revoke_all


@pytest.mark.parametrize("cut", [ClientUnderTest.nv_peer_mem(),
                                 ClientUnderTest.uio_mapping("io_peer_mem"), cmb()],
                         ids=["nv_peer_mem", "io_peer_mem", "cmb_peer"])
def test_correct_clients_cannot_be_unloaded_under_a_callback(cut):
    r = one_check(cut, "module-refs")
    assert r.ok is True, r
    if cut.revoke is None:           # io_peer_mem never invalidates: no free callback
        assert r.detail.endswith("not reached: the free callback, calling "
                                 "ib_invalidate_peer_memory, the free callback, back "
                                 "from ib_invalidate_peer_memory")
    else:
        assert r.detail == (f"rmmod refused or waited with each of {len(MODULE_REF_PROBES)} "
                            "callbacks in flight")


def _no_put_pages_wait(state):
    """put_pages that does not wait for a reset in flight: the deregistration of an MR
    the reset is invalidating can finish under it."""
    ex = example()

    def put_pages(sg_head, ctx):
        mutex_lock(state.lock)
        if ctx in state.live:
            state.live.remove(ctx)
        mutex_unlock(state.lock)
        ex.sg_free_table(sg_head)
    state.put_pages = put_pages


def test_a_client_without_module_references_is_caught(monkeypatch):
    """The example as it was before this check: no module reference anywhere.  The core
    keeps the module through the callbacks it makes (its unregistration waits for the
    umems), but nothing keeps it through the reset: once the MR being invalidated is
    deregistered, rmmod unloads the client under its own free callback."""
    def patch(state, mod):
        state.mod = None
    broken(monkeypatch, "noref_peer", patch)
    r = one_check(cmb("noref_peer", revoke_all), "module-refs")
    assert r.ok is False
    assert r.detail.startswith("the free callback, back from ib_invalidate_peer_memory, its "
                               "MR deregistered meanwhile: rmmod noref_peer went through "
                               "while it was in flight")


def test_a_free_callback_dropping_its_module_reference_early_is_caught(monkeypatch):
    """The docs' module references (acquire to release, and one around the reset), but
    the reset drops its own before the invalidations it makes - with a put_pages that
    does not wait for it, the client is unloaded while it still invalidates."""
    ex = example()

    def patch(state, mod):
        _no_put_pages_wait(state)

        def revoke(self=state):
            try_module_get(self.mod)
            mutex_lock(self.lock)
            victims, self.live = self.live, []
            for ctx in victims:
                ex.kref_get(ctx.kref)
                ctx.revoking = True
                ctx.revoker = current()
            mutex_unlock(self.lock)
            module_put(self.mod)            # the bug: dropped before the callbacks ran
            for ctx in victims:
                self.invalidate[0](self.reg, ctx.core_context)
                mutex_lock(self.lock)
                self._unmap(ctx, ctx.device)
                ctx.revoked = True
                ctx.revoking = False
                mutex_unlock(self.lock)
                wake_up(self.revoke_wq)
                ex.kref_put(ctx.kref, ex._free)
            return len(victims)
        state.revoke_all = revoke
    broken(monkeypatch, "dropref_peer", patch)
    r = one_check(cmb("dropref_peer", revoke_all), "module-refs")
    assert r.ok is False
    assert r.detail.startswith("the free callback, calling ib_invalidate_peer_memory, its "
                               "MR deregistered meanwhile: rmmod dropref_peer went through")
    assert "take a module reference" in r.detail


def test_holding_the_reference_through_the_reset_is_enough(monkeypatch):
    """The same put_pages that does not wait, with the example's reset (its module
    reference held to the end): rmmod is refused while the reset runs."""
    def patch(state, mod):
        _no_put_pages_wait(state)
    broken(monkeypatch, "heldref_peer", patch)
    assert one_check(cmb("heldref_peer", revoke_all), "module-refs").ok is True


@pytest.mark.parametrize("ofed", [None, "4.9"], ids=["default-core", "ofed-4.9"])
def test_amdp2p_is_unloaded_under_its_free_callback(ofed):
    """amdp2p's only module reference is the MR's: its free_callback, in flight while
    the MR is deregistered, runs on in an unloaded module - on the 25.04 core as on the
    4.9 one (the race corpus's unregister-client-busy needs the 4.9 core)."""
    r = one_check(ClientUnderTest.amdp2p().configured(ofed=ofed), "module-refs")
    assert r.ok is False
    assert "rmmod amdp2p went through while it was in flight" in r.detail


def test_amdp2p_dma_faults_under_a_translating_iommu():
    """KFD's table holds raw bus addresses (amdgpu_amdkfd_gpuvm.c get_sg_table:
    aper_base + offset, mapped for no device): the HCA's DMA faults behind an IOMMU."""
    r = one_check(ClientUnderTest.amdp2p(), "data")
    assert r.ok is False and "IOMMU fault" in r.detail and "DMA to unmapped IOVA" in r.detail
