"""The plan's forced NCCL algorithm and protocol in ``hetpar run``'s environment."""

from __future__ import annotations

import os

from hetpar.specs.plan import Plan


def apply(plan: Plan, backend: str) -> str:
    """Set the plan's ``NCCL_ALGO`` / ``NCCL_PROTO`` (``Collectives.env``) in this process's
    environment for an NCCL backend: NCCL reads them when a communicator is created, which
    happens after this in every rank (forked ranks inherit the environment; under torchrun
    before ``init_process_group``). Returns one warning line where they cannot apply (gloo
    has no such choice), else ''."""
    env = plan.collectives.env() if plan.collectives else {}
    if not env:
        return ""
    text = " ".join(f"{k}={v}" for k, v in env.items())
    if backend != "nccl":
        return (f"warning: the plan's collectives ({text}) set NCCL's choice; the {backend} "
                "backend has none, so they have no effect on this run")
    os.environ.update(env)
    return ""
