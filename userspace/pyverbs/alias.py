"""Make `import pyverbs` load this package - only when asked to.

rdma-core's compiled pyverbs may be installed next to the project; importing the
emulated face must be a deliberate choice.  install() puts a finder first on
sys.meta_path that answers every `pyverbs` and `pyverbs.X` import with the module
`userspace.pyverbs[.X]` (the same module object under both names, so isinstance and
enum identity hold across them); uninstall() takes it away again.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

ALIAS, TARGET = "pyverbs", "userspace.pyverbs"


class _PyverbsAlias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: object = None,
                  target: object = None) -> ModuleSpec | None:
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self,
                                               is_package=fullname == ALIAS or
                                               hasattr(importlib.import_module(real),
                                                       "__path__"))

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module(TARGET + spec.name[len(ALIAS):])

    def exec_module(self, module: ModuleType) -> None:
        """The module ran when it was imported under its own name."""


_finder = _PyverbsAlias()


def install() -> None:
    """From now on `pyverbs` is the emulated face (RuntimeError if another pyverbs
    was imported already: the two must not mix in one interpreter)."""
    loaded = sys.modules.get(ALIAS)
    if loaded is not None and not loaded.__name__.startswith(TARGET):
        raise RuntimeError(f"pyverbs alias: another pyverbs ({loaded.__file__}) is "
                           "already imported")
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if sys.modules[name] is not sys.modules.get(TARGET + name[len(ALIAS):]):
            del sys.modules[name]  # an alias of a copy since re-imported: map afresh
    if _finder not in sys.meta_path:
        sys.meta_path.insert(0, _finder)


def uninstall() -> None:
    """Undo install(): forget the aliased names (the modules stay importable as
    userspace.pyverbs)."""
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        if sys.modules[name].__name__.startswith(TARGET):
            del sys.modules[name]


def installed() -> bool:
    return _finder in sys.meta_path
