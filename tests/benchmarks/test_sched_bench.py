"""What a task switch costs, and why the scheduler runs on greenlets.

Three ways to hand the one CPU from task to task, N round trips each:
  * sched       - the real thing: two kernel threads ping-pong through two
                  completions (complete -> wake -> wait_for_completion ->
                  block -> switch), counting SCHED.switches;
  * greenlet    - the bare mechanism under it: two greenlets switching;
  * thread baton - the alternative considered: two OS threads handing a
                  baton through locks (what a threading-based scheduler
                  would pay per switch).
Per-switch figures go in the closing notes; the test asserts only that
each contender really switched N times.
"""

from __future__ import annotations

import threading

from greenlet import greenlet

from kernel_model.emu.machine import Machine
from kernel_model.kthread import kthread_run
from kernel_model.locking import complete, init_completion, wait_for_completion
from kernel_model.sched import SCHED

N = 2000


def test_switch_sched(benchmark):
    m = Machine(ram_size=64 << 20)

    def run() -> int:
        with m.kernel():
            ping, pong = init_completion("ping"), init_completion("pong")

            def a() -> None:
                for _ in range(N):
                    complete(ping)
                    wait_for_completion(pong)

            def b() -> None:
                for _ in range(N):
                    wait_for_completion(ping)
                    complete(pong)

            before = SCHED.switches
            ta, tb = kthread_run(a, name="ping"), kthread_run(b, name="pong")
            ta.join()
            tb.join()
            return SCHED.switches - before

    switches = benchmark.pedantic(run, rounds=5, iterations=1)
    assert switches >= 2 * N


def test_switch_greenlet(benchmark):
    def run() -> int:
        count = [0]

        def a() -> None:
            for _ in range(N):
                count[0] += 1
                gb.switch()

        def b() -> None:
            while True:
                count[0] += 1
                ga.switch()

        ga, gb = greenlet(a), greenlet(b)
        ga.switch()
        return count[0]

    assert benchmark.pedantic(run, rounds=5, iterations=1) == 2 * N


def test_switch_thread_baton(benchmark):
    def run() -> int:
        la, lb = threading.Lock(), threading.Lock()
        la.acquire()
        lb.acquire()
        count = [0]

        def b() -> None:
            for _ in range(N):
                lb.acquire()
                count[0] += 1
                la.release()

        t = threading.Thread(target=b)
        t.start()
        for _ in range(N):
            count[0] += 1
            lb.release()
            la.acquire()
        t.join()
        return count[0]

    assert benchmark.pedantic(run, rounds=5, iterations=1) == 2 * N
