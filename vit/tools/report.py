"""A training run as one HTML page: the run at a glance, its curves, the confusion matrix, the most confident
mistakes and attention rollout, computed from its own checkpoint and data.

    vit-report runs/cifar10_cpu15/version_0                       # writes runs/cifar10_cpu15/version_0/report.html
    vit-report runs/NAME/version_0 --split test --ckpt last --out report.html

The page is self-contained (plots and images embedded as PNG): it opens without a network or the run folder. A run
without a checkpoint or a validation yet still gets its page; the sections that need them say what is missing.
"""

from __future__ import annotations

import base64
import csv
import datetime
import html
import importlib
import inspect
import io
import math
import os
import platform
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch import Tensor

from vit.data.cifar10 import CIFAR10_CLASSES, default_data_dir
from vit.nn.config import ViTConfig
from vit.nn.tta import tta_probs
from vit.nn.vit import ViT
from vit.tools.attention_maps import CAPTION, TILE, heat_maps, render
from vit.tools.common import ToolParser, check_output_path, parse_device
from vit.train import runs
from vit.weights.checkpoint import CONFIG_KEY, DATA_KEY, load_checkpoint_file, vit_weights

DEFAULT_DATA = "vit.data.datamodule.CIFAR10DataModule"  # the command line's --data when none is given
MISTAKES = 16  # most confident mistakes shown
ROLLOUT_IMAGES = 8  # images shown with their attention rollout
CELL_TEXT_MAX = 20  # confusion matrices with more classes are a plain heat map
SHOWN_CLASSES = 30  # class names listed at a glance
MISTAKE_TILE = 96  # pixels a side of a mistake's image (upscaled, nearest)


# ---- the run folder ---------------------------------------------------------------------------------------------


@dataclass
class Run:
    """What a run folder holds, read once: config, metrics, the chosen checkpoint and why (not) that one."""

    folder: Path
    config: dict = field(default_factory=dict)
    rows: list[dict[str, float]] = field(default_factory=list)  # metrics.csv, empty cells dropped
    columns: list[str] = field(default_factory=list)
    ckpt_path: Path | None = None
    ckpt: dict | None = None
    ckpt_note: str = ""  # why this checkpoint, or why none

    def series(self, column: str, x: str = "step") -> tuple[np.ndarray, np.ndarray]:
        """``(x, values)`` of the rows that hold ``column`` (and ``x``)."""
        pairs = [(r[x], r[column]) for r in self.rows if column in r and x in r]
        if not pairs:
            return np.zeros(0), np.zeros(0)
        xs, ys = np.array(pairs, dtype=np.float64).T
        return xs, ys

    @property
    def hparams(self) -> dict:
        """The model's arguments: the checkpoint's, else config.yaml's ``model:``."""
        if self.ckpt is not None and self.ckpt.get("hyper_parameters"):
            return {k: v for k, v in self.ckpt["hyper_parameters"].items() if not k.startswith("_")}
        return dict(self.config.get("model") or {})

    @property
    def trainer(self) -> dict:
        return dict(self.config.get("trainer") or {})


def read_metrics(path: Path) -> tuple[list[dict[str, float]], list[str]]:
    """The rows of a Lightning ``metrics.csv`` as numbers, empty cells dropped, and its columns."""
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = []
        for row in reader:
            values = {}
            for key, value in row.items():
                try:
                    values[key] = float(value)
                except (TypeError, ValueError):  # empty cells, and a row cut short by a kill mid-write
                    pass
            rows.append(values)
        return rows, list(reader.fieldnames or [])


def read_yaml(path: Path) -> dict:
    import yaml  # PyYAML, installed with Lightning and jsonargparse

    try:
        loaded = yaml.safe_load(path.read_text()) if path.is_file() else None
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def choose_checkpoint(folder: Path, ckpt: str | None) -> tuple[Path | None, str]:
    """The checkpoint to evaluate and a note on the choice: ``ckpt`` None means best.ckpt, else last.ckpt."""
    found = {name: folder / "checkpoints" / f"{name}.ckpt" for name in ("best", "last")}
    if ckpt is None:
        if found["best"].is_file():
            return found["best"], "checkpoints/best.ckpt (highest validation accuracy)"
        if found["last"].is_file():
            return found["last"], "checkpoints/last.ckpt: no best.ckpt yet (it is written at the first validation)"
        return None, "no checkpoint in checkpoints/ yet (last.ckpt is written at the end of the first epoch)"
    if ckpt in found:
        if found[ckpt].is_file():
            return found[ckpt], f"checkpoints/{ckpt}.ckpt"
        return None, f"no checkpoints/{ckpt}.ckpt in this run"
    return Path(ckpt), str(ckpt)


def read_run(folder: Path, ckpt: str | None) -> Run:
    run = Run(folder, config=read_yaml(folder / "config.yaml"))
    run.rows, run.columns = read_metrics(folder / "metrics.csv")
    run.ckpt_path, run.ckpt_note = choose_checkpoint(folder, ckpt)
    if run.ckpt_path is not None:
        try:
            run.ckpt = load_checkpoint_file(run.ckpt_path)
        except (OSError, ValueError) as err:
            run.ckpt_path, run.ckpt_note = None, f"{run.ckpt_note} could not be read: {err}"
    return run


def run_origin(run: Run) -> Path | None:
    """The working directory the run was started from, when the run spelled its folder relative to it (``runs/...``,
    as its checkpoint callbacks and logger record it): relative data paths in its config start there, not where the
    report is made."""
    here = run.folder.resolve()
    spellings = []
    if run.ckpt is not None:
        for state in run.ckpt.get("callbacks", {}).values():
            dirpath = state.get("dirpath") if isinstance(state, dict) else None
            if dirpath:
                spellings.append(Path(dirpath).parent)
    logger = run.trainer.get("logger")
    args = (logger.get("init_args") or {}) if isinstance(logger, dict) else {}
    if args.get("save_dir") and args.get("name"):
        spellings.append(Path(args["save_dir"]) / str(args["name"]) / here.name)
    for spelled in spellings:
        if spelled.is_absolute() or ".." in spelled.parts or not spelled.parts:
            continue
        if here.parts[-len(spelled.parts):] == spelled.parts:
            return here.parents[len(spelled.parts) - 1]
    return None


# ---- the data -----------------------------------------------------------------------------------------------------


def data_spec(run: Run) -> dict | None:
    """``{"class_path", "init_args"}`` of the run's data module: the checkpoint's, else config.yaml's ``data:``."""
    if run.ckpt is not None:
        spec = runs.checkpoint_data(run.ckpt)
        if spec is not None:
            return spec
    data = run.config.get("data")
    if not isinstance(data, dict):
        return None
    if "class_path" in data:
        return {"class_path": data["class_path"], "init_args": dict(data.get("init_args") or {})}
    return {"class_path": DEFAULT_DATA, "init_args": dict(data)}  # a config written before --data took a class


def import_class(class_path: str):
    """The class named ``module.Name``, or a bare ``Name`` of this package's data modules."""
    module, _, name = class_path.rpartition(".")
    for candidate in [module] if module else ["vit.data.datamodule", "vit.data.folder", "vit"]:
        try:
            return getattr(importlib.import_module(candidate), name)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"cannot import the data module {class_path!r}")


def resolve_path(value: str, origin: Path | None) -> str:
    """A relative path as it resolves here, else as it resolved where the run was started."""
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists() or origin is None or not (origin / path).exists():
        return str(path)
    return str(origin / path)


def build_datamodule(run: Run, data_dir: str | None):
    """The run's data module, made as the run made it (no download), or raises with a reason."""
    spec = data_spec(run)
    if spec is None:
        raise ValueError("neither the checkpoint nor config.yaml says which data the run used")
    cls = import_class(spec["class_path"])
    accepted = inspect.signature(cls).parameters
    args = {k: v for k, v in spec["init_args"].items() if k in accepted}
    origin = run_origin(run)
    folder_key = "data_dir" if "data_dir" in accepted else "root" if "root" in accepted else None
    if data_dir is not None and folder_key is not None:
        args[folder_key] = data_dir
    elif folder_key == "data_dir":
        args["data_dir"] = resolve_path(args.get("data_dir") or default_data_dir(), origin)
    elif folder_key == "root" and args.get("root"):
        args["root"] = resolve_path(args["root"], origin)
    if "cache_dir" in args and args["cache_dir"]:
        args["cache_dir"] = resolve_path(args["cache_dir"], origin)
    if "download" in accepted:
        args["download"] = False  # a report reads what is there
    return cls(**args)


def data_summary(run: Run) -> str:
    """The data module's name and the arguments that differ from its defaults."""
    spec = data_spec(run)
    if spec is None:
        return "not recorded"
    name = spec["class_path"].rpartition(".")[2]
    try:
        defaults = {k: p.default for k, p in inspect.signature(import_class(spec["class_path"])).parameters.items()}
    except ImportError:
        defaults = {}
    shown = {k: v for k, v in spec["init_args"].items()
             if k in ("batch_size", "root", "data_dir") and v is not None or k in defaults and v != defaults[k]}
    shown.pop("num_workers", None)
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in shown.items())})"


# ---- the model and its evaluation ---------------------------------------------------------------------------------


def build_model(run: Run) -> ViT:
    """The checkpoint's network, in eval mode: the weight average when the run evaluated that (eval_ema)."""
    weights = "ema" if run.hparams.get("eval_ema") else "model"
    config, state = vit_weights(run.ckpt, run.ckpt_path, weights)
    model = ViT(ViTConfig.from_dict(config))
    model.load_state_dict(state)
    model.data_info = run.ckpt.get(DATA_KEY)
    return model.eval()


def config_model(run: Run) -> ViT | None:
    """Without a checkpoint: the network config.yaml describes, on the meta device (to count its parameters)."""
    fields = set(inspect.signature(ViTConfig).parameters)
    args = {k: v for k, v in (run.config.get("model") or {}).items() if k in fields}
    try:
        with torch.device("meta"):
            return ViT(ViTConfig(**args))
    except (TypeError, ValueError):
        return None


@dataclass
class Evaluation:
    probs: Tensor  # (N, C) float32
    labels: Tensor  # (N,) int64
    dataset: object  # the split's dataset: dataset[i] -> (uint8 (3, H, W), label)
    normalize: Callable[[Tensor], Tensor]


@torch.no_grad()
def evaluate(model: ViT, dm, split: str, device: torch.device, tta_flip: bool = False, tta_shift: int = 0
             ) -> Evaluation:
    """Class probabilities of every image of ``split``, normalised as in training, over the views validation
    averaged (vit.nn.tta)."""
    dm.setup("fit" if split == "val" else "test")
    loader = dm.val_dataloader() if split == "val" else dm.test_dataloader()
    probs, labels = [], []
    for images, targets in loader:
        x = dm.normalize(images.to(device)).to(model.pos_embed.dtype)
        probs.append(tta_probs(model, x, tta_flip, tta_shift).cpu())
        labels.append(targets)
    if not probs:
        raise ValueError(f"the {split} split is empty")
    return Evaluation(torch.cat(probs), torch.cat(labels).long(), dm.splits[split], dm.normalize)


def images_at(dataset, indices: list[int]) -> tuple[Tensor, Tensor]:
    items = [dataset[i] for i in indices]
    return torch.stack([torch.as_tensor(x) for x, _ in items]), torch.tensor([int(y) for _, y in items])


# ---- plots (matplotlib's object interface with the Agg canvas: no display, no global state) ------------------------


def _figure(width: float, height: float):
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit("error: vit-report draws with matplotlib: pip install 'vit[report]' (or matplotlib)") from None
    return Figure(figsize=(width, height), dpi=100, layout="constrained")


def png(image) -> str:
    """A matplotlib figure or a PIL image as a base64 PNG ``data:`` URL."""
    buffer = io.BytesIO()
    if isinstance(image, Image.Image):
        image.save(buffer, format="PNG", optimize=True)
    else:
        image.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def epoch_axis(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """Steps and the epochs completed at them, ``([0, end_0, end_1, ...], [0, 1, 2, ...])``, for a second x axis."""
    ends: dict[int, float] = {}
    for row in run.rows:
        if "epoch" in row and "step" in row:
            ends[int(row["epoch"])] = max(ends.get(int(row["epoch"]), 0.0), row["step"] + 1)
    steps, epochs = [0.0], [0.0]
    for epoch in sorted(ends):
        if ends[epoch] > steps[-1]:
            steps.append(ends[epoch])
            epochs.append(epoch + 1.0)
    return (np.array(steps), np.array(epochs)) if len(steps) > 2 else None


def interp(x, xp: np.ndarray, fp: np.ndarray) -> np.ndarray:
    """``np.interp``, continued linearly past both ends (a second axis must map the plot's margins too)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.interp(x, xp, fp)
    left, right = (fp[1] - fp[0]) / (xp[1] - xp[0]), (fp[-1] - fp[-2]) / (xp[-1] - xp[-2])
    y = np.where(x < xp[0], fp[0] + (x - xp[0]) * left, y)
    return np.where(x > xp[-1], fp[-1] + (x - xp[-1]) * right, y)


def smooth(values: np.ndarray, n: int) -> np.ndarray:
    """Running mean over ``n`` points (shorter at the start)."""
    if n <= 1 or len(values) < 2:
        return values
    sums = np.cumsum(np.insert(values, 0, 0.0))
    starts = np.maximum(np.arange(1, len(values) + 1) - n, 0)
    return (sums[1:] - sums[starts]) / (np.arange(1, len(values) + 1) - starts)


def curves_figure(run: Run):
    """Loss, top-1 accuracy and learning rates against steps (epochs on the top axis), images/s per epoch."""
    fig = _figure(11, 7.4)
    (loss_ax, acc_ax), (lr_ax, speed_ax) = fig.subplots(2, 2)
    axis = epoch_axis(run)
    validated = any("val/acc" in r or "val/loss" in r for r in run.rows)

    def by_step(ax, title: str) -> None:
        ax.set_title(title, loc="left", fontsize=11)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if axis is not None:
            steps, epochs = axis
            top = ax.secondary_xaxis("top", functions=(lambda s: interp(s, steps, epochs),
                                                       lambda e: interp(e, epochs, steps)))
            top.set_xlabel("epoch", fontsize=9)
            top.tick_params(labelsize=8)

    def note(ax, text: str) -> None:
        ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#777", fontsize=11)

    x, y = run.series("train/loss")
    if len(y):
        loss_ax.plot(x, y, color="#1f77b4", alpha=0.3, linewidth=0.8)
        loss_ax.plot(x, smooth(y, max(1, len(y) // 20)), color="#1f77b4", label="training (running mean)")
    x, y = run.series("val/loss")
    if len(y):
        loss_ax.plot(x, y, "o-", color="#d62728", label="validation")
    by_step(loss_ax, "Loss" + ("" if validated else " (no validation yet)"))
    if loss_ax.lines:
        loss_ax.legend(fontsize=9)
    else:
        note(loss_ax, "no loss logged yet")

    for column, label, style, color in (("train/acc", "training (epoch mean, augmented)", ".-", "#1f77b4"),
                                        ("val/acc", "validation", "o-", "#d62728")):
        x, y = run.series(column)
        if len(y):
            acc_ax.plot(x, 100 * y, style, color=color, label=label)
    by_step(acc_ax, "Top-1 accuracy (%)" + ("" if validated else " (no validation yet)"))
    if acc_ax.lines:
        acc_ax.legend(fontsize=9)
    else:
        note(acc_ax, "no accuracy logged yet")

    groups: list[tuple[list[str], np.ndarray, np.ndarray]] = []  # groups with the same schedule drawn once
    for column in [c for c in run.columns if c.startswith("lr-")]:
        x, y = run.series(column)
        same = next((g for g in groups if len(g[1]) == len(x) and np.allclose(g[1], x) and np.allclose(g[2], y)),
                    None)
        if same is not None:
            same[0].append(column[3:])
        elif len(y):
            groups.append(([column[3:]], x, y))
    for labels, x, y in groups:
        lr_ax.plot(x, y, label=" = ".join(labels))
    by_step(lr_ax, "Learning rate per parameter group")
    if lr_ax.lines:
        lr_ax.legend(fontsize=9)
    else:
        note(lr_ax, "no learning rate logged")

    x, y = run.series("train/images_per_s", x="epoch")
    speed_ax.set_title("Training speed (images/s per epoch)", loc="left", fontsize=11)
    speed_ax.grid(alpha=0.3)
    speed_ax.set_xlabel("epoch")
    if len(y):
        speed_ax.plot(x + 1, y, "o-", color="#2ca02c")
        speed_ax.set_ylim(0, max(y) * 1.15)
        speed_ax.xaxis.get_major_locator().set_params(integer=True)
    else:
        note(speed_ax, "not logged yet (once per epoch)")
    return fig


def confusion_figure(matrix: np.ndarray, names: list[str]):
    """Counts, coloured by their share of the true class (each row sums to 1), with a class-name axis; more than
    ``CELL_TEXT_MAX`` classes are a heat map without cell text."""
    n = len(names)
    side = min(14.0, max(4.5, 0.4 * n + 2.0))
    fig = _figure(side + 1.2, side)
    ax = fig.subplots()
    shares = matrix / np.maximum(matrix.sum(axis=1, keepdims=True), 1)
    shown = ax.imshow(shares, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(shown, ax=ax, shrink=0.8, label="share of the true class")
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true class")
    fontsize = 10 if n <= 12 else 8 if n <= 30 else 6 if n <= 60 else 4
    step = 1 if n <= 100 else math.ceil(n / 100)
    ticks = np.arange(0, n, step)
    ax.set_xticks(ticks, [names[i] for i in ticks], rotation=45 if n <= 30 else 90, ha="right" if n <= 30 else "center",
                  rotation_mode="anchor" if n <= 30 else "default", fontsize=fontsize)
    ax.set_yticks(ticks, [names[i] for i in ticks], fontsize=fontsize)
    if n <= CELL_TEXT_MAX:
        for (i, j), count in np.ndenumerate(matrix):
            if count:
                ax.text(j, i, str(count), ha="center", va="center", fontsize=fontsize - 1,
                        color="white" if shares[i, j] > 0.5 else "black")
    return fig


def upscale(image: Tensor, size: int) -> Image.Image:
    """A uint8 ``(3, H, W)`` image, scaled up by a whole factor (nearest) to at least ``size`` pixels tall."""
    scale = max(1, -(-size // image.shape[-2]))
    pil = Image.fromarray(image.permute(1, 2, 0).numpy())
    return pil.resize((pil.width * scale, pil.height * scale), Image.Resampling.NEAREST)


# ---- the page -----------------------------------------------------------------------------------------------------


def esc(value) -> str:
    return html.escape(str(value))


def first_line(err: BaseException) -> str:
    """An error's first line, without a trailing lead-in to lines left out ("... Looked for:")."""
    line = (str(err).splitlines() or [type(err).__name__])[0].strip()
    return line.rsplit(". ", 1)[0] + "." if line.endswith(":") and ". " in line else line


def missing(text: str) -> str:
    return f'<p class="missing">{esc(text)}</p>'


def percent(x: float) -> str:
    return f"{100 * x:.2f}%"


def duration(seconds: float) -> str:
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    if minutes:
        return f"{minutes} min {secs:02d} s" if secs else f"{minutes} min"
    return f"{secs} s"


def machine() -> str:
    """This machine's processor model (as lscpu names it), its CPUs and its GPU, if any."""
    name = ""
    try:
        with open("/proc/cpuinfo") as f:
            name = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    name = name or platform.processor() or platform.machine() or "unknown processor"
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = f"{name}, {cpus} CPUs usable"
    if torch.cuda.is_available():
        text += f"; GPU {torch.cuda.get_device_name(0)}"
    return text


def wall_time(run: Run) -> str:
    """The run's training time: Lightning's Timer (kept in the checkpoint when the run had a max_time budget),
    else the time from config.yaml's writing to last.ckpt's, else "not recorded"."""
    last = run.folder / "checkpoints" / "last.ckpt"
    for path in (last, run.ckpt_path):
        if path is None or not path.is_file():
            continue
        try:
            ckpt = run.ckpt if path == run.ckpt_path else torch.load(path, map_location="cpu", weights_only=True,
                                                                     mmap=True)
        except Exception:  # noqa: BLE001 - any unreadable file: try the next source
            continue
        elapsed = (ckpt.get("callbacks", {}).get("Timer") or {}).get("time_elapsed")
        if elapsed:
            train, val = float(elapsed.get("train", 0)), float(elapsed.get("validate", 0))
            where = "" if path == last else f" (to {path.name})"
            return f"{duration(train + val)}: training {duration(train)}, validation {duration(val)}{where}"
    config = run.folder / "config.yaml"
    if last.is_file() and config.is_file():
        seconds = last.stat().st_mtime - config.stat().st_mtime
        if seconds > 0:
            return (f"about {duration(seconds)} (from the file times of config.yaml and last.ckpt; a resumed run "
                    "counts from its resume)")
    return "not recorded"


def version(folder: Path) -> int:
    """n of a ``version_<n>`` folder (-1 for another name): the later of two folders written in the same second."""
    match = re.fullmatch(r"version_(\d+)", folder.name)
    return int(match[1]) if match else -1


def newest_test(folder: Path) -> tuple[float, str] | None:
    """Test accuracy of the newest evaluation (``eval/version_*/metrics.csv`` holding ``test/acc``) and what it
    evaluated."""
    found = []
    for path in folder.glob("eval/version_*/metrics.csv"):
        rows, _ = read_metrics(path)
        accs = [r["test/acc"] for r in rows if "test/acc" in r]
        if accs:
            found.append((path.stat().st_mtime, version(path.parent), accs[-1], path.parent))
    if not found:
        return None
    *_, acc, where = max(found)
    ckpt = read_yaml(where / "config.yaml").get("ckpt_path")
    of = f", {Path(ckpt).parent.name}/{Path(ckpt).name}" if ckpt else ""
    return acc, f"eval/{where.name}{of}"


def budget(max_time) -> str:
    """Lightning's ``max_time`` (``"DD:HH:MM:SS"`` or a dict of timedelta arguments) as a duration."""
    try:
        if isinstance(max_time, dict):
            return duration(datetime.timedelta(**max_time).total_seconds())
        days, hours, minutes, seconds = (int(part) for part in str(max_time).split(":"))
        return duration(((days * 24 + hours) * 60 + minutes) * 60 + seconds)
    except (TypeError, ValueError):
        return str(max_time)


def architecture(config: dict) -> str:
    size = config.get("image_size")
    h, w = (size, size) if isinstance(size, int) else tuple(size)
    p = config.get("patch_size")
    tokens = (h // p) * (w // p)
    extra = "".join(f", {k.replace('_', ' ')} {config[k]}" for k in ("dropout", "attn_dropout", "drop_path")
                    if config.get(k))
    return (f"ViT {config.get('size', '')}: dim {config.get('dim')}, depth {config.get('depth')}, "
            f"heads {config.get('heads')}, MLP ratio {config.get('mlp_ratio'):g}, {p}×{p} patches of {h}×{w} "
            f"images ({tokens} tokens + CLS), {config.get('pool')} pooling{extra}")


def training_settings(run: Run, batch_size) -> str:
    hp, trainer = run.hparams, run.trainer
    if not hp:
        return "not recorded"
    parts = [f"optimizer {hp.get('optimizer', '?')} (lr {hp.get('lr')}"
             + (f", Muon lr {hp.get('muon_lr')}" if hp.get("optimizer") == "muon" else "") + ")",
             f"weight decay {hp.get('weight_decay')}", f"batch size {batch_size}",
             f"warmup {100 * hp.get('warmup_fraction', 0):g}% then cosine to {hp.get('min_lr_ratio')}× the peak"]
    for key, label in (("label_smoothing", "label smoothing"), ("mixup_alpha", "mixup α"),
                       ("cutmix_alpha", "CutMix α"), ("ema_decay", "weight average decay"),
                       ("layer_decay", "layer decay"), ("low_res_size", "low-res pixels")):
        if hp.get(key):
            parts.append(f"{label} {hp[key]}")
    if hp.get("patch_drop"):
        until = hp.get("patch_drop_until", 1.0)
        parts.append(f"patch_drop {hp['patch_drop']}" + (f" for the first {100 * until:g}% of steps" if until < 1
                                                         else " (every step)"))
    for key in ("freeze_backbone", "tta_flip", "eval_ema", "compile"):
        if hp.get(key):
            parts.append(key)
    if hp.get("tta_shift"):
        parts.append(f"tta_shift {hp['tta_shift']}")
    if hp.get("pretrained"):
        parts.append(f"from {hp['pretrained']}")
    length = []
    if trainer.get("max_epochs") not in (None, -1):
        length.append(f"max {trainer['max_epochs']} epochs")
    if trainer.get("max_steps") not in (None, -1):
        length.append(f"max {trainer['max_steps']} steps")
    if trainer.get("max_time"):
        length.append(f"time budget {budget(trainer['max_time'])}")
    if (trainer.get("accumulate_grad_batches") or 1) > 1:
        length.append(f"gradients accumulated over {trainer['accumulate_grad_batches']} batches")
    if trainer.get("gradient_clip_val"):
        length.append(f"gradient clipping {trainer['gradient_clip_val']}")
    return "; ".join(parts + length)


def progress(run: Run) -> str:
    epochs = [r["epoch"] for r in run.rows if "epoch" in r]
    steps = [r["step"] for r in run.rows if "step" in r]
    if steps:
        return f"{int(max(steps)) + 1:,} optimizer steps in {int(max(epochs)) + 1 if epochs else '?'} epochs"
    if run.ckpt is not None:
        return f"{run.ckpt.get('global_step', 0):,} optimizer steps (the checkpoint's; metrics.csv has no rows)"
    return "nothing logged yet"


def glance(run: Run, names: list[str] | None, model: ViT | None, data_error: str | None) -> list[tuple[str, str]]:
    """The rows of the at-a-glance table, as ``(label, HTML)``."""
    rows = [("Run folder", esc(run.folder))]
    spec = data_spec(run)
    rows.append(("Data", esc(data_summary(run)) + (f' <span class="note">({esc(data_error)})</span>'
                                                    if data_error else "")))
    if names:
        listed = ", ".join(names[:SHOWN_CLASSES]) + (f", … ({len(names) - SHOWN_CLASSES} more)"
                                                      if len(names) > SHOWN_CLASSES else "")
        rows.append(("Classes", f"{len(names)}: {esc(listed)}"))
    else:
        rows.append(("Classes", "not known (no checkpoint and no data)"))
    if run.ckpt is not None and CONFIG_KEY in run.ckpt:
        rows.append(("Model", esc(architecture(run.ckpt[CONFIG_KEY]))))
    elif model is not None:
        rows.append(("Model", esc(architecture(model.config.to_dict())) + ' <span class="note">(from config.yaml)'
                                                                           "</span>"))
    else:
        rows.append(("Model", "not recorded"))
    if model is not None:
        count = sum(p.numel() for p in model.parameters())
        rows.append(("Parameters", f"{count / 1e6:.2f} M ({count:,})"))
    batch = (spec or {}).get("init_args", {}).get("batch_size", "?")
    rows.append(("Training", esc(training_settings(run, batch))))
    rows.append(("Trained", esc(progress(run))))
    trainer = run.trainer
    if trainer:
        devices = trainer.get("devices", "auto")
        nodes = f", {trainer['num_nodes']} nodes" if (trainer.get("num_nodes") or 1) > 1 else ""
        precision = trainer.get("precision") or "32-true (the default)"
        rows.append(("Hardware", esc(f"accelerator {trainer.get('accelerator') or 'auto'}, devices {devices}{nodes}, "
                                     f"precision {precision}")))
    else:
        rows.append(("Hardware", "not recorded (no config.yaml)"))
    rows.append(("Report made on", esc(machine())))
    rows.append(("Wall time", esc(wall_time(run))))
    speeds = [r["train/images_per_s"] for r in run.rows if "train/images_per_s" in r]
    if speeds:
        rows.append(("Training speed", esc(f"{speeds[-1]:,.0f} images/s in the last epoch; median "
                                           f"{float(np.median(speeds)):,.0f} over {len(speeds)} epochs")))
    else:
        rows.append(("Training speed", "not logged yet (once per epoch)"))
    vals = [(r["val/acc"], r.get("epoch"), r.get("step")) for r in run.rows if "val/acc" in r]
    if vals:
        acc, epoch, step = max(vals, key=lambda v: v[0])
        known = epoch is not None and step is not None
        at = f" (after epoch {int(epoch) + 1}, step {int(step) + 1:,})" if known else ""
        rows.append(("Best validation accuracy", f"<b>{percent(acc)}</b>{esc(at)}"))
    else:
        rows.append(("Best validation accuracy", '<span class="missing">no validation yet</span>'))
    test = newest_test(run.folder)
    if test is not None:
        rows.append(("Test accuracy", f"<b>{percent(test[0])}</b> ({esc(test[1])})"))
    else:
        ckpts = [p for p in (run.folder / "checkpoints" / f"{n}.ckpt" for n in ("best", "last")) if p.is_file()]
        command = f": python train.py test --ckpt_path {ckpts[0]}" if ckpts else ""
        rows.append(("Test accuracy", esc(f"not tested{command}")))
    saved = f" — saved at step {run.ckpt['global_step']:,}" if run.ckpt and "global_step" in run.ckpt else ""
    rows.append(("Checkpoint evaluated", esc(run.ckpt_note + saved)))
    return rows


STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1120px;
       padding: 16px 24px 48px; color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; margin-bottom: 0.1em; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
.sub { color: #666; margin-top: 0; }
table { border-collapse: collapse; }
table.glance th { text-align: left; vertical-align: top; padding: 4px 16px 4px 0; white-space: nowrap; color: #444; }
table.glance td { padding: 4px 0; }
table.classes th, table.classes td { padding: 2px 12px; text-align: right; }
table.classes th:first-child, table.classes td:first-child { text-align: left; }
table.classes tr:nth-child(even) { background: #f6f6f6; }
.missing { color: #a33; font-style: italic; }
.note { color: #777; }
img.plot { max-width: 100%; height: auto; }
.grid { display: grid; grid-template-columns: repeat(8, minmax(0, 1fr)); gap: 12px 6px; max-width: 1000px; }
.grid figure { margin: 0; font-size: 12px; text-align: center; }
.grid img { image-rendering: pixelated; width: 96px; max-width: 100%; height: auto; border: 1px solid #ccc; }
.rollout { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 6px 0; max-width: 1072px; }
.rollout figure { margin: 0; font-size: 13px; }
.rollout img { image-rendering: pixelated; max-width: 100%; height: auto; }
.wrong { color: #a33; }
.low { color: #a33; }
"""


def page(title: str, subtitle: str, sections: list[tuple[str, str, str]]) -> str:
    nav = " · ".join(f'<a href="#{anchor}">{esc(heading)}</a>' for anchor, heading, _ in sections)
    body = "\n".join(f'<h2 id="{anchor}">{esc(heading)}</h2>\n{content}' for anchor, heading, content in sections)
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n<title>{esc(title)}</title>\n'
            f"<style>{STYLE}</style>\n</head>\n<body>\n<h1>{esc(title)}</h1>\n<p class=\"sub\">{subtitle}</p>\n"
            f"<p>{nav}</p>\n{body}\n</body>\n</html>\n")


def class_table(names: list[str], precision: Tensor, recall: Tensor, support: Tensor, predicted: Tensor) -> str:
    def cell(value: float, count: int) -> str:
        if count == 0:
            return '<td class="note">–</td>'
        return f'<td{" class=low" if value < 0.5 else ""}>{100 * value:.1f}%</td>'

    rows = "".join(
        f"<tr><td>{esc(name)}</td>{cell(p, pc)}{cell(r, s)}<td>{s}</td><td>{pc}</td></tr>"
        for name, p, r, s, pc in zip(names, precision.tolist(), recall.tolist(), support.tolist(), predicted.tolist())
    )
    return ('<table class="classes"><tr><th>class</th><th>precision</th><th>recall</th><th>images</th>'
            f"<th>predicted</th></tr>{rows}</table>")


def evaluation_sections(run: Run, model: ViT | None, dm, data_error: str | None, split: str, device: torch.device,
                        names: list[str]) -> list[tuple[str, str, str]]:
    """The confusion matrix and per-class table, the most confident mistakes and attention rollout."""
    split_name = "validation" if split == "val" else "test"
    headings = [("confusion", f"Confusion matrix ({split_name} split)"),
                ("per-class", "Per-class precision and recall"),
                ("mistakes", "Most confident mistakes"),
                ("attention", "Attention rollout")]
    reason = None
    if model is None:
        reason = f"{run.ckpt_note}: no model to evaluate"
    elif model.num_classes == 0:
        reason = "the checkpoint's model has no classifier head"
    elif dm is None:
        reason = f"the run's data could not be loaded: {data_error}"
    evaluation = None
    if reason is None:
        try:
            evaluation = evaluate(model.to(device), dm, split, device, bool(run.hparams.get("tta_flip")),
                                  int(run.hparams.get("tta_shift") or 0))
        except (OSError, ValueError, RuntimeError) as err:
            reason = f"the {split_name} split could not be loaded: {first_line(err)}"
            if isinstance(err, (OSError, FileNotFoundError)) or "data_dir" in str(err):
                reason += "; pass --data_dir"
    if evaluation is None:
        print(f"note: no evaluation in the report: {reason}", file=sys.stderr)
        return [(anchor, heading, missing(reason if k == 0 else "not computed: see above"))
                for k, (anchor, heading) in enumerate(headings)]

    from torchmetrics.classification import MulticlassConfusionMatrix, MulticlassPrecision, MulticlassRecall

    c = model.num_classes
    if len(names) != c:
        names = [str(i) for i in range(c)]
    preds, labels = evaluation.probs.argmax(-1), evaluation.labels
    matrix = MulticlassConfusionMatrix(num_classes=c)(preds, labels).numpy()
    precision = MulticlassPrecision(num_classes=c, average=None)(preds, labels)
    recall = MulticlassRecall(num_classes=c, average=None)(preds, labels)
    accuracy = (preds == labels).float().mean().item()
    ckpt_name = run.ckpt_path.name
    intro = (f"<p>{len(labels):,} {split_name} images, {esc(ckpt_name)}: top-1 accuracy <b>{percent(accuracy)}</b>. "
             "Rows are the true classes; the colour is the share of each true class predicted as each column "
             f"(the diagonal is the class's recall){'' if c <= CELL_TEXT_MAX else '; no counts for this many classes'}."
             "</p>")
    sections = [(headings[0][0], headings[0][1],
                 intro + f'<img class="plot" alt="confusion matrix" src="{png(confusion_figure(matrix, names))}">')]
    support, predicted = torch.as_tensor(matrix.sum(1)), torch.as_tensor(matrix.sum(0))
    sections.append((headings[1][0], headings[1][1],
                     "<p>Precision: the share of the images predicted as the class that are of it; recall: the share "
                     "of the class's images predicted as it. Below 50% in red; – where there is nothing to count.</p>"
                     + class_table(names, precision, recall, support, predicted)))

    confidence, guess = evaluation.probs.max(-1)
    wrong = torch.nonzero(guess != labels).flatten()
    if len(wrong):
        order = wrong[confidence[wrong].argsort(descending=True)][:MISTAKES].tolist()
        images, _ = images_at(evaluation.dataset, order)
        figures = "".join(
            f'<figure><img alt="mistake" src="{png(upscale(image, MISTAKE_TILE))}"><figcaption>'
            f'<b class="wrong">{esc(names[guess[i]])}</b> {confidence[i]:.2f}<br>true {esc(names[labels[i]])}'
            "</figcaption></figure>"
            for image, i in zip(images, order))
        content = (f"<p>The {len(order)} wrong predictions made with the highest probability, of {len(wrong):,} "
                   "mistakes in all: under each image the predicted class and its probability, then the true "
                   f"class.</p><div class=\"grid\">{figures}</div>")
    else:
        content = f"<p>No mistakes on the {split_name} split.</p>"
    sections.append((headings[2][0], headings[2][1], content))

    shown_count = min(ROLLOUT_IMAGES, len(labels))
    images, truth = images_at(evaluation.dataset, list(range(shown_count)))
    scale = max(1, -(-TILE // images.shape[-2]))
    shown = F.interpolate(images, scale_factor=scale, mode="nearest")
    with torch.no_grad():
        heat = heat_maps(model, evaluation.normalize(images.to(device)).to(model.pos_embed.dtype),
                         tuple(shown.shape[-2:])).cpu()
    pairs = []
    for i in range(shown_count):  # one pair per image: the captions are the page's text, readable at any zoom
        pair = render(shown[i:i + 1], heat[i:i + 1], [""])
        pair = pair.crop((0, 0, pair.width, pair.height - CAPTION))  # render's caption band, left empty
        verdict = "" if guess[i] == truth[i] else ' class="wrong"'
        pairs.append(f'<figure><img alt="attention rollout" src="{png(pair)}"><figcaption{verdict}>predicted '
                     f"<b>{esc(names[guess[i]])}</b> {confidence[i]:.2f}<br>true {esc(names[truth[i]])}"
                     "</figcaption></figure>")
    sections.append((headings[3][0], headings[3][1],
                     f"<p>The first {shown_count} {split_name} images, each beside its attention rollout: how much "
                     "each patch flows into the CLS token through all the blocks, from blue (little) to red (most). "
                     f'Wrong predictions in red.</p><div class="rollout">{"".join(pairs)}</div>'))
    return sections


def make_report(run: Run, split: str, device: torch.device, data_dir: str | None) -> str:
    model, dm, data_error = None, None, None
    if run.ckpt is not None:
        try:
            model = build_model(run)
        except (ValueError, RuntimeError, KeyError) as err:
            run.ckpt_note += f" (not a usable model: {err})"
            run.ckpt = None
    try:
        dm = build_datamodule(run, data_dir)
    except (OSError, ValueError, TypeError, ImportError) as err:
        data_error = first_line(err)
    names = None
    if dm is not None:
        names = list(dm.classes)
    elif model is not None and (model.data_info or {}).get("classes"):
        names = list(model.data_info["classes"])
    elif model is not None and model.num_classes == len(CIFAR10_CLASSES):
        names = list(CIFAR10_CLASSES)
    counted = model if model is not None else config_model(run)
    sections = [("glance", "At a glance",
                 '<table class="glance">' + "".join(f"<tr><th>{label}</th><td>{value}</td></tr>"
                                                    for label, value in glance(run, names, counted, data_error))
                 + "</table>")]
    if run.rows:
        curves = f'<img class="plot" alt="training curves" src="{png(curves_figure(run))}">'
        if not any("val/acc" in r for r in run.rows):
            curves = missing("no validation yet: the validation curves start at the first validation") + curves
    else:
        curves = missing("no metrics.csv rows yet: nothing has been logged")
    sections.append(("curves", "Training curves", curves))
    class_names = names or [str(i) for i in range(model.num_classes if model is not None else 0)]
    sections += evaluation_sections(run, model, dm, data_error, split, device, class_names)
    name = f"{run.folder.resolve().parent.name} / {run.folder.resolve().name}"
    made = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    return page(f"Training run {name}", f"{esc(run.folder)} · report made {made} by vit-report", sections)


def is_run_folder(folder: Path) -> bool:
    return any((folder / name).exists() for name in ("config.yaml", "metrics.csv", "hparams.yaml", "checkpoints"))


def main(argv: list[str] | None = None) -> None:
    parser = ToolParser(prog="vit-report", description=__doc__.split("\n")[0])
    parser.add_argument("run_dir", help="a run folder, runs/<name>/version_<n>")
    parser.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html)")
    parser.add_argument("--ckpt", help="checkpoint to evaluate: best, last or a file (default: best.ckpt, else "
                                       "last.ckpt)")
    parser.add_argument("--split", choices=["val", "test"], default="val", help="the split to evaluate")
    parser.add_argument("--data_dir", help="the run's data folder, when it has moved: CIFAR-10's data_dir or an image "
                                           "folder's root")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    folder = Path(args.run_dir)
    if not folder.exists():
        parser.error(f"run folder {args.run_dir!r} does not exist")
    if not folder.is_dir():
        parser.error(f"{args.run_dir!r} is a file, not a run folder (runs/<name>/version_<n>)")
    if not is_run_folder(folder):
        versions = sorted(folder.glob("version_*/config.yaml"), key=lambda p: (p.stat().st_mtime, version(p.parent)))
        hint = f": its newest run is {versions[-1].parent}" if versions else " (runs/<name>/version_<n>)"
        parser.error(f"{args.run_dir!r} is not a run folder: no config.yaml, metrics.csv or checkpoints/{hint}")
    out = Path(args.out) if args.out else folder / "report.html"
    check_output_path(parser, "--out", str(out), {".html", ".htm"})
    if args.ckpt not in (None, "best", "last") and not Path(args.ckpt).is_file():
        parser.error(f"--ckpt {args.ckpt!r}: no such file (or pass best or last)")
    if args.data_dir is not None and not Path(args.data_dir).is_dir():
        parser.error(f"--data_dir {args.data_dir!r} is not a folder")
    device = parse_device(parser, args.device)
    _figure(1, 1)  # matplotlib is there, before any work
    run = read_run(folder, args.ckpt)
    if args.ckpt not in (None, "best", "last") and run.ckpt is None:
        parser.error(run.ckpt_note)
    out.write_text(make_report(run, args.split, device, args.data_dir), encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
