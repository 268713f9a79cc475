"""kernel_model.hw: the emulated silicon - device models, not kernel code.

What lives here is what a real machine has in hardware and firmware: the
ConnectX HCA (mlx5.py: its PCI function, BAR decoding, UAR pages; mlx5_fw*.py:
the firmware that executes commands and keeps QP/CQ/mkey contexts) and the
interface both sides of the PCI bus agree on (mlx5_ifc.py, the PRM).

Names here are emulator-level (CapWords) except where a structure is the
hardware's own (mlx5_cmd_layout, the ifc field names).  Kernel code never
holds a device-model object: a driver reaches a device only through MMIO
(machine.phys_read/phys_write on its BARs) and what the device DMAs.
"""
