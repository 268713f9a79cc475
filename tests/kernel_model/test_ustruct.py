"""uapi structs: every declared layout packs and unpacks its own bytes back.

The fast paths (one attrgetter for pack, positional __init__ for unpack) serve
structs with no nested struct; the others take the per-field path.  Every uapi
struct class the model declares is round-tripped here, field by field.
"""

from __future__ import annotations

import importlib
import pkgutil
import random

import kernel_model.uapi as uapi
from kernel_model.uapi.ustruct import UStruct


def _all_structs() -> list[type[UStruct]]:
    for info in pkgutil.iter_modules(uapi.__path__):
        importlib.import_module(f"kernel_model.uapi.{info.name}")
    out, todo = [], list(UStruct.__subclasses__())
    while todo:
        c = todo.pop()
        todo += c.__subclasses__()
        if c.SIZE:
            out.append(c)
    return out


def test_every_struct_round_trips_its_bytes_field_by_field():
    rnd = random.Random(7)
    structs = _all_structs()
    assert len(structs) > 40 and any(c._NESTED for c in structs)
    assert any(len(c._NAMES) == 1 for c in structs)
    for cls in structs:
        raw = bytes(rnd.randrange(256) for _ in range(cls.SIZE))
        obj = cls.unpack(raw)
        values = cls._STRUCT.unpack(raw)
        for name, v in zip(cls._NAMES, values, strict=True):
            got = getattr(obj, name)
            assert (got.pack() if name in cls._NESTED else got) == v, (cls.__name__, name)
        again = cls.unpack(obj.pack())
        assert again == obj, cls.__name__
        # pad bytes pack as zero; everything else comes back as it was
        assert len(obj.pack()) == cls.SIZE


def test_a_short_buffer_reads_as_zero_filled():
    for cls in _all_structs():
        assert cls.unpack(b"") == cls(), cls.__name__
