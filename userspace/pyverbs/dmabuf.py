"""pyverbs.dmabuf: a dma-buf from a GPU's render node (DmaBuf over DRM GEM); the
emulated GPUs export dma-bufs through the nvidia driver instead.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import NotEmulated


class DmaBuf(NotEmulated):
    """Mirrors pyverbs' DmaBuf: not emulated."""

    _VERB = "create DmaBuf"
