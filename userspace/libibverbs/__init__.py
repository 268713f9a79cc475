"""libibverbs: rdma-core's verbs library, over the uverbs device file.

`verbs` is the C-like API (ibv_open_device, ibv_alloc_pd, ...), `cmd` the
command layer that turns each call into a write() on /dev/infiniband/uverbsN,
`device` finds devices through sysfs, and `pyverbs` is a Python object face
(Context, PD, MR, CQ, QP) in the style of rdma-core's pyverbs.
"""
