"""The default peermem_ladder() is a clean baseline for race tests (issue 21).

Race tests written from the public docs on the default ladder found two known bugs
before any bug of the test's own: nv_peer_memory issue 53's use-after-free
(ibv_dereg_mr vs cudaFree: the teardown's nvidia_p2p_dma_unmap_pages reads the page
table the driver freed after the free callback, or the callback writes to the context
the deregistration released) and the core's NULL dereference of a
late invalidation (MLNX_OFED peer_mem.c, ib_invalidate_peer_memory(), 5.1b to 25.04).
The ladder now loads nv_peer_mem with the proposed issue 53 fix (issue53_fix=1) on a
core with the proposed late-invalidation fix (ib_core late_invalidate_fix=1, the
default): the same tests pass here within a budget (the whole bound-2 search is
docs/race-testing.md's claim), and each bug is still found with its switch at 0.
"""

from __future__ import annotations

import attrs
import pytest

from kernel_model.emu.explore import explore, replay
from peermem_testing.api import invalidate_core_context, peer_client_of
from peermem_testing.conformance import ClientUnderTest
from peermem_testing.ladder import build_ladder

BUDGET = 150


def dereg_vs_free(lad) -> None:
    dereg = lad.proc.start(lad.dereg)                    # ibv_dereg_mr
    free = lad.proc.thread(lad.revoke, name="free")     # cudaFree
    dereg.join()
    free.join()
    lad.teardown()


def invalidation_vs_dereg(lad) -> None:
    """The client's invalidation of the MR through the core (its core_context, taken
    while the MR is registered) from a task of its own, against ibv_dereg_mr."""
    client, core_context = peer_client_of(lad.mr), lad.core_context()
    dereg = lad.proc.start(lad.dereg)
    late = lad.proc.thread(invalidate_core_context, client, core_context, name="inval")
    dereg.join()
    assert late.join() == 0
    lad.teardown()


@pytest.mark.race(strategy="dfs", bound=2, max_schedules=BUDGET)
def test_dereg_vs_free_on_the_default_ladder(peermem_ladder):
    dereg_vs_free(peermem_ladder())


@pytest.mark.race(strategy="dfs", bound=2, max_schedules=BUDGET)
def test_core_invalidation_vs_dereg_on_the_default_ladder(peermem_ladder):
    invalidation_vs_dereg(peermem_ladder())


def test_the_default_ladder_loads_the_fix():
    assert ClientUnderTest.nv_peer_mem().params["issue53_fix"] == 1


def test_issue_53_is_found_with_the_released_client():
    def program():
        dereg_vs_free(build_ladder(ClientUnderTest.nv_peer_mem(issue53_fix=0)))
    f = explore(program, "dfs", bound=2).failure
    assert f is not None and f.check == "UseAfterFree", f
    # either face of issue 53: the teardown's dma_unmap reads the page table the driver
    # freed after the callback, or the callback writes callback_task into the context
    # the deregistration of the invalidated MR released
    assert ("nvidia_p2p_dma_unmap_pages" in f.detail and "nvidia_p2p_page_table" in f.detail) \
        or ("nv_get_p2p_free_callback" in f.detail and "nv_mem_release" in f.detail), f.detail
    again = replay(program, f.schedule).failure
    assert again is not None and again.check == "UseAfterFree"


def test_the_late_invalidation_null_deref_is_found_with_the_released_core():
    cut = ClientUnderTest.nv_peer_mem()
    cut = attrs.evolve(cut, host_modules=("ib_core", *cut.host_modules),
                       host_params={"ib_core": {"late_invalidate_fix": 0}})

    def program():
        invalidation_vs_dereg(build_ladder(cut))
    f = explore(program, "dfs", bound=2).failure
    assert f is not None and f.check == "null-deref", f
    assert "ib_peer_unmap_on_invalidate" in f.detail
