"""`peermem clients`: the peer-memory clients there are, and what each registers.

For every client module that can be loaded by name - the built-in ones in
peermem_clients/ and those installed packages declare in the
`peermem.clients` entry-point group - the tool boots a host with a ConnectX,
a GPU and a CMB device, loads the client (its dependencies first, as
modprobe would) with the parameters given, and reads what it registered
from /sys/kernel/mm/memory_peers/ as a user process would (`ls` and `cat`
of the directories ib_core publishes per registration), then unloads it.

    peermem clients
    peermem clients --param nv_peer_mem:persistent_api_support=0
"""

from __future__ import annotations

from kernel_model.emu.platform import peer_client_modules, rdma_host
from kernel_model.errno import KernelError
from userspace.libc import read_sysfs

PEERS = "/sys/kernel/mm/memory_peers"
HOST_MODULES = ("mlx5_ib", "nvidia", "uio_cmb")


def _describe(module: str) -> str:
    import importlib
    doc = (importlib.import_module(module).__doc__ or "").strip().splitlines()
    return doc[0] if doc else ""


def _registrations(proc) -> list[tuple[str, str]]:
    names = proc.getdents(PEERS)
    if isinstance(names, int):
        return []
    return [(n, (read_sysfs(proc, f"{PEERS}/{n}/version") or "?").strip()) for n in names]


def list_clients(params: dict[str, dict[str, int]]) -> list[dict[str, object]]:
    """One record per client: name, origin, module, summary, and either the
    registrations (name, version) it made when loaded, or the load error."""
    out = []
    for name, origin, module in peer_client_modules():
        m = rdma_host(name="clients", nr_gpus=1, cmb_size=1 << 20, modules=())
        for mod in HOST_MODULES:
            m.load_module(mod)
        rec: dict[str, object] = {"name": name, "origin": origin, "module": module,
                                  "summary": _describe(module)}
        p = m.spawn("ls")
        try:
            m.load_module(name, **params.get(name, {}))
        except KernelError as e:
            rec["error"] = f"load failed: {e}"
        else:
            rec["registers"] = p.run(_registrations, p)
            m.unload_module(name)
        p.exit(0)
        m.check_leaks()
        out.append(rec)
    return out


def print_clients(recs: list[dict[str, object]]) -> None:
    """What list_clients found, a paragraph per client."""
    for rec in recs:
        print(f"{rec['name']}  ({rec['origin']}, {rec['module']})")
        print(f"    {rec['summary']}")
        if "error" in rec:
            print(f"    {rec['error']}")
            continue
        regs = rec["registers"] or [("(nothing)", "")]
        for reg, version in regs:
            print(f"    registers {reg:12} version {version}")


def main(params: dict[str, dict[str, int]]) -> int:
    print_clients(list_clients(params))
    return 0
