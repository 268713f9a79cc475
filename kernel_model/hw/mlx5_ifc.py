"""Mirrors include/linux/mlx5/mlx5_ifc.h: the ConnectX PRM both the firmware and mlx5_core speak.

The real header describes every command and context as a bit layout
(`struct mlx5_ifc_qpc_bits { u8 log_rq_size[0x4]; ... }`) read and written
with MLX5_SET/MLX5_GET over raw big-endian dwords.  Here the same names and
widths describe structured objects:

    in_ = IfcStruct("create_qp_in", pas=ncont)     # kvzalloc(inlen)
    qpc = MLX5_ADDR_OF("create_qp_in", in_, "qpc")
    MLX5_SET("qpc", qpc, "log_rq_size", 6)
    MLX5_SET64("qpc", qpc, "dbr_addr", db_dma)
    pas = MLX5_ADDR_OF("create_qp_in", in_, "pas")  # a c_ext.U64Array

# EMU: commands are structured objects, not bit-packed mailboxes.  Every
# field keeps its real name and width: MLX5_SET of a field the layout does
# not have raises TypeError (the C macro fails to compile), a value wider
# than the field is masked (as the C macro masks), MLX5_SET of a 64-bit field
# needs MLX5_SET64 (a BUILD_BUG_ON in C).  Offsets are not modelled, so
# reserved_at_* fields do not exist.  PAS/MTT arrays are U64Arrays holding
# big-endian 64-bit values exactly as the mailbox carries them; the firmware
# keeps them as given and byte-swaps when it uses an address.
# Unions (the capability area of QUERY_HCA_CAP) accept the fields of every
# member, as the C union aliases them.

Only the structures and fields the model uses are listed; widths are those
of the current mainline header (mkc.log_page_size is 6 bits since 6.12).
This module is shared by the firmware model (kernel_model.hw) and the driver
(drivers/mlx5_core/ifc.py re-exports it), as both sides of a real device
obey the one PRM.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

from c_ext import U64Array
from kernel_model.sched import keyed_dict, touch_key

if TYPE_CHECKING:
    from kernel_model.emu.machine import Machine

# -- opcodes (enum in mlx5_ifc.h) -------------------------------------------------
MLX5_CMD_OP_QUERY_HCA_CAP = 0x100
MLX5_CMD_OP_QUERY_ADAPTER = 0x101
MLX5_CMD_OP_INIT_HCA = 0x102
MLX5_CMD_OP_TEARDOWN_HCA = 0x103
MLX5_CMD_OP_ENABLE_HCA = 0x104
MLX5_CMD_OP_DISABLE_HCA = 0x105
MLX5_CMD_OP_SET_HCA_CAP = 0x109
MLX5_CMD_OP_CREATE_MKEY = 0x200
MLX5_CMD_OP_QUERY_MKEY = 0x201
MLX5_CMD_OP_DESTROY_MKEY = 0x202
MLX5_CMD_OP_QUERY_SPECIAL_CONTEXTS = 0x203
MLX5_CMD_OP_PAGE_FAULT_RESUME = 0x204
MLX5_CMD_OP_ALLOC_MEMIC = 0x205
MLX5_CMD_OP_DEALLOC_MEMIC = 0x206
# EMU: not a PRM command.  The kernel revokes an mkey with a UMR work request on
# its UMR QP (mlx5r_umr_revoke_mr); the UMR QP is not modelled, so the same
# effect - the mkey free, in the UMR PD, DMA through it drained - is this
# vendor-range command
MLX5_CMD_OP_EMU_UMR_REVOKE_MKEY = 0x7F01
# EMU: not a PRM command either: the UMR of mlx5_ib_update_xlt (MLNX_OFED 4.x) that
# loads an mkey's translation and its PD, access and range, and with `enable`
# turns it on (MLX5_IB_SEND_UMR_ENABLE_MR | UPDATE_PD_ACCESS | UPDATE_TRANSLATION)
MLX5_CMD_OP_EMU_UMR_UPDATE_MKEY = 0x7F02
# EMU: not a PRM command either: the UMR of mlx5r_umr_rereg_pd_access (rereg_mr of the
# PD or access only): the mkey's PD and access bits replaced in place, nothing else;
# MLX5_UMR_CHECK_FREE - it fails on a free (revoked) mkey
MLX5_CMD_OP_EMU_UMR_REREG_PD_ACCESS = 0x7F03
# EMU: not a PRM command either: the UMR of mlx5r_umr_update_xlt (ODP): xlt_nentries MTT
# entries of the mkey from xlt_offset replaced (MLX5_IB_UPD_XLT_ZAP: made not present,
# the DMA through the mkey drained first), with `enable` the mkey turned on
MLX5_CMD_OP_EMU_UMR_UPDATE_XLT = 0x7F04
MLX5_CMD_OP_CREATE_EQ = 0x301
MLX5_CMD_OP_DESTROY_EQ = 0x302
MLX5_CMD_OP_CREATE_CQ = 0x400
MLX5_CMD_OP_DESTROY_CQ = 0x401
MLX5_CMD_OP_QUERY_CQ = 0x402
MLX5_CMD_OP_MODIFY_CQ = 0x403
MLX5_CQ_OPMOD_RESIZE = 1                 # modify_cq_in.op_mod
MLX5_MODIFY_CQ_MASK_LOG_SIZE, MLX5_MODIFY_CQ_MASK_PG_OFFSET, MLX5_MODIFY_CQ_MASK_PG_SIZE = 1, 2, 4
MLX5_CMD_OP_CREATE_QP = 0x500
MLX5_CMD_OP_DESTROY_QP = 0x501
MLX5_CMD_OP_RST2INIT_QP = 0x502
MLX5_CMD_OP_INIT2RTR_QP = 0x503
MLX5_CMD_OP_RTR2RTS_QP = 0x504
MLX5_CMD_OP_RTS2RTS_QP = 0x505
MLX5_CMD_OP_SQERR2RTS_QP = 0x506
MLX5_CMD_OP_2ERR_QP = 0x507
MLX5_CMD_OP_2RST_QP = 0x50a
MLX5_CMD_OP_QUERY_QP = 0x50b
MLX5_CMD_OP_CREATE_DCT = 0x710
MLX5_CMD_OP_DESTROY_DCT = 0x711
MLX5_CMD_OP_DRAIN_DCT = 0x712
MLX5_CMD_OP_QUERY_DCT = 0x713
MLX5_CMD_OP_SQD_RTS_QP = 0x50c
MLX5_CMD_OP_INIT2INIT_QP = 0x50e
MLX5_CMD_OP_CREATE_SRQ = 0x700
MLX5_CMD_OP_DESTROY_SRQ = 0x701
MLX5_CMD_OP_QUERY_SRQ = 0x702
MLX5_CMD_OP_ARM_RQ = 0x703
MLX5_ARM_RQ_IN_OP_MOD_SRQ = 1            # arm_rq_in.op_mod
MLX5_CMD_OP_QUERY_NIC_VPORT_CONTEXT = 0x754
MLX5_CMD_OP_MODIFY_NIC_VPORT_CONTEXT = 0x755
MLX5_CMD_OP_QUERY_ROCE_ADDRESS = 0x760
MLX5_CMD_OP_SET_ROCE_ADDRESS = 0x761
MLX5_CMD_OP_ALLOC_PD = 0x800
MLX5_CMD_OP_DEALLOC_PD = 0x801
MLX5_CMD_OP_ALLOC_UAR = 0x802
MLX5_CMD_OP_DEALLOC_UAR = 0x803
MLX5_CMD_OP_ACCESS_REG = 0x805
MLX5_CMD_OP_ALLOC_TRANSPORT_DOMAIN = 0x816
MLX5_CMD_OP_DEALLOC_TRANSPORT_DOMAIN = 0x817
MLX5_CMD_OP_ALLOC_XRCD = 0x80e
MLX5_CMD_OP_DEALLOC_XRCD = 0x80f
MLX5_CMD_OP_CREATE_TIR = 0x900
MLX5_CMD_OP_DESTROY_TIR = 0x902
MLX5_CMD_OP_CREATE_SQ = 0x904
MLX5_CMD_OP_MODIFY_SQ = 0x905
MLX5_CMD_OP_DESTROY_SQ = 0x906
MLX5_CMD_OP_QUERY_SQ = 0x907
MLX5_CMD_OP_CREATE_RQ = 0x908
MLX5_CMD_OP_MODIFY_RQ = 0x909
MLX5_CMD_OP_DESTROY_RQ = 0x90a
MLX5_CMD_OP_QUERY_RQ = 0x90b
MLX5_CMD_OP_CREATE_TIS = 0x912
MLX5_CMD_OP_DESTROY_TIS = 0x914
MLX5_CMD_OP_CREATE_RQT = 0x916
MLX5_CMD_OP_DESTROY_RQT = 0x918
MLX5_CMD_OP_CREATE_UCTX = 0xa04
MLX5_CMD_OP_DESTROY_UCTX = 0xa06
# query commands a DevX context may send as general commands (devx_is_general_cmd); the
# emulated firmware implements only some of them
MLX5_CMD_OP_QUERY_ISSI = 0x10a
MLX5_CMD_OP_QUERY_VPORT_STATE = 0x750
MLX5_CMD_OP_QUERY_ESW_VPORT_CONTEXT = 0x752
MLX5_CMD_OP_QUERY_HCA_VPORT_CONTEXT = 0x762
MLX5_CMD_OP_QUERY_VNIC_ENV = 0x76f
MLX5_CMD_OP_QUERY_VPORT_COUNTER = 0x770
MLX5_CMD_OP_GET_DROPPED_PACKET_LOG = 0x80a
MLX5_CMD_OP_NOP = 0x80d
MLX5_CMD_OP_QUERY_CONG_STATUS = 0x822
MLX5_CMD_OP_QUERY_CONG_PARAMS = 0x824
MLX5_CMD_OP_QUERY_CONG_STATISTICS = 0x826
MLX5_CMD_OP_QUERY_LAG = 0x842

#: opcode -> "CREATE_QP" (what mlx5_command_str() prints)
MLX5_CMD_NAMES: dict[int, str] = {v: k[len("MLX5_CMD_OP_"):] for k, v in dict(globals()).items()
                                  if k.startswith("MLX5_CMD_OP_")}
# the valid range of general commands that work on no object
MLX5_CMD_OP_GENERAL_START, MLX5_CMD_OP_GENERAL_END = 0xb00, 0xd00

# -- command status (include/linux/mlx5/device.h) ------------------------------------
MLX5_CMD_STAT_OK = 0x0
MLX5_CMD_STAT_INT_ERR = 0x1
MLX5_CMD_STAT_BAD_OP_ERR = 0x2
MLX5_CMD_STAT_BAD_PARAM_ERR = 0x3
MLX5_CMD_STAT_BAD_SYS_STATE_ERR = 0x4
MLX5_CMD_STAT_BAD_RES_ERR = 0x5
MLX5_CMD_STAT_RES_BUSY = 0x6
MLX5_CMD_STAT_NOT_READY = 0x7
MLX5_CMD_STAT_LIM_ERR = 0x8
MLX5_CMD_STAT_BAD_RES_STATE_ERR = 0x9
MLX5_CMD_STAT_IX_ERR = 0xa
MLX5_CMD_STAT_NO_RES_ERR = 0xf
MLX5_CMD_STAT_BAD_QP_STATE_ERR = 0x10
MLX5_CMD_STAT_BAD_PKT_ERR = 0x30
MLX5_CMD_STAT_BAD_SIZE_OUTS_CQES_ERR = 0x40
MLX5_CMD_STAT_BAD_INP_LEN_ERR = 0x50
MLX5_CMD_STAT_BAD_OUTP_LEN_ERR = 0x51

# -- capability selectors (QUERY_HCA_CAP op_mod = type << 1 | mode) -------------------
MLX5_CAP_GENERAL = 0
MLX5_CAP_ETHERNET_OFFLOADS = 1
MLX5_CAP_ROCE = 4
MLX5_CAP_DEV_MEM = 0xF
HCA_CAP_OPMOD_GET_MAX = 0
HCA_CAP_OPMOD_GET_CUR = 1
MLX5_SET_HCA_CAP_OP_MOD_GENERAL_DEVICE = 0x0

# -- context enums ---------------------------------------------------------------------
MLX5_QPC_STATE_RST, MLX5_QPC_STATE_INIT, MLX5_QPC_STATE_RTR, MLX5_QPC_STATE_RTS = 0, 1, 2, 3
MLX5_QPC_STATE_SQER, MLX5_QPC_STATE_ERR, MLX5_QPC_STATE_SQD = 0x4, 0x6, 0x7
MLX5_QPC_ST_RC, MLX5_QPC_ST_UC, MLX5_QPC_ST_UD, MLX5_QPC_ST_XRC = 0x0, 0x1, 0x2, 0x3
MLX5_QPC_ST_DCI, MLX5_QPC_ST_QP0, MLX5_QPC_ST_QP1 = 0x5, 0x7, 0x8
MLX5_QPC_ST_RAW_DATAGRAM, MLX5_QPC_ST_REG_UMR = 0x9, 0xc
MLX5_QPC_PM_STATE_MIGRATED = 0x3
MLX5_NON_ZERO_RQ, MLX5_SRQ_RQ, MLX5_CRQ_RQ, MLX5_ZERO_LEN_RQ = 0x0, 0x1, 0x2, 0x3
MLX5_QPC_TIMESTAMP_FORMAT_FREE_RUNNING = 0x0
MLX5_QPC_TIMESTAMP_FORMAT_DEFAULT = 0x1
MLX5_QPC_TIMESTAMP_FORMAT_REAL_TIME = 0x2
MLX5_CQC_CQE_SZ_64_BYTES, MLX5_CQC_CQE_SZ_128_BYTES = 0x0, 0x1
MLX5_MKC_ACCESS_MODE_PA, MLX5_MKC_ACCESS_MODE_MTT = 0x0, 0x1
MLX5_MKC_ACCESS_MODE_KLMS, MLX5_MKC_ACCESS_MODE_KSM = 0x2, 0x3
MLX5_MKC_ACCESS_MODE_MEMIC = 0x5
MLX5_CAP_PORT_TYPE_IB, MLX5_CAP_PORT_TYPE_ETH = 0x0, 0x1
MLX5_CAP_INLINE_MODE_L2, MLX5_CAP_INLINE_MODE_VPORT_CONTEXT = 0, 1
MLX5_CAP_INLINE_MODE_NOT_REQUIRED = 2
MLX5_INLINE_MODE_NONE, MLX5_INLINE_MODE_L2 = 0, 1
MLX5_REG_PMTU, MLX5_REG_PTYS = 0x5003, 0x5004
MLX5_PTYS_IB, MLX5_PTYS_EN = 1 << 0, 1 << 2
MLX5_SHARED_RESOURCE_UID = 0xffff
# the modify commands' opt_param_mask bits (include/linux/mlx5/qp.h enum mlx5_qp_optpar)
MLX5_QP_OPTPAR_ALT_ADDR_PATH, MLX5_QP_OPTPAR_RRE, MLX5_QP_OPTPAR_RAE = 1 << 0, 1 << 1, 1 << 2
MLX5_QP_OPTPAR_RWE, MLX5_QP_OPTPAR_PKEY_INDEX, MLX5_QP_OPTPAR_Q_KEY = 1 << 3, 1 << 4, 1 << 5
MLX5_QP_OPTPAR_RNR_TIMEOUT, MLX5_QP_OPTPAR_PRIMARY_ADDR_PATH = 1 << 6, 1 << 7
MLX5_QP_OPTPAR_SRA_MAX, MLX5_QP_OPTPAR_RRA_MAX, MLX5_QP_OPTPAR_PM_STATE = 1 << 8, 1 << 9, 1 << 10
MLX5_QP_OPTPAR_RETRY_COUNT, MLX5_QP_OPTPAR_RNR_RETRY = 1 << 12, 1 << 13
MLX5_QP_OPTPAR_ACK_TIMEOUT, MLX5_QP_OPTPAR_LAG_TX_AFF = 1 << 14, 1 << 15
MLX5_QP_OPTPAR_PRI_PORT, MLX5_QP_OPTPAR_SRQN, MLX5_QP_OPTPAR_CQN_RCV = 1 << 16, 1 << 18, 1 << 19
MLX5_QP_OPTPAR_DC_HS, MLX5_QP_OPTPAR_DC_KEY = 1 << 20, 1 << 21
MLX5_QP_OPTPAR_COUNTER_SET_ID = 1 << 25
# dctc.state (a DCT's life after CREATE_DCT)
MLX5_DCTC_STATE_ACTIVE, MLX5_DCTC_STATE_DRAINING, MLX5_DCTC_STATE_DRAINED = 0, 1, 2
# roce_addr_layout.roce_version / roce_l3_type (include/linux/mlx5/device.h)
MLX5_ROCE_VERSION_1, MLX5_ROCE_VERSION_2 = 0, 2
MLX5_ROCE_L3_TYPE_IPV4, MLX5_ROCE_L3_TYPE_IPV6 = 0, 1
# the transport objects of a raw packet QP: SQ/RQ states, the WQ type, the RQ's memory,
# a TIR's dispatch (mlx5_ifc.h enums)
MLX5_SQC_STATE_RST, MLX5_SQC_STATE_RDY, MLX5_SQC_STATE_ERR = 0x0, 0x1, 0x3
MLX5_RQC_STATE_RST, MLX5_RQC_STATE_RDY, MLX5_RQC_STATE_ERR = 0x0, 0x1, 0x3
MLX5_WQ_TYPE_LINKED_LIST, MLX5_WQ_TYPE_CYCLIC = 0x0, 0x1
MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_INLINE, MLX5_RQC_MEM_RQ_TYPE_MEMORY_RQ_RMP = 0x0, 0x1
MLX5_TIRC_DISP_TYPE_DIRECT, MLX5_TIRC_DISP_TYPE_INDIRECT = 0x0, 0x1

# -- layouts -------------------------------------------------------------------------------
# "name width" (bits); "name @type" a nested structure; "name []" a flexible
# array of 64-bit entries (PAS/MTT); "name bytesN" an N-byte string.
_HDR_IN = "opcode 16, uid 16, op_mod 16"
_HDR_OUT = "status 8, syndrome 32"
_MODIFY_QP_IN = "qpc_ext 1, qpn 24, opt_param_mask 32, ece 32, qpc @qpc"

_TEXT: dict[str, str] = {
    "mbox_in": "",  # the header of every *_in (opcode, uid, op_mod)
    "mbox_out": "",  # the header of every *_out (status, syndrome)
    "cmd_hca_cap": """
        vhca_id 16, log_max_srq_sz 8, log_max_qp_sz 8, event_cap 1, log_max_qp 5,
        log_max_srq 5, log_max_cq_sz 8, log_max_cq 5, log_max_eq_sz 8, relaxed_ordering_write 1,
        relaxed_ordering_read_pci_enabled 1, log_max_mkey 6, terminate_scatter_list_mkey 1,
        repeated_mkey 1, dump_fill_mkey 1, fast_teardown 1, log_max_eq 4, max_indirection 8,
        fixed_buffer_size 1, log_max_mrw_sz 7, force_teardown 1, log_max_bsf_list_size 6,
        umr_extended_translation_offset 1, null_mkey 1, log_max_klm_list_size 6,
        log_max_ra_req_dc 6, log_max_ra_res_dc 6, log_max_ra_req_qp 6, log_max_ra_res_qp 6,
        end_pad 1, cc_query_allowed 1, cc_modify_allowed 1, start_pad 1, cache_line_128byte 1,
        gid_table_size 16, out_of_seq_cnt 1, vport_counters 1, retransmission_q_counters 1,
        debug 1, max_qp_cnt 10, pkey_table_size 16, vport_group_manager 1, ib_virt 1,
        eth_virt 1, ets 1, nic_flow_table 1, eswitch_manager 1, device_memory 1, mcam_reg 1,
        pcam_reg 1, local_ca_ack_delay 5, port_module_event 1, port_type 2, num_ports 8, pps 1,
        log_max_msg 5, max_tc 4, general_notification_event 1, stat_rate_support 16,
        init2_lag_tx_port_affinity 1, cqe_version 4, compact_address_vector 1,
        ipoib_enhanced_offloads 1, ipoib_basic_offloads 1, umr_fence 2, drain_sigerr 1,
        cmdif_checksum 2, sigerr_cqe 1, wq_signature 1, sctr_data_cqe 1, sho 1, tph 1, rf 1,
        dct 1, qos 1, eth_net_offloads 1, roce 1, atomic 1, cq_oi 1, cq_resize 1,
        cq_moderation 1, cq_period_mode_modify 1, cq_eq_remap 1, pg 1, block_lb_mc 1,
        scqe_break_moderation 1, cq_period_start_from_cqe 1, cd 1, apm 1, umr_ptr_rlkey 1,
        imaicl 1, qp_packet_based 1, qkv 1, pkv 1, set_deth_sqpn 1, xrc 1, ud 1, uc 1, rc 1,
        uar_4k 1, uar_sz 6, umem_uid_0 1, log_pg_sz 8, bf 1, driver_version 1,
        pad_tx_eth_packet 1, mkey_by_name 1, log_bf_reg_size 5, lag_tx_port_affinity 1,
        lag_master 1, num_lag_ports 4, max_wqe_sz_sq 16, max_wqe_sz_rq 16, max_wqe_sz_sq_dc 16,
        max_qp_mcg 25, log_max_mcg 8, log_max_transport_domain 5, log_max_pd 5,
        log_max_xrcd 5, log_max_rq 5, log_max_sq 5, log_max_tir 5, log_max_tis 5,
        basic_cyclic_rcv_wqe 1, log_max_rmp 5, log_max_rqt 5, log_max_rqt_size 5,
        log_max_tis_per_sq 5, roce_rw_supported 1, log_max_wq_sz 5, nic_vport_change_event 1,
        disable_local_lb_uc 1, disable_local_lb_mc 1, log_max_vlan_list 5,
        log_max_current_mc_list 5, log_max_current_uc_list 5, general_obj_types 64,
        sq_ts_format 2, rq_ts_format 2, steering_format_version 4, create_qp_start_hint 24,
        log_max_uctx 5, log_max_umem 5, max_num_eqs 16, log_max_l2_table 5,
        log_uar_page_sz 16, device_frequency_mhz 32, device_frequency_khz 32,
        num_of_uars_per_page 32, log_max_atomic_size_qp 8, log_max_atomic_size_dc 8,
        cqe_128_always 1, cqe_compression 1, native_port_num 8, num_vhca_ports 8,
        sw_owner_id 1, ece_support 1, hca_cap_2 1""",
    "roce_cap": """
        roce_apm 1, sw_r_roce_src_udp_port 1, fl_rc_qp_when_roce_disabled 1,
        fl_rc_qp_when_roce_enabled 1, roce_cc_general 1, qp_ooo_transmit_default 1,
        qp_ts_format 2, l3_type 8, roce_version 8, r_roce_dest_udp_port 16,
        r_roce_max_src_udp_port 16, r_roce_min_src_udp_port 16, roce_address_table_size 16""",
    "per_protocol_networking_offload_caps": """
        csum_cap 1, vlan_cap 1, lro_cap 1, lro_psh_flag 1, lro_time_stamp 1,
        self_lb_en_modifiable 1, max_lso_cap 5, multi_pkt_send_wqe 2, wqe_inline_mode 2,
        rss_ind_tbl_cap 4, reg_umr_sq 1, scatter_fcs 1, enhanced_multi_pkt_send_wqe 1,
        tunnel_stateless_vxlan 1, swp 1, lro_min_mss_size 16""",
    "ads": """
        fl 1, free_ar 1, pkey_index 16, grh 1, mlid 7, rlid 16, ack_timeout 5,
        src_addr_index 8, log_rtm 4, stat_rate 4, hop_limit 8, tclass 8, flow_label 20,
        rgid_rip bytes16, f_dscp 1, f_ecn 1, f_eth_prio 1, ecn 2, dscp 6, udp_sport 16,
        dei_cfi 1, eth_prio 3, sl 4, vhca_port_num 8, rmac_47_32 16, rmac_31_0 32""",
    "qpc": """
        state 4, lag_tx_port_affinity 4, st 8, isolate_vl_tc 1, pm_state 2,
        req_e2e_credit_mode 2, offload_type 4, end_padding_mode 2, wq_signature 1,
        block_lb_mc 1, atomic_like_write_en 1, latency_sensitive 1, drain_sigerr 1, pd 24,
        mtu 3, log_msg_max 5, log_rq_size 4, log_rq_stride 3, no_sq 1, log_sq_size 4,
        ts_format 2, data_in_order 1, rlky 1, ulp_stateless_offload_mode 4,
        counter_set_id 8, uar_page 24, user_index 24, log_page_size 5, remote_qpn 24,
        primary_address_path @ads, secondary_address_path @ads, log_ack_req_freq 4,
        log_sra_max 3, retry_count 3, rnr_retry 3, fre 1, cur_rnr_retry 3,
        cur_retry_count 3, next_send_psn 24, cqn_snd 24, deth_sqpn 24, last_acked_psn 24,
        ssn 24, log_rra_max 3, atomic_mode 4, rre 1, rwe 1, rae 1, page_offset 6,
        cd_slave_receive 1, cd_slave_send 1, cd_master 1, min_rnr_nak 5, next_rcv_psn 24,
        xrcd 24, cqn_rcv 24, dbr_addr 64, q_key 32, rq_type 3, srqn_rmpn_xrqn 24, rmsn 24,
        hw_sq_wqebb_counter 16, sw_sq_wqebb_counter 16, hw_rq_counter 32, sw_rq_counter 32,
        cgs 1, cs_req 8, cs_res 8, dc_access_key 64, dbr_umem_valid 1""",
    "dctc": """
        state 4, user_index 24, ece 32, lag_tx_port_affinity 4, cs_res 8,
        counter_set_id 8, atomic_mode 4, rre 1, rwe 1, rae 1, atomic_like_write_en 1,
        latency_sensitive 1, rlky 1, free_ar 1, data_in_order 1, pd 24, mtu 3, tclass 8,
        min_rnr_nak 5, cqn 24, srqn_xrqn 24, pkey_index 16, port 8, my_addr_index 8,
        hop_limit 8, dc_access_key_violation_count 32, eth_prio 3, ecn 2, dscp 6,
        flow_label 20, dc_access_key 64""",
    # EMU: one context for basic and XRC SRQs: srqc with xrc_srqc's user_index (the
    # CQE of an XRC SRQ's receive names it); see kernel_model/hw/mlx5_fw_srq.py
    "srqc": """
        state 4, log_srq_size 4, wq_signature 1, cont_srq 1, rlky 1, log_rq_stride 3,
        xrcd 24, page_offset 6, cqn 24, log_page_size 6, pd 24, lwm 16, wqe_cnt 16,
        dbr_addr 64, user_index 24""",
    "cqc": """
        status 4, as_notify 1, initiator_src_dct 1, dbr_umem_valid 1, apu_cq 1, cqe_sz 3,
        cc 1, scqe_break_moderation_en 1, oi 1, cq_period_mode 2, cqe_comp_en 1,
        mini_cqe_res_format 2, st 4, always_armed_cq 1, apu_element_type 3,
        cqe_compression_layout 2, dbr_umem_id 32, page_offset 6, mini_cqe_res_format_3_2 2,
        cq_time_stamp_format 2, log_cq_size 5, uar_page 24, cq_period 12, cq_max_count 16,
        c_eqn_or_apu_element 32, log_page_size 5, last_notified_index 24,
        last_solicit_index 24, consumer_counter 24, producer_counter 24, dbr_addr 64""",
    "mkc": """
        free 1, access_mode_4_2 3, relaxed_ordering_write 1,
        small_fence_on_rdma_read_response 1, umr_en 1, a 1, rw 1, rr 1, lw 1, lr 1,
        access_mode_1_0 2, qpn 24, mkey_7_0 8, length64 1, bsf_en 1, sync_umr 1,
        expected_sigerr_count 1, en_rinval 1, pd 24, start_addr 64, len 64,
        bsf_octword_size 32, crossing_target_vhca_id 16, translations_octword_size 32,
        relaxed_ordering_read 1, log_page_size 6""",
    "eqc": """
        status 4, ec 1, oi 1, st 4, page_offset 6, log_eq_size 5, uar_page 24, intr 16,
        log_page_size 5, consumer_counter 24, producer_counter 24""",
    "nic_vport_context": """
        min_wqe_inline_mode 3, disable_mc_local_lb 1, disable_uc_local_lb 1, roce_en 1,
        arm_change_event 1, mtu 16, system_image_guid 64, port_guid 64, node_guid 64,
        qkey_violation_counter 16, promisc_uc 1, promisc_mc 1, promisc_all 1,
        allowed_list_type 3, allowed_list_size 12, permanent_address @mac_address_layout""",
    "mac_address_layout": "mac_addr_47_32 16, mac_addr_31_0 32",
    "modify_nic_vport_field_select": """
        affiliation 1, disable_uc_local_lb 1, disable_mc_local_lb 1, node_guid 1,
        port_guid 1, min_inline 1, mtu 1, change_event 1, promisc 1, permanent_address 1,
        addresses_list 1, roce_en 1""",
    "query_adapter_param_block": "ieee_vendor_id 24, vsd_vendor_id 16, vsd bytes208, "
                                 "vsd_contd_psid bytes16",
    "pmtu_reg": "local_port 8, max_mtu 16, admin_mtu 16, oper_mtu 16",
    "ptys_reg": """
        an_disable_admin 1, an_disable_cap 1, local_port 8, proto_mask 3, an_status 4,
        ext_eth_proto_capability 32, eth_proto_capability 32, ib_link_width_capability 16,
        ib_proto_capability 16, ext_eth_proto_admin 32, eth_proto_admin 32,
        ib_link_width_admin 16, ib_proto_admin 16, ext_eth_proto_oper 32, eth_proto_oper 32,
        ib_link_width_oper 16, ib_proto_oper 16, connector_type 4, eth_proto_lp_advertise 32""",
    "uctx": "cap 32",
    "device_mem_cap": """
        memic 1, log_min_memic_alloc_size 5, log_max_memic_addr_alignment 8,
        memic_bar_start_addr 64, memic_bar_size 32, max_memic_size 32, memic_operations 32""",
    # commands
    "query_hca_cap_in": "other_function 1, function_id 16",
    "query_hca_cap_out": "capability @hca_cap_union",
    "set_hca_cap_in": "other_function 1, function_id 16, capability @hca_cap_union",
    "set_hca_cap_out": "",
    "enable_hca_in": "embedded_cpu_function 1, function_id 16",
    "enable_hca_out": "",
    "disable_hca_in": "embedded_cpu_function 1, function_id 16",
    "disable_hca_out": "",
    "init_hca_in": "sw_owner_id bytes16",
    "init_hca_out": "",
    "teardown_hca_in": "profile 16",
    "teardown_hca_out": "state 8",
    "query_adapter_in": "",
    "query_adapter_out": "query_adapter_struct @query_adapter_param_block",
    "query_special_contexts_in": "",
    "query_special_contexts_out": """
        dump_fill_mkey 32, resd_lkey 32, null_mkey 32, terminate_scatter_list_mkey 32,
        repeated_mkey 32""",
    "alloc_uar_in": "", "alloc_uar_out": "uar 24",
    "dealloc_uar_in": "uar 24", "dealloc_uar_out": "",
    "alloc_pd_in": "", "alloc_pd_out": "pd 24",
    "dealloc_pd_in": "pd 24", "dealloc_pd_out": "",
    "alloc_transport_domain_in": "", "alloc_transport_domain_out": "transport_domain 24",
    "dealloc_transport_domain_in": "transport_domain 24",
    "dealloc_transport_domain_out": "",
    "create_uctx_in": "uctx @uctx", "create_uctx_out": "uid 16",
    "destroy_uctx_in": "uid 16", "destroy_uctx_out": "",
    "create_eq_in": "eq_context_entry @eqc, event_bitmask 64, pas []",
    "create_eq_out": "eq_number 8",
    "destroy_eq_in": "eq_number 8", "destroy_eq_out": "",
    "create_cq_in": """
        cq_context @cqc, cq_umem_offset 64, cq_umem_id 32, cq_umem_valid 1, pas []""",
    "create_cq_out": "cqn 24",
    "destroy_cq_in": "cqn 24", "destroy_cq_out": "",
    "query_cq_in": "cqn 24", "query_cq_out": "cq_context @cqc, pas []",
    "modify_cq_in": "cqn 24, modify_field_select 32, cq_context @cqc, cq_umem_valid 1, pas []",
    "modify_cq_out": "",
    "create_qp_in": """
        qpc_ext 1, input_qpn 24, opt_param_mask 32, ece 32, qpc @qpc, wq_umem_offset 64,
        wq_umem_id 32, wq_umem_valid 1, pas []""",
    "create_qp_out": "qpn 24, ece 32",
    "destroy_qp_in": "qpn 24", "destroy_qp_out": "",
    "query_qp_in": "qpc_ext 1, qpn 24",
    "query_qp_out": "opt_param_mask 32, ece 32, qpc @qpc, pas []",
    "create_dct_in": "dct_context_entry @dctc", "create_dct_out": "dctn 24, ece 32",
    "destroy_dct_in": "dctn 24", "destroy_dct_out": "",
    "drain_dct_in": "dctn 24", "drain_dct_out": "",
    "query_dct_in": "dctn 24", "query_dct_out": "dct_context_entry @dctc",
    "create_srq_in": "srq_context_entry @srqc, pas []", "create_srq_out": "srqn 24",
    "destroy_srq_in": "srqn 24", "destroy_srq_out": "",
    "query_srq_in": "srqn 24", "query_srq_out": "srq_context_entry @srqc, pas []",
    "arm_rq_in": "srq_number 24, lwm 16", "arm_rq_out": "",
    "alloc_xrcd_in": "", "alloc_xrcd_out": "xrcd 24",
    "dealloc_xrcd_in": "xrcd 24", "dealloc_xrcd_out": "",
    # the transport objects (a raw packet QP's TIS, SQ, RQ, TIR).  # EMU: a WQ's PAS
    # (wq.pas, the last field of the sqc/rqc that ends the command) is the command's own
    # flexible array: IfcStruct sizes only a top-level one
    "wq": """
        wq_type 4, wq_signature 1, end_padding_mode 2, cd_slave 1, page_offset 5, lwm 16,
        pd 24, uar_page 24, dbr_addr 64, hw_counter 32, sw_counter 32, log_wq_stride 4,
        log_wq_pg_sz 5, log_wq_sz 5, dbr_umem_valid 1, wq_umem_valid 1""",
    "sqc": """
        rlky 1, cd_master 1, fre 1, flush_in_error_en 1, allow_multi_pkt_send_wqe 1,
        min_wqe_inline_mode 3, state 4, reg_umr 1, allow_swp 1, hairpin 1, ts_format 2,
        user_index 24, cqn 24, packet_pacing_rate_limit_index 16, tis_lst_sz 16,
        tis_num_0 24, wq @wq""",
    "rqc": """
        rlky 1, delay_drop_en 1, scatter_fcs 1, vsd 1, mem_rq_type 4, state 4,
        flush_in_error_en 1, hairpin 1, ts_format 2, user_index 24, cqn 24,
        counter_set_id 8, rmpn 24, wq @wq""",
    "tisc": """
        strict_lag_tx_port_affinity 1, tls_en 1, lag_tx_port_affinity 4, prio 4,
        transport_domain 24, underlay_qpn 24""",
    "tirc": """
        disp_type 4, tls_en 1, lro_timeout_period_usecs 16, lro_enable_mask 4,
        lro_max_ip_payload_size 8, inline_rqn 24, rx_hash_symmetric 1,
        tunneled_offload_en 1, indirect_table 24, rx_hash_fn 4, self_lb_block 2,
        transport_domain 24""",
    "create_tis_in": "ctx @tisc", "create_tis_out": "tisn 24",
    "destroy_tis_in": "tisn 24", "destroy_tis_out": "",
    "create_tir_in": "ctx @tirc", "create_tir_out": "tirn 24",
    "destroy_tir_in": "tirn 24", "destroy_tir_out": "",
    "create_sq_in": "ctx @sqc, pas []", "create_sq_out": "sqn 24",
    "modify_sq_in": "sq_state 4, sqn 24, modify_bitmask 64, ctx @sqc", "modify_sq_out": "",
    "destroy_sq_in": "sqn 24", "destroy_sq_out": "",
    "query_sq_in": "sqn 24", "query_sq_out": "sq_context @sqc",
    "create_rq_in": "ctx @rqc, pas []", "create_rq_out": "rqn 24",
    "modify_rq_in": "rq_state 4, rqn 24, modify_bitmask 64, ctx @rqc", "modify_rq_out": "",
    "destroy_rq_in": "rqn 24", "destroy_rq_out": "",
    "query_rq_in": "rqn 24", "query_rq_out": "rq_context @rqc",
    # EMU: rqtc.rq_num[] (u32 entries, 24-bit RQ numbers) is the command's flexible array
    "rqtc": "rqt_max_size 16, rqt_actual_size 16",
    "create_rqt_in": "rqt_context @rqtc, rq_num []", "create_rqt_out": "rqtn 24",
    "destroy_rqt_in": "rqtn 24", "destroy_rqt_out": "",
    # the QP state transitions (the mailboxes of qpc.c modify_qp_mbox_alloc)
    "rst2init_qp_in": _MODIFY_QP_IN, "rst2init_qp_out": "ece 32",
    "init2init_qp_in": _MODIFY_QP_IN, "init2init_qp_out": "ece 32",
    "init2rtr_qp_in": _MODIFY_QP_IN, "init2rtr_qp_out": "ece 32",
    "rtr2rts_qp_in": _MODIFY_QP_IN, "rtr2rts_qp_out": "ece 32",
    "rts2rts_qp_in": _MODIFY_QP_IN, "rts2rts_qp_out": "ece 32",
    "sqerr2rts_qp_in": "qpn 24, opt_param_mask 32, qpc @qpc", "sqerr2rts_qp_out": "",
    "sqd2rts_qp_in": "qpn 24, opt_param_mask 32, qpc @qpc", "sqd2rts_qp_out": "",
    "qp_2err_in": "qpn 24", "qp_2err_out": "",
    "qp_2rst_in": "qpn 24", "qp_2rst_out": "",
    "roce_addr_layout": """
        source_l3_address bytes16, vlan_valid 1, vlan_id 12, source_mac_47_32 16,
        source_mac_31_0 32, roce_l3_type 2, roce_version 8""",
    "set_roce_address_in": """
        roce_address_index 16, vhca_port_num 8, roce_address @roce_addr_layout""",
    "set_roce_address_out": "",
    "create_mkey_in": """
        pg_access 1, mkey_umem_valid 1, data_direct 1, memory_key_mkey_entry @mkc,
        translations_octword_actual_size 32, klm_pas_mtt []""",
    "create_mkey_out": "mkey_index 24",
    "destroy_mkey_in": "mkey_index 24", "destroy_mkey_out": "",
    "alloc_memic_in": """
        range_size 32, memic_size 32, log_memic_addr_alignment 8, range_start_addr 64""",
    "alloc_memic_out": "memic_start_addr 64",
    "dealloc_memic_in": "memic_start_addr 64, memic_size 32", "dealloc_memic_out": "",
    "emu_umr_revoke_mkey_in": "mkey_index 24", "emu_umr_revoke_mkey_out": "",
    "emu_umr_update_mkey_in": """
        mkey_index 24, enable 1, memory_key_mkey_entry @mkc, klm_pas_mtt []""",
    "emu_umr_update_mkey_out": "",
    "emu_umr_update_xlt_in": """
        mkey_index 24, zap 1, enable 1, xlt_offset 32, xlt_nentries 32, klm_pas_mtt []""",
    "emu_umr_update_xlt_out": "",
    "page_fault_resume_in": "error 1, page_fault_type 3, token 24, wq_number 24",
    "page_fault_resume_out": "",
    "emu_umr_rereg_pd_access_in": "mkey_index 24, memory_key_mkey_entry @mkc",
    "emu_umr_rereg_pd_access_out": "",
    "query_mkey_in": "mkey_index 24",
    "query_mkey_out": "memory_key_mkey_entry @mkc, bsf0_klm0_pas_mtt0_1 []",
    "query_nic_vport_context_in": "other_vport 1, vport_number 16, allowed_list_type 3",
    "query_nic_vport_context_out": "nic_vport_context @nic_vport_context",
    "modify_nic_vport_context_in": """
        other_vport 1, vport_number 16, field_select @modify_nic_vport_field_select,
        nic_vport_context @nic_vport_context""",
    "modify_nic_vport_context_out": "",
    "access_register_in": "register_id 16, argument 32, register_data @register_data",
    "access_register_out": "register_data @register_data",
}

#: union name -> its members (a union accepts every member's fields)
UNIONS: dict[str, tuple[str, ...]] = {
    "hca_cap_union": ("cmd_hca_cap", "roce_cap", "per_protocol_networking_offload_caps",
                      "device_mem_cap"),
    "register_data": ("pmtu_reg", "ptys_reg"),
}

ARRAY = "[]"


def _parse(text: str) -> dict[str, int | str]:
    fields: dict[str, int | str] = {}
    for tok in text.replace("\n", ",").split(","):
        tok = tok.strip()
        if not tok:
            continue
        name, kind = tok.split()
        if kind.startswith(("@", "bytes")) or kind == ARRAY:
            fields[name] = kind
        else:
            fields[name] = int(kind)
    return fields


def _build() -> dict[str, dict[str, int | str]]:
    out: dict[str, dict[str, int | str]] = {}
    for typ, text in _TEXT.items():
        hdr = _HDR_IN if typ.endswith("_in") else _HDR_OUT if typ.endswith("_out") else ""
        out[typ] = _parse(hdr + "," + text)
    for union, members in UNIONS.items():
        merged: dict[str, int | str] = {}
        for member in members:
            merged.update(out[member])
        out[union] = merged
    return out


#: typ -> field -> width in bits | "@nested" | "[]" | "bytesN"
LAYOUTS = _build()
#: typ -> (its flexible arrays, its nested structures as (field, typ)): what
#: IfcStruct() lays out, read from LAYOUTS once rather than on every command
_SHAPES: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    typ: (tuple(n for n, k in layout.items() if k == ARRAY),
          tuple((n, k[1:]) for n, k in layout.items() if isinstance(k, str) and k[:1] == "@"))
    for typ, layout in LAYOUTS.items()}


# -- the object and the macros ------------------------------------------------------------
class IfcStruct:
    """One ifc structure (a command, a context): the `u32 in[MLX5_ST_SZ_DW(typ)]` buffer.

    Unset fields read 0.  `flex` gives each flexible array's length in entries
    (`IfcStruct("create_qp_in", pas=4)`).  s["field"] reads a field (for the
    firmware's and a test's inspection); the kernel uses MLX5_GET.
    """

    __slots__ = ("typ", "vals", "subs", "arrays", "__weakref__")
    #: partial-order reduction: not a tracked struct - its fields are fixed once made
    #: (memcpy_ifc copies in place), and it reports what it holds itself: each value
    #: through `vals` (keyed_dict), each flexible array where MLX5_ADDR_OF hands it out
    POR_SELF_REPORTED = True

    def __init__(self, typ: str, **flex: int):
        layout = LAYOUTS.get(typ)
        if layout is None:
            raise TypeError(f"IfcStruct: no layout mlx5_ifc_{typ}_bits")
        self.typ = typ
        # partial-order reduction sees the fields one by one (keyed_dict): a command
        # reading a capability does not conflict with another setting a QP's field
        self.vals: dict[str, int | bytearray] = keyed_dict()
        arrays, subs = _SHAPES[typ]
        self.subs: dict[str, IfcStruct] = {name: IfcStruct(sub) for name, sub in subs}
        self.arrays: dict[str, U64Array] = {}
        if flex:
            for name in arrays:
                n = flex.pop(name, 0)
                if n:                       # an empty one is made when first asked for
                    self.arrays[name] = U64Array(n)
            if flex:
                raise TypeError(f"IfcStruct: {typ} has no flexible array {sorted(flex)}")

    def __getitem__(self, field: str) -> int:
        return MLX5_GET(self.typ, self, field)

    def copy(self) -> IfcStruct:
        """A deep copy (memcpy of the buffer), arrays included."""
        new = IfcStruct.__new__(IfcStruct)
        new.typ = self.typ
        new.vals = keyed_dict()
        vals = self.vals
        if bytearray in map(type, vals.values()):   # byte fields are copied, not shared
            new.vals.update({k: bytearray(v) if isinstance(v, bytearray) else v
                             for k, v in vals.items()})
        else:
            new.vals.update(vals)
        new.subs = {k: v.copy() for k, v in self.subs.items()}
        new.arrays = {}
        for k, arr in self.arrays.items():
            touch_key((id(self.vals), "[]" + k), False)
            new.arrays[k] = U64Array(arr.n)
            new.arrays[k].view[: arr.n] = arr.view[: arr.n]
        return new

    def __repr__(self) -> str:
        set_ = ", ".join(f"{k}={v:#x}" for k, v in self.vals.items() if isinstance(v, int) and v)
        return f"mlx5_ifc_{self.typ} {{{set_}}}"


def _resolve(typ: str, obj: IfcStruct, field: str, macro: str) -> tuple[IfcStruct, str, int | str]:
    """Walk a dotted field path ("memory_key_mkey_entry.mkey_7_0") to (struct, name, kind).

    What the C macros resolve at compile time is resolved here once per
    (typ, the object's typ, field) and kept in _FIELDS: the nested structures
    to step through, the field's name and its kind.  Only a resolution that
    succeeded is kept, so every misuse still raises its TypeError.
    """
    if type(obj) is IfcStruct:
        hit = _FIELDS.get((typ, obj.typ, field))
        if hit is not None:
            path, name, kind = hit
            for head in path:
                obj = obj.subs[head]
            return obj, name, kind
    s, name, kind = _walk(typ, obj, field, macro)
    if type(obj) is IfcStruct:
        _FIELDS[(typ, obj.typ, field)] = (tuple(field.split(".")[:-1]), name, kind)
    return s, name, kind


#: (typ, the object's typ, field) -> (nested structures on the way, name, kind)
_FIELDS: dict[tuple[str, str, str], tuple[tuple[str, ...], str, int | str]] = {}


def _walk(typ: str, obj: IfcStruct, field: str, macro: str) -> tuple[IfcStruct, str, int | str]:
    """_resolve's first resolution of a field: every check, then the walk."""
    if not isinstance(obj, IfcStruct):
        raise TypeError(f"{macro}: {type(obj).__name__} is not an ifc structure")
    otyp = obj.typ
    if otyp != typ and typ not in UNIONS.get(otyp, ()) and not (
            typ in ("mbox_in", "mbox_out") and otyp.endswith(typ[4:])):
        # mbox_in/mbox_out: the header every command's in/out begins with
        raise TypeError(f"{macro}: object is mlx5_ifc_{otyp}, not {typ}")
    layout = LAYOUTS.get(typ)
    if layout is None:
        raise TypeError(f"{macro}: no layout mlx5_ifc_{typ}_bits")
    head, _, rest = field.partition(".")
    kind = layout.get(head)
    if kind is None:
        raise TypeError(f"{macro}: mlx5_ifc_{typ}_bits has no field {head}")
    if rest:
        if not (isinstance(kind, str) and kind.startswith("@")):
            raise TypeError(f"{macro}: {typ}.{head} is not a structure")
        return _walk(kind[1:], obj.subs[head], rest, macro)
    return obj, head, kind


def __mlx5_bit_sz(typ: str, field: str) -> int:
    """Mirrors __mlx5_bit_sz(): a field's width in bits."""
    kind = LAYOUTS[typ].get(field) if typ in LAYOUTS else None
    if isinstance(kind, int):
        return kind
    if isinstance(kind, str) and kind.startswith("bytes"):
        return int(kind[5:]) * 8
    if kind == ARRAY:
        return 64
    raise TypeError(f"__mlx5_bit_sz: mlx5_ifc_{typ}_bits has no scalar field {field}")


def MLX5_FLD_SZ_BYTES(typ: str, field: str) -> int:
    """Mirrors MLX5_FLD_SZ_BYTES(); for a flexible array, one entry's size."""
    return __mlx5_bit_sz(typ, field) // 8


def _scalar(typ: str, obj: IfcStruct, field: str, macro: str) -> tuple[IfcStruct, str, int]:
    s, name, kind = _resolve(typ, obj, field, macro)
    if not isinstance(kind, int):
        raise TypeError(f"{macro}: {typ}.{field} is not a scalar field")
    return s, name, kind


def MLX5_SET(typ: str, obj: IfcStruct, field: str, value: int) -> None:
    """Mirrors MLX5_SET(): store value masked to the field's width (<= 32 bits).
    A field resolved before is found in _FIELDS inline (no call to _scalar)."""
    hit = _FIELDS.get((typ, obj.typ, field)) if type(obj) is IfcStruct else None
    if hit is None or type(hit[2]) is not int:
        s, name, width = _scalar(typ, obj, field, "MLX5_SET")
    else:
        path, name, width = hit
        s = obj
        for head in path:
            s = s.subs[head]
    if width > 32:
        raise TypeError(f"MLX5_SET: {typ}.{field} is {width} bits wide: use MLX5_SET64")
    s.vals[name] = int(value) & ((1 << width) - 1)


def MLX5_SET64(typ: str, obj: IfcStruct, field: str, value: int) -> None:
    """Mirrors MLX5_SET64(): a 64-bit field."""
    s, name, width = _scalar(typ, obj, field, "MLX5_SET64")
    if width != 64:
        raise TypeError(f"MLX5_SET64: {typ}.{field} is {width} bits wide, not 64")
    s.vals[name] = int(value) & ((1 << 64) - 1)


def MLX5_GET(typ: str, obj: IfcStruct, field: str) -> int:
    """Mirrors MLX5_GET()/MLX5_GET64(): the field's value (0 when never set).
    A field resolved before is found in _FIELDS inline (no call to _scalar)."""
    hit = _FIELDS.get((typ, obj.typ, field)) if type(obj) is IfcStruct else None
    if hit is None or type(hit[2]) is not int:
        s, name, _ = _scalar(typ, obj, field, "MLX5_GET")
        return s.vals.get(name, 0)  # type: ignore[return-value]
    path, name, _ = hit
    for head in path:
        obj = obj.subs[head]
    return obj.vals.get(name, 0)  # type: ignore[return-value]


MLX5_GET64 = MLX5_GET


def MLX5_ADDR_OF(typ: str, obj: IfcStruct, field: str) -> IfcStruct | U64Array | bytearray:
    """Mirrors MLX5_ADDR_OF(): a nested structure, a flexible array, or a byte string."""
    s, name, kind = _resolve(typ, obj, field, "MLX5_ADDR_OF")
    if kind == ARRAY:
        # the caller may write the entries in place: for partial-order reduction, a write
        touch_key((id(s.vals), "[]" + name), True)
        arr = s.arrays.get(name)
        if arr is None:
            arr = s.arrays[name] = U64Array(0)
        return arr
    if isinstance(kind, str) and kind.startswith("@"):
        return s.subs[name]
    if isinstance(kind, str):
        buf = s.vals.get(name)
        if buf is None:
            buf = s.vals[name] = bytearray(int(kind[5:]))
        # the caller may write the bytes in place: for partial-order reduction, a write
        touch_key((id(s.vals), name), True)
        return buf  # type: ignore[return-value]
    raise TypeError(f"MLX5_ADDR_OF: {typ}.{field} is a scalar: use MLX5_GET")


def memcpy_ifc(dst: IfcStruct, src: IfcStruct) -> None:
    """memcpy(dst, src, MLX5_ST_SZ_BYTES(...)) between two ifc buffers."""
    dup = src.copy()
    _assign(dst, dup)


def _assign(dst: IfcStruct, src: IfcStruct) -> None:
    """dst's values and nested structures become src's, in place (what a memcpy does)."""
    dst.vals.clear()
    dst.vals.update(src.vals)
    for k, sub in src.subs.items():
        if k in dst.subs:
            _assign(dst.subs[k], sub)
        else:
            dst.subs[k] = sub
    for k in [k for k in dst.subs if k not in src.subs]:
        del dst.subs[k]


def cpu_to_be64(v: int) -> int:
    """Mirrors cpu_to_be64() on a little-endian host."""
    return int.from_bytes((v & (1 << 64) - 1).to_bytes(8, "little"), "big")


be64_to_cpu = cpu_to_be64


# -- raw PRM mailboxes (DevX) ---------------------------------------------------------------
# A DevX command arrives from user space as the raw big-endian bytes of the PRM layout
# (fields packed MSB first within each dword, at the bit offsets of mlx5_ifc.h).  For the
# layouts below the bit offsets are known, so a raw mailbox converts to and from an
# IfcStruct.  PRM_LAYOUTS: typ -> (size in bits, {field: (bit offset, width)}); a nested
# structure or union is (bit offset, "@typ").  # EMU: fields the model's layout has but
# whose offset is not listed (cmd_hca_cap.ece_support) are not carried in a raw mailbox.
PRM_LAYOUTS: dict[str, tuple[int, dict[str, tuple[int, int | str]]]] = {
    "mbox_in": (0x40, dict(opcode=(0x0, 16), uid=(0x10, 16), op_mod=(0x30, 16))),
    "mbox_out": (0x80, dict(status=(0x0, 8), syndrome=(0x20, 32))),
    "query_hca_cap_in": (0x80, dict(opcode=(0x0, 16), uid=(0x10, 16), op_mod=(0x30, 16),
                                    other_function=(0x40, 1), function_id=(0x50, 16))),
    "query_hca_cap_out": (0x8080, dict(status=(0x0, 8), syndrome=(0x20, 32),
                                       capability=(0x80, "@hca_cap_union"))),
    "hca_cap_union": (0x8000, {}),  # a union: packed as the member the caller names
    "cmd_hca_cap": (0x800, dict(
        hca_cap_2=(0x20, 1), vhca_id=(0x30, 16), log_max_srq_sz=(0x80, 8),
        log_max_qp_sz=(0x88, 8), event_cap=(0x90, 1), log_max_qp=(0x9b, 5),
        log_max_srq=(0xab, 5), log_max_cq_sz=(0xc8, 8), log_max_cq=(0xdb, 5),
        log_max_eq_sz=(0xe0, 8), relaxed_ordering_write=(0xe8, 1),
        relaxed_ordering_read_pci_enabled=(0xe9, 1), log_max_mkey=(0xea, 6),
        terminate_scatter_list_mkey=(0xf6, 1), repeated_mkey=(0xf7, 1),
        dump_fill_mkey=(0xf8, 1), log_max_eq=(0xfc, 4), max_indirection=(0x100, 8),
        fixed_buffer_size=(0x108, 1), log_max_mrw_sz=(0x109, 7), force_teardown=(0x110, 1),
        fast_teardown=(0x111, 1), log_max_bsf_list_size=(0x112, 6),
        umr_extended_translation_offset=(0x118, 1), null_mkey=(0x119, 1),
        log_max_klm_list_size=(0x11a, 6), log_max_ra_req_dc=(0x12a, 6),
        log_max_ra_res_dc=(0x13a, 6), log_max_ra_req_qp=(0x14a, 6),
        log_max_ra_res_qp=(0x15a, 6), end_pad=(0x160, 1), cc_query_allowed=(0x161, 1),
        cc_modify_allowed=(0x162, 1), start_pad=(0x163, 1), cache_line_128byte=(0x164, 1),
        gid_table_size=(0x170, 16), out_of_seq_cnt=(0x180, 1), vport_counters=(0x181, 1),
        retransmission_q_counters=(0x182, 1), debug=(0x183, 1), max_qp_cnt=(0x186, 10),
        pkey_table_size=(0x190, 16), vport_group_manager=(0x1a0, 1), ib_virt=(0x1a2, 1),
        eth_virt=(0x1a3, 1), ets=(0x1a5, 1), nic_flow_table=(0x1a6, 1),
        eswitch_manager=(0x1a7, 1), device_memory=(0x1a8, 1), mcam_reg=(0x1a9, 1),
        pcam_reg=(0x1aa, 1), local_ca_ack_delay=(0x1ab, 5), port_module_event=(0x1b0, 1),
        port_type=(0x1b6, 2), num_ports=(0x1b8, 8), pps=(0x1c1, 1), log_max_msg=(0x1c3, 5),
        max_tc=(0x1cc, 4), general_notification_event=(0x1d2, 1),
        stat_rate_support=(0x1e0, 16), init2_lag_tx_port_affinity=(0x1f9, 1),
        cqe_version=(0x1fc, 4), compact_address_vector=(0x200, 1),
        ipoib_enhanced_offloads=(0x203, 1), ipoib_basic_offloads=(0x204, 1),
        umr_fence=(0x20a, 2), drain_sigerr=(0x20f, 1), cmdif_checksum=(0x210, 2),
        sigerr_cqe=(0x212, 1), wq_signature=(0x214, 1), sctr_data_cqe=(0x215, 1),
        sho=(0x217, 1), tph=(0x218, 1), rf=(0x219, 1), dct=(0x21a, 1), qos=(0x21b, 1),
        eth_net_offloads=(0x21c, 1), roce=(0x21d, 1), atomic=(0x21e, 1), cq_oi=(0x220, 1),
        cq_resize=(0x221, 1), cq_moderation=(0x222, 1), cq_period_mode_modify=(0x223, 1),
        cq_eq_remap=(0x226, 1), pg=(0x227, 1), block_lb_mc=(0x228, 1),
        scqe_break_moderation=(0x22a, 1), cq_period_start_from_cqe=(0x22b, 1),
        cd=(0x22c, 1), apm=(0x22e, 1), umr_ptr_rlkey=(0x230, 1), imaicl=(0x231, 1),
        qp_packet_based=(0x232, 1), qkv=(0x236, 1), pkv=(0x237, 1), set_deth_sqpn=(0x238, 1),
        xrc=(0x23c, 1), ud=(0x23d, 1), uc=(0x23e, 1), rc=(0x23f, 1), uar_4k=(0x240, 1),
        uar_sz=(0x24a, 6), umem_uid_0=(0x252, 1), log_pg_sz=(0x258, 8), bf=(0x260, 1),
        driver_version=(0x261, 1), pad_tx_eth_packet=(0x262, 1), mkey_by_name=(0x266, 1),
        log_bf_reg_size=(0x26b, 5), lag_tx_port_affinity=(0x278, 1), lag_master=(0x27b, 1),
        num_lag_ports=(0x27c, 4), max_wqe_sz_sq=(0x290, 16), max_wqe_sz_rq=(0x2b0, 16),
        max_wqe_sz_sq_dc=(0x2d0, 16), max_qp_mcg=(0x2e7, 25), log_max_mcg=(0x318, 8),
        log_max_transport_domain=(0x323, 5), log_max_pd=(0x32b, 5), log_max_xrcd=(0x33b, 5),
        log_max_rq=(0x363, 5), log_max_sq=(0x36b, 5), log_max_tir=(0x373, 5),
        log_max_tis=(0x37b, 5), basic_cyclic_rcv_wqe=(0x380, 1), log_max_rmp=(0x383, 5),
        log_max_rqt=(0x38b, 5), log_max_rqt_size=(0x393, 5), log_max_tis_per_sq=(0x39b, 5),
        roce_rw_supported=(0x3a1, 1), log_max_wq_sz=(0x3db, 5),
        nic_vport_change_event=(0x3e0, 1), disable_local_lb_uc=(0x3e1, 1),
        disable_local_lb_mc=(0x3e2, 1), log_max_vlan_list=(0x3eb, 5),
        log_max_current_mc_list=(0x3f3, 5), log_max_current_uc_list=(0x3fb, 5),
        general_obj_types=(0x400, 64), sq_ts_format=(0x440, 2), rq_ts_format=(0x442, 2),
        steering_format_version=(0x444, 4), create_qp_start_hint=(0x448, 24),
        log_max_uctx=(0x463, 5), log_max_umem=(0x46b, 5), max_num_eqs=(0x470, 16),
        log_max_l2_table=(0x483, 5), log_uar_page_sz=(0x490, 16),
        device_frequency_mhz=(0x4c0, 32), device_frequency_khz=(0x4e0, 32),
        num_of_uars_per_page=(0x520, 32), log_max_atomic_size_qp=(0x580, 8),
        log_max_atomic_size_dc=(0x598, 8), cqe_128_always=(0x5bd, 1),
        cqe_compression=(0x5bf, 1), native_port_num=(0x608, 8), num_vhca_ports=(0x610, 8),
        sw_owner_id=(0x61e, 1))),
    "device_mem_cap": (0x800, dict(
        memic=(0x0, 1), log_min_memic_alloc_size=(0x2b, 5),
        log_max_memic_addr_alignment=(0x38, 8), memic_bar_start_addr=(0x40, 64),
        memic_bar_size=(0x80, 32), max_memic_size=(0xa0, 32), memic_operations=(0x200, 32))),
}


def MLX5_ST_SZ_BYTES(typ: str) -> int:
    """Mirrors MLX5_ST_SZ_BYTES(): the PRM size of a layout with known offsets."""
    if typ not in PRM_LAYOUTS:
        raise TypeError(f"MLX5_ST_SZ_BYTES: no PRM offsets for mlx5_ifc_{typ}_bits")
    return PRM_LAYOUTS[typ][0] // 8


def _prm_table(typ: str, unions: dict[str, str]) -> tuple[int, dict[str, tuple[int, int | str]]]:
    if typ in UNIONS:
        member = unions.get(typ)
        if member is None or member not in UNIONS[typ]:
            raise TypeError(f"prm: union {typ} needs one of its members, not {member!r}")
        typ = member
    if typ not in PRM_LAYOUTS:
        raise TypeError(f"prm: no PRM offsets for mlx5_ifc_{typ}_bits")
    return PRM_LAYOUTS[typ]


def _prm_walk(typ: str, base: int, unions: dict[str, str], obj: IfcStruct | None = None):
    """(bit offset, width, struct, field) of every scalar field of typ, nested ones too."""
    _, table = _prm_table(typ, unions)
    for name, (off, kind) in table.items():
        if isinstance(kind, str):
            sub = obj.subs[name] if obj is not None else None
            yield from _prm_walk(kind[1:], base + off, unions, sub)
        else:
            yield base + off, kind, obj, name


def prm_unpack(typ: str, raw: bytes, unions: dict[str, str] | None = None) -> IfcStruct:
    """The IfcStruct a raw PRM mailbox of layout typ holds (what MLX5_GET reads from it).

    `unions` names the member each union is read as ({"hca_cap_union": "cmd_hca_cap"}).
    Bytes beyond a short buffer read 0, as in a zeroed mailbox; fields the model's
    layout lacks (reserved bits included) are dropped."""
    unions = unions or {}
    obj = IfcStruct(typ)
    value = int.from_bytes(bytes(raw).ljust(MLX5_ST_SZ_BYTES(typ), b"\0")[
        :MLX5_ST_SZ_BYTES(typ)], "big")
    nbits = PRM_LAYOUTS[typ][0]
    for off, width, s, name in _prm_walk(typ, 0, unions, obj):
        if name in LAYOUTS[s.typ]:
            s.vals[name] = (value >> (nbits - off - width)) & ((1 << width) - 1)
    return obj


def prm_pack(obj: IfcStruct, unions: dict[str, str] | None = None) -> bytes:
    """The raw PRM bytes of obj (MLX5_ST_SZ_BYTES long, big-endian, MSB first); the
    inverse of prm_unpack for every field both the model and PRM_LAYOUTS know."""
    unions = unions or {}
    nbits = PRM_LAYOUTS[obj.typ][0] if obj.typ in PRM_LAYOUTS else 0
    if not nbits:
        raise TypeError(f"prm_pack: no PRM offsets for mlx5_ifc_{obj.typ}_bits")
    value = 0
    for off, width, s, name in _prm_walk(obj.typ, 0, unions, obj):
        v = s.vals.get(name, 0)
        if isinstance(v, int) and v:
            value |= (v & ((1 << width) - 1)) << (nbits - off - width)
    return value.to_bytes(nbits // 8, "big")


# -- the command queue --------------------------------------------------------------------
class mlx5_cmd_layout:
    """Mirrors struct mlx5_cmd_layout: one command-queue entry.

    # EMU: the entry carries the whole input and output structures instead of
    # 16 inline bytes plus chained mailboxes of 512-byte blocks.
    """

    __slots__ = ("type", "in_", "out", "token", "status_own")
    #: partial-order reduction: the token is the last command's, whichever ran last
    #: (see mlx5_cmd.POR_ADDS)
    POR_ADDS = ("token",)

    def __init__(self) -> None:
        self.type = 0
        self.in_: IfcStruct | None = None
        self.out: IfcStruct | None = None
        self.token = 0
        self.status_own = 0  # bit 0: owned by hardware; bits 1-7: delivery status

    def __repr__(self) -> str:
        op = MLX5_GET("mbox_in", self.in_, "opcode") if self.in_ is not None else 0
        return f"cmd entry {MLX5_CMD_NAMES.get(op, hex(op))} own={self.status_own & 1}"


class CmdqMemory:
    """Where a command queue lives, as both sides of the bus find it.

    # EMU: the driver allocates a real page for the queue and programs its
    # DMA address into the initialisation segment, as mlx5_cmd_init does; the
    # entries themselves are Python objects, so the page's contents live in
    # this table keyed by (machine, address) and the device "DMA-reads" an
    # entry by looking it up.
    """

    _queues: weakref.WeakKeyDictionary[Machine, dict[int, list[mlx5_cmd_layout]]] = (
        weakref.WeakKeyDictionary())

    @classmethod
    def publish(cls, machine: Machine, dma_addr: int, entries: list[mlx5_cmd_layout]) -> None:
        cls._queues.setdefault(machine, {})[dma_addr] = entries

    @classmethod
    def withdraw(cls, machine: Machine, dma_addr: int) -> None:
        cls._queues.get(machine, {}).pop(dma_addr, None)

    @classmethod
    def lookup(cls, machine: Machine, dma_addr: int) -> list[mlx5_cmd_layout] | None:
        return cls._queues.get(machine, {}).get(dma_addr)
