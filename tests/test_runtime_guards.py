"""`hetpar run` refuses what it cannot trust, in one line with exit 2: corrupted checkpoints
(verified against their manifest before any rank starts), learning rates, host memory, NaN."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from loadscale import deadline

from hetpar.cli.main import main
from hetpar.runtime.manifest import unname, verify

pytestmark = pytest.mark.timeout(deadline(120))
RUN = ["run", "--model", "tiny-llama", "--plan", "tp=2,gbs=4"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-step checkpoint (steps 2 and 4 kept) of RUN."""
    root = tmp_path_factory.mktemp("ck") / "ck"
    assert main([*RUN, "--steps", "4", "--checkpoint", str(root), "--every", "2"]) == 0
    return root


def _flip(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40  # one bit of one byte, size unchanged
    p.write_bytes(bytes(data))


def _shard(ck: Path) -> Path:
    return sorted((ck / "step-4").glob("*.distcp"))[0]


CORRUPTIONS: dict[str, tuple[Callable[[Path], object], str]] = {
    "flipped-byte": (lambda ck: _flip(_shard(ck)), "fails its SHA-256 check"),
    "truncated-shard": (lambda ck: _shard(ck).write_bytes(_shard(ck).read_bytes()[:100]),
                        "has 100 bytes"),
    "garbage-metadata": (lambda ck: (ck / "step-4" / ".metadata").write_bytes(b"garbage"),
                         ".metadata has 7 bytes"),
    "missing-metadata": (lambda ck: (ck / "step-4" / ".metadata").unlink(), ".metadata is missing"),
    "missing-shard": (lambda ck: _shard(ck).unlink(), ".distcp is missing"),
    "garbage-manifest": (lambda ck: (ck / "step-4" / "manifest.json").write_text("{"),
                         "not a valid"),
    "latest-empty": (lambda ck: (ck / "latest").write_text(""), "latest holds ''"),
    "latest-garbage": (lambda ck: (ck / "latest").write_bytes(b"\xff\x00zz"), "latest holds"),
    "latest-negative": (lambda ck: (ck / "latest").write_text("-3"), "latest holds '-3'"),
    "latest-too-far": (lambda ck: (ck / "latest").write_text("99"), "names step 99"),
    "empty-step-dir": (lambda ck: [p.unlink() for p in (ck / "step-4").iterdir()], "is empty"),
    "file-for-step-dir": (lambda ck: (shutil.rmtree(ck / "step-4"),
                                      (ck / "step-4").write_text("x")), "is a file"),
    "dir-for-latest": (lambda ck: ((ck / "latest").unlink(), (ck / "latest").mkdir()),
                       "latest is not a file"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_corrupt_checkpoint_is_one_line_exit_2(case: str, saved: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    shutil.rmtree(ck / "step-2")  # no older step to fall back to (that is tested below)
    corrupt, expect = CORRUPTIONS[case]
    corrupt(ck)
    capsys.readouterr()
    assert main([*RUN, "--steps", "6", "--checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("hetpar: error: checkpoint: "), err
    assert expect in err, err


def test_checkpoint_root_that_is_a_file(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "f").write_text("x")
    assert main([*RUN, "--checkpoint", str(tmp_path / "f")]) == 2
    assert "is a file, expected a directory" in capsys.readouterr().err


def test_missing_latest_uses_the_newest_verified_step_and_says_so(
        saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    (ck / "latest").unlink()
    _flip(_shard(ck))  # step-4 is now corrupt: step-2 is the newest that verifies
    assert main([*RUN, "--steps", "2", "--checkpoint", str(ck)]) == 0
    err = capsys.readouterr().err
    assert "has no 'latest' file; using the newest verified step-2 (skipped step-4:" in err
    assert f"resuming from {ck / 'step-2'} step 2" in err


def test_corrupt_latest_falls_back_to_the_newest_valid_step_naming_both(
        saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # issue 34: a flipped bit in the newest step no longer stops a run whose previous
    # checkpoint is intact; the warning names the corrupt step, its file and the one used.
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _flip(_shard(ck))
    assert main([*RUN, "--steps", "6", "--checkpoint", str(ck)]) == 0
    err = capsys.readouterr().err
    assert (f"checkpoint: the latest {ck / 'step-4'} is corrupt ({_shard(ck)} fails its "
            f"SHA-256 check (corrupted)); falling back to the newest verified "
            f"{ck / 'step-2'}") in err, err
    assert f"resuming from {ck / 'step-2'} step 2" in err, err
    # Training reached step 6 from step 2: equal to a run from scratch (resume is exact).
    ref = tmp_path / "ref"
    assert main([*RUN, "--steps", "6", "--checkpoint", str(ref)]) == 0
    verify(ck / "step-6", 6)
    got = torch.load(_as_torch(ck / "step-6"), weights_only=True)
    want = torch.load(_as_torch(ref / "step-6"), weights_only=True)
    assert sorted(got) == sorted(want)
    for k, t in want.items():
        assert torch.equal(got[k], t), k


def _as_torch(path: Path) -> Path:
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    out = path.parent / (path.name + ".pt")
    dcp_to_torch_save(str(path), str(out))
    return out


def test_rewriting_a_corrupt_latest_step_first_points_latest_at_a_valid_one(
        saved: Path, tmp_path: Path) -> None:
    # After a fallback, rank 0 removes the corrupt step-4 before saving step 4 again; a
    # crash in between must not leave `latest` naming a step that is gone (exit 2).
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _flip(_shard(ck))
    unname(ck, 2)  # latest names 4, not 2: nothing to do
    assert (ck / "latest").read_text() == "4"
    unname(ck, 4)
    assert (ck / "latest").read_text() == "2"
    (ck / "latest").write_text("4")
    (ck / "step-2" / "manifest.json").write_text("{")
    unname(ck, 4)  # no older step verifies: no `latest` at all (resolve then says so)
    assert not (ck / "latest").exists()


def test_every_step_corrupt_is_exit_2_naming_the_latest(
        saved: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    _flip(_shard(ck))
    (ck / "step-2" / "manifest.json").write_text("{")
    assert main([*RUN, "--steps", "6", "--checkpoint", str(ck)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "fails its SHA-256 check" in err, err
    assert "(and no older step directory verifies)" in err, err


def test_steps_below_the_checkpoint_is_exit_2(saved: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, "--steps", "3", "--checkpoint", str(saved)]) == 2
    assert "--steps 3 is below the step 4 of the checkpoint" in capsys.readouterr().err


def test_resume_says_where_it_resumed(saved: Path, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(saved, ck)
    assert main([*RUN, "--steps", "5", "--checkpoint", str(ck), "--keep", "1"]) == 0
    assert f"resuming from {ck / 'step-4'} step 4" in capsys.readouterr().err
    assert sorted(p.name for p in ck.glob("step-*")) == ["step-5"]  # --keep 1


@pytest.mark.parametrize(("lr", "says"), [
    ("nan", "'nan' is not a finite number"), ("inf", "'inf' is not a finite number"),
    ("-1", "allowed: > 0 and <= 1"), ("0", "allowed: > 0 and <= 1"),
    ("1e9", "allowed: > 0 and <= 1"), ("1_0", "'1_0' is not a finite number"),
])
def test_bad_learning_rate_is_refused_before_forking(
        lr: str, says: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*RUN, f"--lr={lr}"]) == 2  # argparse's type: the strict number parser
    err = capsys.readouterr().err.strip()
    assert err.startswith("hetpar: error: argument --lr:") and says in err, err
    assert "\n" not in err


def test_host_memory_is_checked_before_forking(monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from hetpar.runtime import dryrun

    monkeypatch.setattr(dryrun, "available_host_bytes", lambda: 23 * 2**30)
    for extra in (["--dry-run"], []):
        rc = main(["run", "--model", "llama3.1-8b", "--plan", "tp=2,gbs=8", *extra])
        assert rc == 2
        err = capsys.readouterr().err.strip()
        assert "need >= 127.49 GiB" in err and "23.00 GiB available" in err, err
    assert main(["run", "--model", "tiny-llama", "--plan", "tp=2,gbs=8", "--dry-run"]) == 0
    assert "host memory: 2 local rank(s) need >= 0.00 GiB" in capsys.readouterr().out


def test_gpu_memory_check_places_ranks_round_robin() -> None:
    from hetpar.catalog import load_model, load_plan
    from hetpar.errors import Infeasible
    from hetpar.runtime.dryrun import check_device_memory, rank_state_bytes
    from hetpar.runtime.layout import build_layout

    layout = build_layout(load_plan("tp=2,gbs=8"), load_model("llama3.1-8b"), None)
    per = rank_state_bytes(layout, 4)
    assert len(per) == 2 and per[0] == per[1] and abs(per[0] / 2**30 - 63.75) < 0.01
    assert "cuda:0 needs >= 63.75 GiB" in check_device_memory(layout, 4, "float32",
                                                              [80 * 2**30, 80 * 2**30])
    with pytest.raises(Infeasible, match=r"cuda:0 needs >= 127.49 GiB .* 80.00 GiB free"):
        check_device_memory(layout, 4, "float32", [80 * 2**30])  # both ranks on one GPU


def test_non_finite_loss_stops_or_skips(monkeypatch: pytest.MonkeyPatch,
                                        capfd: pytest.CaptureFixture[str]) -> None:
    from hetpar.runtime import model

    real = model.head_loss

    def poisoned(*a: object, **k: object) -> torch.Tensor:
        return real(*a, **k) * float("nan")  # type: ignore[arg-type]

    monkeypatch.setattr(model, "head_loss", poisoned)  # the forked ranks inherit it
    assert main([*RUN, "--steps", "2"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert err[-1].startswith("hetpar: error: training: loss is nan at step 0"), err
    assert main([*RUN, "--steps", "2", "--on-nan", "skip"]) == 0
    assert capfd.readouterr().err.count("update skipped (--on-nan skip)") == 2
