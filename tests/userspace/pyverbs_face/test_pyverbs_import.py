"""userspace/pyverbs: Context(cmd_fd=...), PD(ctx, handle=...), MR(pd, handle=...),
DM(ctx, handle=...) and unimport() - a second context on a dup of Context.cmd_fd (the
memfd standing for the emulated uverbs fd) shares the first one's objects by handle;
pyverbs' messages and the errnos of each step."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

import userspace.pyverbs.device as d
import userspace.pyverbs.enums as e
from userspace.pyverbs import host
from userspace.pyverbs.cq import CQ
from userspace.pyverbs.mr import MR
from userspace.pyverbs.pd import PD
from userspace.pyverbs.pyverbs_error import PyverbsRDMAError
from userspace.pyverbs.qp import QP, QPCap, QPInitAttr

LW, RW = e.IBV_ACCESS_LOCAL_WRITE, e.IBV_ACCESS_REMOTE_WRITE


def emulated_fds() -> list[int]:
    return host.current_process().task.files.open_fds()


def fd_is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


@pytest.fixture
def res():
    ctx = d.Context(name="mlx5_0")
    pd = PD(ctx)
    mr = MR(pd, 4096, LW | RW)
    yield ctx, pd, mr
    ctx.close()


def test_imported_context_pd_and_mr_share_the_originals(res):
    ctx, pd, mr = res
    fds = emulated_fds()
    dup = os.dup(ctx.cmd_fd)
    ictx = d.Context(cmd_fd=dup)
    assert ictx.name == "mlx5_0" and ictx.cmd_fd == dup
    assert len(emulated_fds()) == len(fds) + 2             # the fd's dup, its async fd
    ipd = PD(ictx, handle=pd.handle)
    imr = MR(ipd, handle=mr.handle, address=mr.buf)
    assert (imr.lkey, imr.rkey, imr.length, imr.handle, imr.buf) == \
        (mr.lkey, mr.rkey, 4096, mr.handle, mr.buf)
    mr.write(b"one buffer", 10)
    assert imr.read(10, 0) == b"one buffer"
    # a QP made through the imported context and PD is closed with the imported PD
    cq = CQ(ictx, 4)
    qp = QP(ipd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(2, 2, 1, 1)))
    imr.unimport()
    ipd.unimport()
    assert qp._closed and not pd._closed and not mr._closed
    ictx.close()
    assert not fd_is_open(dup) and emulated_fds() == fds   # the context closed its fd
    mr.write(b"still here", 10)                            # the originals are untouched
    assert mr.read(10, 0) == b"still here"


def test_closing_imported_objects_leaves_the_originals(res):
    ctx, pd, mr = res
    ictx = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    ipd = PD(ictx, handle=pd.handle)
    MR(ipd, handle=mr.handle)
    ictx.close()                       # closes the imported PD and MR: nothing freed
    mr2 = MR(pd, 64, LW)               # the PD is alive
    mr2.close()


def test_import_errors(res):
    ctx, pd, mr = res
    ictx = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    cases = [(lambda: PD(ictx, handle=4242), "Failed to import PD", errno.ENOENT),
             (lambda: PD(ictx, handle=mr.handle), "Failed to import PD", errno.EINVAL)]
    ipd = PD(ictx, handle=pd.handle)
    cases += [(lambda: MR(ipd, handle=4242), "Failed to import MR", errno.ENOENT),
              (lambda: MR(ipd, handle=pd.handle), "Failed to import MR", errno.EINVAL),
              (lambda: d.DM(ictx, handle=pd.handle), "Failed to import DM", errno.EINVAL)]
    for make, msg, err in cases:
        with pytest.raises(PyverbsRDMAError, match=msg) as ex:
            make()
        assert ex.value.error_code == err
    ictx.close()


def test_a_descriptor_that_stands_for_no_uverbs_file_is_einval(res):
    ctx, pd, mr = res
    fds = emulated_fds()
    with tempfile.TemporaryFile() as f:
        other = os.dup(f.fileno())
        for fd in (other, 987654):             # an unrelated file of this process; none
            with pytest.raises(PyverbsRDMAError, match="Failed to import device") as ex:
                d.Context(cmd_fd=fd)
            assert ex.value.error_code == errno.EINVAL
        assert fd_is_open(other)               # not taken: still the caller's
        os.close(other)
    assert emulated_fds() == fds


def test_a_dup_outliving_its_context_stands_for_nothing():
    """EMU: the emulated fd is dup()ed when the program imports, not when it dup()s the
    memfd: once the context the memfd stood for is closed, a dup of it names no
    uverbs file (on a real host the dup would keep the file, and import it)."""
    ctx = d.Context(name="mlx5_0")
    dup = os.dup(ctx.cmd_fd)
    ctx.close()
    with pytest.raises(PyverbsRDMAError, match="Failed to import device") as ex:
        d.Context(cmd_fd=dup)
    assert ex.value.error_code == errno.EINVAL
    os.close(dup)


def test_imported_dm_reads_what_the_original_wrote():
    ctx = d.Context(name="mlx5_0")
    dm = d.DM(ctx, d.AllocDmAttr(256))
    ictx = d.Context(cmd_fd=os.dup(ctx.cmd_fd))
    idm = d.DM(ictx, handle=dm.handle)
    dm.copy_to_dm(16, b"\xab" * 32, 32)
    assert idm.copy_from_dm(16, 32) == b"\xab" * 32
    idm.unimport()
    assert idm._closed and not dm._closed
    ictx.close()
    assert dm.copy_from_dm(16, 4) == b"\xab" * 4
    ctx.close()
    assert host.host().machine.hcas[0].fw.memics == {}
