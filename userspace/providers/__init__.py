"""rdma-core's providers/: the vendor halves of libibverbs (the mlx5 provider)."""
