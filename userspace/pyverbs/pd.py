"""pyverbs.pd: protection domains (ibv_alloc_pd / ibv_dealloc_pd)."""

from __future__ import annotations

from typing import Any

from userspace.libibverbs import verbs as v
from userspace.pyverbs.base import (
    PyverbsCM,
    PyverbsObject,
    call,
    destroy,
    set_errno,
)
from userspace.pyverbs.device import Context
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


class PD(PyverbsCM):
    """Mirrors pyverbs' PD: allocated on a Context, closed before it.  PD(ctx, handle=h)
    imports the PD of handle h of the context's command fd (ibv_import_pd); closing it
    does not deallocate the PD, which stays its creator's."""

    _is_imported = False

    def __init__(self, creator: Context, **kwargs: Any) -> None:
        super().__init__()
        self.ctx = creator
        if kwargs.get("handle") is not None:
            self.pd = call("Failed to import PD", v.ibv_import_pd, creator.ctx,
                           kwargs["handle"])
            self._is_imported = True
        else:
            self.pd = call("Failed to allocate PD", v.ibv_alloc_pd, creator.ctx)
        self._created()
        creator.add_ref(self)
        self.logger.debug("PD: Allocated ibv_pd")

    @property
    def handle(self) -> int:
        return self.pd.handle

    def advise_mr(self, advise: int, flags: int, sg_list: list) -> int:
        """Mirrors pyverbs' PD.advise_mr(): ibv_advise_mr over the SGEs (addr, length,
        lkey); PyverbsRDMAError('Failed to advise MR', errno) on failure."""
        rc = v.ibv_advise_mr(self.pd, advise, flags, list(sg_list))
        if rc:
            set_errno(rc)
            raise PyverbsRDMAError("Failed to advise MR", rc)
        return rc

    def unimport(self) -> None:
        """ibv_unimport_pd(), then close() (its objects first; the PD stays)."""
        self._check_open("PD.unimport")
        call("Failed to unimport PD", v.ibv_unimport_pd, self.pd)
        self.close()

    def _free(self) -> None:
        self.logger.debug("Closing PD")
        if not self._is_imported:
            destroy("Failed to dealloc PD", v.ibv_dealloc_pd, self.pd)


def _pd_alloc(pd: v.ibv_pd, pd_context: ParentDomainContext, size: int, alignment: int,
              resource_type: int) -> int:
    """pyverbs' pd_alloc: the C allocator that calls the Python alloc_func with
    (pd, context, size, alignment, resource_type) and hands libmlx5 what it returns as
    a pointer.  As a Cython callback that cannot raise, an exception is reported and
    the pointer is NULL; so is a value no pointer can hold."""
    try:
        ptr = pd_context.p_alloc(pd_context.pd, pd_context, size, alignment, resource_type)
        return int(ptr) if 0 <= int(ptr) <= _UINTPTR_MAX else 0
    except Exception as ex:  # noqa: BLE001 - Cython prints it and returns NULL
        pd_context.logger.error("Exception ignored in pd_alloc: %r", ex)
        return 0


def _pd_free(pd: v.ibv_pd, pd_context: ParentDomainContext, ptr: int,
             resource_type: int) -> None:
    """pyverbs' pd_free: calls the Python free_func with (pd, context, ptr,
    resource_type); an exception is reported, not raised (a void C callback)."""
    try:
        pd_context.p_free(pd_context.pd, pd_context, ptr, resource_type)
    except Exception as ex:  # noqa: BLE001 - Cython prints it and goes on
        pd_context.logger.error("Exception ignored in pd_free: %r", ex)


_UINTPTR_MAX = (1 << 64) - 1


class ParentDomainContext(PyverbsObject):
    """Mirrors pyverbs' ParentDomainContext: the Python allocators of a parent domain
    (alloc_func(pd, context, size, alignment, resource_type) -> address or
    _IBV_ALLOCATOR_USE_DEFAULT; free_func(pd, context, ptr, resource_type)) and
    user_data for them."""

    def __init__(self, pd: PD, alloc_func: Any, free_func: Any, user_data: Any = None) -> None:
        super().__init__()
        self.pd, self.p_alloc, self.p_free, self.user_data = pd, alloc_func, free_func, \
            user_data


class ParentDomainInitAttr(PyverbsObject):
    """Mirrors pyverbs' ParentDomainInitAttr (struct ibv_parent_domain_init_attr): a
    pd_context sets the allocators and both comp_mask bits."""

    def __init__(self, pd: PD, pd_context: ParentDomainContext | None = None) -> None:
        super().__init__()
        if pd is None:
            raise TypeError("Argument 'pd' must not be None")
        self.pd, self.pd_context = pd, pd_context
        self.init_attr = v.ibv_parent_domain_init_attr(pd=pd.pd)
        if pd_context:
            self.init_attr.alloc, self.init_attr.free = _pd_alloc, _pd_free
            self.init_attr.pd_context = pd_context
            self.init_attr.comp_mask = (v.IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT
                                        | v.IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS)

    @property
    def comp_mask(self) -> int:
        return self.init_attr.comp_mask


class ParentDomain(PD):
    """Mirrors pyverbs' ParentDomain (ibv_alloc_parent_domain): a PD to every verb;
    the QPs, CQs and SRQs made on it get their buffers from its allocators.  It is
    closed before its protection domain, and closes its extended CQs first."""

    def __init__(self, context: Context, attr: ParentDomainInitAttr) -> None:
        PyverbsCM.__init__(self)
        if context is None or attr is None:
            raise TypeError("ParentDomain: context and attr must not be None")
        self.protection_domain = attr.pd
        self.pd_context = attr.pd_context
        self.ctx = context
        self.pd = call("Failed to allocate Parent Domain", v.ibv_alloc_parent_domain,
                       context.ctx, attr.init_attr)
        self._created()
        attr.pd.add_ref(self)
        context.add_ref(self)
        self.logger.debug("Allocated ParentDomain")

    def _free(self) -> None:
        self.logger.debug("Closing ParentDomain")
        super()._free()
