"""include/uapi: the structs and numbers the kernel and userspace share.

Both sides import these (drivers for the kernel half, userspace/ for the
library half), as both compile against the same uapi headers.
"""
