"""drivers/ib_core/verbs.py: qp_state_table and ib_modify_qp_is_ok (pure: no machine)."""

from __future__ import annotations

import pytest

from drivers.ib_core.ib_verbs import (
    IB_QP_ACCESS_FLAGS,
    IB_QP_ALT_PATH,
    IB_QP_AV,
    IB_QP_CUR_STATE,
    IB_QP_DEST_QPN,
    IB_QP_EN_SQD_ASYNC_NOTIFY,
    IB_QP_MAX_DEST_RD_ATOMIC,
    IB_QP_MAX_QP_RD_ATOMIC,
    IB_QP_MIN_RNR_TIMER,
    IB_QP_PATH_MTU,
    IB_QP_PKEY_INDEX,
    IB_QP_PORT,
    IB_QP_QKEY,
    IB_QP_RETRY_CNT,
    IB_QP_RNR_RETRY,
    IB_QP_RQ_PSN,
    IB_QP_SQ_PSN,
    IB_QP_STATE,
    IB_QP_TIMEOUT,
    IB_QPS_ERR,
    IB_QPS_INIT,
    IB_QPS_RESET,
    IB_QPS_RTR,
    IB_QPS_RTS,
    IB_QPS_SQD,
    IB_QPS_SQE,
    IB_QPT_RC,
    IB_QPT_UC,
    IB_QPT_UD,
)
from drivers.ib_core.verbs import ib_modify_qp_is_ok, qp_state_table

S = IB_QP_STATE
RC_INIT = S | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_ACCESS_FLAGS
UD_INIT = S | IB_QP_PKEY_INDEX | IB_QP_PORT | IB_QP_QKEY
UC_RTR = S | IB_QP_AV | IB_QP_PATH_MTU | IB_QP_DEST_QPN | IB_QP_RQ_PSN
RC_RTR = UC_RTR | IB_QP_MAX_DEST_RD_ATOMIC | IB_QP_MIN_RNR_TIMER
RC_RTS = S | IB_QP_TIMEOUT | IB_QP_RETRY_CNT | IB_QP_RNR_RETRY | IB_QP_SQ_PSN | \
    IB_QP_MAX_QP_RD_ATOMIC


@pytest.mark.parametrize("cur, new, type_, mask", [
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_RC, RC_INIT),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_UC, RC_INIT),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_UD, UD_INIT),
    (IB_QPS_RESET, IB_QPS_RESET, IB_QPT_RC, S),
    (IB_QPS_INIT, IB_QPS_INIT, IB_QPT_RC, S | IB_QP_ACCESS_FLAGS),      # all optional
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_RC, RC_RTR),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_RC, RC_RTR | IB_QP_ALT_PATH | IB_QP_PKEY_INDEX),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_UC, UC_RTR),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_UD, S),                             # nothing required
    (IB_QPS_RTR, IB_QPS_RTS, IB_QPT_RC, RC_RTS | IB_QP_MIN_RNR_TIMER | IB_QP_CUR_STATE),
    (IB_QPS_RTR, IB_QPS_RTS, IB_QPT_UC, S | IB_QP_SQ_PSN),
    (IB_QPS_RTR, IB_QPS_RTS, IB_QPT_UD, S | IB_QP_SQ_PSN | IB_QP_QKEY),
    (IB_QPS_RTS, IB_QPS_RTS, IB_QPT_RC, IB_QP_MIN_RNR_TIMER),           # no state: RTS -> RTS
    (IB_QPS_RTS, IB_QPS_SQD, IB_QPT_RC, S | IB_QP_EN_SQD_ASYNC_NOTIFY),
    (IB_QPS_SQD, IB_QPS_SQD, IB_QPT_RC, S | IB_QP_AV | IB_QP_RNR_RETRY | IB_QP_PORT),
    (IB_QPS_SQD, IB_QPS_RTS, IB_QPT_RC, S | IB_QP_CUR_STATE),
    (IB_QPS_SQE, IB_QPS_RTS, IB_QPT_UD, S | IB_QP_QKEY),
    (IB_QPS_SQE, IB_QPS_RTS, IB_QPT_UC, S | IB_QP_ACCESS_FLAGS),
] + [(s, IB_QPS_ERR, t, S) for s in (IB_QPS_INIT, IB_QPS_RTR, IB_QPS_RTS, IB_QPS_SQD,
                                     IB_QPS_SQE, IB_QPS_ERR)
     for t in (IB_QPT_RC, IB_QPT_UC, IB_QPT_UD)]
  + [(s, IB_QPS_RESET, IB_QPT_RC, S) for s in range(IB_QPS_ERR + 1)])
def test_allowed(cur, new, type_, mask):
    assert ib_modify_qp_is_ok(cur, new, type_, mask)


@pytest.mark.parametrize("cur, new, type_, mask, why", [
    (IB_QPS_RESET, IB_QPS_RTR, IB_QPT_RC, RC_RTR, "no such transition"),
    (IB_QPS_RESET, IB_QPS_RTS, IB_QPT_RC, RC_RTS, "no such transition"),
    (IB_QPS_RESET, IB_QPS_ERR, IB_QPT_RC, S, "no such transition"),
    (IB_QPS_INIT, IB_QPS_RTS, IB_QPT_RC, RC_RTS, "no such transition"),
    (IB_QPS_ERR, IB_QPS_INIT, IB_QPT_RC, RC_INIT, "no such transition"),
    (IB_QPS_RTR, IB_QPS_SQD, IB_QPT_RC, S, "no such transition"),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_RC, RC_INIT & ~IB_QP_ACCESS_FLAGS, "required missing"),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_UD, RC_INIT, "required QKEY missing, ACCESS extra"),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_RC, RC_RTR & ~IB_QP_MIN_RNR_TIMER, "required missing"),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_RC, RC_RTR & ~IB_QP_AV, "required missing"),
    (IB_QPS_RTR, IB_QPS_RTS, IB_QPT_RC, RC_RTS & ~IB_QP_TIMEOUT, "required missing"),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_UC, UC_RTR | IB_QP_MAX_DEST_RD_ATOMIC, "not optional"),
    (IB_QPS_INIT, IB_QPS_RTR, IB_QPT_RC, RC_RTR | IB_QP_SQ_PSN, "not optional"),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_RC, RC_INIT | IB_QP_QKEY, "not optional"),
    (IB_QPS_RTS, IB_QPS_RTS, IB_QPT_RC, IB_QP_RNR_RETRY, "not optional"),
    (IB_QPS_RTS, IB_QPS_RTS, IB_QPT_UD, IB_QP_ACCESS_FLAGS, "not optional"),
    (IB_QPS_SQE, IB_QPS_RTS, IB_QPT_UD, S | IB_QP_ACCESS_FLAGS, "not optional"),
    (IB_QPS_INIT, IB_QPS_ERR, IB_QPT_RC, S | IB_QP_PORT, "not optional"),
    (IB_QPS_INIT, IB_QPS_INIT, IB_QPT_RC, S | IB_QP_CUR_STATE, "CUR_STATE from INIT"),
    (IB_QPS_RESET, IB_QPS_INIT, IB_QPT_RC, RC_INIT | IB_QP_CUR_STATE, "CUR_STATE from RESET"),
])
def test_refused(cur, new, type_, mask, why):
    assert not ib_modify_qp_is_ok(cur, new, type_, mask), why


def test_the_table_has_every_row_of_the_real_one():
    pairs = set(qp_state_table)
    assert {(s, IB_QPS_RESET) for s in range(IB_QPS_ERR + 1)} <= pairs
    assert {(s, IB_QPS_ERR) for s in range(IB_QPS_INIT, IB_QPS_ERR + 1)} <= pairs
    assert len(pairs) == 22
    # required and optional never overlap
    for (req, opt) in qp_state_table.values():
        for qpt in set(req) | set(opt):
            assert not req.get(qpt, 0) & opt.get(qpt, 0)
