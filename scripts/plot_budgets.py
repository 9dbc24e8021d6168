"""Test accuracy against training minutes, from run folders: the README's accuracy-per-budget figure and table.

Each RUN is a run folder (``runs/NAME/version_N``) of a time-budget ``fit`` that was then tested on its final
weights (``train.py test --ckpt_path RUN/checkpoints/last.ckpt``). From the folder alone it reads:

- the training time and steps: Lightning's Timer and the step count, saved in ``checkpoints/last.ckpt``;
- the budget and seed: ``config.yaml`` (``trainer.max_time``, ``seed_everything``);
- the test top-1: the newest ``eval/version_*`` whose ``config.yaml`` tested ``last.ckpt``.

Runs with the same budget are one point (their mean, each seed drawn too). It prints a Markdown table and writes
the PNG (matplotlib: ``pip install 'vit[report]'``).

    python scripts/plot_budgets.py runs/cifar10_cpu5/version_* runs/cifar10_cpu15*/version_* \\
        runs/cifar10_cpu60/version_* --out docs/accuracy_vs_minutes.png
"""

from __future__ import annotations

import argparse
import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

import yaml

from vit.weights.checkpoint import load_checkpoint_file


@dataclass
class BudgetRun:
    folder: Path
    budget_s: float  # trainer.max_time
    seed: int
    train_s: float  # Lightning's Timer: time spent in the training loop, validation excluded
    steps: int
    epochs: float
    test_acc: float  # top-1 of the final weights, as a share


def seconds(max_time: str) -> float:
    """Lightning's ``DD:HH:MM:SS`` as seconds."""
    days, hours, minutes, secs = (float(part) for part in max_time.split(":"))
    return ((days * 24 + hours) * 60 + minutes) * 60 + secs


def read_run(folder: Path) -> BudgetRun:
    config = yaml.safe_load((folder / "config.yaml").read_text())
    if not config["trainer"].get("max_time"):
        raise SystemExit(f"error: {folder} has no trainer.max_time: not a time-budget run")
    ckpt = load_checkpoint_file(folder / "checkpoints" / "last.ckpt")  # weights_only: no code runs
    timer = ckpt["callbacks"]["Timer"]["time_elapsed"]
    loop = ckpt["loops"]["fit_loop"]
    whole = loop["epoch_progress"]["total"]["completed"]  # epochs finished; the Timer stopped the next one
    batches = loop["epoch_loop.batch_progress"]
    into_last = batches["current"]["completed"]
    epochs = whole + (into_last / ((batches["total"]["completed"] - into_last) / whole) if whole else 0)
    tests = []
    for eval_dir in sorted((folder / "eval").glob("version_*"), key=lambda p: int(p.name.split("_")[1])):
        tested = yaml.safe_load((eval_dir / "config.yaml").read_text()).get("ckpt_path") or ""
        rows = list(csv.DictReader((eval_dir / "metrics.csv").open()))
        if tested.endswith("last.ckpt") and rows and rows[-1].get("test/acc"):
            tests.append(float(rows[-1]["test/acc"]))
    if not tests:
        raise SystemExit(f"error: {folder} has no test of its last.ckpt: run "
                         f"python train.py test --ckpt_path {folder}/checkpoints/last.ckpt")
    return BudgetRun(folder, seconds(config["trainer"]["max_time"]), int(config["seed_everything"]),
                     timer["train"], ckpt["global_step"], epochs, tests[-1])


def table(groups: dict[float, list[BudgetRun]]) -> str:
    lines = ["| budget | seeds | training time | steps (epochs) | test top-1, each seed | mean |",
             "|---|---|---|---|---|---|"]
    for budget, runs in groups.items():
        accs = [r.test_acc for r in runs]
        lines.append(
            f"| {budget / 60:g} min | {', '.join(str(r.seed) for r in runs)} "
            f"| {statistics.mean(r.train_s for r in runs) / 60:.2f} min "
            f"| {', '.join(f'{r.steps:,} ({r.epochs:.1f})' for r in runs)} "
            f"| {', '.join(f'{100 * a:.2f}%' for a in accs)} | **{100 * statistics.mean(accs):.2f}%** |")
    return "\n".join(lines)


def plot(groups: dict[float, list[BudgetRun]], out: Path, title: str) -> None:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise SystemExit("error: the figure needs matplotlib: pip install 'vit[report]' (or matplotlib)") from None
    fig = Figure(figsize=(6.4, 4.2), dpi=100, layout="constrained")
    ax = fig.subplots()
    minutes = [statistics.mean(r.train_s for r in runs) / 60 for runs in groups.values()]
    means = [100 * statistics.mean(r.test_acc for r in runs) for runs in groups.values()]
    ax.plot(minutes, means, "-o", color="C0", label="mean of the seeds")
    for runs in groups.values():
        ax.scatter([r.train_s / 60 for r in runs], [100 * r.test_acc for r in runs], s=14, color="C0", alpha=0.4,
                   label="one seed" if runs is next(iter(groups.values())) else None)
    for i, (x, y, runs) in enumerate(zip(minutes, means, groups.values())):
        last = i == len(minutes) - 1  # its label goes to the left, inside the axes
        ax.annotate(f"{y:.1f}%, {statistics.mean(r.epochs for r in runs):.0f} epochs", (x, y),
                    textcoords="offset points", xytext=(-8 if last else 8, -14), ha="right" if last else "left",
                    fontsize=8)
    ax.margins(x=0.08, y=0.12)
    ax.set_xscale("log")
    ax.set_xticks(minutes, [f"{m:.0f}" for m in minutes])
    ax.minorticks_off()
    ax.set_xlabel("training time, minutes (log scale)")
    ax.set_ylabel("CIFAR-10 test top-1, %")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders (runs/NAME/version_N)")
    parser.add_argument("--out", type=Path, default=Path("docs/accuracy_vs_minutes.png"), help="the PNG to write")
    parser.add_argument("--title", default="ViT from scratch on CIFAR-10, 2 CPU cores: one recipe, three budgets",
                        help="the figure's title")
    args = parser.parse_args(argv)
    groups: dict[float, list[BudgetRun]] = {}
    for run in sorted((read_run(folder) for folder in args.runs), key=lambda r: (r.budget_s, r.seed)):
        groups.setdefault(run.budget_s, []).append(run)
    print(table(groups))
    plot(groups, args.out, args.title)
    print(f"figure: {args.out}")


if __name__ == "__main__":
    main()
