"""drivers/ib_core: mirrors drivers/infiniband/core (the ib_core module).

Loading "ib_core" creates its per-machine globals (the devices and clients
lists, kept in the module's state); drivers and ib_uverbs need it loaded
first, as their MODULE_DEPENDS say.
"""


def module_init(mod):
    """ib_core_init(): the device and client lists."""
    from drivers.ib_core.device import IbCoreState
    return IbCoreState()


def module_exit(mod):
    """ib_core_cleanup(): every device and client must be gone already."""
    state = mod.state
    if state.devices or state.clients:
        mod.machine.report_bug("ib_core_cleanup", f"unloaded with {state!r}")
