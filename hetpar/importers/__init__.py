"""Cluster descriptions from other planners' formats (Metis, ASTRA-sim) -> hetpar clusters."""

from hetpar.importers.astrasim import read_astrasim
from hetpar.importers.devices import ALIASES, resolve
from hetpar.importers.metis import read_metis

FORMATS = ("metis", "astra-sim")

__all__ = ["ALIASES", "FORMATS", "read_astrasim", "read_metis", "resolve"]
