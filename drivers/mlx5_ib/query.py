"""Mirrors the query part of drivers/infiniband/hw/mlx5/main.c: device and port attributes.

mlx5_ib_query_device() turns the HCA capabilities into struct ib_device_attr
(ib_core caches it at registration, and QUERY_DEVICE answers from that
cache); mlx5_ib_query_port() answers QUERY_PORT for a RoCE port from the
NIC vport and the port registers (PTYS for speed and width, PMTU and the
vport MTU for the MTUs); mlx5_port_roce_immutable() gives ib_core the
per-port facts fixed at registration.

    max_send_sge = (min(max_wqe_sz_sq, 512) - ctrl 16 - raddr 16) / 16 = 30
    max_recv_sge = max_wqe_sz_rq / 16                                   = 32
    (ibv_devinfo's max_sge is the smaller: 30)

Lock order: none (every answer is read from the capability pages or a
firmware register query).
"""

from __future__ import annotations

from drivers.ib_core.ib_verbs import (
    IB_ATOMIC_HCA,
    IB_ATOMIC_NONE,
    IB_LINK_LAYER_ETHERNET,
    IB_MTU_256,
    IB_MTU_512,
    IB_MTU_1024,
    IB_MTU_2048,
    IB_MTU_4096,
    IB_PORT_ACTIVE,
    IB_PORT_DOWN,
    IB_QPT_RAW_PACKET,
    IB_SPEED_EDR,
    IB_SPEED_FDR,
    IB_SPEED_QDR,
    IB_SPEED_SDR,
    IB_WIDTH_1X,
    IB_WIDTH_2X,
    IB_WIDTH_4X,
    IBK_ON_DEMAND_PAGING,
    ib_device_attr,
    ib_is_udata_cleared,
    ib_port_attr,
    ib_port_immutable,
    ib_udata,
)
from drivers.mlx5_core.driver import (
    MLX5_CAP_DEV_MEM,
    MLX5_CAP_ETH,
    MLX5_CAP_GEN,
    MLX5_CAP_ROCE,
    fw_rev_maj,
    fw_rev_min,
    fw_rev_sub,
)
from drivers.mlx5_core.port import mlx5_port_query_eth_proto, mlx5_query_port_max_mtu
from drivers.mlx5_core.vport import (
    mlx5_core_query_vendor_id,
    mlx5_query_nic_vport_mtu,
    mlx5_query_nic_vport_system_image_guid,
)
from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, to_mdev
from kernel_model.errno import EINVAL, KernelError
from kernel_model.trace import traced

# include/rdma/ib_verbs.h: enum ib_device_cap_flags (the ones mlx5 sets here)
IB_DEVICE_RESIZE_MAX_WR = 1 << 0
IB_DEVICE_BAD_PKEY_CNTR = 1 << 1
IB_DEVICE_BAD_QKEY_CNTR = 1 << 2
IB_DEVICE_CHANGE_PHY_PORT = 1 << 5
IB_DEVICE_PORT_ACTIVE_EVENT = 1 << 10
IB_DEVICE_SYS_IMAGE_GUID = 1 << 11
IB_DEVICE_RC_RNR_NAK_GEN = 1 << 12
IB_DEVICE_MEM_WINDOW = 1 << 17
IB_DEVICE_XRC = 1 << 20
IB_DEVICE_MEM_MGT_EXTENSIONS = 1 << 21
IB_DEVICE_BLOCK_MULTICAST_LOOPBACK = 1 << 22
IB_DEVICE_MEM_WINDOW_TYPE_2B = 1 << 24
IB_DEVICE_RAW_IP_CSUM = 1 << 26
IB_DEVICE_RAW_SCATTER_FCS = 1 << 34
IB_DEVICE_PCI_WRITE_END_PADDING = 1 << 36
# enum ib_raw_packet_caps
IB_RAW_PACKET_CAP_CVLAN_STRIPPING, IB_RAW_PACKET_CAP_SCATTER_FCS = 1 << 0, 1 << 1
IB_RAW_PACKET_CAP_IP_CSUM = 1 << 2
# the CQ moderation limits: the widths of cqc.cq_max_count and cqc.cq_period
MLX5_MAX_CQ_COUNT, MLX5_MAX_CQ_PERIOD = (1 << 16) - 1, (1 << 12) - 1
MLX5_TIMESTAMP_MASK = 0x7FFFFFFFFFFFFFFF
# enum ib_port_capability_mask_bits, RDMA_CORE_PORT_*, IB_MGMT_MAD_SIZE
IB_PORT_CM_SUP = 1 << 16
IB_PORT_IP_BASED_GIDS = 1 << 26
RDMA_CORE_CAP_IB_MAD, RDMA_CORE_CAP_IB_CM = 0x1, 0x4
RDMA_CORE_CAP_PROT_ROCE, RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP = 0x200000, 0x800000
RDMA_CORE_PORT_IBA_ROCE = RDMA_CORE_CAP_PROT_ROCE | RDMA_CORE_CAP_IB_MAD | RDMA_CORE_CAP_IB_CM
RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP = RDMA_CORE_CAP_PROT_ROCE_UDP_ENCAP | RDMA_CORE_CAP_IB_MAD \
    | RDMA_CORE_CAP_IB_CM
IB_MGMT_MAD_SIZE = 256
IB_PORT_PHYS_STATE_DISABLED, IB_PORT_PHYS_STATE_LINK_UP = 3, 5
MLX5_ROCE_VERSION_1_CAP, MLX5_ROCE_VERSION_2_CAP = 1 << 0, 1 << 2
# mlx5 WQE segments (include/linux/mlx5/qp.h): ctrl, raddr, data are 16 bytes each
MLX5_WQE_SEG_SIZE = 16
MLX5_MAX_SGE_RD = (512 - 16 - 16) // 16
IB_MAX_MR_SIZE = (1 << 64) - 1

#: translate_eth_legacy_proto_oper(): PTYS legacy link-mode bit -> (speed, width)
_ETH_LEGACY_PROTO = {
    0: (IB_SPEED_SDR, IB_WIDTH_1X), 1: (IB_SPEED_SDR, IB_WIDTH_1X),          # 1000BASE
    2: (IB_SPEED_QDR, IB_WIDTH_1X), 3: (IB_SPEED_QDR, IB_WIDTH_1X),          # 10GBASE
    4: (IB_SPEED_QDR, IB_WIDTH_1X), 12: (IB_SPEED_QDR, IB_WIDTH_1X),
    13: (IB_SPEED_QDR, IB_WIDTH_1X), 14: (IB_SPEED_QDR, IB_WIDTH_1X),
    5: (IB_SPEED_QDR, IB_WIDTH_2X),                                         # 20GBASE_KR2
    6: (IB_SPEED_QDR, IB_WIDTH_4X), 7: (IB_SPEED_QDR, IB_WIDTH_4X),          # 40GBASE
    15: (IB_SPEED_QDR, IB_WIDTH_4X), 16: (IB_SPEED_QDR, IB_WIDTH_4X),
    8: (IB_SPEED_FDR, IB_WIDTH_4X),                                         # 56GBASE_R4
    20: (IB_SPEED_EDR, IB_WIDTH_4X), 21: (IB_SPEED_EDR, IB_WIDTH_4X),        # 100GBASE
    22: (IB_SPEED_EDR, IB_WIDTH_4X), 23: (IB_SPEED_EDR, IB_WIDTH_4X),
    27: (IB_SPEED_EDR, IB_WIDTH_1X), 28: (IB_SPEED_EDR, IB_WIDTH_1X),        # 25GBASE
    29: (IB_SPEED_EDR, IB_WIDTH_1X),
    30: (IB_SPEED_EDR, IB_WIDTH_2X), 31: (IB_SPEED_EDR, IB_WIDTH_2X),        # 50GBASE
}


def iboe_get_mtu(mtu: int) -> int:
    """Mirrors iboe_get_mtu(): the largest IB MTU an Ethernet MTU carries (minus the
    RoCE headers: IB_GRH_BYTES 40 + IB_BTH_BYTES 12 + ICRC 4 ... the kernel's
    `mtu - IB_GRH_BYTES - IB_UDP_BYTES - IB_BTH_BYTES - IB_EXT_XRC_BYTES -
    IB_EXT_ATOMICETH_BYTES - IB_ICRC_BYTES`)."""
    mtu -= 40 + 8 + 12 + 4 + 28 + 4
    for size, enum in ((4096, IB_MTU_4096), (2048, IB_MTU_2048), (1024, IB_MTU_1024),
                       (512, IB_MTU_512), (256, IB_MTU_256)):
        if mtu >= size:
            return enum
    return 0


@traced
def mlx5_ib_query_device(ibdev: mlx5_ib_dev, props: ib_device_attr, uhw: ib_udata) -> None:
    """Mirrors mlx5_ib_query_device(): the device attributes from the capabilities.

    EINVAL when the caller's driver-private input has a non-zero byte.
    # EMU: the driver-private response (struct mlx5_ib_query_device_resp: TSO,
    # RSS hash, CQE compression, packet pacing caps) is not written - the model's
    # libmlx5 asks for none (it has no query_device_ex of its own); no tag
    # matching (not in the modelled capability
    # layout: tm_caps 0), nor flow steering namespaces (no
    # IB_DEVICE_MANAGED_FLOW_STEERING).
    """
    if uhw.inlen and not ib_is_udata_cleared(uhw, 0, uhw.inlen):
        raise KernelError(EINVAL, "mlx5_ib_query_device: non-zero driver input")
    dev = to_mdev(ibdev)
    mdev = dev.mdev
    max_rq_sg = MLX5_CAP_GEN(mdev, "max_wqe_sz_rq") // MLX5_WQE_SEG_SIZE
    max_sq_desc = min(MLX5_CAP_GEN(mdev, "max_wqe_sz_sq"), 512)
    max_sq_sg = (max_sq_desc - 2 * MLX5_WQE_SEG_SIZE) // MLX5_WQE_SEG_SIZE
    props.fw_ver = fw_rev_maj(mdev) << 32 | fw_rev_min(mdev) << 16 | fw_rev_sub(mdev)
    props.device_cap_flags = (IB_DEVICE_CHANGE_PHY_PORT | IB_DEVICE_PORT_ACTIVE_EVENT
                              | IB_DEVICE_SYS_IMAGE_GUID | IB_DEVICE_RC_RNR_NAK_GEN)
    if MLX5_CAP_GEN(mdev, "pkv"):
        props.device_cap_flags |= IB_DEVICE_BAD_PKEY_CNTR
    if MLX5_CAP_GEN(mdev, "qkv"):
        props.device_cap_flags |= IB_DEVICE_BAD_QKEY_CNTR
    if MLX5_CAP_GEN(mdev, "xrc"):
        props.device_cap_flags |= IB_DEVICE_XRC
    if MLX5_CAP_GEN(mdev, "block_lb_mc"):
        props.device_cap_flags |= IB_DEVICE_BLOCK_MULTICAST_LOOPBACK
    if MLX5_CAP_GEN(mdev, "cq_resize"):
        props.device_cap_flags |= IB_DEVICE_RESIZE_MAX_WR
    props.device_cap_flags |= IB_DEVICE_MEM_MGT_EXTENSIONS
    if MLX5_CAP_GEN(mdev, "imaicl"):       # memory windows (type 1 and 2B)
        props.device_cap_flags |= IB_DEVICE_MEM_WINDOW | IB_DEVICE_MEM_WINDOW_TYPE_2B
        props.max_mw = 1 << MLX5_CAP_GEN(mdev, "log_max_mkey")
    props.sys_image_guid = mlx5_query_nic_vport_system_image_guid(mdev)
    # mlx5_query_vendor_id(): a RoCE port's vport is reached by HCA commands, so the
    # adapter's IEEE OUI; sysfs device/vendor stays the PCI vendor
    props.vendor_id = mlx5_core_query_vendor_id(mdev)
    props.vendor_part_id = mdev.pdev.device
    props.hw_ver = getattr(mdev.pdev, "revision", 0)
    props.max_mr_size = IB_MAX_MR_SIZE
    props.page_size_cap = ~((1 << MLX5_CAP_GEN(mdev, "log_pg_sz")) - 1) & IB_MAX_MR_SIZE
    props.max_qp = 1 << MLX5_CAP_GEN(mdev, "log_max_qp")
    props.max_qp_wr = 1 << MLX5_CAP_GEN(mdev, "log_max_qp_sz")
    props.max_send_sge = max_sq_sg
    props.max_recv_sge = max_rq_sg
    props.max_sge_rd = MLX5_MAX_SGE_RD
    props.max_cq = 1 << MLX5_CAP_GEN(mdev, "log_max_cq")
    props.max_cqe = (1 << MLX5_CAP_GEN(mdev, "log_max_cq_sz")) - 1
    props.max_mr = 1 << MLX5_CAP_GEN(mdev, "log_max_mkey")
    props.max_pd = 1 << MLX5_CAP_GEN(mdev, "log_max_pd")
    props.max_qp_rd_atom = 1 << MLX5_CAP_GEN(mdev, "log_max_ra_req_qp")
    props.max_qp_init_rd_atom = 1 << MLX5_CAP_GEN(mdev, "log_max_ra_res_qp")
    props.max_srq = 1 << MLX5_CAP_GEN(mdev, "log_max_srq")
    props.max_srq_wr = (1 << MLX5_CAP_GEN(mdev, "log_max_srq_sz")) - 1
    props.local_ca_ack_delay = MLX5_CAP_GEN(mdev, "local_ca_ack_delay")
    props.max_res_rd_atom = props.max_qp_rd_atom * props.max_qp
    props.max_srq_sge = max_rq_sg - 1
    props.max_fast_reg_page_list_len = 1 << MLX5_CAP_GEN(mdev, "log_max_klm_list_size")
    props.atomic_cap = IB_ATOMIC_HCA if MLX5_CAP_GEN(mdev, "atomic") else IB_ATOMIC_NONE
    props.masked_atomic_cap = props.atomic_cap
    props.max_mcast_grp = 1 << MLX5_CAP_GEN(mdev, "log_max_mcg")
    props.max_mcast_qp_attach = MLX5_CAP_GEN(mdev, "max_qp_mcg")
    props.max_total_mcast_qp_attach = props.max_mcast_qp_attach * props.max_mcast_grp
    props.max_ah = 0x7FFFFFFF  # INT_MAX: address handles are not a firmware resource
    props.max_pkeys = 1        # RoCE: the default P_Key only (pkey_table_size 0)
    if MLX5_CAP_GEN(mdev, "pg"):   # and CONFIG_INFINIBAND_ON_DEMAND_PAGING
        props.kernel_cap_flags |= IBK_ON_DEMAND_PAGING
    props.odp_caps = getattr(dev, "odp_caps", props.odp_caps)   # (set by the ODP stage)
    if MLX5_CAP_GEN(mdev, "end_pad"):
        props.device_cap_flags |= IB_DEVICE_PCI_WRITE_END_PADDING
    # raw_support = !mlx5_core_mp_enabled(): always, one port and no multi-port
    if MLX5_CAP_GEN(mdev, "eth_net_offloads"):
        if MLX5_CAP_ETH(mdev, "csum_cap"):
            props.device_cap_flags |= IB_DEVICE_RAW_IP_CSUM
            props.raw_packet_caps |= IB_RAW_PACKET_CAP_IP_CSUM
        if MLX5_CAP_ETH(mdev, "vlan_cap"):
            props.raw_packet_caps |= IB_RAW_PACKET_CAP_CVLAN_STRIPPING
        if MLX5_CAP_ETH(mdev, "scatter_fcs"):
            props.device_cap_flags |= IB_DEVICE_RAW_SCATTER_FCS
            props.raw_packet_caps |= IB_RAW_PACKET_CAP_SCATTER_FCS
    props.hca_core_clock = MLX5_CAP_GEN(mdev, "device_frequency_khz")
    if MLX5_CAP_GEN(mdev, "device_memory") and MLX5_CAP_DEV_MEM(mdev, "memic"):
        props.max_dm_size = MLX5_CAP_DEV_MEM(mdev, "max_memic_size")
    props.timestamp_mask = MLX5_TIMESTAMP_MASK
    if mlx5_ib_get_link_layer(ibdev, 1) == IB_LINK_LAYER_ETHERNET:
        props.rss_caps.max_rwq_indirection_tables = 1 << MLX5_CAP_GEN(mdev, "log_max_rqt")
        props.rss_caps.max_rwq_indirection_table_size = \
            1 << MLX5_CAP_GEN(mdev, "log_max_rqt_size")
        props.rss_caps.supported_qpts = 1 << IB_QPT_RAW_PACKET
        props.max_wq_type_rq = 1 << MLX5_CAP_GEN(mdev, "log_max_rq")
    if MLX5_CAP_GEN(mdev, "cq_moderation"):
        props.cq_caps.max_cq_moderation_count = MLX5_MAX_CQ_COUNT
        props.cq_caps.max_cq_moderation_period = MLX5_MAX_CQ_PERIOD


@traced
def mlx5_query_port_roce(ibdev: mlx5_ib_dev, port: int, props: ib_port_attr) -> None:
    """Mirrors mlx5_query_port_roce(): a RoCE port's attributes.

    # EMU: the port is up exactly when PTYS reports an operational link mode
    # (the real driver asks the netdev's carrier).
    """
    mdev = to_mdev(ibdev).mdev
    proto = mlx5_port_query_eth_proto(mdev, port, False)
    oper = proto.oper
    speed, width = next((_ETH_LEGACY_PROTO[b] for b in range(32)
                         if oper >> b & 1 and b in _ETH_LEGACY_PROTO), (IB_SPEED_SDR,
                                                                       IB_WIDTH_1X))
    props.active_speed, props.active_width = speed, width
    props.port_cap_flags |= IB_PORT_CM_SUP | IB_PORT_IP_BASED_GIDS
    props.gid_tbl_len = MLX5_CAP_ROCE(mdev, "roce_address_table_size")
    props.ip_gids = True
    props.max_msg_sz = 1 << MLX5_CAP_GEN(mdev, "log_max_msg")
    props.pkey_tbl_len = 1
    props.state = IB_PORT_ACTIVE if oper else IB_PORT_DOWN
    props.phys_state = IB_PORT_PHYS_STATE_LINK_UP if oper else IB_PORT_PHYS_STATE_DISABLED
    props.max_mtu = iboe_get_mtu(mlx5_query_port_max_mtu(mdev, port))
    props.active_mtu = min(props.max_mtu, iboe_get_mtu(mlx5_query_nic_vport_mtu(mdev)))


@traced
def mlx5_ib_query_port(ibdev: mlx5_ib_dev, port: int, props: ib_port_attr) -> None:
    """Mirrors mlx5_ib_query_port(): by link layer (only RoCE is modelled)."""
    mlx5_query_port_roce(ibdev, port, props)


IB_DEFAULT_PKEY_FULL = 0xFFFF


@traced
def mlx5_ib_query_pkey(ibdev: mlx5_ib_dev, port: int, index: int) -> int:
    """Mirrors mlx5_ib_query_pkey(): a RoCE port (vport access method NIC) asks
    mlx5_query_hca_vport_pkey(); its table holds the default full-member P_Key at
    index 0.  EINVAL for an index past the port's pkey_tbl_len.

    # EMU: the QUERY_HCA_VPORT_PKEY firmware command is not modelled; the answer
    # is the one a RoCE vport's table gives (0xffff at index 0).
    """
    attr = ib_port_attr()
    mlx5_ib_query_port(ibdev, port, attr)
    if not 0 <= index < attr.pkey_tbl_len:
        raise KernelError(EINVAL, f"mlx5_query_hca_vport_pkey: index {index} outside the "
                          f"{attr.pkey_tbl_len}-entry table")
    return IB_DEFAULT_PKEY_FULL


def mlx5_ib_get_link_layer(ibdev: mlx5_ib_dev, port: int) -> int:
    """Mirrors mlx5_ib_port_link_layer(): Ethernet for a port_type ETH device."""
    return IB_LINK_LAYER_ETHERNET


@traced
def mlx5_port_roce_immutable(ibdev: mlx5_ib_dev, port: int,
                             immutable: ib_port_immutable) -> None:
    """Mirrors mlx5_port_roce_immutable(): table sizes, RoCE v1/v2 flags, MAD size."""
    attr = ib_port_attr()
    mlx5_ib_query_port(ibdev, port, attr)
    roce_version = MLX5_CAP_ROCE(to_mdev(ibdev).mdev, "roce_version")
    immutable.pkey_tbl_len = attr.pkey_tbl_len
    immutable.gid_tbl_len = attr.gid_tbl_len
    if roce_version & MLX5_ROCE_VERSION_1_CAP:
        immutable.core_cap_flags |= RDMA_CORE_PORT_IBA_ROCE
    if roce_version & MLX5_ROCE_VERSION_2_CAP:
        immutable.core_cap_flags |= RDMA_CORE_PORT_IBA_ROCE_UDP_ENCAP
    immutable.max_mad_size = IB_MGMT_MAD_SIZE


def mlx5_get_dev_fw_str(ibdev: mlx5_ib_dev) -> str:
    """Mirrors get_dev_fw_str(): "major.minor.sub" (sub zero-padded to 4)."""
    mdev = to_mdev(ibdev).mdev
    return f"{fw_rev_maj(mdev)}.{fw_rev_min(mdev)}.{fw_rev_sub(mdev):04d}"
