"""A libfabric-style memory-registration layer (fi_mr(3)) over the emulated verbs.

Communication libraries register memory through a layer like this one; it is
where the kernel's invalidation meets an application's cache.  `fi_mr.py`
holds the domain and the fi_mr calls, `fi_errno.py` the fabric errno values.
"""
