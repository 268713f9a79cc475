"""The pytest plugin's `race` marker and `--peermem-replay`, run on a test file of its own.

The file runs the lost update of tests/kernel_model/test_explore.py as
ordinary tests: marked, the plugin explores it and the test fails with the
report; `--peermem-replay` reruns exactly the reported schedule.
"""

from __future__ import annotations

import re

import pytest

RACY = '''
import pytest
from tests.kernel_model.test_explore import lost_update


@pytest.mark.race(bound=1)
def test_racy():
    lost_update()


@pytest.mark.race(bound=0)
def test_no_preemption_no_bug():
    lost_update()


@pytest.mark.race(strategy="pct", max_schedules=50, seed=1)
def test_racy_pct():
    lost_update()
'''


@pytest.fixture
def racy(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(test_racy=RACY)
    return pytester


def test_a_failing_race_test_prints_the_report_and_its_replay_command(racy):
    res = racy.runpytest_inprocess("-p", "no:randomly", "-q")
    res.assert_outcomes(passed=1, failed=2)
    out = res.stdout.str()
    assert "race: assertion: lost update: counter is 1" in out
    assert "1 preemption(s)" in out                     # shrunk to the one that matters
    assert "# tracer: function_graph" in out and "kthread_create" in out   # its trace
    m = re.search(r"replay: pytest 'test_racy.py::test_racy' --peermem-replay '([^']+)'", out)
    assert m, out
    again = racy.runpytest_inprocess("-q", "test_racy.py::test_racy",
                                     "--peermem-replay", m.group(1))
    again.assert_outcomes(failed=1)
    assert f"schedule {m.group(1)!r}" in again.stdout.str()


def test_a_replay_of_a_harmless_schedule_passes(racy):
    res = racy.runpytest_inprocess("-q", "test_racy.py::test_racy", "--peermem-replay", "0")
    res.assert_outcomes(passed=1)


def test_race_takes_only_the_explorers_keywords(pytester):
    pytester.makepyfile(test_bad='''
import pytest

@pytest.mark.race(bound=1, tries=3)
def test_bad():
    pass
''')
    res = pytester.runpytest_inprocess("-q")
    assert res.ret != 0
    assert "race() takes keywords" in res.stdout.str() + res.stderr.str()


def test_shards_make_one_test_per_part_of_the_search(pytester):
    pytester.makepyfile(test_sharded='''
import pytest
from tests.kernel_model.test_explore import lost_update

@pytest.mark.race(bound=1, shards=3)
def test_racy():
    lost_update()

@pytest.mark.race(bound=0, shards=2)
def test_calm():
    lost_update()
''')
    res = pytester.runpytest_inprocess("-q", "-rA", "-p", "no:randomly")
    out = res.stdout.str()
    for i in range(3):
        assert f"test_racy[shard{i}of3]" in out
    # the lost update is in some part of the bound-1 search, and the summary combines
    # the three parts into one verdict naming where it was found
    failed = [i for i in range(3) if f"FAILED test_sharded.py::test_racy[shard{i}of3]" in out]
    assert failed
    assert re.search(r"test_sharded.py::test_racy \(all shards\): 3 shard\(s\) of 3: "
                     r"\d+ schedule\(s\) in all: FAILED \(assertion in shard "
                     + str(failed[0]), out), out
    # bound 0 is a few schedules (a task's end against its join): shard 0 runs them
    # before there is anything to split, shard 1 has nothing left - both pass
    assert "PASSED test_sharded.py::test_calm[shard0of2]" in out
    assert "PASSED test_sharded.py::test_calm[shard1of2]" in out
    assert re.search(r"test_calm \(all shards\): 2 shard\(s\) of 2: \d+ schedule\(s\) in "
                     r"all: no failure", out), out


def test_race_shards_must_be_a_positive_int(pytester):
    pytester.makepyfile(test_bad_shards='''
import pytest

@pytest.mark.race(shards=0)
def test_bad():
    pass
''')
    res = pytester.runpytest_inprocess("-q")
    assert res.ret != 0
    assert "race(shards=) wants an int >= 1" in res.stdout.str() + res.stderr.str()


def test_a_ladder_cannot_revoke_memory_its_client_never_takes_away(peermem_ladder):
    from peermem_testing.conformance import ClientUnderTest
    lad = peermem_ladder(ClientUnderTest.uio_mapping("io_peer_mem"), size=64 << 10)
    with pytest.raises(ValueError, match="io_peer_mem has no way to revoke"):
        lad.revoke()
    assert not lad.mr.closed                       # nothing was undone by the refusal
    lad.teardown()
    assert lad.mr.closed and not lad.proc.alive    # and the leak check runs after


def test_each_race_test_says_what_it_explored(racy):
    """The terminal summary lists every race test: schedules run (and distinct), the
    strategy with its bound or seed, the time, and the verdict; a failing test's report
    ends with the same line."""
    res = racy.runpytest_inprocess("-p", "no:randomly", "-q")
    out = res.stdout.str()
    assert "peermem race tests" in out
    calm = re.search(r"test_racy.py::test_no_preemption_no_bug: (\d+) schedule\(s\) explored "
                     r"\((\d+) distinct\), dfs, bound 0, in [\d.]+ s: no failure", out)
    assert calm and calm.group(1) == calm.group(2), out
    assert re.search(r"test_racy.py::test_racy: \d+ schedule\(s\) explored \(\d+ distinct\), "
                     r"dfs, bound 1, in [\d.]+ s: FAILED \(assertion\)", out)
    assert re.search(r"test_racy.py::test_racy_pct: \d+ schedule\(s\) explored .*pct, seed 1, "
                     r"depth 3, in [\d.]+ s: FAILED \(assertion\)", out)
    assert re.search(r"--peermem-replay '[^']+'\n\d+ schedule\(s\) explored", out)


def test_a_replayed_race_test_says_which_schedule(racy):
    res = racy.runpytest_inprocess("-q", "test_racy.py::test_racy", "--peermem-replay", "0")
    assert "test_racy.py::test_racy: replayed schedule '0' in " in res.stdout.str()
    assert ": no failure" in res.stdout.str()
