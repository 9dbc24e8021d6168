"""Training callbacks and plugins that belong to no model: the rolling ``last.ckpt``, written atomically, and the
training speed in images per second."""

from __future__ import annotations

import io
import os
import time
import uuid
from pathlib import Path
from typing import Any

import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``: the newest training state, to resume from after a stop or a crash.

    Written at the end of every training epoch (with or without a validation in it), at the end of training, and,
    with ``every_n_train_steps`` > 0, every that many optimizer steps, so a long epoch is not lost. With
    :class:`AtomicCheckpointIO` (the command line's default) a crash mid-write leaves the previous file intact.
    (Lightning's own ``save_last`` only refreshes ``last.ckpt`` when a best checkpoint was also written.)

    The epoch's file is written after validation and after the best-checkpoint callback has taken its score (list
    this callback after it, as the command line does), so a run resumed from ``last.ckpt`` knows its best score
    and does not overwrite ``best.ckpt`` with a worse model.
    """

    def __init__(self, every_n_train_steps: int = 0, dirpath: str | None = None) -> None:
        if every_n_train_steps < 0:
            raise ValueError(f"every_n_train_steps must be >= 0 (0 = only at epoch ends), got {every_n_train_steps}")
        super().__init__(
            dirpath=dirpath, filename="last", monitor=None, save_top_k=1,
            every_n_train_steps=every_n_train_steps or None, every_n_epochs=None if every_n_train_steps else 1,
            enable_version_counter=False,
        )

    def _save_now(self, trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):
            self._save_none_monitor_checkpoint(trainer, self._monitor_candidates(trainer))

    def on_validation_end(self, trainer, pl_module) -> None:
        pass  # the epoch's end follows; saving here would store the best score before the epoch's update

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._save_now(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_now(trainer)


class TrainingSpeed(Callback):
    """Logs ``train/images_per_s``: training images per second of wall time in each epoch.

    The clock runs from the end of an epoch's first training batch (so ``torch.compile`` and other one-off
    work stay out) to the end of its last, and stops while validation runs: it covers loading, augmenting and
    the optimisation steps. It waits for the GPU only where it starts and stops, never between steps, so the
    measurement does not slow training down. Each process counts its own images; under DDP the logged value is
    the mean over processes, so the whole job trains at ``images_per_s x devices``.
    """

    def __init__(self) -> None:
        self._start: float | None = None
        self._images = 0
        self._seconds = 0.0

    @staticmethod
    def _now(pl_module) -> float:
        if pl_module.device.type == "cuda":  # steps run asynchronously: count what the GPU has finished
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def _stop(self, pl_module) -> None:
        if self._start is not None:
            self._seconds += self._now(pl_module) - self._start
            self._start = None

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start, self._images, self._seconds = None, 0, 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._start is None:
            self._start = self._now(pl_module)  # this batch is not timed, so it does not count
        else:
            self._images += len(batch[1])

    def on_validation_start(self, trainer, pl_module) -> None:
        self._stop(pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._stop(pl_module)
        if self._images:
            pl_module.log("train/images_per_s", self._images / self._seconds, sync_dist=True)


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (a full disk, a file-size limit, no permission); the earlier ones stand."""


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, made atomic for local files.

    The checkpoint goes to a temporary file beside its destination, is flushed to disk and renamed over it: a
    rename within a folder is atomic, so a kill, a crash or a full disk mid-write leaves the previous checkpoint
    whole. Lightning's default stages the file in the system temp folder instead; when that is another file
    system (a tmpfs ``/tmp``, a local disk beside network storage) the final move is a copy over the old file,
    and a crash during that copy leaves neither. Remote storage keeps Lightning's writer.
    """

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None or not isinstance(get_filesystem(path), LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Serialised in memory first (a second copy of the checkpoint, briefly), so that a full disk surfaces as the
        # OSError of a plain write, and a failure to serialise before any file is touched.
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            with open(tmp, "xb") as f:
                f.write(buffer.getbuffer())
                f.flush()
                os.fsync(f.fileno())  # the data is on disk before the rename makes it the checkpoint
            os.replace(tmp, path)
        except OSError as err:
            tmp.unlink(missing_ok=True)
            raise CheckpointWriteError(
                f"could not write checkpoint {str(path)!r}: {err.strerror or err}; nothing half-written was left, "
                "and the checkpoints written before are intact"
            ) from err
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
