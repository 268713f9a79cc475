"""Mirrors rdma-core libibverbs/driver.h and the driver loading of init.c: how a
provider plugs into libibverbs.

A provider describes itself with a `verbs_context_ops` table and registers it,
keyed by the PCI vendor id its hca_table matches, with `verbs_register_driver()`
when it is loaded (rdma-core's PROVIDER_DRIVER() constructor).  libibverbs never
names a provider in its code: `load_drivers()` loads the ones the configuration
lists (rdma-core dlopen()s each library /etc/libibverbs.d names), and their
registration fills the table `ibv_get_device_list()` matches devices against.
"""

from __future__ import annotations

import importlib
from typing import Any

import attrs

# /etc/libibverbs.d: the provider libraries to load (here, modules by name)
IBV_DRIVERS = ("userspace.providers.mlx5.verbs",)


@attrs.define(eq=False)
class verbs_context_ops:
    """Mirrors struct verbs_context_ops: a provider's entry points."""

    alloc_context: Any = None
    free_context: Any = None
    query_port: Any = None
    query_device_ex: Any = None
    query_rt_values: Any = None
    alloc_pd: Any = None
    dealloc_pd: Any = None
    alloc_parent_domain: Any = None
    reg_mr: Any = None
    rereg_mr: Any = None
    alloc_mw: Any = None
    dealloc_mw: Any = None
    bind_mw: Any = None
    dereg_mr: Any = None
    create_cq: Any = None
    create_cq_ex: Any = None
    resize_cq: Any = None
    req_notify_cq: Any = None
    cq_event: Any = None
    destroy_cq: Any = None
    create_qp: Any = None
    create_qp_ex: Any = None
    modify_qp: Any = None
    query_qp: Any = None
    destroy_qp: Any = None
    create_srq: Any = None
    create_srq_ex: Any = None
    modify_srq: Any = None
    query_srq: Any = None
    get_srq_num: Any = None
    destroy_srq: Any = None
    post_srq_recv: Any = None
    open_xrcd: Any = None
    close_xrcd: Any = None
    create_ah: Any = None
    destroy_ah: Any = None
    post_send: Any = None
    post_recv: Any = None
    poll_cq: Any = None
    alloc_dm: Any = None
    free_dm: Any = None
    memcpy_to_dm: Any = None
    memcpy_from_dm: Any = None
    reg_dm_mr: Any = None
    advise_mr: Any = None
    # receive work queues and RSS indirection tables (wq.py)
    create_wq: Any = None
    modify_wq: Any = None
    destroy_wq: Any = None
    create_rwq_ind_table: Any = None
    destroy_rwq_ind_table: Any = None
    # sharing a context's objects (ibv_import_device / _pd / _mr / _dm)
    import_context: Any = None
    import_pd: Any = None
    unimport_pd: Any = None
    import_mr: Any = None
    unimport_mr: Any = None
    import_dm: Any = None
    unimport_dm: Any = None


# vendor id -> the registered provider's ops (init.c's driver_list)
_drivers: dict[int, verbs_context_ops] = {}


def verbs_register_driver(vendor_id: int, ops: verbs_context_ops) -> None:
    """Mirrors verbs_register_driver(): a loaded provider offers its ops for the
    devices of vendor_id."""
    _drivers[vendor_id] = ops


def load_drivers() -> dict[int, verbs_context_ops]:
    """Mirrors load_drivers(): load every configured provider (dlopen; a provider
    already loaded registers only once) and return the driver table."""
    for name in IBV_DRIVERS:
        importlib.import_module(name)
    return _drivers
