"""pyverbs.providers.mlx5.dr_action: mlx5 software steering (DR): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from typing import Any

from userspace.pyverbs.base import AttrStruct, NotEmulated, unsupported


class DrAction(NotEmulated):
    """Mirrors pyverbs' DrAction: not emulated."""

    _VERB = "create DrAction"


class DrActionDefMiss(NotEmulated):
    """Mirrors pyverbs' DrActionDefMiss: not emulated."""

    _VERB = "create DrActionDefMiss"


class DrActionDestArray(NotEmulated):
    """Mirrors pyverbs' DrActionDestArray: not emulated."""

    _VERB = "create DrActionDestArray"


class DrActionDestAttr(AttrStruct):
    """Mirrors pyverbs' DrActionDestAttr."""

    _FIELDS = ('action_type', 'dest', 'reformat')


class DrActionDestTable(NotEmulated):
    """Mirrors pyverbs' DrActionDestTable: not emulated."""

    _VERB = "create DrActionDestTable"


class DrActionDestTir(NotEmulated):
    """Mirrors pyverbs' DrActionDestTir: not emulated."""

    _VERB = "create DrActionDestTir"


class DrActionDrop(NotEmulated):
    """Mirrors pyverbs' DrActionDrop: not emulated."""

    _VERB = "create DrActionDrop"


class DrActionFlowCounter(NotEmulated):
    """Mirrors pyverbs' DrActionFlowCounter: not emulated."""

    _VERB = "create DrActionFlowCounter"


class DrActionFlowMeter(NotEmulated):
    """Mirrors pyverbs' DrActionFlowMeter: not emulated."""

    _VERB = "create DrActionFlowMeter"


class DrActionFlowSample(NotEmulated):
    """Mirrors pyverbs' DrActionFlowSample: not emulated."""

    _VERB = "create DrActionFlowSample"


class DrActionIBPort(NotEmulated):
    """Mirrors pyverbs' DrActionIBPort: not emulated."""

    _VERB = "create DrActionIBPort"


class DrActionModify(NotEmulated):
    """Mirrors pyverbs' DrActionModify: not emulated."""

    _VERB = "create DrActionModify"


class DrActionPacketReformat(NotEmulated):
    """Mirrors pyverbs' DrActionPacketReformat: not emulated."""

    _VERB = "create DrActionPacketReformat"


class DrActionPopVLan(NotEmulated):
    """Mirrors pyverbs' DrActionPopVLan: not emulated."""

    _VERB = "create DrActionPopVLan"


class DrActionPushVLan(NotEmulated):
    """Mirrors pyverbs' DrActionPushVLan: not emulated."""

    _VERB = "create DrActionPushVLan"


class DrActionQp(NotEmulated):
    """Mirrors pyverbs' DrActionQp: not emulated."""

    _VERB = "create DrActionQp"


class DrActionTag(NotEmulated):
    """Mirrors pyverbs' DrActionTag: not emulated."""

    _VERB = "create DrActionTag"


class DrActionVPort(NotEmulated):
    """Mirrors pyverbs' DrActionVPort: not emulated."""

    _VERB = "create DrActionVPort"


class DrFlowMeterAttr(AttrStruct):
    """Mirrors pyverbs' DrFlowMeterAttr."""

    _FIELDS = ('next_table', 'active', 'reg_c_index', 'flow_meter_parameter')


class DrFlowSamplerAttr(AttrStruct):
    """Mirrors pyverbs' DrFlowSamplerAttr."""

    _FIELDS = ('sample_ratio', 'default_next_table', 'sample_actions', 'action')


def be64toh(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("be64toh: not emulated")
