"""The test bench: the emulator's own machinery, not code the kernel has.

Machine (RAM, mem_map, the physical address map, boot and shutdown), Process (a user
process and its system calls), platform (which devices a machine is built with),
explore (a program run under many schedules), the leak check, and the tracer's reading
side (ftrace/Perfetto/Mermaid output and filters, as trace-cmd reads what the kernel's
tracer recorded).  It sits above the kernel's primitives (kernel_model/) and the emulated
silicon (kernel_model/hw/); neither imports it.
"""
