"""pyverbs.addr: GIDs, global routes, address-handle attributes and address handles.

GID, GlobalRoute and AHAttr are the plain structs (ibv_gid, ibv_global_route,
ibv_ah_attr) QPs are connected with; AH is an address handle (ibv_create_ah, or
ibv_create_ah_from_wc to answer a received datagram), what a UD send is addressed by.
"""

from __future__ import annotations

import struct
from typing import Any

from userspace.libibverbs import verbs as v
from userspace.libibverbs import verbs_types as vt
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy
from userspace.pyverbs.host import current_process
from userspace.pyverbs.pyverbs_error import PyverbsUserError
from userspace.pyverbs.utils import gid_str_to_array


class GID(PyverbsObject):
    """Mirrors pyverbs' GID: `gid` is the text form, eight 16-bit groups."""

    def __init__(self, val: Any = None) -> None:
        super().__init__()
        if val is None:
            self.raw = bytes(16)
        elif isinstance(val, str):
            self.raw = bytes(gid_str_to_array(val))
        else:
            self.raw = bytes(val)

    @property
    def gid(self) -> str:
        return ":".join(self.raw[i:i + 2].hex() for i in range(0, 16, 2))

    @gid.setter
    def gid(self, val: str) -> None:
        self.raw = bytes(gid_str_to_array(val))

    def _set_gid(self, val: str) -> None:
        self.gid = val

    def __str__(self) -> str:
        return self.gid


class GlobalRoute(PyverbsObject):
    """Mirrors pyverbs' GlobalRoute (struct ibv_global_route)."""

    def __init__(self, dgid: GID | None = None, flow_label: int = 0, sgid_index: int = 0,
                 hop_limit: int = 1, traffic_class: int = 0) -> None:
        super().__init__()
        self.dgid = dgid if dgid is not None else GID()
        self.flow_label, self.sgid_index = flow_label, sgid_index
        self.hop_limit, self.traffic_class = hop_limit, traffic_class

    def to_c(self) -> vt.ibv_global_route:
        return vt.ibv_global_route(self.dgid.raw, self.flow_label, self.sgid_index,
                                   self.hop_limit, self.traffic_class)


class AHAttr(PyverbsObject):
    """Mirrors pyverbs' AHAttr (struct ibv_ah_attr); `gr` makes it global."""

    def __init__(self, dlid: int = 0, sl: int = 0, src_path_bits: int = 0,
                 static_rate: int = 0, is_global: int = 0, port_num: int = 1,
                 gr: GlobalRoute | None = None) -> None:
        super().__init__()
        self.dlid, self.sl, self.src_path_bits = dlid, sl, src_path_bits
        self.static_rate, self.port_num = static_rate, port_num
        self.gr = gr if gr is not None else GlobalRoute()
        self.is_global = 1 if gr is not None else is_global

    def __getattr__(self, name: str) -> Any:
        if name in ("dgid", "flow_label", "sgid_index", "hop_limit", "traffic_class"):
            value = getattr(self.gr, name)
            return value.gid if name == "dgid" else value
        raise AttributeError(name)

    def to_c(self) -> vt.ibv_ah_attr:
        return vt.ibv_ah_attr(self.gr.to_c(), self.dlid, self.sl, self.src_path_bits,
                              self.static_rate, self.is_global, self.port_num)

    @classmethod
    def from_c(cls, ah: vt.ibv_ah_attr) -> AHAttr:
        g = ah.grh
        gr = GlobalRoute(GID(g.dgid), g.flow_label, g.sgid_index, g.hop_limit, g.traffic_class)
        out = cls(ah.dlid, ah.sl, ah.src_path_bits, ah.static_rate, ah.is_global, ah.port_num,
                  gr)
        out.is_global = ah.is_global
        return out


class GRH(PyverbsObject):
    """Mirrors pyverbs' GRH (struct ibv_grh)."""

    def __init__(self, sgid: GID | None = None, dgid: GID | None = None,
                 version_tclass_flow: int = 0, paylen: int = 0, next_hdr: int = 0,
                 hop_limit: int = 1) -> None:
        super().__init__()
        self.sgid, self.dgid = sgid or GID(), dgid or GID()
        self.version_tclass_flow, self.paylen = version_tclass_flow, paylen
        self.next_hdr, self.hop_limit = next_hdr, hop_limit


    def pack(self) -> bytes:
        """The 40 bytes of struct ibv_grh."""
        return struct.pack(">IHBB16s16s", self.version_tclass_flow, self.paylen, self.next_hdr,
                           self.hop_limit, self.sgid.raw, self.dgid.raw)


class AH(PyverbsCM):
    """Mirrors pyverbs' AH: AH(pd, attr=AHAttr) is ibv_create_ah; AH(pd, wc=WC,
    grh=GRH or the address of the received GRH, port_num=N) is ibv_create_ah_from_wc
    (its attributes, from ibv_init_ah_from_wc, become `init_attr`).  A child of the
    PD: closed (ibv_destroy_ah) before it."""

    def __init__(self, pd: Any, **kwargs: Any) -> None:
        super().__init__()
        self.init_attr: AHAttr | None = kwargs.get("attr")
        wc = kwargs.get("wc")
        if wc is not None:
            grh, port_num = kwargs.get("grh"), kwargs.get("port_num")
            if grh is None or port_num is None:
                raise PyverbsUserError("Missing grh or port_num to create AH from WC")
            raw = grh.pack() if isinstance(grh, GRH) else current_process().load(int(grh), 40)
            c_attr = call("Failed to initialize AH from WC", v.ibv_init_ah_from_wc,
                          pd.ctx.ctx, port_num, wc, raw)
            self.init_attr = AHAttr.from_c(c_attr)
            self.ah = call("Failed to create AH", v.ibv_create_ah, pd.pd, c_attr)
        else:
            if self.init_attr is None:
                raise PyverbsUserError("Missing attr to create AH")
            self.ah = call("Failed to create AH", v.ibv_create_ah, pd.pd, self.init_attr.to_c())
        self._created()
        self.pd = pd
        pd.add_ref(self)

    def _free(self) -> None:
        self.logger.debug("Closing AH")
        destroy("Failed to destroy AH", v.ibv_destroy_ah, self.ah)
