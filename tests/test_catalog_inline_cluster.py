"""The inline cluster form (``--cluster gpu=...,nodes=N``): the same cluster as its file."""

import pytest

from hetpar.catalog import inline_cluster, load_cluster, load_model, parse_inline_plan
from hetpar.cli.main import main
from hetpar.errors import ConfigError
from hetpar.io import from_dict
from hetpar.sim import simulate
from hetpar.specs.cluster import ClusterSpec


def test_inline_cluster_simulates_as_the_equivalent_file(tmp_path):
    text = ('name = "f"\n[[node_groups]]\nname = "g"\ngpu = "A100-SXM4-80GB"\n'
            "num_nodes = 2\ngpus_per_node = 8\nnic_bandwidth_gbps = 100.0\n")
    path = tmp_path / "c.toml"
    path.write_text(text)
    model = load_model("llama3.1-8b")
    plan = parse_inline_plan("tp=2,dp=8,mbs=1,gbs=32")
    inline = simulate(model, load_cluster("gpu=A100-SXM4-80GB,nodes=2,nic_gbps=100"), plan)
    filed = simulate(model, load_cluster(str(path)), plan)
    assert inline.iteration_time_s == filed.iteration_time_s
    assert inline.memory == filed.memory
    # the NIC rate is read: a slower network makes the cross-node gradient sync slower
    slow = simulate(model, load_cluster("gpu=A100-SXM4-80GB,nodes=2,nic_gbps=10"), plan)
    assert slow.iteration_time_s > filed.iteration_time_s


def test_defaults_are_one_node_of_eight():
    c = inline_cluster("gpu=H100-SXM5-80GB")
    (g,) = c.node_groups
    assert (g.num_nodes, g.gpus_per_node, g.gpu) == (1, 8, "H100-SXM5-80GB")
    assert c.name == "8xH100-SXM5-80GB"
    assert c == from_dict(ClusterSpec, {"name": c.name, "description": c.description,
                                        "node_groups": [{"name": "g", "gpu": "H100-SXM5-80GB",
                                                         "num_nodes": 1, "gpus_per_node": 8}]},
                          "expected")


@pytest.mark.parametrize("text, needle", [
    ("nodes=2", "missing key 'gpu'"),
    ("gpu=H100-SXM5-80GB,nodez=2", "unknown key 'nodez'"),
    ("gpu=H100-SXM5-80GB,nodes=2,nodes=3", "given twice"),
    ("gpu=H100-SXM5-80GB,nodes=0", "num_nodes must be >= 1"),
])
def test_bad_inline_cluster_is_a_config_error(text, needle):
    with pytest.raises(ConfigError, match=needle):
        inline_cluster(text)


def test_cli_unknown_gpu_is_one_line_exit_2(capsys):
    rc = main(["simulate", "--cluster", "gpu=H999,nodes=2", "--model", "llama3.1-8b",
               "--plan", "dp=8"])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err and "unknown gpu 'H999'" in err
