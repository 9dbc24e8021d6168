"""Training callbacks that belong to no model: the rolling ``last.ckpt``."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint


class LastCheckpoint(ModelCheckpoint):
    """``last.ckpt``: the newest training state, to resume from after a stop or a crash.

    Written at the end of every validation (every epoch), at the end of training, and, with
    ``every_n_train_steps`` > 0, every that many optimizer steps, so a long epoch is not lost. Lightning writes
    checkpoints to a temporary file and moves it into place, so a kill mid-write leaves the previous file intact.
    (Lightning's own ``save_last`` only refreshes ``last.ckpt`` when a best checkpoint was also written.)
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
        self._save_now(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        self._save_now(trainer)
