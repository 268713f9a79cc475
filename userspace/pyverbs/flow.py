"""pyverbs.flow: flow steering (ibv_create_flow): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from typing import Any

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Flow(NotEmulated):
    """Mirrors pyverbs' Flow: not emulated."""

    _VERB = "create Flow"


class FlowAction(NotEmulated):
    """Mirrors pyverbs' FlowAction: not emulated."""

    _VERB = "create FlowAction"


class FlowAttr(AttrStruct):
    """Mirrors pyverbs' FlowAttr."""

    _FIELDS = ('num_of_specs', 'flow_type', 'priority', 'port', 'flags')

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.specs: list = []   # the specs a Flow would match on, appended by the caller

    @property
    def type(self) -> int:
        """ibv_flow_attr.type (the constructor's flow_type)."""
        return self.flow_type
