"""userfaultfd(2) as the registration cache's unmap monitor uses it: the API handshake,
registering ranges, UFFD_EVENT_UNMAP on munmap, and every errno."""

from __future__ import annotations

import errno
import struct

import pytest

from kernel_model.emu.platform import rdma_host
from kernel_model.uapi.userfaultfd import (
    UFFD_API,
    UFFD_EVENT_UNMAP,
    UFFD_FEATURE_EVENT_UNMAP,
    UFFD_MSG_FMT,
    UFFD_USER_MODE_ONLY,
    UFFDIO_API,
    UFFDIO_API_FMT,
    UFFDIO_RANGE_FMT,
    UFFDIO_REGISTER,
    UFFDIO_REGISTER_FMT,
    UFFDIO_UNREGISTER,
)
from userspace.cuda.runtime import cudart

O_NONBLOCK = 0o4000
PAGE = 4096


@pytest.fixture
def proc():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1, modules=())
    m.load_module("nvidia")
    p = m.spawn("app")
    yield p
    if p.alive:
        p.exit(0)


class Uffd:
    """A userfaultfd and a page of scratch memory for its ioctl arguments."""

    def __init__(self, p, flags=O_NONBLOCK | UFFD_USER_MODE_ONLY, api=True,
                 features=UFFD_FEATURE_EVENT_UNMAP):
        self.p = p
        self.fd = p.userfaultfd(flags)
        assert self.fd >= 0
        self.arg = p.mmap(0, PAGE)
        if api:
            assert self.api(UFFD_API, features) == 0

    def api(self, api, features):
        self.p.store(self.arg, struct.pack(UFFDIO_API_FMT, api, features, 0))
        return self.p.ioctl(self.fd, UFFDIO_API, self.arg)

    def register(self, start, length, mode=1):
        self.p.store(self.arg, struct.pack(UFFDIO_REGISTER_FMT, start, length, mode, 0))
        return self.p.ioctl(self.fd, UFFDIO_REGISTER, self.arg)

    def unregister(self, start, length):
        self.p.store(self.arg, struct.pack(UFFDIO_RANGE_FMT, start, length))
        return self.p.ioctl(self.fd, UFFDIO_UNREGISTER, self.arg)

    def read(self, n=32):
        ret = self.p.read(self.fd, self.arg, n)
        if ret < 0:
            return ret, None
        return ret, struct.unpack(UFFD_MSG_FMT, self.p.load(self.arg, 32))

    def close(self):
        self.p.close(self.fd)
        self.p.munmap(self.arg, PAGE)


def test_the_handshake_and_an_unmap_event(proc):
    p = proc

    def go():
        u = Uffd(p, api=False)
        assert u.api(UFFD_API, UFFD_FEATURE_EVENT_UNMAP) == 0
        api, features, ioctls = struct.unpack(UFFDIO_API_FMT, p.load(u.arg, 24))
        assert api == UFFD_API and features & UFFD_FEATURE_EVENT_UNMAP and ioctls >> 63
        buf = p.mmap(0, 4 * PAGE)
        assert u.register(buf + PAGE, 2 * PAGE) == 0
        assert [v.vm_userfaultfd_ctx is not None for v in p.mm.overlapping(buf, buf + 4 * PAGE)
                ] == [False, True, False]                    # split at the range
        assert u.read() == (-errno.EAGAIN, None)
        p.munmap(buf, PAGE)                                  # outside it: nothing
        assert u.read() == (-errno.EAGAIN, None)
        p.munmap(buf + PAGE, 3 * PAGE)                       # through it: one event
        ret, msg = u.read()
        assert ret == 32 and msg[0] == UFFD_EVENT_UNMAP
        assert (msg[4], msg[5]) == (buf + PAGE, buf + 4 * PAGE)
        assert u.read() == (-errno.EAGAIN, None)
        u.close()
    p.run(go)


def test_unregister_and_close_stop_the_events(proc):
    p = proc

    def go():
        u = Uffd(p)
        buf = p.mmap(0, 2 * PAGE)
        assert u.register(buf, 2 * PAGE) == 0
        assert u.unregister(buf, PAGE) == 0
        p.munmap(buf, PAGE)
        assert u.read() == (-errno.EAGAIN, None)
        u.close()
        assert p.mm.find_vma(buf + PAGE).vm_userfaultfd_ctx is None
        p.munmap(buf + PAGE, PAGE)
    p.run(go)


def test_a_blocking_read_waits_for_the_unmap(proc):
    p = proc

    def go():
        u = Uffd(p, flags=UFFD_USER_MODE_ONLY)
        buf = p.mmap(0, PAGE)
        assert u.register(buf, PAGE) == 0
        reader = p.thread(u.read, name="monitor")
        p.sched_yield()                                      # the reader blocks
        p.munmap(buf, PAGE)
        ret, msg = reader.join()
        assert ret == 32 and msg[0] == UFFD_EVENT_UNMAP
        u.close()
    p.run(go)


def test_userfaultfd_errors(proc):
    p = proc

    def go():
        assert p.userfaultfd(O_NONBLOCK) == -errno.EPERM       # unprivileged, all modes
        assert p.userfaultfd(UFFD_USER_MODE_ONLY | 0x100) == -errno.EINVAL
        u = Uffd(p, api=False)
        buf = p.mmap(0, 2 * PAGE)
        assert u.register(buf, PAGE) == -errno.EINVAL         # before UFFDIO_API
        assert u.read() == (-errno.EINVAL, None)
        assert u.api(0xAB, UFFD_FEATURE_EVENT_UNMAP) == -errno.EINVAL
        assert u.api(UFFD_API, 1 << 40) == -errno.EINVAL      # unsupported feature
        assert u.api(UFFD_API, UFFD_FEATURE_EVENT_UNMAP) == 0
        assert u.api(UFFD_API, UFFD_FEATURE_EVENT_UNMAP) == -errno.EINVAL   # twice
        assert u.register(buf + 1, PAGE) == -errno.EINVAL     # unaligned
        assert u.register(buf, 0) == -errno.EINVAL            # empty
        assert u.register(buf, PAGE, mode=0) == -errno.EINVAL
        assert u.register(buf, 4 * PAGE) == -errno.EINVAL     # a hole after it
        d = cudart(p).cudaMalloc(1 << 16)                     # VM_IO | VM_PFNMAP
        assert u.register(d, 1 << 16) == -errno.EINVAL
        cudart(p).cudaFree(d)
        assert u.read(16) == (-errno.EINVAL, None)            # no room for a msg
        assert p.ioctl(u.fd, 0xc008aa42, u.arg) == -errno.EINVAL
        other = Uffd(p)
        assert u.register(buf, PAGE) == 0
        assert other.register(buf, PAGE) == -errno.EBUSY      # another userfaultfd's
        other.close()
        u.close()
        p.munmap(buf, 2 * PAGE)
    p.run(go)


def test_root_needs_no_user_mode_only():
    m = rdma_host(ram_size=16 << 20, modules=())
    p = m.spawn("root", uid=0)
    fd = p.run(p.userfaultfd, O_NONBLOCK)
    assert fd >= 0
    p.run(p.close, fd)
    p.exit(0)


def test_unregistering_part_of_a_range_keeps_the_rest(proc):
    p = proc

    def go():
        u = Uffd(p)
        buf = p.mmap(0, 4 * PAGE)
        assert u.register(buf, 4 * PAGE) == 0
        assert u.unregister(buf + PAGE, PAGE) == 0
        owned = [v.vm_userfaultfd_ctx is not None
                 for v in p.mm.overlapping(buf, buf + 4 * PAGE)]
        assert owned == [True, False, True]
        p.munmap(buf + 2 * PAGE, PAGE)                     # still registered: an event
        assert u.read()[0] == 32
        u.close()
        p.munmap(buf, 4 * PAGE)
    p.run(go)


def test_bad_user_addresses_are_efault(proc):
    p = proc

    def go():
        u = Uffd(p)
        assert p.ioctl(u.fd, UFFDIO_API, 0x10) == -errno.EFAULT
        assert p.ioctl(u.fd, UFFDIO_REGISTER, 0x10) == -errno.EFAULT
        buf = p.mmap(0, PAGE)
        assert u.register(buf, PAGE) == 0
        p.munmap(buf, PAGE)                                  # an event is queued
        assert p.read(u.fd, 0x10, 32) == -errno.EFAULT       # nowhere to put it
        u.close()
    p.run(go)
