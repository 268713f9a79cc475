"""Mirrors drivers/net/ethernet/mellanox/mlx5/core/eq.c: the completion event queues.

mlx5_eq_table_create() makes one completion EQ per vector (CREATE_EQ with a
zeroed buffer of MLX5_COMP_EQ_SIZE 64-byte entries, the core's UAR for its
doorbell, the vector as interrupt); a CQ names its EQ by number
(cqc.c_eqn_or_apu_element), which mlx5_comp_eqn_get() hands out, and the EQ
keeps the CQs attached to it (mlx5_eq_add_cq / mlx5_eq_del_cq).

Completion events: the HCA writes an EQE (type COMP, the CQN) into the EQ of an
armed CQ that got a CQE and raises the EQ's MSI-X vector; mlx5_eq_comp_int()
takes every EQE software owns (owner bit = the pass parity of the consumer
index), calls the CQ's comp handler (mlx5_ib: the CQ's ib comp_handler) and
writes the consumer index back, re-arming the EQ.

Asynchronous events: create_async_eqs() makes the async EQ (MLX5_NUM_ASYNC_EQE
entries, the MLX5_ASYNC_EVENT_MASK events: QP, SRQ, CQ and port events) before the
completion EQs; its interrupt, mlx5_eq_async_int(), hands each EQE to the
notifier chain of its type and to the NOTIFY_ANY chain (where events.py forwards
it to the interfaces - mlx5_ib's SRQ table, ...), then re-arms the EQ.

# EMU: the command and page-request EQs are not created (commands are
# polled, the firmware needs no pages).  The emulated machine has one
# completion vector; the async EQ has a vector of its own
# (MLX5_EMU_ASYNC_EQ_VECTOR; the kernel's shares the control vector 0).
# The buffer comes from the page allocator, its physical address standing in
# for the DMA address (dma_alloc_coherent is not modelled); the handler reads
# it through the direct map (phys_read).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from drivers.mlx5_core.cmd import mlx5_cmd_exec
from drivers.mlx5_core.driver import mlx5_core_warn
from drivers.mlx5_core.ifc import (
    MLX5_ADAPTER_PAGE_SHIFT,
    MLX5_ADDR_OF,
    MLX5_CMD_OP_CREATE_EQ,
    MLX5_CMD_OP_DESTROY_EQ,
    MLX5_EQ_DOORBEL_OFFSET,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
    cpu_to_be64,
)
from kernel_model.current import current
from kernel_model.errno import EINVAL, ENOENT, KernelError
from kernel_model.interrupt import IRQ_HANDLED, free_irq, request_irq
from kernel_model.notifier import (
    ATOMIC_INIT_NOTIFIER_HEAD,
    atomic_notifier_call_chain,
    atomic_notifier_chain_register,
    atomic_notifier_chain_unregister,
    atomic_notifier_head,
    notifier_block,
)
from kernel_model.page_alloc import __GFP_ZERO, GFP_KERNEL, __free_pages, alloc_pages, page_to_phys
from kernel_model.pci import iowrite32be
from kernel_model.trace import traced

if TYPE_CHECKING:
    from drivers.mlx5_core.cq import mlx5_core_cq
    from drivers.mlx5_core.driver import mlx5_core_dev
    from kernel_model.page_alloc import page

MLX5_COMP_EQ_SIZE = 1024
MLX5_EQE_SIZE = 64
MLX5_EQE_OWNER_INIT_VAL = 0x1
MLX5_EVENT_TYPE_COMP = 0x0
MLX5_EQ_POLLING_BUDGET = 128
EQE_TYPE, EQE_COMP_CQN, EQE_OWNER = 1, 56, 63   # struct mlx5_eqe offsets
MLX5_EMU_COMP_VECTORS = 1
MLX5_NUM_ASYNC_EQE = 0x1000
# EMU: see the module docstring (vector 1 is the ODP page-fault EQ's)
MLX5_EMU_ASYNC_EQ_VECTOR = 2

# enum mlx5_event: the asynchronous event types (the EQE's type byte)
MLX5_EVENT_TYPE_PATH_MIG = 0x01
MLX5_EVENT_TYPE_COMM_EST = 0x02
MLX5_EVENT_TYPE_SQ_DRAINED = 0x03
MLX5_EVENT_TYPE_SRQ_LAST_WQE = 0x13
MLX5_EVENT_TYPE_SRQ_RQ_LIMIT = 0x14
MLX5_EVENT_TYPE_CQ_ERROR = 0x04
MLX5_EVENT_TYPE_WQ_CATAS_ERROR = 0x05
MLX5_EVENT_TYPE_PATH_MIG_FAILED = 0x07
MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR = 0x10
MLX5_EVENT_TYPE_WQ_ACCESS_ERROR = 0x11
MLX5_EVENT_TYPE_SRQ_CATAS_ERROR = 0x12
MLX5_EVENT_TYPE_PORT_CHANGE = 0x09
MLX5_EVENT_TYPE_NOTIFY_ANY = 0xE9
MLX5_EVENT_TYPE_MAX = 0x100
MLX5_ASYNC_EVENT_MASK = sum(1 << t for t in (
    MLX5_EVENT_TYPE_PATH_MIG, MLX5_EVENT_TYPE_COMM_EST, MLX5_EVENT_TYPE_SQ_DRAINED,
    MLX5_EVENT_TYPE_CQ_ERROR, MLX5_EVENT_TYPE_WQ_CATAS_ERROR,
    MLX5_EVENT_TYPE_PATH_MIG_FAILED, MLX5_EVENT_TYPE_WQ_INVAL_REQ_ERROR,
    MLX5_EVENT_TYPE_WQ_ACCESS_ERROR, MLX5_EVENT_TYPE_PORT_CHANGE,
    MLX5_EVENT_TYPE_SRQ_CATAS_ERROR, MLX5_EVENT_TYPE_SRQ_LAST_WQE,
    MLX5_EVENT_TYPE_SRQ_RQ_LIMIT))
EQE_QP_SRQ_TYPE, EQE_QP_SRQ_N = 52, 56    # struct mlx5_eqe_qp_srq in the EQE's data


class mlx5_eq:
    """Mirrors struct mlx5_eq (and mlx5_eq_comp): number, size, buffer, doorbell, CQs."""

    def __init__(self, nent: int, vecidx: int):
        self.eqn = 0
        self.nent, self.vecidx = nent, vecidx
        self.buf: page | None = None
        self.order = 0
        self.doorbell = 0
        self.cons_index = 0
        self.dev: mlx5_core_dev | None = None
        self.irq_requested = False
        self.cq_table: dict[int, mlx5_core_cq] = {}

    def __repr__(self) -> str:
        return f"mlx5_eq {self.eqn:#x} nent {self.nent} vec {self.vecidx} cqs {len(self.cq_table)}"


class mlx5_eq_table:
    """Mirrors struct mlx5_eq_table: the async EQ, the completion EQs by vector, and
    the notifier chains by event type (nh[MLX5_EVENT_TYPE_NOTIFY_ANY] gets them all)."""

    def __init__(self) -> None:
        self.comp_eqs: list[mlx5_eq] = []
        self.async_eq: mlx5_eq | None = None
        self.nh: dict[int, atomic_notifier_head] = {}   # ATOMIC_INIT_NOTIFIER_HEAD each


@traced
def create_map_eq(dev: mlx5_core_dev, eq: mlx5_eq, mask: int = 0) -> None:
    """Mirrors create_map_eq(): buffer, CREATE_EQ (the events of `mask` besides
    completions), doorbell address."""
    machine = current().machine
    nbytes = eq.nent * MLX5_EQE_SIZE
    npages = -(-nbytes // machine.page_size)
    eq.order = (npages - 1).bit_length()
    eq.buf = alloc_pages(GFP_KERNEL | __GFP_ZERO, eq.order, f"mlx5 eq {dev.priv.name}")
    init_eq_buf(dev, eq)
    try:
        in_ = IfcStruct("create_eq_in", pas=1 << eq.order)
        pas = MLX5_ADDR_OF("create_eq_in", in_, "pas")
        base = page_to_phys(eq.buf)
        for i in range(1 << eq.order):  # mlx5_fill_page_frag_array()
            pas[i] = cpu_to_be64(base + i * machine.page_size)
        MLX5_SET("create_eq_in", in_, "opcode", MLX5_CMD_OP_CREATE_EQ)
        MLX5_SET64("create_eq_in", in_, "event_bitmask", mask)
        eqc = MLX5_ADDR_OF("create_eq_in", in_, "eq_context_entry")
        MLX5_SET("eqc", eqc, "log_eq_size", (eq.nent - 1).bit_length())
        MLX5_SET("eqc", eqc, "uar_page", dev.priv.uar.index)
        MLX5_SET("eqc", eqc, "intr", eq.vecidx)
        MLX5_SET("eqc", eqc, "log_page_size", machine.page_shift - MLX5_ADAPTER_PAGE_SHIFT)
        out = IfcStruct("create_eq_out")
        mlx5_cmd_exec(dev, in_, out)
    except BaseException:
        __free_pages(eq.buf, eq.order)  # err_buf:
        eq.buf = None
        raise
    eq.eqn = MLX5_GET("create_eq_out", out, "eq_number")
    eq.doorbell = dev.priv.uar.map + MLX5_EQ_DOORBEL_OFFSET


def init_eq_buf(dev: mlx5_core_dev, eq: mlx5_eq) -> None:
    """Mirrors init_eq_buf(): every EQE's owner bit = MLX5_EQE_OWNER_INIT_VAL (hardware's)."""
    eqe = bytes(MLX5_EQE_SIZE - 1) + bytes([MLX5_EQE_OWNER_INIT_VAL])
    dev.pdev.machine.phys_write(page_to_phys(eq.buf), eqe * eq.nent)


def next_eqe_sw(dev: mlx5_core_dev, eq: mlx5_eq) -> bytes | None:
    """Mirrors next_eqe_sw(): the EQE at the consumer index if software owns it."""
    at = page_to_phys(eq.buf) + (eq.cons_index & (eq.nent - 1)) * MLX5_EQE_SIZE
    eqe = dev.pdev.machine.phys_read(at, MLX5_EQE_SIZE)
    return None if (eqe[EQE_OWNER] & 1) ^ bool(eq.cons_index & eq.nent) else eqe


def eq_update_ci(eq: mlx5_eq, arm: bool) -> None:
    """Mirrors eq_update_ci(): the consumer index (and the EQ number) to the EQ
    doorbell, the arming one (offset 0) or not (offset 8)."""
    iowrite32be((eq.cons_index & 0xFFFFFF) | eq.eqn << 24, eq.doorbell + (0 if arm else 8))


@traced
def mlx5_eq_comp_int(vector: int, eq: mlx5_eq) -> int:
    """Mirrors mlx5_eq_comp_int(): for each EQE software owns (at most the polling
    budget), the CQ it names gets arm_sn + 1 and its comp handler (a bogus CQN is
    skipped); then the consumer index goes back with the EQ re-armed."""
    dev = eq.dev
    n = 0
    while n < MLX5_EQ_POLLING_BUDGET:
        eqe = next_eqe_sw(dev, eq)
        if eqe is None:
            break
        if eqe[EQE_TYPE] == MLX5_EVENT_TYPE_COMP:
            cqn = int.from_bytes(eqe[EQE_COMP_CQN:EQE_COMP_CQN + 4], "big") & 0xFFFFFF
            cq = eq.cq_table.get(cqn)              # mlx5_eq_cq_get()
            if cq is not None:
                cq.arm_sn += 1
                if cq.comp is not None:
                    cq.comp(cq, eqe)
        eq.cons_index += 1
        n += 1
    eq_update_ci(eq, True)
    return IRQ_HANDLED


@traced
def destroy_unmap_eq(dev: mlx5_core_dev, eq: mlx5_eq) -> None:
    """Mirrors destroy_unmap_eq(): DESTROY_EQ (a failure is only warned about), free."""
    in_ = IfcStruct("destroy_eq_in")
    MLX5_SET("destroy_eq_in", in_, "opcode", MLX5_CMD_OP_DESTROY_EQ)
    MLX5_SET("destroy_eq_in", in_, "eq_number", eq.eqn)
    try:
        mlx5_cmd_exec(dev, in_, IfcStruct("destroy_eq_out"))
    except KernelError as e:
        mlx5_core_warn(dev, f"failed to destroy a previously created eq: eqn {eq.eqn}: {e}")
    if eq.buf is not None:
        __free_pages(eq.buf, eq.order)
        eq.buf = None


class mlx5_nb(notifier_block):
    """Mirrors struct mlx5_nb: a notifier block for one event type (MLX5_NB_INIT)."""

    def __init__(self, notifier_call: object, event_type: int):
        super().__init__(notifier_call)
        self.event_type = event_type


@traced
def mlx5_eq_async_int(vector: int, eq: mlx5_eq) -> int:
    """Mirrors mlx5_eq_async_int(): each EQE software owns goes to the chain of its
    type, then to the NOTIFY_ANY chain; the consumer index goes back, EQ re-armed."""
    dev = eq.dev
    nh = dev.priv.eq_table.nh
    n = 0
    while n < MLX5_EQ_POLLING_BUDGET:
        eqe = next_eqe_sw(dev, eq)
        if eqe is None:
            break
        etype = eqe[EQE_TYPE]
        atomic_notifier_call_chain(nh[etype], etype, eqe)
        atomic_notifier_call_chain(nh[MLX5_EVENT_TYPE_NOTIFY_ANY], etype, eqe)
        eq.cons_index += 1
        n += 1
    eq_update_ci(eq, True)
    return IRQ_HANDLED


@traced
def mlx5_eq_notifier_register(dev: mlx5_core_dev, nb: mlx5_nb) -> int:
    """Mirrors mlx5_eq_notifier_register(): nb on the chain of its event type."""
    return atomic_notifier_chain_register(dev.priv.eq_table.nh[nb.event_type], nb)


@traced
def mlx5_eq_notifier_unregister(dev: mlx5_core_dev, nb: mlx5_nb) -> int:
    """Mirrors mlx5_eq_notifier_unregister()."""
    return atomic_notifier_chain_unregister(dev.priv.eq_table.nh[nb.event_type], nb)


@traced
def create_async_eqs(dev: mlx5_core_dev) -> None:
    """Mirrors create_async_eqs() for the async EQ: MLX5_NUM_ASYNC_EQE entries taking
    the MLX5_ASYNC_EVENT_MASK events, mlx5_eq_async_int as its interrupt, armed."""
    table = dev.priv.eq_table
    eq = mlx5_eq(MLX5_NUM_ASYNC_EQE, MLX5_EMU_ASYNC_EQ_VECTOR)
    eq.dev = dev
    create_map_eq(dev, eq, MLX5_ASYNC_EVENT_MASK)
    table.async_eq = eq
    request_irq(dev.pdev, eq.vecidx, mlx5_eq_async_int, "mlx5_async_eq", eq)
    eq.irq_requested = True
    eq_update_ci(eq, True)


@traced
def destroy_async_eqs(dev: mlx5_core_dev) -> None:
    """Mirrors destroy_async_eqs(): the handler off, DESTROY_EQ, the buffer freed."""
    table = dev.priv.eq_table
    eq, table.async_eq = table.async_eq, None
    if eq is None:
        return
    if eq.irq_requested:
        free_irq(dev.pdev, eq.vecidx, eq)
    destroy_unmap_eq(dev, eq)


@traced
def mlx5_eq_table_create(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_eq_table_init() (the notifier chains) + mlx5_eq_table_create():
    create_async_eqs(), then create_comp_eqs()."""
    table = dev.priv.eq_table = mlx5_eq_table()
    for i in range(MLX5_EVENT_TYPE_MAX):
        table.nh[i] = ATOMIC_INIT_NOTIFIER_HEAD(f"eq_table->nh[{i:#x}]")
    try:
        create_async_eqs(dev)
        for vec in range(MLX5_EMU_COMP_VECTORS):
            eq = mlx5_eq(MLX5_COMP_EQ_SIZE, vec)
            create_map_eq(dev, eq)
            table.comp_eqs.append(eq)
            eq.dev = dev
            request_irq(dev.pdev, vec, mlx5_eq_comp_int, f"mlx5_comp{vec}", eq)
            eq.irq_requested = True
            eq_update_ci(eq, True)
    except BaseException:
        mlx5_eq_table_destroy(dev)  # clean_eqs:
        raise


@traced
def mlx5_eq_table_destroy(dev: mlx5_core_dev) -> None:
    """Mirrors mlx5_eq_table_destroy(): destroy_comp_eqs(), then destroy_async_eqs()."""
    table = dev.priv.eq_table
    if table is None:
        return
    for eq in reversed(table.comp_eqs):
        if eq.cq_table:
            dev.pdev.machine.report_bug("destroy_comp_eqs", f"{eq!r}: CQs still attached")
        if getattr(eq, "irq_requested", False):
            free_irq(dev.pdev, eq.vecidx, eq)
        destroy_unmap_eq(dev, eq)
    table.comp_eqs = []
    destroy_async_eqs(dev)
    dev.priv.eq_table = None


@traced
def mlx5_eq_create_generic(dev: mlx5_core_dev, nent: int, vecidx: int, mask: int,
                           handler: object, name: str) -> mlx5_eq:
    """Mirrors mlx5_eq_create_generic(): an EQ for a driver's own events (mask), its
    interrupt handler attached.  # EMU: the kernel shares the control vector (0)
    among such EQs; the model's vector 0 is the completion EQ's, so the caller
    names a vector of its own."""
    eq = mlx5_eq(nent, vecidx)
    eq.dev = dev
    create_map_eq(dev, eq, mask)
    try:
        request_irq(dev.pdev, vecidx, handler, name, eq)
    except BaseException:
        destroy_unmap_eq(dev, eq)
        raise
    eq.irq_requested = True
    return eq


@traced
def mlx5_eq_destroy_generic(dev: mlx5_core_dev, eq: mlx5_eq) -> None:
    """Mirrors mlx5_eq_destroy_generic(): detach the handler, DESTROY_EQ, free the buffer."""
    if eq.irq_requested:
        free_irq(dev.pdev, eq.vecidx, eq)
        eq.irq_requested = False
    destroy_unmap_eq(dev, eq)


def mlx5_comp_vectors_max(dev: mlx5_core_dev) -> int:
    """Mirrors mlx5_comp_vectors_max()."""
    return MLX5_EMU_COMP_VECTORS


def mlx5_comp_eqn_get(dev: mlx5_core_dev, vecidx: int) -> int:
    """Mirrors mlx5_comp_eqn_get(): the EQ number for a completion vector (EINVAL/ENOENT)."""
    table = dev.priv.eq_table
    if table is None or not table.comp_eqs:
        raise KernelError(ENOENT, "mlx5_comp_eqn_get: no completion EQs")
    if not 0 <= vecidx < len(table.comp_eqs):
        raise KernelError(EINVAL, f"mlx5_comp_eqn_get: vector {vecidx} out of range")
    return table.comp_eqs[vecidx].eqn


def mlx5_eqn2comp_eq(dev: mlx5_core_dev, eqn: int) -> mlx5_eq:
    """Mirrors mlx5_eqn2comp_eq(): the completion EQ with that number (ENOENT)."""
    for eq in dev.priv.eq_table.comp_eqs if dev.priv.eq_table else []:
        if eq.eqn == eqn:
            return eq
    raise KernelError(ENOENT, f"mlx5_eqn2comp_eq: no completion EQ {eqn:#x}")
