"""Mirrors the probe part of drivers/infiniband/hw/mlx5/main.c: stages, ops, probe/remove.

mlx5r_probe() runs when mlx5_core offers "mlx5_core.rdma.<n>": it allocates
the mlx5_ib_dev and runs __mlx5_ib_add(), the driver's profile - a table of
(init, cleanup) stages executed in order, unwound in reverse on a failing
stage and at remove:

    init          ports, capabilities, dump_fill_mkey (QUERY_SPECIAL_CONTEXTS),
                  the QP and SRQ tables on the async events / off them
    caps          the ops table (ib_set_device_ops)
    roce          enable RoCE on the NIC vport          / disable it
    clock         the clock-info page user space maps  / freed
    odp           ODP caps, the ODP mkey table          / the page-fault EQ, if made
    ib_reg        ib_register_device("mlx5_%d")        / ib_unregister_device

then sets ib_active, which alloc_ucontext checks (EAGAIN before).
# EMU: the real Ethernet profile has ~20 stages (flow steering, SRQ/XRC
# resources, counters, UMR, delay drop, restrack, debugfs); only those
# the control path above uses are modelled.  The device clock and its
# clock-info page are mlx5_core's (drivers/mlx5_core/clock.py); the "clock"
# stage starts and stops them, since the model's mlx5_load does not.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from drivers.ib_core.device import (
    ib_alloc_device,
    ib_dealloc_device,
    ib_device_ops,
    ib_register_device,
    ib_set_device_ops,
    ib_unregister_device,
)
from drivers.mlx5_core.clock import mlx5_cleanup_clock, mlx5_init_clock
from drivers.mlx5_core.driver import MLX5_CAP_DEV_MEM, MLX5_CAP_GEN
from drivers.mlx5_core.eq import mlx5_comp_vectors_max
from drivers.mlx5_core.ifc import MLX5_CAP_PORT_TYPE_ETH
from drivers.mlx5_core.vport import (
    mlx5_nic_vport_disable_roce,
    mlx5_nic_vport_enable_roce,
    mlx5_query_nic_vport_node_guid,
)
from drivers.mlx5_core.wc import mlx5_wc_support_get
from drivers.mlx5_ib.ah import mlx5_ib_ah, mlx5_ib_create_ah, mlx5_ib_destroy_ah
from drivers.mlx5_ib.cmd import mlx5_cmd_dump_fill_mkey
from drivers.mlx5_ib.cq import mlx5_ib_create_cq, mlx5_ib_destroy_cq, mlx5_ib_resize_cq
from drivers.mlx5_ib.devx import mlx5_ib_devx_methods
from drivers.mlx5_ib.dm import (
    mlx5_dm,
    mlx5_ib_alloc_dm,
    mlx5_ib_dealloc_dm,
    mlx5_ib_dm_methods,
    mlx5_ib_reg_dm_mr,
)
from drivers.mlx5_ib.gid import mlx5_ib_add_gid, mlx5_ib_del_gid, mlx5_ib_get_port_mac
from drivers.mlx5_ib.main import (
    mlx5_ib_alloc_pd,
    mlx5_ib_alloc_ucontext,
    mlx5_ib_dealloc_pd,
    mlx5_ib_dealloc_ucontext,
    mlx5_ib_query_ucontext,
)
from drivers.mlx5_ib.mlx5_ib import (
    mlx5_ib_cq,
    mlx5_ib_dev,
    mlx5_ib_mw,
    mlx5_ib_pd,
    mlx5_ib_port,
    mlx5_ib_qp,
    mlx5_ib_ucontext,
    parse_kernel_release,
)
from drivers.mlx5_ib.mmap import mlx5_ib_mmap, mlx5_ib_mmap_free, mlx5_ib_uar_methods
from drivers.mlx5_ib.mr import (
    mlx5_ib_alloc_mw,
    mlx5_ib_dealloc_mw,
    mlx5_ib_dereg_mr,
    mlx5_ib_reg_user_mr,
    mlx5_ib_reg_user_mr_dmabuf,
    mlx5_ib_rereg_user_mr,
)
from drivers.mlx5_ib.odp import mlx5_ib_advise_mr, mlx5_ib_odp_cleanup_one, mlx5_ib_odp_init_one
from drivers.mlx5_ib.qp import mlx5_ib_create_qp, mlx5_ib_destroy_qp
from drivers.mlx5_ib.qp_modify import mlx5_ib_modify_qp, mlx5_ib_query_qp
from drivers.mlx5_ib.qpc import mlx5_cleanup_qp_table, mlx5_init_qp_table
from drivers.mlx5_ib.query import (
    mlx5_get_dev_fw_str,
    mlx5_ib_get_link_layer,
    mlx5_ib_query_device,
    mlx5_ib_query_pkey,
    mlx5_ib_query_port,
    mlx5_port_roce_immutable,
)
from drivers.mlx5_ib.srq import (
    mlx5_cleanup_srq_table,
    mlx5_ib_alloc_xrcd,
    mlx5_ib_create_srq,
    mlx5_ib_dealloc_xrcd,
    mlx5_ib_destroy_srq,
    mlx5_ib_modify_srq,
    mlx5_ib_query_srq,
    mlx5_ib_srq,
    mlx5_ib_xrcd,
    mlx5_init_srq_table,
)
from drivers.mlx5_ib.std_types import mlx5_ib_std_types_methods
from drivers.mlx5_ib.wq import (
    mlx5_ib_create_rwq_ind_table,
    mlx5_ib_create_wq,
    mlx5_ib_destroy_rwq_ind_table,
    mlx5_ib_destroy_wq,
    mlx5_ib_modify_wq,
    mlx5_ib_rwq_ind_table,
)
from kernel_model.auxiliary import auxiliary_device, auxiliary_device_id, auxiliary_driver
from kernel_model.trace import traced

#: module parameters and their defaults (see __init__.py)
MLX5_IB_PARAMS: dict[str, bool | str] = {"dyn_uar": False, "comp_mask_v6": False,
                                         "mkey_update_tag": False, "release": "upstream"}
MLX5_IB_UVERBS_ABI_VERSION = 1
RDMA_DRIVER_MLX5 = 1  # enum rdma_driver_id

#: Mirrors mlx5_ib_dev_ops (the subset the model implements)
mlx5_ib_dev_ops = ib_device_ops(
    owner="mlx5_ib", driver_id=RDMA_DRIVER_MLX5, uverbs_abi_ver=MLX5_IB_UVERBS_ABI_VERSION,
    query_device=mlx5_ib_query_device, query_port=mlx5_ib_query_port,
    query_pkey=mlx5_ib_query_pkey,
    get_port_immutable=mlx5_port_roce_immutable, get_link_layer=mlx5_ib_get_link_layer,
    get_dev_fw_str=mlx5_get_dev_fw_str,
    alloc_ucontext=mlx5_ib_alloc_ucontext, dealloc_ucontext=mlx5_ib_dealloc_ucontext,
    query_ucontext=mlx5_ib_query_ucontext,
    mmap=mlx5_ib_mmap, mmap_free=mlx5_ib_mmap_free,
    uapi_methods={**mlx5_ib_uar_methods, **mlx5_ib_std_types_methods, **mlx5_ib_dm_methods,
                  **mlx5_ib_devx_methods},
    alloc_pd=mlx5_ib_alloc_pd, dealloc_pd=mlx5_ib_dealloc_pd,
    reg_user_mr=mlx5_ib_reg_user_mr, dereg_mr=mlx5_ib_dereg_mr,
    reg_user_mr_dmabuf=mlx5_ib_reg_user_mr_dmabuf,
    advise_mr=mlx5_ib_advise_mr,
    rereg_user_mr=mlx5_ib_rereg_user_mr,
    alloc_mw=mlx5_ib_alloc_mw, dealloc_mw=mlx5_ib_dealloc_mw,
    create_cq=mlx5_ib_create_cq, destroy_cq=mlx5_ib_destroy_cq, resize_cq=mlx5_ib_resize_cq,
    create_qp=mlx5_ib_create_qp, modify_qp=mlx5_ib_modify_qp, query_qp=mlx5_ib_query_qp,
    destroy_qp=mlx5_ib_destroy_qp,
    create_srq=mlx5_ib_create_srq, modify_srq=mlx5_ib_modify_srq, query_srq=mlx5_ib_query_srq,
    destroy_srq=mlx5_ib_destroy_srq, alloc_xrcd=mlx5_ib_alloc_xrcd,
    dealloc_xrcd=mlx5_ib_dealloc_xrcd,
    create_ah=mlx5_ib_create_ah, create_user_ah=mlx5_ib_create_ah,
    destroy_ah=mlx5_ib_destroy_ah,
    add_gid=mlx5_ib_add_gid, del_gid=mlx5_ib_del_gid, get_port_mac=mlx5_ib_get_port_mac,
    size_ib_ucontext=mlx5_ib_ucontext, size_ib_pd=mlx5_ib_pd, size_ib_cq=mlx5_ib_cq,
    size_ib_qp=mlx5_ib_qp, size_ib_ah=mlx5_ib_ah, size_ib_mw=mlx5_ib_mw,
    size_ib_srq=mlx5_ib_srq, size_ib_xrcd=mlx5_ib_xrcd,
)


#: Mirrors mlx5_ib_dev_dm_ops
mlx5_ib_dev_dm_ops = ib_device_ops(alloc_dm=mlx5_ib_alloc_dm, dealloc_dm=mlx5_ib_dealloc_dm,
                                   reg_dm_mr=mlx5_ib_reg_dm_mr)


#: Mirrors mlx5_ib_dev_common_roce_ops (an Ethernet port's): WQs and RSS tables
mlx5_ib_dev_common_roce_ops = ib_device_ops(
    create_rwq_ind_table=mlx5_ib_create_rwq_ind_table, create_wq=mlx5_ib_create_wq,
    destroy_rwq_ind_table=mlx5_ib_destroy_rwq_ind_table, destroy_wq=mlx5_ib_destroy_wq,
    modify_wq=mlx5_ib_modify_wq, size_ib_rwq_ind_table=mlx5_ib_rwq_ind_table)


# -- stages --------------------------------------------------------------------------------
@traced
def mlx5_ib_stage_init_init(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_stage_init_init(): ports, GUID, dump_fill_mkey, WC support; the
    QP and SRQ tables, listening on mlx5_core's async events."""
    mdev = dev.mdev
    dev.num_ports = MLX5_CAP_GEN(mdev, "num_ports")
    dev.phys_port_cnt = dev.num_ports
    dev.port = [mlx5_ib_port(i + 1) for i in range(dev.num_ports)]
    dev.node_guid = mlx5_query_nic_vport_node_guid(mdev)
    # mlx5_query_max_pkeys()  # EMU: a RoCE port's one default P_Key (see query.py)
    dev.pkey_table_len = 1
    dev.num_comp_vectors = mlx5_comp_vectors_max(mdev)
    dev.dev_parent = mdev.device
    if MLX5_CAP_GEN(mdev, "dump_fill_mkey"):
        dev.dump_fill_mkey = mlx5_cmd_dump_fill_mkey(mdev)
    dev.dm = mlx5_dm(mdev)  # spin_lock_init(&dev->dm.lock); dev->dm.dev = mdev
    dev.wc_support = mlx5_wc_support_get(mdev)  # may BlueFlame pages be write-combining
    mlx5_init_qp_table(dev)
    mlx5_init_srq_table(dev)


@traced
def mlx5_ib_stage_init_cleanup(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_stage_init_cleanup(): the SRQ and QP tables off the async events."""
    mlx5_cleanup_srq_table(dev)
    mlx5_cleanup_qp_table(dev)


def mlx5_ib_stage_caps_init(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_stage_caps_init(): the ops table (device memory only when the
    HCA has MEMIC)."""
    ib_set_device_ops(dev, mlx5_ib_dev_ops)
    if MLX5_CAP_GEN(dev.mdev, "device_memory") and MLX5_CAP_DEV_MEM(dev.mdev, "memic"):
        ib_set_device_ops(dev, mlx5_ib_dev_dm_ops)


@traced
def mlx5_ib_roce_init(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_roce_init(): an Ethernet port's ops (WQs, RSS tables), then
    mlx5_enable_eth(): RoCE on at the NIC vport."""
    if MLX5_CAP_GEN(dev.mdev, "port_type") == MLX5_CAP_PORT_TYPE_ETH:
        ib_set_device_ops(dev, mlx5_ib_dev_common_roce_ops)
    if MLX5_CAP_GEN(dev.mdev, "roce"):
        mlx5_nic_vport_enable_roce(dev.mdev)


@traced
def mlx5_ib_roce_cleanup(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_roce_cleanup() -> mlx5_disable_eth()."""
    if MLX5_CAP_GEN(dev.mdev, "roce"):
        mlx5_nic_vport_disable_roce(dev.mdev)


def mlx5_ib_stage_clock_init(dev: mlx5_ib_dev) -> None:
    """The device clock and its clock-info page (mlx5_core's mlx5_init_clock)."""
    mlx5_init_clock(dev.mdev)
    dev.clock_info = dev.mdev.clock_info


def mlx5_ib_stage_clock_cleanup(dev: mlx5_ib_dev) -> None:
    """mlx5_cleanup_clock(): the overflow work stopped, the page freed."""
    mlx5_cleanup_clock(dev.mdev)
    dev.clock_info = None


@traced
def mlx5_ib_stage_ib_reg_init(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_stage_ib_reg_init(): ib_register_device("mlx5_%d")."""
    ib_register_device(dev, "mlx5_%d", dev.mdev.device)


def mlx5_ib_stage_ib_reg_cleanup(dev: mlx5_ib_dev) -> None:
    """Mirrors mlx5_ib_stage_ib_reg_cleanup()."""
    ib_unregister_device(dev)


@attrs.frozen
class mlx5_ib_stage:
    """Mirrors struct mlx5_ib_stage: one init/cleanup pair of the profile."""

    name: str
    init: Callable[[mlx5_ib_dev], None]
    cleanup: Callable[[mlx5_ib_dev], None] | None = None


#: Mirrors pf_profile (the stages this model has), in order
pf_profile: tuple[mlx5_ib_stage, ...] = (
    mlx5_ib_stage("init", mlx5_ib_stage_init_init, mlx5_ib_stage_init_cleanup),
    mlx5_ib_stage("caps", mlx5_ib_stage_caps_init),
    mlx5_ib_stage("roce", mlx5_ib_roce_init, mlx5_ib_roce_cleanup),
    mlx5_ib_stage("odp", mlx5_ib_odp_init_one, mlx5_ib_odp_cleanup_one),
    mlx5_ib_stage("clock", mlx5_ib_stage_clock_init, mlx5_ib_stage_clock_cleanup),
    mlx5_ib_stage("ib_reg", mlx5_ib_stage_ib_reg_init, mlx5_ib_stage_ib_reg_cleanup),
)


@traced
def __mlx5_ib_remove(dev: mlx5_ib_dev, profile: tuple[mlx5_ib_stage, ...], stage: int) -> None:
    """Mirrors __mlx5_ib_remove(): the cleanups of stages [0, stage), newest first."""
    dev.ib_active = False
    for st in reversed(profile[:stage]):
        if st.cleanup is not None:
            st.cleanup(dev)
    ib_dealloc_device(dev)


@traced
def __mlx5_ib_add(dev: mlx5_ib_dev, profile: tuple[mlx5_ib_stage, ...]) -> None:
    """Mirrors __mlx5_ib_add(): each stage's init; a failure unwinds the earlier ones."""
    for i, st in enumerate(profile):
        try:
            st.init(dev)
        except BaseException:
            __mlx5_ib_remove(dev, profile, i)  # err_out:
            raise
    dev.ib_active = True


def mlx5r_driver(params: dict[str, bool | str]) -> auxiliary_driver:
    """The auxiliary driver "mlx5_ib.rdma" with this module instance's parameters."""

    @traced
    def mlx5r_probe(adev: auxiliary_device, ident: auxiliary_device_id) -> None:
        """Mirrors mlx5r_probe(): allocate the mlx5_ib_dev, run the profile."""
        dev = ib_alloc_device(mlx5_ib_dev)
        dev.mdev, dev.adev = adev.mdev, adev
        dev.dyn_uar = params["dyn_uar"]
        dev.comp_mask_v6 = params["comp_mask_v6"]
        dev.mkey_update_tag = params["mkey_update_tag"]
        dev.release = parse_kernel_release(str(params["release"]))
        __mlx5_ib_add(dev, pf_profile)
        adev.drvdata = dev  # auxiliary_set_drvdata()

    @traced
    def mlx5r_remove(adev: auxiliary_device) -> None:
        """Mirrors mlx5r_remove(): every stage's cleanup."""
        dev = adev.drvdata
        __mlx5_ib_remove(dev, pf_profile, len(pf_profile))
        adev.drvdata = None

    return auxiliary_driver("mlx5_ib.rdma", ["mlx5_core.rdma"], mlx5r_probe, mlx5r_remove)
