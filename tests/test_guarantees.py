"""The guarantees of README's "Guarantees" section, each proved on the CPU in seconds.

1. Bad input fails early with an error that names the offending value or file, and leaves no run folder.
2. Crashes lose almost nothing: atomic checkpoint writes, step-level checkpoints, exact resume, NaN stops.
3. Untrusted files: no loader of the package runs code from a crafted checkpoint.
4. Reproducible: the same config and seed give the same numbers on the CPU.
"""

import os
import pickle
import re
import resource
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from helpers import REPO, SMOKE, copy_with_official_sums, data_args, tiny_vit
from vit.tools import attention_maps, common, export, predict
from vit.train.callbacks import AtomicCheckpointIO
from vit.weights.checkpoint import load_checkpoint_file
from vit.train.cli import main
from vit.train.classifier import ViTClassifier

@pytest.fixture(scope="module")
def smoke_ckpt(fake_data, tmp_path_factory):
    """last.ckpt of a one-epoch smoke run (dim 32, depth 2, heads 2)."""
    root = tmp_path_factory.mktemp("smoke_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "1"])
    return root / "runs/smoke/version_0/checkpoints/last.ckpt"


def truncated(fake_data, tmp_path, monkeypatch):
    path = copy_with_official_sums(fake_data, tmp_path / "data", monkeypatch) / "data_batch_2.bin"
    path.write_bytes(path.read_bytes()[:-100])
    return tmp_path / "data"


def byte_flipped(fake_data, tmp_path, monkeypatch):
    path = copy_with_official_sums(fake_data, tmp_path / "data", monkeypatch) / "data_batch_2.bin"
    raw = bytearray(path.read_bytes())
    raw[12345] ^= 0xFF
    path.write_bytes(bytes(raw))
    return tmp_path / "data"


def misspelt_yaml(tmp_path):
    path = tmp_path / "typo.yaml"
    path.write_text("model:\n  lrr: 0.1\n")
    return str(path)


def not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("these are my notes, not a checkpoint")
    return str(path)


def unreachable_download(tmp_path, monkeypatch):
    from torchvision.datasets import CIFAR10

    monkeypatch.setattr(CIFAR10, "url", "http://127.0.0.1:9/cifar-10-python.tar.gz")  # nothing listens there
    return ["--data.data_dir", str(tmp_path / "empty"), "--data.download", "true"]


# (id, arguments after the subcommand built from (tmp_path, fake_data, smoke_ckpt, monkeypatch), the exception
# behind the exit (None: rejected by the argument parser), a regex the one-line error must match)
CLI_CASES = [
    ("unknown-option", lambda t, d, c, m: ["fit", "--config", SMOKE, "--model.lrr", "0.1"],
     None, r"unrecognized arguments: --model.lrr 0.1 \(did you mean --model.lr\?\)"),
    ("unknown-yaml-key", lambda t, d, c, m: ["fit", "--config", SMOKE, "--config", misspelt_yaml(t)],
     None, r"does not accept option 'model.lrr' \(did you mean --model.lr\?\)"),
    ("patch-size", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.patch_size", "5"],
     ValueError, r"image_size 32 is not divisible by patch_size 5"),
    ("heads", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.heads", "3"],
     ValueError, r"dim 32 is not divisible by heads 3"),
    ("lr-negative", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.lr", "-0.1"],
     ValueError, r"lr must be positive, got -0.1"),
    ("num-classes", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.num_classes", "1"],
     None, r"--model.num_classes comes from the data \(data.num_classes\): drop it"),
    ("lr-zero", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.lr", "0"],
     ValueError, r"lr must be positive, got 0"),
    ("batch-size", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--data.batch_size", "0"],
     ValueError, r"batch_size must be positive, got 0"),
    ("epochs-zero", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--trainer.max_epochs", "0"],
     ValueError, r"max_epochs must be positive \(or -1 for no limit\), got 0"),
    ("epochs-negative", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--trainer.max_epochs", "-3"],
     ValueError, r"max_epochs must be positive \(or -1 for no limit\), got -3"),
    ("predict", lambda t, d, c, m: ["predict", "--ckpt_path", str(c), *data_args(d)],
     None, r"invalid choice: 'predict'.*; to classify image files: vit-predict --ckpt_path"),
    ("no-length", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--trainer.max_epochs", "-1"],
     ValueError, r"schedule needs the run's length: set trainer.max_epochs, trainer.max_steps or trainer.max_time"),
    ("test-best-nothing", lambda t, d, c, m: ["test", "--config", SMOKE, *data_args(d), "--ckpt_path", "best"],
     FileNotFoundError, r"no runs/smoke/version_\*/checkpoints/best.ckpt to evaluate"),
    ("val-size", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--data.val_size", "320"],
     ValueError, r"val_size 320 must be smaller than the 320 training images"),
    ("no-training-batch", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--data.val_size", "310"],
     ValueError, r"val_size 310 leaves 10 training images, fewer than one batch of 16"),
    ("num-workers", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--data.num_workers", "-1"],
     ValueError, r"num_workers must be >= 0"),
    ("accumulate", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--trainer.accumulate_grad_batches",
                                       "0"], ValueError, r"accumulate_grad_batches must be >= 1, got 0"),
    ("min-lr-ratio", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.min_lr_ratio", "-0.5"],
     ValueError, r"min_lr_ratio must be in \[0, 1\]"),
    ("cutmix-alpha", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.cutmix_alpha", "-1"],
     ValueError, r"mixup_alpha and cutmix_alpha must be >= 0"),
    ("mix-prob", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--model.mix_prob", "1.5"],
     ValueError, r"mix_prob must be in \[0, 1\], got 1.5"),
    ("eval-ema-without-ema", lambda t, d, c, m: ["test", "--ckpt_path", str(c), *data_args(d), "--model.ema_decay",
                                                 "0.99", "--model.eval_ema", "true"],
     ValueError, r"was trained without a weight average \(ema_decay 0\), so it has no ema_model"),
    ("data-missing", lambda t, d, c, m: ["fit", "--config", SMOKE, "--data.data_dir", str(t / "nowhere"),
                                         "--data.download", "false"],
     FileNotFoundError, r"CIFAR-10 not found in '.*nowhere'"),
    ("download-unavailable", lambda t, d, c, m: ["fit", "--config", SMOKE, *unreachable_download(t, m)],
     FileNotFoundError, r"CIFAR-10 not found in '.*empty' and the download failed"),
    ("data-truncated", lambda t, d, c, m: ["fit", "--config", SMOKE, "--data.data_dir", str(truncated(d, t, m))],
     ValueError, r"data_batch_2.bin' is corrupt"),
    ("data-byte-flipped", lambda t, d, c, m: ["fit", "--config", SMOKE, "--data.data_dir", str(byte_flipped(d, t, m))],
     ValueError, r"data_batch_2.bin' is corrupt"),
    ("ckpt-missing", lambda t, d, c, m: ["test", "--ckpt_path", str(t / "nope.ckpt"), *data_args(d)],
     FileNotFoundError, r"checkpoint '.*nope.ckpt' does not exist"),
    ("resume-nothing", lambda t, d, c, m: ["fit", "--config", SMOKE, *data_args(d), "--ckpt_path", "last"],
     FileNotFoundError, r"no runs/smoke/version_\*/checkpoints/last.ckpt to resume from"),
    ("not-a-checkpoint", lambda t, d, c, m: ["test", "--ckpt_path", not_a_checkpoint(t), *data_args(d)],
     ValueError, r"'.*notes.ckpt' is not a readable PyTorch checkpoint"),
    ("other-architecture", lambda t, d, c, m: ["test", "--ckpt_path", str(c), *data_args(d), "--model.dim", "64"],
     ValueError, (r"last.ckpt' does not fit the model: model.cls_token is \(1, 1, 32\) in the checkpoint but "
                  r"\(1, 1, 64\) here.*asks for dim=64 \(checkpoint: 32\)")),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_bad_command_fails_cleanly(case, workdir, fake_data, smoke_ckpt, monkeypatch, capsys):
    _, make_args, error_type, message = case
    with pytest.raises(SystemExit) as exit_info:
        main(make_args(workdir, fake_data, smoke_ckpt, monkeypatch))
    assert exit_info.value.code == 2
    if error_type is None:
        assert exit_info.value.__cause__ is None
    else:
        assert isinstance(exit_info.value.__cause__, error_type)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and re.search(message, errors[0]), err
    # nothing that looks like a result: no run folder at all
    assert not list(workdir.glob("runs/*/version_*")), sorted(map(str, workdir.rglob("*")))


@pytest.mark.slow
def test_command_line_prints_one_error_line_and_exits_2(fake_data, tmp_path):
    """The same as a user sees it: ``python train.py ...`` prints the error, not a traceback."""
    result = subprocess.run(
        [sys.executable, str(REPO / "train.py"), "fit", "--config", SMOKE, *data_args(fake_data), "--model.heads", "3"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == "error: dim 32 is not divisible by heads 3"
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("version_*"))


def images(**changes):
    x = torch.randn(2, 3, 32, 32)
    if "channels" in changes:
        x = torch.randn(2, changes["channels"], 32, 32)
    if "size" in changes:
        x = torch.randn(2, 3, changes["size"], changes["size"])
    if "dtype" in changes:
        x = x.to(changes["dtype"])
    if "nan_at" in changes:
        x[changes["nan_at"]] = float("nan")
    return x


def not_an_image(tmp_path):
    path = tmp_path / "holiday.png"
    path.write_text("this is not a PNG")
    return path


MODEL = dict(image_size=32, depth=1, num_classes=10)  # tiny_vit(**MODEL): 32x32 images, 4x4 patches, dim 32
# (id, call given tmp_path, exception type, regex the message must match)
PYTHON_CASES = [
    ("forward-channels", lambda t: tiny_vit(**MODEL)(images(channels=1)), ValueError, r"expected 3 channels, got 1"),
    ("forward-size", lambda t: tiny_vit(**MODEL)(images(size=30)), ValueError,
     r"expected images of size 32x32, got 30x30"),
    ("forward-dtype", lambda t: tiny_vit(**MODEL)(images(dtype=torch.uint8)), TypeError, r"got torch.uint8"),
    ("forward-not-a-tensor", lambda t: tiny_vit(**MODEL)(np.zeros((2, 3, 32, 32))), TypeError, r"got ndarray"),
    ("predict-float-images", lambda t: common.predict(tiny_vit(**MODEL), images()), TypeError,
     r"expected uint8 images \(as decoded from files\), got torch.float32"),
    ("predict-not-an-image", lambda t: common.load_image(not_an_image(t), (32, 32)), OSError,
     r"cannot identify image file '.*holiday.png'"),
]


@pytest.mark.parametrize("case", PYTHON_CASES, ids=[c[0] for c in PYTHON_CASES])
def test_bad_input_from_python(case, tmp_path):
    _, call, error_type, message = case
    with pytest.raises(error_type, match=message):
        call(tmp_path)


def test_forward_reads_no_pixel_values():
    """The network checks shapes and dtypes, never values: a value check (NaN) would wait for the device on every
    forward, and traced or exported graphs must hold no data-dependent branch. NaN images give NaN logits; the
    tools feed decoded 8-bit images, which cannot hold NaN, and in training the non-finite loss check stops."""
    model = tiny_vit(**MODEL).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the static shape checks; they stay constant
        traced = torch.jit.trace(model, images())
    assert "isfinite" not in str(traced.graph)
    assert model(images(nan_at=(0, 0, 0, 0))).isnan().any()


# ---- 2. crashes lose almost nothing ---------------------------------------------------------------------------


def test_checkpoint_write_failing_part_way_keeps_the_previous_file(tmp_path):
    """A full disk mid-write (here: a file-size limit) leaves the previous last.ckpt whole and no temporary file."""
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.zeros(1000)}, "global_step": 1}, path)
    before = path.read_bytes()
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (4 * len(before), limit[1]))
    try:
        with pytest.raises((OSError, RuntimeError)):
            io.save_checkpoint({"state_dict": {"w": torch.zeros(100_000)}, "global_step": 2}, path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limit)
        signal.signal(signal.SIGXFSZ, handler)
    assert path.read_bytes() == before
    assert load_checkpoint_file(path)["global_step"] == 1
    assert os.listdir(path.parent) == ["last.ckpt"]


LONG = ["--data.batch_size", "4", "--trainer.limit_train_batches", "40", "--trainer.max_epochs", "2",
        "--last_checkpoint.every_n_train_steps", "5"]  # 2 epochs of 40 steps, last.ckpt every 5 steps


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_end(fake_data, tmp_path, monkeypatch):
    """SIGKILL mid-epoch, then ``fit --ckpt_path last``: the run ends as an uninterrupted one does, having
    redone only the steps after the newest step-level checkpoint."""
    args = ["fit", "--config", SMOKE, *data_args(fake_data), *LONG]
    killed = tmp_path / "killed"
    killed.mkdir()
    last = killed / "runs/smoke/version_0/checkpoints/last.ckpt"
    proc = subprocess.Popen([sys.executable, str(REPO / "train.py"), *args], cwd=killed,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not last.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it was killed"
    resumed_from = load_checkpoint_file(last)["global_step"]
    assert 0 < resumed_from < 40 and resumed_from % 5 == 0  # a step-level checkpoint, mid-epoch 0

    steps = []
    monkeypatch.setattr(ViTClassifier, "on_train_batch_start", lambda self, batch, i: steps.append(self.global_step))
    monkeypatch.chdir(killed)
    resumed = main([*args, "--ckpt_path", "last"])
    assert steps == list(range(resumed_from, 80))  # nothing skipped, nothing done twice after the checkpoint
    assert Path(resumed.trainer.log_dir).resolve() == (killed / "runs/smoke/version_0").resolve()  # one run

    monkeypatch.undo()
    (tmp_path / "whole").mkdir()
    monkeypatch.chdir(tmp_path / "whole")
    whole = main(args)
    final_resumed, final_whole = torch.load(last, weights_only=True), torch.load(
        "runs/smoke/version_0/checkpoints/last.ckpt", weights_only=True)
    for key in ("global_step", "epoch"):
        assert final_resumed[key] == final_whole[key]
    assert final_resumed["lr_schedulers"] == final_whole["lr_schedulers"]  # the schedule ends at the same point
    assert whole.trainer.global_step == resumed.trainer.global_step == 80


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(fake_data, workdir, monkeypatch):
    """A weight turned NaN after the step-6 checkpoint: training stops at step 7, naming it; last.ckpt is step 6."""

    def poison_at_step_7(self, batch, batch_idx):
        if self.global_step == 7:
            with torch.no_grad():
                self.model.head.weight.fill_(float("nan"))

    monkeypatch.setattr(ViTClassifier, "on_train_batch_start", poison_at_step_7)
    with pytest.raises(FloatingPointError, match=r"non-finite training loss \(nan\) at step 7 \(epoch 1\)"):
        main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "3",
              "--last_checkpoint.every_n_train_steps", "3"])
    last = load_checkpoint_file(workdir / "runs/smoke/version_0/checkpoints/last.ckpt")
    assert last["global_step"] == 6
    assert all(t.isfinite().all() for t in last["state_dict"].values() if t.is_floating_point())


# ---- 3. untrusted files ---------------------------------------------------------------------------------------


class RunsACommand:
    """Unpickling this calls os.system: what a crafted checkpoint would do."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return os.system, (self.command,)


@pytest.fixture
def crafted_checkpoint(tmp_path):
    """A checkpoint-shaped file whose unpickling touches ``marker``, and the image the loaders are given."""
    marker = tmp_path / "code-ran"
    path = tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt"
    path.parent.mkdir(parents=True)
    model = tiny_vit(**MODEL)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    state["model.head.bias"] = RunsACommand(f"touch {marker}")
    torch.save({"state_dict": state, "vit_config": model.config.to_dict(), "hyper_parameters": {}}, path)
    image = tmp_path / "cat.png"
    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(image)
    return path, marker, image


def test_no_loader_runs_code_from_a_checkpoint(crafted_checkpoint, fake_data, tmp_path, monkeypatch, capsys):
    path, marker, image = crafted_checkpoint
    refused = r"refused to load .*last.ckpt.*could run code"
    loaders = {
        "load_checkpoint_file": lambda: load_checkpoint_file(path),
        "ViT.from_checkpoint": lambda: vit.ViT.from_checkpoint(path),
    }
    for name, load in loaders.items():
        with pytest.raises(ValueError, match=refused):
            load()
        assert not marker.exists(), name
    commands = {  # the command-line tools say the same in one error line
        "vit-predict": lambda: predict.main(["--ckpt_path", str(path), str(image)]),
        "vit-export": lambda: export.main(["--ckpt_path", str(path), "--safetensors", str(tmp_path / "m.safetensors")]),
        "vit-attention-maps": lambda: attention_maps.main(["--ckpt_path", str(path), "--out", str(tmp_path / "a.png"),
                                                           str(image)]),
    }
    for name, command in commands.items():
        with pytest.raises(SystemExit) as exit_info:
            command()
        assert exit_info.value.code == 2 and re.search(refused, capsys.readouterr().err), name
        assert not marker.exists(), name
    # Lightning's loader relies on torch.load's default (weights_only=True since torch 2.6)
    with pytest.raises(pickle.UnpicklingError, match="Weights only load failed"):
        ViTClassifier.load_from_checkpoint(path)
    monkeypatch.chdir(tmp_path)
    for args in (["test", "--ckpt_path", str(path)], ["fit", "--config", SMOKE, "--ckpt_path", "last"]):
        with pytest.raises(SystemExit) as exit_info:
            main([*args, *data_args(fake_data)])
        assert exit_info.value.code == 2 and re.search(refused, capsys.readouterr().err)
    assert not marker.exists()

    torch.load(path, weights_only=False)  # the file really is dangerous: the unrestricted unpickler runs it
    assert marker.exists()


# ---- 4. reproducible ------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_same_config_and_seed_give_the_same_run(fake_data, tmp_path, monkeypatch):
    runs = []
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
        monkeypatch.chdir(tmp_path / name)
        cli = main(["fit", "--config", SMOKE, *data_args(fake_data)])
        assert isinstance(cli.trainer.strategy.checkpoint_io, AtomicCheckpointIO)
        runs.append((dict(cli.trainer.callback_metrics), cli.model.state_dict()))
    (metrics, weights), (metrics2, weights2) = runs
    assert {"val/acc", "val/loss", "train/loss"} <= set(metrics)
    assert "train/images_per_s" in metrics  # wall-clock speed: a measurement of the machine, not of the run
    for key in metrics.keys() - {"train/images_per_s"}:
        assert torch.equal(metrics[key], metrics2[key]), key
    for key in weights:
        assert torch.equal(weights[key], weights2[key]), key


def test_print_config_with_a_checkpoint_shows_its_model(smoke_ckpt, capsys):
    """What the command would run: the checkpoint's architecture, not the defaults it replaces."""
    with pytest.raises(SystemExit):
        main(["test", "--ckpt_path", str(smoke_ckpt), "--print_config"])
    out = capsys.readouterr().out
    assert "  dim: 32\n" in out and "  depth: 2\n" in out
