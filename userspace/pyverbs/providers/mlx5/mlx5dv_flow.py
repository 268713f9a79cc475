"""pyverbs.providers.mlx5.mlx5dv_flow: mlx5 flow steering (mlx5dv_create_flow): not
emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Mlx5Flow(NotEmulated):
    """Mirrors pyverbs' Mlx5Flow: not emulated."""

    _VERB = "create Mlx5Flow"


class Mlx5FlowActionAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5FlowActionAttr."""

    _FIELDS = ('action_type', 'qp', 'flow_action')


class Mlx5FlowMatchParameters(NotEmulated):
    """Mirrors pyverbs' Mlx5FlowMatchParameters: not emulated."""

    _VERB = "create Mlx5FlowMatchParameters"


class Mlx5FlowMatcher(NotEmulated):
    """Mirrors pyverbs' Mlx5FlowMatcher: not emulated."""

    _VERB = "create Mlx5FlowMatcher"


class Mlx5FlowMatcherAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5FlowMatcherAttr."""

    _FIELDS = ('match_mask', 'attr_type', 'flags', 'priority', 'match_criteria_enable',
               'comp_mask', 'ft_type')


class Mlx5PacketReformatFlowAction(NotEmulated):
    """Mirrors pyverbs' Mlx5PacketReformatFlowAction: not emulated."""

    _VERB = "create Mlx5PacketReformatFlowAction"
