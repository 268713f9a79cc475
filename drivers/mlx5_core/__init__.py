"""Mirrors drivers/net/ethernet/mellanox/mlx5/core (the mlx5_core module): the mlx5 core driver.

module_init registers the pci_driver "mlx5_core"; every ConnectX function on
the bus is probed (main.probe_one) and, once up, offers an auxiliary device
"mlx5_core.rdma.<n>" for mlx5_ib.  module_exit unregisters the driver, which
removes every device it drives (main.remove_one).

The API other modules use (mlx5_ib):

    cmd.py       mlx5_cmd_exec(dev, in_, out), mlx5_cmd_exec_inout(dev, in_),
                 mlx5_cmd_do / mlx5_cmd_check, trace_mlx5_cmd
    ifc.py       IfcStruct, MLX5_SET/GET/SET64/ADDR_OF, opcodes, statuses
    driver.py    mlx5_core_dev, MLX5_CAP_GEN/_MAX, MLX5_CAP_ROCE, MLX5_CAP_ETH, fw_rev_*
    uar.py       mlx5_cmd_alloc_uar, mlx5_cmd_free_uar, mlx5_get_uars_page, uar2pfn
    mr.py        mlx5_core_create_mkey, mlx5_core_destroy_mkey, mlx5_idx_to_mkey
    cq.py        mlx5_core_cq, mlx5_core_create_cq, mlx5_core_destroy_cq
    eq.py        mlx5_comp_eqn_get, mlx5_comp_vectors_max
    transobj.py  mlx5_core_alloc_transport_domain, mlx5_core_dealloc_transport_domain
    vport.py     mlx5_query_nic_vport_*(), mlx5_query_min_inline, mlx5_nic_vport_enable_roce
    port.py      mlx5_query_port_ptys, mlx5_port_query_eth_proto, mlx5_query_port_*_mtu
    wc.py        mlx5_wc_support_get
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.main import DRIVER_NAME, MLX5_CORE_PCI_TABLE, probe_one, remove_one
from kernel_model.current import current
from kernel_model.pci import pci_driver, pci_register_driver, pci_unregister_driver

if TYPE_CHECKING:
    from kernel_model.module import module


def module_init(mod: module) -> pci_driver:
    """mlx5_init(): pci_register_driver(&mlx5_core_driver)."""
    drv = pci_driver(DRIVER_NAME, MLX5_CORE_PCI_TABLE, probe_one, remove_one)
    pci_register_driver(current().machine, drv)
    return drv


def module_exit(mod: module) -> None:
    """mlx5_cleanup(): pci_unregister_driver(&mlx5_core_driver)."""
    pci_unregister_driver(current().machine, mod.state)
