"""pyverbs.pd: protection domains (ibv_alloc_pd / ibv_dealloc_pd)."""

from __future__ import annotations

from typing import Any

from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import PyverbsCM, PyverbsObject, call, destroy, unsupported
from userspace.pyverbs.device import Context


class PD(PyverbsCM):
    """Mirrors pyverbs' PD: allocated on a Context, closed before it."""

    def __init__(self, creator: Context, **kwargs: Any) -> None:
        super().__init__()
        if kwargs.get("handle") is not None:
            raise unsupported("Failed to import PD")
        self.ctx = creator
        self.pd = call("Failed to allocate PD", v.ibv_alloc_pd, creator.ctx)
        self._created()
        creator.add_ref(self)
        self.logger.debug("PD: Allocated ibv_pd")

    @property
    def handle(self) -> int:
        return self.pd.handle

    def advise_mr(self, advise: int, flags: int, sg_list: list) -> None:
        raise unsupported("Failed to advise MR")

    def unimport(self) -> None:
        raise unsupported("Failed to unimport PD")

    def _free(self) -> None:
        self.logger.debug("Closing PD")
        destroy("Failed to dealloc PD", v.ibv_dealloc_pd, self.pd)


class ParentDomainInitAttr(PyverbsObject):
    """Mirrors pyverbs' ParentDomainInitAttr."""

    def __init__(self, pd: PD, pd_context: Any = None) -> None:
        super().__init__()
        self.pd, self.pd_context, self.comp_mask = pd, pd_context, 0


class ParentDomainContext(PyverbsObject):
    """Mirrors pyverbs' ParentDomainContext (custom allocators for a parent domain)."""

    def __init__(self, pd: PD, alloc_func: Any, free_func: Any, user_data: Any = None) -> None:
        super().__init__()
        self.pd, self.alloc_func, self.free_func, self.user_data = (pd, alloc_func, free_func,
                                                                    user_data)


class ParentDomain(PD):
    """Mirrors pyverbs' ParentDomain (ibv_alloc_parent_domain): not emulated yet."""

    def __init__(self, context: Context, attr: ParentDomainInitAttr) -> None:
        PyverbsCM.__init__(self)
        raise unsupported("Failed to allocate Parent Domain")
