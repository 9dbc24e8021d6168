"""The command line end to end, on the smoke config and fake data."""

import csv
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from PIL import Image

from lightning.pytorch.callbacks import Timer

import vit
from helpers import REPO, SMOKE, data_args
from vit.train.callbacks import TrainingSpeed
from vit.train.cli import main


@pytest.fixture
def run_dir(workdir):
    return workdir / "runs" / "smoke" / "version_0"


def test_fit_test_from_checkpoint_and_resume(fake_data, run_dir):
    cli = main(["fit", "--config", SMOKE, *data_args(fake_data)])
    assert cli.trainer.global_step == 8  # 2 epochs x 4 batches
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "best.ckpt").is_file() and (ckpts / "last.ckpt").is_file()
    assert (run_dir / "config.yaml").is_file()
    with open(run_dir / "metrics.csv") as f:
        columns = next(csv.reader(f))
    assert {"train/loss", "val/acc", "val/acc_top5", "lr-AdamW/decay", "train/images_per_s"} <= set(columns)
    with open(run_dir / "metrics.csv") as f:
        speeds = [float(row["train/images_per_s"]) for row in csv.DictReader(f) if row["train/images_per_s"]]
    assert len(speeds) == 2 and all(s > 0 for s in speeds)  # one per epoch

    # test with the checkpoint alone: the architecture (dim 32, depth 2) comes from the file
    tested = main(["test", "--ckpt_path", str(ckpts / "last.ckpt"), *data_args(fake_data)])
    metrics = tested.trainer.callback_metrics
    assert {"test/acc", "test/acc_top5", "test/loss"} <= set(metrics)
    assert 0 <= metrics["test/acc"] <= metrics["test/acc_top5"] <= 1
    assert tested.model.model.config.dim == 32

    # the plain backbone from the checkpoint computes what the Lightning module computes
    backbone = vit.ViT.from_checkpoint(ckpts / "last.ckpt").eval()
    module = vit.ViTClassifier.load_from_checkpoint(ckpts / "last.ckpt", weights_only=True).eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(backbone(images), module(images))
    assert not any(isinstance(m, vit.ViTClassifier) for m in backbone.modules())

    # resume: one more epoch continues from step 8 in the same run folder, configured as the run was (no --config:
    # the smoke config's 4 batches an epoch come from the run's config.yaml), keeping its metrics and best score
    resumed = main(["fit", *data_args(fake_data), "--trainer.max_epochs", "3", "--ckpt_path", str(ckpts / "last.ckpt")])
    assert resumed.trainer.global_step == 12
    assert Path(resumed.trainer.log_dir).resolve() == run_dir.resolve()
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 12
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(row["step"]) for row in rows if row["train/loss"]] == list(range(12))  # steps 0-7 kept, 8-11 added
    scores = [float(row["val/acc"]) for row in rows if row["val/acc"]]
    assert len(scores) == 3
    best = torch.load(ckpts / "best.ckpt", weights_only=True)
    assert resumed.trainer.checkpoint_callback.best_model_score == max(scores)
    assert best["epoch"] == scores.index(max(scores))  # the first of equal scores: a tie does not replace it


def test_training_speed_times_training_batches_only(monkeypatch):
    """Images per second over an epoch: the first batch (compilation, warmup) and validation stay off the clock."""
    clock = iter([10.0, 12.0, 100.0, 101.0])  # every read of the time the callback may make, in order
    monkeypatch.setattr("vit.train.callbacks.time.perf_counter", lambda: next(clock))
    logged = {}
    module = SimpleNamespace(device=torch.device("cpu"), log=lambda name, value, **kw: logged.update({name: value}))
    speed, batch = TrainingSpeed(), (torch.zeros(8, 3, 32, 32), torch.zeros(8))
    speed.on_train_epoch_start(None, module)
    speed.on_train_batch_end(None, module, None, batch, 0)  # t=10: the clock starts, this batch is not timed
    speed.on_train_batch_end(None, module, None, batch, 1)  # 8 images
    speed.on_validation_start(None, module)                 # t=12: stops (2 s so far); validation runs until 100
    speed.on_train_batch_end(None, module, None, batch, 2)  # t=100: restarts, this batch is not timed
    speed.on_train_batch_end(None, module, None, batch, 3)  # 8 images
    speed.on_train_epoch_end(None, module)                  # t=101: 1 s more
    assert logged == {"train/images_per_s": 16 / 3}


@pytest.mark.slow
def test_validate_uses_checkpoint_and_explicit_args_win(fake_data, run_dir):
    main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "1", "--data.val_size", "32"])
    last = str(run_dir / "checkpoints" / "last.ckpt")
    # the run's validation split comes with its checkpoint: another would hold images the run trained on
    split = main(["validate", "--ckpt_path", last, "--data.data_dir", str(fake_data), "--data.verify", "false"])
    assert split.datamodule.val_size == 32
    validated = main(["validate", "--ckpt_path", last, *data_args(fake_data), "--model.tta_flip", "true"])
    assert "val/acc" in validated.trainer.callback_metrics
    assert validated.model.hparams.tta_flip and validated.model.model.config.dim == 32
    # "last" and "best" name the newest run's files, not an untrained model
    explicit = main(["test", "--ckpt_path", last, *data_args(fake_data)]).trainer.callback_metrics
    for name in ("last", "best"):
        named = main(["test", "--config", SMOKE, "--ckpt_path", name, *data_args(fake_data)])
        # one epoch: best is last (the smoke config batches the same test images differently: float rounding)
        torch.testing.assert_close(named.trainer.callback_metrics["test/loss"], explicit["test/loss"])
    # without a logger there is no run folder, and nothing lands in the working directory either
    before = set(os.listdir())
    main(["validate", "--ckpt_path", last, *data_args(fake_data), "--trainer.logger", "false"])
    assert set(os.listdir()) == before


def test_print_config_shows_the_full_config(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", SMOKE, "--model.lr", "0.002", "--print_config"])
    out = capsys.readouterr().out
    assert "lr: 0.002" in out and "max_epochs: 2" in out and "data_dir:" in out


@pytest.mark.parametrize("configs, max_time, name", [
    (["cifar10_cpu15.yaml"], "00:00:15:00", "cifar10_cpu15"),
    (["cifar10_cpu15.yaml", "cifar10_cpu5.yaml"], "00:00:05:00", "cifar10_cpu5"),
    (["cifar10_cpu15.yaml", "cifar10_cpu60.yaml"], "00:01:00:00", "cifar10_cpu60"),
    (["cifar10_vit_small.yaml"], None, "cifar10_vit_small"),
])
def test_shipped_configs_resolve(configs, max_time, name, capsys):
    """Every config in configs/ parses; the 5- and 60-minute ones change only the budget of the 15-minute one."""
    with pytest.raises(SystemExit):
        main(["fit", *[arg for c in configs for arg in ("--config", str(REPO / "configs" / c))], "--print_config"])
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["trainer"]["max_time"] == max_time and config["trainer"]["logger"]["init_args"]["name"] == name
    if max_time:
        assert config["trainer"]["max_epochs"] == -1 and config["model"]["patch_drop_until"] == 0.9


@pytest.mark.slow
def test_ddp_on_two_cpu_processes(fake_data, tmp_path):
    """The same command under Lightning's DDP strategy (gloo on CPU): each process trains on its shard."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", SMOKE, *data_args(fake_data),
         "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    ckpt = torch.load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == 8 and ckpt["epoch"] == 1
    assert "run folder:" in result.stdout + result.stderr


def test_last_checkpoint_every_epoch_also_between_validations(fake_data, run_dir, monkeypatch):
    """Validation every 3rd epoch: last.ckpt is still refreshed at every epoch's end, so a crash loses one epoch."""
    seen = []

    def record(self):
        path = run_dir / "checkpoints" / "last.ckpt"
        seen.append(torch.load(path, weights_only=True)["global_step"] if path.exists() else None)

    monkeypatch.setattr(vit.ViTClassifier, "on_train_epoch_start", record)
    main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "3",
          "--trainer.check_val_every_n_epoch", "3"])
    assert seen == [None, 4, 8]


def test_weight_average_updates_once_per_optimizer_step(fake_data, workdir, monkeypatch):
    """With gradient accumulation the average moves when the weights do, not on every micro-batch."""
    updates = []
    original = vit.ViTClassifier.on_train_batch_end

    def spy(self, outputs, batch, batch_idx):
        before = [p.clone() for p in self.ema_model.parameters()]
        original(self, outputs, batch, batch_idx)
        if any(not torch.equal(a, b) for a, b in zip(before, self.ema_model.parameters())):
            updates.append(self.global_step)

    monkeypatch.setattr(vit.ViTClassifier, "on_train_batch_end", spy)
    cli = main(["fit", "--config", SMOKE, *data_args(fake_data), "--model.ema_decay", "0.9",
                "--trainer.accumulate_grad_batches", "2"])
    assert cli.trainer.global_step == 4 and updates == [1, 2, 3, 4]


@pytest.mark.slow
def test_accuracy_against_budget_from_run_folders(fake_data, workdir):
    """scripts/plot_budgets.py turns a time-budget run, tested on its final weights, into a table row and a PNG."""
    main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "-1", "--trainer.max_time",
          "00:00:00:03", "--trainer.limit_train_batches", "2", "--trainer.check_val_every_n_epoch", "5"])
    run = workdir / "runs" / "smoke" / "version_0"
    tested = main(["test", "--ckpt_path", str(run / "checkpoints" / "last.ckpt"), *data_args(fake_data)])
    figure = workdir / "accuracy.png"
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "plot_budgets.py"), str(run), "--out", str(figure)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-3000:]
    row = next(line for line in result.stdout.splitlines() if line.startswith("| 0.05 min |"))
    assert f"{100 * tested.trainer.callback_metrics['test/acc'].item():.2f}%" in row
    with Image.open(figure) as image:
        assert image.format == "PNG" and image.size == (640, 420)


def test_time_budget_alone_sizes_the_schedule(fake_data, workdir):
    """max_time without max_epochs/max_steps: the warmup + cosine runs over the budget and ends where it ends."""
    budget = 6  # seconds
    cli = main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "-1",
                "--trainer.max_time", f"00:00:00:0{budget}", "--trainer.limit_train_batches", "2",
                "--trainer.check_val_every_n_epoch", "5", "--model.min_lr_ratio", "0.1"])
    timer = next(c for c in cli.trainer.callbacks if isinstance(c, Timer))
    assert budget <= timer.time_elapsed() < budget + 3  # stopped by the budget, within a step or so of it
    with open(Path(cli.trainer.log_dir) / "metrics.csv") as f:
        lrs = [float(row["lr-AdamW/decay"]) for row in csv.DictReader(f) if row.get("lr-AdamW/decay")]
    peak = cli.model.hparams.lr
    assert len(lrs) > 10 and max(lrs) > 0.9 * peak  # warmed up to the peak ...
    assert lrs[-1] < 0.15 * peak  # ... and decayed to about min_lr_ratio x peak when the time ran out
    assert all(a >= b for a, b in zip(lrs[lrs.index(max(lrs)):], lrs[lrs.index(max(lrs)) + 1:]))
