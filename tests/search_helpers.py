"""A small model, two-type cluster and job that the synthetic-cost planner tests share."""

from hetpar.specs.cluster import ClusterSpec, NodeGroup
from hetpar.specs.job import Job
from hetpar.specs.model import ModelSpec

MODEL = ModelSpec(name="m16", n_layers=16, hidden=4096, n_heads=32, n_kv_heads=8,
                  ffn_hidden=14336, vocab=128256, seq_len=4096, mlp="swiglu")
CLUSTER = ClusterSpec(name="ab", node_groups=(
    NodeGroup(name="a", gpu="type-A", num_nodes=2, gpus_per_node=8),
    NodeGroup(name="b", gpu="type-B", num_nodes=4, gpus_per_node=8, nic_bandwidth_gbps=400.0),
))
JOB = Job(global_batch=64)
