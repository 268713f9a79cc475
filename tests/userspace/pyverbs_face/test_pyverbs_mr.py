"""userspace/pyverbs: MR.rereg - what it changes on the Python object (keys, buffer,
length, the PD that owns it), its errors as pyverbs words them, rereg_error_to_str - and
MW (memory windows): properties, lifetime under the PD, errors."""

from __future__ import annotations

import errno

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host, mem_alloc
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR, MW, MWBind, MWBindInfo
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError, PyverbsUserError
from userspace.pyverbs.qp import QP, QPInitAttr
from userspace.pyverbs.utils import rereg_error_to_str
from userspace.pyverbs.wr import SendWR

LW, RW = e.IBV_ACCESS_LOCAL_WRITE, e.IBV_ACCESS_REMOTE_WRITE


def mkeys() -> dict:
    return host.host().machine.hcas[0].fw.mkeys


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    yield ctx, pd
    ctx.close()


@pytest.mark.parametrize("code,name", [
    (e.IBV_REREG_MR_ERR_INPUT, "IBV_REREG_MR_ERR_INPUT"),
    (e.IBV_REREG_MR_ERR_DONT_FORK_NEW, "IBV_REREG_MR_ERR_DONT_FORK_NEW"),
    (e.IBV_REREG_MR_ERR_DO_FORK_OLD, "IBV_REREG_MR_ERR_DO_FORK_OLD"),
    (e.IBV_REREG_MR_ERR_CMD, "IBV_REREG_MR_ERR_CMD"),
    (e.IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW, "IBV_REREG_MR_ERR_CMD_AND_DO_FORK_NEW"),
    (-9, "Unknown error (-9)")])
def test_rereg_error_to_str_names_the_code(code, name):
    assert rereg_error_to_str(code) == name


def test_an_access_change_keeps_the_keys_and_the_buffer(res):
    ctx, pd = res
    mr = MR(pd, 4096, LW)
    keys, buf = (mr.lkey, mr.rkey), mr.buf
    mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, access=LW | RW)
    assert (mr.lkey, mr.rkey, mr.buf, mr.length) == (*keys, buf, 4096)
    assert mkeys()[mr.lkey >> 8].mkc["rw"] == 1
    mr.write(b"still mine", 10)
    assert mr.read(10, 0) == b"still mine"


def test_a_translation_change_moves_the_buffer_and_the_keys(res):
    ctx, pd = res
    mr = MR(pd, 4096, LW)
    old_lkey = mr.lkey
    addr = mem_alloc.posix_memalign(8192)
    mr.rereg(e.IBV_REREG_MR_CHANGE_TRANSLATION, addr=addr, length=8192)
    assert (mr.buf, mr.length) == (addr, 8192) and mr.lkey != old_lkey
    assert old_lkey >> 8 not in mkeys()
    mr.write(b"x" * 8192, 8192)
    assert mr.read(3, 8189) == b"xxx"
    mr.close()                              # the caller's memory is not the MR's to free
    mem_alloc.free(addr)


def test_a_pd_change_moves_the_mr_under_the_new_pd(res):
    ctx, pd = res
    pd2 = PD(ctx)
    mr = MR(pd, 4096, LW)
    mr.rereg(e.IBV_REREG_MR_CHANGE_PD, pd=pd2)
    assert mr.pd is pd2
    pd.close()                              # no longer the MR's parent: the MR lives on
    assert mr.lkey >> 8 in mkeys()
    pd2.close()                             # closes the MR first
    assert not mkeys()
    with pytest.raises(PyverbsUserError):
        mr.write(b"a", 1)


def test_errors_as_pyverbs_words_them(res):
    ctx, pd = res
    mr = MR(pd, 4096, LW)
    with pytest.raises(PyverbsRDMAError) as ei:
        mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, access=RW)          # remote write, no local
    assert ei.value.error_code == errno.EINVAL
    assert str(ei.value).startswith("Failed to rereg MR: IBV_REREG_MR_ERR_CMD. Errno: 22")
    with pytest.raises(PyverbsRDMAError) as ei:
        mr.rereg(e.IBV_REREG_MR_CHANGE_TRANSLATION)                 # no address, no length
    assert ei.value.error_code == errno.EINVAL
    assert "IBV_REREG_MR_ERR_INPUT" in str(ei.value)
    with pytest.raises(PyverbsRDMAError) as ei:
        mr.rereg(e.IBV_REREG_MR_CHANGE_ACCESS, access=LW | e.IBV_ACCESS_ON_DEMAND)
    assert ei.value.error_code == errno.EOPNOTSUPP
    with pytest.raises(PyverbsUserError, match="needs a PD"):
        mr.rereg(e.IBV_REREG_MR_CHANGE_PD)
    assert mkeys()[mr.lkey >> 8].mkc["rw"] == 0


def test_a_memory_window_and_its_properties(res):
    ctx, pd = res
    mw = MW(pd, e.IBV_MW_TYPE_2)
    assert mw.type == e.IBV_MW_TYPE_2 and mkeys()[mw.rkey >> 8].mkey == mw.rkey
    assert str(mw).startswith("MW\nrkey: ") and "IBV_MW_TYPE_2" in str(mw)
    pd.close()                                  # the PD closes its windows first
    assert not mkeys()
    mw.close()


def test_memory_window_errors_as_pyverbs_words_them(res):
    ctx, pd = res
    with pytest.raises(PyverbsRDMAError) as ei:
        MW(pd, 3)
    assert ei.value.error_code == errno.EINVAL
    assert str(ei.value).startswith("Failed to allocate MW")
    cq = CQ(ctx, 8)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq))
    mr = MR(pd, 4096, LW | e.IBV_ACCESS_MW_BIND)
    mw = MW(pd, e.IBV_MW_TYPE_2)               # type 2 is bound by a work request
    with pytest.raises(PyverbsRDMAError) as ei:
        qp.bind_mw(mw, MWBind(MWBindInfo(mr, mr.buf, 4096, RW), e.IBV_SEND_SIGNALED))
    assert ei.value.error_code == errno.EINVAL and "Failed to Bind MW" in str(ei.value)
    wr = SendWR(opcode=e.IBV_WR_BIND_MW)
    wr.set_bind_wr(mw, MWBindInfo(mr, mr.buf, 4096, RW))
    assert wr.rkey == (mw.rkey & ~0xFF) | ((mw.rkey + 1) & 0xFF)


def test_the_device_reports_memory_windows(res):
    """mlx5_ib_query_device with the imaicl capability: type 1 and 2B windows, as many
    as mkeys."""
    ctx, pd = res
    attr = ctx.query_device()
    assert attr.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW
    assert attr.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW_TYPE_2B
    assert not attr.device_cap_flags & e.IBV_DEVICE_MEM_WINDOW_TYPE_2A
    assert attr.max_mw == attr.max_mr == 1 << 24
