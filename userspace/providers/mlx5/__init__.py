"""Mirrors rdma-core providers/mlx5: the userspace driver of ConnectX HCAs (libmlx5).

Only the pure-logic parts live here so far, each in the module named after the
rdma-core file (or function group) it mirrors:

    env.py     mlx5.c   - the MLX5_* environment knobs and need_uuar_lock
    uar.py     mlx5.c / verbs.c - mmap offsets, the legacy bfs[] table, the
               dynamic (per-QP) UAR allocator
    wqsize.py  verbs.c  - send/receive queue sizing (mlx5_calc_*)
    dbrec.py   dbrec.c  - the doorbell-record page allocator
    mlx5dv.py  mlx5dv.h / mlx5.h / mlx5-abi.h - shared constants
    errors.py  ProviderError, the provider's errno-carrying failure

None of them does I/O: whatever needs memory or the kernel (an mmap, a UAR
object ioctl, a page for doorbell records) is a callable the caller injects.
rdma-core's pthread mutexes (dyn_bfregs_mutex, dbr_map_mutex) have no twin:
the provider runs in one emulated user thread per context here.
"""
