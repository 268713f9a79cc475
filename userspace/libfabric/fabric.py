"""The constants of rdma/fabric.h and rdma/fi_domain.h the fi_mr layer uses (values as
libfabric defines them), shared by fi_mr.py and mr_cache.py."""

from __future__ import annotations

# -- rdma/fabric.h ---------------------------------------------------------------------------
FI_READ = 1 << 8
FI_WRITE = 1 << 9
FI_RECV = 1 << 10
FI_SEND = 1 << 11
FI_REMOTE_READ = 1 << 12
FI_REMOTE_WRITE = 1 << 13
FI_ACCESS_ALL = FI_READ | FI_WRITE | FI_RECV | FI_SEND | FI_REMOTE_READ | FI_REMOTE_WRITE
FI_HMEM = 1 << 47               # capability: device memory
FI_RMA_EVENT = 1 << 56          # registration flag
FI_KEY_NOTAVAIL = (1 << 64) - 1

FI_MR_UNSPEC, FI_MR_BASIC, FI_MR_SCALABLE = 0, 1, 2
FI_MR_LOCAL = 1 << 2
FI_MR_RAW = 1 << 3
FI_MR_VIRT_ADDR = 1 << 4
FI_MR_ALLOCATED = 1 << 5
FI_MR_PROV_KEY = 1 << 6
FI_MR_MMU_NOTIFY = 1 << 7
FI_MR_RMA_EVENT = 1 << 8
FI_MR_ENDPOINT = 1 << 9
FI_MR_HMEM = 1 << 10

FI_CLASS_DOMAIN, FI_CLASS_EP, FI_CLASS_MR, FI_CLASS_CNTR = 2, 3, 12, 15

# -- rdma/fi_domain.h -----------------------------------------------------------------------
FI_MR_DMABUF = 1 << 40
FI_HMEM_SYSTEM, FI_HMEM_CUDA, FI_HMEM_ROCR, FI_HMEM_ZE = 0, 1, 2, 3

MR_KEY_SIZE = 4                 # domain_attr.mr_key_size: the rkey's 32 bits
MR_IOV_LIMIT = 1                # domain_attr.mr_iov_limit: one ibv_mr per fid_mr
RAW_KEY_FMT = "<I"              # the raw key: the rkey, little-endian


