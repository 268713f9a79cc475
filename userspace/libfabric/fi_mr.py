"""Mirrors fi_mr(3) (rdma/fi_domain.h): memory registration, over the emulated verbs.

    ret, dom = fi_domain(proc, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                         FI_MR_PROV_KEY, caps=FI_HMEM)
    ret, mr = fi_mr_reg(dom, buf, length, FI_REMOTE_WRITE, 0, 0, 0)
    desc, key = fi_mr_desc(mr), fi_mr_key(mr)      # local descriptor, remote key
    fi_close(mr); fi_close(dom)

Every call returns 0 or a negative fabric errno (fi_errno.py), as the man page
says - a C out-parameter comes back as the second element of a tuple.

The domain is a verbs one (libfabric's verbs provider: one ibv_context and
PD).  What each mr_mode bit makes the application do, and what the layer does
for it here:

  FI_MR_ALLOCATED   required: registration pins (no on-demand paging in the
                    model), so hints without it match no provider (-FI_ENODATA)
  FI_MR_VIRT_ADDR   remote addresses are virtual addresses (the MR's iova is
                    the buffer); unset, they are offsets from 0 (iova 0)
  FI_MR_PROV_KEY    the key is the provider's (the rkey); unset, the
                    application's requested_key is the key (a table in the
                    domain: -FI_ENOKEY if in use, -FI_EKEYREJECTED beyond the
                    4-byte mr_key_size)
  FI_MR_RAW         fi_mr_key gives FI_KEY_NOTAVAIL: fi_mr_raw_attr locally,
                    fi_mr_map_raw at the peer
  FI_MR_ENDPOINT    MRs start disabled: fi_mr_bind to an endpoint, fi_mr_enable
  FI_MR_HMEM        device memory must come through fi_mr_regattr with its
                    iface; unset, the layer finds CUDA memory itself
                    (cuPointerGetAttribute) - both need the FI_HMEM capability
  FI_MR_LOCAL       recorded (descriptors for local buffers are the caller's job)
  FI_MR_MMU_NOTIFY, FI_MR_RMA_EVENT   not needed by verbs: cleared from the
                    domain's mode; FI_RMA_EVENT registrations are -FI_EBADFLAGS
  FI_MR_BASIC       = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY |
                    FI_MR_LOCAL

CUDA memory (FI_HMEM_CUDA) reaches the kernel as any other ibv_reg_mr: gup
refuses it and the peer-memory path (nv_peer_mem) pins it.

# EMU: libfabric picks a provider in fi_getinfo and opens fabric, domain and
# endpoint objects; here fi_domain(proc, mr_mode, caps) stands for that chain
# (the mr_mode passed is the application's hints), and fi_endpoint makes an
# endpoint that is only something to bind MRs to.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import attrs

from kernel_model.trace import traced
from userspace.cuda.runtime import CU_MEMORYTYPE_DEVICE, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, cudart
from userspace.libfabric.fabric import (  # noqa: F401 - they are fi_mr's API too
    FI_ACCESS_ALL,
    FI_CLASS_CNTR,
    FI_CLASS_DOMAIN,
    FI_CLASS_EP,
    FI_CLASS_MR,
    FI_HMEM,
    FI_HMEM_CUDA,
    FI_HMEM_ROCR,
    FI_HMEM_SYSTEM,
    FI_HMEM_ZE,
    FI_KEY_NOTAVAIL,
    FI_MR_ALLOCATED,
    FI_MR_BASIC,
    FI_MR_DMABUF,
    FI_MR_ENDPOINT,
    FI_MR_HMEM,
    FI_MR_LOCAL,
    FI_MR_MMU_NOTIFY,
    FI_MR_PROV_KEY,
    FI_MR_RAW,
    FI_MR_RMA_EVENT,
    FI_MR_SCALABLE,
    FI_MR_UNSPEC,
    FI_MR_VIRT_ADDR,
    FI_READ,
    FI_RECV,
    FI_REMOTE_READ,
    FI_REMOTE_WRITE,
    FI_RMA_EVENT,
    FI_SEND,
    FI_WRITE,
    MR_IOV_LIMIT,
    MR_KEY_SIZE,
    RAW_KEY_FMT,
)
from userspace.libfabric.fi_errno import (
    FI_EBADFLAGS,
    FI_EBUSY,
    FI_EINVAL,
    FI_EKEYREJECTED,
    FI_ENODATA,
    FI_ENODEV,
    FI_ENOKEY,
    FI_ENOSYS,
    FI_EOPBADSTATE,
    FI_EOPNOTSUPP,
    FI_ETOOSMALL,
)
from userspace.libfabric.mr_cache import (
    memhooks_subscribe,
    memhooks_unsubscribe,
    ofi_mr_cache,
    ofi_mr_cache_cleanup,
    ofi_mr_cache_delete,
    ofi_mr_cache_search,
    uffd_monitor,
)
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError


@attrs.define(eq=False)
class fid:
    """Mirrors struct fid: the class and the user's context."""

    fclass: int
    context: Any = None
    closed: bool = attrs.field(default=False, init=False)


@attrs.define(eq=False)
class fid_domain(fid):
    """A verbs domain: its process, ibv_context and PD, the negotiated mr_mode, and
    the key tables (requested keys, mapped raw keys)."""

    proc: Any = None
    ctx: Any = None
    pd: Any = None
    mr_mode: int = 0
    caps: int = 0
    keys: dict = attrs.Factory(dict)          # requested key -> fid_mr (not PROV_KEY)
    raw_keys: dict = attrs.Factory(dict)      # mapped key -> (base_addr, rkey)
    mrs: list = attrs.Factory(list)
    eps: list = attrs.Factory(list)
    next_raw: int = 1
    cuda: Any = None                          # the process's CUDA runtime, with FI_HMEM
    cache: Any = None                         # the registration cache (mr_cache.py)


@attrs.define(eq=False)
class fid_ep(fid):
    """An endpoint: here only what FI_MR_ENDPOINT MRs are bound to."""

    domain: Any = None
    mrs: list = attrs.Factory(list)


@attrs.define(eq=False)
class fid_mr(fid):
    """Mirrors struct fid_mr: mem_desc and key, over one ibv_mr."""

    domain: Any = None
    ibv_mr: Any = None
    mem_desc: Any = None
    key: int = FI_KEY_NOTAVAIL
    iface: int = FI_HMEM_SYSTEM
    device: int = 0
    addr: int = 0
    length: int = 0
    access: int = 0
    enabled: bool = True
    eps: list = attrs.Factory(list)
    entry: Any = None                         # the cache entry behind it, if cached


@attrs.define(eq=False)
class fi_mr_dmabuf:
    """Mirrors struct fi_mr_dmabuf: [offset, offset + len) of the dma-buf fd, whose
    start the peer sees at base_addr (FI_MR_VIRT_ADDR)."""

    fd: int
    offset: int
    len: int
    base_addr: int = 0


@attrs.define(eq=False)
class fi_mr_attr:
    """Mirrors struct fi_mr_attr (the fields this layer reads); with the FI_MR_DMABUF
    flag, `dmabuf` replaces `mr_iov`."""

    mr_iov: Sequence[tuple[int, int]] = ()
    access: int = 0
    offset: int = 0
    requested_key: int = 0
    context: Any = None
    iface: int = FI_HMEM_SYSTEM
    device: int = 0
    dmabuf: fi_mr_dmabuf | None = None

    @property
    def iov_count(self) -> int:
        return len(self.mr_iov)


# -- the domain ----------------------------------------------------------------------------
def _negotiate(mr_mode: int) -> int | None:
    """The mode the verbs domain runs in for these hints, or None (no provider)."""
    if mr_mode == FI_MR_BASIC:
        mr_mode = FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_LOCAL
    elif mr_mode == FI_MR_SCALABLE:
        mr_mode = 0
    if not mr_mode & FI_MR_ALLOCATED:
        return None                   # the registration pins: no on-demand paging here
    return mr_mode & ~(FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT | FI_MR_BASIC | FI_MR_SCALABLE)


@traced
def fi_domain(proc: Any, mr_mode: int, caps: int = 0, name: str | None = None,
              env: dict[str, str] | None = None) -> tuple[int, fid_domain | None]:
    """fi_getinfo with these hints + fi_fabric + fi_domain: a verbs domain on the RDMA
    device `name` (the first by default).  -FI_ENODATA when no provider takes the
    hints (mr_mode without FI_MR_ALLOCATED), -FI_ENODEV without a device.

    `env` (default: the process's environment, as libfabric reads it): the
    FI_MR_CACHE_* variables configure the registration cache (mr_cache.py), which fi_mr_reg
    uses when the keys are the provider's and MRs need no endpoint binding."""
    mode = _negotiate(mr_mode)
    if mode is None:
        return -FI_ENODATA, None
    if not caps & FI_HMEM:
        mode &= ~FI_MR_HMEM
    devs = [d for d in v.ibv_get_device_list(proc) if name is None or d.name == name]
    if not devs:
        return -FI_ENODEV, None
    try:
        ctx = v.ibv_open_device(proc, devs[0])
        pd = v.ibv_alloc_pd(ctx)
    except VerbsError as e:
        return -e.errno, None
    dom = fid_domain(FI_CLASS_DOMAIN, None, proc, ctx, pd, mode, caps)
    if caps & FI_HMEM:
        dom.cuda = _cuda_runtime(proc)
    try:
        cache = ofi_mr_cache(dom, proc.environ if env is None else env,
                             lambda *region: _register_uncached(dom, *region), _dereg)
    except ValueError:                 # an FI_MR_CACHE_* value libfabric would refuse
        v.ibv_dealloc_pd(pd)
        v.ibv_close_device(ctx)
        return -FI_EINVAL, None
    # the cache hands out registrations of larger ranges: only where peers address
    # memory by virtual address (offsets from 0 would be offsets into the entry)
    if cache.enabled and mode & FI_MR_PROV_KEY and mode & FI_MR_VIRT_ADDR and \
            not mode & FI_MR_ENDPOINT:
        dom.cache = cache
        if cache.monitor == "memhooks":
            memhooks_subscribe(proc, cache)
        else:
            cache.uffd = uffd_monitor.start(proc)
            if cache.uffd is None:       # no userfaultfd: libfabric runs without a cache
                dom.cache = None
    return 0, dom


def _cuda_runtime(proc: Any) -> Any:
    """The process's CUDA runtime, or None when it has no GPU to open."""
    try:
        return cudart(proc)
    except OSError:
        return None


@traced
def fi_endpoint(domain: fid_domain, context: Any = None) -> tuple[int, fid_ep]:
    """An endpoint of the domain (for FI_MR_ENDPOINT binding)."""
    ep = fid_ep(FI_CLASS_EP, context, domain)
    domain.eps.append(ep)
    return 0, ep


# -- registration ------------------------------------------------------------------------------
def _ibv_access(access: int) -> int:
    """Mirrors the verbs provider's access translation: anything the HCA writes locally
    (a receive, a READ's data) needs LOCAL_WRITE, and verbs requires LOCAL_WRITE with
    REMOTE_WRITE."""
    out = 0
    if access & (FI_RECV | FI_READ):
        out |= v.IBV_ACCESS_LOCAL_WRITE
    if access & FI_REMOTE_READ:
        out |= v.IBV_ACCESS_REMOTE_READ
    if access & FI_REMOTE_WRITE:
        out |= v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_LOCAL_WRITE
    return out


def _is_cuda(domain: fid_domain, addr: int) -> bool:
    """Is addr CUDA device memory?  The provider's own discovery in an FI_HMEM domain
    (ofi_get_hmem_iface: cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE));
    without FI_HMEM every buffer is system memory to the layer."""
    if domain.cuda is None:
        return False
    try:
        kind = domain.cuda.cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr)
    except OSError:
        return False                      # not CUDA memory
    return kind == CU_MEMORYTYPE_DEVICE


@traced
def fi_mr_regattr(domain: fid_domain, attr: fi_mr_attr, flags: int = 0
                  ) -> tuple[int, fid_mr | None]:
    """Mirrors fi_mr_regattr(): register attr's buffer with the domain's rules.

    -FI_EBADFLAGS for flags the domain does not take (FI_RMA_EVENT: verbs has no
    RMA events; FI_MR_DMABUF goes to the dma-buf path); -FI_EINVAL for no or several iovs (the
    domain's mr_iov_limit is 1), a zero length, a non-zero offset, access bits
    that are not FI access bits, device memory through fi_mr_reg when FI_MR_HMEM
    is set, or device memory in a domain without FI_HMEM; -FI_ENOSYS for CUDA
    memory in a process without a GPU; -FI_EOPNOTSUPP for an
    iface other than system and CUDA; -FI_EKEYREJECTED / -FI_ENOKEY for a
    requested key out of range / in use; the verbs errno of ibv_reg_mr.
    """
    if flags == FI_MR_DMABUF:
        return _regattr_dmabuf(domain, attr)
    if flags:                         # FI_RMA_EVENT: verbs reports no RMA events
        return -FI_EBADFLAGS, None
    if attr.iov_count != MR_IOV_LIMIT:
        return -FI_EINVAL, None
    addr, length = attr.mr_iov[0]
    if length <= 0 or attr.offset != 0:
        return -FI_EINVAL, None
    if not attr.access or attr.access & ~FI_ACCESS_ALL:
        return -FI_EINVAL, None
    iface = attr.iface
    if iface not in (FI_HMEM_SYSTEM, FI_HMEM_CUDA):
        return -FI_EOPNOTSUPP, None
    if iface == FI_HMEM_SYSTEM and _is_cuda(domain, addr):
        if domain.mr_mode & FI_MR_HMEM:
            return -FI_EINVAL, None       # device memory must be named by its iface
        iface = FI_HMEM_CUDA
    if iface != FI_HMEM_SYSTEM and not domain.caps & FI_HMEM:
        return -FI_EINVAL, None
    if iface == FI_HMEM_CUDA and domain.cuda is None:
        return -FI_ENOSYS, None       # no GPU in this process: the CUDA iface is not there
    ret = _check_requested_key(domain, attr.requested_key)
    if ret:
        return ret, None
    cache = domain.cache
    if cache is not None and (iface != FI_HMEM_CUDA or cache.cuda_monitor):
        ret, entry = ofi_mr_cache_search(cache, addr, length, attr.access, iface,
                                         attr.device)
        if ret:
            return ret, None
        base = entry.mr
        mr = fid_mr(FI_CLASS_MR, attr.context, domain, base.ibv_mr, base.mem_desc, base.key,
                    iface, attr.device, addr, length, attr.access, entry=entry)
        domain.mrs.append(mr)
        return 0, mr
    ret, mr = _register_uncached(domain, addr, length, attr.access, iface, attr.device)
    if ret:
        return ret, None
    return 0, _publish(domain, mr, attr)


def _regattr_dmabuf(domain: fid_domain, attr: fi_mr_attr) -> tuple[int, fid_mr | None]:
    """FI_MR_DMABUF: ibv_reg_dmabuf_mr of attr.dmabuf (the verbs provider's path; the
    registration cache, which works on virtual addresses, is not involved).
    -FI_EINVAL without a dmabuf, for a zero length, bad access bits, or a device
    iface in a domain without FI_HMEM; the verbs errno otherwise."""
    db = attr.dmabuf
    if db is None or db.len <= 0 or not attr.access or attr.access & ~FI_ACCESS_ALL:
        return -FI_EINVAL, None
    if attr.iface != FI_HMEM_SYSTEM and not domain.caps & FI_HMEM:
        return -FI_EINVAL, None
    ret = _check_requested_key(domain, attr.requested_key)
    if ret:
        return ret, None
    iova = db.base_addr + db.offset if domain.mr_mode & FI_MR_VIRT_ADDR else 0
    try:
        ibmr = v.ibv_reg_dmabuf_mr(domain.pd, db.offset, db.len, iova, db.fd,
                                   _ibv_access(attr.access))
    except VerbsError as e:
        return -e.errno, None
    mr = fid_mr(FI_CLASS_MR, None, domain, ibmr, ibmr.lkey, ibmr.rkey, attr.iface,
                attr.device, db.base_addr + db.offset, db.len, attr.access,
                enabled=not domain.mr_mode & FI_MR_ENDPOINT)
    return 0, _publish(domain, mr, attr)


def _check_requested_key(domain: fid_domain, requested_key: int) -> int:
    """Without FI_MR_PROV_KEY the application's key is the key: -FI_EKEYREJECTED beyond
    mr_key_size, -FI_ENOKEY when another MR has it; 0."""
    if domain.mr_mode & FI_MR_PROV_KEY:
        return 0
    if requested_key >> (8 * MR_KEY_SIZE):
        return -FI_EKEYREJECTED
    if requested_key in domain.keys:
        return -FI_ENOKEY
    return 0


def _publish(domain: fid_domain, mr: fid_mr, attr: fi_mr_attr) -> fid_mr:
    """A new registration becomes the application's MR: its context, its requested
    key (the key table's entry) without FI_MR_PROV_KEY, and the domain's list."""
    mr.context = attr.context
    if not domain.mr_mode & FI_MR_PROV_KEY:
        mr.key = attr.requested_key
        domain.keys[mr.key] = mr
    domain.mrs.append(mr)
    return mr


def _register_uncached(domain: fid_domain, addr: int, length: int, access: int, iface: int,
                       device: int) -> tuple[int, fid_mr | None]:
    """The verbs registration behind an MR (what the cache keeps): ibv_reg_mr_iova with
    the iova the mode asks for; the verbs errno on failure."""
    iova = addr if domain.mr_mode & FI_MR_VIRT_ADDR else 0
    try:
        ibmr = v.ibv_reg_mr_iova(domain.pd, addr, length, iova, _ibv_access(access))
    except VerbsError as e:
        return -e.errno, None
    return 0, fid_mr(FI_CLASS_MR, None, domain, ibmr, ibmr.lkey, ibmr.rkey, iface, device,
                     addr, length, access, enabled=not domain.mr_mode & FI_MR_ENDPOINT)


def _dereg(mr: fid_mr) -> int:
    """ibv_dereg_mr of the registration behind an MR: 0 or -errno."""
    try:
        v.ibv_dereg_mr(mr.ibv_mr)
    except VerbsError as e:
        return -e.errno
    return 0


@traced
def fi_mr_reg(domain: fid_domain, buf: int, length: int, access: int, offset: int,
              requested_key: int, flags: int, context: Any = None
              ) -> tuple[int, fid_mr | None]:
    """Mirrors fi_mr_reg(): fi_mr_regattr of one system-memory buffer (CUDA memory is
    found by the layer itself when FI_MR_HMEM is unset)."""
    return fi_mr_regattr(domain, fi_mr_attr([(buf, length)], access, offset, requested_key,
                                            context), flags)


@traced
def fi_mr_regv(domain: fid_domain, iov: Sequence[tuple[int, int]], count: int, access: int,
               offset: int, requested_key: int, flags: int, context: Any = None
               ) -> tuple[int, fid_mr | None]:
    """Mirrors fi_mr_regv(): fi_mr_regattr of `count` iovs (the domain takes one)."""
    return fi_mr_regattr(domain, fi_mr_attr(list(iov)[:count], access, offset, requested_key,
                                            context), flags)


# -- the MR's keys ---------------------------------------------------------------------------
def fi_mr_desc(mr: fid_mr) -> Any:
    """Mirrors fi_mr_desc(): the local descriptor (the lkey)."""
    return mr.mem_desc


def fi_mr_key(mr: fid_mr) -> int:
    """Mirrors fi_mr_key(): the remote key; FI_KEY_NOTAVAIL under FI_MR_RAW."""
    if mr.domain.mr_mode & FI_MR_RAW:
        return FI_KEY_NOTAVAIL
    return mr.key


@traced
def fi_mr_raw_attr(mr: fid_mr, key_size: int, flags: int = 0
                   ) -> tuple[int, int, bytes, int]:
    """Mirrors fi_mr_raw_attr(): (ret, base_addr, raw_key, key_size).  A key_size
    smaller than the key gives -FI_ETOOSMALL, with key_size set to what is needed."""
    if flags:
        return -FI_EBADFLAGS, 0, b"", key_size
    raw = struct.pack(RAW_KEY_FMT, mr.ibv_mr.rkey)
    if key_size < len(raw):
        return -FI_ETOOSMALL, 0, b"", len(raw)
    base = mr.addr if mr.domain.mr_mode & FI_MR_VIRT_ADDR else 0
    return 0, base, raw, len(raw)


@traced
def fi_mr_map_raw(domain: fid_domain, base_addr: int, raw_key: bytes, key_size: int,
                  flags: int = 0) -> tuple[int, int]:
    """Mirrors fi_mr_map_raw(): a peer's raw key as a 64-bit key usable in transfers."""
    if flags:
        return -FI_EBADFLAGS, 0
    if key_size != struct.calcsize(RAW_KEY_FMT) or len(raw_key) < key_size:
        return -FI_EINVAL, 0
    (rkey,) = struct.unpack(RAW_KEY_FMT, bytes(raw_key[:key_size]))
    key = domain.next_raw
    domain.next_raw += 1
    domain.raw_keys[key] = (base_addr, rkey)
    return 0, key


@traced
def fi_mr_unmap_key(domain: fid_domain, key: int) -> int:
    """Mirrors fi_mr_unmap_key(): forget a key fi_mr_map_raw made; -FI_EINVAL if none."""
    if domain.raw_keys.pop(key, None) is None:
        return -FI_EINVAL
    return 0


# -- binding, enabling, refresh ------------------------------------------------------------
@traced
def fi_mr_bind(mr: fid_mr, bfid: fid, flags: int = 0) -> int:
    """Mirrors fi_mr_bind(): an FI_MR_ENDPOINT MR to an endpoint, before fi_mr_enable.
    -FI_ENOSYS for a counter (verbs reports no RMA events), -FI_EINVAL for another
    object or a domain not in FI_MR_ENDPOINT mode, -FI_EOPBADSTATE once enabled."""
    if bfid.fclass == FI_CLASS_CNTR:
        return -FI_ENOSYS
    if bfid.fclass != FI_CLASS_EP or not mr.domain.mr_mode & FI_MR_ENDPOINT:
        return -FI_EINVAL
    if flags:
        return -FI_EBADFLAGS
    if mr.enabled:
        return -FI_EOPBADSTATE
    mr.eps.append(bfid)
    bfid.mrs.append(mr)
    return 0


@traced
def fi_mr_enable(mr: fid_mr) -> int:
    """Mirrors fi_mr_enable(): an FI_MR_ENDPOINT MR becomes usable once bound;
    -FI_EOPBADSTATE if it is not bound to an endpoint yet."""
    if mr.enabled:
        return 0
    if not mr.eps:
        return -FI_EOPBADSTATE
    mr.enabled = True
    return 0


@traced
def fi_mr_refresh(mr: fid_mr, iov: Sequence[tuple[int, int]], count: int,
                  flags: int = 0) -> int:
    """Mirrors fi_mr_refresh(): -FI_ENOSYS - the domain requires FI_MR_ALLOCATED, so the
    pages are pinned at registration and never need refreshing."""
    return -FI_ENOSYS


# -- close -----------------------------------------------------------------------------------
@traced
def fi_close(f: fid) -> int:
    """Mirrors fi_close() of an MR, endpoint or domain.  An MR bound to an open
    endpoint, or a domain with MRs or endpoints open, is -FI_EBUSY; a fid closed
    already (# EMU: undefined in libfabric) is -FI_EINVAL."""
    if not isinstance(f, fid) or f.closed:
        return -FI_EINVAL
    ret = _close(f)
    if ret == 0:
        f.closed = True
    return ret


def _close(f: fid) -> int:
    if isinstance(f, fid_mr):
        if f.eps:
            return -FI_EBUSY
        if f.entry is not None:
            ofi_mr_cache_delete(f.domain.cache, f.entry)     # lazily: the pin may stay
        else:
            ret = _dereg(f)
            if ret:
                return ret
        f.domain.mrs.remove(f)
        if f.domain.keys.get(f.key) is f:
            del f.domain.keys[f.key]
        return 0
    if isinstance(f, fid_ep):
        for mr in f.mrs:
            mr.eps.remove(f)
        f.mrs.clear()
        f.domain.eps.remove(f)
        return 0
    if isinstance(f, fid_domain):
        if f.mrs or f.eps:
            return -FI_EBUSY
        if f.cache is not None:
            ofi_mr_cache_cleanup(f.cache)        # nothing is in use: every entry goes
            memhooks_unsubscribe(f.proc, f.cache)
            if f.cache.uffd is not None:
                f.cache.uffd.stop()
        v.ibv_dealloc_pd(f.pd)
        v.ibv_close_device(f.ctx)
        return 0                       # the process's CUDA runtime is not the domain's
    return -FI_EINVAL                  # another kind of fid
