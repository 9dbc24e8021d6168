"""Optimisation in plain PyTorch: parameter groups, the optimizer (AdamW, or Muon for the blocks' matrices) and the
warmup + cosine learning-rate schedule. No Lightning here: ``vit.ViTClassifier`` calls these.

Muon and AdamW share one optimizer (rather than two): that keeps Lightning's automatic optimisation, one
learning-rate schedule that scales every group from its own base rate, and one state dict in checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor, nn


def param_groups(
    model: nn.Module,
    *,
    weight_decay: float,
    lr: float,
    muon_lr: float | None = None,
    layer_decay: float | None = None,
) -> list[dict]:
    """The parameter groups of ``model``: ``decay`` (weight matrices), ``no_decay`` (``model.no_weight_decay()``:
    biases, norms, CLS token, position embeddings) and, with ``muon_lr``, ``muon``: the 2-D weight matrices
    inside ``blocks.``, at ``muon_lr``. The patch embedding and the head stay on AdamW, as in Muon's reference
    setup.

    Parameters with ``requires_grad=False`` are left out: to train only the head (a linear probe), set it False
    on every other parameter before calling this.

    ``layer_decay`` (``0 < d <= 1``; BEiT's layer-wise learning-rate decay, as timm's ``param_groups_layer_decay``)
    scales each parameter's learning rates by ``d ** (depth + 1 - layer)``: layer 0 is the patch embedding, CLS
    token and position embeddings, layer ``i + 1`` is ``blocks.i``, and the final norm and the head are layer
    ``depth + 1`` (scale 1), so that fine-tuning changes the early, general layers least. The groups are then
    split per layer, named ``decay_layer3``, ``no_decay_layer3``, ``muon_layer3``, each with its ``lr`` already
    scaled (``lr * scale``, ``muon_lr * scale``) and the scale under ``lr_scale``: a schedule that multiplies
    every group's initial rate (``LambdaLR``) keeps the ratios. Empty groups are left out.
    """
    exempt = model.no_weight_decay()
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    if not params:
        raise ValueError("the model has no trainable parameters (every requires_grad is False)")
    matrices = {n for n, p in params.items() if muon_lr is not None and n.startswith("blocks.") and p.ndim == 2}

    def kind(name: str) -> str:
        return "muon" if name in matrices else "no_decay" if name in exempt else "decay"

    if layer_decay is None:
        groups = [
            {"params": [p for n, p in params.items() if kind(n) == "decay"], "weight_decay": weight_decay,
             "name": "decay"},
            {"params": [p for n, p in params.items() if kind(n) == "no_decay"], "weight_decay": 0.0,
             "name": "no_decay"},
        ]
        if matrices:
            # decay scaled so that the matrices shrink per step exactly as much as the AdamW ones (p *= 1 - lr * wd)
            groups.append({"params": [params[n] for n in sorted(matrices)], "lr": muon_lr, "muon": True,
                           "weight_decay": weight_decay * lr / muon_lr, "name": "muon"})
        return [group for group in groups if group["params"]]

    if not 0 < layer_decay <= 1:
        raise ValueError(f"layer_decay must be in (0, 1], got {layer_decay}")
    depth = len(model.blocks)
    by_group: dict[tuple[int, str], list[str]] = {}
    for n in params:
        by_group.setdefault((layer_id(n, depth), kind(n)), []).append(n)
    groups = []
    order = ("decay", "no_decay", "muon")
    for layer, group_kind in sorted(by_group, key=lambda key: (key[0], order.index(key[1]))):
        names = by_group[(layer, group_kind)]
        scale = layer_decay ** (depth + 1 - layer)
        group = {"params": [params[n] for n in (sorted(names) if group_kind == "muon" else names)],
                 "name": f"{group_kind}_layer{layer}", "lr_scale": scale}
        if group_kind == "muon":
            group.update(lr=muon_lr * scale, muon=True, weight_decay=weight_decay * lr / muon_lr)
        else:
            group.update(lr=lr * scale, weight_decay=weight_decay if group_kind == "decay" else 0.0)
        groups.append(group)
    return groups


def layer_id(name: str, depth: int) -> int:
    """The layer of parameter ``name`` for layer-wise learning-rate decay: 0 for the patch embedding, CLS token and
    position embeddings, ``i + 1`` for ``blocks.i``, ``depth + 1`` for the rest (the final norm, the head)."""
    if name.startswith(("patch_embed.", "cls_token", "pos_embed")):
        return 0
    if name.startswith("blocks."):
        return int(name.split(".")[1]) + 1
    return depth + 1


def make_optimizer(groups: list[dict], *, lr: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    """:class:`MuonAdamW` when a group is marked ``muon``, else PyTorch's AdamW (fused where the device has it)."""
    if any(group.get("muon") for group in groups):
        return MuonAdamW(groups, lr=lr, betas=tuple(betas))
    # the fused kernel updates all tensors in one pass: hundreds fewer small ops per step than the default
    fused = all(p.device.type in ("cpu", "cuda") for group in groups for p in group["params"])
    return torch.optim.AdamW(groups, lr=lr, betas=tuple(betas), fused=fused)


def warmup_cosine(total_steps: int, warmup_fraction: float, min_lr_ratio: float) -> Callable[[int], float]:
    """The learning-rate multiplier of optimizer step ``step``: a linear warmup over the first ``warmup_fraction``
    of ``total_steps``, then a cosine decay from 1 to ``min_lr_ratio`` at ``total_steps`` (and after it)."""
    total = max(int(total_steps), 1)
    warmup = int(warmup_fraction * total)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return cosine_decay((step - warmup) / max(total - warmup, 1), min_lr_ratio)

    return schedule


def warmup_cosine_by_progress(progress: float, warmup_fraction: float, min_lr_ratio: float) -> float:
    """The same schedule as a function of the share of the run done, ``progress`` in [0, 1]: for a run bounded by
    time, where the step count is not known in advance."""
    if progress < warmup_fraction:
        return progress / warmup_fraction
    return cosine_decay((progress - warmup_fraction) / (1 - warmup_fraction), min_lr_ratio)


def cosine_decay(progress: float, min_lr_ratio: float) -> float:
    """From 1 at ``progress`` 0 down to ``min_lr_ratio`` at 1 (and after it), along half a cosine."""
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def orthogonalize(update: Tensor, steps: int = 5) -> Tensor:
    """Approximately ``U V^T`` of ``update = U S V^T``: every singular value pushed towards 1.

    The quintic Newton-Schulz iteration of Muon (Jordan et al. 2024), whose coefficients trade exactness for
    speed: singular values land roughly in [0.7, 1.2] (its authors found that trains as well as exact
    orthogonalisation; ``tests/test_recipe.py`` checks [0.5, 1.3] on a badly conditioned input). Works on a
    matrix ``(m, n)`` or a stack of them ``(k, m, n)``, in the update's own dtype (fp32 here: bf16 is slow on
    CPUs without AVX-512).
    """
    a, b, c = 3.4445, -4.7750, 2.0315
    tall = update.shape[-2] > update.shape[-1]
    x = update.mT if tall else update  # iterate on the wide side: the Gram matrix is the smaller square
    shape = x.shape
    x = x.reshape(-1, *shape[-2:])  # a stack, for baddbmm
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)  # spectral norm <= Frobenius norm <= 1: converges
    for _ in range(steps):
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b G + c G^2, fused
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b G + c G^2) X
    x = x.reshape(shape)
    return x.mT if tall else x


class MuonAdamW(torch.optim.Optimizer):
    """Muon on parameter groups with ``muon=True`` (2-D weight matrices), AdamW on the others.

    Muon: Nesterov momentum, then the update is orthogonalised (:func:`orthogonalize`) and scaled by
    ``sqrt(max(1, rows / cols))``; every direction of the matrix moves by about the same amount, which is
    what lets it take larger, better-conditioned steps than Adam on hidden layers. Embeddings, the head,
    biases and norms stay on AdamW, as in Muon's reference setup. Weight decay is decoupled, ``p *= 1 - lr * wd``,
    for both kinds of group.
    """

    def __init__(
        self,
        params: Iterable[dict],
        lr: float = 1e-3,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        defaults = dict(lr=lr, momentum=momentum, betas=betas, eps=eps, weight_decay=weight_decay, muon=False)
        super().__init__(params, defaults)
        for group in self.param_groups:
            if group["muon"] and any(p.ndim != 2 for p in group["params"]):
                shapes = [tuple(p.shape) for p in group["params"] if p.ndim != 2]
                raise ValueError(f"Muon updates 2-D weight matrices only; this group also holds shapes {shapes}")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            lr = group["lr"]
            if group["weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * group["weight_decay"])
            if group["muon"]:
                self._muon(params, lr, group["momentum"])
            else:
                self._adamw(params, lr, *group["betas"], group["eps"])
        return loss

    def _muon(self, params: list[Tensor], lr: float, momentum: float) -> None:
        for p in params:
            if not self.state[p]:
                self.state[p]["momentum_buffer"] = torch.zeros_like(p)
        grads = [p.grad for p in params]
        buffers = [self.state[p]["momentum_buffer"] for p in params]
        torch._foreach_lerp_(buffers, grads, 1 - momentum)
        updates = torch._foreach_lerp(grads, buffers, momentum)  # Nesterov: look one momentum step ahead
        # one batched iteration per shape, tall matrices transposed to wide (U V^T transposes with them):
        # fewer, larger matmuls
        by_shape: dict[tuple[int, int], list[tuple[Tensor, Tensor]]] = {}
        for p, u in zip(params, updates):
            by_shape.setdefault((min(p.shape), max(p.shape)), []).append((p, u.mT if u.shape[0] > u.shape[1] else u))
        for pairs in by_shape.values():
            orthogonal = orthogonalize(torch.stack([u for _, u in pairs]))
            for (p, _), o in zip(pairs, orthogonal):
                rows, cols = p.shape
                p.add_(o.mT if rows > cols else o, alpha=-lr * max(1.0, rows / cols) ** 0.5)

    def _adamw(self, params: list[Tensor], lr: float, beta1: float, beta2: float, eps: float) -> None:
        for p in params:
            if not self.state[p]:
                self.state[p].update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            self.state[p]["step"] += 1
        by_step: dict[int, list[Tensor]] = {}  # bias corrections differ only if some grads were missing earlier
        for p in params:
            by_step.setdefault(self.state[p]["step"], []).append(p)
        for step, group in by_step.items():  # foreach: a few ops per step, not a few per tensor
            grads = [p.grad for p in group]
            exp_avgs = [self.state[p]["exp_avg"] for p in group]
            exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in group]
            torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
            torch._foreach_mul_(exp_avg_sqs, beta2)
            torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
            denoms = torch._foreach_sqrt(exp_avg_sqs)
            torch._foreach_div_(denoms, (1 - beta2**step) ** 0.5)
            torch._foreach_add_(denoms, eps)
            torch._foreach_addcdiv_(group, exp_avgs, denoms, value=-lr / (1 - beta1**step))
