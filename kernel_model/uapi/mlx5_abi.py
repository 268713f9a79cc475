"""Mirrors include/uapi/rdma/mlx5-abi.h (rdma-core's kernel-headers copy is the
same file): the mlx5 driver-private udata of each uverbs command.

The kernel's mlx5_ib reads the request structs from udata->inbuf and writes
the responses to udata->outbuf; rdma-core's mlx5 provider builds the same
bytes.  Sizes matter: mlx5_ib_alloc_ucontext() tells the ABI version apart by
the request length (8 bytes: v0; at least offsetof(max_cqe_version): v2).
"""

from __future__ import annotations

from kernel_model.uapi.ustruct import UStruct, uapi_struct

MLX5_IB_UVERBS_ABI_VERSION = 1

MLX5_LIB_CAP_4K_UAR = 1 << 0
MLX5_LIB_CAP_DYN_UAR = 1 << 1
MLX5_IB_ALLOC_UCTX_DEVX = 1 << 0

# alloc_ucontext resp comp_mask
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_CORE_CLOCK_OFFSET = 1 << 0
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_DUMP_FILL_MKEY = 1 << 1
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_ECE = 1 << 2
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_SQD2RTS = 1 << 3
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_REAL_TIME_TS = 1 << 4
MLX5_IB_ALLOC_UCONTEXT_RESP_MASK_MKEY_UPDATE_TAG = 1 << 5

# enum mlx5_user_cmds_supp_uhw
MLX5_USER_CMDS_SUPP_UHW_QUERY_DEVICE = 1 << 0
MLX5_USER_CMDS_SUPP_UHW_CREATE_AH = 1 << 1

# enum mlx5_ib_create_qp flags
MLX5_QP_FLAG_SIGNATURE = 1 << 0
MLX5_QP_FLAG_SCATTER_CQE = 1 << 1
MLX5_QP_FLAG_TUNNEL_OFFLOADS = 1 << 2
MLX5_QP_FLAG_BFREG_INDEX = 1 << 3
MLX5_QP_FLAG_TYPE_DCT = 1 << 4
MLX5_QP_FLAG_TYPE_DCI = 1 << 5
MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_UC = 1 << 6
MLX5_QP_FLAG_TIR_ALLOW_SELF_LB_MC = 1 << 7
MLX5_QP_FLAG_ALLOW_SCATTER_CQE = 1 << 8
MLX5_QP_FLAG_PACKET_BASED_CREDIT_MODE = 1 << 9
MLX5_QP_FLAG_UAR_PAGE_INDEX = 1 << 10
MLX5_QP_FLAG_DCI_STREAM = 1 << 11

# enum mlx5_ib_create_cq_flags
MLX5_IB_CREATE_CQ_FLAGS_CQE_128B_PAD = 1 << 0
MLX5_IB_CREATE_CQ_FLAGS_UAR_PAGE_INDEX = 1 << 1
MLX5_IB_CREATE_CQ_FLAGS_REAL_TIME_TS = 1 << 2

# enum mlx5_ib_mmap_cmd
MLX5_IB_MMAP_REGULAR_PAGE = 0
MLX5_IB_MMAP_GET_CONTIGUOUS_PAGES = 1
MLX5_IB_MMAP_WC_PAGE = 2
MLX5_IB_MMAP_NC_PAGE = 3
MLX5_IB_MMAP_CORE_CLOCK = 5
MLX5_IB_MMAP_ALLOC_WC = 6
MLX5_IB_MMAP_CLOCK_INFO = 7
MLX5_IB_MMAP_DEVICE_MEM = 8

MLX5_IB_CLOCK_INFO_V1 = 0
# struct mlx5_ib_clock_info's sign: the kernel is rewriting the page
MLX5_IB_CLOCK_INFO_KERNEL_UPDATING = 1


@uapi_struct
class mlx5_ib_clock_info(UStruct):
    """The clock-info page (MLX5_IB_MMAP_CLOCK_INFO, version 1): the timecounter that
    converts device timestamps to nanoseconds, host-endian, written by mlx5_core."""

    FIELDS = (("sign", "I"), ("resv", "I"), ("nsec", "Q"), ("cycles", "Q"), ("frac", "Q"),
              ("mult", "I"), ("shift", "I"), ("mask", "Q"), ("overflow_period", "Q"))


@uapi_struct
class mlx5_ib_alloc_ucontext_req(UStruct):
    FIELDS = (("total_num_bfregs", "I"), ("num_low_latency_bfregs", "I"))


@uapi_struct
class mlx5_ib_alloc_ucontext_req_v2(UStruct):
    FIELDS = (("total_num_bfregs", "I"), ("num_low_latency_bfregs", "I"), ("flags", "I"),
              ("comp_mask", "I"), ("max_cqe_version", "B"), ("reserved0", "B"),
              ("reserved1", "H"), ("reserved2", "I"), ("lib_caps", "Q"))


@uapi_struct
class mlx5_ib_alloc_ucontext_resp(UStruct):
    FIELDS = (("qp_tab_size", "I"), ("bf_reg_size", "I"), ("tot_bfregs", "I"),
              ("cache_line_size", "I"), ("max_sq_desc_sz", "H"), ("max_rq_desc_sz", "H"),
              ("max_send_wqebb", "I"), ("max_recv_wr", "I"), ("max_srq_recv_wr", "I"),
              ("num_ports", "H"), ("flow_action_flags", "H"), ("comp_mask", "I"),
              ("response_length", "I"), ("cqe_version", "B"), ("cmds_supp_uhw", "B"),
              ("eth_min_inline", "B"), ("clock_info_versions", "B"),
              ("hca_core_clock_offset", "Q"), ("log_uar_size", "I"),
              ("num_uars_per_page", "I"), ("num_dyn_bfregs", "I"), ("dump_fill_mkey", "I"))


@uapi_struct
class mlx5_ib_alloc_pd_resp(UStruct):
    FIELDS = (("pdn", "I"),)


@uapi_struct
class mlx5_ib_create_ah_resp(UStruct):
    """The driver's part of CREATE_AH's response: the destination MAC it resolved."""

    FIELDS = (("response_length", "I"), ("dmac", "6s"), ("reserved", "6s"))


@uapi_struct
class mlx5_ib_create_cq(UStruct):
    FIELDS = (("buf_addr", "Q"), ("db_addr", "Q"), ("cqe_size", "I"), ("cqe_comp_en", "B"),
              ("cqe_comp_res_format", "B"), ("flags", "H"), ("uar_page_index", "H"),
              ("reserved0", "H"), ("reserved1", "I"))


@uapi_struct
class mlx5_ib_create_cq_resp(UStruct):
    FIELDS = (("cqn", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_resize_cq(UStruct):
    FIELDS = (("buf_addr", "Q"), ("cqe_size", "H"), ("reserved0", "H"), ("reserved1", "I"))


@uapi_struct
class mlx5_ib_create_qp(UStruct):
    FIELDS = (("buf_addr", "Q"), ("db_addr", "Q"), ("sq_wqe_count", "I"),
              ("rq_wqe_count", "I"), ("rq_wqe_shift", "I"), ("flags", "I"), ("uidx", "I"),
              ("bfreg_index", "I"), ("sq_buf_addr", "Q"), ("ece_options", "I"),
              ("log_num_concurent", "B"), ("log_num_errored", "B"), ("reserved", "H"))


@uapi_struct
class mlx5_ib_create_srq(UStruct):
    FIELDS = (("buf_addr", "Q"), ("db_addr", "Q"), ("flags", "I"), ("reserved0", "I"),
              ("uidx", "I"), ("reserved1", "I"))


@uapi_struct
class mlx5_ib_create_srq_resp(UStruct):
    FIELDS = (("srqn", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_create_qp_resp(UStruct):
    FIELDS = (("bfreg_index", "I"), ("ece_options", "I"), ("comp_mask", "I"), ("tirn", "I"),
              ("tisn", "I"), ("rqn", "I"), ("sqn", "I"), ("reserved1", "I"),
              ("tir_icm_addr", "Q"))


@uapi_struct
class mlx5_ib_create_wq(UStruct):
    FIELDS = (("buf_addr", "Q"), ("db_addr", "Q"), ("rq_wqe_count", "I"),
              ("rq_wqe_shift", "I"), ("user_index", "I"), ("flags", "I"), ("comp_mask", "I"),
              ("single_stride_log_num_of_bytes", "I"), ("single_wqe_log_num_of_strides", "I"),
              ("two_byte_shift_en", "I"))


@uapi_struct
class mlx5_ib_create_wq_resp(UStruct):
    FIELDS = (("response_length", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_create_rwq_ind_tbl_resp(UStruct):
    FIELDS = (("response_length", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_modify_wq(UStruct):
    FIELDS = (("comp_mask", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_burst_info(UStruct):
    FIELDS = (("max_burst_sz", "I"), ("typical_pkt_sz", "H"), ("reserved", "H"))


@uapi_struct
class mlx5_ib_modify_qp(UStruct):
    """The driver part of MODIFY_QP (only the extended command carries it)."""

    FIELDS = (("comp_mask", "I"), ("burst_info", mlx5_ib_burst_info), ("ece_options", "I"))


@uapi_struct
class mlx5_ib_modify_qp_resp(UStruct):
    FIELDS = (("response_length", "I"), ("dctn", "I"), ("ece_options", "I"), ("reserved", "I"))


@uapi_struct
class mlx5_ib_alloc_mw(UStruct):
    FIELDS = (("comp_mask", "I"), ("num_klms", "B"), ("reserved1", "B"), ("reserved2", "H"))
