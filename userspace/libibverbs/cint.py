"""C integer conversions: what storing a Python int into a fixed-width C field does.

rdma-core is C: a capability the caller puts in `struct ibv_qp_cap` is a
uint32_t, a CQ size an int, and every computed value the provider keeps or
packs into a command lives in a field of fixed width.  A Python caller can
pass any int (-1, 2**40); these helpers give the value the C variable would
hold - two's-complement wrap-around, as the compilers rdma-core supports do
it - so the library computes exactly what the C code computes, and a value
out of range reaches the kernel the way a C caller's would, never as a
Python struct.error.

`c_assign(ustruct)` applies the same rule to every integer field of a uapi
struct before it is packed: the command layer's field-by-field copies
(`cmd->max_send_wr = attr->cap.max_send_wr` ...) are C assignments.
"""

from __future__ import annotations

import functools
from typing import Any

#: struct-module integer codes: (bits, signed)
_CODES = {"b": (8, True), "B": (8, False), "h": (16, True), "H": (16, False),
          "i": (32, True), "I": (32, False), "l": (32, True), "L": (32, False),
          "q": (64, True), "Q": (64, False)}


def wrap(value: int, bits: int, signed: bool) -> int:
    """The value a `bits`-wide C integer holds after `var = value`."""
    value &= (1 << bits) - 1
    if signed and value >> (bits - 1):
        value -= 1 << bits
    return value


def u8(value: int) -> int:
    return value & 0xFF


def u16(value: int) -> int:
    return value & 0xFFFF


def u32(value: int) -> int:
    return value & 0xFFFFFFFF


def s32(value: int) -> int:
    """int (and C's int arithmetic, which wraps in practice)."""
    return wrap(value, 32, True)


def u64(value: int) -> int:
    """uint64_t, size_t, unsigned long and pointers on x86-64."""
    return value & 0xFFFFFFFFFFFFFFFF


def c_assign(obj: Any) -> Any:
    """Wrap every integer field of a uapi struct (nested ones too) to its C type;
    anything else that packs itself (raw bytes) is left as it is."""
    for name, bits, signed, lo, hi in _plan(type(obj)):
        value = getattr(obj, name)
        if bits is None:                       # an embedded struct
            c_assign(value)
        elif isinstance(value, bool):
            setattr(obj, name, int(value))
        elif isinstance(value, int) and not lo <= value <= hi:
            setattr(obj, name, wrap(value, bits, signed))
    return obj


@functools.cache
def _plan(cls: type) -> tuple[tuple[str, Any, Any, int, int], ...]:
    """A struct's integer fields with their width, sign and range, read from FIELDS
    once per class (c_assign runs on every command the library writes)."""
    out: list[tuple[str, Any, Any, int, int]] = []
    for name, code in getattr(cls, "FIELDS", ()):
        if isinstance(code, type):
            out.append((name, None, None, 0, 0))
            continue
        kind = _CODES.get(code[-1]) if isinstance(code, str) else None
        if kind is None or code[:-1]:          # padding, byte arrays, repeat counts
            continue
        bits, signed = kind
        lo = -(1 << (bits - 1)) if signed else 0
        hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
        out.append((name, bits, signed, lo, hi))
    return tuple(out)


__all__ = ["c_assign", "s32", "u16", "u32", "u64", "u8", "wrap"]
