"""Training and inference throughput of the same ViT in three packages: ``vit``, timm and vit-pytorch.

The architecture is the CIFAR-10 ViT of this repository's issue: 32x32 images, 4x4 patches (64 tokens + a CLS
token), width 192, depth 6, 3 heads of 64, MLP 768, learned position embeddings, CLS pooling, 10 classes:

* ``vit``: ``vit.ViT(image_size=32, patch_size=4, num_classes=10, dim=192, depth=6, heads=3, mlp_ratio=4)``;
* ``timm``: ``timm.models.vision_transformer.VisionTransformer`` with the same sizes;
* ``vit-pytorch``: ``vit_pytorch.ViT(..., dim=192, depth=6, heads=3, mlp_dim=768, dim_head=64, pool="cls")``.

Measured, in images/s (median over rounds), for each model in eager mode and under ``torch.compile``:

* ``train``: one optimisation step, forward + cross-entropy + backward + ``torch.optim.AdamW.step`` (the same
  optimizer settings for all three: lr 1e-3, weight decay 0.05, torch's default implementation) and
  ``zero_grad``. Under ``torch.compile`` the model is compiled (forward and backward); the optimizer step
  stays eager, as in a Lightning run of ``vit.ViTClassifier``.
* ``infer``: a forward pass in ``eval()`` mode under ``torch.inference_mode``.

The contenders run interleaved in one process, after warmup (round 1: vit, timm, vit-pytorch; round 2: timm,
vit-pytorch, vit; the order rotates), so that a noisy machine slows all three alike; each ratio compares the same
mode against the same mode. Two ratios are printed: of the medians, and the median of the per-round ratios
(paired, so less sensitive to load that changes between rounds), with the quartiles of the per-round ratios.
Compilation time (the first calls of a compiled model) is printed separately and excluded from the timings.
fp32 by default, ``torch.set_num_threads`` = all cores; on a GPU ``--dtype bf16`` runs under bf16 autocast.
The process keeps freed memory for reuse (``vit.train.runtime.keep_freed_memory``, as ``train.py`` does), for all
three alike: otherwise whichever model's allocation order makes glibc return memory to the OS pays page faults
on every step (0 to ~54,000 a step measured here, up to ~9% of a step), luck rather than model speed.
``--system-malloc`` leaves the allocator as it is; each mode prints the median page faults per step.

Run (needs the ``bench`` extra: ``pip install -e ".[bench]"``)::

    python benchmarks/throughput.py                 # CPU, eager and compiled, train and inference
    python benchmarks/throughput.py --quick         # smoke run: fewer rounds and steps
    python benchmarks/throughput.py --no-compile    # eager only
    python benchmarks/throughput.py --device cuda --dtype bf16 --batch-size 512
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from typing import Callable

try:
    import resource  # Unix only: page-fault counts
except ImportError:
    resource = None

import torch
import torch.nn.functional as F
from torch import nn

import vit
from vit.train.runtime import keep_freed_memory

IMAGE_SIZE, PATCH, DIM, DEPTH, HEADS, MLP_RATIO, CLASSES = 32, 4, 192, 6, 3, 4, 10


def build_models() -> dict[str, nn.Module]:
    """The three implementations of the same architecture (each with its own default initialisation)."""
    from timm.models.vision_transformer import VisionTransformer
    from vit_pytorch import ViT as LucidViT

    torch.manual_seed(0)
    return {
        "vit": vit.ViT(
            image_size=IMAGE_SIZE, patch_size=PATCH, num_classes=CLASSES, dim=DIM, depth=DEPTH, heads=HEADS,
            mlp_ratio=MLP_RATIO,
        ),
        "timm": VisionTransformer(
            img_size=IMAGE_SIZE, patch_size=PATCH, embed_dim=DIM, depth=DEPTH, num_heads=HEADS, mlp_ratio=MLP_RATIO,
            class_token=True, global_pool="token", num_classes=CLASSES,
        ),
        "vit-pytorch": LucidViT(
            image_size=IMAGE_SIZE, patch_size=PATCH, num_classes=CLASSES, dim=DIM, depth=DEPTH, heads=HEADS,
            mlp_dim=DIM * MLP_RATIO, dim_head=DIM // HEADS, pool="cls",
        ),
    }


PARAM_NOTES = """\
Why the counts differ (same blocks, attention, MLP and head everywhere):
  vit          patch Linear(48->192), CLS token, 65 position embeddings, qkv with bias, pre-norm blocks.
  timm         the same parameters as vit (a 4x4/4 Conv2d patch embedding is the same 48x192 matrix):
               equal counts, and vit.ViT.from_timm maps one onto the other.
  vit-pytorch  no qkv bias (-6 x 576), but a LayerNorm(48) before and a LayerNorm(192) after the patch
               projection (+96 +384); its norm1 lives inside Attention and norm2 inside FeedForward."""


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def minor_faults() -> int:
    """Minor page faults of this process so far (first touches of fresh memory); 0 where not reported."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt if resource is not None else 0


def quartiles(values: list[float]) -> str:
    """First and third quartiles, e.g. ``1.15-1.26``; a single value stands for both."""
    if len(values) < 2:
        return f"{values[0]:.2f}-{values[0]:.2f}"
    q1, _, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.2f}-{q3:.2f}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_train_step(model: nn.Module, images, labels, autocast) -> Callable[[], None]:
    # The same optimizer for every contender; torch's default AdamW (foreach on CPU and GPU).
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)

    def step() -> None:
        with autocast():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def make_infer_step(model: nn.Module, images, autocast) -> Callable[[], None]:
    def step() -> None:
        with torch.inference_mode(), autocast():
            model(images)

    return step


def run_mode(
    name: str, steps: dict[str, Callable[[], None]], batch: int, rounds: int, iters: int, warmup: int,
    device: torch.device,
) -> dict[str, float]:
    """Warm every contender up, then time ``iters`` calls per contender per round, interleaved; median img/s."""
    for label, step in steps.items():
        start = time.perf_counter()
        for _ in range(warmup):
            step()
        sync(device)
        print(f"  [{name}] warmup {label:<12} {time.perf_counter() - start:7.1f} s", flush=True)
    rates: dict[str, list[float]] = {label: [] for label in steps}
    faults: dict[str, list[float]] = {label: [] for label in steps}  # minor page faults per step
    labels = list(steps)
    for r in range(rounds):
        # rotate who goes first, so that no contender always runs in the same place of a round
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            step = steps[label]
            sync(device)
            start, faulted = time.perf_counter(), minor_faults()
            for _ in range(iters):
                step()
            sync(device)
            rates[label].append(batch * iters / (time.perf_counter() - start))
            faults[label].append((minor_faults() - faulted) / iters)
        print(f"  [{name}] round {r + 1}/{rounds}: " + "  ".join(f"{k} {v[-1]:7.1f}" for k, v in rates.items()),
              flush=True)
    medians = {label: statistics.median(v) for label, v in rates.items()}
    peers = [label for label in medians if label != "vit"]
    print(f"{name}: median images/s  " + "  ".join(f"{k} {v:.1f}" for k, v in medians.items()))
    print(f"{name}: median page faults per step  "
          + "  ".join(f"{k} {statistics.median(v):,.0f}" for k, v in faults.items()))
    print(f"{name}: ratio " + "  ".join(f"vit/{p} {medians['vit'] / medians[p]:.2f}x" for p in peers), flush=True)
    # Paired: the ratio within each round (neighbours in time share the machine's load), then its median.
    # Their quartiles show how far one run of this benchmark can be trusted on this machine.
    paired = {p: [a / b for a, b in zip(rates["vit"], rates[p])] for p in peers}
    print(f"{name}: median of per-round ratios " + "  ".join(
        f"vit/{p} {statistics.median(r):.2f}x (quartiles {quartiles(r)})" for p, r in paired.items()), flush=True)
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: 3 rounds, fewer steps")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="bf16: autocast (GPU only)")
    parser.add_argument("--no-compile", action="store_true", help="eager mode only")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per mode (default 7, quick 3)")
    parser.add_argument("--system-malloc", action="store_true", help="leave glibc's malloc settings as they are")
    args = parser.parse_args()
    kept = False if args.system_malloc else keep_freed_memory()

    device = torch.device(args.device)
    if args.dtype == "bf16" and device.type != "cuda":
        parser.error("--dtype bf16 is for --device cuda (bf16 autocast on this CPU would measure emulation)")
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        if args.dtype == "bf16":
            return torch.autocast(device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    rounds = args.rounds or (3 if args.quick else 7)
    train_iters, infer_iters = (1, 2) if args.quick else (3, 6)
    if device.type == "cuda":  # GPU steps take milliseconds: time more of them per round
        train_iters, infer_iters = train_iters * 20, infer_iters * 20
    warmup = 2 if args.quick else 3

    print(f"torch {torch.__version__}, device {device}, dtype {args.dtype}, threads {threads}, "
          f"batch {args.batch_size}, rounds {rounds}, freed memory kept: {kept}")
    models = {k: m.to(device) for k, m in build_models().items()}
    for label, model in models.items():
        print(f"  {label:<12} {count_params(model):>10,d} parameters")
    print(PARAM_NOTES)

    g = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, generator=g).to(device)
    labels = torch.randint(0, CLASSES, (args.batch_size,), generator=g).to(device)

    results: dict[tuple[str, str], dict[str, float]] = {}
    for variant in ("eager",) if args.no_compile else ("eager", "compiled"):
        runnable = dict(models)
        if variant == "compiled":  # compile outside the timings: the first calls of each mode trigger it
            torch._dynamo.reset()
            runnable = {k: torch.compile(m) for k, m in models.items()}
            for mode in ("train", "infer"):
                for label, model in runnable.items():
                    model.train(mode == "train")
                    start = time.perf_counter()
                    if mode == "train":
                        with autocast():
                            F.cross_entropy(model(images), labels).backward()
                        model.zero_grad(set_to_none=True)
                    else:
                        make_infer_step(model, images, autocast)()
                    sync(device)
                    print(f"  compile {mode:<5} {label:<12} {time.perf_counter() - start:6.1f} s", flush=True)
        for m in models.values():
            m.train()
        train = {k: make_train_step(m, images, labels, autocast) for k, m in runnable.items()}
        results[(variant, "train")] = run_mode(
            f"{variant} train", train, args.batch_size, rounds, train_iters, warmup, device
        )
        for m in models.values():
            m.eval()
        infer = {k: make_infer_step(m, images, autocast) for k, m in runnable.items()}
        results[(variant, "infer")] = run_mode(
            f"{variant} infer", infer, args.batch_size, rounds, infer_iters, warmup, device
        )

    peers = [k for k in models if k != "vit"]
    print(f"\nSummary: median images/s, batch {args.batch_size}, {args.dtype}, {device}, {threads} threads")
    header = f"{'mode':<16}" + "".join(f"{k:>13}" for k in models) + "".join(f"{'vit/' + p:>17}" for p in peers)
    print(header)
    print("-" * len(header))
    for (variant, mode), medians in results.items():
        row = f"{variant + ' ' + mode:<16}" + "".join(f"{medians[k]:>13.1f}" for k in models)
        row += "".join(f"{medians['vit'] / medians[p]:>16.2f}x" for p in peers)
        print(row)


if __name__ == "__main__":
    main()
