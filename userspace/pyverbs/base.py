"""pyverbs.base: the base classes every pyverbs object derives from.

PyverbsObject carries a logger; PyverbsCM is a context manager whose close() frees
the C object.  Closing is idempotent, and closing a parent closes its children first
(a Context closes its PDs, a PD its MRs and QPs), as pyverbs' weak-reference sets do,
so a test's `ctx.close()` tears down in the order the kernel needs.
"""

from __future__ import annotations

import errno
import itertools
import logging
import operator
import threading
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from kernel_model.emu.process import SegmentationFault
from userspace.pyverbs import host
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError

T = TypeVar("T")
LOG_LEVEL = logging.INFO
LOG_FORMAT = "[%(levelname)s] %(asctime)s %(filename)s:%(lineno)s: %(message)s"
logging.basicConfig(format=LOG_FORMAT, level=LOG_LEVEL)


_errno = threading.local()
_seq = itertools.count()


def set_errno(err: int) -> None:
    """Record the errno of the verb that just failed (C's thread-local `errno`)."""
    _errno.value = err


def PyverbsRDMAErrno(msg: str) -> PyverbsRDMAError:
    """The PyverbsRDMAError for the calling thread's last errno (C's `errno`)."""
    return PyverbsRDMAError(msg, getattr(_errno, "value", 0))


@contextmanager
def verb(msg: str) -> Iterator[None]:
    """Run a verb; its failure (an OSError with the errno) becomes pyverbs' error."""
    try:
        yield
    except OSError as ex:
        set_errno(ex.errno or 0)
        raise PyverbsRDMAError(msg, ex.errno or 0) from None
    except SegmentationFault as ex:
        # EMU: the library's own load or store faulted (memory exhausted, say): a real
        # process dies of SIGSEGV; the face reports EFAULT so the program goes on
        set_errno(errno.EFAULT)
        raise PyverbsRDMAError(f"{msg} ({ex})", errno.EFAULT) from None


_graveyard: list[PyverbsCM] = []


def reap() -> None:
    """Close the objects the garbage collector found unclosed (see PyverbsCM.__del__)."""
    while _graveyard:
        obj = _graveyard.pop()
        if obj._generation != host.generation():
            continue  # its host was torn down, and everything on it
        try:
            obj.close()
        except Exception as ex:  # noqa: BLE001 - as pyverbs' dealloc: log, go on
            logging.getLogger("pyverbs").warning("closing a collected %s: %s",
                                                 type(obj).__name__, ex)


def call(msg: str, fn: Callable[..., T], *args: Any) -> T:
    """fn(*args) as one verb (see verb()), after closing what was collected unclosed."""
    if _graveyard:
        reap()
    with verb(msg):
        return fn(*args)


def destroy(msg: str, fn: Callable[..., int], *args: Any) -> None:
    """A destroy verb returns 0 or an errno, as in C; a non-zero one raises."""
    rc = fn(*args)
    if rc:
        set_errno(rc)
        raise PyverbsRDMAError(msg, rc)


def unsupported(msg: str) -> PyverbsRDMAError:
    """The error a verb the emulated stack does not have returns: EOPNOTSUPP, as
    libibverbs' stubs for a provider without the op do."""
    set_errno(errno.EOPNOTSUPP)
    return PyverbsRDMAError(msg, errno.EOPNOTSUPP)


def inc_rkey(rkey: int) -> int:
    """The rkey with its 8-bit key part incremented (ibv_inc_rkey)."""
    return (rkey & 0xFFFFFF00) | ((rkey + 1) & 0xFF)


def struct_field(name: str, struct: str = "attr") -> property:
    """A read-write property over field `name` of the C struct at self.<struct> (a
    dotted path: "attr.attr"): pyverbs' attribute classes expose their struct's
    fields one by one."""
    at = operator.attrgetter(struct)
    return property(lambda self: getattr(at(self), name),
                    lambda self, val: setattr(at(self), name, val))


def object_field(name: str) -> property:
    """A read-write property holding a pyverbs object (a PD, CQ, XRCD) whose C object -
    its own attribute `name` - goes into field `name` of self.attr, as pyverbs'
    attribute classes keep both."""
    def set_(self: Any, val: Any) -> None:
        inner = getattr(val, name)
        setattr(self, "_" + name, val)
        setattr(self.attr, name, inner)
    return property(lambda self: getattr(self, "_" + name), set_)


class PyverbsObject:
    """An object with a logger (pyverbs' debug messages go to it)."""

    def __init__(self) -> None:
        self.logger = logging.getLogger(self.__class__.__name__)

    def set_log_level(self, val: int) -> None:
        self.logger.setLevel(val)


class PyverbsCM(PyverbsObject):
    """A context-managed object: close() frees it; children are closed first."""

    def __init__(self) -> None:
        super().__init__()
        self._children: weakref.WeakSet[PyverbsCM] = weakref.WeakSet()
        self._closed = True  # nothing to free until the C object exists (_created)
        self._seq = next(_seq)  # children close newest first
        self._generation = host.generation()  # the host its C object lives on

    def _created(self) -> None:
        """The C object exists: close() (or the garbage collector) must free it."""
        self._closed = False
        self._generation = host.generation()

    def __del__(self) -> None:
        # pyverbs frees an object nobody closed when it is collected.  Freeing is a
        # verb, which must not run from inside whatever verb the collector
        # interrupted: the object is kept (resurrected) and closed by the next verb.
        if not getattr(self, "_closed", True) and _graveyard is not None:
            _graveyard.append(self)  # (None once the interpreter tears modules down)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self.close()

    def add_ref(self, child: PyverbsCM) -> None:
        """Record `child` so that closing this object closes it first."""
        self._children.add(child)

    def remove_ref(self, child: PyverbsCM) -> None:
        """Forget `child` (it moved to another parent, as an MR re-registered in
        another PD)."""
        self._children.discard(child)

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise PyverbsUserError(f"{what}: the {type(self).__name__} is closed")

    def close(self) -> None:
        if self._closed:
            return
        for child in sorted(self._children, key=lambda c: -c._seq):
            child.close()
        self._closed = True
        self._free()

    def _free(self) -> None:
        """Free the C object (each class overrides it)."""


class AttrStruct(PyverbsObject):
    """A plain attribute struct of pyverbs (SrqAttr, XRCDInitAttr, Mlx5DVContextAttr...):
    its constructor's parameters, by position or name, become attributes; any other
    field reads 0.  It can be built for a feature the emulated stack lacks, since
    building it calls no verb: the verb that takes it fails instead."""

    _FIELDS: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        if len(args) > len(self._FIELDS):
            raise TypeError(f"{type(self).__name__}() takes at most {len(self._FIELDS)} "
                            f"positional arguments ({len(args)} given)")
        for name, value in zip(self._FIELDS, args, strict=False):
            setattr(self, name, value)
        for name, value in kwargs.items():
            setattr(self, name, value)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return 0


class NotEmulated(PyverbsCM):
    """An object of a feature the emulated stack does not have (device memory, SRQ,
    XRC, flow steering, mlx5 DevX/DR, EFA...): creating it fails with EOPNOTSUPP, as
    libibverbs does for a provider without the verb, so a test skips it.  The list,
    and why, is in docs/pyverbs.md."""

    _VERB = "create the object"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()
        raise unsupported(f"Failed to {self._VERB}")
