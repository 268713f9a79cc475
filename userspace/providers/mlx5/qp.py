"""Mirrors rdma-core providers/mlx5/qp.c: posting work requests and ringing the doorbell.
"""

from __future__ import annotations

from typing import Any


def mlx5_init_qp_indices(qp: Any) -> None:
    """Mirrors mlx5_init_qp_indices(): both queues back to empty (after RESET)."""
    qp.sq.head = qp.sq.tail = qp.sq.cur_post = 0
    qp.rq.head = qp.rq.tail = 0
