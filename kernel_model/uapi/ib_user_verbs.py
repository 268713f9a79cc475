"""Mirrors include/uapi/rdma/ib_user_verbs.h (+ the access flags of
ib_user_ioctl_verbs.h): the uverbs write() commands both sides compile against.

A legacy command is one write() to /dev/infiniband/uverbsN of
`ib_uverbs_cmd_hdr` + the command struct + the driver's request (udata in).
`in_words` counts the whole write in 32-bit words, header included;
`out_words` the response buffer (core response + driver response) whose user
address is the command's first field, `response`.
"""

from __future__ import annotations

from kernel_model.uapi.ustruct import UStruct, uapi_struct

IB_USER_VERBS_ABI_VERSION = 6

# enum ib_uverbs_write_cmds
IB_USER_VERBS_CMD_GET_CONTEXT = 0
IB_USER_VERBS_CMD_QUERY_DEVICE = 1
IB_USER_VERBS_CMD_QUERY_PORT = 2
IB_USER_VERBS_CMD_ALLOC_PD = 3
IB_USER_VERBS_CMD_DEALLOC_PD = 4
IB_USER_VERBS_CMD_CREATE_AH = 5
IB_USER_VERBS_CMD_DESTROY_AH = 8
IB_USER_VERBS_CMD_REG_MR = 9
IB_USER_VERBS_CMD_REREG_MR = 11
IB_USER_VERBS_CMD_DEREG_MR = 13
IB_USER_VERBS_CMD_ALLOC_MW = 14
IB_USER_VERBS_CMD_DEALLOC_MW = 15
IB_USER_VERBS_CMD_CREATE_CQ = 18
IB_USER_VERBS_CMD_CREATE_COMP_CHANNEL = 17
IB_USER_VERBS_CMD_RESIZE_CQ = 19
IB_USER_VERBS_CMD_DESTROY_CQ = 20
IB_USER_VERBS_CMD_CREATE_QP = 24
IB_USER_VERBS_CMD_QUERY_QP = 25
IB_USER_VERBS_CMD_MODIFY_QP = 26
IB_USER_VERBS_CMD_DESTROY_QP = 27
IB_USER_VERBS_CMD_CREATE_SRQ = 29
IB_USER_VERBS_CMD_MODIFY_SRQ = 30
IB_USER_VERBS_CMD_QUERY_SRQ = 31
IB_USER_VERBS_CMD_DESTROY_SRQ = 32
IB_USER_VERBS_CMD_CREATE_XSRQ = 36
IB_USER_VERBS_CMD_OPEN_XRCD = 37
IB_USER_VERBS_CMD_CLOSE_XRCD = 38

# the command word: a command number, plus a flag for the extended (write_ex) table
IB_USER_VERBS_CMD_COMMAND_MASK = 0xFF
IB_USER_VERBS_CMD_FLAG_EXTENDED = 0x80000000

# enum ib_uverbs_ex_write_cmds (the extended table: the command word has
# IB_USER_VERBS_CMD_FLAG_EXTENDED, the header is followed by ib_uverbs_ex_cmd_hdr)
IB_USER_VERBS_EX_CMD_QUERY_DEVICE = IB_USER_VERBS_CMD_QUERY_DEVICE
IB_USER_VERBS_EX_CMD_CREATE_CQ = IB_USER_VERBS_CMD_CREATE_CQ
IB_USER_VERBS_EX_CMD_CREATE_QP = IB_USER_VERBS_CMD_CREATE_QP
IB_USER_VERBS_EX_CMD_MODIFY_QP = IB_USER_VERBS_CMD_MODIFY_QP
IB_USER_VERBS_CMD_THRESHOLD = 50
IB_USER_VERBS_EX_CMD_CREATE_WQ = IB_USER_VERBS_CMD_THRESHOLD + 2
IB_USER_VERBS_EX_CMD_MODIFY_WQ = IB_USER_VERBS_CMD_THRESHOLD + 3
IB_USER_VERBS_EX_CMD_DESTROY_WQ = IB_USER_VERBS_CMD_THRESHOLD + 4
IB_USER_VERBS_EX_CMD_CREATE_RWQ_IND_TBL = IB_USER_VERBS_CMD_THRESHOLD + 5
IB_USER_VERBS_EX_CMD_DESTROY_RWQ_IND_TBL = IB_USER_VERBS_CMD_THRESHOLD + 6

# enum ib_uverbs_ex_create_cq_flags
IB_UVERBS_CQ_FLAGS_TIMESTAMP_COMPLETION = 1 << 0
IB_UVERBS_CQ_FLAGS_IGNORE_OVERRUN = 1 << 1

# enum ib_uverbs_gid_type (ib_uverbs_gid_entry.gid_type)
IB_UVERBS_GID_TYPE_IB, IB_UVERBS_GID_TYPE_ROCE_V1, IB_UVERBS_GID_TYPE_ROCE_V2 = 0, 1, 2

# enum ib_uverbs_access_flags
IB_UVERBS_ACCESS_LOCAL_WRITE = 1 << 0
IB_UVERBS_ACCESS_REMOTE_WRITE = 1 << 1
IB_UVERBS_ACCESS_REMOTE_READ = 1 << 2
IB_UVERBS_ACCESS_REMOTE_ATOMIC = 1 << 3
IB_UVERBS_ACCESS_MW_BIND = 1 << 4
IB_UVERBS_ACCESS_ZERO_BASED = 1 << 5
IB_UVERBS_ACCESS_ON_DEMAND = 1 << 6
IB_UVERBS_ACCESS_HUGETLB = 1 << 7
IB_UVERBS_ACCESS_FLUSH_GLOBAL = 1 << 8
IB_UVERBS_ACCESS_FLUSH_PERSISTENT = 1 << 9
IB_UVERBS_ACCESS_RELAXED_ORDERING = 1 << 20  # IB_UVERBS_ACCESS_OPTIONAL_FIRST
IB_UVERBS_ACCESS_OPTIONAL_RANGE = ((1 << 29) - 1) & ~((1 << 20) - 1)

# enum ib_uverbs_qp_type
IB_UVERBS_QPT_RC = 2
IB_UVERBS_QPT_UC = 3
IB_UVERBS_QPT_UD = 4
IB_UVERBS_QPT_RAW_PACKET = 8
IB_UVERBS_QPT_XRC_INI = 9
IB_UVERBS_QPT_XRC_TGT = 10
IB_UVERBS_QPT_DRIVER = 0xFF


@uapi_struct
class ib_uverbs_cmd_hdr(UStruct):
    FIELDS = (("command", "I"), ("in_words", "H"), ("out_words", "H"))


@uapi_struct
class ib_uverbs_get_context(UStruct):
    FIELDS = (("response", "Q"),)


@uapi_struct
class ib_uverbs_get_context_resp(UStruct):
    FIELDS = (("async_fd", "I"), ("num_comp_vectors", "I"))


@uapi_struct
class ib_uverbs_query_device(UStruct):
    FIELDS = (("response", "Q"),)


@uapi_struct
class ib_uverbs_query_device_resp(UStruct):
    FIELDS = (("fw_ver", "Q"), ("node_guid", "Q"), ("sys_image_guid", "Q"),
              ("max_mr_size", "Q"), ("page_size_cap", "Q"), ("vendor_id", "I"),
              ("vendor_part_id", "I"), ("hw_ver", "I"), ("max_qp", "I"), ("max_qp_wr", "I"),
              ("device_cap_flags", "I"), ("max_sge", "I"), ("max_sge_rd", "I"), ("max_cq", "I"),
              ("max_cqe", "I"), ("max_mr", "I"), ("max_pd", "I"), ("max_qp_rd_atom", "I"),
              ("max_ee_rd_atom", "I"), ("max_res_rd_atom", "I"), ("max_qp_init_rd_atom", "I"),
              ("max_ee_init_rd_atom", "I"), ("atomic_cap", "I"), ("max_ee", "I"),
              ("max_rdd", "I"), ("max_mw", "I"), ("max_raw_ipv6_qp", "I"),
              ("max_raw_ethy_qp", "I"), ("max_mcast_grp", "I"), ("max_mcast_qp_attach", "I"),
              ("max_total_mcast_qp_attach", "I"), ("max_ah", "I"), ("max_fmr", "I"),
              ("max_map_per_fmr", "I"), ("max_srq", "I"), ("max_srq_wr", "I"),
              ("max_srq_sge", "I"), ("max_pkeys", "H"), ("local_ca_ack_delay", "B"),
              ("phys_port_cnt", "B"), ("reserved", "4s"))


@uapi_struct
class ib_uverbs_query_port(UStruct):
    FIELDS = (("response", "Q"), ("port_num", "B"), ("reserved", "7s"))


@uapi_struct
class ib_uverbs_query_port_resp(UStruct):
    FIELDS = (("port_cap_flags", "I"), ("max_msg_sz", "I"), ("bad_pkey_cntr", "I"),
              ("qkey_viol_cntr", "I"), ("gid_tbl_len", "I"), ("pkey_tbl_len", "H"),
              ("lid", "H"), ("sm_lid", "H"), ("state", "B"), ("max_mtu", "B"),
              ("active_mtu", "B"), ("lmc", "B"), ("max_vl_num", "B"), ("sm_sl", "B"),
              ("subnet_timeout", "B"), ("init_type_reply", "B"), ("active_width", "B"),
              ("active_speed", "B"), ("phys_state", "B"), ("link_layer", "B"),
              ("flags", "B"), ("reserved", "B"))


@uapi_struct
class ib_uverbs_query_port_resp_ex(UStruct):
    """struct ib_uverbs_query_port_resp_ex (UVERBS_METHOD_QUERY_PORT's answer): the
    legacy response's fields (legacy_resp, flattened here), then port_cap_flags2 and,
    since 6.1, active_speed_ex (the speed that no longer fits the legacy u8)."""

    FIELDS = ib_uverbs_query_port_resp.FIELDS + (
        ("port_cap_flags2", "H"), ("reserved_ex", "2s"), ("active_speed_ex", "I"))


@uapi_struct
class ib_uverbs_alloc_pd(UStruct):
    FIELDS = (("response", "Q"),)


@uapi_struct
class ib_uverbs_alloc_pd_resp(UStruct):
    FIELDS = (("pd_handle", "I"),)


@uapi_struct
class ib_uverbs_dealloc_pd(UStruct):
    FIELDS = (("pd_handle", "I"),)


@uapi_struct
class ib_uverbs_reg_mr(UStruct):
    FIELDS = (("response", "Q"), ("start", "Q"), ("length", "Q"), ("hca_va", "Q"),
              ("pd_handle", "I"), ("access_flags", "I"))


@uapi_struct
class ib_uverbs_reg_mr_resp(UStruct):
    FIELDS = (("mr_handle", "I"), ("lkey", "I"), ("rkey", "I"))


@uapi_struct
class ib_uverbs_rereg_mr(UStruct):
    FIELDS = (("response", "Q"), ("mr_handle", "I"), ("flags", "I"), ("start", "Q"),
              ("length", "Q"), ("hca_va", "Q"), ("pd_handle", "I"), ("access_flags", "I"))


@uapi_struct
class ib_uverbs_rereg_mr_resp(UStruct):
    FIELDS = (("lkey", "I"), ("rkey", "I"))


@uapi_struct
class ib_uverbs_dereg_mr(UStruct):
    FIELDS = (("mr_handle", "I"),)


@uapi_struct
class ib_uverbs_alloc_mw(UStruct):
    FIELDS = (("response", "Q"), ("pd_handle", "I"), ("mw_type", "B"), ("reserved", "3s"))


@uapi_struct
class ib_uverbs_alloc_mw_resp(UStruct):
    FIELDS = (("mw_handle", "I"), ("rkey", "I"))


@uapi_struct
class ib_uverbs_dealloc_mw(UStruct):
    FIELDS = (("mw_handle", "I"),)


@uapi_struct
class ib_uverbs_create_cq(UStruct):
    FIELDS = (("response", "Q"), ("user_handle", "Q"), ("cqe", "I"), ("comp_vector", "I"),
              ("comp_channel", "i"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_create_cq_resp(UStruct):
    FIELDS = (("cq_handle", "I"), ("cqe", "I"))


@uapi_struct
class ib_uverbs_ex_create_cq(UStruct):
    """The extended CREATE_CQ request (no response pointer: ib_uverbs_ex_cmd_hdr has it)."""

    FIELDS = (("user_handle", "Q"), ("cqe", "I"), ("comp_vector", "I"), ("comp_channel", "i"),
              ("comp_mask", "I"), ("flags", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_create_cq_resp(UStruct):
    FIELDS = (("base", ib_uverbs_create_cq_resp), ("comp_mask", "I"),
              ("response_length", "I"))


@uapi_struct
class ib_uverbs_create_comp_channel(UStruct):
    FIELDS = (("response", "Q"),)


@uapi_struct
class ib_uverbs_create_comp_channel_resp(UStruct):
    FIELDS = (("fd", "I"),)


@uapi_struct
class ib_uverbs_resize_cq(UStruct):
    FIELDS = (("response", "Q"), ("cq_handle", "I"), ("cqe", "I"))


@uapi_struct
class ib_uverbs_resize_cq_resp(UStruct):
    FIELDS = (("cqe", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_comp_event_desc(UStruct):
    """What read() of a completion channel returns per event: the CQ's user_handle."""

    FIELDS = (("cq_handle", "Q"),)


@uapi_struct
class ib_uverbs_async_event_desc(UStruct):
    """What read() of the async event file returns per event: the object's
    user_handle (a port event: the port number) and the ib_event_type."""

    FIELDS = (("element", "Q"), ("event_type", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_destroy_cq(UStruct):
    FIELDS = (("response", "Q"), ("cq_handle", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_destroy_cq_resp(UStruct):
    FIELDS = (("comp_events_reported", "I"), ("async_events_reported", "I"))


@uapi_struct
class ib_uverbs_create_qp(UStruct):
    FIELDS = (("response", "Q"), ("user_handle", "Q"), ("pd_handle", "I"),
              ("send_cq_handle", "I"), ("recv_cq_handle", "I"), ("srq_handle", "I"),
              ("max_send_wr", "I"), ("max_recv_wr", "I"), ("max_send_sge", "I"),
              ("max_recv_sge", "I"), ("max_inline_data", "I"), ("sq_sig_all", "B"),
              ("qp_type", "B"), ("is_srq", "B"), ("reserved", "B"))


@uapi_struct
class ib_uverbs_create_qp_resp(UStruct):
    FIELDS = (("qp_handle", "I"), ("qpn", "I"), ("max_send_wr", "I"), ("max_recv_wr", "I"),
              ("max_send_sge", "I"), ("max_recv_sge", "I"), ("max_inline_data", "I"),
              ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_create_qp(UStruct):
    """The extended CREATE_QP request (no response pointer: ib_uverbs_ex_cmd_hdr has it)."""

    FIELDS = (("user_handle", "Q"), ("pd_handle", "I"), ("send_cq_handle", "I"),
              ("recv_cq_handle", "I"), ("srq_handle", "I"), ("max_send_wr", "I"),
              ("max_recv_wr", "I"), ("max_send_sge", "I"), ("max_recv_sge", "I"),
              ("max_inline_data", "I"), ("sq_sig_all", "B"), ("qp_type", "B"),
              ("is_srq", "B"), ("reserved", "B"), ("comp_mask", "I"), ("create_flags", "I"),
              ("rwq_ind_tbl_handle", "I"), ("source_qpn", "I"))


@uapi_struct
class ib_uverbs_ex_create_qp_resp(UStruct):
    FIELDS = (("base", ib_uverbs_create_qp_resp), ("comp_mask", "I"),
              ("response_length", "I"))


#: enum ib_uverbs_create_qp_mask
IB_UVERBS_CREATE_QP_MASK_IND_TABLE = 1 << 0
IB_UVERBS_CREATE_QP_SUP_COMP_MASK = IB_UVERBS_CREATE_QP_MASK_IND_TABLE


@uapi_struct
class ib_uverbs_destroy_qp(UStruct):
    FIELDS = (("response", "Q"), ("qp_handle", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_destroy_qp_resp(UStruct):
    FIELDS = (("events_reported", "I"),)


# -- SRQ (enum ib_srq_type, enum ib_srq_attr_mask) ---------------------------------
IB_UVERBS_SRQT_BASIC, IB_UVERBS_SRQT_XRC, IB_UVERBS_SRQT_TM = 0, 1, 2
IB_SRQ_MAX_WR, IB_SRQ_LIMIT = 1 << 0, 1 << 1


@uapi_struct
class ib_uverbs_create_srq(UStruct):
    FIELDS = (("response", "Q"), ("user_handle", "Q"), ("pd_handle", "I"), ("max_wr", "I"),
              ("max_sge", "I"), ("srq_limit", "I"))


@uapi_struct
class ib_uverbs_create_xsrq(UStruct):
    FIELDS = (("response", "Q"), ("user_handle", "Q"), ("srq_type", "I"), ("pd_handle", "I"),
              ("max_wr", "I"), ("max_sge", "I"), ("srq_limit", "I"), ("max_num_tags", "I"),
              ("xrcd_handle", "I"), ("cq_handle", "I"))


@uapi_struct
class ib_uverbs_create_srq_resp(UStruct):
    FIELDS = (("srq_handle", "I"), ("max_wr", "I"), ("max_sge", "I"), ("srqn", "I"))


@uapi_struct
class ib_uverbs_modify_srq(UStruct):
    FIELDS = (("srq_handle", "I"), ("attr_mask", "I"), ("max_wr", "I"), ("srq_limit", "I"))


@uapi_struct
class ib_uverbs_query_srq(UStruct):
    FIELDS = (("response", "Q"), ("srq_handle", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_query_srq_resp(UStruct):
    FIELDS = (("max_wr", "I"), ("max_sge", "I"), ("srq_limit", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_destroy_srq(UStruct):
    FIELDS = (("response", "Q"), ("srq_handle", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_destroy_srq_resp(UStruct):
    FIELDS = (("events_reported", "I"),)


# -- work queues and RSS indirection tables (the extended commands) ------------------------
@uapi_struct
class ib_uverbs_ex_create_wq(UStruct):
    FIELDS = (("comp_mask", "I"), ("wq_type", "I"), ("user_handle", "Q"), ("pd_handle", "I"),
              ("cq_handle", "I"), ("max_wr", "I"), ("max_sge", "I"), ("create_flags", "I"),
              ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_create_wq_resp(UStruct):
    FIELDS = (("comp_mask", "I"), ("response_length", "I"), ("wq_handle", "I"),
              ("max_wr", "I"), ("max_sge", "I"), ("wqn", "I"))


@uapi_struct
class ib_uverbs_ex_destroy_wq(UStruct):
    FIELDS = (("comp_mask", "I"), ("wq_handle", "I"))


@uapi_struct
class ib_uverbs_ex_destroy_wq_resp(UStruct):
    FIELDS = (("comp_mask", "I"), ("response_length", "I"), ("events_reported", "I"),
              ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_modify_wq(UStruct):
    FIELDS = (("attr_mask", "I"), ("wq_handle", "I"), ("wq_state", "I"),
              ("curr_wq_state", "I"), ("flags", "I"), ("flags_mask", "I"))


@uapi_struct
class ib_uverbs_ex_create_rwq_ind_table(UStruct):
    """The fixed part; the u32 wq_handles[1 << log_ind_tbl_size] follow it."""

    FIELDS = (("comp_mask", "I"), ("log_ind_tbl_size", "I"))


@uapi_struct
class ib_uverbs_ex_create_rwq_ind_table_resp(UStruct):
    FIELDS = (("comp_mask", "I"), ("response_length", "I"), ("ind_tbl_handle", "I"),
              ("ind_tbl_num", "I"))


@uapi_struct
class ib_uverbs_ex_destroy_rwq_ind_table(UStruct):
    FIELDS = (("comp_mask", "I"), ("ind_tbl_handle", "I"))


# enum ib_uverbs_wq_type; the largest indirection table (log2) a request may ask for
IB_UVERBS_WQT_RQ = 0
IB_USER_VERBS_MAX_LOG_IND_TBL_SIZE = 0x0000000d


# -- XRC domains ----------------------------------------------------------------------
@uapi_struct
class ib_uverbs_open_xrcd(UStruct):
    FIELDS = (("response", "Q"), ("fd", "I"), ("oflags", "I"))


@uapi_struct
class ib_uverbs_open_xrcd_resp(UStruct):
    FIELDS = (("xrcd_handle", "I"),)


@uapi_struct
class ib_uverbs_close_xrcd(UStruct):
    FIELDS = (("xrcd_handle", "I"),)



@uapi_struct
class ib_uverbs_global_route(UStruct):
    FIELDS = (("dgid", "16s"), ("flow_label", "I"), ("sgid_index", "B"), ("hop_limit", "B"),
              ("traffic_class", "B"), ("reserved", "B"))


@uapi_struct
class ib_uverbs_ah_attr(UStruct):
    FIELDS = (("grh", ib_uverbs_global_route), ("dlid", "H"), ("sl", "B"),
              ("src_path_bits", "B"), ("static_rate", "B"), ("is_global", "B"),
              ("port_num", "B"), ("reserved", "B"))


@uapi_struct
class ib_uverbs_create_ah(UStruct):
    FIELDS = (("response", "Q"), ("user_handle", "Q"), ("pd_handle", "I"), ("reserved", "I"),
              ("attr", ib_uverbs_ah_attr))


@uapi_struct
class ib_uverbs_create_ah_resp(UStruct):
    FIELDS = (("ah_handle", "I"),)


@uapi_struct
class ib_uverbs_destroy_ah(UStruct):
    FIELDS = (("ah_handle", "I"),)


@uapi_struct
class ib_uverbs_qp_dest(UStruct):
    """An address vector of MODIFY_QP and QUERY_QP (the primary or alternate path)."""

    FIELDS = (("dgid", "16s"), ("flow_label", "I"), ("dlid", "H"), ("reserved", "H"),
              ("sgid_index", "B"), ("hop_limit", "B"), ("traffic_class", "B"), ("sl", "B"),
              ("src_path_bits", "B"), ("static_rate", "B"), ("is_global", "B"),
              ("port_num", "B"))


@uapi_struct
class ib_uverbs_modify_qp(UStruct):
    """MODIFY_QP: no response; the attributes attr_mask names (the rest are ignored)."""

    FIELDS = (("dest", ib_uverbs_qp_dest), ("alt_dest", ib_uverbs_qp_dest), ("qp_handle", "I"),
              ("attr_mask", "I"), ("qkey", "I"), ("rq_psn", "I"), ("sq_psn", "I"),
              ("dest_qp_num", "I"), ("qp_access_flags", "I"), ("pkey_index", "H"),
              ("alt_pkey_index", "H"), ("qp_state", "B"), ("cur_qp_state", "B"),
              ("path_mtu", "B"), ("path_mig_state", "B"), ("en_sqd_async_notify", "B"),
              ("max_rd_atomic", "B"), ("max_dest_rd_atomic", "B"), ("min_rnr_timer", "B"),
              ("port_num", "B"), ("timeout", "B"), ("retry_cnt", "B"), ("rnr_retry", "B"),
              ("alt_port_num", "B"), ("alt_timeout", "B"), ("reserved", "2s"))


@uapi_struct
class ib_uverbs_ex_modify_qp(UStruct):
    """The extended MODIFY_QP: the legacy request, then the rate limit."""

    FIELDS = (("base", ib_uverbs_modify_qp), ("rate_limit", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_modify_qp_resp(UStruct):
    FIELDS = (("comp_mask", "I"), ("response_length", "I"))


@uapi_struct
class ib_uverbs_query_qp(UStruct):
    FIELDS = (("response", "Q"), ("qp_handle", "I"), ("attr_mask", "I"))


@uapi_struct
class ib_uverbs_query_qp_resp(UStruct):
    FIELDS = (("dest", ib_uverbs_qp_dest), ("alt_dest", ib_uverbs_qp_dest),
              ("max_send_wr", "I"), ("max_recv_wr", "I"), ("max_send_sge", "I"),
              ("max_recv_sge", "I"), ("max_inline_data", "I"), ("qkey", "I"), ("rq_psn", "I"),
              ("sq_psn", "I"), ("dest_qp_num", "I"), ("qp_access_flags", "I"),
              ("pkey_index", "H"), ("alt_pkey_index", "H"), ("qp_state", "B"),
              ("cur_qp_state", "B"), ("path_mtu", "B"), ("path_mig_state", "B"),
              ("sq_draining", "B"), ("max_rd_atomic", "B"), ("max_dest_rd_atomic", "B"),
              ("min_rnr_timer", "B"), ("port_num", "B"), ("timeout", "B"), ("retry_cnt", "B"),
              ("rnr_retry", "B"), ("alt_port_num", "B"), ("alt_timeout", "B"),
              ("sq_sig_all", "B"), ("reserved", "5s"))


# -- the extended commands (write_ex) and the GID entry of the QUERY_GID ioctls ---------
@uapi_struct
class ib_uverbs_ex_cmd_hdr(UStruct):
    """After ib_uverbs_cmd_hdr in an extended command; its sizes count 8-byte words."""

    FIELDS = (("response", "Q"), ("provider_in_words", "H"), ("provider_out_words", "H"),
              ("cmd_hdr_reserved", "I"))


@uapi_struct
class ib_uverbs_ex_query_device(UStruct):
    FIELDS = (("comp_mask", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_odp_caps(UStruct):
    FIELDS = (("general_caps", "Q"), ("rc_odp_caps", "I"), ("uc_odp_caps", "I"),
              ("ud_odp_caps", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_rss_caps(UStruct):
    FIELDS = (("supported_qpts", "I"), ("max_rwq_indirection_tables", "I"),
              ("max_rwq_indirection_table_size", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_tm_caps(UStruct):
    FIELDS = (("max_rndv_hdr_size", "I"), ("max_num_tags", "I"), ("flags", "I"),
              ("max_ops", "I"), ("max_sge", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_cq_moderation_caps(UStruct):
    FIELDS = (("max_cq_moderation_count", "H"), ("max_cq_moderation_period", "H"),
              ("reserved", "I"))


@uapi_struct
class ib_uverbs_ex_query_device_resp(UStruct):
    """The legacy response as `base`, then the extended capabilities (304 bytes)."""

    FIELDS = (("base", ib_uverbs_query_device_resp), ("comp_mask", "I"),
              ("response_length", "I"), ("odp_caps", ib_uverbs_odp_caps),
              ("timestamp_mask", "Q"), ("hca_core_clock", "Q"), ("device_cap_flags_ex", "Q"),
              ("rss_caps", ib_uverbs_rss_caps), ("max_wq_type_rq", "I"),
              ("raw_packet_caps", "I"), ("tm_caps", ib_uverbs_tm_caps),
              ("cq_moderation_caps", ib_uverbs_cq_moderation_caps), ("max_dm_size", "Q"),
              ("xrc_odp_caps", "I"), ("reserved", "I"))


@uapi_struct
class ib_uverbs_gid_entry(UStruct):
    """One GID of UVERBS_METHOD_QUERY_GID_TABLE / _ENTRY (gid: its 16 raw bytes)."""

    FIELDS = (("gid", "16s"), ("gid_index", "I"), ("port_num", "I"), ("gid_type", "I"),
              ("netdev_ifindex", "I"))
