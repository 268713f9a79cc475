"""Mirrors mm/gup_test.h: struct gup_test and the gup_test ioctl numbers."""

import struct

from kernel_model.uapi.ioctl import _IOWR

GUP_TEST_PATH = "/sys/kernel/debug/gup_test"
GUP_TEST_MAX_PAGES_TO_DUMP = 8
# get_delta_usec, put_delta_usec, addr, size (u64); nr_pages_per_call,
# gup_flags, test_flags (u32); which_pages[8] (u32); 4 bytes of tail padding
GUP_TEST_FMT = "<QQQQIII8I4x"
GUP_TEST_SIZE = struct.calcsize(GUP_TEST_FMT)
PIN_FAST_BENCHMARK = _IOWR("g", 2, GUP_TEST_SIZE)
PIN_LONGTERM_BENCHMARK = _IOWR("g", 3, GUP_TEST_SIZE)
