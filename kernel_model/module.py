"""Mirrors kernel/module/main.c: loading and unloading modules by name.

A module is a Python module under drivers/ or peermem_clients/ (or any
importable name, or a peer-memory client another package declares in the
`peermem.clients` entry-point group) defining `module_init()` and, optionally, `module_exit()`,
the two ends of module_init()/module_exit(), and `MODULE_DEPENDS`, the
modules whose symbols it uses: loading it loads those first (modprobe), and
they cannot be unloaded while it is loaded (EWOULDBLOCK, "in use by").  Loading runs init in the
machine's init task context and keeps the module's state per machine; a
module's refcount (try_module_get from open files) makes unloading fail with
EBUSY, as delete_module does.

Names are resolved at run time (importlib), as modprobe finds a .ko, so the
code that asks for a module - a CLI, a test - never imports drivers itself.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import inspect
import pkgutil
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kernel_model.current import running
from kernel_model.errno import EBUSY, EEXIST, ENOENT, EWOULDBLOCK, KernelError
from kernel_model.slab import counter_add
from kernel_model.trace import traced

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

SEARCH_PATH = ("drivers.", "peermem_clients.", "")


class module:
    """Mirrors struct module: name, refcount, and the per-machine instance state."""

    def __init__(self, name: str, code: Any, machine: Machine):
        self.name = name
        self.code = code
        self.machine = machine
        self.refcnt = 0
        self.state: Any = None  # what module_init returned: the driver's globals

    def __repr__(self) -> str:
        return f"module {self.name} refcnt={self.refcnt}"


def _find(name: str) -> Any:
    """The code of module `name`: drivers.<name>, peermem_clients.<name>, then <name>
    itself (any importable module, dotted names too), then the `peermem.clients` entry
    points.  A module that is found but fails to import raises its own error."""
    for prefix in SEARCH_PATH:
        full = prefix + name
        try:
            return importlib.import_module(full)
        except ModuleNotFoundError as e:
            # not there (the name or one of its parent packages is missing): look on
            if e.name is None or not (full == e.name or full.startswith(e.name + ".")):
                raise
    ep = _entry_points().get(name)
    if ep is not None:                   # a client another package installed
        return importlib.import_module(ep.value.split(":")[0])
    raise KernelError(ENOENT, f"request_module: module {name} not found")


PEER_CLIENT_GROUP = "peermem.clients"


def _entry_points() -> dict[str, importlib.metadata.EntryPoint]:
    """The peer-memory client modules installed packages declare (their entry points)."""
    return {ep.name: ep for ep in importlib.metadata.entry_points(group=PEER_CLIENT_GROUP)}


def peer_client_modules() -> list[tuple[str, str, str]]:
    """Every peer-memory client module that can be loaded by name: (name, origin, module),
    the built-in ones (peermem_clients/*.py defining module_init) first, then those of
    installed packages (entry point group `peermem.clients`, value "package.module").

    # EMU: stands in for modinfo over /lib/modules: what `peermem clients` lists.
    """
    out = []
    spec = importlib.util.find_spec("peermem_clients")
    for info in pkgutil.iter_modules(spec.submodule_search_locations or []):
        mod = importlib.import_module(f"peermem_clients.{info.name}")
        if hasattr(mod, "module_init"):
            out.append((info.name, "built-in", mod.__name__))
    for name, ep in sorted(_entry_points().items()):
        dist = ep.dist.name if ep.dist is not None else "?"
        out.append((name, f"installed ({dist})", ep.value.split(":")[0]))
    return out


@functools.cache
def _init_params(module_init: Callable) -> tuple[Any, bool]:
    """module_init's parameters and whether it takes **kwargs (then it checks its own):
    read once per module, as modinfo lists a module's parameters."""
    accepted = inspect.signature(module_init).parameters
    return accepted, any(a.kind is a.VAR_KEYWORD for a in accepted.values())


@traced
def load_module(machine: Machine, name: str, **params: Any) -> module:
    """Mirrors load_module() (insmod/modprobe): import, then run module_init(params)."""
    mods = machine_modules(machine)
    if name in mods:
        raise KernelError(EEXIST, f"load_module: module {name} already loaded")
    code = _find(name)
    for dep in getattr(code, "MODULE_DEPENDS", ()):  # modprobe: dependencies first
        if dep not in mods:
            load_module(machine, dep)
    accepted, takes_any = _init_params(code.module_init)
    unknown = [k for k in params if not takes_any and (k not in accepted or k == "mod")]
    if unknown:   # parse_args(): "Unknown parameter" fails the load
        raise KernelError(ENOENT, f"load_module: {name}: unknown parameter {unknown[0]!r}")
    mod = module(name, code, machine)
    with running(machine.init_task):
        mod.state = code.module_init(mod, **params)
    mods[name] = mod
    return mod


@traced
def delete_module(machine: Machine, name: str, force: bool = False) -> None:
    """Mirrors delete_module() (rmmod): EBUSY while in use, else module_exit().

    `force` is `rmmod -f` (O_TRUNC in the flags, try_force_unload()): a module
    whose refcount is not zero is unloaded anyway - module_exit runs with the
    references still held (a peer-memory client's exit then blocks in
    ib_unregister_peer_memory_client until its MRs are gone) - and the kernel
    is tainted TAINT_FORCED_RMMOD.  Modules that depend on it still refuse it.
    # EMU: `rmmod -f` works whatever the kernel configuration; a real kernel honours
    # it only when built with CONFIG_MODULE_FORCE_UNLOAD (else the refcount refuses
    # the unload); and a real kernel answers a held refcount with EWOULDBLOCK, where
    # the model says EBUSY.
    """
    mods = machine_modules(machine)
    mod = mods.get(name)
    if mod is None:
        raise KernelError(ENOENT, f"delete_module: module {name} not loaded")
    users = [m.name for m in mods.values() if name in getattr(m.code, "MODULE_DEPENDS", ())]
    if users:
        raise KernelError(EWOULDBLOCK, f"delete_module: module {name} is in use by: "
                          + " ".join(users))
    if mod.refcnt and not force:
        raise KernelError(EBUSY, f"delete_module: module {name} in use (refcnt {mod.refcnt})")
    if mod.refcnt:                       # try_force_unload(): add_taint(TAINT_FORCED_RMMOD)
        taints = machine.__dict__.setdefault("taints", set())
        taints.add("TAINT_FORCED_RMMOD")
        machine.dmesg.append(f"delete_module: forced unload of {name} "
                             f"(refcnt {mod.refcnt}): Disabling lock debugging due to "
                             "kernel taint")
    exit_fn = getattr(mod.code, "module_exit", None)
    with running(machine.init_task):
        if exit_fn is not None:
            exit_fn(mod)
    del mods[name]


def try_module_get(mod: module | None) -> bool:
    """Mirrors try_module_get(): pin a module while its code may run.  For partial-order
    reduction an add (counter_add): gets and puts of different tasks commute."""
    if mod is not None:
        counter_add(mod, "refcnt", 1)
    return True


def module_put(mod: module | None) -> None:
    """Mirrors module_put().  An add, as try_module_get: an unbalanced put underflows
    in whichever order the tasks' gets and puts run (only where it is reported moves)."""
    if mod is not None:
        if object.__getattribute__(mod, "refcnt") <= 0:
            mod.machine.report_bug("module_put", f"{mod} refcount underflow")
            return
        counter_add(mod, "refcnt", -1)


def machine_modules(machine: Machine) -> dict[str, module]:
    """The machine's loaded modules, in load order."""
    if not hasattr(machine, "modules"):
        machine.modules = {}
    return machine.modules


def unload_all(machine: Machine) -> None:
    """rmmod everything in reverse load order (machine shutdown)."""
    for name in reversed(list(machine_modules(machine))):
        delete_module(machine, name)
