"""Mirrors rdma-core providers/mlx5/cq.c: polling completions and cleaning a CQ.

A CQ is a ring of 64-byte CQEs in the process's memory that the HCA writes
by DMA.  Software owns a CQE when its owner bit equals the parity of the
pass the consumer index is on (ci & ncqe) and its opcode is not INVALID; the
HCA flips the expected parity each time it wraps.  After polling, the
consumer index goes to the CQ's doorbell record (big-endian, 24 bits), which
is how the HCA knows room was made.
"""

from __future__ import annotations
