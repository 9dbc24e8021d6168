"""The command line end to end, on the smoke config and fake data."""

import csv
import os
import subprocess
import sys

import pytest
import torch

import vit
from conftest import REPO, SMOKE, data_args
from vit.cli import main


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
    assert {"train/loss", "val/acc", "val/acc_top5", "lr-AdamW/decay"} <= set(columns)

    # test with the checkpoint alone: the architecture (dim 32, depth 2) comes from the file
    tested = main(["test", "--ckpt_path", str(ckpts / "last.ckpt"), *data_args(fake_data)])
    metrics = tested.trainer.callback_metrics
    assert {"test/acc", "test/acc_top5", "test/loss"} <= set(metrics)
    assert 0 <= metrics["test/acc"] <= metrics["test/acc_top5"] <= 1
    assert tested.model.model.dim == 32

    # the plain backbone from the checkpoint computes what the Lightning module computes
    backbone = vit.ViT.from_checkpoint(ckpts / "last.ckpt").eval()
    module = vit.ViTClassifier.load_from_checkpoint(ckpts / "last.ckpt", weights_only=True).eval()
    images = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(backbone(images), module(images))
    assert not any(isinstance(m, vit.ViTClassifier) for m in backbone.modules())

    # resume: one more epoch continues from step 8 in the same run folder
    resumed = main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "3",
                    "--ckpt_path", str(ckpts / "last.ckpt")])
    assert resumed.trainer.global_step == 12
    assert resumed.trainer.log_dir == str(run_dir)
    assert torch.load(ckpts / "last.ckpt", weights_only=True)["global_step"] == 12


def test_validate_uses_checkpoint_and_explicit_args_win(fake_data, run_dir):
    main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "1"])
    last = str(run_dir / "checkpoints" / "last.ckpt")
    validated = main(["validate", "--ckpt_path", last, *data_args(fake_data), "--model.tta_flip", "true"])
    assert "val/acc" in validated.trainer.callback_metrics
    assert validated.model.hparams.tta_flip and validated.model.model.dim == 32
    # without a logger there is no run folder, and nothing lands in the working directory either
    before = set(os.listdir())
    main(["validate", "--ckpt_path", last, *data_args(fake_data), "--trainer.logger", "false"])
    assert set(os.listdir()) == before


def test_print_config_shows_the_full_config(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", SMOKE, "--model.lr", "0.002", "--print_config"])
    out = capsys.readouterr().out
    assert "lr: 0.002" in out and "max_epochs: 2" in out and "data_dir:" in out


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
