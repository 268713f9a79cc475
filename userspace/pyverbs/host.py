"""The implicit host a pyverbs program runs on.

A real pyverbs program is one process on a host with an RDMA device.  Here the first
pyverbs call that needs the device builds that host: an emulated machine with
ConnectX HCAs (RoCE ports), booted with the kernel modules loaded, and one emulated
process standing for the calling Python process - its uid, CAP_IPC_LOCK when it runs
as root, its RLIMIT_MEMLOCK and its environment (os.environ itself, so a variable the
program sets later, such as MLX5_SHUT_UP_BF, is what libmlx5's getenv() reads).
Every verb then goes through that process's system calls, as with rdma-core.  At
interpreter exit the process exits and the machine is shut down and leak-checked.

Configure it before the first verb, with environment variables or configure():

    PEERMEM_PYVERBS_HCAS=2            ConnectX functions (default 1)
    PEERMEM_PYVERBS_RAM_MB=4096       emulated RAM in MiB (default 2048)
    PEERMEM_PYVERBS_PAGE_SIZE=4096    the machine's page size (4096, 16384, 65536)
    PEERMEM_PYVERBS_GPUS=1            NVIDIA GPUs (default 0)
    PEERMEM_PYVERBS_AMD_GPUS=1        AMD GPUs with the amdgpu driver: their render nodes
                                      /dev/dri/renderD128... are what pyverbs' DmaBuf
                                      allocates from (default 1; 0: no render node, so
                                      DmaBuf fails with ENOENT)
    PEERMEM_PYVERBS_PARAMS="mlx5_ib.dyn_uar=1 ib_core.ofed=25.4"
                                      module parameters, module.name=value
                                      (default mlx5_ib.dyn_uar=1; the variable replaces it)
"""

from __future__ import annotations

import atexit
import os
import resource
from typing import Any

from kernel_model.emu.machine import Machine
from kernel_model.emu.platform import rdma_host

CAP_LAST_CAP = 40  # linux/capability.h: CAP_CHECKPOINT_RESTORE
# 2 GiB of RAM: rdma-core's suite touches up to 512 MiB at once (a CQ of max_cqe + 1
# entries, which libmlx5 allocates and initialises before the kernel refuses it)
# mlx5_ib.dyn_uar=1: the kernel of rdma-core v44's distribution (Debian bookworm, 6.1)
# hands out UARs per object (v5.8+), as mlx5dv_devx_alloc_uar and the singleton NC UAR need
DEFAULTS: dict[str, Any] = {"nr_hcas": 1, "ram_mb": 2048, "page_size": 4096, "nr_gpus": 0,
                            "nr_amd_gpus": 1, "params": {"mlx5_ib": {"dyn_uar": 1}}}
_ENV = {"PEERMEM_PYVERBS_HCAS": "nr_hcas", "PEERMEM_PYVERBS_RAM_MB": "ram_mb",
        "PEERMEM_PYVERBS_PAGE_SIZE": "page_size", "PEERMEM_PYVERBS_GPUS": "nr_gpus",
        "PEERMEM_PYVERBS_AMD_GPUS": "nr_amd_gpus"}


class Host:
    """The emulated machine and the process standing for this Python process."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        params: dict[str, dict[str, Any]] = config["params"]
        self.machine: Machine = rdma_host(ram_size=config["ram_mb"] << 20,
                                          page_size=config["page_size"],
                                          nr_hcas=config["nr_hcas"], nr_gpus=config["nr_gpus"],
                                          nr_amd_gpus=config.get("nr_amd_gpus", 0),
                                          name="pyverbs", modules=())
        for mod in ("mlx5_core", "mlx5_ib") + (("nvidia",) if config["nr_gpus"] else ()) + \
                (("amdgpu",) if config.get("nr_amd_gpus", 0) else ()):
            if mod not in self.machine.modules:
                self.machine.load_module(mod, **params.get(mod, {}))
        soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
        root = os.geteuid() == 0
        self.proc = self.machine.spawn(
            "python", uid=os.getuid(), cap_ipc_lock=root,
            rlimit_memlock=None if soft == resource.RLIM_INFINITY else soft)
        if root:  # root's effective set holds every capability (CAP_NET_RAW: RAW QPs)
            self.proc.task.cred.cap_effective = (1 << (CAP_LAST_CAP + 1)) - 1
        # EMU: the emulated process reads the real process's environment, live
        self.proc.environ = os.environ  # type: ignore[assignment]

    def close(self, check_leaks: bool = True) -> None:
        """Exit the process, shut the machine down and (by default) leak-check it."""
        if not getattr(self.machine, "leak_check_expected", True):
            return  # the machine was shut down and checked already (by a test's fixture)
        self.machine.leak_check_expected = False  # checked here, once
        if self.proc.alive:
            self.proc.exit(0)
        if check_leaks:
            self.machine.check_leaks()
        else:
            self.machine.shutdown()


_host: Host | None = None
_config: dict[str, Any] = {}
_generation = 0  # how many hosts were built: objects of an older one are gone with it


def generation() -> int:
    """The current host's number (0 before the first)."""
    return _generation


def _parse_params(text: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        mod, dot, name = key.partition(".")
        if not sep or not dot or not mod or not name:
            raise ValueError(f"PEERMEM_PYVERBS_PARAMS: {item!r} is not module.name=value")
        out.setdefault(mod, {})[name] = int(value, 0) if value.lstrip("-").isdigit() or \
            value.startswith("0x") else value
    return out


def configure(**kwargs: Any) -> None:
    """Set the implicit host's shape (keys of DEFAULTS); only before it is built."""
    if _host is not None:
        raise RuntimeError("pyverbs host: already built; configure() it before the first verb")
    unknown = set(kwargs) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"pyverbs host: unknown settings {sorted(unknown)}")
    _config.update(kwargs)


def config() -> dict[str, Any]:
    """The settings the host is (or will be) built with: defaults, environment, configure()."""
    cfg = dict(DEFAULTS)
    for var, key in _ENV.items():
        if var in os.environ:
            cfg[key] = int(os.environ[var], 0)
    if "PEERMEM_PYVERBS_PARAMS" in os.environ:
        cfg["params"] = _parse_params(os.environ["PEERMEM_PYVERBS_PARAMS"])
    cfg.update(_config)
    return cfg


def host() -> Host:
    """The implicit host, built on first use."""
    global _host, _generation
    if _host is not None and not getattr(_host.machine, "leak_check_expected", True):
        _host = None  # shut down and checked from outside (a test's leak-check fixture)
    if _host is None:
        _generation += 1
        _host = Host(config())
        if _generation == 1:
            atexit.register(shutdown)
    return _host


def current_process() -> Any:
    """The emulated process that stands for this Python process."""
    return host().proc


def shutdown(check_leaks: bool = True) -> None:
    """Tear the implicit host down (at exit, or for a fresh one in a test)."""
    global _host
    h, _host = _host, None
    if h is not None:
        h.close(check_leaks)
