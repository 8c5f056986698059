"""Plan description: uniform degrees as a shorthand for explicit replicas of pipeline stages."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from hetpar.errors import ConfigError, Infeasible
from hetpar.specs import axes as axis_table
from hetpar.specs.axes import BUILTIN
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.gpu import DEFAULT_PRECISION, Precision
from hetpar.specs.model import ModelSpec

Recompute = Literal["none", "selective", "full"]
FailurePolicy = Literal["ntp", "drop"]
P2PSplit = Literal["scatter-gather", "forward", "none"]
ZeroScope = Literal["all", "group"]
AXES = tuple(a.name for a in BUILTIN)
"""The device axes ("tp", "cp", "dp", "pp"; rows of ``specs/axes.py``), which ``order`` permutes."""


@dataclass(frozen=True, kw_only=True)
class Stage:
    """One pipeline stage (a model chunk) on ``tp * cp`` devices of one node group.

    With ``vpp`` virtual stages per rank a replica lists ``pp * vpp`` stages in model order;
    stage ``j`` runs on pipeline rank ``j % pp`` (all chunks of a rank share its devices).
    """

    layers: tuple[int, int]
    """Transformer layers [start, end) of this chunk."""
    group: str
    tp: int
    cp: int = 1
    devices: tuple[int, ...] | None = None
    """Device indices inside ``group`` (tp-major, length tp*cp); None = next free ones."""

    def __post_init__(self) -> None:
        a, b = self.layers
        if not 0 <= a <= b:
            raise ConfigError(
                f"stage: layers must be [start, end) with 0 <= start <= end, got {a, b}"
            )
        if self.tp < 1 or self.cp < 1:
            raise ConfigError(f"stage: tp and cp must be >= 1, got tp={self.tp}, cp={self.cp}")
        if self.devices is not None and len(self.devices) != self.tp * self.cp:
            raise ConfigError(
                f"stage: devices lists {len(self.devices)} devices, tp*cp = {self.tp * self.cp}"
            )
        if self.devices is not None and (
            min(self.devices) < 0 or len(set(self.devices)) != len(self.devices)
        ):
            raise ConfigError(f"stage: devices must be distinct and >= 0, got {list(self.devices)}")

    @property
    def n_layers(self) -> int:
        return self.layers[1] - self.layers[0]

    @property
    def width(self) -> int:
        """Devices this stage runs on."""
        return self.tp * self.cp


@dataclass(frozen=True, kw_only=True)
class Replica:
    """One data-parallel replica: its stages and its share of the global batch (sequences)."""

    stages: tuple[Stage, ...]
    batch: int
    micro_batch: int

    def __post_init__(self) -> None:
        if not self.stages:
            raise ConfigError("replica: stages is empty")
        if self.batch < 1 or self.micro_batch < 1 or self.batch % self.micro_batch:
            raise ConfigError(
                f"replica: batch ({self.batch}) must be a positive multiple of "
                f"micro_batch ({self.micro_batch})"
            )

    @property
    def num_microbatches(self) -> int:
        return self.batch // self.micro_batch


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
    axes: tuple[tuple[str, int], ...] = ()
    """(name, degree) of the plan-scope axes of ``specs/axes.py`` (one degree for the whole
    plan, e.g. expert parallelism) not at degree 1, in table order. A file or inline plan names
    them as keys of their own (``ep = 2``, ``ep=2``): ``from_file_form`` / ``to_file_form``."""

    def __post_init__(self) -> None:
        for k in ("tp", "pp", "dp", "cp", "vpp", "micro_batch"):
            if getattr(self, k) < 1:
                raise ConfigError(f"plan: {k} must be >= 1, got {getattr(self, k)}")
        if self.axes:
            object.__setattr__(self, "axes", _plan_axes(self.axes))
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
        if self.replicas:
            if (self.tp, self.pp, self.dp, self.cp) != (1, 1, 1, 1):
                raise ConfigError("plan: give either tp/pp/dp/cp or replicas, not both")
            total = sum(r.batch for r in self.replicas)
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

    @staticmethod
    def from_file_form(data: dict[str, Any]) -> dict[str, Any]:
        """A plan file's keys as fields: each registered plan-scope axis's own key (``ep``)
        goes into ``axes`` (``hetpar.io.from_dict`` calls this first)."""
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
        return {**data, **dict(found)}

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


def split_layers(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """Split ``n_layers`` into ``parts`` contiguous ranges, sizes differing by at most one."""
    base, extra = divmod(n_layers, parts)
    out, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        out.append((start, start + size))
        start += size
    return out


EMPTY_END_CHUNKS = 2
"""Most model chunks that may hold no layer: the first (then only the embedding) and the last
(only the LM head and loss). Megatron-Core's ``account_for_embedding_in_pipeline_split`` and
``account_for_loss_in_pipeline_split`` count each as one layer of the split; Llama 3 (Sec.
3.3.2) removes one layer from the first and the last stage so that "the first model chunk on
the first stage has only the embedding, and the last model chunk on the last stage has only
output projection and loss calculation"."""


def padded_split(n_layers: int, parts: int) -> list[tuple[int, int]]:
    """``split_layers``, or with fewer layers than chunks one layer per chunk and the empty
    chunks at the ends, last and first alternately (22 layers as 8 stages x 3 chunks; 126 as
    16 x 8 in Llama 3; see ``EMPTY_END_CHUNKS``)."""
    if n_layers >= parts:
        return split_layers(n_layers, parts)
    empty: set[int] = set()
    lo, hi = 0, parts - 1
    while len(empty) < parts - n_layers:
        empty.add(hi)
        hi -= 1
        if len(empty) < parts - n_layers:
            empty.add(lo)
            lo += 1
    out, start = [], 0
    for j in range(parts):
        size = 0 if j in empty else 1
        out.append((start, start + size))
        start += size
    return out


def device_index(coords: dict[str, int], degrees: dict[str, int], order: list[str]) -> int:
    """Index (in the pool of devices) of the rank at ``coords``: ``order`` innermost first."""
    index, stride = 0, 1
    for axis in order:
        index += coords[axis] * stride
        stride *= degrees[axis]
    return index


def expand(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> Plan:
    """Return ``plan`` in explicit-replica form with every stage's devices assigned.

    A uniform plan's ranks are laid on the chosen group(s) in ``plan.order``; an explicit
    plan gets devices for stages that lack them, in order, and is checked against the cluster.
    """
    if plan.uniform:
        replicas = _expand_uniform(plan, model, cluster)
        return replace(plan, tp=1, pp=1, dp=1, cp=1, replicas=replicas, global_batch=plan.batch)
    return replace(plan, replicas=_assign_devices(plan, model, cluster))


def _expand_uniform(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> tuple[Replica, ...]:
    groups = [cluster.group(plan.group)] if plan.group else list(cluster.node_groups)
    pool = [(g.name, i) for g in groups for i in range(g.num_gpus)]
    need = plan.num_gpus()
    if need > len(pool):
        raise Infeasible(
            "devices",
            f"plan needs tp*cp*dp*pp = {plan.tp}*{plan.cp}*{plan.dp}*{plan.pp} = {need} GPUs, "
            f"cluster has {len(pool)}",
        )
    chunks = plan.pp * plan.vpp
    if model.n_layers < chunks - (EMPTY_END_CHUNKS if chunks > 1 else 0):
        raise Infeasible(
            "divisibility", f"{model.n_layers} layers < pp*vpp = {plan.pp}*{plan.vpp} chunks"
        )
    ranges = padded_split(model.n_layers, chunks)
    degrees = {"tp": plan.tp, "cp": plan.cp, "dp": plan.dp, "pp": plan.pp}
    order = plan.order.split("-")
    replicas = []
    for d in range(plan.dp):
        stages = []
        for j, rng in enumerate(ranges):
            p = j % plan.pp
            devs = [
                pool[device_index({"tp": t, "cp": c, "dp": d, "pp": p}, degrees, order)]
                for c in range(plan.cp)
                for t in range(plan.tp)
            ]
            names = {n for n, _ in devs}
            if len(names) > 1:
                raise Infeasible(
                    "placement",
                    f"a stage of tp*cp = {plan.tp * plan.cp} spans node groups {sorted(names)}",
                )
            stages.append(
                Stage(
                    layers=rng,
                    group=devs[0][0],
                    tp=plan.tp,
                    cp=plan.cp,
                    devices=tuple(i for _, i in devs),
                )
            )
        replicas.append(
            Replica(stages=tuple(stages), batch=plan.batch // plan.dp, micro_batch=plan.micro_batch)
        )
    return tuple(replicas)


def _assign_devices(plan: Plan, model: ModelSpec, cluster: ClusterSpec) -> tuple[Replica, ...]:
    used: dict[str, set[int]] = {g.name: set() for g in cluster.node_groups}
    owner: dict[tuple[str, int], str] = {}
    for i, r in enumerate(plan.replicas):
        for j, s in enumerate(r.stages):
            cluster.group(s.group)
            if s.devices is None or j >= plan.pp_of(r):
                continue  # a later virtual stage runs on its pipeline rank's devices
            for d in s.devices:
                # one device, one stage: two replicas pinned to a device would be simulated
                # as if each had its own (the runtime's layout refuses the same plan)
                if (s.group, d) in owner:
                    raise ConfigError(f"plan: device {d} of node group {s.group!r} is pinned by "
                                      f"{owner[s.group, d]} and replica {i} stage {j}")
                owner[s.group, d] = f"replica {i} stage {j}"
            used[s.group].update(s.devices)
    out = []
    for r in plan.replicas:
        _check_replica_layers(plan, r, model)
        pp = plan.pp_of(r)
        stages: list[Stage] = []
        for j, s in enumerate(r.stages):
            if j >= pp:
                s = replace(s, devices=stages[j % pp].devices, group=stages[j % pp].group)
            elif s.devices is None:
                g = cluster.group(s.group)
                free = [i for i in range(g.num_gpus) if i not in used[s.group]][: s.width]
                if len(free) < s.width:
                    raise Infeasible("devices", f"node group {s.group!r} has too few free GPUs")
                used[s.group].update(free)
                s = replace(s, devices=tuple(free))
            g = cluster.group(s.group)
            assert s.devices is not None
            if max(s.devices) >= g.num_gpus or min(s.devices) < 0:
                raise ConfigError(
                    f"plan: stage devices {list(s.devices)} outside node group "
                    f"{s.group!r} (0..{g.num_gpus - 1})"
                )
            stages.append(s)
        out.append(replace(r, stages=tuple(stages)))
    return tuple(out)


def _check_replica_layers(plan: Plan, r: Replica, model: ModelSpec) -> None:
    if len(r.stages) % plan.vpp:
        raise ConfigError(
            f"plan: a replica has {len(r.stages)} stages, not a multiple of vpp={plan.vpp}"
        )
    pos = 0
    for s in r.stages:
        if s.layers[0] != pos:
            raise ConfigError(
                f"plan: stage layers {list(s.layers)} do not continue from layer {pos}"
            )
        pos = s.layers[1]
    if pos != model.n_layers:
        raise ConfigError(
            f"plan: a replica's stages cover {pos} layers, model has {model.n_layers}"
        )
