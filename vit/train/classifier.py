"""The training wrapper: loss, metrics, optimisation and weight averaging around a plain ``vit.ViT``."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Timer
from lightning.pytorch.utilities import rank_zero_only
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vit.data.augment import mix
from vit.nn.config import ViTConfig
from vit.nn.tta import tta_probs
from vit.nn.vit import ViT
from vit.train.optim import make_optimizer, param_groups, warmup_cosine, warmup_cosine_by_progress
from vit.weights.checkpoint import CONFIG_KEY, DATA_KEY
from vit.weights.pretrained import load_pretrained


class ViTClassifier(L.LightningModule):
    """Trains a :class:`vit.ViT` classifier; the constructor arguments are the ``model:`` section of a config.

    The architecture arguments are the fields of ``vit.ViTConfig`` (``size``, ``image_size``, ``dim``,
    ``patch_drop``, ...), given flat beside the training ones: ``--model.size micro --model.lr 2e-3``.

    Optimisation: AdamW with weight decay on weight matrices only, or Muon for the blocks' weight matrices and
    AdamW for the rest (``vit.train.optim``); a linear warmup, then cosine decay, per optimizer step.

    Args:
        pretrained: start from these weights (vit.weights.load_pretrained): a checkpoint or safetensors export of
            this package, a timm ViT state dict (.pth/.bin/.safetensors), or timm:NAME. The architecture comes from
            the weights; a new head is made when num_classes differs, and position embeddings (and patch kernels)
            are resampled when image_size (patch_size) differs.
        layer_decay: layer-wise learning-rate decay for fine-tuning (e.g. 0.65-0.85): block i's rates are scaled by
            layer_decay ** (depth - i), the head's by 1. None: off.
        freeze_backbone: train the head only (a linear probe): every other weight stays as loaded.
        patch_drop_until: share of the optimizer steps (of the time, with a time budget alone) that drop
            patches (patch_drop); the later steps see every token, as evaluation does.
        low_res_size: train the first low_res_until share of the steps on images downsampled to this many
            pixels a side (progressive resolution; the model gets dynamic_img_size). None: off.
        low_res_until: share of the optimizer steps at low_res_size.
        optimizer: adamw, or muon (Muon at muon_lr for the blocks' weight matrices, AdamW at lr for the rest).
        lr: peak learning rate of AdamW.
        muon_lr: peak learning rate of Muon (with optimizer muon).
        weight_decay: decoupled weight decay of the weight matrices (biases, norms and embeddings get none).
        betas: AdamW's moment decay rates.
        warmup_fraction: share of the optimizer steps of linear warmup.
        min_lr_ratio: learning rate at the end of the cosine decay, as a share of the peak.
        label_smoothing: label smoothing of the training loss.
        mixup_alpha: mixup's Beta parameter; 0 turns mixup off.
        cutmix_alpha: CutMix's Beta parameter; 0 turns CutMix off.
        mix_prob: probability that a batch is mixed (with mixup_alpha or cutmix_alpha).
        ema_decay: decay of an exponential moving average of the weights; 0 keeps none.
        eval_ema: validate and test the weight average instead of the trained weights.
        tta_flip: average each evaluated image's predictions with its mirror image's.
        tta_shift: also average the views shifted this many pixels down-right and up-left (reflect-padded;
            with tta_flip, their mirror images too: 6 views); 0: off. See vit.nn.tta.
        compile: compile the network with torch.compile.
        **arch: the architecture: the fields of vit.ViTConfig.
    """

    def __init__(
        self,
        pretrained: str | None = None,
        layer_decay: float | None = None,
        freeze_backbone: bool = False,
        patch_drop_until: float = 1.0,
        low_res_size: int | None = None,
        low_res_until: float = 0.5,
        optimizer: Literal["adamw", "muon"] = "adamw",
        lr: float = 1e-3,
        muon_lr: float = 0.005,
        weight_decay: float = 0.05,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_fraction: float = 0.05,
        min_lr_ratio: float = 0.01,
        label_smoothing: float = 0.1,
        mixup_alpha: float = 0.0,
        cutmix_alpha: float = 0.0,
        mix_prob: float = 1.0,
        ema_decay: float = 0.0,
        eval_ema: bool = False,
        tta_flip: bool = False,
        tta_shift: int = 0,
        compile: bool = False,
        **arch,
    ) -> None:
        super().__init__()
        config = ViTConfig(**arch)
        if config.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 for classification training, got {config.num_classes}")
        if not 0 <= patch_drop_until <= 1:
            raise ValueError(f"patch_drop_until must be in [0, 1] (a share of the steps), got {patch_drop_until}")
        if tta_shift < 0:
            raise ValueError(f"tta_shift must be >= 0 pixels (0 turns the shifted views off), got {tta_shift}")
        if not 0 <= low_res_until <= 1:
            raise ValueError(f"low_res_until must be in [0, 1] (a share of the steps), got {low_res_until}")
        if low_res_size is not None:
            if not (0 < low_res_size < min(config.image_size) and low_res_size % config.patch_size == 0):
                raise ValueError(f"low_res_size {low_res_size} must be smaller than image_size "
                                 f"{min(config.image_size)} and divisible by patch_size {config.patch_size}")
            config = config.replace(dynamic_img_size=True)  # the low-resolution steps need another patch grid
        if lr <= 0 or muon_lr <= 0:
            raise ValueError(f"lr and muon_lr must be positive, got {lr} and {muon_lr}")
        if optimizer not in ("adamw", "muon"):
            raise ValueError(f"unknown optimizer {optimizer!r}; use 'adamw' or 'muon'")
        if weight_decay < 0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        if not 0 <= warmup_fraction < 1:
            raise ValueError(f"warmup_fraction must be in [0, 1), got {warmup_fraction}")
        if not 0 <= min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio must be in [0, 1] (the final share of the base rates), got {min_lr_ratio}")
        if mixup_alpha < 0 or cutmix_alpha < 0:
            raise ValueError(f"mixup_alpha and cutmix_alpha must be >= 0 (0 = off), got {mixup_alpha}, {cutmix_alpha}")
        if not 0 <= mix_prob <= 1:
            raise ValueError(f"mix_prob must be in [0, 1], got {mix_prob}")
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        if not 0 <= ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) (0 disables the average), got {ema_decay}")
        if eval_ema and ema_decay == 0:
            raise ValueError("eval_ema needs a weight average: train with ema_decay > 0 (e.g. 0.999); "
                             "a checkpoint trained without one has none to evaluate")
        if layer_decay is not None and not 0 < layer_decay <= 1:
            raise ValueError(f"layer_decay must be in (0, 1] (1 = no decay), got {layer_decay}")
        self.save_hyperparameters()
        if pretrained is None:
            self.model = ViT(config)
        else:
            requested = {**arch, "dynamic_img_size": config.dynamic_img_size}
            self.model = load_pretrained(pretrained, **requested).train()
            # A checkpoint of this run rebuilds the network from these, not from the file it started from.
            self.hparams.update(self.model.config.to_dict(), pretrained=None)
        if freeze_backbone:
            for name, p in self.model.named_parameters():
                p.requires_grad_(name.startswith("head."))
        # The average is a frozen copy updated after each optimizer step; it is never trained.
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False) if ema_decay > 0 else None
        num_classes = config.num_classes
        metrics = MetricCollection(
            {
                "acc": MulticlassAccuracy(num_classes, top_k=1, average="micro"),
                "acc_top5": MulticlassAccuracy(num_classes, top_k=min(5, num_classes), average="micro"),
            }
        )
        self.train_metrics = metrics.clone(prefix="train/")
        self.val_metrics = metrics.clone(prefix="val/")
        self.test_metrics = metrics.clone(prefix="test/")
        if compile:
            self.model.compile()

    def forward(self, images: Tensor) -> Tensor:
        return self.model(images)

    @property
    def eval_model(self) -> ViT:
        """The network that validation and test evaluate: the weight average when ``eval_ema``."""
        return self.ema_model if self.hparams.eval_ema else self.model

    # ---- steps --------------------------------------------------------------------------------------------

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, labels = batch
        hp = self.hparams
        if hp.patch_drop_until < 1 or hp.low_res_size is not None:
            progress = self.run_progress()
            low_res = hp.low_res_size is not None and progress < hp.low_res_until
            dropping = not low_res and progress < hp.patch_drop_until
            self.model.patch_drop = self.model.config.patch_drop if dropping else 0.0
            if low_res:
                images = F.interpolate(images, size=hp.low_res_size, mode="bilinear", antialias=True)
        targets: Tensor = labels
        if hp.mixup_alpha > 0 or hp.cutmix_alpha > 0:
            images, targets = mix(images, labels, self.model.num_classes, mixup_alpha=hp.mixup_alpha,
                                  cutmix_alpha=hp.cutmix_alpha, prob=hp.mix_prob)
        logits = self.model(images)
        # cross_entropy takes class indices or, after mixing, class probabilities
        loss = F.cross_entropy(logits, targets, label_smoothing=hp.label_smoothing)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite training loss ({loss.item()}) at step {self.global_step} (epoch {self.current_epoch}); "
                "lower the learning rate or check the data. The last checkpoint written before this step is intact."
            )
        self.train_metrics.update(logits.detach(), labels)
        self.log("train/loss", loss, prog_bar=True)
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True)
        return loss

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str) -> None:
        images, labels = batch
        hp = self.hparams
        if hp.tta_flip or hp.tta_shift:
            logits = tta_probs(self.eval_model, images, hp.tta_flip, hp.tta_shift).log()
        else:
            logits = self.eval_model(images)
        loss = F.cross_entropy(logits, labels)
        metrics = self.val_metrics if stage == "val" else self.test_metrics
        metrics.update(logits, labels)
        self.log(f"{stage}/loss", loss, prog_bar=stage == "val", sync_dist=True)
        self.log_dict(metrics, prog_bar=stage == "val")

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    # ---- weight average -----------------------------------------------------------------------------------

    def on_train_start(self) -> None:
        self._ema_step = self.global_step  # the optimizer step the average last saw (a resumed run's, too)

    @torch.no_grad()
    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        if self.ema_model is None or self.global_step == self._ema_step:
            return  # no optimizer step since the last update (gradient accumulation): the weights are unchanged
        self._ema_step = step = self.global_step
        # timm-style warmup of the decay: early on the average follows the fast-moving weights closely
        decay = min(self.hparams.ema_decay, (1 + step) / (10 + step))
        ema = list(self.ema_model.parameters())
        torch._foreach_lerp_(ema, [p.detach() for p in self.model.parameters()], 1.0 - decay)

    # ---- optimisation -------------------------------------------------------------------------------------

    def configure_optimizers(self):
        hp = self.hparams
        groups = param_groups(self.model, weight_decay=hp.weight_decay, lr=hp.lr,
                              muon_lr=hp.muon_lr if hp.optimizer == "muon" else None, layer_decay=hp.layer_decay)
        optimizer = make_optimizer(groups, lr=hp.lr, betas=hp.betas)
        if self._time_budget() is None:
            schedule = warmup_cosine(self.trainer.estimated_stepping_batches, hp.warmup_fraction, hp.min_lr_ratio)
        else:
            def schedule(step: int) -> float:
                return warmup_cosine_by_progress(self.run_progress(), hp.warmup_fraction, hp.min_lr_ratio)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def run_progress(self) -> float:
        """The share of the run done, from 0 to 1: optimizer steps over the run's steps, or, for a run bounded by
        ``max_time`` alone, the training time spent over the budget (a resumed run counts the time before it).

        Steps make the schedule a function of the step alone, so the same config and seed give the same run. Time
        fills a budget on a machine of any speed, but the step count, and so the run, depends on the machine.
        """
        timer = self._time_budget()
        if timer is None:
            return self.global_step / max(self.trainer.estimated_stepping_batches, 1)
        elapsed = timer.time_elapsed()
        progress = min(elapsed / (elapsed + timer.time_remaining()), 1.0)
        if self.trainer.world_size > 1:  # every process must step with the same learning rate
            progress = self.trainer.strategy.broadcast(progress)
        return progress

    def _time_budget(self) -> Timer | None:
        """Lightning's ``max_time`` timer, when it alone bounds the run (no ``max_steps``, ``max_epochs`` -1)."""
        if math.isfinite(self.trainer.estimated_stepping_batches):
            return None
        return next(c for c in self.trainer.callbacks if isinstance(c, Timer) and c.time_remaining() is not None)

    # ---- run folder and checkpoints -----------------------------------------------------------------------

    def on_fit_start(self) -> None:
        _say(f"run folder: {self.trainer.log_dir}")
        timer = self._time_budget()
        if timer is not None:
            budget = timer.time_elapsed() + timer.time_remaining()
            _say(f"learning-rate schedule: warmup and cosine decay over the max_time budget of {budget:.0f} s")

    def on_fit_end(self) -> None:
        if self.trainer.log_dir is None:
            return
        # the files that exist, whatever their names (best.ckpt needs a validation: none with val_size 0)
        folder = Path(self.trainer.log_dir)
        written = sorted(str(p.relative_to(folder)) for p in folder.glob("checkpoints/*.ckpt"))
        _say(f"run folder: {folder} ({', '.join(written) or 'no checkpoint'})")

    def setup(self, stage: str) -> None:
        # what the data is (class names, normalisation) travels with the weights, to the tools and exports
        datamodule = getattr(self.trainer, "datamodule", None)
        if datamodule is not None and all(hasattr(datamodule, k) for k in ("classes", "mean", "std")):
            info = {"classes": list(datamodule.classes), "mean": [float(m) for m in datamodule.mean],
                    "std": [float(s) for s in datamodule.std]}
            for model in filter(None, (self.model, self.ema_model)):
                model.data_info = info

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # plain data, so that vit.ViT.from_checkpoint can rebuild the network without Lightning
        checkpoint[CONFIG_KEY] = self.model.config.to_dict()
        if self.model.data_info is not None:
            checkpoint[DATA_KEY] = self.model.data_info


@rank_zero_only
def _say(message: str) -> None:
    """A line for the person at the console, from the main process only."""
    print(message, flush=True)
