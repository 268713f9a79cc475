"""Mirrors kernel/irq/manage.c (request_irq, free_irq) for a PCI function's MSI-X
vectors, and the delivery a device raises (the MSI-X write -> generic_handle_irq).

A driver attaches a handler to vector `nr` of its PCI function (pci_irq_vector
+ request_irq); a device model raises the vector after writing what the handler
is to read (an EQE), and the handler runs.

# EMU: no interrupt controller, no CPUs to interrupt: the handler runs at once on
# the raising device's task (the engine's), which stands in for hard-irq
# context - it must not sleep - as init_task (an interrupt taken on an idle
# CPU runs in the idle task's context) unless the raising task is in kernel
# context already.  An interrupt on a vector with no handler is counted as
# spurious and lost, as an unrequested MSI-X vector's would be.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kernel_model.current import current_or_none, running
from kernel_model.errno import EBUSY, EINVAL, KernelError
from kernel_model.trace import traced

IRQ_NONE, IRQ_HANDLED = 0, 1


def _actions(pdev: Any) -> dict[int, tuple[Callable[[int, Any], int], Any, str]]:
    acts = pdev.__dict__.get("irq_actions")
    if acts is None:
        acts = pdev.irq_actions = {}
    return acts


@traced
def request_irq(pdev: Any, nr: int, handler: Callable[[int, Any], int], name: str,
                dev_id: Any) -> None:
    """Mirrors request_irq(pci_irq_vector(pdev, nr), ...): EBUSY when the vector has
    a handler already, EINVAL for a negative vector."""
    if nr < 0:
        raise KernelError(EINVAL, f"request_irq: vector {nr}")
    acts = _actions(pdev)
    if nr in acts:
        raise KernelError(EBUSY, f"request_irq: vector {nr} already has {acts[nr][2]}")
    acts[nr] = (handler, dev_id, name)


@traced
def free_irq(pdev: Any, nr: int, dev_id: Any) -> None:
    """Mirrors free_irq(): detach the handler dev_id requested (a WARN if none)."""
    acts = _actions(pdev)
    act = acts.get(nr)
    if act is None or act[1] is not dev_id:
        pdev.machine.report_bug("free_irq", f"trying to free already-free IRQ {nr}")
        return
    del acts[nr]


def msix_raise(pdev: Any, nr: int) -> int:
    """The device side: MSI-X vector nr fires; its handler's answer, IRQ_NONE if none."""
    act = _actions(pdev).get(nr)
    if act is None:
        pdev.__dict__["spurious_irqs"] = pdev.__dict__.get("spurious_irqs", 0) + 1
        return IRQ_NONE
    if current_or_none() is not None:
        return act[0](nr, act[1])
    with running(pdev.machine.init_task):
        return act[0](nr, act[1])
