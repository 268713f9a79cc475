"""docs/peer-clients.md quotes examples/cmb_peer/cmb_peer.py: every quoted piece of the
client is in the source as quoted, so the walkthrough cannot drift from the code."""

from __future__ import annotations

import re

import pytest

from tests.docs.docblocks import ROOT

DOC = (ROOT / "docs" / "peer-clients.md").read_text()
SOURCE = (ROOT / "examples" / "cmb_peer" / "cmb_peer.py").read_text()
QUOTES = [b for b in re.findall(r"```python\n(.*?)```", DOC, re.S)
          if b.lstrip().startswith(("def ", "class "))]


def test_the_walkthrough_quotes_the_client():
    assert len(QUOTES) >= 5


@pytest.mark.parametrize("quote", QUOTES, ids=[q.split("(")[0].split()[-1] for q in QUOTES])
def test_each_quote_is_in_the_source(quote: str):
    assert quote in SOURCE
