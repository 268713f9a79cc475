"""uapi structs as attrs classes with the C layout: what crosses the user/kernel line.

A uapi struct is declared once, with its fields in C order and their struct
codes, and both sides use it: userspace packs a request into its own memory,
the kernel copy_from_user()s the bytes and unpacks them.

    @uapi_struct
    class mlx5_ib_alloc_ucontext_req(UStruct):
        FIELDS = (("total_num_bfregs", "I"), ("num_low_latency_bfregs", "I"))

    req = mlx5_ib_alloc_ucontext_req(total_num_bfregs=16, num_low_latency_bfregs=4)
    raw = req.pack()                           # 8 little-endian bytes
    mlx5_ib_alloc_ucontext_req.unpack(raw[:4]) # a short buffer reads as zero-filled

Layouts are little-endian (x86-64) with explicit padding: a field code "x" or
"4x" is padding, "8s" a byte array.  `SIZE` is sizeof(), `offsetof(name)` the
field's offset, as the kernel's ABI length checks use them.  A field whose
code is another uapi struct class embeds it (`("dest", ib_uverbs_qp_dest)`).
"""

from __future__ import annotations

import operator
import struct
from typing import Any, ClassVar, TypeVar

import attrs

T = TypeVar("T", bound="UStruct")


class UStruct:
    """Base of every uapi struct; see the module docstring."""

    FIELDS: ClassVar[tuple[tuple[str, Any], ...]] = ()
    FMT: ClassVar[str] = "<"
    SIZE: ClassVar[int] = 0
    _OFFSETS: ClassVar[dict[str, int]] = {}
    _NESTED: ClassVar[dict[str, type[UStruct]]] = {}
    #: the layout compiled once (struct.Struct) and the non-pad field names in order
    _STRUCT: ClassVar[struct.Struct] = struct.Struct("<")
    _NAMES: ClassVar[tuple[str, ...]] = ()
    #: the fields' values in _NAMES order, as a tuple (operator.attrgetter)
    _GET: ClassVar[Any] = staticmethod(lambda obj: ())

    def pack(self) -> bytes:
        """The struct's bytes, as the C compiler lays it out."""
        nested = self._NESTED
        if not nested:      # most structs: one attrgetter, one Struct.pack
            return self._STRUCT.pack(*self._GET(self))
        return self._STRUCT.pack(*[getattr(self, n).pack() if n in nested else getattr(self, n)
                                   for n in self._NAMES])

    @classmethod
    def unpack(cls: type[T], data: bytes | bytearray | memoryview) -> T:
        """Read a struct from bytes; a short buffer is zero-extended (the
        kernel's copy of min(inlen, sizeof) into a zeroed struct)."""
        size = cls.SIZE
        raw = data[:size]
        if len(raw) < size:
            raw = bytes(raw).ljust(size, b"\0")
        nested = cls._NESTED
        if not nested:      # the fields are __init__'s parameters, in the same order
            return cls(*cls._STRUCT.unpack(raw))
        return cls(**{n: nested[n].unpack(v) if n in nested else v
                      for n, v in zip(cls._NAMES, cls._STRUCT.unpack(raw), strict=True)})

    @classmethod
    def offsetof(cls, name: str) -> int:
        """Mirrors offsetof(struct, field)."""
        return cls._OFFSETS[name]


def _is_pad(code: Any) -> bool:
    return isinstance(code, str) and code.endswith("x")


def _default(code: str) -> Any:
    return b"\0" * int(code[:-1] or 1) if code.endswith("s") else 0


def uapi_struct(cls: type[T]) -> type[T]:
    """Make `cls` (a UStruct with FIELDS) an attrs class with its C layout."""
    fmt, offsets = "<", {}
    nested = {n: c for n, c in cls.FIELDS if isinstance(c, type)}
    for name, code in cls.FIELDS:
        if not _is_pad(code):
            offsets[name] = struct.calcsize(fmt)
        fmt += f"{code.SIZE}s" if name in nested else code
    cls.FMT, cls.SIZE, cls._OFFSETS = fmt, struct.calcsize(fmt), offsets
    cls._NESTED = nested
    cls._STRUCT = struct.Struct(fmt)
    cls._NAMES = tuple(n for n, c in cls.FIELDS if not _is_pad(c))
    get = operator.attrgetter(*cls._NAMES) if cls._NAMES else (lambda obj: ())
    cls._GET = staticmethod(get if len(cls._NAMES) != 1 else lambda obj: (get(obj),))
    these = {n: attrs.field(factory=nested[n]) if n in nested else
             attrs.field(default=_default(c)) for n, c in cls.FIELDS if not _is_pad(c)}
    return attrs.define(these=these, slots=False, eq=True)(cls)
