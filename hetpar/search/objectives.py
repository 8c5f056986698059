"""Search objectives (throughput, cost per token, budget, fewest GPUs) and GPU prices."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from hetpar.catalog import gpu_spec
from hetpar.errors import ConfigError, Infeasible
from hetpar.formulas import attention_core_flops_per_token, model_flops_per_token
from hetpar.io import check_name, parse_float, read_document
from hetpar.search.robust import Uncertainty
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec

OBJECTIVES = ("throughput", "cost", "budget", "min_gpus", "robust")
PRICES_FILE = Path(__file__).resolve().parent.parent / "catalog" / "prices" / "gpu-hour.toml"
Score = tuple[float, ...]


@dataclass(frozen=True, kw_only=True)
class Objective:
    """What to maximise. Scores are tuples compared lexicographically (higher is better)."""

    name: str = "throughput"
    prices: tuple[tuple[str, float], ...] = ()
    """(GPU name or name fragment, $ per GPU-hour); a later entry for a key wins."""
    budget_per_hour: float | None = None
    target_tokens_per_s: float | None = None
    uncertainty: Uncertainty = Uncertainty()
    """How wrong the cost model may be: the intervals, P(#1 beats #2), the reorder report
    and the ``robust`` objective (a low quantile of tokens/s) use it."""

    def __post_init__(self) -> None:
        if self.name not in OBJECTIVES:
            raise ConfigError(f"objective {self.name!r} unknown; allowed: {', '.join(OBJECTIVES)}")
        if self.name == "budget" and (self.budget_per_hour is None or self.budget_per_hour <= 0):
            raise ConfigError("objective budget: --budget must be a positive $/hour")
        if self.name == "min_gpus" and (
            self.target_tokens_per_s is None or self.target_tokens_per_s <= 0
        ):
            raise ConfigError("objective min_gpus: --target must be a positive tokens/s")

    @property
    def needs_prices(self) -> bool:
        return self.name in ("cost", "budget")

    def price_of(self, gpu: str) -> float:
        """$ per GPU-hour of ``gpu``: exact name, else the longest key contained in it."""
        table = dict(self.prices)
        if gpu in table:
            return table[gpu]
        hits = sorted((k for k in table if k.lower() in gpu.lower()), key=len, reverse=True)
        if not hits:
            known = ", ".join(sorted(table)) or "none"
            raise ConfigError(
                f"price: no price for GPU {gpu!r}; known: {known} (use --price {gpu}=USD)"
            )
        return table[hits[0]]

    def admissible(self, price_per_hour: float) -> bool:
        """Whether a plan costing ``price_per_hour`` may be considered at all (the budget)."""
        return self.budget_per_hour is None or price_per_hour <= self.budget_per_hour * (1 + 1e-9)

    def score(self, tokens_per_s: float, gpus: int, price_per_hour: float) -> Score:
        """The ranking key of a plan; also used with an upper bound on tokens/s as its bound.
        ``robust`` searches by tokens/s; the planner re-ranks by ``robust.robust_score``."""
        if self.name == "cost":
            return (tokens_per_s * 3600.0 / price_per_hour,)
        if self.name == "min_gpus":
            assert self.target_tokens_per_s is not None
            reached = 1.0 if tokens_per_s >= self.target_tokens_per_s else 0.0
            return (reached, -float(gpus) if reached else 0.0, tokens_per_s)
        return (tokens_per_s,)

    def describe(self) -> str:
        """One line naming the objective and its parameters."""
        if self.name == "cost":
            return "most tokens per dollar"
        if self.name == "budget":
            return f"highest throughput under ${self.budget_per_hour:g}/hour"
        if self.name == "min_gpus":
            return f"fewest GPUs reaching {self.target_tokens_per_s:g} tokens/s"
        if self.name == "robust":
            q = self.uncertainty.quantile
            return (f"smallest worst loss under alternative network models, then highest "
                    f"{q:.0%} quantile of tokens/s (robust to cost-model error)")
        return "highest throughput (tokens/s)"


def load_prices(path: str | None = None) -> tuple[tuple[str, float], ...]:
    """GPU prices from a TOML file of ``"GPU name" = USD per GPU-hour`` (default: bundled)."""
    p = Path(path) if path else PRICES_FILE
    data = read_document(p)
    out = []
    for k, v in data.items():
        check_name(k, f"{p.name}: price name")
        if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
            raise ConfigError(f"{p.name}: price {k!r} = {v!r} not allowed; allowed: a finite "
                              "number > 0 ($ per GPU-hour)")
        out.append((k, float(v)))
    return tuple(out)


def parse_prices(text: str) -> tuple[tuple[str, float], ...]:
    """``H100=2.5,A100=1.2`` -> (("H100", 2.5), ("A100", 1.2))."""
    out = []
    for item in text.split(","):
        if not item.strip():
            continue
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise ConfigError(f"--price: {item!r} is not GPU=USD_per_hour (e.g. H100=2.5)")
        try:  # the one strict parser: "2_5" and full-width digits are no price
            price = parse_float(v, "--price")
        except ConfigError:
            price = math.nan
        if not 0 < price < math.inf:  # nan fails both comparisons
            raise ConfigError(f"--price {k.strip()}={v.strip()!r} not allowed; allowed: a "
                              "finite number > 0 ($ per GPU-hour)")
        out.append((k.strip(), price))
    return tuple(out)


def throughput_bound(model: ModelSpec, cluster: ClusterSpec, seq_len: int) -> float:
    """A proven upper bound on any plan's tokens/s on ``cluster``: every GPU at its highest
    dense peak (of any precision) doing nothing but the weight GEMMs of training, 3 x 2 FLOPs
    per weight per token (forward + twice for the backward, Narayanan et al. SC'21 Sec. 5.1;
    ``formulas.flops``). Attention, recompute, communication and efficiency below 1
    (``EfficiencyTable`` fractions are in (0, 1]) only lower what a plan reaches."""
    peak = sum(g.num_gpus * max(gpu_spec(g.gpu).peak_tflops.values()) * 1e12
               for g in cluster.node_groups)
    weights = model_flops_per_token(model, seq_len) - (
        3.0 * model.n_layers * attention_core_flops_per_token(model, seq_len))
    return peak / weights


def check_reachable(objective: Objective, model: ModelSpec, cluster: ClusterSpec,
                    seq_len: int) -> None:
    """Infeasible at once for a ``min_gpus`` target above ``throughput_bound``: no search
    through every plan can reach it (the search took minutes to say so)."""
    target = objective.target_tokens_per_s
    if objective.name != "min_gpus" or target is None:
        return
    bound = throughput_bound(model, cluster, seq_len)
    if target > bound:
        raise Infeasible("target", f"--target {target:,.0f} tokens/s is above {bound:,.0f} "
                         f"tokens/s, what all {cluster.num_gpus} GPUs of {cluster.name} would "
                         f"reach at peak FLOP/s doing only {model.name}'s weight GEMMs "
                         "(an upper bound on every plan)")
