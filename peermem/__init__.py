"""The front door: the `peermem` command, above everything it drives.

`peermem` is the emulator's command line, not a program that runs inside the emulated
machine: it boots machines (kernel_model.emu), runs the programs a process runs inside
them (userspace/tools: devinfo, write_bw, gup_test), the stories in scenarios/ and the
campaigns in peermem_testing/.  `python -m peermem` is the same command.
"""
