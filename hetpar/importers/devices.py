"""Device names used by other planners -> hetpar GPU catalog names (a documented table)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from hetpar import catalog
from hetpar.errors import ConfigError

# Alias (matched normalised: upper case, letters and digits only) -> catalog candidates; with a
# reported memory size the closest one wins, otherwise the first. Catalog names themselves
# are always accepted. Documented in docs/exports.md.
ALIASES: dict[str, tuple[str, ...]] = {
    "V100": ("V100-SXM2-32GB", "V100-SXM2-16GB"),
    "V100-16GB": ("V100-SXM2-16GB",),
    "V100-32GB": ("V100-SXM2-32GB",),
    "A100": ("A100-SXM4-80GB", "A100-SXM4-40GB"),
    "A100-40GB": ("A100-SXM4-40GB",),
    "A100-80GB": ("A100-SXM4-80GB",),
    "H100": ("H100-SXM5-80GB", "H100-SXM5-96GB-500W"),
    "H100-80GB": ("H100-SXM5-80GB",),
    "H200": ("H200-SXM-141GB",),
    "B200": ("B200",),
    "GH200": ("GH200-96GB",),
    "L40S": ("L40S",),
    "T4": ("T4-16GB",),
    "RTX2080": ("RTX-2080",),
    "RTX3090": ("RTX-3090",),
    "RTX4090": ("RTX-4090",),
    "TitanRTX": ("Titan-RTX",),
    "MI300X": ("MI300X",),
}


def normalise(name: str) -> str:
    """Upper case, letters and digits only ("a100_80gb" -> "A10080GB")."""
    return re.sub(r"[^A-Z0-9]", "", name.upper())


def known() -> list[str]:
    """Every catalog name and documented alias (for error messages); an alias that only
    respells a catalog name (RTX2080) is not listed again."""
    names = set(catalog.names("gpus"))
    spelt = {normalise(n) for n in names}
    return sorted(names | {a for a in ALIASES if normalise(a) not in spelt})


def resolve(
    name: str, memory_gib: float | None = None, overrides: Mapping[str, str] | None = None
) -> tuple[str, list[str]]:
    """The catalog GPU for a foreign device ``name``, and warnings about the match.

    ``overrides`` (foreign name -> catalog name) come first, then ``ALIASES``, then catalog
    names; an unmappable name is a ConfigError listing what is known.
    """
    for key, target in (overrides or {}).items():
        if normalise(key) == normalise(name):  # the target resolves like any device name
            try:
                return resolve(target, memory_gib)
            except ConfigError:
                raise ConfigError(
                    f"--gpu-map {key}={target}: unknown device type {target!r}; known: "
                    f"{', '.join(known())}"
                ) from None
    by_norm: dict[str, tuple[str, ...]] = {normalise(n): (n,) for n in catalog.names("gpus")}
    by_norm |= {normalise(a): cands for a, cands in ALIASES.items()}
    cands = by_norm.get(normalise(name))
    if cands is None:
        raise ConfigError(
            f"unknown device type {name!r}; known: {', '.join(known())} "
            f"(map others with --gpu-map {name}=<catalog GPU>)"
        )
    if memory_gib is None or len(cands) == 1:
        choice = cands[0]
    else:
        choice = min(cands, key=lambda c: abs(catalog.load_gpu(c).memory_gib - memory_gib))
    warnings = []
    have = catalog.load_gpu(choice).memory_gib
    if memory_gib is not None and abs(have - memory_gib) > 0.1 * have:
        warnings.append(
            f"device {name!r} reports {memory_gib:g} GB; catalog {choice} has {have:g} GiB "
            f"(the catalog value is used)"
        )
    return choice, warnings
