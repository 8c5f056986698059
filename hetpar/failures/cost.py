"""What a degraded replica costs: the small interface the policies ask, and an analytic model of it.

The policies only ask two questions (``ReplicaCost``): how long one replica takes at TP
degree ``t`` with a batch share of ``b`` sequences (optionally with its GPUs sped up by a power
boost), and how long the gradient synchronisation takes when live replicas run at several TP
degrees. ``hetpar.failures.simcost`` answers them with the iteration simulator; the
``AnalyticCost`` here is an explicitly fast approximation (closed forms, so that the Monte
Carlo also runs alone) that prices its collectives and bytes with the simulator's public cost
terms (``hetpar.sim.terms``); tests/test_analytic_vs_sim.py keeps it near the simulator on
every bundled cluster.
"""

from __future__ import annotations

import math
from typing import Protocol

from hetpar import formulas
from hetpar.catalog import gpu_spec
from hetpar.failures.layout import Layout
from hetpar.sim import terms
from hetpar.specs.cluster import ClusterSpec
from hetpar.specs.model import ModelSpec
from hetpar.specs.plan import Plan


class ReplicaCost(Protocol):
    """Seconds of one replica and of the gradient synchronisation between replicas."""

    def replica_time(self, tp: int, batch: int, speed: float = 1.0) -> float:
        """One iteration of one replica (no DP sync) at TP ``tp`` with ``batch`` sequences.

        ``tp`` may be below the plan's degree n: the n weight shards then live on ``tp`` GPUs
        (NTP, Arfeen et al. 2025 Sec. 4.2), each computing n / tp of the shards. ``speed``
        multiplies the GPUs' compute rate (power boost).
        """
        ...

    def sync_time(self, degrees: frozenset[int], replicas: int) -> float:
        """Exposed gradient synchronisation per iteration with live replicas at ``degrees``.

        With several degrees, gradients are resharded inside each scale-up domain to the
        smallest degree and all-reduced over the matching ranks, each carrying the larger
        payload 1 / min(degrees) of a stage; then resharded back (Arfeen et al. Sec. 4.2, 5.1).
        """
        ...


class AnalyticCost:
    """Closed-form replica and sync times (1F1B pipeline of the bottleneck stage).

    Replica: (m + (p-1)/v) x per-microbatch time of the busiest pipeline rank (Narayanan et al.
    2021, Sec. 2.2: bubble (p-1)/(v m)). A rank's microbatch time is its layers' GEMM and
    attention FLOPs (3 x forward, Sec. 5.1) at the catalog GPU's efficiency for that kernel
    size, plus Megatron TP collectives over the scale-up links (4 all-gather/reduce-scatter or
    2 all-reduce per layer each way, Korthikanti et al. 2022 Sec. 4.2.2), plus the pipeline
    send of one activation. No overlap of communication is assumed (a pessimistic bound).
    """

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, plan: Plan, lay: Layout,
                 seq_len: int | None = None) -> None:
        self.model, self.plan, self.lay = model, plan, lay
        group = cluster.group(lay.group)
        self.gpu = gpu_spec(group.gpu)
        self.peak = self.gpu.peak_flops(plan.precision)
        self.seq = seq_len or model.seq_len
        self.layers = math.ceil(model.n_layers / lay.pp)
        su_gbps = group.scaleup_bandwidth_gbps or self.gpu.scaleup_bandwidth_gbps
        self.su_bw = terms.bytes_per_s(su_gbps)
        self.su_lat = group.scaleup_latency_us * 1e-6
        out_gbps = min([group.nic_bandwidth_gbps]
                       + [t.bandwidth_gbps / t.oversubscription for t in cluster.tiers])
        self.net_bw = terms.bytes_per_s(out_gbps)
        self.net_lat = group.nic_latency_us * 1e-6 + max((t.latency_us * 1e-6
                                                          for t in cluster.tiers), default=0.0)
        # activations and gradients are kept in the parameter dtype (the simulator's table)
        self.act_bytes = terms.element_bytes(plan.precision)

    def _compute(self, tp: int, speed: float) -> float:
        """GEMM + attention seconds of one layer, one microbatch, forward and backward."""
        m, tokens = self.model, self.plan.micro_batch * self.seq
        n = self.lay.tp  # shards per stage: n / tp of them on each surviving GPU
        attn = formulas.attention_core_flops(m, tokens, self.seq) / n
        t_attn = attn / self.gpu.attention_efficiency(attn)
        proj = self._projections()
        t = t_attn + self._gemms(tokens, n, proj + self._mlp(False))
        moe = formulas.moe_layers_in(m, 0, m.n_layers) / m.n_layers
        if moe:  # the mean layer: an MoE layer runs its active experts instead
            t = (1 - moe) * t + moe * (t_attn + self._gemms(tokens, n, proj + self._mlp(True)))
        t /= self.peak
        passes = 3.0 + {"none": 0.0, "selective": 0.0, "full": 1.0}[self.plan.recompute]
        return passes * t * n / tp / speed

    def _projections(self) -> list[int]:
        """Attention projection weights as GEMMs: fused QKV and output, or MLA's five
        (formulas.mla_matrices), all split over the stage's shards (a cheap estimate)."""
        m = self.model
        if m.attention == "mla":
            return [i * o for i, o in formulas.mla_matrices(m)]
        h, q, kv = m.hidden, m.n_heads * m.dim_head, m.n_kv_heads * m.dim_head
        return [h * (q + 2 * kv), q * h]

    def _gemms(self, tokens: int, n: int, mats: list[int]) -> float:
        """Peak-normalised seconds of one forward pass through ``mats`` weights on 1/n."""
        return sum(f / self.gpu.matmul_efficiency(f) for f in (2.0 * tokens * w / n
                                                               for w in mats))

    def _mlp(self, moe: bool) -> list[int]:
        """Weight matrices a token passes in one MLP: the dense one, or its top-k experts, the
        shared expert and the router h x E plus the shared expert's gate h x 1 (Qwen2-MoE,
        transformers modeling_qwen2_moe) as GEMMs of all the tokens (a cheap estimate: the
        simulator sizes the routed GEMMs by tokens x k / E, formulas.layer_gemms)."""
        m, mats = self.model, formulas.mlp_matrices(self.model)
        if not moe:
            return [m.hidden * m.ffn_hidden] * mats
        out = [m.hidden * m.expert_ffn] * (mats * m.experts_per_token) + [m.hidden * m.n_experts]
        if m.shared_expert_ffn_hidden:
            out += [m.hidden * m.shared_expert_ffn_hidden] * mats
        return out + ([m.hidden] if m.shared_expert_gate else [])

    def _tp_comm(self, tp: int) -> float:
        if tp == 1:
            return 0.0
        v = self.plan.micro_batch * self.seq * self.model.hidden * self.act_bytes
        per = terms.ring_reduce_scatter(v, tp, self.su_bw, self.su_lat)
        return 8 * per  # 2 all-gathers + 2 reduce-scatters forward, the same backward

    def replica_time(self, tp: int, batch: int, speed: float = 1.0) -> float:
        mb = self.plan.micro_batch
        m = max(1, batch // mb)
        v = mb * self.seq * self.model.hidden * self.act_bytes
        p2p = 0.0 if self.lay.pp == 1 else 2 * (v / tp / self.net_bw + self.net_lat)
        per_mb = self.layers * (self._compute(tp, speed) + self._tp_comm(tp)) + p2p
        return (m + (self.lay.pp - 1) / self.lay.vpp) * per_mb

    def stage_params(self) -> float:
        """Parameters of the busiest pipeline stage (its transformer layers)."""
        return float(formulas.layers_params(self.model, 0, self.layers))

    def sync_time(self, degrees: frozenset[int], replicas: int) -> float:
        t_min = min(degrees)
        payload = self.stage_params() * self.act_bytes / t_min
        t = terms.ring_all_reduce(payload, replicas, self.net_bw, self.net_lat)
        if len(degrees) > 1:
            # the n - t extra ranks of a healthy replica each send their whole shard (1/n of
            # the stage) into the domain, before and after the all-reduce (Sec. 5.1)
            n = max(degrees)
            t += 2 * (self.stage_params() * self.act_bytes / n / self.su_bw + self.su_lat)
        return t
