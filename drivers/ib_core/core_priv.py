"""Mirrors drivers/infiniband/core/core_priv.h: what ib_core's own files share.

ib_core's globals (the devices xarray, the clients list, the peer-memory core's
state) live in the ib_core module's state (device.py's IbCoreState), one per
machine; every ib_core file that needs them finds them here, so peer_mem.py does
not import device.py to reach them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kernel_model.current import current
from kernel_model.errno import ENODEV, KernelError

if TYPE_CHECKING:
    from drivers.ib_core.device import IbCoreState


def _core() -> IbCoreState:
    """ib_core's globals on the current machine; ENODEV when ib_core is not loaded."""
    mod = current().machine.modules.get("ib_core")
    if mod is None:
        raise KernelError(ENODEV, "ib_core: module not loaded")
    return mod.state
