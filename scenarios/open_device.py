"""The `open-device` scenario: ibv_open_device and ibv_close_device on an mlx5 HCA.

A host with one ConnectX HCA boots: mlx5_core probes the PCI function and
brings the firmware up, mlx5_ib registers the RDMA device mlx5_0 (on
swapper-0, as modprobe would at boot).  Then a process ("app") does what
every verbs program does first:

  ibv_get_device_list   sysfs: /sys/class/infiniband_verbs/uverbs0 -> mlx5_0
  ibv_open_device       open /dev/infiniband/uverbs0; libmlx5's
                        mlx5_alloc_context sends GET_CONTEXT, which the kernel
                        runs as mlx5_ib_alloc_ucontext -> calc_total_bfregs ->
                        allocate_uars (one ALLOC_UAR firmware command per
                        static UAR page); back in the library, mlx5_set_context
                        mmaps the 8 UAR pages (mlx5_ib_mmap -> uar_mmap)
  ibv_close_device      munmap the UARs, close the file: the kernel destroys
                        the ucontext (mlx5_ib_dealloc_ucontext, DEALLOC_UAR x8)

The process exits and the machine must pass the leak check.
"""

from __future__ import annotations

from kernel_model.emu.platform import rdma_host
from kernel_model.trace import traced
from scenarios import scenario
from userspace.libibverbs.verbs import ibv_close_device, ibv_get_device_list, ibv_open_device


@traced(layer="userspace")
def open_and_close(proc) -> int:
    """The user program: find the device, open it, close it; the UAR pages it had mapped."""
    devs = ibv_get_device_list(proc)
    ctx = ibv_open_device(proc, devs[0])
    mapped = len(ctx.uar)
    ibv_close_device(ctx)
    return mapped


@scenario("open-device", "a process opens the mlx5 device (GET_CONTEXT, alloc_ucontext, "
          "8 UARs allocated and mmapped) and closes it")
def open_device() -> None:
    m = rdma_host(name="host0")
    m.load_module("mlx5_ib")
    p = m.spawn("app")
    mapped = p.run(open_and_close, p)
    assert mapped == 8, mapped
    p.exit(0)
    m.check_leaks()
