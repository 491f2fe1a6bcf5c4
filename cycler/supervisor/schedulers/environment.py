"""Defaults ``cycle run`` takes from the scheduler's environment: Slurm's and ISC's variables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cycler.errors import ConfigError
from cycler.protocol.environment import default_checkpoint_root
from cycler.supervisor.schedulers.slurm import expand_nodelist

_DEFAULT_MASTER_PORT_BASE = 20000
NNODES_VARIABLES = ("NNODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
NPROC_VARIABLES = ("N_PROC", "SLURM_GPUS_ON_NODE")
NODE_RANK_VARIABLES = ("NODE_RANK", "SLURM_NODEID")
"""Where each default is read from, the first one set wins (ISC's names, then Slurm's)."""


def scheduler_defaults(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Defaults from Slurm/ISC variables: (always applied, applied only to multi-node runs)."""
    general: dict[str, Any] = {"checkpoint_dir": str(default_checkpoint_root(environ))}
    _set_int(general, "nnodes", environ, *NNODES_VARIABLES)
    _set_int(general, "nproc_per_node", environ, *NPROC_VARIABLES)
    _set_int(general, "node_rank", environ, *NODE_RANK_VARIABLES)
    if "node_rank" not in general and environ.get("NNODES") and not environ.get("LOCAL_RANK"):
        # ISC's launch commands pass `--node_rank=$RANK`: there RANK is the node's rank. Inside
        # a torchrun worker (LOCAL_RANK set) RANK is a process rank, so it is not used there.
        _set_int(general, "node_rank", environ, "RANK")
    if environ.get("SLURM_JOB_ID"):
        general["slurm_job_id"] = environ["SLURM_JOB_ID"]
        general["requeue"] = True
        _set_int(general, "requeue_count", environ, "SLURM_RESTART_COUNT")
    return general, _rendezvous_defaults(environ)


def _rendezvous_defaults(environ: Mapping[str, str]) -> dict[str, Any]:
    rendezvous: dict[str, Any] = {}
    if environ.get("MASTER_ADDR"):
        rendezvous["master_addr"] = environ["MASTER_ADDR"]
    elif environ.get("SLURM_JOB_NODELIST"):
        rendezvous["master_addr"] = expand_nodelist(environ["SLURM_JOB_NODELIST"])[0]
    _set_int(rendezvous, "master_port", environ, "MASTER_PORT")
    job_id = environ.get("SLURM_JOB_ID", "")
    if "master_port" not in rendezvous and job_id.isdigit():
        # Every node derives the same port from the job id; jobs sharing a host rarely collide.
        rendezvous["master_port"] = _DEFAULT_MASTER_PORT_BASE + int(job_id) % 20000
    return rendezvous


def _set_int(target: dict[str, Any], key: str, environ: Mapping[str, str], *names: str) -> None:
    for name in names:
        text = environ.get(name)
        if not text:
            continue
        try:
            target[key] = int(text.split("(")[0])  # SLURM_* may read like "2(x3)"
        except ValueError:
            raise ConfigError(f"environment variable {name}={text!r} is not a whole number; "
                              "fix or unset it") from None
        return
