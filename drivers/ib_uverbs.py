"""The ib_uverbs module (drivers/infiniband/core/uverbs_main.c's module_init).

Registers the uverbs client with ib_core, so every RDMA device gets its
/dev/infiniband/uverbsN, and publishes /sys/class/infiniband_verbs/abi_version.
The code lives in drivers/ib_core/uverbs_*.py, beside the rest of core/.
"""

from __future__ import annotations

from drivers.ib_core.device import ib_register_client, ib_unregister_client
from drivers.ib_core.uverbs_main import UverbsState
from kernel_model.current import current
from kernel_model.sysfs import sysfs_create_file
from kernel_model.uapi.ib_user_verbs import IB_USER_VERBS_ABI_VERSION

MODULE_DEPENDS = ("ib_core",)


def module_init(mod):
    """ib_uverbs_init()."""
    state = UverbsState(mod)
    sysfs_create_file("/sys/class/infiniband_verbs/abi_version",
                      lambda: f"{IB_USER_VERBS_ABI_VERSION}\n")
    ib_register_client(state.client)
    return state


def module_exit(mod):
    """ib_uverbs_cleanup()."""
    ib_unregister_client(mod.state.client)
    current().machine.chrdevs.pop("/sys/class/infiniband_verbs/abi_version", None)
