"""pyverbs.providers.efa.efadv: the EFA provider's direct verbs: the emulated host has
no EFA device.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from typing import Any

from userspace.pyverbs.base import AttrStruct, NotEmulated, unsupported


class EfaAH(NotEmulated):
    """Mirrors pyverbs' EfaAH: not emulated."""

    _VERB = "create EfaAH"


class EfaCQ(NotEmulated):
    """Mirrors pyverbs' EfaCQ: not emulated."""

    _VERB = "create EfaCQ"


class EfaContext(NotEmulated):
    """Mirrors pyverbs' EfaContext: not emulated."""

    _VERB = "create EfaContext"


class EfaDVAHAttr(AttrStruct):
    """Mirrors pyverbs' EfaDVAHAttr."""

    _FIELDS = ()


class EfaDVCQInitAttr(AttrStruct):
    """Mirrors pyverbs' EfaDVCQInitAttr."""

    _FIELDS = ('wc_flags',)


class EfaDVDeviceAttr(AttrStruct):
    """Mirrors pyverbs' EfaDVDeviceAttr."""

    _FIELDS = ()


class EfaQPInitAttr(AttrStruct):
    """Mirrors pyverbs' EfaQPInitAttr."""

    _FIELDS = ()


class SRDQP(NotEmulated):
    """Mirrors pyverbs' SRDQP: not emulated."""

    _VERB = "create SRDQP"


class SRDQPEx(NotEmulated):
    """Mirrors pyverbs' SRDQPEx: not emulated."""

    _VERB = "create SRDQPEx"


def bitmask_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("bitmask_to_str: not emulated")


def dev_cap_to_str(*args: Any, **kwargs: Any) -> Any:
    raise unsupported("dev_cap_to_str: not emulated")
