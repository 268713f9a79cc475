"""The ConnectX-6 Dx capability pages the emulated firmware reports (device model).

QUERY_HCA_CAP returns two pages per capability type: the maximum the device
supports (op_mod GET_MAX) and the current setting (GET_CUR), which the driver
may change before INIT_HCA with SET_HCA_CAP - only the fields the PRM marks
writable, and never beyond the maximum.

The defaults reproduce, through the real mlx5_core and mlx5_ib code paths,
the alloc_ucontext response a real mlx5 device gives on a 4 KiB-page
host (struct mlx5_ib_alloc_ucontext_resp, as a debugger prints it):
qp_tab_size 262144 (log_max_qp 18), bf_reg_size 512 (log_bf_reg_size 9),
max_sq_desc_sz 1024, max_rq_desc_sz 512, max_send_wqebb = max_recv_wr 32768
(log_max_qp_sz 15), max_srq_recv_wr 32768 (log_max_srq_sz 15), num_ports 1,
cqe_version 1, eth_min_inline 2 (vport min inline mode L2 = 1, plus 1 in
mlx5_ib), dump_fill_mkey supported (QUERY_SPECIAL_CONTEXTS returns 1792).
uar_4k is supported (max page) and off (current page) until a driver on a
host with PAGE_SIZE > 4096 turns it on.
"""

from __future__ import annotations

from kernel_model.hw.mlx5_ifc import (
    MLX5_CAP_DEV_MEM,
    MLX5_CAP_ETHERNET_OFFLOADS,
    MLX5_CAP_GENERAL,
    MLX5_CAP_INLINE_MODE_VPORT_CONTEXT,
    MLX5_CAP_PORT_TYPE_ETH,
    MLX5_CAP_ROCE,
)

GENERAL_MAX: dict[str, int] = dict(
    log_max_srq_sz=15, log_max_qp_sz=15, log_max_qp=18, log_max_srq=23, log_max_cq_sz=22,
    log_max_cq=24, log_max_eq_sz=22, log_max_mkey=24, dump_fill_mkey=1, null_mkey=1,
    terminate_scatter_list_mkey=1, repeated_mkey=1, fast_teardown=1, force_teardown=1,
    log_max_eq=7, max_indirection=8, log_max_mrw_sz=64, log_max_klm_list_size=16,
    log_max_ra_req_dc=4, log_max_ra_res_dc=4, log_max_ra_req_qp=4, log_max_ra_res_qp=4,
    end_pad=1, start_pad=1, cache_line_128byte=1, gid_table_size=4, max_qp_cnt=64,
    pkey_table_size=0, vport_group_manager=1, eth_virt=1, ets=1, nic_flow_table=1,
    pcam_reg=1, mcam_reg=1, local_ca_ack_delay=16, port_type=MLX5_CAP_PORT_TYPE_ETH,
    num_ports=1, pps=1, log_max_msg=30, max_tc=8, general_notification_event=1,
    stat_rate_support=0x1ff, cqe_version=1, compact_address_vector=1, umr_fence=1,
    drain_sigerr=1, sigerr_cqe=1, wq_signature=1, sctr_data_cqe=1, dct=1, qos=1,
    eth_net_offloads=1, roce=1, atomic=1, cq_oi=1, cq_resize=1, cq_moderation=1,
    cq_period_mode_modify=1, cq_eq_remap=1, pg=1, block_lb_mc=1, scqe_break_moderation=1,
    cq_period_start_from_cqe=1, cd=1, imaicl=1, qkv=1, pkv=1, set_deth_sqpn=1, xrc=1, ud=1, uc=1,
    rc=1, uar_4k=1, uar_sz=5, umem_uid_0=1, log_pg_sz=12, bf=1, driver_version=1,
    log_bf_reg_size=9, max_wqe_sz_sq=1024, max_wqe_sz_rq=512, max_wqe_sz_sq_dc=512,
    max_qp_mcg=240, log_max_mcg=21, log_max_transport_domain=20, log_max_pd=24,
    log_max_xrcd=24, log_max_rq=20, log_max_sq=20, log_max_tir=16, log_max_tis=16,
    basic_cyclic_rcv_wqe=1, log_max_rmp=20, log_max_rqt=16, log_max_rqt_size=11,
    log_max_tis_per_sq=3, log_max_wq_sz=17, nic_vport_change_event=1, disable_local_lb_uc=1,
    disable_local_lb_mc=1, log_max_vlan_list=12, log_max_current_mc_list=12,
    log_max_current_uc_list=4, sq_ts_format=2, rq_ts_format=2, steering_format_version=1,
    log_max_uctx=7, log_max_umem=24, max_num_eqs=256, log_max_l2_table=9,
    log_uar_page_sz=4, device_frequency_mhz=156, device_frequency_khz=156250,
    num_of_uars_per_page=16, log_max_atomic_size_qp=6, log_max_atomic_size_dc=6,
    cqe_128_always=1, cqe_compression=1, native_port_num=1, ece_support=1,
    device_memory=1, fixed_buffer_size=1, umr_extended_translation_offset=1,
)

#: the current page differs from the maximum until the driver's SET_HCA_CAP
GENERAL_CUR_DEFAULTS: dict[str, int] = dict(
    uar_4k=0, log_uar_page_sz=0, num_of_uars_per_page=1, cache_line_128byte=0, dct=0,
    cmdif_checksum=0,
)

ROCE: dict[str, int] = dict(
    qp_ts_format=2, l3_type=0x7, roce_version=0x5, r_roce_dest_udp_port=4791,
    r_roce_max_src_udp_port=0xffff, r_roce_min_src_udp_port=0xc000,
    roce_address_table_size=256,
)

ETH: dict[str, int] = dict(
    csum_cap=1, vlan_cap=1, lro_cap=1, lro_psh_flag=1, lro_time_stamp=1,
    self_lb_en_modifiable=1, max_lso_cap=18, multi_pkt_send_wqe=2,
    wqe_inline_mode=MLX5_CAP_INLINE_MODE_VPORT_CONTEXT, rss_ind_tbl_cap=11, reg_umr_sq=1,
    scatter_fcs=1, enhanced_multi_pkt_send_wqe=1, tunnel_stateless_vxlan=1, swp=1,
    lro_min_mss_size=1344,
)

#: on-chip memory (MEMIC): 256 KiB at the top of BAR0, handed out by ALLOC_MEMIC in
#: 64-byte units (log_min_memic_alloc_size 6), addresses aligned up to 64 << 6 bytes.
#: memic_bar_start_addr (BAR-relative) is filled in by the firmware from the BAR size
#: (the last memic_bar_size bytes) unless a test overrides it.
DEV_MEM: dict[str, int] = dict(
    memic=1, log_min_memic_alloc_size=6, log_max_memic_addr_alignment=6,
    memic_bar_size=256 << 10, max_memic_size=256 << 10,
)

#: the layout each capability type's page uses
CAP_LAYOUT = {MLX5_CAP_GENERAL: "cmd_hca_cap", MLX5_CAP_ETHERNET_OFFLOADS:
              "per_protocol_networking_offload_caps", MLX5_CAP_ROCE: "roce_cap",
              MLX5_CAP_DEV_MEM: "device_mem_cap"}

#: general-capability fields SET_HCA_CAP may change; "log" ones up to the
#: maximum, the others 0 or (when the maximum is 1) 1
WRITABLE_GENERAL = {
    "log_max_qp": "log", "pkey_table_size": "enum", "log_uar_page_sz": "log",
    "uar_4k": "bool", "cache_line_128byte": "bool", "dct": "bool", "drain_sigerr": "bool",
    "cmdif_checksum": "zero", "roce": "bool", "num_vhca_ports": "log", "mkey_by_name": "bool",
    "log_max_current_uc_list": "log",
}


def split_overrides(overrides: dict[str, int]) -> dict[int, dict[str, int]]:
    """Mlx5Config.caps -> per-type overrides: "field" is general, "roce.f", "eth.f" and
    "devmem.f" (device memory) not."""
    out: dict[int, dict[str, int]] = {MLX5_CAP_GENERAL: {}, MLX5_CAP_ROCE: {},
                                      MLX5_CAP_ETHERNET_OFFLOADS: {}, MLX5_CAP_DEV_MEM: {}}
    for key, value in overrides.items():
        prefix, _, name = key.rpartition(".")
        cap = {"": MLX5_CAP_GENERAL, "roce": MLX5_CAP_ROCE,
               "eth": MLX5_CAP_ETHERNET_OFFLOADS, "devmem": MLX5_CAP_DEV_MEM}.get(prefix)
        if cap is None:
            raise ValueError(f"Mlx5Config.caps: unknown capability page in {key!r}")
        out[cap][name] = value
    return out
