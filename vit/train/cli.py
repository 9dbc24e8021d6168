"""The command line: ``python train.py {fit,validate,test} ...``, a LightningCLI over the classifier and the data
modules (CIFAR-10 by default; ``--data ImageFolderDataModule --data.root DIR`` for a folder of images)."""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
import traceback
import warnings
from pathlib import Path

import lightning.pytorch.loops
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

# the data modules are imported so that --data CIFAR100DataModule and --data ImageFolderDataModule resolve
from vit.data.cifar100 import CIFAR100DataModule  # noqa: F401
from vit.data.datamodule import InMemoryDataModule
from vit.data.folder import ImageFolderDataModule  # noqa: F401
from vit.train import runs
from vit.train.callbacks import CheckpointWriteError, LastCheckpoint
from vit.train.classifier import ViTClassifier
from vit.train.runtime import keep_freed_memory
from vit.weights.checkpoint import CONFIG_KEY, load_checkpoint_file


CKPT_PATH_HELP = {
    "fit": "checkpoint to resume from: a file, or 'last' for the newest run of this config's logger name; the run "
           "goes on in that checkpoint's run folder, with its config.yaml unless --config is given",
    "validate": "checkpoint to evaluate: a file, or 'best'/'last' of the newest run of this config's logger name; "
                "the model's arguments and validation split come from it; metrics go to eval/ in its run folder",
    "test": "checkpoint to evaluate: a file, or 'best'/'last' of the newest run of this config's logger name; the "
            "model's arguments come from it; metrics go to eval/ in its run folder",
}
# What the model takes from the data, never typed: its classes and its image size.
LINKS = {"data.num_classes": "model.num_classes", "data.image_size": "model.image_size"}
# the optimizer and its schedule belong to the model (one place, recorded in the run's config.yaml)
OWN_OPTIMIZER = ("the optimizer and learning-rate schedule are the model's options: --model.optimizer adamw|muon, "
                 "--model.lr, --model.muon_lr, --model.weight_decay, --model.warmup_fraction, --model.min_lr_ratio")


class ArgumentParser(LightningArgumentParser):
    """Argument errors as one line that names the closest known option, instead of a 100-line usage message; help
    as plain text (the docstrings' reST markup removed)."""

    def error(self, message: str, ex: Exception | None = None):
        message = _union_error(message)
        # jsonargparse refuses a link's target as 'Linked "model.x" must be given via "data.x"' or, for a Union
        # type, as "argument data.x --> model.x: ..."
        linked = "must be given via" in message or re.search(r"data\.\w+ --> model\.", message)
        if re.search(r"(?:^|\s)--(optimizer|lr_scheduler)\b", message):
            message = f"{message.split(':')[0]}: --optimizer/--lr_scheduler are not options here; {OWN_OPTIMIZER}"
        elif linked:
            target, source = re.search(r"model\.\w+", message)[0], re.search(r"data\.\w+", message)[0]
            message = (f"--{target} comes from the data ({source}): drop it; for a folder of images, "
                       "--data.image_size sets the size")
        else:
            message += _did_you_mean(message, self)
        if "invalid choice: 'predict'" in message:  # Lightning's CLIs have one; here it is its own command
            message += "; to classify image files: vit-predict --ckpt_path CKPT IMAGE_OR_FOLDER ..."
        if not self.exit_on_error:
            return super().error(message, ex)  # raises ArgumentError, as configured
        prog = (getattr(ex, "subcommand_parser", None) or self).prog.replace(" [options]", "")
        print(f"error: {message}\n(options: {prog} --help)", file=sys.stderr)
        self.exit(2)

    def format_help(self) -> str:
        text = super().format_help()
        text = re.sub(r":(?:class|func|meth|attr|mod|paramref):`~?([^`]+)`", r"\1", text)
        return text.replace("``", "")


def _union_error(message: str) -> str:
    """The data module's own error out of jsonargparse's report on ``--data`` (which tried each type it may be)."""
    if "Does not validate against any of the Union subtypes" not in message:
        return message
    errors = [line.strip()[2:] for line in message.splitlines() if line.strip().startswith("- ")]
    errors = [e for e in errors if not e.startswith("Expected a <class 'NoneType'>")]
    return f"--data: {errors[0]}" if errors else message


def _did_you_mean(message: str, parser: ArgumentParser) -> str:
    """" (did you mean --model.lr?)" for the unknown options of a jsonargparse error message, or "".

    The messages name options as "unrecognized arguments: --model.lrr 0.1" (command line), "... does not accept
    option 'model.lrr'" (config file) or "Group 'model' does not accept option 'lrr'".
    """
    unknown = re.findall(r"(?:^|\s)--([\w.-]+)", message.partition("unrecognized arguments:")[2])
    in_config = re.findall(r"(?:Group '([^']+)' )?[^']*[Oo]ption '([^']+)'", message)
    unknown += [".".join(filter(None, m)) for m in in_config]
    known, parsers = set(), [parser]
    while parsers:  # the options of this parser and of its subcommands
        p = parsers.pop()
        known.update(s[2:] for a in p._actions for s in a.option_strings if s.startswith("--"))
        if p._subcommands_action is not None:
            parsers += p._subcommands_action._name_parser_map.values()
    close = [m for key in unknown for m in difflib.get_close_matches(key, known, n=1)]
    return f" (did you mean {', '.join('--' + m for m in close)}?)" if close else ""


class ViTCLI(LightningCLI):
    """LightningCLI with the run layout of this project.

    - Runs live in ``runs/<name>/version_<n>/``: ``config.yaml``, ``metrics.csv``, ``checkpoints/best.ckpt``
      (highest validation accuracy) and ``checkpoints/last.ckpt``.
    - ``--ckpt_path FILE`` alone is enough to ``test`` or ``validate``: the model's arguments and the run's
      validation split (``data.val_size``) come from the checkpoint and any argument given explicitly still
      wins. ``fit --ckpt_path FILE`` resumes into the run folder of FILE; ``fit --ckpt_path last`` resumes the
      newest run of the configured name, and ``test``/``validate --ckpt_path last|best`` evaluate that run's
      ``last.ckpt`` or ``best.ckpt``.
    - With ``--trainer.logger false`` there is no run folder, so no ``config.yaml`` is written (rather than
      one dropped into the working directory).
    - Bad arguments fail before any training: unknown options name the closest known one, a checkpoint that
      does not fit the model names the tensors that differ, and a command that fails before writing a
      checkpoint or a metric leaves no run folder behind.
    """

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("parser_class", ArgumentParser)
        self._ckpt: tuple[str, dict] | None = None  # (path, contents) of --ckpt_path, until the model is checked
        self._resumed_step: int | None = None  # the checkpoint's step, when fit resumes a run
        try:
            super().__init__(*args, **kwargs)
        except BaseException:
            self._remove_run_folder_without_results()
            raise

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test``; images are classified by ``vit-predict``, so no ``predict`` loop."""
        return {name: skip for name, skip in LightningCLI.subcommands().items() if name != "predict"}

    def _prepare_subcommand_parser(self, klass, subcommand: str, **kwargs):
        parser = super()._prepare_subcommand_parser(klass, subcommand, **kwargs)
        for action in parser._actions:  # this project's meaning of --ckpt_path, not Lightning's generic text
            if "--ckpt_path" in action.option_strings:
                action.help = CKPT_PATH_HELP[subcommand]
        return parser

    def add_arguments_to_parser(self, parser) -> None:
        for source, target in LINKS.items():
            parser.link_arguments(source, target, apply_on="instantiate")
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.add_lightning_class_args(LastCheckpoint, "last_checkpoint")
        parser.set_defaults(
            {
                "data": {"class_path": "vit.data.datamodule.CIFAR10DataModule"},
                "checkpoint.monitor": "val/acc",
                "checkpoint.mode": "max",
                "checkpoint.filename": "best",
                "checkpoint.auto_insert_metric_name": False,
                "checkpoint.enable_version_counter": False,
                "trainer.logger": {
                    "class_path": "lightning.pytorch.loggers.CSVLogger",
                    "init_args": {"save_dir": "runs", "name": "vit"},
                },
                "trainer.callbacks": [
                    {"class_path": "lightning.pytorch.callbacks.LearningRateMonitor"},
                    {"class_path": "vit.train.callbacks.TrainingSpeed"},
                ],
                "trainer.plugins": [{"class_path": "vit.train.callbacks.AtomicCheckpointIO"}],
            }
        )

    def parse_arguments(self, parser, args) -> None:
        self._cli_args = list(sys.argv[1:] if args is None else args)
        printing = [a for a in self._cli_args if a == "--print_config" or a.startswith("--print_config=")]
        if printing and _typed(self._cli_args, "--ckpt_path"):
            # print what the command would run: the config with the checkpoint's arguments applied (the argument
            # parser prints as it parses, before they are)
            self._cli_args = [a for a in self._cli_args if a not in printing]
            self.config = parser.parse_args(self._cli_args)
            self._parse_ckpt_path()
            parser.parse_args(self._cli_args + printing)  # prints and exits
        super().parse_arguments(parser, args)

    def before_instantiate_classes(self) -> None:
        if self.subcommand == "fit":
            trainer = self.config.fit.trainer
            max_epochs, max_steps = trainer.max_epochs, trainer.max_steps
            if trainer.accumulate_grad_batches < 1:
                raise ValueError(f"trainer.accumulate_grad_batches must be >= 1, got {trainer.accumulate_grad_batches}")
            if max_epochs is not None and max_epochs != -1 and max_epochs < 1:
                raise ValueError(f"trainer.max_epochs must be positive (or -1 for no limit), got {max_epochs}")
            if max_epochs is None:  # Lightning's default: 1000 epochs, unless max_steps or max_time bounds the run
                max_epochs = 1000 if max_steps == -1 and trainer.max_time is None else -1
            if max_epochs == -1 and max_steps in (None, -1) and trainer.max_time is None:
                raise ValueError(
                    "the warmup + cosine schedule needs the run's length: set trainer.max_epochs, "
                    "trainer.max_steps or trainer.max_time (a time budget alone sizes the schedule to the time)"
                )

    def after_instantiate_classes(self) -> None:
        # Fail before the run starts (and before its folder is made) when the model does not fit the data or the
        # checkpoint: these would otherwise fail mid-run, deep inside torch.
        _check_model_fits_data(self.model.model.config, self.datamodule)
        if self._ckpt is not None:
            path, ckpt = self._ckpt
            self._ckpt = None  # the trainer loads the weights again; do not hold a second copy
            try:
                self.model.load_state_dict(ckpt["state_dict"])  # as the trainer will, pos_embed resampling included
            except RuntimeError:
                ours, built = self.model.state_dict(), self.model.model.config.to_dict()
                raise ValueError(runs.mismatch_message(path, ckpt, ours, built, CONFIG_KEY)) from None

    def before_fit(self) -> None:
        self._keep_metrics_history()

    def after_validate(self) -> None:
        self._print_metrics_path()

    def after_test(self) -> None:
        self._print_metrics_path()

    def _print_metrics_path(self) -> None:
        logger = self.trainer.logger
        if isinstance(logger, CSVLogger) and self.trainer.is_global_zero:
            print(f"metrics: {Path(logger.log_dir) / ExperimentWriter.NAME_METRICS_FILE}")

    def _keep_metrics_history(self) -> None:
        """A resumed run keeps the rows of its ``metrics.csv`` up to the checkpoint's step.

        Lightning's CSV writer deletes the file it finds in its folder: the rows are read first and written back
        through the new writer, which then appends the resumed run's rows.
        """
        logger = self.trainer.logger
        if self._resumed_step is None or not isinstance(logger, CSVLogger) or not self.trainer.is_global_zero:
            return
        rows = runs.metrics_rows_before(Path(logger.log_dir) / ExperimentWriter.NAME_METRICS_FILE, self._resumed_step)
        writer = logger.experiment  # this deletes the file
        writer.metrics = rows
        writer.save()

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if trainer.logger is None:  # no run folder: the config would otherwise land in the working directory
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, SaveConfigCallback)]
        return trainer

    def _remove_run_folder_without_results(self) -> None:
        trainer = getattr(self, "trainer", None)
        if trainer is not None and trainer.logger is not None and trainer.is_global_zero and trainer.logger.log_dir:
            runs.remove_if_no_results(Path(trainer.logger.log_dir))

    def _parse_ckpt_path(self) -> None:
        """Take the model's arguments from the checkpoint as defaults that explicit arguments override."""
        subcommand = self.config.get("subcommand")
        if not subcommand:
            return
        ckpt_path = self.config[subcommand].get("ckpt_path")
        # "last" (and, to evaluate, "best") name the newest run's file: in a fresh process Lightning itself has no
        # checkpoint of that name, and would evaluate the untrained model or fail with a misleading message
        if ckpt_path == "last" or (ckpt_path == "best" and subcommand in ("validate", "test")):
            args = self._logger_args()
            root = Path(args.save_dir) / args.name if args is not None else Path("runs")
            ckpt_path = runs.newest_checkpoint(root, ckpt_path, "resume from" if subcommand == "fit" else "evaluate")
            self.config[subcommand]["ckpt_path"] = ckpt_path
        if not ckpt_path or ckpt_path in ("best", "last", "hpc", "registry"):
            return
        ckpt = load_checkpoint_file(ckpt_path)  # a clear error for a missing, foreign or unsafe file
        self._ckpt = (ckpt_path, ckpt)
        defaults = {k: v for k, v in runs.checkpoint_defaults(ckpt).items() if k not in LINKS.values()}
        split = {k[len("data."):]: defaults.pop(k) for k in list(defaults) if k.startswith("data.")}
        data_module = runs.checkpoint_data(ckpt)
        if data_module is not None:  # evaluate (or resume) on the data the run used, unless told otherwise
            defaults["data"] = data_module
        args = list(self._cli_args)
        run_config = runs.run_folder(ckpt_path, ckpt) / "config.yaml"
        if subcommand == "fit" and not _typed(args, "--config") and run_config.is_file():
            # Resuming continues the run as it was configured (its schedule's length, batch size, augmentation):
            # the run's own config, under the arguments typed now, rather than the defaults.
            at = args.index(subcommand) + 1
            args[at:at] = ["--config", str(run_config)]
        if defaults or args != self._cli_args:
            self.parser._subcommands_action._name_parser_map[subcommand].set_defaults(defaults)
            self._cli_args = args
            self.config = self.parser.parse_args(args)
            self.config[subcommand]["ckpt_path"] = ckpt_path  # "last"/"best" as resolved above, not as typed
        data = self.config[subcommand]["data"]["init_args"]
        for key, value in split.items():  # the run's split: no default or config file changes it
            if key in data and not _typed(args, f"--data.{key}"):
                data[key] = value
        # The checkpoint holds the weights and, as built, the architecture: neither the file the run started from
        # (model.pretrained) nor a config file's architecture arguments apply; arguments typed now still win.
        model = self.config[subcommand]["model"]
        model["pretrained"] = None
        for key, value in ckpt.get(CONFIG_KEY, {}).items():
            if key in model and not _typed(args, f"--model.{key}"):
                model[key] = value
        if subcommand == "fit":
            max_epochs, epoch = self.config.fit.trainer.max_epochs, ckpt.get("epoch")
            if max_epochs not in (None, -1) and epoch is not None and epoch >= max_epochs:
                raise ValueError(
                    f"checkpoint {ckpt_path!r} has trained into epoch {epoch + 1}, past --trainer.max_epochs "
                    f"{max_epochs}: pass a larger --trainer.max_epochs to train on, or evaluate it with test"
                )
            self._resume_into(Path(ckpt_path), ckpt)
            self._resumed_step = ckpt.get("global_step")
        elif not any(a.startswith("--trainer.logger") for a in self._cli_args):
            self._evaluate_into(Path(ckpt_path), ckpt)

    def _logger_args(self):
        logger = self.config[self.config.subcommand].trainer.logger
        return logger.init_args if hasattr(logger, "init_args") else None

    def _evaluate_into(self, ckpt_path: Path, ckpt: dict) -> None:
        """Evaluations log beside what they evaluate, ``<run>/eval/version_<n>/``, not into a new training run."""
        args = self._logger_args()
        if args is not None:
            args.save_dir, args.name, args.version = str(runs.evaluation_folder(ckpt_path, ckpt)), "eval", None

    def _resume_into(self, ckpt_path: Path, ckpt: dict) -> None:
        """Log into the run folder the checkpoint came from, so a resumed run stays one run."""
        run = runs.run_folder(ckpt_path, ckpt)
        args = self._logger_args()
        if args is not None and run.name.startswith("version_"):
            args.save_dir, args.name, args.version = str(run.parent.parent), run.parent.name, run.name


def main(args: list[str] | None = None) -> ViTCLI:
    """Run the command line (``args`` as on the command line, default ``sys.argv[1:]``).

    A bad argument, file or setting exits with status 2 after one ``error: ...`` line on stderr, as argument
    errors do (``SystemExit``, the original exception as its ``__cause__``). Errors raised inside the training
    and evaluation loops keep their traceback: they are failures of a run, not of its arguments.

    The process keeps freed memory for reuse (:func:`vit.train.runtime.keep_freed_memory`): a run owns its process,
    and CPU training steps then stop paying page faults for activations allocated anew every step.
    """
    keep_freed_memory()
    _quiet_lightning()
    try:
        return ViTCLI(
            ViTClassifier,
            InMemoryDataModule,  # any of its subclasses, --data NAME; CIFAR10DataModule by default
            subclass_mode_data=True,
            args=args,
            seed_everything_default=0,
            save_config_kwargs={"overwrite": True},
            auto_configure_optimizers=False,  # OWN_OPTIMIZER
        )
    except CheckpointWriteError as err:  # the disk, not the run: one line, wherever it happened
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(1) from err
    except (ValueError, TypeError, FileNotFoundError, NotADirectoryError, IsADirectoryError,
            MisconfigurationException) as err:
        if _raised_in_loop(err):
            raise
        print(f"error: {_union_error(str(err))}", file=sys.stderr)
        raise SystemExit(2) from err


def _quiet_lightning() -> None:
    """Keep the console to the progress bar, the run folder, the results and real warnings.

    Lightning's info lines (seed, GPU/TPU availability, an advertisement, checkpoint restoring) go, and so do the
    warnings that are noise here: a deprecation inside Lightning itself, a Timer or checkpoint folder that an
    evaluation does not need, and "previous log files will be deleted", which the resume logic makes untrue.
    """
    for name in ("lightning.pytorch", "lightning.fabric"):  # and every logger below them
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (r".*isinstance\(treespec, LeafSpec\)` is deprecated", r"The dirpath has changed from",
                    r".*Please add the following callbacks", r".*Previous log files in this directory will be deleted"):
        warnings.filterwarnings("ignore", message=message)


def _check_model_fits_data(config, datamodule) -> None:
    """What the model takes against what the data gives (classes and size are linked from the data; the channels
    of a checkpoint's model may still differ), named in one error."""
    if config.in_channels != 3:  # every data module here yields RGB images
        raise ValueError(f"the model takes {config.in_channels}-channel images (--model.in_channels) but the data's "
                         "are RGB: drop the option or set it to 3")


def _typed(args: list[str], option: str) -> bool:
    """Whether a command line gives ``option`` itself (``--opt value`` or ``--opt=value``)."""
    return any(a == option or a.startswith(option + "=") for a in args)


def _raised_in_loop(err: BaseException) -> bool:
    loops = os.path.dirname(lightning.pytorch.loops.__file__)
    return any(frame.filename.startswith(loops) for frame in traceback.extract_tb(err.__traceback__))
