"""pyverbs.wq: work queues and RSS indirection tables (ibv_create_wq): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class RwqIndTable(NotEmulated):
    """Mirrors pyverbs' RwqIndTable: not emulated."""

    _VERB = "create RwqIndTable"


class RwqIndTableInitAttr(AttrStruct):
    """Mirrors pyverbs' RwqIndTableInitAttr."""

    _FIELDS = ('log_ind_tbl_size', 'wqs_list', 'comp_mask')


class RxHashConf(AttrStruct):
    """Mirrors pyverbs' RxHashConf."""

    _FIELDS = ('rx_hash_function', 'rx_hash_key_len', 'rx_hash_key', 'rx_hash_fields_mask')


class WQ(NotEmulated):
    """Mirrors pyverbs' WQ: not emulated."""

    _VERB = "create WQ"


class WQAttr(AttrStruct):
    """Mirrors pyverbs' WQAttr."""

    _FIELDS = ('attr_mask', 'wq_state', 'curr_wq_state', 'flags', 'flags_mask')


class WQInitAttr(AttrStruct):
    """Mirrors pyverbs' WQInitAttr."""

    _FIELDS = ('wq_context', 'wq_pd', 'wq_cq', 'wq_type', 'max_wr', 'max_sge', 'comp_mask',
               'create_flags')
