"""A pyverbs-compatible face of the emulated stack.

rdma-core's Python bindings, pyverbs, with the same module names (pyverbs.device,
.pd, .mr, .cq, .qp, .wr, .addr, .enums, .pyverbs_error, .providers.mlx5 ...),
constructors, attributes, return shapes, exceptions and messages, built on the
project's libibverbs and libmlx5: every verb is a system call of the emulated
process that stands for this Python process (userspace.pyverbs.host).

It is importable as `userspace.pyverbs`.  To run an unmodified pyverbs program
against the emulator, map the name `pyverbs` to it deliberately - it never shadows
rdma-core's compiled bindings on its own:

    from userspace.pyverbs.alias import install
    install()              # from here on, `import pyverbs.device` is this package

or run `peermem rdma-core-tests`, or `pytest -p peermem_testing.pyverbs_plugin`.
docs/pyverbs.md says which verbs are emulated.
"""
