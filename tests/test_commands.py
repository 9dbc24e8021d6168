"""The commands as a user meets them: help text, where evaluations write, refused options, early one-line errors, a
quiet console, folder scanning, option spellings, and faults of the disk and of paths."""

import re
import resource
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from helpers import REPO, SMOKE, data_args, tiny_vit, write_training_checkpoint
from vit.data.files import scan_images
from vit.tools import predict
from vit.train.cli import main


@pytest.fixture(scope="module")
def smoke_run(fake_data, tmp_path_factory):
    """A finished smoke run (2 epochs), in its own working directory."""
    root = tmp_path_factory.mktemp("smoke_run")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.enable_progress_bar", "false"])
    return root / "runs" / "smoke" / "version_0"


def run_cli(args, cwd, **kwargs):
    return subprocess.run([sys.executable, str(REPO / "train.py"), *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, **kwargs)


# ---- 1. help that helps ----------------------------------------------------------------------------------------


def help_text(args, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(args)
    assert exit_.value.code == 0
    return capsys.readouterr().out


def undescribed(text: str, group: str) -> list[str]:
    """The ``--group.*`` options of a help text with nothing between the option (with its metavar or choices)
    and ``(type: ...)``: no description."""
    blocks = [b for b in re.split(r"\n(?=  --)", text) if re.match(rf"  --{group}\.\w", b)]
    assert len(blocks) >= 10
    found = {b.split()[0]: re.sub(r"^\s*--\S+( [A-Z_]+| \{[^}]*\})?", "", b).split("(type:")[0] for b in blocks}
    return [name for name, description in found.items() if not re.search(r"[a-z]{3}", description)]


def test_every_model_and_data_option_is_described_in_plain_text(capsys):
    text = help_text(["fit", "--help"], capsys)
    assert "``" not in text and ":class:" not in text
    assert not undescribed(text, "model")
    assert "--model.size {micro,tiny,small,base}" in text
    ckpt_help = text[text.index("  --ckpt_path"):]
    assert "'last'" in ckpt_help.split("  --", 2)[1]
    for data in ("CIFAR10DataModule", "ImageFolderDataModule"):
        text = help_text(["fit", "--data.help", data], capsys)
        assert not undescribed(text, "data") and "``" not in text


# ---- 2. evaluating writes beside the evaluated run ---------------------------------------------------------------


def test_test_writes_its_metrics_into_the_run_not_a_new_run(smoke_run, fake_data, monkeypatch, capsys):
    monkeypatch.chdir(smoke_run.parent.parent.parent)
    for _ in range(2):
        main(["test", "--ckpt_path", str(smoke_run / "checkpoints" / "best.ckpt"), *data_args(fake_data)])
    assert sorted(p.name for p in (smoke_run.parent.parent).iterdir()) == ["smoke"]  # no runs/vit
    assert sorted(p.name for p in smoke_run.parent.iterdir()) == ["version_0"]  # no second training run
    evaluations = sorted(smoke_run.glob("eval/version_*/metrics.csv"))
    assert len(evaluations) == 2
    printed = re.findall(r"^metrics: (.*)$", capsys.readouterr().out, re.M)
    assert [Path(p).resolve() for p in printed] == [p.resolve() for p in evaluations]


# ---- 3. one optimizer setting ----------------------------------------------------------------------------------


def test_lightning_optimizer_options_are_refused_with_the_models(fake_data, workdir, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", SMOKE, *data_args(fake_data), "--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.5"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--optimizer/--lr_scheduler are not options here" in err and "--model.optimizer adamw|muon" in err
    assert not (workdir / "runs").exists()


# ---- 4. contradictions caught before training ------------------------------------------------------------------


@pytest.mark.parametrize("args, message", [
    (["--model.num_classes", "3"], r"--model.num_classes comes from the data \(data.num_classes\): drop it"),
    (["--model.image_size", "64"], r"--model.image_size comes from the data \(data.image_size\): drop it"),
    (["--model.in_channels", "1"], r"the model takes 1-channel images \(--model.in_channels\) but the data's are RGB"),
])
def test_a_model_that_contradicts_the_data_fails_before_training(args, message, fake_data, workdir, capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--config", SMOKE, *data_args(fake_data), *args])
    assert re.search(message, capsys.readouterr().err)
    assert not (workdir / "runs").exists()


def test_resuming_past_max_epochs_says_what_to_change(smoke_run, fake_data, monkeypatch, capsys):
    monkeypatch.chdir(smoke_run.parent.parent.parent)
    with pytest.raises(SystemExit):
        main(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.max_epochs", "1",
              "--ckpt_path", str(smoke_run / "checkpoints" / "last.ckpt")])
    assert "past --trainer.max_epochs 1: pass a larger --trainer.max_epochs" in capsys.readouterr().err


# ---- 5. a quiet console ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_smoke_fit_prints_the_run_and_no_noise(fake_data, tmp_path):
    result = run_cli(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.enable_progress_bar", "false"],
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    console = result.stdout + result.stderr
    for noise in ("GPU available", "TPU available", "litlogger", "LeafSpec", "Seed set", "Loading `train_dataloader`",
                  "Previous log files"):
        assert noise not in console
    assert "run folder: runs/smoke/version_0 (checkpoints/best.ckpt, checkpoints/last.ckpt)" in console
    tested = run_cli(["test", "--ckpt_path", "runs/smoke/version_0/checkpoints/best.ckpt", *data_args(fake_data)],
                     cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr
    assert "test/acc" in tested.stdout and "Please add the following callbacks" not in tested.stderr
    assert "Restoring states" not in tested.stdout + tested.stderr


# ---- 6. one folder scan ----------------------------------------------------------------------------------------


def write_image(path, size=(12, 10), fmt=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((*size, 3), 128, np.uint8)).save(path, format=fmt)
    return path


def test_folder_scan_takes_every_image_suffix_and_counts_what_it_skips(tmp_path):
    for name in ("a.png", "b.JPG", "c.webp", "d.BMP", "e.tif", "sub/f.jpeg"):
        write_image(tmp_path / name)
    write_image(tmp_path / ".hidden.png")
    write_image(tmp_path / ".git" / "x.png")
    (tmp_path / "notes.txt").write_text("no")
    (tmp_path / "empty.png").touch()
    scan = scan_images([tmp_path])
    assert [p.relative_to(tmp_path).as_posix() for p in scan.images] == [
        "a.png", "b.JPG", "c.webp", "d.BMP", "e.tif", "sub/f.jpeg"]
    assert scan.summary().startswith("skipped 4 files (1 empty, 2 hidden, 1 not an image): ")


def test_predict_on_a_folder_classifies_them_all_and_names_an_empty_file(tmp_path, capsys):
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=3))
    for name in ("a.png", "b.webp", "c.bmp", "d.tiff"):
        write_image(tmp_path / "photos" / name)
    (tmp_path / "photos" / ".hidden.png").touch()
    (tmp_path / "empty.jpg").touch()
    assert predict.main(["--ckpt_path", str(ckpt), str(tmp_path / "photos"), str(tmp_path / "empty.jpg")]) == 0
    out, err = capsys.readouterr()
    assert len(out.strip().splitlines()) == 4
    assert "skipped 1 file (1 hidden)" in err and "empty.jpg' is empty (0 bytes)" in err


# ---- 7. one option style ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["--top_k", "--top-k"])
def test_tool_options_take_both_spellings(spelling, tmp_path, capsys):
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=3))
    image = write_image(tmp_path / "a.png")
    assert predict.main(["--ckpt_path", str(ckpt), str(image), spelling, "2", "--batch-size=4"]) == 0
    assert capsys.readouterr().out.count(" 0.") == 2  # two classes reported


def test_a_misspelt_tool_option_names_the_closest(tmp_path, capsys):
    with pytest.raises(SystemExit):
        predict.main(["--ckpt_path", "x.ckpt", "a.png", "--topk", "2"])
    assert "(did you mean --top_k?)" in capsys.readouterr().err


# ---- 8. every loader returns eval mode -------------------------------------------------------------------------


def test_every_loader_returns_eval_mode(tmp_path):
    timm = pytest.importorskip("timm")
    trained = tiny_vit().train()
    trained.save_safetensors(tmp_path / "m.safetensors")
    loaded = [vit.ViT.from_checkpoint(write_training_checkpoint(tmp_path / "m.ckpt", trained)),
              vit.ViT.from_safetensors(tmp_path / "m.safetensors"),
              vit.ViT.from_timm(timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, num_classes=3))]
    assert [m.training for m in loaded] == [False, False, False]


# ---- 9. faults of the disk and of paths ------------------------------------------------------------------------


def _small_file_limit():  # a disk that fills while the first checkpoint is written
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write then fails with EFBIG instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (64_000, 64_000))


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_is_one_line(fake_data, tmp_path):
    result = run_cli(["fit", "--config", SMOKE, *data_args(fake_data), "--trainer.enable_progress_bar", "false"],
                     cwd=tmp_path, preexec_fn=_small_file_limit)
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Traceback" not in result.stderr
    assert re.search(r"could not write checkpoint '.*\.ckpt': File too large; .* written before are intact", errors[0])
    assert not list(tmp_path.rglob("*.tmp"))


def test_a_folder_for_a_file_and_a_file_for_a_folder_are_named(smoke_run, fake_data, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        main(["test", "--ckpt_path", str(smoke_run.parent), *data_args(fake_data)])
    assert "is a folder, not a checkpoint file" in capsys.readouterr().err
    readme = tmp_path / "README.md"
    readme.write_text("hello")
    with pytest.raises(SystemExit):
        main(["fit", "--config", SMOKE, "--data.data_dir", str(readme)])
    assert "README.md' is a file, not a folder" in capsys.readouterr().err
