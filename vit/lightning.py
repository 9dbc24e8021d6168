"""The training wrapper: loss, metrics, optimisation and weight averaging around a plain ``vit.ViT``."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Literal

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torchmetrics import MetricCollection
from torchmetrics.classification import MulticlassAccuracy

from vit.augment import mix
from vit.checkpoint import CONFIG_KEY
from vit.model import ViT, _pair, size_config
from vit.optim import MuonAdamW


class ViTClassifier(L.LightningModule):
    """Trains a :class:`vit.ViT` classifier; the constructor arguments are the ``model:`` section of a config.

    Architecture: ``size`` names a row of ``vit.SIZES``; ``dim``, ``depth``, ``heads`` and ``mlp_ratio``
    override it when given. The remaining architecture arguments are those of :class:`vit.ViT`.

    Optimisation: AdamW (weight decay on weight matrices only), or with ``optimizer="muon"`` Muon at ``muon_lr``
    for the blocks' weight matrices and AdamW at ``lr`` for the rest (:class:`vit.optim.MuonAdamW`); a linear
    warmup over the first ``warmup_fraction`` of the optimizer steps, then cosine decay to ``min_lr_ratio``
    times the base rates. The default ``muon_lr`` is the best of 0.0025-0.04 for ``configs/cifar10_cpu15.yaml``
    (README, Results); Muon's usual 0.02 made that ViT train far worse, and 0.04 diverged.

    Regularisation: ``label_smoothing``; mixup/CutMix with soft targets when ``mixup_alpha`` or
    ``cutmix_alpha`` > 0 (accuracy is still measured on the hard labels); stochastic depth ``drop_path``;
    ``patch_drop`` drops that share of patch tokens from each training image (cheaper steps), for the first
    ``patch_drop_until`` share of the optimizer steps; the steps after that see every token, as evaluation does.

    Progressive resolution: with ``low_res_size``, the first ``low_res_until`` share of the optimizer steps
    trains on images downsampled (antialiased bilinear) to ``low_res_size`` pixels a side, through position
    embeddings resampled to the smaller patch grid; the model is built with ``dynamic_img_size``. Those steps
    cost about as much as ``patch_drop`` at full size (16 of 64 tokens at 16x16 with patch 4) but keep the whole
    image; no patches are dropped from them. The later steps, and evaluation, use the full size.

    Evaluation: ``ema_decay`` > 0 keeps an exponential moving average of the weights (``ema_model``);
    ``eval_ema`` makes validation and test evaluate it instead of the raw weights; ``tta_flip`` averages the
    predictions of each image and its mirror image.
    """

    def __init__(
        self,
        size: str = "tiny",
        image_size: int | tuple[int, int] = 32,
        patch_size: int = 4,
        num_classes: int = 10,
        dim: int | None = None,
        depth: int | None = None,
        heads: int | None = None,
        mlp_ratio: float | None = None,
        pool: Literal["cls", "mean"] = "cls",
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.1,
        patch_drop: float = 0.0,
        patch_drop_until: float = 1.0,
        qkv_bias: bool = True,
        init: Literal["trunc_normal", "mimetic"] = "trunc_normal",
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
        compile: bool = False,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 for classification training, got {num_classes}")
        if not 0 <= patch_drop_until <= 1:
            raise ValueError(f"patch_drop_until must be in [0, 1] (a share of the steps), got {patch_drop_until}")
        if not 0 <= low_res_until <= 1:
            raise ValueError(f"low_res_until must be in [0, 1] (a share of the steps), got {low_res_until}")
        if low_res_size is not None and not (0 < low_res_size < min(_pair(image_size))
                                             and low_res_size % patch_size == 0):
            raise ValueError(f"low_res_size {low_res_size} must be smaller than image_size {image_size} and "
                             f"divisible by patch_size {patch_size}")
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
        self.save_hyperparameters()
        arch = size_config(size)
        overrides = dict(dim=dim, depth=depth, heads=heads, mlp_ratio=mlp_ratio)
        arch.update({k: v for k, v in overrides.items() if v is not None})
        self.model = ViT(
            image_size=image_size, patch_size=patch_size, num_classes=num_classes, pool=pool, dropout=dropout,
            attn_dropout=attn_dropout, drop_path=drop_path, patch_drop=patch_drop, qkv_bias=qkv_bias, init=init,
            dynamic_img_size=low_res_size is not None, **arch,
        )
        # The average is a frozen copy updated after each optimizer step; it is never trained.
        self.ema_model = copy.deepcopy(self.model).requires_grad_(False) if ema_decay > 0 else None
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
            # from global_step alone, so a resumed run does exactly what the uninterrupted one would
            step, total = self.global_step, self.trainer.estimated_stepping_batches
            low_res = hp.low_res_size is not None and step < hp.low_res_until * total
            dropping = not low_res and step < hp.patch_drop_until * total
            self.model.patch_drop = hp.patch_drop if dropping else 0.0
            if low_res:
                images = F.interpolate(images, size=hp.low_res_size, mode="bilinear", antialias=True)
        targets: Tensor = labels
        if hp.mixup_alpha > 0 or hp.cutmix_alpha > 0:
            images, targets = mix(images, labels, hp.num_classes, mixup_alpha=hp.mixup_alpha,
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
        logits = self.eval_model(images)
        if self.hparams.tta_flip:
            logits = (logits.softmax(-1) + self.eval_model(images.flip(-1)).softmax(-1)).div(2).log()
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
        exempt = self.model.no_weight_decay()
        params = dict(self.model.named_parameters())
        # Muon takes the weight matrices inside the blocks; the patch embedding and the head stay on AdamW.
        matrices = {n for n, p in params.items() if hp.optimizer == "muon" and n.startswith("blocks.") and p.ndim == 2}
        groups = [
            {"params": [p for n, p in params.items() if n not in exempt | matrices], "weight_decay": hp.weight_decay,
             "name": "decay"},
            {"params": [p for n, p in params.items() if n in exempt], "weight_decay": 0.0, "name": "no_decay"},
        ]
        if matrices:
            # decay scaled so that the matrices shrink per step exactly as much as the AdamW ones (p *= 1 - lr * wd)
            groups.append({"params": [params[n] for n in sorted(matrices)], "lr": hp.muon_lr, "muon": True,
                           "weight_decay": hp.weight_decay * hp.lr / hp.muon_lr, "name": "muon"})
            optimizer = MuonAdamW(groups, lr=hp.lr, betas=tuple(hp.betas))
        else:
            # the fused kernel updates all tensors in one pass: hundreds fewer small ops per step than the default
            fused = all(p.device.type in ("cpu", "cuda") for p in params.values())
            optimizer = torch.optim.AdamW(groups, lr=hp.lr, betas=tuple(hp.betas), fused=fused)
        total = max(int(self.trainer.estimated_stepping_batches), 1)
        warmup = int(hp.warmup_fraction * total)

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            progress = min((step - warmup) / max(total - warmup, 1), 1.0)
            return hp.min_lr_ratio + (1 - hp.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    # ---- run folder and checkpoints -----------------------------------------------------------------------

    def on_fit_start(self) -> None:
        rank_zero_info(f"run folder: {self.trainer.log_dir}")

    def on_fit_end(self) -> None:
        if self.trainer.log_dir is None:
            return
        # the files that exist: best.ckpt needs a validation (none with val_size 0)
        written = [f"checkpoints/{name}" for name in ("best.ckpt", "last.ckpt")
                   if (Path(self.trainer.log_dir) / "checkpoints" / name).is_file()]
        rank_zero_info(f"run folder: {self.trainer.log_dir} ({', '.join(written) or 'no checkpoint'})")

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # plain data, so that vit.ViT.from_checkpoint can rebuild the network without Lightning
        checkpoint[CONFIG_KEY] = self.model.config
