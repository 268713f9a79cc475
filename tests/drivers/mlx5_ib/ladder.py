"""The resource ladder of the mlx5_ib tests: host -> process -> context -> PD -> CQ -> QP.

Two ways in, as the tests need them:

* through libibverbs and the mlx5 provider (open_ctx, v.ibv_alloc_pd, ...), what
  rdma-core really sends;
* raw commands built here (get_context, create_cq_raw, create_qp_raw, write_raw)
  for the requests the provider never sends: bad flags, wrong sizes, short or
  dirty udata, a response buffer the kernel cannot write.

`state(p, ctx)` is what must come back unchanged after a failed verb: the
process's pinned pages, the context's bfreg counts and doorbell pages, and the
firmware objects.
"""

from __future__ import annotations

from typing import Any

from drivers.mlx5_ib.mlx5_ib import mlx5_ib_dev, mlx5_ib_ucontext
from kernel_model.auxiliary import auxiliary_bus
from kernel_model.emu.machine import Machine
from kernel_model.emu.platform import rdma_host
from kernel_model.hw.mlx5 import Mlx5Config
from kernel_model.hw.mlx5_ifc import MLX5_CMD_STAT_LIM_ERR  # noqa: F401 - ENOMEM
from kernel_model.uapi import ib_user_verbs as uv
from kernel_model.uapi.mlx5_abi import (
    MLX5_IB_ALLOC_UCTX_DEVX,
    MLX5_LIB_CAP_4K_UAR,
    mlx5_ib_alloc_pd_resp,
    mlx5_ib_alloc_ucontext_req_v2,
    mlx5_ib_alloc_ucontext_resp,
    mlx5_ib_create_cq,
    mlx5_ib_create_cq_resp,
    mlx5_ib_create_qp,
    mlx5_ib_create_qp_resp,
)
from userspace.libc import MAP_ANONYMOUS, MAP_PRIVATE, PROT_READ, PROT_WRITE, posix_memalign
from userspace.libibverbs import cmd as c
from userspace.libibverbs import verbs as v
from userspace.libibverbs.cmd import VerbsError
from userspace.providers.mlx5.verbs import mlx5_cq, mlx5_pd

DEFAULT_UIDX = 0xFFFFFF


class RawBytes:
    """A driver request of exactly these bytes (short, long, dirty)."""

    def __init__(self, data: bytes):
        self.data = data

    def pack(self) -> bytes:
        return self.data


# -- the host ----------------------------------------------------------------------------
def host(hca: Mlx5Config | None = None, page_size: int = 4096, **params: bool) -> Machine:
    """A small RDMA host (64 MiB) with mlx5_ib loaded with `params`."""
    m = rdma_host(ram_size=64 << 20, page_size=page_size, hca=hca)
    m.load_module("mlx5_ib", **params)
    return m


def ib_dev(m: Machine) -> mlx5_ib_dev:
    """The mlx5_ib_dev mlx5_ib bound to the first HCA (auxiliary drvdata)."""
    return auxiliary_bus(m).devices[0].drvdata


def fw(m: Machine) -> Any:
    return m.hcas[0].fw


def fw_objects(m: Machine) -> list[str]:
    """Every firmware object, one status line each."""
    return [repr(o) for o in fw(m).live_objects()]


def cmds(m: Machine, since: int = 0) -> list[str]:
    """Names of the firmware commands issued since index `since` of the command log."""
    return [e[0] for e in fw(m).cmd_log[since:]]


def last_error(p: Any) -> str:
    """The kernel's message for the process's last failed system call."""
    return str(p.task.last_error)


def errno_of(fn: Any, *args: Any) -> int:
    """0, or the errno of the VerbsError fn raised."""
    try:
        fn(*args)
    except VerbsError as e:
        return e.errno
    return 0


# -- contexts ------------------------------------------------------------------------------
def open_ctx(p: Any) -> Any:
    """ibv_open_device of mlx5_0 (v2 ABI, 16/4 bfregs, DEVX, cqe_version 1)."""
    return v.ibv_open_device(p, v.ibv_get_device_list(p)[0])


def ucontext(p: Any, ctx: Any) -> mlx5_ib_ucontext:
    """The kernel's mlx5_ib_ucontext behind the process's uverbs fd."""
    return p.task.files.fdt[ctx.cmd_fd].private_data.ucontext


def raw_ctx(p: Any) -> v.ibv_context:
    """An open uverbs file with a command page, before GET_CONTEXT."""
    dev = v.ibv_get_device_list(p)[0]
    ctx = v.ibv_context(dev, p, p.open(dev.dev_path), None)
    ctx.cmd_buf = posix_memalign(p, 4096, c.CMD_BUF_SIZE)
    return ctx


def ucontext_req(total: int = 16, low: int = 4, **kw: int) -> mlx5_ib_alloc_ucontext_req_v2:
    """The provider's request, v2 ABI, without DEVX unless asked."""
    fields = dict(total_num_bfregs=total, num_low_latency_bfregs=low, max_cqe_version=1,
                  lib_caps=MLX5_LIB_CAP_4K_UAR)
    fields.update(kw)
    return mlx5_ib_alloc_ucontext_req_v2(**fields)


def get_context(p: Any, drv_req: Any, ctx: Any = None) -> tuple[Any, mlx5_ib_alloc_ucontext_resp]:
    """GET_CONTEXT with a hand-made driver request; (ctx, mlx5 response)."""
    ctx = ctx or raw_ctx(p)
    _core, resp = c.ibv_cmd_get_context(ctx, drv_req, mlx5_ib_alloc_ucontext_resp)
    return ctx, resp


def devx_req(**kw: int) -> mlx5_ib_alloc_ucontext_req_v2:
    return ucontext_req(flags=MLX5_IB_ALLOC_UCTX_DEVX, **kw)


def raw_pd(ctx: Any) -> mlx5_pd:
    """ALLOC_PD on a context opened with a raw request."""
    resp, drv = c.ibv_cmd_alloc_pd(ctx, mlx5_ib_alloc_pd_resp)
    return mlx5_pd(ctx, resp.pd_handle, pdn=drv.pdn)


# -- user memory --------------------------------------------------------------------------
def user_pages(p: Any, n: int = 1) -> int:
    """n fresh anonymous pages of the process, touched (so present)."""
    ps = p.machine.page_size
    addr = p.mmap(0, n * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS)
    assert addr > 0
    p.store(addr, bytes(n * ps))
    return addr


def hole(p: Any) -> int:
    """An address with nothing mapped: a page mapped, then unmapped."""
    addr = user_pages(p)
    p.munmap(addr, p.machine.page_size)
    return addr


# -- CQ ------------------------------------------------------------------------------------
def cq_ucmd(p: Any, entries: int = 32, **kw: int) -> mlx5_ib_create_cq:
    """A create_cq request with its own buffer (64-byte CQEs) and doorbell page."""
    ps = p.machine.page_size
    if "buf_addr" not in kw:
        kw["buf_addr"] = user_pages(p, -(-entries * 64 // ps))
    if "db_addr" not in kw:
        kw["db_addr"] = user_pages(p)
    kw.setdefault("cqe_size", 64)
    return mlx5_ib_create_cq(**kw)


def create_cq_raw(ctx: Any, ucmd: Any, cqe: int = 31, comp_vector: int = 0) -> tuple[Any, Any]:
    """CREATE_CQ with this driver request; (core resp, mlx5 resp) or VerbsError."""
    return c.ibv_cmd_create_cq(ctx, cqe, comp_vector, ucmd, mlx5_ib_create_cq_resp)


def raw_cq(p: Any, ctx: Any, **kw: int) -> mlx5_cq:
    """A CQ made with a raw request (left for the process exit to destroy)."""
    core, drv = create_cq_raw(ctx, cq_ucmd(p, **kw))
    return mlx5_cq(ctx, core.cq_handle, core.cqe, cqn=drv.cqn)


# -- QP ------------------------------------------------------------------------------------
def qp_ucmd(p: Any, sq: int = 256, rq: int = 64, rq_shift: int = 4, uidx: int = 0,
            **kw: int) -> mlx5_ib_create_qp:
    """A create_qp request as libmlx5 sizes an RC 64/64 QP (RQ first, then the SQ)."""
    ps = p.machine.page_size
    if "buf_addr" not in kw:
        kw["buf_addr"] = user_pages(p, max(1, -(-((rq << rq_shift) + sq * 64) // ps)))
    if "db_addr" not in kw:
        kw["db_addr"] = user_pages(p)
    return mlx5_ib_create_qp(sq_wqe_count=sq, rq_wqe_count=rq, rq_wqe_shift=rq_shift,
                             uidx=uidx, **kw)


def qp_cmd(pd: Any, cq: Any, send_wr: int = 64, recv_wr: int = 64,
           qp_type: int = v.IBV_QPT_RC) -> uv.ib_uverbs_create_qp:
    """The core create_qp request for an RC 64/64 QP on one CQ."""
    return uv.ib_uverbs_create_qp(pd_handle=pd.handle, send_cq_handle=cq.handle,
                                  recv_cq_handle=cq.handle, max_send_wr=send_wr,
                                  max_recv_wr=recv_wr, max_send_sge=1, max_recv_sge=1,
                                  qp_type=qp_type)


def create_qp_raw(ctx: Any, req: Any, ucmd: Any) -> tuple[Any, mlx5_ib_create_qp_resp]:
    """CREATE_QP; (core resp, mlx5 resp) or VerbsError."""
    return c.ibv_cmd_create_qp(ctx, req, ucmd, mlx5_ib_create_qp_resp)


def write_raw(ctx: Any, command: int, req: Any, resp_size: int, drv_req: bytes,
              drv_resp_size: int, response: int) -> int:
    """write() one command whose responses go to `response` (chosen by the test);
    0 or the errno."""
    p = ctx.proc
    req.response = response
    body = req.pack() + drv_req
    hdr = uv.ib_uverbs_cmd_hdr(command=command, in_words=(uv.ib_uverbs_cmd_hdr.SIZE
                                                          + len(body)) // 4,
                               out_words=(resp_size + drv_resp_size) // 4)
    data = hdr.pack() + body
    p.store(ctx.cmd_buf, data)
    ret = p.write(ctx.cmd_fd, ctx.cmd_buf, len(data))
    return 0 if ret == len(data) else -ret


def response_at_edge(p: Any, core_size: int) -> int:
    """A response address whose first `core_size` bytes are the last of a mapped
    page: the core response fits, the driver's (right after it) faults."""
    ps = p.machine.page_size
    addr = user_pages(p, 2)
    p.munmap(addr + ps, ps)
    return addr + ps - core_size


# -- what a failed verb must leave as it found it ---------------------------------------
def state(p: Any, ctx: Any) -> tuple:
    """(pinned pages, bfreg counts, doorbell pages, firmware objects)."""
    uctx = ucontext(p, ctx)
    m = p.machine
    return (p.mm.pinned_vm, list(uctx.bfregi.count), [repr(d) for d in uctx.db_page_list],
            fw_objects(m), len(ib_dev(m).qp_list))


# -- QP states (modify_qp) ------------------------------------------------------------------
RC_INIT_MASK = v.IBV_QP_STATE | v.IBV_QP_PKEY_INDEX | v.IBV_QP_PORT | v.IBV_QP_ACCESS_FLAGS
RC_RTR_MASK = (v.IBV_QP_STATE | v.IBV_QP_AV | v.IBV_QP_PATH_MTU | v.IBV_QP_DEST_QPN
               | v.IBV_QP_RQ_PSN | v.IBV_QP_MAX_DEST_RD_ATOMIC | v.IBV_QP_MIN_RNR_TIMER)
RC_RTS_MASK = (v.IBV_QP_STATE | v.IBV_QP_TIMEOUT | v.IBV_QP_RETRY_CNT | v.IBV_QP_RNR_RETRY
               | v.IBV_QP_SQ_PSN | v.IBV_QP_MAX_QP_RD_ATOMIC)
RC_ACCESS = v.IBV_ACCESS_LOCAL_WRITE | v.IBV_ACCESS_REMOTE_WRITE | v.IBV_ACCESS_REMOTE_READ


def rc_qp(ctx: Any, pd: Any = None, cq: Any = None) -> v.ibv_qp:
    """An RC QP (4/4 WRs, one SGE) through libibverbs; PD and CQ made if not given."""
    pd = pd or v.ibv_alloc_pd(ctx)
    cq = cq or v.ibv_create_cq(ctx, 16)
    return v.ibv_create_qp(pd, v.ibv_qp_init_attr(send_cq=cq, recv_cq=cq,
                                                  cap=v.ibv_qp_cap(4, 4, 1, 1)))


def kqp(p: Any, ctx: Any, qp: Any) -> Any:
    """The kernel's mlx5_ib_qp behind a QP handle of the process's uverbs file."""
    return p.task.files.fdt[ctx.cmd_fd].private_data.idr[qp.handle].object


def qp_states(p: Any, ctx: Any, qp: Any) -> tuple[int, int, int]:
    """(the firmware QPC state, the driver's qp->state, libibverbs' qp->state)."""
    return fw(p.machine).qps[qp.qp_num].state, kqp(p, ctx, qp).state, qp.state


def init_attr(port: int = 1, access: int = RC_ACCESS, **kw: int) -> v.ibv_qp_attr:
    return v.ibv_qp_attr(qp_state=v.IBV_QPS_INIT, pkey_index=0, port_num=port,
                         qp_access_flags=access, **kw)


def rtr_attr(dgid: bytes, dest_qpn: int, sgid_index: int = 0, port: int = 1,
             **kw: Any) -> v.ibv_qp_attr:
    ah = v.ibv_ah_attr(grh=v.ibv_global_route(dgid=dgid, sgid_index=sgid_index, hop_limit=1),
                       is_global=1, port_num=port)
    fields = dict(qp_state=v.IBV_QPS_RTR, path_mtu=v.IBV_MTU_1024, dest_qp_num=dest_qpn,
                  rq_psn=0x77, max_dest_rd_atomic=1, min_rnr_timer=12, ah_attr=ah)
    fields.update(kw)
    return v.ibv_qp_attr(**fields)


def rts_attr(**kw: int) -> v.ibv_qp_attr:
    fields = dict(qp_state=v.IBV_QPS_RTS, sq_psn=0x55, timeout=14, retry_cnt=7, rnr_retry=7,
                  max_rd_atomic=1)
    fields.update(kw)
    return v.ibv_qp_attr(**fields)


def to_state(qp: Any, state: int, dgid: bytes = b"", dest_qpn: int = 0) -> None:
    """Walk an RC QP from RESET up to `state` (INIT, RTR or RTS), asserting each step."""
    steps = [(init_attr(), RC_INIT_MASK), (rtr_attr(dgid, dest_qpn), RC_RTR_MASK),
             (rts_attr(), RC_RTS_MASK)]
    for attr, mask in steps[:state]:
        assert v.ibv_modify_qp(qp, attr, mask) == 0


def modify_raw(ctx: Any, cmd: uv.ib_uverbs_modify_qp) -> int:
    """MODIFY_QP with a hand-made request; 0 or the errno."""
    return errno_of(c.execute_write, ctx, uv.IB_USER_VERBS_CMD_MODIFY_QP, cmd, None)
