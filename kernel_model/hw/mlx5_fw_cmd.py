"""The firmware's command table and what every command handler shares (device model).

The bottom of the firmware, as a header is the bottom of a driver: the PRM
error a handler raises (FwError, with its stable syndrome), the opcode table
the @fw_command decorator fills, and FwObject, the base of every object a
command creates.  Firmware (mlx5_fw.py) dispatches through COMMANDS; the
handler modules - mlx5_fw.py's small resources, mlx5_fw_ctx.py, mlx5_fw_qp.py,
mlx5_fw_port.py - register into it, and name Firmware in annotations only.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import attrs

from kernel_model.sched import KeyedDict, touch_key

if TYPE_CHECKING:
    from kernel_model.hw.mlx5_fw import Firmware
    from kernel_model.hw.mlx5_ifc import IfcStruct

INIT_SEG_SIZE = 0x2010  # struct mlx5_init_seg: fw_rev .. clr_intx
ADAPTER_PAGE = 4096

# -- errors and the opcode table --------------------------------------------------------
SYNDROMES: dict[int, str] = {}  # syndrome -> the check that produced it


def syndrome(check: str) -> int:
    """The syndrome the firmware reports for a failing check (stable, 32 bits)."""
    value = zlib.crc32(check.encode()) & 0x7FFFFFFF | 0x100000
    SYNDROMES[value] = check
    return value


class FwError(Exception):
    """A command the firmware refuses: PRM status and the check's syndrome."""

    def __init__(self, status: int, check: str):
        super().__init__(f"{check} (status {status:#x})")
        self.status, self.check, self.syndrome = status, check, syndrome(check)


@attrs.define
class FwCommand:
    handler: Callable[[Firmware, IfcStruct, IfcStruct], None]
    name: str   # the layout stem: create_qp -> create_qp_in / create_qp_out
    state: str  # lowest lifecycle state the command needs


COMMANDS: dict[int, FwCommand] = {}
LIFECYCLE_STATES = ("disabled", "enabled", "initialized")  # see mlx5_fw.py


def fw_command(opcode: int, name: str, state: str = "initialized") -> Callable:
    """Register a handler for `opcode` in the firmware's opcode table."""

    def mark(fn: Callable[[Firmware, IfcStruct, IfcStruct], None]) -> Callable:
        COMMANDS[opcode] = FwCommand(fn, name, state)
        return fn

    return mark


# -- the tables that hold them ---------------------------------------------------------------
class FwTable(KeyedDict):
    """One of the firmware's object tables (number -> FwObject): a KeyedDict, so that
    partial-order reduction sees commands on different objects as independent, which
    also counts the objects each uid owns - DESTROY_UCTX asks whether a uid still owns
    any (owns()), which depends on that uid's objects only, not on every table's."""

    __slots__ = ("owned",)

    def __init__(self) -> None:
        super().__init__()
        self.owned: dict[int, int] = {}

    def _count(self, obj: object, n: int) -> None:
        uid = getattr(obj, "uid", 0)
        touch_key((id(self), "uid", uid), "add")
        left = self.owned.get(uid, 0) + n
        if left:
            self.owned[uid] = left
        else:
            self.owned.pop(uid, None)

    def __setitem__(self, k: Any, v: Any) -> None:
        if dict.__contains__(self, k):
            self._count(dict.__getitem__(self, k), -1)
        self._count(v, 1)
        super().__setitem__(k, v)

    def _forget(self, k: Any) -> None:
        super()._forget(k)
        if dict.__contains__(self, k):
            self._count(dict.__getitem__(self, k), -1)

    def popitem(self) -> tuple[Any, Any]:
        k, v = super().popitem()
        self._count(v, -1)
        return k, v

    def clear(self) -> None:
        super().clear()
        self.owned.clear()

    def owns(self, uid: int) -> bool:
        """Does uid own an object here?"""
        touch_key((id(self), "uid", uid), False)
        return uid in self.owned


# -- the objects commands create -----------------------------------------------------------
@attrs.define(eq=False)
class FwObject:
    """Base of every firmware object: its number, owning uid and user count."""

    num: int
    uid: int = 0
    users: int = 0
    kind = "OBJ"

    def __repr__(self) -> str:
        return f"{self.kind} {self.num:#x} uid={self.uid}" + (
            f" users={self.users}" if self.users else "")
