from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from hetpar import catalog
from hetpar.cli import import_cluster as import_cli
from hetpar.errors import ConfigError
from hetpar.export import export
from hetpar.importers import ALIASES, read_astrasim, read_metis, resolve

FIX = Path(__file__).parent / "fixtures" / "importers"
HOSTFILE = (FIX / "metis" / "hostfile").read_text()
CLUSTERFILE = (FIX / "metis" / "clusterfile.json").read_text()
NETWORK = (FIX / "astra-sim" / "network.yml").read_text()


def node(ip: str, kind: str, inter: float = 23842, intra: float = 286102, mem: float = 80) -> str:
    return (f'"{ip}": {{"instance_type": "{kind}", "inter_bandwidth": {inter}, '
            f'"intra_bandwidth": {intra}, "memory": {mem}}}')


def test_metis_fixture() -> None:
    c, warnings = read_metis(HOSTFILE, CLUSTERFILE)
    assert warnings == []
    a100, v100 = c.node_groups
    assert (a100.gpu, a100.num_nodes, a100.gpus_per_node) == ("A100-SXM4-80GB", 2, 8)
    assert v100.gpu == "V100-SXM2-32GB" and c.num_gpus == 32
    # MiB/s -> Gbit/s: 286102 MiB/s is NVLink3's 300 GB/s = 2400 Gbit/s per direction
    assert a100.scaleup_bandwidth_gbps == pytest.approx(2400, rel=1e-4)
    assert a100.nic_bandwidth_gbps == pytest.approx(200, rel=1e-4)
    assert c.tiers[0].bandwidth_gbps == v100.nic_bandwidth_gbps  # the slowest NIC


def test_metis_hostfile_forms_and_units() -> None:
    hosts = "# two nodes\nn1 4\n\nn2 slots=4\n"
    info = "{" + node("n1", "A100") + ", " + node("n2", "A100") + "}"
    c, _ = read_metis(hosts, info)
    assert len(c.node_groups) == 1 and c.node_groups[0].num_nodes == 2
    small = info.replace("23842", "10").replace("286102", "50")
    # read as Metis's MiB/s these are 0.08 Gbit/s: an error naming the units that fit
    with pytest.raises(ConfigError, match=r"outside 1-30000 Gbit/s; give the unit with "
                                          r"--bandwidth-unit \(values fit: gbyte_s, gbps\)"):
        read_metis(hosts, small)
    _, warnings = read_metis(hosts, small, unit="mib_s")  # a unit given: only a warning
    assert any("implausible" in w for w in warnings)
    c, warnings = read_metis(hosts, small, unit="gbps")
    assert warnings == [] and c.node_groups[0].nic_bandwidth_gbps == 10
    # bytes/s (2.5 Gbit/s and 100 Gbit/s) would be millions of Gbit/s as MiB/s
    big = "{" + node("n1", "A100", 312_500_000, 12_500_000_000) + "}"
    with pytest.raises(ConfigError, match=r"values fit: byte_s\)"):
        read_metis("n1 4", big)


def test_metis_errors() -> None:
    k80 = "{" + node("h", "K80") + "}"
    with pytest.raises(ConfigError, match=r"unknown device type 'K80'; known: .*A100.*--gpu-map"):
        read_metis("h 4", k80)
    c, _ = read_metis("h 4", k80, gpu_map={"K80": "L40S"})
    assert c.node_groups[0].gpu == "L40S"
    with pytest.raises(ConfigError, match="--gpu-map K80=K80-12GB: unknown.*known: .*A100-SXM4"):
        read_metis("h 4", k80, gpu_map={"K80": "K80-12GB"})  # not a catalog GPU
    # the target of a mapping resolves like any device name (aliases, memory size)
    p100 = "{" + node("h", "P100", mem=32) + "}"
    c, _ = read_metis("h 4", p100, gpu_map={"P100": "V100"})
    assert c.node_groups[0].gpu == "V100-SXM2-32GB"
    c, warnings = read_metis("h 4", "{" + node("h", "P100", mem=16) + "}", gpu_map={"P100": "V100"})
    assert c.node_groups[0].gpu == "V100-SXM2-16GB" and warnings == []
    c, _ = read_metis("h 4", "{" + node("h", "P100", mem=40) + "}", gpu_map={"p100": "a100"})
    assert c.node_groups[0].gpu == "A100-SXM4-40GB"
    with pytest.raises(ConfigError, match="line 1"):
        read_metis("h slots=x", CLUSTERFILE)
    with pytest.raises(ConfigError, match="not in the clusterfile"):
        read_metis("10.9.9.9 slots=8", CLUSTERFILE)
    with pytest.raises(ConfigError, match="expected instance_type"):
        read_metis("h 4", '{"h": {"instance_type": "A100"}}')
    with pytest.raises(ConfigError, match="must be a number > 0"):
        read_metis("h 4", "{" + node("h", "A100", inter=-1) + "}")


def test_device_table() -> None:
    assert resolve("a100", 40)[0] == "A100-SXM4-40GB"
    assert resolve("A100_80GB")[0] == "A100-SXM4-80GB"
    assert resolve("h100-sxm5-80gb")[0] == "H100-SXM5-80GB"  # catalog names are accepted
    # V100 and T4 (Metis's sample devices) resolve to the catalog's 16 GB parts by memory
    assert resolve("V100", 16) == ("V100-SXM2-16GB", [])
    assert resolve("V100", 32) == ("V100-SXM2-32GB", [])
    assert resolve("V100")[0] == "V100-SXM2-32GB"  # no memory: the first candidate
    assert resolve("t4", 16) == ("T4-16GB", [])
    gpu, warnings = resolve("V100-32GB", 16)
    assert gpu == "V100-SXM2-32GB" and "16 GB" in warnings[0]
    known = set(catalog.names("gpus"))
    assert all(set(targets) <= known for targets in ALIASES.values())


def test_unknown_device_lists_names_as_written() -> None:
    """The error lists catalog names and documented aliases, not their normalised keys."""
    with pytest.raises(ConfigError) as e:
        resolve("P100")
    listed = str(e.value).split("known: ")[1].split(" (map")[0].split(", ")
    assert {"A100-40GB", "V100-16GB", "RTX-2080", "Titan-RTX"} <= set(listed)
    assert not {"A10040GB", "V10016GB", "RTX2080", "TITANRTX"} & set(listed)


def test_astrasim_fixture() -> None:
    c, warnings = read_astrasim(NETWORK, "H100")
    (g,) = c.node_groups
    assert warnings == [] and (g.gpus_per_node, g.num_nodes, c.num_gpus) == (8, 8, 64)
    assert (g.scaleup_bandwidth_gbps, g.nic_bandwidth_gbps) == (2400.0, 400.0)  # GB/s x 8
    assert (g.scaleup_latency_us, g.nic_latency_us) == (0.5, 2.0)  # ns / 1000
    (tier,) = c.tiers
    assert (tier.size_gpus, tier.bandwidth_gbps, tier.latency_us) == (64, 200.0, 5.0)


def test_astrasim_topologies_warn_what_is_approximated() -> None:
    ring = "topology: [Ring, Ring]\nnpus_count: [8, 4]\nbandwidth: [100, 50]\n" \
           "latency: [500, 500]\n"
    c, warnings = read_astrasim(ring, "H100")
    assert c.num_gpus == 32
    assert any("dimension 0 Ring(8) approximated as a switch" in w for w in warnings)
    assert any("2-D torus" in w for w in warnings)
    full = ring.replace("Ring, Ring", "FullyConnected, Switch")
    (w,) = read_astrasim(full, "H100")[1]
    assert "FullyConnected(8)" in w and "other 6 direct links" in w
    exact = ring.replace("Ring, Ring", "Switch, Switch")
    assert read_astrasim(exact, "H100")[1] == []
    two = ring.replace("npus_count: [8, 4]", "npus_count: [2, 4]").replace("Ring, Ring",
                                                                            "Ring, Switch")
    assert read_astrasim(two, "H100")[1] == []  # a ring of two NPUs is one link


def test_astrasim_errors() -> None:
    with pytest.raises(ConfigError, match="unknown key 'links'"):
        read_astrasim(NETWORK + "links: [1]\n", "H100")
    with pytest.raises(ConfigError, match="same"):
        read_astrasim(NETWORK.replace("[ 8, 4, 2 ]", "[ 8, 4 ]"), "H100")
    with pytest.raises(ConfigError, match="topology 'Torus'"):
        read_astrasim(NETWORK.replace("[ Switch,", "[ Torus,"), "H100")
    with pytest.raises(ConfigError, match="missing key 'latency'"):
        read_astrasim("topology: [Ring]\nnpus_count: [8]\nbandwidth: [50]\n", "H100")
    with pytest.raises(ConfigError, match="unknown device type"):
        read_astrasim(NETWORK, "TPUv4")


def run_cli(*argv: str) -> int:
    p = argparse.ArgumentParser()
    import_cli.add_arguments(p)
    return import_cli.run(p.parse_args(list(argv)))


def test_cli_metis_writes_a_loadable_cluster(tmp_path: Path) -> None:
    out = tmp_path / "imported.toml"
    assert run_cli(str(FIX / "metis" / "hostfile"), "--from", "metis", "--out", str(out),
                   "--name", "lab") == 0
    loaded = catalog.load_cluster(str(out))
    expected, _ = read_metis(HOSTFILE, CLUSTERFILE, name="lab")
    assert loaded == expected
    assert [p.name for p in tmp_path.iterdir()] == ["imported.toml"]


def test_cli_astrasim_and_plan_import(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--gpu is required"):
        run_cli(str(FIX / "astra-sim" / "network.yml"), "--from", "astra-sim")
    assert run_cli(str(FIX / "astra-sim" / "network.yml"), "--from", "astra-sim", "--gpu",
                   "X", "--gpu-map", "X=B200") == 0
    assert 'gpu = "B200"' in capsys.readouterr().out
    model = catalog.load_model("llama3.1-8b")
    plan = catalog.load_plan("tp=4,pp=2,dp=2,gbs=64,sp=true,name=p1")
    script = tmp_path / "megatron_args.sh"
    script.write_text(export(plan, model, "megatron").files[0][1])
    out = tmp_path / "plan.toml"
    assert run_cli(str(script), "--from", "megatron", "--model", "llama3.1-8b", "--out",
                   str(out)) == 0
    assert catalog.load_plan(str(out)) == plan
    # DeepSpeed: the pipeline depth comes from the launcher written beside the config
    ds_plan = catalog.load_plan("tp=2,pp=4,dp=2,gbs=64,recompute=full,name=d")
    e = export(ds_plan, model, "deepspeed", config_name="ds.json")
    for name, text in e.files:
        (tmp_path / name).write_text(text)
    assert run_cli(str(tmp_path / "ds.json"), "--from", "deepspeed", "--model", "llama3.1-8b",
                   "--out", str(out)) == 0
    assert catalog.load_plan(str(out)) == e.plan and e.plan.pp == 4
    (tmp_path / "ds.sh").unlink()
    capsys.readouterr()
    assert run_cli(str(tmp_path / "ds.json"), "--from", "deepspeed", "--model", "llama3.1-8b",
                   "--out", str(out)) == 0
    assert "pp taken as 1" in capsys.readouterr().err


def test_through_the_hetpar_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hetpar.cli.main import main

    out = tmp_path / "c.toml"
    assert main(["import", "--from", "astra-sim", str(FIX / "astra-sim" / "network.yml"),
                 "--gpu", "H100", "--out", str(out)]) == 0
    assert catalog.load_cluster(str(out)).num_gpus == 64
    assert main(["import", "--from", "astra-sim", str(FIX / "astra-sim" / "network.yml"),
                 "--gpu", "K80"]) == 2
    assert "unknown device type 'K80'" in capsys.readouterr().err
    # the newest torchtitan has registry configs for Llama 3 sizes only: exit 2, one line
    assert main(["export", "--plan", "tp=2,gbs=8", "--model", "tiny-llama", "--to",
                 "torchtitan"]) == 2
    assert "needs its own config_registry entry" in capsys.readouterr().err
    assert main(["export", "--plan", "tp=2,gbs=8", "--model", "tiny-llama", "--to",
                 "torchtitan", "--framework-version", "2025-10"]) == 0
    assert "tensor_parallel_degree = 2" in capsys.readouterr().out
