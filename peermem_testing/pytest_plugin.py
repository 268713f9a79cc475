"""The pytest plugin (entry point `pytest11: peermem`): fixtures for testing peer clients.

    def test_my_client(peer_client_conformance):
        cut = ClientUnderTest.uio_mapping("my_client")
        report = peer_client_conformance(cut)     # fails the test, naming each violation
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from peermem_testing.conformance import ClientUnderTest, ConformanceReport, run_conformance


@pytest.fixture
def peer_client_conformance() -> Callable[[ClientUnderTest], ConformanceReport]:
    """Run the conformance kit on a client; the test fails listing every violation."""

    def run(cut: ClientUnderTest) -> ConformanceReport:
        report = run_conformance(cut)
        if not report.ok:
            pytest.fail(str(report), pytrace=False)
        return report

    return run
