"""A HIP-like runtime over /dev/kfd (userspace/hip/runtime.py)."""
