"""pyverbs.providers.mlx5.mlx5dv_crypto: mlx5 crypto (DEKs, crypto login): not
emulated.

The names exist so that programs importing them load; creating one of its objects
fails with EOPNOTSUPP (see userspace/pyverbs/base.py, NotEmulated), which the
rdma-core tests report as a skip.  docs/pyverbs.md lists what is emulated.
"""

from __future__ import annotations

from userspace.pyverbs.base import AttrStruct, NotEmulated


class Mlx5CryptoAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5CryptoAttr."""

    _FIELDS = ('crypto_standard', 'encrypt_on_tx', 'signature_crypto_order',
               'data_unit_size', 'initial_tweak', 'dek', 'keytag', 'comp_mask')


class Mlx5CryptoExtLoginAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5CryptoExtLoginAttr."""

    _FIELDS = ('credential', 'credential_len', 'credential_id', 'import_kek_id')


class Mlx5CryptoLogin(NotEmulated):
    """Mirrors pyverbs' Mlx5CryptoLogin: not emulated."""

    _VERB = "create Mlx5CryptoLogin"


class Mlx5CryptoLoginAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5CryptoLoginAttr."""

    _FIELDS = ('credential', 'credential_id', 'import_kek_id')


class Mlx5DEK(NotEmulated):
    """Mirrors pyverbs' Mlx5DEK: not emulated."""

    _VERB = "create Mlx5DEK"


class Mlx5DEKAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DEKAttr."""

    _FIELDS = ()


class Mlx5DEKInitAttr(AttrStruct):
    """Mirrors pyverbs' Mlx5DEKInitAttr."""

    _FIELDS = ('pd', 'key_size', 'has_keytag', 'key_purpose', 'opaque', 'key', 'comp_mask',
               'crypto_login')
