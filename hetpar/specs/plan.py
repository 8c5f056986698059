"""Plan description: uniform degrees as a shorthand for explicit replicas of pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from hetpar.errors import ConfigError
from hetpar.specs import axes as axis_table
from hetpar.specs.axes import BUILTIN
from hetpar.specs.collectives import Collectives
from hetpar.specs.gpu import DEFAULT_PRECISION, Precision
from hetpar.specs.stage import Replica

Recompute = Literal["none", "selective", "full"]
FailurePolicy = Literal["ntp", "drop"]
P2PSplit = Literal["scatter-gather", "forward", "none"]
ZeroScope = Literal["all", "group"]
EXPERT_SPLITS = ("even", "by_speed")
"""The named forms of ``Plan.experts_per_rank`` (a list of counts is the explicit form)."""
AXES = tuple(a.name for a in BUILTIN)
MAX_GLOBAL_BATCH = 1 << 24
"""The most sequences an iteration may hold (16,777,216): thousands of times the published
batches (Llama 3 405B: 2,048 sequences of 8K tokens, Dubey et al. 2024, Table 4); a larger one
is a typo, which priced gives an iteration of years and no error."""


def check_batch(batch: int, where: str) -> None:
    """ConfigError unless ``batch`` is at most ``MAX_GLOBAL_BATCH`` sequences."""
    if batch > MAX_GLOBAL_BATCH:
        raise ConfigError(f"{where} {batch} not allowed; allowed: 1..{MAX_GLOBAL_BATCH:,}")
"""The device axes ("tp", "cp", "dp", "pp"; rows of ``specs/axes.py``), which ``order`` permutes."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A hybrid-parallel plan: either uniform degrees or an explicit list of replicas."""

    name: str = ""
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; >1 for interleaved schedules."""
    micro_batch: int = 1
    global_batch: int | None = None
    """Sequences per iteration; for explicit replicas, the sum of their batches."""
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    recompute: Recompute = "none"
    zero: int = 0
    """0 plain DP, 1 optimizer state sharded, 2 + gradients, 3 + parameters (FSDP)."""
    zero_scope: ZeroScope = "all"
    """Which data-parallel peers a ZeRO stage shards over. ``all``: every replica (one ZeRO
    group). ``group``: only the replicas on the same node group (GPU type), which keep a
    copy each; their gradient shards are then all-reduced across the node groups, once per
    iteration (hybrid sharding: PyTorch FSDP ``ShardingStrategy.HYBRID_SHARD``, which shards
    within a node and replicates across; here the shard group is the GPU type)."""
    precision: Precision = DEFAULT_PRECISION
    """bf16 when not written; a stated precision wins over a job's default (resolve_precision)."""
    attention: str = ""
    """Attention kernel override (flash, fused, unfused); blank: the job's framework's."""
    group: str | None = None
    """Uniform plans: the node group to run on (default: all groups, in order)."""
    order: str = "tp-cp-dp-pp"
    """Uniform plans: how ranks map to devices, innermost axis first (Megatron's default)."""
    replicas: tuple[Replica, ...] = ()
    uneven_tp: bool = False
    """Explicit replicas only: a stage's TP need not split the heads, KV heads and MLP width
    evenly (nonuniform tensor parallelism, Arfeen et al. 2025; the simulator costs the largest
    shard). Off (the default), every stage meets the uniform plan's rule
    (``feasibility.tp_shards``). The NTP plans of ``hetpar failures --write-plan`` set it; the
    runtime cannot run uneven shards and refuses them."""
    on_failure: FailurePolicy = "ntp"
    p2p_split: P2PSplit | None = None
    """How a TP group sends activations between pipeline stages; None: the framework profile's
    choice (catalog/frameworks). ``scatter-gather`` (Megatron-LM: each TP rank sends 1/tp of the
    activation and of its gradient, Narayanan et al. 2021 Sec. 4.1; current DeepSpeed with
    pipe_partitioned and grad_partitioned), ``forward`` (early DeepSpeed PipelineEngine, as AMP
    vendors it, with model parallelism: activations partitioned and all-gathered over the TP
    group, gradients sent whole: ``is_grad_partitioned = False``), ``none`` (every TP rank sends
    everything)."""
    p2p_attention_mask: bool | None = None
    """Whether the (1, 1, s, s) attention mask travels with the activations as fp16 (the
    GPT2ModelPipe of DeepSpeed's Megatron-LM v1.1.5 3D example casts the bool mask to half and
    sends it with every forward); None: the framework profile's choice."""
    p2p_blocking: bool | None = None
    """Whether both ends wait for every stage-to-stage transfer: DeepSpeed's PipelineEngine
    sends with ``dist.broadcast`` on two-rank groups inside its lock-step TrainSchedule (receive,
    then compute), so a transfer is on the receiver's critical path as well as the sender's,
    and a 1F1B pipeline is timed step by step as that schedule runs (sim/lockstep.py).
    False: the receiver's compute overlaps the transfer (the event-driven schedule executor).
    None: the framework profile's choice."""
    grad_reduce_dtype: Precision | None = None
    """Data type of the data-parallel gradient all-reduce; None = the gradients' own (2 bytes
    under bf16/fp16). DeepSpeed's ``fp32_allreduce`` (and Megatron's
    ``accumulate_allreduce_grads_in_fp32``) reduce 16-bit gradients in fp32: twice the bytes."""
    """What the runtime does with a replica that lost a device: shrink its TP (NTP) or drop it."""
    collectives: Collectives | None = None
    """NCCL algorithm / protocol and DP sync the plan forces (``specs/collectives.py``); None:
    all ``auto`` (a file leaves the ``[collectives]`` table out). Simulated, searched and
    carried by every export (``NCCL_ALGO`` / ``NCCL_PROTO``, hybrid sharding options)."""
    axes: tuple[tuple[str, int], ...] = ()
    """(name, degree) of the plan-scope axes of ``specs/axes.py`` (one degree for the whole
    plan, e.g. expert parallelism) not at degree 1, in table order. A file or inline plan names
    them as keys of their own (``ep = 2``, ``ep=2``): ``from_file_form`` / ``to_file_form``."""
    experts_per_rank: str | tuple[int, ...] = "even"
    """How many routed experts of each MoE layer each EP rank holds, by its coordinate in
    its EP group (every EP group alike: the ranks of one coordinate share experts and reduce
    their gradients over the expert-data-parallel group). ``even``: n_experts / ep each;
    ``by_speed``: in proportion to the slowest GPU holding each coordinate (its dense peak
    at the plan's precision; ``hetpar.sim.expert_split``); or ep counts, each >= 1, summing
    to n_experts (checked against the model by ``feasibility.check_costed``)."""

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch"):
            if getattr(self, k) < 1:
                raise ConfigError(f"plan: {k} must be >= 1, got {getattr(self, k)}")
        if self.axes:
            object.__setattr__(self, "axes", _plan_axes(self.axes))
        _check_experts_per_rank(self.experts_per_rank, self.degree("ep"))
        if self.collectives is not None and self.collectives.is_auto:
            object.__setattr__(self, "collectives", None)  # one form of "all auto"
        if self.zero not in (0, 1, 2, 3):
            raise ConfigError(f"plan: zero must be 0, 1, 2 or 3, got {self.zero}")
        if self.zero_scope not in ("all", "group"):
            raise ConfigError(f"plan: zero_scope {self.zero_scope!r} unknown; allowed: all, group")
        if self.zero_scope == "group" and self.zero == 0:
            raise ConfigError("plan: zero_scope = 'group' needs zero >= 1, got zero = 0")
        if self.attention not in ("", "flash", "fused", "unfused", "auto"):
            raise ConfigError(f"plan: attention {self.attention!r} unknown; allowed: "
                              "flash, fused, unfused, auto")
        if sorted(self.order.split("-")) != sorted(AXES):
            raise ConfigError(f"plan: order {self.order!r} must be a permutation of tp-cp-dp-pp")
        if self.uneven_tp and not self.replicas:
            raise ConfigError("plan: uneven_tp = true needs explicit replicas; a uniform plan "
                              "splits the heads evenly")
        if self.replicas:
            if (self.tp, self.pp, self.dp, self.cp) != (1, 1, 1, 1):
                raise ConfigError("plan: give either tp/pp/dp/cp or replicas, not both")
            total = sum(r.batch for r in self.replicas)
            check_batch(total, "plan: the replicas' batches")
            if self.global_batch is not None and self.global_batch != total:
                raise ConfigError(
                    f"plan: global_batch ({self.global_batch}) != sum of replica batches ({total})"
                )
        elif self.global_batch is None:
            raise ConfigError("plan: missing key 'global_batch'")
        elif self.global_batch < 1:
            raise ConfigError(f"plan: global_batch must be >= 1, got {self.global_batch}")
        elif self.global_batch % (self.dp * self.micro_batch):
            raise ConfigError(
                f"plan: global_batch ({self.global_batch}) not divisible by "
                f"dp ({self.dp}) x micro_batch ({self.micro_batch})"
            )
        else:
            check_batch(self.global_batch, "plan: global_batch")

    @staticmethod
    def from_file_form(data: dict[str, Any]) -> dict[str, Any]:
        """A plan file's keys as fields: each registered plan-scope axis's own key (``ep``)
        goes into ``axes`` (``hetpar.io.from_dict`` calls this first)."""
        if data.get("replicas", None) in ([], ()) and not any(k in data for k in AXES):
            # a file meant to list replicas and listed none: without a degree it would be a
            # uniform plan of tp = pp = dp = cp = 1, one GPU, silently (the plan files hetpar
            # writes say replicas = [] beside their degrees: those load)
            raise ConfigError("plan: replicas = [] lists no replica; give at least one "
                              "[[replicas]] table, or tp/pp/dp/cp for a uniform plan")
        names = [a.name for a in axis_table.of_scope("plan")]
        found = [[n, data[n]] for n in names if n in data]
        if not found:
            return data
        if "axes" in data:
            raise ConfigError(f"plan: give {found[0][0]} as its own key or in axes, not both")
        return {**{k: v for k, v in data.items() if k not in names}, "axes": found}

    @staticmethod
    def to_file_form(data: dict[str, Any]) -> dict[str, Any]:
        """``from_file_form`` reversed (``hetpar.io.to_dict`` calls it): ``axes`` as keys."""
        found = data.pop("axes", [])
        if not data.get("uneven_tp", True):
            del data["uneven_tp"]  # the default: plan files stay as they were
        if data.get("experts_per_rank") == "even":
            del data["experts_per_rank"]
        return {**data, **dict(found)}

    def split_at(self, ep: int) -> str | tuple[int, ...]:
        """``experts_per_rank`` for the same plan at expert degree ``ep`` (a failure or an
        export that changes ep): ``by_speed`` kept where ep > 1, counts only at their ep,
        else ``even``."""
        split = self.experts_per_rank
        if isinstance(split, str):
            return split if ep > 1 else "even"
        return split if len(split) == ep else "even"

    def degree(self, axis: str) -> int:
        """The degree of plan-scope axis ``axis`` (1 unless ``axes`` names it)."""
        return dict(self.axes).get(axis, 1)

    @property
    def uniform(self) -> bool:
        return not self.replicas

    @property
    def batch(self) -> int:
        """Global batch in sequences."""
        return sum(r.batch for r in self.replicas) if self.replicas else int(self.global_batch or 0)

    def num_gpus(self) -> int:
        """Devices the plan uses."""
        if self.uniform:
            return self.tp * self.pp * self.dp * self.cp
        return sum(s.width for r in self.replicas for s in r.stages[: self.pp_of(r)])

    def pp_of(self, replica: Replica) -> int:
        """Pipeline ranks of ``replica`` (its stages divided by vpp)."""
        return len(replica.stages) // self.vpp


def _plan_axes(given: tuple[tuple[str, int], ...]) -> tuple[tuple[str, int], ...]:
    """``Plan.axes`` checked (registered plan-scope axes, each once, degree >= 1) and in
    canonical form: table order, degree 1 left out (a plan without the axis is unchanged)."""
    seen: dict[str, int] = {}
    for name, d in given:
        row = axis_table.get(name)
        if row.scope != "plan":
            raise ConfigError(f"plan: axes names {name!r}, a {row.scope} axis; give it as "
                              f"its own field, axes holds only plan-scope ones")
        if name in seen:
            raise ConfigError(f"plan: axis {name!r} given twice")
        if isinstance(d, bool) or not isinstance(d, int) or d < 1:
            raise ConfigError(f"plan: {name} must be an integer >= 1, got {d!r}")
        seen[name] = d
    return tuple((a.name, seen[a.name]) for a in axis_table.of_scope("plan")
                 if seen.get(a.name, 1) != 1)



def _check_experts_per_rank(split: str | tuple[int, ...], ep: int) -> None:
    """ConfigError naming ``experts_per_rank`` unless it is a named form, or ep counts >= 1
    (their sum against the model's experts: ``feasibility.expert_counts``)."""
    if isinstance(split, str):
        if split not in EXPERT_SPLITS:
            raise ConfigError(f"plan: experts_per_rank {split!r} unknown; allowed: "
                              f"{', '.join(EXPERT_SPLITS)}, or a list of ep counts")
        if split != "even" and ep == 1:
            raise ConfigError(f"plan: experts_per_rank = {split!r} needs ep > 1, got ep = 1")
        return
    if len(split) != ep:
        raise ConfigError(f"plan: experts_per_rank lists {len(split)} counts "
                          f"{list(split)}; it needs one per EP rank, ep = {ep}")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in split):
        raise ConfigError(f"plan: experts_per_rank counts must be integers >= 1, "
                          f"got {list(split)}")
