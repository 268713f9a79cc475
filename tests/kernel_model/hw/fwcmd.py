"""Test helpers: issue firmware commands straight to a ConnectX model (no driver).

    st, out = run(hca, "alloc_pd")                      # opcode from the name
    st, out = run(hca, "create_qp", pas=2, qpc__pd=pd)  # "__" is a "." in the field path

`run` sets the opcode, applies the fields (MLX5_SET or MLX5_SET64 by width),
executes and returns (status, out).  `ok` asserts success and returns out.
"""

from __future__ import annotations

from kernel_model.hw.mlx5 import ConnectX
from kernel_model.hw.mlx5_fw import syndrome
from kernel_model.hw.mlx5_ifc import (
    MLX5_ADDR_OF,
    MLX5_CMD_NAMES,
    MLX5_GET,
    MLX5_SET,
    MLX5_SET64,
    IfcStruct,
    cpu_to_be64,
)

OPCODES = {name.lower(): op for op, name in MLX5_CMD_NAMES.items()}
OPCODES["access_register"] = OPCODES["access_reg"]
# the layout stems that are not the opcode's name
OPCODES.update(qp_2err=OPCODES["2err_qp"], qp_2rst=OPCODES["2rst_qp"],
               sqd2rts_qp=OPCODES["sqd_rts_qp"])


def set_field(typ: str, obj: IfcStruct, path: str, value: int) -> None:
    try:
        MLX5_SET(typ, obj, path, value)
    except TypeError as e:
        if "MLX5_SET64" not in str(e):
            raise
        MLX5_SET64(typ, obj, path, value)


def run(hca: ConnectX, name: str, *, flex: dict[str, int] | None = None,
        pas: list[int] | int | None = None, **fields: int) -> tuple[int, IfcStruct]:
    """Execute command `name` with `fields`; pas=n (n entries) or a list of addresses."""
    flex = dict(flex or {})
    addrs = None
    if pas is not None:
        addrs = list(range(0x100000, 0x100000 + pas * 0x1000, 0x1000)) if isinstance(
            pas, int) else pas
        flex["klm_pas_mtt" if name == "create_mkey" else "pas"] = len(addrs)
    in_ = IfcStruct(f"{name}_in", **flex)
    MLX5_SET(f"{name}_in", in_, "opcode", OPCODES[name])
    for key, value in fields.items():
        set_field(f"{name}_in", in_, key.replace("__", "."), value)
    if addrs is not None:
        arr = MLX5_ADDR_OF(f"{name}_in", in_, "klm_pas_mtt" if name == "create_mkey" else "pas")
        for i, a in enumerate(addrs):
            arr[i] = cpu_to_be64(a)
    out = IfcStruct(f"{name}_out")
    status = hca.fw.execute(in_, out)
    assert MLX5_GET("mbox_out", out, "status") == status
    return status, out


def ok(hca: ConnectX, name: str, **kw) -> IfcStruct:
    status, out = run(hca, name, **kw)
    assert status == 0, (name, hex(status), hex(MLX5_GET("mbox_out", out, "syndrome")))
    return out


def fails(hca: ConnectX, name: str, status: int, check: str, **kw) -> None:
    """The command fails with `status` and the syndrome of the named check."""
    got, out = run(hca, name, **kw)
    assert (got, MLX5_GET("mbox_out", out, "syndrome")) == (status, syndrome(check)), (
        name, hex(got), check)


def bring_up(hca: ConnectX) -> None:
    ok(hca, "enable_hca")
    ok(hca, "init_hca")


def ladder(hca: ConnectX, uid: int = 0, eqn: int | None = None) -> dict[str, int]:
    """UAR, PD, EQ (unless given: EQs are the kernel's), CQ (2^6 x 64 B = one page):
    the objects a QP needs."""
    uar = MLX5_GET("alloc_uar_out", ok(hca, "alloc_uar", uid=uid), "uar")
    pd = MLX5_GET("alloc_pd_out", ok(hca, "alloc_pd", uid=uid), "pd")
    if eqn is None:
        eqn = MLX5_GET("create_eq_out", ok(hca, "create_eq", pas=16,
                                           eq_context_entry__log_eq_size=10,
                                           eq_context_entry__uar_page=uar), "eq_number")
    cqn = MLX5_GET("create_cq_out", ok(hca, "create_cq", uid=uid, pas=1,
                                       cq_context__log_cq_size=6,
                                       cq_context__uar_page=uar,
                                       cq_context__c_eqn_or_apu_element=eqn), "cqn")
    return {"uar": uar, "pd": pd, "eqn": eqn, "cqn": cqn}


def qp_fields(objs: dict[str, int], **over: int) -> dict[str, int]:
    """An RC QP: RQ 2^6 x 16 B, SQ 2^8 x 64 B = 17408 bytes, 5 pages."""
    f = dict(qpc__st=0, qpc__pm_state=3, qpc__pd=objs["pd"], qpc__uar_page=objs["uar"],
             qpc__log_rq_size=6, qpc__log_rq_stride=0, qpc__log_sq_size=8,
             qpc__cqn_snd=objs["cqn"], qpc__cqn_rcv=objs["cqn"], qpc__dbr_addr=0x200040,
             qpc__user_index=1, qpc__ts_format=1)
    f.update(over)
    return f
