"""A CUDA-like runtime over the emulated NVIDIA driver (see runtime.py)."""
