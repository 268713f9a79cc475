"""pyverbs.providers.mlx5.mlx5dv_mkey: mlx5 indirect and signature mkeys
(mlx5dv_create_mkey): not emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Mlx5Mkey(NotEmulated):
    """Mirrors pyverbs' Mlx5Mkey: not emulated."""

    _VERB = "create Mlx5Mkey"


class Mlx5MkeyConfAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5MkeyConfAttr."""

    _FIELDS = ('conf_flags', 'comp_mask')


class Mlx5MkeyErr(NotEmulated):
    """Mirrors pyverbs' Mlx5MkeyErr: not emulated."""

    _VERB = "create Mlx5MkeyErr"


class Mlx5MrInterleaved(NotEmulated):
    """Mirrors pyverbs' Mlx5MrInterleaved: not emulated."""

    _VERB = "create Mlx5MrInterleaved"


class Mlx5SigBlockAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5SigBlockAttr."""

    _FIELDS = ('mem', 'wire', 'flags', 'check_mask', 'copy_mask', 'comp_mask')


class Mlx5SigBlockDomain(AttrStruct):
    """Mirrors pyverbs' Mlx5SigBlockDomain."""

    _FIELDS = ('sig_type', 'dif', 'crc', 'block_size', 'comp_mask')


class Mlx5SigCrc(AttrStruct):
    """Mirrors pyverbs' Mlx5SigCrc."""

    _FIELDS = ('crc_type', 'seed')


class Mlx5SigErr(NotEmulated):
    """Mirrors pyverbs' Mlx5SigErr: not emulated."""

    _VERB = "create Mlx5SigErr"


class Mlx5SigT10Dif(AttrStruct):
    """Mirrors pyverbs' Mlx5SigT10Dif."""

    _FIELDS = ('bg_type', 'bg', 'app_tag', 'ref_tag', 'flags')
