"""fi_mr(3) over the emulated verbs: the mr_mode bits' rules, keys, raw keys, endpoint
binding, CUDA memory, and every error the layer returns (as negative fabric errno).
The suite's leak check runs after each test: every MR here is closed."""

from __future__ import annotations

import struct

import pytest

from kernel_model.emu.platform import rdma_host
from userspace.cuda.runtime import cudart
from userspace.libfabric.fi_errno import (
    FI_EBADFLAGS,
    FI_EBUSY,
    FI_EFAULT,
    FI_EINVAL,
    FI_EKEYREJECTED,
    FI_ENODATA,
    FI_ENODEV,
    FI_ENOKEY,
    FI_ENOSYS,
    FI_EOPBADSTATE,
    FI_EOPNOTSUPP,
    FI_ETOOSMALL,
    fi_strerror,
)
from userspace.libfabric.fi_mr import (
    FI_CLASS_CNTR,
    FI_HMEM,
    FI_HMEM_CUDA,
    FI_HMEM_SYSTEM,
    FI_HMEM_ZE,
    FI_KEY_NOTAVAIL,
    FI_MR_ALLOCATED,
    FI_MR_BASIC,
    FI_MR_DMABUF,
    FI_MR_ENDPOINT,
    FI_MR_HMEM,
    FI_MR_LOCAL,
    FI_MR_MMU_NOTIFY,
    FI_MR_PROV_KEY,
    FI_MR_RAW,
    FI_MR_RMA_EVENT,
    FI_MR_SCALABLE,
    FI_MR_VIRT_ADDR,
    FI_READ,
    FI_RECV,
    FI_REMOTE_READ,
    FI_REMOTE_WRITE,
    FI_RMA_EVENT,
    FI_SEND,
    fi_close,
    fi_domain,
    fi_endpoint,
    fi_mr_attr,
    fi_mr_bind,
    fi_mr_desc,
    fi_mr_enable,
    fi_mr_key,
    fi_mr_map_raw,
    fi_mr_raw_attr,
    fi_mr_refresh,
    fi_mr_reg,
    fi_mr_regattr,
    fi_mr_regv,
    fi_mr_unmap_key,
    fid,
)

BASIC = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY
KiB64 = 1 << 16


@pytest.fixture
def host():
    m = rdma_host(ram_size=64 << 20, nr_gpus=1)
    m.load_module("mlx5_ib")
    m.load_module("nvidia")
    m.load_module("nv_peer_mem")
    p = m.spawn("app")
    yield m, p
    if p.alive:
        p.exit(0)


def run(p, fn, *args):
    return p.run(fn, *args)


def buffer(p, n=KiB64):
    return p.run(p.mmap, 0, n)


def kernel_mkey(m, key):
    """The firmware's mkey context for a key (index = key >> 8)."""
    return m.hcas[0].fw.mkeys[key >> 8].mkc


# -- the domain -------------------------------------------------------------------------------
@pytest.mark.parametrize("hints, want", [
    (BASIC, BASIC),
    (FI_MR_BASIC, BASIC),                                   # the deprecated spelling
    (BASIC | FI_MR_MMU_NOTIFY | FI_MR_RMA_EVENT, BASIC),    # not needed: cleared
    (FI_MR_ALLOCATED, FI_MR_ALLOCATED),
])
def test_the_domain_keeps_the_bits_it_needs(host, hints, want):
    m, p = host
    ret, dom = run(p, fi_domain, p, hints)
    assert ret == 0 and dom.mr_mode == want
    assert run(p, fi_close, dom) == 0


@pytest.mark.parametrize("hints", [FI_MR_SCALABLE, FI_MR_LOCAL | FI_MR_VIRT_ADDR, 0])
def test_hints_without_allocated_match_no_provider(host, hints):
    m, p = host
    assert run(p, fi_domain, p, hints) == (-FI_ENODATA, None)


def test_hmem_mode_needs_the_hmem_capability_and_an_unknown_device_is_enodev(host):
    m, p = host
    ret, dom = run(p, fi_domain, p, BASIC | FI_MR_HMEM)
    assert ret == 0 and not dom.mr_mode & FI_MR_HMEM
    assert run(p, fi_close, dom) == 0
    assert run(p, fi_domain, p, BASIC, 0, "mlx5_9") == (-FI_ENODEV, None)


# -- registration -------------------------------------------------------------------------------
def test_a_provider_key_registration_is_the_verbs_mr(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = buffer(p)
        ret, mr = fi_mr_reg(dom, buf, KiB64, FI_REMOTE_WRITE | FI_RECV, 0, 0x77, 0, "ctx")
        assert ret == 0 and mr.context == "ctx" and mr.iface == FI_HMEM_SYSTEM
        assert fi_mr_key(mr) == mr.ibv_mr.rkey            # requested_key ignored
        assert fi_mr_desc(mr) == mr.ibv_mr.lkey
        mkc = kernel_mkey(m, mr.ibv_mr.lkey)
        assert mkc["start_addr"] == buf                   # FI_MR_VIRT_ADDR: the iova is buf
        assert mkc["rw"] == 1 and mkc["lw"] == 1 and mkc["rr"] == 0
        assert fi_close(dom) == -FI_EBUSY                 # an MR is still open
        assert fi_close(mr) == 0 and fi_close(dom) == 0
        assert fi_close(mr) == -FI_EINVAL and fi_close(dom) == -FI_EINVAL   # twice
    run(p, go)


def test_without_virt_addr_the_region_is_zero_based(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, FI_MR_ALLOCATED | FI_MR_PROV_KEY)
        buf = buffer(p)
        ret, mr = fi_mr_reg(dom, buf, KiB64, FI_REMOTE_READ, 0, 0, 0)
        assert ret == 0 and kernel_mkey(m, mr.ibv_mr.lkey)["start_addr"] == 0
        assert kernel_mkey(m, mr.ibv_mr.lkey)["rr"] == 1
        ret, base, raw, size = fi_mr_raw_attr(mr, 8)
        assert ret == 0 and base == 0
        fi_close(mr)
        fi_close(dom)
    run(p, go)


@pytest.mark.parametrize("access, rr, rw, lw", [
    (FI_SEND, 0, 0, 0),
    (FI_RECV, 0, 0, 1),
    (FI_READ, 0, 0, 1),
    (FI_REMOTE_READ, 1, 0, 0),
    (FI_REMOTE_WRITE, 0, 1, 1),
])
def test_access_bits_become_verbs_access(host, access, rr, rw, lw):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC)
        ret, mr = fi_mr_reg(dom, buffer(p), KiB64, access, 0, 0, 0)
        mkc = kernel_mkey(m, mr.ibv_mr.lkey)
        assert ret == 0 and (mkc["rr"], mkc["rw"], mkc["lw"]) == (rr, rw, lw)
        fi_close(mr)
        fi_close(dom)
    run(p, go)


@pytest.mark.parametrize("case, want", [
    ("length 0", -FI_EINVAL),
    ("offset", -FI_EINVAL),
    ("access 0", -FI_EINVAL),
    ("access bit", -FI_EINVAL),
    ("rma event", -FI_EBADFLAGS),
    ("dmabuf", -FI_EINVAL),              # fi_mr_reg carries no fi_mr_dmabuf
    ("unmapped", -FI_EFAULT),
])
def test_bad_registrations_fail_and_leave_nothing(host, case, want):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC)
        buf = buffer(p)
        args = {"length 0": (buf, 0, FI_RECV, 0, 0),
                "offset": (buf, KiB64, FI_RECV, 8, 0),
                "access 0": (buf, KiB64, 0, 0, 0),
                "access bit": (buf, KiB64, FI_RECV | 1, 0, 0),
                "rma event": (buf, KiB64, FI_RECV, 0, FI_RMA_EVENT),
                "dmabuf": (buf, KiB64, FI_RECV, 0, FI_MR_DMABUF),
                "unmapped": (0x1000, KiB64, FI_RECV, 0, 0)}[case]
        addr, length, access, offset, flags = args
        assert fi_mr_reg(dom, addr, length, access, offset, 0, flags) == (want, None)
        assert dom.mrs == [] and fi_close(dom) == 0
    run(p, go)


def test_regv_takes_one_iov(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC)
        a, b = buffer(p), buffer(p)
        iov = [(a, KiB64), (b, KiB64)]
        assert fi_mr_regv(dom, iov, 2, FI_RECV, 0, 0, 0) == (-FI_EINVAL, None)
        assert fi_mr_regv(dom, iov, 0, FI_RECV, 0, 0, 0) == (-FI_EINVAL, None)
        ret, mr = fi_mr_regv(dom, iov, 1, FI_RECV, 0, 0, 0)
        assert ret == 0 and (mr.addr, mr.length) == (a, KiB64)
        fi_close(mr)
        fi_close(dom)
    run(p, go)


# -- requested keys ----------------------------------------------------------------------------
def test_requested_keys_are_the_keys_and_each_is_used_once(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED)
        buf = buffer(p)
        ret, mr = fi_mr_reg(dom, buf, KiB64, FI_REMOTE_WRITE, 0, 42, 0)
        assert ret == 0 and fi_mr_key(mr) == 42
        assert fi_mr_reg(dom, buf, KiB64, FI_REMOTE_WRITE, 0, 42, 0) == (-FI_ENOKEY, None)
        assert fi_mr_reg(dom, buf, KiB64, FI_REMOTE_WRITE, 0, 1 << 32, 0) == (
            -FI_EKEYREJECTED, None)
        assert fi_close(mr) == 0
        ret, again = fi_mr_reg(dom, buf, KiB64, FI_REMOTE_WRITE, 0, 42, 0)   # free again
        assert ret == 0 and fi_mr_key(again) == 42
        fi_close(again)
        fi_close(dom)
    run(p, go)


# -- raw keys ----------------------------------------------------------------------------------
def test_raw_keys_go_through_raw_attr_and_map_raw(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC | FI_MR_RAW)
        buf = buffer(p)
        _, mr = fi_mr_reg(dom, buf, KiB64, FI_REMOTE_READ, 0, 0, 0)
        assert fi_mr_key(mr) == FI_KEY_NOTAVAIL
        assert fi_mr_raw_attr(mr, 0) == (-FI_ETOOSMALL, 0, b"", 4)   # says what it needs
        assert fi_mr_raw_attr(mr, 8, 1)[0] == -FI_EBADFLAGS
        ret, base, raw, size = fi_mr_raw_attr(mr, 8)
        assert (ret, base, size) == (0, buf, 4)
        assert struct.unpack("<I", raw) == (mr.ibv_mr.rkey,)
        ret, key = fi_mr_map_raw(dom, base, raw, size)                # at the peer
        assert ret == 0 and dom.raw_keys[key] == (buf, mr.ibv_mr.rkey)
        assert fi_mr_map_raw(dom, base, raw, 3) == (-FI_EINVAL, 0)
        assert fi_mr_map_raw(dom, base, raw, size, 1) == (-FI_EBADFLAGS, 0)
        assert fi_mr_unmap_key(dom, key) == 0
        assert fi_mr_unmap_key(dom, key) == -FI_EINVAL
        fi_close(mr)
        fi_close(dom)
    run(p, go)


# -- FI_MR_ENDPOINT ----------------------------------------------------------------------------
def test_endpoint_mrs_are_bound_then_enabled(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC | FI_MR_ENDPOINT)
        _, ep = fi_endpoint(dom)
        _, mr = fi_mr_reg(dom, buffer(p), KiB64, FI_REMOTE_WRITE, 0, 0, 0)
        assert not mr.enabled
        assert fi_mr_enable(mr) == -FI_EOPBADSTATE                     # not bound yet
        assert fi_mr_bind(mr, fid(FI_CLASS_CNTR)) == -FI_ENOSYS        # no RMA events
        assert fi_mr_bind(mr, dom) == -FI_EINVAL
        assert fi_mr_bind(mr, ep, 1) == -FI_EBADFLAGS
        assert fi_mr_bind(mr, ep) == 0 and fi_mr_enable(mr) == 0 and mr.enabled
        assert fi_mr_bind(mr, ep) == -FI_EOPBADSTATE                   # enabled: no more
        assert fi_close(mr) == -FI_EBUSY                               # bound to an open ep
        assert fi_close(ep) == 0 and fi_close(mr) == 0 and fi_close(dom) == 0
    run(p, go)


def test_binding_outside_endpoint_mode_and_refresh(host):
    m, p = host

    def go():
        _, dom = fi_domain(p, BASIC)
        _, ep = fi_endpoint(dom)
        _, mr = fi_mr_reg(dom, buffer(p), KiB64, FI_RECV, 0, 0, 0)
        assert mr.enabled and fi_mr_enable(mr) == 0
        assert fi_mr_bind(mr, ep) == -FI_EINVAL
        assert fi_mr_refresh(mr, [(mr.addr, KiB64)], 1) == -FI_ENOSYS
        assert fi_close(object()) == -FI_EINVAL
        fi_close(ep)
        fi_close(mr)
        fi_close(dom)
    run(p, go)


# -- device memory ---------------------------------------------------------------------------
def test_cuda_memory_is_found_by_the_layer_or_named_by_regattr(host):
    m, p = host

    def go():
        cu = cudart(p)
        d = cu.cudaMalloc(1 << 20)
        # FI_HMEM without FI_MR_HMEM: the layer finds the iface itself
        _, dom = fi_domain(p, BASIC, FI_HMEM)
        ret, mr = fi_mr_reg(dom, d, 1 << 20, FI_REMOTE_WRITE, 0, 0, 0)
        assert ret == 0 and mr.iface == FI_HMEM_CUDA
        fi_close(mr)
        fi_close(dom)
        # FI_MR_HMEM: device memory only through fi_mr_regattr with its iface
        _, dom = fi_domain(p, BASIC | FI_MR_HMEM, FI_HMEM)
        assert fi_mr_reg(dom, d, 1 << 20, FI_REMOTE_WRITE, 0, 0, 0) == (-FI_EINVAL, None)
        attr = fi_mr_attr([(d, 1 << 20)], FI_REMOTE_WRITE, iface=FI_HMEM_CUDA, device=0)
        ret, mr = fi_mr_regattr(dom, attr)
        assert ret == 0 and (mr.iface, mr.device) == (FI_HMEM_CUDA, 0)
        assert fi_mr_regattr(dom, fi_mr_attr([(d, 1 << 20)], FI_REMOTE_WRITE,
                                             iface=FI_HMEM_ZE)) == (-FI_EOPNOTSUPP, None)
        fi_close(mr)
        fi_close(dom)
        # without the FI_HMEM capability a CUDA iface is refused
        _, dom = fi_domain(p, BASIC)
        assert fi_mr_regattr(dom, attr) == (-FI_EINVAL, None)
        fi_close(dom)
        cu.cudaFree(d)
    run(p, go)


def test_fi_strerror():
    assert fi_strerror(-FI_ENOKEY) == "Required key not available"
    assert fi_strerror(FI_EINVAL) == "Invalid argument"
    assert fi_strerror(-FI_EBADFLAGS) == "Flags not supported"
    assert FI_HMEM_SYSTEM == 0
