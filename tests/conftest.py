"""Shared fixtures: a two-node local Ray cluster, started once for the tests that ask for it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from loadscale import deadline


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """The hang guard of every test (pyproject's ``timeout``) stretched by the machine's load
    (``loadscale.deadline``), unless given on the command line or in PYTEST_TIMEOUT."""
    if config.getvalue("timeout") is None and "PYTEST_TIMEOUT" not in os.environ:
        ini = config.getini("timeout")
        if ini:
            config.option.timeout = deadline(float(ini))


@pytest.fixture(scope="session")
def ray_two_nodes() -> Iterator[Any]:
    """A head and a worker node (one CPU each, small object stores) on this machine, started
    by the first test that asks for it (about 10 s) and shut down at the end of the session.
    Tests use its ``address`` (``--workers ray:ADDRESS``); none stays connected."""
    ray = pytest.importorskip("ray", reason="ray extra not installed: pip install -e .[ray]")
    cluster_utils = pytest.importorskip("ray.cluster_utils", reason="ray is partly installed")
    args = {"num_cpus": 1, "object_store_memory": 80 * 2**20, "include_dashboard": False}
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args=args)
    try:
        cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        alive = [n for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU")]
        ray.shutdown()
        assert len(alive) == 2
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()  # ends the processes this cluster started, and only those
