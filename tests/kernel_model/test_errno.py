"""Tests for kernel_model/errno.py: errno values and KernelError's contract."""

from __future__ import annotations

import errno as host_errno
import sys

import pytest

from kernel_model import errno as kerrno
from kernel_model.errno import EFAULT, EINVAL, ENOTSUPP, KernelError, errorcode


def test_message_must_name_the_function():
    with pytest.raises(ValueError, match="must start with 'function: '"):
        KernelError(EINVAL, "no function here")
    with pytest.raises(ValueError):
        KernelError(EINVAL, ": empty name")
    with pytest.raises(ValueError):
        KernelError(EINVAL, "two words: no")
    KernelError(EINVAL, "mlx5_ib.alloc_ucontext: dotted names are fine")


def test_unknown_errno_is_refused():
    with pytest.raises(ValueError, match="unknown errno 9999"):
        KernelError(9999, "f: x")


def test_str_shows_the_negative_symbolic_errno():
    e = KernelError(EINVAL, "do_mmap: length is 0")
    assert str(e) == "do_mmap: length is 0 (-EINVAL)"
    assert (e.errno, e.name, e.function, e.message) == (
        22, "EINVAL", "do_mmap", "do_mmap: length is 0")
    assert e.args == (EINVAL, "do_mmap: length is 0")
    assert str(KernelError(EFAULT, "f: x")).endswith("(-EFAULT)")


def test_errorcode_is_the_inverse_table():
    assert errorcode[EINVAL] == "EINVAL" and errorcode[ENOTSUPP] == "ENOTSUPP"
    for code, name in errorcode.items():
        assert getattr(kerrno, name) == code


@pytest.mark.skipif(sys.platform != "linux", reason="compares with Linux's errno values")
def test_values_match_linux():
    for code, name in errorcode.items():
        if name == "ENOTSUPP":  # kernel-internal: userspace has only EOPNOTSUPP (95)
            assert code == 524
            continue
        assert getattr(host_errno, name) == code, name
