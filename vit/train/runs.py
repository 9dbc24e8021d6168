"""Run folders and resuming, as plain functions: where a run lives, which checkpoint ``last``/``best`` mean, what a
checkpoint says about the command that evaluates or resumes it. ``vit.train.cli`` calls these; no Lightning here.

A run lives in ``<save_dir>/<name>/version_<n>/``: ``config.yaml``, ``metrics.csv`` and ``checkpoints/``.
"""

from __future__ import annotations

import contextlib
import csv
import shutil
from pathlib import Path

NOT_RESULTS = ("config.yaml", "hparams.yaml")
# the data modules' arguments that choose the validation split (CIFAR-10's; a folder's)
SPLIT_KEYS = ("val_size", "val_fraction", "seed")  # what a run folder holds before it has any result


def newest_checkpoint(root: Path, name: str, purpose: str) -> str:
    """``root/version_*/checkpoints/<name>.ckpt`` of the newest run (by the file's time), for ``--ckpt_path last``
    or ``best``; ``purpose`` ("resume from", "evaluate") words the error when there is none."""
    found = sorted(Path(root).glob(f"version_*/checkpoints/{name}.ckpt"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise FileNotFoundError(f"--ckpt_path {name}: no {root}/version_*/checkpoints/{name}.ckpt to {purpose}")
    return str(found[-1])


def run_folder(ckpt_path: str | Path, ckpt: dict) -> Path:
    """The run folder a checkpoint was written to, spelled as the run spelled it (e.g. relative ``runs/...``).

    The spelling matters: Lightning's ModelCheckpoint restores its best score only when the folder's path string
    is unchanged, and without it the first validation after a resume replaces best.ckpt whatever its score.
    """
    run = Path(ckpt_path).resolve().parent.parent
    for state in ckpt.get("callbacks", {}).values():
        dirpath = state.get("dirpath") if isinstance(state, dict) else None
        if dirpath and Path(dirpath).resolve() == run / "checkpoints":
            return Path(dirpath).parent
    return run


def evaluation_folder(ckpt_path: str | Path, ckpt: dict) -> Path:
    """Where evaluating a checkpoint logs: its run folder when it lies in ``<run>/checkpoints/``, else its own
    folder (the evaluation then goes to ``eval/version_<n>/`` inside it)."""
    if Path(ckpt_path).resolve().parent.name == "checkpoints":
        return run_folder(ckpt_path, ckpt)
    return Path(ckpt_path).parent


def checkpoint_defaults(ckpt: dict) -> dict:
    """The command-line defaults a checkpoint implies: its model arguments (``model.<name>``) and its run's
    validation split (``data.<name>`` of ``SPLIT_KEYS``: another split would validate on images the run trained on)."""
    # names starting with "_" are Lightning's bookkeeping (e.g. _class_path), not arguments
    hparams = {k: v for k, v in ckpt.get("hyper_parameters", {}).items() if not k.startswith("_")}
    defaults = {f"model.{k}": list(v) if isinstance(v, tuple) else v for k, v in hparams.items()}
    data = ckpt.get("datamodule_hyper_parameters", {})
    defaults.update({f"data.{k}": data[k] for k in SPLIT_KEYS if data.get(k) is not None})
    return defaults


def checkpoint_data(ckpt: dict) -> dict | None:
    """The data module a checkpoint's run used, ``{"class_path": ..., "init_args": {...}}``, as the command line
    recorded it (None for a checkpoint written outside the command line)."""
    hparams = ckpt.get("datamodule_hyper_parameters", {})
    class_path = hparams.get("_class_path")
    if class_path is None:
        return None
    return {"class_path": class_path, "init_args": {k: v for k, v in hparams.items() if not k.startswith("_")}}


def metrics_rows_before(path: Path, step: int) -> list[dict]:
    """The rows of a ``metrics.csv`` logged before optimizer step ``step``, empty cells dropped: what a run resumed
    from a checkpoint at ``step`` keeps (it logs the later steps again)."""
    if not Path(path).is_file():
        return []
    with open(path, newline="") as f:
        rows = [row for row in csv.DictReader(f) if int(float(row["step"])) < step]
    return [{k: v for k, v in row.items() if v != ""} for row in rows]


def remove_if_no_results(run: Path) -> bool:
    """Delete a run folder that holds no checkpoint and no metric (only its config and empty folders), and its
    name's folder if that was its only run, so a command that failed early leaves nothing that looks like a result.
    Returns whether it removed the folder."""
    run = Path(run)
    if not run.is_dir() or not all(p.is_dir() or p.name in NOT_RESULTS for p in run.rglob("*")):
        return False
    shutil.rmtree(run)
    with contextlib.suppress(OSError):  # not empty: other runs live there
        run.parent.rmdir()
    return True


def mismatch_message(path: str, ckpt: dict, ours: dict, built: dict, config_key: str) -> str:
    """Which tensors differ between a checkpoint's state dict and a model's (``ours``), and which of the model's
    arguments (``built``, the config) made them differ, as one message that says what to drop."""
    theirs = ckpt["state_dict"]
    if any(k.startswith("ema_model.") for k in ours) and not any(k.startswith("ema_model.") for k in theirs):
        return (f"checkpoint {path!r} was trained without a weight average (ema_decay 0), so it has no "
                "ema_model to evaluate or resume: drop --model.ema_decay and --model.eval_ema")
    problems = [f"{k} is {tuple(v.shape)} in the checkpoint but {tuple(ours[k].shape)} here"
                for k, v in theirs.items() if k in ours and v.shape != ours[k].shape]
    problems += [f"{k} is missing from the checkpoint" for k in ours.keys() - theirs.keys()]
    problems += [f"{k} is in the checkpoint but not in this model" for k in theirs.keys() - ours.keys()]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    saved = ckpt.get(config_key, {})
    changed = ", ".join(f"{k}={built[k]} (checkpoint: {v})" for k, v in saved.items() if k in built and built[k] != v)
    hint = f"This command asks for {changed}: drop those arguments" if changed else "Check the --model arguments"
    return (f"checkpoint {path!r} does not fit the model: {'; '.join(problems[:3])}{more}. "
            f"{hint} to use the checkpoint's architecture.")
