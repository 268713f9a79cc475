"""userspace/pyverbs: DM (ibv_alloc_dm over the ConnectX's MEMIC) and DMMR - the bytes
through the mapping, libmlx5's errnos, pyverbs' messages, the firmware's MEMIC
allocations (freed at close: a MEMIC left allocated would be a leak)."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.mr import DMMR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError


def memics() -> dict:
    return host.host().machine.hcas[0].fw.memics


@pytest.fixture
def ctx():
    c = d.Context(name="mlx5_0")
    yield c
    c.close()


def test_max_dm_size_is_the_memic_size(ctx):
    assert ctx.query_device_ex().max_dm_size == 256 << 10


def test_dm_bytes_round_trip_and_memic_freed_at_close(ctx):
    dm = d.DM(ctx, d.AllocDmAttr(100, 0, 0))
    (memic,) = memics().values()
    assert memic.size == 128                     # rounded up to 64 bytes
    dm.copy_to_dm(8, b"abcdefgh", 8)
    assert dm.copy_from_dm(8, 8) == b"abcdefgh"
    dm.close()
    dm.close()                                   # a second close does nothing
    assert memics() == {}


@pytest.mark.parametrize("offset,length,err", [(1, 4, errno.EINVAL), (4, 3, errno.EINVAL),
                                               (100, 4, errno.EFAULT), (0, 104, errno.EFAULT)])
def test_dm_copy_errors(ctx, offset, length, err):
    with d.DM(ctx, d.AllocDmAttr(100)) as dm:
        with pytest.raises(PyverbsRDMAError, match="Failed to copy to dm") as ex:
            dm.copy_to_dm(offset, b"x" * length, length)
        assert ex.value.error_code == err
        with pytest.raises(PyverbsRDMAError, match="Failed to copy from dm") as ex:
            dm.copy_from_dm(offset, length)
        assert ex.value.error_code == err


def test_dm_too_big_or_bad_comp_mask(ctx):
    with pytest.raises(PyverbsRDMAError, match=r"size 262145\. Max available size 262144\.") \
            as ex:
        d.DM(ctx, d.AllocDmAttr((256 << 10) + 1))
    assert ex.value.error_code == errno.EINVAL
    with pytest.raises(PyverbsRDMAError, match="Failed to allocate device memory") as ex:
        d.DM(ctx, d.AllocDmAttr(64, 0, 1))
    assert ex.value.error_code == errno.EINVAL
    assert memics() == {}


def test_memic_full_is_refused_and_reused_after_free(ctx):
    dms = [d.DM(ctx, d.AllocDmAttr(128 << 10)) for _ in range(2)]
    with pytest.raises(PyverbsRDMAError, match="Failed to allocate device memory"):
        d.DM(ctx, d.AllocDmAttr(4096))          # the kernel's ENOMEM, reported as EINVAL
    dms[0].close()
    with d.DM(ctx, d.AllocDmAttr(4096)):
        assert len(memics()) == 2
    dms[1].close()


def test_dmmr_needs_zero_based_and_fits_the_dm(ctx):
    pd = PD(ctx)
    with d.DM(ctx, d.AllocDmAttr(100)) as dm:
        acc = e.IBV_ACCESS_ZERO_BASED | e.IBV_ACCESS_LOCAL_WRITE
        with pytest.raises(PyverbsRDMAError, match="Failed to register a device MR") as ex:
            DMMR(pd, 104, acc, dm, 0)
        assert ex.value.error_code == errno.EINVAL
        with pytest.raises(PyverbsRDMAError, match="Failed to register a device MR") as ex:
            DMMR(pd, 100, e.IBV_ACCESS_LOCAL_WRITE, dm, 0)
        assert ex.value.error_code == errno.EINVAL
        mr = DMMR(pd, 100, acc, dm, 0)
        assert mr.buf == 0 and mr.lkey
        mr.write("wxyz", 4, 8)
        assert mr.read(4, 8) == b"wxyz"
    # closing the DM closed its MR first
    assert memics() == {}
