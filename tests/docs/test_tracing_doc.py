"""docs/tracing.md shows real output: every example is rerun and compared.

An example is an HTML comment naming what produced it, directly followed by
a fenced block holding exactly what that printed:

    <!-- peermem trace pin --function demo_pin_and_map -->
    ```text
    ...the command's stdout...
    ```

`peermem ...` markers run the CLI in-process (peermem.cli.main);
`example: NAME` markers run one of the small programs in EXAMPLES (for
output the CLI does not print, such as an assert_call_flow failure).  The
machinery is shared with the other docs (tests/docs/docblocks.py).  When the
tracer, a formatter or a scenario changes, rewrite the blocks with

    python -m tests.docs.test_tracing_doc --regen

(from the repository root; `tests` is a namespace package there) and read
the diff before committing it.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable

import pytest

from tests.docs.docblocks import ROOT, DocBlocks, Example, parse

DOC = ROOT / "docs" / "tracing.md"
REGEN = "python -m tests.docs.test_tracing_doc --regen"

# -- the examples that are not CLI commands ---------------------------------------

#: the failing flow shown in the doc, as its source text (sets are literals too)
CALL_FLOW_FAILURE = ('["sys_mmap", "pin_user_pages_remote", '
                     '{"dma_map_sgtable", "handle_mm_fault"}, "unpin_user_pages"]')


def _call_flow_failure() -> str:
    from kernel_model.emu.tracefilter import assert_call_flow
    from scenarios import run_traced
    trace = run_traced("pin")
    try:
        assert_call_flow(trace, ast.literal_eval(CALL_FLOW_FAILURE))
    except AssertionError as e:
        return (f'>>> trace = run_traced("pin")\n'
                f">>> assert_call_flow(trace, {CALL_FLOW_FAILURE})\n"
                f"Traceback (most recent call last):\n  ...\nAssertionError: {e}\n")
    raise AssertionError("the doc's failing call flow passed")


EXAMPLES: dict[str, Callable[[], str]] = {"call_flow_failure": _call_flow_failure}

BLOCKS = DocBlocks(DOC, EXAMPLES, REGEN)
_ALL = BLOCKS.blocks
produce = BLOCKS.produce
regenerate = BLOCKS.regenerate
__all__ = ["Example", "parse", "produce", "regenerate"]


# -- the tests ----------------------------------------------------------------------

def test_the_doc_has_examples():
    BLOCKS.check_nonempty(min_cli=4)


@pytest.mark.parametrize("ex", _ALL, ids=BLOCKS.ids)
def test_example_is_current(ex: Example):
    BLOCKS.check(ex)


@pytest.mark.parametrize("ex", [ex for ex in _ALL if "--format perfetto" in ex.command],
                         ids=BLOCKS.ids)
def test_perfetto_examples_are_json_blocks(ex: Example):
    assert ex.lang == "json"
    assert json.loads(ex.body)["traceEvents"]


if __name__ == "__main__":
    BLOCKS.regen_main()
