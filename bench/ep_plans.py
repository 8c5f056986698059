"""Mixtral 8x7B on selene-a100 without and with the bundled ep axis (docs/extending.md)."""

from hetpar.catalog import load_cluster, load_model, parse_inline_plan
from hetpar.sim import simulate

model, cluster = load_model("mixtral-8x7b"), load_cluster("selene-a100")
for text in ("tp=4,pp=4,dp=2,gbs=64", "tp=4,pp=4,dp=2,gbs=64,ep=2,etp=4"):
    r = simulate(model, cluster, parse_inline_plan(text))
    print(f"{text:34s} {r.iteration_time_s:7.3f} s  ep_comm {r.breakdown.get('ep_comm', 0):.3f} s"
          f"  rank 0 params {r.memory[0].params / 2**30:5.1f} GiB")
