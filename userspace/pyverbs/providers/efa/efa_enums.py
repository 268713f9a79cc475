"""The EFA provider's constants (infiniband/efadv.h), with the names and values pyverbs exposes.

Generated once from the enum names and values of rdma-core v44's pyverbs (numbers are
facts of the ABI); every member is also a module-level name, as in pyverbs, so both
`e.IBV_QPT_RC` and `e.ibv_qp_type.IBV_QPT_RC` work.
"""


EFADV_DEVICE_ATTR_CAPS_CQ_WITH_SGID = 4
EFADV_DEVICE_ATTR_CAPS_RDMA_READ = 1
EFADV_QP_DRIVER_TYPE_SRD = 0
EFADV_WC_EX_WITH_SGID = 1
