"""Mirrors include/uapi/rdma/ib_user_ioctl_cmds.h: the core's ioctl object, method and
attribute ids (the part the model answers: the DEVICE object's GID queries).

UVERBS_OBJECT_DEVICE has no instances; its methods are "global" - they act on the
device behind the uverbs file.  Ids are positions in the header's enums.
"""

from __future__ import annotations

# enum uverbs_default_objects
UVERBS_OBJECT_DEVICE = 0

# enum uverbs_methods_device
(UVERBS_METHOD_INVOKE_WRITE, UVERBS_METHOD_INFO_HANDLES, UVERBS_METHOD_QUERY_PORT,
 UVERBS_METHOD_GET_CONTEXT, UVERBS_METHOD_QUERY_CONTEXT, UVERBS_METHOD_QUERY_GID_TABLE,
 UVERBS_METHOD_QUERY_GID_ENTRY) = range(7)

# enum uverbs_attrs_query_port_cmd_attr_ids
UVERBS_ATTR_QUERY_PORT_PORT_NUM, UVERBS_ATTR_QUERY_PORT_RESP = range(2)

# enum uverbs_attrs_query_gid_table_cmd_attr_ids
(UVERBS_ATTR_QUERY_GID_TABLE_ENTRY_SIZE, UVERBS_ATTR_QUERY_GID_TABLE_FLAGS,
 UVERBS_ATTR_QUERY_GID_TABLE_RESP_ENTRIES,
 UVERBS_ATTR_QUERY_GID_TABLE_RESP_NUM_ENTRIES) = range(4)

# enum uverbs_attrs_query_gid_entry_cmd_attr_ids
(UVERBS_ATTR_QUERY_GID_ENTRY_PORT, UVERBS_ATTR_QUERY_GID_ENTRY_GID_INDEX,
 UVERBS_ATTR_QUERY_GID_ENTRY_FLAGS, UVERBS_ATTR_QUERY_GID_ENTRY_RESP_ENTRY) = range(4)

# device memory (ibv_alloc_dm, ibv_reg_dm_mr): enum uverbs_default_objects
UVERBS_OBJECT_MR = 7
UVERBS_OBJECT_DM = 14
# enum uverbs_methods_dm
UVERBS_METHOD_DM_ALLOC, UVERBS_METHOD_DM_FREE = range(2)
# enum uverbs_attrs_alloc_dm_cmd_attr_ids / uverbs_attrs_free_dm_cmd_attr_ids
UVERBS_ATTR_ALLOC_DM_HANDLE, UVERBS_ATTR_ALLOC_DM_LENGTH, UVERBS_ATTR_ALLOC_DM_ALIGNMENT = range(3)
UVERBS_ATTR_FREE_DM_HANDLE = 0
# enum uverbs_methods_mr (UVERBS_METHOD_REG_DMABUF_MR is 4)
UVERBS_METHOD_DM_MR_REG = 0
# enum uverbs_attrs_reg_dm_mr_cmd_attr_ids
(UVERBS_ATTR_REG_DM_MR_HANDLE, UVERBS_ATTR_REG_DM_MR_OFFSET, UVERBS_ATTR_REG_DM_MR_LENGTH,
 UVERBS_ATTR_REG_DM_MR_PD_HANDLE, UVERBS_ATTR_REG_DM_MR_ACCESS_FLAGS,
 UVERBS_ATTR_REG_DM_MR_DM_HANDLE, UVERBS_ATTR_REG_DM_MR_RESP_LKEY,
 UVERBS_ATTR_REG_DM_MR_RESP_RKEY) = range(8)

# sharing objects between contexts (ibv_import_device / _pd / _mr)
# enum uverbs_attrs_query_context_attr_ids
UVERBS_ATTR_QUERY_CONTEXT_NUM_COMP_VECTORS, UVERBS_ATTR_QUERY_CONTEXT_CORE_SUPPORT = range(2)
IB_UVERBS_CORE_SUPPORT_OPTIONAL_MR_ACCESS = 1 << 0
UVERBS_OBJECT_PD = 1
UVERBS_OBJECT_ASYNC_EVENT = 16
UVERBS_METHOD_ASYNC_EVENT_ALLOC = 0                 # enum uverbs_method_async_event
UVERBS_ATTR_ASYNC_EVENT_ALLOC_FD_HANDLE = 0         # enum uverbs_attrs_async_event_create
UVERBS_METHOD_QUERY_MR = 3                          # enum uverbs_methods_mr
# enum uverbs_attrs_query_mr_cmd_attr_ids
(UVERBS_ATTR_QUERY_MR_HANDLE, UVERBS_ATTR_QUERY_MR_RESP_LKEY, UVERBS_ATTR_QUERY_MR_RESP_RKEY,
 UVERBS_ATTR_QUERY_MR_RESP_LENGTH, UVERBS_ATTR_QUERY_MR_RESP_IOVA) = range(5)
