"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/events.c: async events to interfaces.

mlx5_events_start() puts forward_event on the async EQ's NOTIFY_ANY chain: every
asynchronous EQE (eq.c's mlx5_eq_async_int) is passed on to the device's
interface chain, events->nh, which the interfaces join with
mlx5_notifier_register() - mlx5_ib's SRQ table (srq_event_notifier) among them.

# EMU: of the core's own consumers of events (port state, temperature, PPS, the
# firmware tracer, general events) none is modelled; only the forwarding is.
# The events struct is made at start (the kernel's mlx5_events_init runs once at
# probe, before the EQs) - nothing registers on it before then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drivers.mlx5_core.eq import (
    MLX5_EVENT_TYPE_NOTIFY_ANY,
    mlx5_eq_notifier_register,
    mlx5_eq_notifier_unregister,
    mlx5_nb,
)
from kernel_model.notifier import (
    ATOMIC_INIT_NOTIFIER_HEAD,
    NOTIFY_OK,
    atomic_notifier_call_chain,
    atomic_notifier_chain_register,
    atomic_notifier_chain_unregister,
    atomic_notifier_head,
    notifier_block,
)
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.driver import mlx5_core_dev


class mlx5_events:
    """Mirrors struct mlx5_events: the interfaces' chain and the EQ notifiers."""

    def __init__(self, dev: mlx5_core_dev):
        self.dev = dev
        self.nh: atomic_notifier_head = ATOMIC_INIT_NOTIFIER_HEAD("events->nh")
        self.notifiers: list[mlx5_nb] = []

    def __repr__(self) -> str:
        return f"mlx5_events {len(self.nh.head)} interface notifiers"


@traced
def forward_event(nb: mlx5_nb, event: int, data: Any) -> int:
    """Mirrors forward_event(): an async EQE to the interfaces' chain."""
    events: mlx5_events = nb.ctx
    atomic_notifier_call_chain(events.nh, event, data)
    return NOTIFY_OK


@traced
def mlx5_events_start(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_events_init() + mlx5_events_start(): forward_event on NOTIFY_ANY."""
    events = dev.priv.events = mlx5_events(dev)
    nb = mlx5_nb(forward_event, MLX5_EVENT_TYPE_NOTIFY_ANY)
    nb.ctx = events
    mlx5_eq_notifier_register(dev, nb)
    events.notifiers.append(nb)


@traced
def mlx5_events_stop(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_events_stop() + mlx5_events_cleanup(): the EQ notifiers off."""
    events = getattr(dev.priv, "events", None)
    if events is None:
        return
    for nb in reversed(events.notifiers):
        mlx5_eq_notifier_unregister(dev, nb)
    events.notifiers.clear()
    dev.priv.events = None


@traced
def mlx5_notifier_register(dev: mlx5_core_dev, nb: notifier_block) -> int:
    """Mirrors mlx5_notifier_register(): an interface joins the async events."""
    return atomic_notifier_chain_register(dev.priv.events.nh, nb)


@traced
def mlx5_notifier_unregister(dev: mlx5_core_dev, nb: notifier_block) -> int:
    """Mirrors mlx5_notifier_unregister()."""
    return atomic_notifier_chain_unregister(dev.priv.events.nh, nb)
