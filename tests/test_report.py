"""vit-report: one self-contained HTML page per run, made with the real command line, for a CIFAR-10 run, a
folder-data run, and runs without a checkpoint or a validation yet."""

import base64
import csv
import html
import io
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers import SMOKE, data_args
from vit.tools.report import main as report
from vit.train.cli import main as train

SECTIONS = ("At a glance", "Training curves", "Confusion matrix", "Per-class precision and recall",
            "Most confident mistakes", "Attention rollout")
EVALUATED = SECTIONS[2:]  # the sections that need a checkpoint and the data


def fit(*args: str) -> Path:
    """A smoke run in the working directory (``runs/smoke/version_<n>``); returns its folder."""
    train(["fit", "--config", SMOKE, *args, "--trainer.enable_progress_bar", "false"])
    return max(Path("runs/smoke").glob("version_*"), key=lambda p: int(p.name.split("_")[1]))


def make(run: Path, *args: str, capsys) -> str:
    """The page ``vit-report run ...`` writes, after checking that it says where."""
    capsys.readouterr()
    report([str(run), *args])
    out = capsys.readouterr().out
    path = Path(re.fullmatch(r"wrote (.+)\n", out)[1])
    return path.read_text(encoding="utf-8")


def sections(page: str) -> dict[str, str]:
    """Each h2 heading's text -> the HTML up to the next one."""
    parts = re.split(r"<h2[^>]*>([^<]*)</h2>", page)
    return {heading: body for heading, body in zip(parts[1::2], parts[2::2])}


def section(page: str, start: str) -> str:
    return next(body for heading, body in sections(page).items() if heading.startswith(start))


def glance(page: str) -> dict[str, str]:
    """The at-a-glance table as label -> text (tags dropped)."""
    rows = re.findall(r"<tr><th>([^<]+)</th><td>(.*?)</td></tr>", section(page, "At a glance"))
    return {label: html.unescape(re.sub(r"<[^>]+>", "", value)) for label, value in rows}


def embedded_images(page: str) -> list[Image.Image]:
    """Every image of the page, each checked to decode; the page links to nothing else."""
    assert not re.search(r"""(?:src|href)=["'](?!data:image/png;base64,|#)""", page)  # no file, no network
    found = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    images = []
    for data in found:
        raw = base64.b64decode(data, validate=True)
        Image.open(io.BytesIO(raw)).verify()
        images.append(Image.open(io.BytesIO(raw)))
    return images


def val_accuracies(run: Path) -> list[float]:
    with open(run / "metrics.csv", newline="") as f:
        return [float(row["val/acc"]) for row in csv.DictReader(f) if row.get("val/acc")]


def test_cifar10_run(workdir, fake_data, capsys):
    run = fit(*data_args(fake_data))
    page = make(run, capsys=capsys)
    assert (run / "report.html").is_file()
    assert [h for h in sections(page) if not h.startswith(SECTIONS)] == []
    assert all(any(h.startswith(s) for h in sections(page)) for s in SECTIONS)
    assert 'class="missing"' not in page
    images = embedded_images(page)
    assert len(images) == 2 + 16 + 8  # curves, confusion matrix, mistakes, rollout pairs
    assert all(min(image.size) >= 96 for image in images[2:])  # 32-pixel images shown upscaled
    facts = glance(page)
    assert facts["Data"].startswith("CIFAR10DataModule(") and "val_size=64" in facts["Data"]
    assert facts["Classes"].startswith("10: airplane, automobile")
    assert "dim 32, depth 2, heads 2" in facts["Model"] and facts["Parameters"].endswith(")")
    assert "optimizer adamw (lr 0.001)" in facts["Training"] and "batch size 16" in facts["Training"]
    assert "accelerator cpu" in facts["Hardware"] and facts["Report made on"]
    assert facts["Wall time"] != "not recorded" and "images/s" in facts["Training speed"]
    assert facts["Best validation accuracy"].startswith(f"{100 * max(val_accuracies(run)):.2f}%")
    assert facts["Test accuracy"].startswith("not tested: python train.py test --ckpt_path")
    # the best checkpoint run over the validation split as validation ran it: the same accuracy
    assert f"top-1 accuracy <b>{100 * max(val_accuracies(run)):.2f}%</b>" in section(page, "Confusion matrix")
    assert section(page, "Per-class").count("<tr>") == 1 + 10
    assert section(page, "Confusion matrix").startswith("\n<p>64 validation images, best.ckpt")

    train(["test", "--config", SMOKE, "--ckpt_path", "best", *data_args(fake_data)])
    page = make(run, "--split", "test", "--ckpt", "last", "--out", "other.html", capsys=capsys)
    assert Path("other.html").is_file()
    assert "Confusion matrix (test split)" in sections(page)
    assert section(page, "Confusion matrix").startswith("\n<p>64 test images, last.ckpt")
    assert re.match(r"\d+\.\d\d% \(eval/version_0, checkpoints/best\.ckpt\)", glance(page)["Test accuracy"])
    embedded_images(page)


@pytest.mark.slow
def test_folder_data_run_with_its_own_classes(workdir, capsys):
    rng = np.random.default_rng(0)
    names = ["circle", "square", "triangle"]
    for label, name in enumerate(names):
        (workdir / "shapes" / name).mkdir(parents=True)
        for i in range(12):
            pixels = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
            pixels[..., label] = 255
            Image.fromarray(pixels).save(workdir / "shapes" / name / f"{i}.png")
    run = fit("--data", "ImageFolderDataModule", "--data.root", "shapes", "--data.batch_size", "8",
              "--data.image_size", "16", "--data.num_workers", "0")
    page = make(run, capsys=capsys)
    facts = glance(page)
    assert facts["Data"].startswith("ImageFolderDataModule(root='shapes'")
    assert facts["Classes"] == "3: circle, square, triangle"
    assert "16×16 images" in facts["Model"]
    per_class = section(page, "Per-class")
    assert [re.search(rf"<td>{n}</td>", per_class) is not None for n in names] == [True] * 3
    assert 'class="missing"' not in page
    embedded_images(page)

    # from elsewhere: the run's relative root still resolves (from where the run was started)
    other = workdir / "elsewhere"
    other.mkdir()
    capsys.readouterr()
    report([str(run.resolve()), "--out", str(other / "r.html")])
    assert 'class="missing"' not in (other / "r.html").read_text()
    # a split the data does not have: the evaluated sections say so, the rest is there
    page = make(run, "--split", "test", capsys=capsys)
    assert "no test split" in section(page, "Confusion matrix (test split)")
    assert "Training curves" in sections(page)


@pytest.mark.slow
def test_run_without_validation_then_without_checkpoint(workdir, fake_data, capsys):
    run = fit(*data_args(fake_data), "--trainer.limit_val_batches", "0", "--trainer.max_epochs", "1")
    assert not (run / "checkpoints" / "best.ckpt").exists()
    page = make(run, capsys=capsys)
    facts = glance(page)
    assert facts["Best validation accuracy"] == "no validation yet"
    assert facts["Checkpoint evaluated"].startswith("checkpoints/last.ckpt: no best.ckpt yet")
    assert "no validation yet" in section(page, "Training curves")
    assert 'class="missing"' not in section(page, "Confusion matrix")  # last.ckpt still evaluates
    embedded_images(page)

    shutil.rmtree(run / "checkpoints")
    capsys.readouterr()
    report([str(run)])
    assert "note: no evaluation in the report: no checkpoint" in capsys.readouterr().err
    page = (run / "report.html").read_text()
    for name in EVALUATED:
        assert 'class="missing"' in section(page, name)
    assert "no checkpoint in checkpoints/ yet" in section(page, "Confusion matrix")
    facts = glance(page)
    assert "dim 32, depth 2" in facts["Model"] and "from config.yaml" in facts["Model"]
    assert facts["Classes"].startswith("10: airplane")
    embedded_images(page)

    (run / "metrics.csv").unlink()  # a run killed before its first log
    page = make(run, capsys=capsys)
    assert "nothing has been logged" in section(page, "Training curves")
    assert glance(page)["Best validation accuracy"] == "no validation yet"


@pytest.mark.parametrize("args, message", [
    (["missing"], "run folder 'missing' does not exist"),
    (["."], "'.' is not a run folder"),
    (["runs"], "is not a run folder"),
    (["runs/smoke/version_0", "--out", "report.txt"], "--out must end in .htm or .html"),
    (["runs/smoke/version_0", "--ckpt", "nope.ckpt"], "--ckpt 'nope.ckpt': no such file"),
    (["runs/smoke/version_0", "--split", "train"], "invalid choice: 'train'"),
    (["runs/smoke/version_0", "--data-dir", "nowhere"], "--data_dir 'nowhere' is not a folder"),
])
def test_errors_are_one_line(workdir, capsys, args, message):
    (workdir / "runs" / "smoke" / "version_0").mkdir(parents=True)
    (workdir / "runs" / "smoke" / "version_0" / "config.yaml").write_text("trainer: {}\n")
    with pytest.raises(SystemExit) as exit_:
        report(args)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("vit-report: error:") and message in last, err


def test_a_parent_folder_names_its_newest_run(workdir, capsys):
    for n in (0, 1):
        (workdir / "runs" / "smoke" / f"version_{n}").mkdir(parents=True)
        (workdir / "runs" / "smoke" / f"version_{n}" / "config.yaml").write_text("{}\n")
    with pytest.raises(SystemExit):
        report(["runs/smoke"])
    assert "its newest run is runs/smoke/version_1" in capsys.readouterr().err


def test_confusion_matrix_text_only_for_few_classes():
    from vit.tools.report import confusion_figure

    for n, texts in ((4, True), (25, False)):
        matrix = np.full((n, n), 2) + 10 * np.eye(n, dtype=int)
        ax = confusion_figure(matrix, [f"class {i}" for i in range(n)]).axes[0]
        assert bool(ax.texts) == texts
        assert [t.get_text() for t in ax.get_yticklabels()] == [f"class {i}" for i in range(n)]
