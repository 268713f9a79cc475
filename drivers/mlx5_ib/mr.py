"""Mirrors drivers/infiniband/hw/mlx5/mr.c (user MRs): reg_user_mr, rereg_user_mr, dereg_mr.

ibv_reg_mr(pd, addr, len, access) reaches mlx5_ib_reg_user_mr():

    ib_umem_get(addr, len, access)    pin + DMA-map (FOLL_WRITE only if writable)
    mlx5_umem_find_best_pgsz          the largest page size the mkc can say that
                                      the DMA layout and the iova both allow
    reg_create                        create_mkey_in: mkc access bits (a/rw/rr/lw/lr),
                                      pd, start_addr = iova, len, log_page_size,
                                      translations_octword_size, and the MTT filled
                                      by mlx5_ib_populate_pas (one entry per block)
    mlx5_ib_create_mkey               CREATE_MKEY, the key = index << 8 | variant
    set_mr_fields                     lkey = rkey = the key

# EMU: the upstream mkey cache is not modelled: every pinned user MR takes
# reg_create(populate=true), the path the kernel uses when UMR cannot load the
# PAS, so CREATE_MKEY always carries the MTT.  The user-visible result (a key
# whose MTT maps the pinned pages) is the same.  ODP and dma-buf MRs are created
# empty and loaded by UMR (EMU_UMR_UPDATE_XLT), as upstream.  The MLNX_OFED 4.x
# peer path (below) does take a cached mkey and enables it by UMR, because its
# order of steps is a bug the race corpus needs.

Peer memory (MLNX_OFED): ib_umem_get_peer(..., IB_PEER_MEM_INVAL_SUPP) lets
a peer client back the MR when gup cannot (GPU memory); once the mkey
exists create_real_mr activates the invalidation notifier
(mlx5_invalidate_umem revokes the mkey by UMR), and dereg revokes the mkey,
stops the notifier, then destroys the mkey and releases the umem.  Peer
umems never take the cached-mkey path (reg_create always, as here).

Lock order: none of the driver's own (ib_umem_get takes the mm's locks).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from drivers.ib_core.ib_verbs import (
    IB_ACCESS_LOCAL_WRITE,
    IB_ACCESS_ON_DEMAND,
    IB_ACCESS_RELAXED_ORDERING,
    IB_ACCESS_REMOTE_ATOMIC,
    IB_ACCESS_REMOTE_READ,
    IB_ACCESS_REMOTE_WRITE,
    IB_MR_REREG_ACCESS,
    IB_MR_REREG_PD,
    IB_MR_REREG_TRANS,
    IB_MW_TYPE_2,
    ib_copy_from_udata,
    ib_is_udata_cleared,
    ib_udata,
)
from drivers.ib_core.peer_mem import (
    IB_PEER_MEM_INVAL_SUPP,
    ib_umem_activate_invalidation_notifier,
    ib_umem_stop_invalidation_notifier,
    peer_ticket_design,
)
from drivers.ib_core.umem import (
    ib_umem,
    ib_umem_check_rereg,
    ib_umem_get_peer,
    ib_umem_num_dma_blocks,
    ib_umem_release,
)
from drivers.ib_core.umem_dmabuf import (
    ib_umem_dmabuf_get,
    ib_umem_dmabuf_unmap_pages,
)
from drivers.ib_core.umem_odp import ib_umem_odp_get
from drivers.mlx5_core.driver import MLX5_CAP_GEN
from drivers.mlx5_core.ifc import (
    MLX5_ADDR_OF,
    MLX5_MKC_ACCESS_MODE_KLMS,
    MLX5_MKC_ACCESS_MODE_MTT,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
)
from drivers.mlx5_core.mr import mlx5_core_create_mkey, mlx5_core_destroy_mkey
from drivers.mlx5_ib.mem import mlx5_ib_populate_pas, mlx5_umem_find_best_pgsz
from drivers.mlx5_ib.mlx5_ib import (
    MLX5_MKEY_MR,
    MLX5_MKEY_MW,
    mlx5_ib_dev,
    mlx5_ib_mkey,
    mlx5_ib_mr,
    mlx5_ib_mw,
    mlx5_ib_pd,
    mlx5_ib_warn,
    order_base_2,
    to_mdev,
    to_mpd,
)
from drivers.mlx5_ib.odp import (
    IB_ODP_SUPPORT_IMPLICIT,
    MLX5_IB_UPD_XLT_ZAP,
    mlx5_ib_alloc_implicit_mr,
    mlx5_ib_free_implicit_mr,
    mlx5_ib_init_dmabuf_mr,
    mlx5_ib_init_odp_mr,
    mlx5_mn_ops,
    mlx5r_erase_odp_mkey,
    mlx5r_odp_create_eq,
    mlx5r_store_odp_mkey,
    mlx5r_umr_update_mr_pas,
)
from drivers.mlx5_ib.umr import (
    mlx5_ib_post_send_wait_update,
    mlx5r_umr_can_reconfig,
    mlx5r_umr_rereg_pd_access,
    mlx5r_umr_revoke_mr,
)
from kernel_model.dma_buf import dma_buf_attach_ops
from kernel_model.errno import EINVAL, EOPNOTSUPP, KernelError
from kernel_model.lockdep import lockdep_assert_held
from kernel_model.locking import (
    complete,
    init_completion,
    mutex_lock,
    mutex_unlock,
    wait_for_completion,
)
from kernel_model.slab import kfree, kmalloc_obj
from kernel_model.trace import traced
from kernel_model.uapi.mlx5_abi import mlx5_ib_alloc_mw as mlx5_ib_alloc_mw_req

MLX5_IB_MTT_READ, MLX5_IB_MTT_WRITE = 1 << 0, 1 << 1
MLX5_IB_MTT_PRESENT = MLX5_IB_MTT_READ | MLX5_IB_MTT_WRITE


def get_octo_len(addr: int, length: int, page_shift: int) -> int:
    """Mirrors get_octo_len(): 16-byte octowords of MTT (two 8-byte entries each)."""
    page_size = 1 << page_shift
    offset = addr & (page_size - 1)
    npages = (length + offset + page_size - 1) >> page_shift
    return (npages + 1) // 2


def set_mkc_access_pd_addr_fields(mkc: IfcStruct, acc: int, start_addr: int,
                                  pd: mlx5_ib_pd) -> None:
    """Mirrors set_mkc_access_pd_addr_fields(): local read always; the rest by
    the access flags."""
    MLX5_SET("mkc", mkc, "a", bool(acc & IB_ACCESS_REMOTE_ATOMIC))
    MLX5_SET("mkc", mkc, "rw", bool(acc & IB_ACCESS_REMOTE_WRITE))
    MLX5_SET("mkc", mkc, "rr", bool(acc & IB_ACCESS_REMOTE_READ))
    MLX5_SET("mkc", mkc, "lw", bool(acc & IB_ACCESS_LOCAL_WRITE))
    MLX5_SET("mkc", mkc, "lr", 1)
    MLX5_SET("mkc", mkc, "pd", pd.pdn)
    MLX5_SET64("mkc", mkc, "start_addr", start_addr)


@traced
def mlx5_ib_create_mkey(dev: mlx5_ib_dev, mkey: mlx5_ib_mkey, in_: IfcStruct) -> None:
    """Mirrors mlx5_ib_create_mkey(): assign_mkey_variant (an 8-bit rolling counter,
    so a recycled index gives a new key), then CREATE_MKEY."""
    dev.mkey_var = (dev.mkey_var + 1) & 0xFF  # atomic_inc_return(&dev->mkey_var)
    MLX5_SET("mkc", MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry"),
             "mkey_7_0", dev.mkey_var)
    mkey.key = mlx5_core_create_mkey(dev.mdev, in_)


def set_mr_fields(mr: mlx5_ib_mr, length: int, access_flags: int, iova: int) -> None:
    """Mirrors set_mr_fields(): lkey = rkey = the mkey."""
    mr.lkey = mr.rkey = mr.mmkey.key
    mr.length, mr.access_flags, mr.iova = length, access_flags, iova


@traced
def reg_create(pd: mlx5_ib_pd, umem: ib_umem, iova: int, access_flags: int,
               page_size: int, populate: bool = True) -> mlx5_ib_mr:
    """Mirrors reg_create(..., MLX5_MKC_ACCESS_MODE_MTT): with populate the mkey with
    its MTT in the command; without (alloc_cacheable_mr's dma-buf case) an mkey created
    free, its MTT all not present, to be loaded by UMR."""
    dev = to_mdev(pd.device)
    pg_cap = bool(MLX5_CAP_GEN(dev.mdev, "pg"))
    mr = kmalloc_obj(mlx5_ib_mr(pd.device))
    with ExitStack() as unwind:
        unwind.callback(kfree, mr)                                     # err_1:
        mr.page_shift = order_base_2(page_size)
        nblocks = ib_umem_num_dma_blocks(umem, page_size)
        in_ = IfcStruct("create_mkey_in", klm_pas_mtt=nblocks + (nblocks & 1))  # roundup 2
        if populate:
            mlx5_ib_populate_pas(umem, page_size,
                                 MLX5_ADDR_OF("create_mkey_in", in_, "klm_pas_mtt"),
                                 MLX5_IB_MTT_PRESENT if pg_cap else 0)
        MLX5_SET("create_mkey_in", in_, "pg_access", pg_cap)
        MLX5_SET("create_mkey_in", in_, "uid", pd.uid)
        mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
        set_mkc_access_pd_addr_fields(mkc, access_flags, iova, pd)
        MLX5_SET("mkc", mkc, "free", int(not populate))
        MLX5_SET("mkc", mkc, "access_mode_1_0", MLX5_MKC_ACCESS_MODE_MTT)
        MLX5_SET64("mkc", mkc, "len", umem.length)
        MLX5_SET("mkc", mkc, "bsf_octword_size", 0)
        octo = get_octo_len(iova, umem.length, mr.page_shift)
        MLX5_SET("mkc", mkc, "translations_octword_size", octo)
        MLX5_SET("mkc", mkc, "log_page_size", mr.page_shift)
        if populate:
            MLX5_SET("create_mkey_in", in_, "translations_octword_actual_size", octo)
        mlx5_ib_create_mkey(dev, mr.mmkey, in_)
        unwind.pop_all()
    mr.mmkey.type = MLX5_MKEY_MR
    mr.mmkey.ndescs = octo
    mr.umem = umem
    set_mr_fields(mr, umem.length, access_flags, iova)
    return mr


@traced
def create_real_mr(pd: mlx5_ib_pd, umem: ib_umem, iova: int, access_flags: int) -> mlx5_ib_mr:
    """Mirrors create_real_mr(): the best page size, then reg_create (see the EMU note).

    EINVAL when no page size the mkey can encode fits the layout.
    """
    page_size = mlx5_umem_find_best_pgsz(umem, "mkc", "log_page_size", 0, iova)
    if not page_size:
        raise KernelError(EINVAL, "create_real_mr: no page size fits the region and iova")
    mr = reg_create(pd, umem, iova, access_flags, page_size)
    if umem.is_peer and not peer_ticket_design():
        # the mkey exists: from here an invalidation can revoke it
        ib_umem_activate_invalidation_notifier(umem, mlx5_invalidate_umem, mr)
    return mr


@traced
def mlx5_invalidate_umem(umem: ib_umem, priv: mlx5_ib_mr) -> None:
    """Mirrors mlx5_invalidate_umem() (MLNX_OFED mr.c): the peer's memory is going -
    revoke the mkey, so the HCA cannot reach the pages once this returns.  It returns
    void and the kernel drops the revoke's result; # EMU: the model also warns."""
    try:
        mlx5r_umr_revoke_mr(priv)
    except KernelError as e:
        mlx5_ib_warn(to_mdev(priv.device), f"mlx5_invalidate_umem: revoke failed: {e}")


@traced
def create_user_odp_mr(pd: mlx5_ib_pd, start: int, length: int, iova: int,
                       access_flags: int) -> mlx5_ib_mr:
    """Mirrors create_user_odp_mr() (explicit ODP): the page-fault EQ made if it is the
    first, an ODP umem (nothing pinned), an mkey with pg_access whose MTT entries start
    not present (created free, as alloc_cacheable_mr's mkey is), stored among the ODP
    mkeys, then mlx5_ib_init_odp_mr (the pages already present loaded, the mkey on).

    Implicit ODP (start 0, length U64_MAX) is mlx5_ib_alloc_implicit_mr: EINVAL for an
    iova other than 0 or a device without IB_ODP_SUPPORT_IMPLICIT.
    ib_umem_odp_get's errors; firmware errors.  Every step unwound on failure."""
    dev = to_mdev(pd.device)
    mlx5r_odp_create_eq(dev, dev.odp_pf_eq)
    if start == 0 and length == (1 << 64) - 1:
        if iova != 0:
            raise KernelError(EINVAL, "create_user_odp_mr: implicit MR with an iova")
        if not dev.odp_caps.general_caps & IB_ODP_SUPPORT_IMPLICIT:
            raise KernelError(EINVAL, "create_user_odp_mr: no implicit ODP support")
        return mlx5_ib_alloc_implicit_mr(pd, access_flags)
    odp = ib_umem_odp_get(pd.device, start, length, access_flags, mlx5_mn_ops)
    with ExitStack() as unwind:
        unwind.callback(ib_umem_release, odp)
        mr = kmalloc_obj(mlx5_ib_mr(pd.device))
        unwind.callback(kfree, mr)
        mr.page_shift = odp.page_shift
        npages = odp.npages
        in_ = IfcStruct("create_mkey_in", klm_pas_mtt=npages + (npages & 1))
        MLX5_SET("create_mkey_in", in_, "pg_access", 1)
        MLX5_SET("create_mkey_in", in_, "uid", pd.uid)
        mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
        set_mkc_access_pd_addr_fields(mkc, access_flags, iova, pd)
        MLX5_SET("mkc", mkc, "free", 1)           # on once mlx5_ib_init_odp_mr loaded it
        MLX5_SET("mkc", mkc, "access_mode_1_0", MLX5_MKC_ACCESS_MODE_MTT)
        MLX5_SET64("mkc", mkc, "len", length)
        octo = get_octo_len(iova, length, mr.page_shift)
        MLX5_SET("mkc", mkc, "translations_octword_size", octo)
        MLX5_SET("mkc", mkc, "log_page_size", mr.page_shift)
        MLX5_SET("create_mkey_in", in_, "translations_octword_actual_size", octo)
        mlx5_ib_create_mkey(dev, mr.mmkey, in_)
        unwind.callback(mlx5_core_destroy_mkey, dev.mdev, mr.mmkey.key)
        mr.mmkey.type = MLX5_MKEY_MR
        mr.mmkey.ndescs = octo
        mr.umem = odp
        set_mr_fields(mr, length, access_flags, iova)
        odp.private = mr
        mlx5r_store_odp_mkey(dev, mr)
        unwind.callback(mlx5r_erase_odp_mkey, dev, mr)
        mlx5_ib_init_odp_mr(mr)
        unwind.pop_all()
    return mr


@traced
def mlx5_ib_reg_user_mr(pd: mlx5_ib_pd, start: int, length: int, iova: int,
                        access_flags: int, udata: ib_udata) -> mlx5_ib_mr:
    """Mirrors mlx5_ib_reg_user_mr(): pin the range, then create the mkey.

    On-demand paging goes to create_user_odp_mr; ib_umem_get's errors
    (EINVAL for length 0 or a wrapping range, EFAULT, ENOMEM/EPERM for the
    memlock limit); EINVAL from create_real_mr; firmware errors.  On any
    failure the umem is released.
    """
    if access_flags & IB_ACCESS_ON_DEMAND:
        return create_user_odp_mr(pd, start, length, iova, access_flags)
    # MLNX_OFED: a user MR may be backed by a peer-memory client that invalidates
    umem = ib_umem_get_peer(pd.device, start, length, access_flags, IB_PEER_MEM_INVAL_SUPP)
    if getattr(umem, "invalidation_ctx", None) is not None:
        return reg_user_mr_ticket(pd, umem, iova, access_flags)
    try:
        return create_real_mr(pd, umem, iova, access_flags)
    except BaseException:
        if umem.is_peer:
            ib_umem_stop_invalidation_notifier(umem)   # stop without activate
        ib_umem_release(umem)
        raise


@traced
def mlx5_ib_dereg_mr(mr: mlx5_ib_mr, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_dereg_mr() -> __mlx5_ib_dereg_mr(): DESTROY_MKEY (the HCA can
    no longer reach the pages), then unpin them, then free the MR."""
    dev = to_mdev(mr.device)
    if mr.peer_id is not None:
        dereg_mr_ticket(mr)
        return
    if mr.umem is not None and mr.umem.is_dmabuf:
        # no page fault finds the MR any more (and none still uses it); under the
        # dma_resv (mlx5_revoke_mr) the mkey goes and no move_notify reaches the MR;
        # then ib_umem_release unmaps, detaches and puts the dma-buf
        umem = mr.umem
        mlx5r_erase_odp_mkey(dev, mr)
        mutex_lock(umem.attach.dmabuf.resv)
        try:
            mlx5_core_destroy_mkey(dev.mdev, mr.mmkey.key)
            umem.private = None
        finally:
            mutex_unlock(umem.attach.dmabuf.resv)
        ib_umem_release(umem)
        mr.umem = None
        kfree(mr)
        return
    if mr.umem is not None and mr.umem.is_odp:
        # no page fault finds the MR any more, none still uses it; then the mkey goes
        # and ib_umem_release removes the notifier and unmaps what is mapped
        mlx5r_erase_odp_mkey(dev, mr)
        if mr.is_odp_implicit:
            mlx5_ib_free_implicit_mr(mr)          # the parent mkey, the children, the root
            return
    if mr.umem is not None and mr.umem.is_peer:
        # mlx5r_handle_mkey_cleanup(): fence the DMA, then no more invalidations
        mlx5r_umr_revoke_mr(mr)
        ib_umem_stop_invalidation_notifier(mr.umem)
    mlx5_core_destroy_mkey(dev.mdev, mr.mmkey.key)
    ib_umem_release(mr.umem)
    mr.umem = None
    kfree(mr)



def can_use_umr_rereg_access(dev: mlx5_ib_dev, current_access_flags: int,
                             target_access_flags: int) -> bool:
    """Mirrors can_use_umr_rereg_access(): a UMR can change only the local/remote
    write, remote read, atomic and relaxed-ordering bits (and only those
    mlx5r_umr_can_reconfig allows); MW_BIND, ZERO_BASED, ON_DEMAND... need a new mkey."""
    diffs = current_access_flags ^ target_access_flags
    if diffs & ~(IB_ACCESS_LOCAL_WRITE | IB_ACCESS_REMOTE_WRITE | IB_ACCESS_REMOTE_READ
                 | IB_ACCESS_RELAXED_ORDERING | IB_ACCESS_REMOTE_ATOMIC):
        return False
    return mlx5r_umr_can_reconfig(dev, current_access_flags, target_access_flags)


@traced
def mlx5_ib_rereg_user_mr(ib_mr: mlx5_ib_mr, flags: int, start: int, length: int, iova: int,
                          new_access_flags: int, new_pd: mlx5_ib_pd,
                          udata: ib_udata) -> mlx5_ib_mr | None:
    """Mirrors mlx5_ib_rereg_user_mr(): change an MR's translation, PD or access - in
    place when a UMR can (None: the same MR, the same keys), else a new MR the core
    puts behind the handle (the old one is deregistered by the core).

    Without TRANS: a UMR changes the PD and access of the live mkey when the access
    change is one a UMR can make; otherwise the umem is kept, the old mkey revoked and
    a new one created over it (create_real_mr: new keys) - EOPNOTSUPP when there is no
    plain umem to keep (a dma-buf MR).  With TRANS: new pages, a new mkey
    (mlx5_ib_reg_user_mr, the "recreate" path; a dma-buf MR becomes a plain one).

    EOPNOTSUPP for flags other than TRANS/PD/ACCESS; EACCES from ib_umem_check_rereg
    (writable access over a read-only pinning); EFAULT when the UMR fails (a revoked
    mkey); the errors of ib_umem_get and create_real_mr.

    MLNX_OFED: a peer MR cannot be changed (its invalidation races any change):
    EOPNOTSUPP.  # EMU: a peer MR's rereg gets OFED 5.1's EOPNOTSUPP in every release;
    later releases send a peer MR's TRANS rereg down the recreate path instead.
    """
    mr = ib_mr
    dev = to_mdev(mr.device)
    if flags & ~(IB_MR_REREG_TRANS | IB_MR_REREG_PD | IB_MR_REREG_ACCESS):
        raise KernelError(EOPNOTSUPP, f"mlx5_ib_rereg_user_mr: flags {flags:#x}")
    if mr.umem is not None and mr.umem.is_peer:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_rereg_user_mr: a peer-memory MR")
    ib_umem_check_rereg(mr.umem, flags, new_access_flags)
    if not flags & IB_MR_REREG_ACCESS:
        new_access_flags = mr.access_flags
    if not flags & IB_MR_REREG_PD:
        new_pd = mr.pd
    if not flags & IB_MR_REREG_TRANS:
        # the fast path for a PD/access change
        if can_use_umr_rereg_access(dev, mr.access_flags, new_access_flags):
            mlx5r_umr_rereg_pd_access(mr, new_pd, new_access_flags)
            return None
        if (mr.umem is not None and mr.umem.is_odp) or \
                (mr.access_flags ^ new_access_flags) & IB_ACCESS_ON_DEMAND:
            # EMU: upstream recreates the MR (mlx5_ib_reg_user_mr over start/length);
            # the model refuses an access-only rereg of or into an on-demand MR
            raise KernelError(EOPNOTSUPP, "mlx5_ib_rereg_user_mr: on-demand paging needs "
                              "a new registration")
        # DM and dma-buf MRs have no plain umem to reuse
        if mr.umem is None or mr.umem.is_dmabuf:
            raise KernelError(EOPNOTSUPP, "mlx5_ib_rereg_user_mr: no umem to reuse for "
                              "the access change")
        # one live MR per umem: revoke the old mkey before the new one takes the umem
        mlx5r_umr_revoke_mr(mr)
        umem, mr.umem = mr.umem, None
        try:
            return create_real_mr(new_pd, umem, mr.iova, new_access_flags)
        except BaseException:
            ib_umem_release(umem)       # create_real_mr's error path: the old MR stays revoked
            raise
    # TRANS.  With a plain umem and an access change a UMR can make, upstream pins the
    # new range and, for an MR whose mkey came from the mkey cache and is big enough
    # (can_use_umr_rereg_pas), loads the new translation by UMR (umr_rereg_pas).
    # EMU: can_use_umr_rereg_pas never holds (no mkey cache in the model), so a TRANS
    # rereg always gets a new mkey over new pages: mlx5_ib_reg_user_mr's pin + create.
    return mlx5_ib_reg_user_mr(new_pd, start, length, iova, new_access_flags, udata)


# -- memory windows (upstream mr.c: mlx5_ib_alloc_mw, mlx5_ib_dealloc_mw) ----------------------
@traced
def mlx5_ib_alloc_mw(ibmw: mlx5_ib_mw, udata: ib_udata) -> None:
    """Mirrors mlx5_ib_alloc_mw(): a free KLM mkey in the window's PD that UMR may bind
    (umr_en), local read only, not bound to a QP (qpn 0xffffff); a type 2 window may
    be invalidated remotely (en_rinval).  Its key is the window's rkey.

    EOPNOTSUPP for a request with comp_mask or reserved bits, or bytes past it that
    are not zero; the firmware's errors."""
    dev = to_mdev(ibmw.device)
    req = ib_copy_from_udata(mlx5_ib_alloc_mw_req, udata,
                             min(udata.inlen, mlx5_ib_alloc_mw_req.SIZE))
    if req.comp_mask or req.reserved1 or req.reserved2:
        raise KernelError(EOPNOTSUPP, "mlx5_ib_alloc_mw: comp_mask or reserved bits")
    if udata.inlen > mlx5_ib_alloc_mw_req.SIZE and not ib_is_udata_cleared(
            udata, mlx5_ib_alloc_mw_req.SIZE, udata.inlen - mlx5_ib_alloc_mw_req.SIZE):
        raise KernelError(EOPNOTSUPP, "mlx5_ib_alloc_mw: non-zero bytes past the request")
    ndescs = -(-max(req.num_klms, 1) // 4) * 4
    in_ = IfcStruct("create_mkey_in")
    MLX5_SET("create_mkey_in", in_, "uid", to_mpd(ibmw.pd).uid)
    mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "free", 1)
    MLX5_SET("mkc", mkc, "translations_octword_size", ndescs)
    MLX5_SET("mkc", mkc, "pd", to_mpd(ibmw.pd).pdn)
    MLX5_SET("mkc", mkc, "umr_en", 1)
    MLX5_SET("mkc", mkc, "lr", 1)
    MLX5_SET("mkc", mkc, "access_mode_1_0", MLX5_MKC_ACCESS_MODE_KLMS)
    MLX5_SET("mkc", mkc, "en_rinval", ibmw.type == IB_MW_TYPE_2)
    MLX5_SET("mkc", mkc, "qpn", 0xFFFFFF)
    mlx5_ib_create_mkey(dev, ibmw.mmkey, in_)
    ibmw.mmkey.type = MLX5_MKEY_MW
    ibmw.rkey = ibmw.mmkey.key
    ibmw.mmkey.ndescs = ndescs
    # the response (comp_mask, response_length) only when the caller has room for it:
    # rdma-core's libmlx5 asks for none


@traced
def mlx5_ib_dealloc_mw(ibmw: mlx5_ib_mw) -> None:
    """Mirrors mlx5_ib_dealloc_mw(): DESTROY_MKEY - a bound window's rkey is dead."""
    mlx5_core_destroy_mkey(to_mdev(ibmw.device).mdev, ibmw.mmkey.key)



# -- MLNX_OFED 4.x: the peer path with the ticket core (ib_core ofed="4.9") --------------------
# The notifier is armed before the mkey exists (a mlx5_ib_peer_id whose
# completion says "the MR is built, or failed"); an invalidation deregisters
# the whole MR - mkey, umem, the client's context - inside the peer's callback,
# and mr->invalidated decides whether that or the user's dereg does the
# teardown; the loser waits for the winner (MLNX_OFED 4.9 hw/mlx5/mr.c).
class mlx5_ib_peer_id:
    """Mirrors OFED 4.x struct mlx5_ib_peer_id: the MR an invalidation should tear down,
    once `comp` says registration finished (mr None: it failed)."""

    def __init__(self) -> None:
        self.comp = init_completion("mlx5_ib_peer_id comp")
        self.mr: mlx5_ib_mr | None = None

    def __repr__(self) -> str:
        return f"mlx5_ib_peer_id mr={self.mr!r}"


#: OFED 4.x use_umr(): MRs of up to 2^MLX5_MAX_UMR_SHIFT blocks take a cached mkey that a
#: UMR enables (# EMU: the bound without umr_extended_translation_offset, for every HCA)
MLX5_MAX_UMR_SHIFT = 16


def use_umr(order: int) -> bool:
    """Mirrors OFED 4.x use_umr(): is the MR small enough for the mkey cache?"""
    return order <= MLX5_MAX_UMR_SHIFT


@traced
def reg_user_mr_ticket(pd: mlx5_ib_pd, umem: ib_umem, iova: int,
                       access_flags: int) -> mlx5_ib_mr:
    """Mirrors OFED 4.x mlx5_ib_reg_user_mr() for a peer umem with an invalidation
    context: activate first (EINVAL if the peer already invalidated), then the mkey -
    a cached one (alloc_mr_from_cache) when use_umr(), else reg_create; on failure
    complete the peer_id with no MR, release the umem, free the peer_id.

    Then the MR is published to the invalidation (complete(peer_id->comp)) and only
    after that does mlx5_ib_update_xlt load and enable a cached mkey - the 4.x order
    (4.6 and 4.7 read).  An invalidation in between finds the mkey still free, so its
    unreg_umr posts nothing, and releases the umem: the ENABLE that follows either
    dereferences the umem it cleared or turns the mkey on over pages the peer took
    back.  5.x enables first and activates after; see the `dma-vs-invalidate` race.
    """
    peer_id = kmalloc_obj(mlx5_ib_peer_id())
    try:
        if ib_umem_activate_invalidation_notifier(umem, mlx5_invalidate_umem_ticket,
                                                  peer_id):
            raise KernelError(EINVAL, "mlx5_ib_reg_user_mr: pages were invalidated by peer")
        page_size = mlx5_umem_find_best_pgsz(umem, "mkc", "log_page_size", 0, iova)
        if page_size and use_umr(order_base_2(ib_umem_num_dma_blocks(umem, page_size))):
            mr = alloc_mr_from_cache(pd, umem, iova, access_flags, page_size)
        else:
            mr = create_real_mr(pd, umem, iova, access_flags)
    except BaseException:
        complete(peer_id.comp)
        ib_umem_release(umem)
        kfree(peer_id)
        raise
    mr.invalidated = 0
    mr.invalidation_comp = init_completion("mlx5_ib_mr invalidation_comp")
    peer_id.mr, mr.peer_id = mr, peer_id
    complete(peer_id.comp)
    if mr.allocated_from_cache:
        try:
            mlx5_ib_update_xlt(mr)
        except KernelError:
            # 4.x: dereg_mr(dev, mr), without looking at mr->invalidated: if an
            # invalidation tore the MR down while the UMR was outstanding, this is a
            # second teardown (peer_id freed twice) - a 4.x defect, kept (code-derived)
            _dereg_mr_ticket(mr)
            mlx5_mr_cache_free(mr)
            kfree(mr)
            raise
        mr.free = False
    return mr


@traced
def alloc_mr_from_cache(pd: mlx5_ib_pd, umem: ib_umem, iova: int, access_flags: int,
                        page_size: int) -> mlx5_ib_mr:
    """Mirrors OFED 4.x alloc_mr_from_cache(): an mkey from the cache entry of the MR's
    order - created free, for UMR - and the MR's software fields; nothing is posted.

    # EMU: the model's cache keeps no mkeys: the one taken is created here, in the
    # MR's PD with room for its translation, as the entry's refill work would have
    # made it, and mlx5_mr_cache_free destroys it instead of putting it back."""
    dev = to_mdev(pd.device)
    mr = kmalloc_obj(mlx5_ib_mr(pd.device))
    mr.page_shift = order_base_2(page_size)
    octo = get_octo_len(iova, umem.length, mr.page_shift)
    in_ = IfcStruct("create_mkey_in")
    MLX5_SET("create_mkey_in", in_, "uid", pd.uid)
    mkc = MLX5_ADDR_OF("create_mkey_in", in_, "memory_key_mkey_entry")
    MLX5_SET("mkc", mkc, "free", 1)
    MLX5_SET("mkc", mkc, "umr_en", 1)
    MLX5_SET("mkc", mkc, "access_mode_1_0", MLX5_MKC_ACCESS_MODE_MTT)
    MLX5_SET("mkc", mkc, "pd", pd.pdn)
    MLX5_SET("mkc", mkc, "qpn", 0xFFFFFF)
    MLX5_SET("mkc", mkc, "translations_octword_size", octo)
    MLX5_SET("mkc", mkc, "log_page_size", mr.page_shift)
    try:
        mlx5_ib_create_mkey(dev, mr.mmkey, in_)
    except BaseException:
        kfree(mr)
        raise
    mr.mmkey.type = MLX5_MKEY_MR
    mr.mmkey.ndescs = octo
    mr.allocated_from_cache = True
    mr.free = True
    mr.umem = umem
    mr.pd = pd                           # set_mr_fileds(): mr->ibmr.pd
    set_mr_fields(mr, umem.length, access_flags, iova)
    return mr


@traced
def mlx5_ib_update_xlt(mr: mlx5_ib_mr) -> None:
    """Mirrors OFED 4.x mlx5_ib_update_xlt(mr, 0, npages, page_shift,
    MLX5_IB_UPD_XLT_ENABLE): populate_xlt copies the translation out of mr->umem into
    the XLT buffer, then the UMR - posted under umrc->sem, waited for - loads it with
    the PD, access and range, and enables the mkey.  Nothing checks mr->invalidated,
    and mr->free stays set until the caller clears it after this returns."""
    dev = to_mdev(mr.device)
    pd = mr.pd
    page_size = 1 << mr.page_shift
    umem = mr.umem                       # populate_xlt: NULL once an invalidation ran
    nblocks = ib_umem_num_dma_blocks(umem, page_size)
    in_ = IfcStruct("emu_umr_update_mkey_in", klm_pas_mtt=nblocks + (nblocks & 1))
    pg_cap = bool(MLX5_CAP_GEN(dev.mdev, "pg"))
    mlx5_ib_populate_pas(umem, page_size,
                         MLX5_ADDR_OF("emu_umr_update_mkey_in", in_, "klm_pas_mtt"),
                         MLX5_IB_MTT_PRESENT if pg_cap else 0)
    mkc = MLX5_ADDR_OF("emu_umr_update_mkey_in", in_, "memory_key_mkey_entry")
    set_mkc_access_pd_addr_fields(mkc, mr.access_flags, mr.iova, pd)
    MLX5_SET64("mkc", mkc, "len", mr.length)
    MLX5_SET("mkc", mkc, "log_page_size", mr.page_shift)
    MLX5_SET("mkc", mkc, "translations_octword_size", mr.mmkey.ndescs)
    MLX5_SET("emu_umr_update_mkey_in", in_, "enable", 1)
    mlx5_ib_post_send_wait_update(mr, in_)


@traced
def unreg_umr(mr: mlx5_ib_mr) -> None:
    """Mirrors OFED 4.x unreg_umr(): a UMR that disables the mkey (DMA through it
    drained) - or nothing at all while the mkey is still free (mr->free), which is
    the state of a cached mkey until mlx5_ib_update_xlt enabled it.
    # EMU: the model's disabling UMR is the revoke's, which also moves the mkey
    # to the UMR PD (4.x keeps the PD: upstream 9ec4483a3f0f added the move)."""
    if mr.free:
        return
    mlx5r_umr_revoke_mr(mr)
    mr.free = True


@traced
def mlx5_mr_cache_free(mr: mlx5_ib_mr) -> None:
    """Mirrors OFED 4.x mlx5_mr_cache_free(): disable the mkey (unreg_umr), give it back
    to its cache entry (# EMU: destroyed, see alloc_mr_from_cache)."""
    unreg_umr(mr)
    mlx5_core_destroy_mkey(to_mdev(mr.device).mdev, mr.mmkey.key)


def _dereg_mr_ticket(mr: mlx5_ib_mr) -> None:
    """OFED 4.x dereg_mr() of a peer MR: clean_mr - DESTROY_MKEY, or for a cached mkey
    unreg_umr (it stays with the MR until the user's dereg gives it back) - the
    peer_id freed, then ib_umem_release: the client's dma_unmap, put_pages and
    release().  The peer_id goes before ib_umem_release takes the ticket off the
    client's list: an invalidation in between calls mlx5_invalidate_umem with the
    freed peer_id (4.3 to 5.0, code-derived; the dereg-vs-invalidate-ticket race)."""
    if mr.allocated_from_cache:
        unreg_umr(mr)
    else:
        mlx5_core_destroy_mkey(to_mdev(mr.device).mdev, mr.mmkey.key)
    kfree(mr.peer_id)
    umem, mr.umem = mr.umem, None
    ib_umem_release(umem)


@traced
def mlx5_invalidate_umem_ticket(cookie: mlx5_ib_peer_id, umem: ib_umem, addr: int,
                                size: int) -> None:
    """Mirrors OFED 4.x mlx5_invalidate_umem(): wait until registration finished; if
    the user's dereg got to mr->invalidated first, tell the core to wait for it
    (inflight_invalidation); else deregister the MR here (peer_callback), leaving
    only the mlx5_ib_mr for the user's dereg to free."""
    peer_id = cookie
    wait_for_completion(peer_id.comp)
    mr = peer_id.mr
    if mr is None:
        return
    mr.invalidated += 1                             # atomic_inc_return
    if mr.invalidated > 1:
        umem.invalidation_ctx.inflight_invalidation = 1
        return
    umem.invalidation_ctx.peer_callback = 1
    # EMU: 4.x dereg_mr reads umem->invalidation_ctx->peer_callback after
    # ib_umem_release freed the umem (code-derived); the model decided it above
    _dereg_mr_ticket(mr)
    complete(mr.invalidation_comp)


@traced
def dereg_mr_ticket(mr: mlx5_ib_mr) -> None:
    """Mirrors OFED 4.x mlx5_ib_dereg_mr() of a peer MR: if an invalidation got to
    mr->invalidated first, wait for its teardown; else tear down here (waking an
    invalidation that came meanwhile, through the core's ticket); free the MR."""
    mr.invalidated += 1                             # atomic_inc_return
    if mr.invalidated > 1:
        wait_for_completion(mr.invalidation_comp)
    else:
        _dereg_mr_ticket(mr)
    if mr.allocated_from_cache:
        mlx5_mr_cache_free(mr)
    kfree(mr)


# -- dma-buf MRs (upstream mr.c: mlx5_ib_reg_user_mr_dmabuf) -------------------------------------
@traced
def mlx5_ib_dmabuf_invalidate_cb(attach: Any) -> None:
    """Mirrors mlx5_ib_dmabuf_invalidate_cb(): the exporter moves the buffer (dma_resv
    held) - zap the MTT by UMR (the HCA's DMA through the mkey drained), then give
    the mapping back.  The mkey stays on: the next access through it page-faults
    and pagefault_dmabuf_mr maps the buffer where it is then.  Nothing for an MR
    not mapped yet, or being deregistered.

    # EMU: the lock is asserted through `attach` itself; upstream reaches it through
    # umem_dmabuf->attach, which ib_umem_dmabuf_get sets only after
    # dma_buf_dynamic_attach returned - a move_notify in between (the attachment is
    # on the exporter's list already) would dereference NULL with CONFIG_LOCKDEP."""
    umem = attach.importer_priv
    lockdep_assert_held(attach.dmabuf.resv)               # dma_resv_assert_held
    mr = umem.private
    if umem.sgt is None or mr is None:
        return
    try:
        mlx5r_umr_update_mr_pas(mr, MLX5_IB_UPD_XLT_ZAP)
    except KernelError as e:              # void upstream: the UMR's result is dropped
        mlx5_ib_warn(to_mdev(mr.device), f"mlx5_ib_dmabuf_invalidate_cb: zap failed: {e}")
    ib_umem_dmabuf_unmap_pages(umem)


mlx5_ib_dmabuf_attach_ops = dma_buf_attach_ops(move_notify=mlx5_ib_dmabuf_invalidate_cb,
                                               allow_peer2peer=True)


def mlx5_umem_dmabuf_default_pgsz(umem: ib_umem, iova: int) -> int:
    """Mirrors mlx5_umem_dmabuf_default_pgsz(): PAGE_SIZE (sets umem.iova), or 0 when
    iova and the offset differ inside a page."""
    ps = 1 << to_mdev(umem.ibdev).mdev.pdev.machine.page_shift
    if (iova ^ umem.address) & (ps - 1):
        return 0
    umem.iova = iova
    return ps


@traced
def alloc_dmabuf_mkey(pd: mlx5_ib_pd, umem: ib_umem, iova: int, access_flags: int
                      ) -> mlx5_ib_mr:
    """alloc_cacheable_mr() for a dma-buf umem -> reg_create(populate=false): an mkey of
    PAGE_SIZE entries, created free (on once the pages are loaded), with pg_access
    (an entry not present is a page fault) and its MTT all not present.  EINVAL when
    iova and offset differ inside a page."""
    page_size = mlx5_umem_dmabuf_default_pgsz(umem, iova)
    if not page_size:
        raise KernelError(EINVAL, "alloc_cacheable_mr: iova and offset differ in a page")
    return reg_create(pd, umem, iova, access_flags, page_size, populate=False)


@traced
def reg_user_mr_dmabuf(pd: mlx5_ib_pd, offset: int, length: int, virt_addr: int, fd: int,
                       access_flags: int) -> mlx5_ib_mr:
    """Mirrors reg_user_mr_dmabuf() (MTT mode, not pinned): attach dynamically
    (ib_umem_dmabuf_get with mlx5's move_notify), an empty free mkey
    (alloc_cacheable_mr), the MR published to the umem, the page-fault EQ made
    (EOPNOTSUPP without ODP), the mkey stored among the ODP mkeys (faults find it),
    then mlx5_ib_init_dmabuf_mr (mapped and loaded under the dma_resv, the mkey
    on).  A failure after the mkey exists deregisters the MR."""
    dev = to_mdev(pd.device)
    umem = ib_umem_dmabuf_get(pd.device, offset, length, fd, access_flags,
                              mlx5_ib_dmabuf_attach_ops)
    try:
        mr = alloc_dmabuf_mkey(pd, umem, virt_addr, access_flags)
    except BaseException:
        ib_umem_release(umem)
        raise
    umem.private = mr
    try:
        mlx5r_odp_create_eq(dev, dev.odp_pf_eq)
        mlx5r_store_odp_mkey(dev, mr)
        mlx5_ib_init_dmabuf_mr(mr)
    except BaseException:
        mlx5_ib_dereg_mr(mr, None)                        # err_dereg_mr
        raise
    return mr


@traced
def mlx5_ib_reg_user_mr_dmabuf(pd: mlx5_ib_pd, offset: int, length: int, virt_addr: int,
                               fd: int, access_flags: int, udata: ib_udata) -> mlx5_ib_mr:
    """Mirrors mlx5_ib_reg_user_mr_dmabuf(): reg_user_mr_dmabuf in MTT mode.

    EINVAL for on-demand-paging access (not with a dma-buf) and from
    ib_umem_dmabuf_get (a range past the buffer, empty or wrapping) or the page
    size; EBADF for a bad fd; EOPNOTSUPP on a device without ODP (the MR is
    filled by page faults); the exporter's attach/map errors.
    """
    if access_flags & IB_ACCESS_ON_DEMAND:
        raise KernelError(EINVAL, "mlx5_ib_reg_user_mr_dmabuf: on-demand access")
    return reg_user_mr_dmabuf(pd, offset, length, virt_addr, fd, access_flags)
