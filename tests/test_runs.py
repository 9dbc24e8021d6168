"""Run-folder and resume policy (vit.train.runs) and the optimizer's pure parts (vit.train.optim), without a trainer."""

import math
import os

import pytest
import torch

from helpers import tiny_vit
from vit.train import runs
from vit.train.optim import MuonAdamW, make_optimizer, param_groups, warmup_cosine, warmup_cosine_by_progress


def touch(path, mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x")
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


def test_newest_checkpoint_is_the_newest_file_not_the_highest_version(tmp_path):
    touch(tmp_path / "version_3/checkpoints/last.ckpt", mtime=1_000)
    newer = touch(tmp_path / "version_1/checkpoints/last.ckpt", mtime=2_000)
    touch(tmp_path / "version_2/checkpoints/best.ckpt", mtime=3_000)
    assert runs.newest_checkpoint(tmp_path, "last", "resume from") == str(newer)
    with pytest.raises(FileNotFoundError, match=r"--ckpt_path best: no .*version_\*/checkpoints/best.ckpt to evaluate"):
        runs.newest_checkpoint(tmp_path / "none", "best", "evaluate")


def test_run_folder_keeps_the_runs_own_spelling(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpt_path = touch(tmp_path / "runs/a/version_0/checkpoints/last.ckpt")
    ckpt = {"callbacks": {"ModelCheckpoint{...}": {"dirpath": "runs/a/version_0/checkpoints"}}}
    assert str(runs.run_folder(ckpt_path, ckpt)) == "runs/a/version_0"
    assert runs.run_folder(ckpt_path, {}) == (tmp_path / "runs/a/version_0").resolve()


def test_checkpoint_defaults_are_its_model_arguments_and_validation_split():
    ckpt = {"hyper_parameters": {"lr": 0.1, "betas": (0.9, 0.99), "_class_path": "x"},
            "datamodule_hyper_parameters": {"val_size": 64, "batch_size": 8}}
    assert runs.checkpoint_defaults(ckpt) == {"model.lr": 0.1, "model.betas": [0.9, 0.99], "data.val_size": 64}
    assert runs.checkpoint_defaults({}) == {}


def test_metrics_rows_before_a_step(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train/loss,val/acc\n0,9,2.0,\n0,19,1.5,\n0,19,,0.3\n1,29,1.0,\n")
    assert runs.metrics_rows_before(path, 20) == [
        {"epoch": "0", "step": "9", "train/loss": "2.0"},
        {"epoch": "0", "step": "19", "train/loss": "1.5"},
        {"epoch": "0", "step": "19", "val/acc": "0.3"},
    ]
    assert runs.metrics_rows_before(tmp_path / "missing.csv", 20) == []


def test_only_a_run_without_results_is_removed(tmp_path):
    empty = tmp_path / "a/version_0"
    touch(empty / "config.yaml")
    (empty / "checkpoints").mkdir()
    kept = tmp_path / "b/version_0"
    touch(kept / "config.yaml")
    touch(kept / "metrics.csv")
    assert runs.remove_if_no_results(empty) and not (tmp_path / "a").exists()
    assert not runs.remove_if_no_results(kept) and (kept / "metrics.csv").is_file()


def test_mismatch_message_names_tensors_and_arguments():
    ours = {"model.head.weight": torch.zeros(3, 8)}
    ckpt = {"state_dict": {"model.head.weight": torch.zeros(10, 8)}, "vit_config": {"num_classes": 10, "dim": 8}}
    message = runs.mismatch_message("c.ckpt", ckpt, ours, {"num_classes": 3, "dim": 8}, "vit_config")
    assert "model.head.weight is (10, 8) in the checkpoint but (3, 8) here" in message
    assert "num_classes=3 (checkpoint: 10)" in message and "dim=" not in message


def test_param_groups_exempt_biases_norms_and_embeddings():
    model = tiny_vit()
    groups = {g["name"]: g for g in param_groups(model, weight_decay=0.05, lr=1e-3)}
    assert set(groups) == {"decay", "no_decay"}
    assert groups["no_decay"]["weight_decay"] == 0
    assert {id(p) for p in groups["no_decay"]["params"]} == {
        id(p) for n, p in model.named_parameters() if n in model.no_weight_decay()}
    assert all(p.ndim == 2 for p in groups["decay"]["params"])
    assert sum(len(g["params"]) for g in groups.values()) == len(list(model.parameters()))


def test_muon_takes_the_blocks_matrices_with_matched_decay():
    model = tiny_vit()
    groups = {g["name"]: g for g in param_groups(model, weight_decay=0.05, lr=1e-3, muon_lr=0.01)}
    muon = groups["muon"]
    assert muon["lr"] == 0.01 and muon["weight_decay"] == pytest.approx(0.05 * 1e-3 / 0.01)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(names[id(p)].startswith("blocks.") and p.ndim == 2 for p in muon["params"])
    assert isinstance(make_optimizer(list(groups.values()), lr=1e-3, betas=(0.9, 0.999)), MuonAdamW)
    adamw = make_optimizer(param_groups(model, weight_decay=0.05, lr=1e-3), lr=1e-3, betas=(0.9, 0.999))
    assert type(adamw) is torch.optim.AdamW


def test_warmup_then_cosine_to_the_floor():
    schedule = warmup_cosine(100, warmup_fraction=0.1, min_lr_ratio=0.01)
    assert schedule(0) == pytest.approx(0.1) and schedule(9) == pytest.approx(1.0)
    assert schedule(10) == pytest.approx(1.0)
    assert schedule(55) == pytest.approx(0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert schedule(100) == pytest.approx(0.01) and schedule(500) == pytest.approx(0.01)
    assert all(schedule(s) >= schedule(s + 1) for s in range(10, 120))


def test_the_schedule_by_progress_has_the_same_shape():
    assert warmup_cosine_by_progress(0.05, 0.1, 0.01) == pytest.approx(0.5)
    assert warmup_cosine_by_progress(0.1, 0.1, 0.01) == pytest.approx(1.0)
    assert warmup_cosine_by_progress(0.55, 0.1, 0.01) == pytest.approx(warmup_cosine(100, 0.1, 0.01)(55))
    assert warmup_cosine_by_progress(1.0, 0.1, 0.01) == pytest.approx(0.01)
