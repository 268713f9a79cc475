"""drivers/ib_core: mirrors drivers/infiniband/core (the ib_core module).

Loading "ib_core" creates its per-machine globals (the devices and clients
lists, kept in the module's state); drivers and ib_uverbs need it loaded
first, as their MODULE_DEPENDS say.
"""


def module_init(mod, ofed: str = "25.04", late_invalidate_fix: int = 1):
    """ib_core_init(): the device and client lists.

    `ofed` (# EMU: a module parameter standing for which MLNX_OFED release's
    ib_core this is) picks the peer-memory core's design: "25.04" and later
    (the default), "5.1" up to "24.10" (ib_umem_stop_invalidation_notifier's
    lock condition inverted), or "4.9" and earlier (the ticket design,
    peer_mem.py's last section).  EINVAL for a malformed release.

    `late_invalidate_fix` (# EMU: not an MLNX_OFED parameter; the model's proposed
    fix for a NULL dereference in the released core, on by default): 1 is the
    model's proposed fix for an invalidation that took its umem reference but got
    mapping_lock only after the umem was stopped and released - it does nothing;
    0 is the core as released (5.1b to 25.04 peer_mem.c, ib_invalidate_peer_memory():
    a NULL dereference of the client release cleared).  EINVAL for another value.
    """
    from drivers.ib_core.device import IbCoreState
    from drivers.ib_core.peer_mem import parse_ofed_release
    from kernel_model.errno import EINVAL, KernelError
    if late_invalidate_fix not in (0, 1):
        raise KernelError(EINVAL, "ib_core_init: invalid value for late_invalidate_fix "
                          f"{late_invalidate_fix}")
    state = IbCoreState(parse_ofed_release(ofed))
    state.peer.late_invalidate_fix = bool(late_invalidate_fix)
    return state


def module_exit(mod):
    """ib_core_cleanup(): every device and client must be gone already."""
    state = mod.state
    if state.devices or state.clients:
        mod.machine.report_bug("ib_core_cleanup", f"unloaded with {state!r}")
