"""The command line: ``python train.py {fit,validate,test} ...``, a LightningCLI over the classifier and CIFAR-10."""

from __future__ import annotations

import sys
from pathlib import Path

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI

from vit.callbacks import LastCheckpoint
from vit.checkpoint import load_checkpoint_file
from vit.data import CIFAR10DataModule
from vit.lightning import ViTClassifier


class ViTCLI(LightningCLI):
    """LightningCLI with the run layout of this project.

    - Runs live in ``runs/<name>/version_<n>/``: ``config.yaml``, ``metrics.csv``, ``checkpoints/best.ckpt``
      (highest validation accuracy) and ``checkpoints/last.ckpt``.
    - ``--ckpt_path FILE`` alone is enough to ``test`` or ``validate``: the model's arguments come from the
      checkpoint and any argument given explicitly still wins. ``fit --ckpt_path FILE`` resumes into the run
      folder of FILE; ``fit --ckpt_path last`` resumes the newest run of the configured name.
    """

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.set_defaults(
            {
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.filename": "best",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.enable_version_counter": False,
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": "runs", "name": "vit"},
                },
                "trainer.callbacks": [{"class_path": "lightning.pytorch.callbacks.LearningRateMonitor"}],
            }
        )

    def parse_arguments(self, parser, args) -> None:
        self._cli_args = sys.argv[1:] if args is None else args
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """Take the model's arguments from the checkpoint as defaults that explicit arguments override."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        if subcommand == "fit" and ckpt_path == "last":
            ckpt_path = self._newest_last_checkpoint()
            self.config[subcommand]["ckpt_path"] = ckpt_path
        if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
            return
        ckpt = load_checkpoint_file(ckpt_path)  # a clear error for a missing, foreign or unsafe file
        hparams = {k: v for k, v in ckpt.get("hyper_parameters", {}).items() if not k.startswith("_")}
        if hparams:
            self.parser._subcommands_action._name_parser_map[subcommand].set_defaults(
                {f"model.{k}": list(v) if isinstance(v, tuple) else v for k, v in hparams.items()}
            )
            self.config = self.parser.parse_args(self._cli_args)
        if subcommand == "fit":
            self._resume_into(Path(ckpt_path))

    def _logger_args(self):
        logger = self.config[self.config.subcommand].trainer.logger
        return logger.init_args if hasattr(logger, "init_args") else None

    def _newest_last_checkpoint(self) -> str:
        args = self._logger_args()
        root = Path(args.save_dir) / args.name if args is not None else Path("runs")
        found = sorted(root.glob("version_*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime)
        if not found:
            raise FileNotFoundError(f"--ckpt_path last: no {root}/version_*/checkpoints/last.ckpt to resume from")
        return str(found[-1])

    def _resume_into(self, ckpt_path: Path) -> None:
        """Log into the run folder the checkpoint came from, so a resumed run stays one run."""
        run = ckpt_path.resolve().parent.parent
        args = self._logger_args()
        if args is not None and run.name.startswith("version_"):
            args.save_dir, args.name, args.version = str(run.parent.parent), run.parent.name, run.name


def main(args: list[str] | None = None) -> ViTCLI:
    """Run the command line (``args`` as on the command line, default ``sys.argv[1:]``)."""
    return ViTCLI(
        ViTClassifier,
        CIFAR10DataModule,
        args=args,
        seed_everything_default=0,
        save_config_kwargs={"overwrite": True},
    )
