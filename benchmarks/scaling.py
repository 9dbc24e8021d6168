"""How the training cost of the same ViT in ``vit`` and timm grows with tokens, depth and width; inference latency.

The two contenders are built as in ``throughput.py`` (``vit.ViT`` and timm's ``VisionTransformer`` with
``class_token=True, global_pool="token"``, qkv bias, MLP ratio 4, 10 classes), with the LayerNorm epsilon matched
(timm's 1e-6): the same parameters, count for count. For each configuration, interleaved in one process as in
``throughput.py`` (its ``run_mode``: warmup, rounds with the contenders' order rotating, medians, ratios):

* **time**: one training step, forward + cross-entropy + backward + AdamW step, in ms per image (median over
  rounds); the ratio timm/vit of the medians (>1: ``vit`` is faster);
* **memory**: how far one warm training step raises memory above what the process holds between steps (weights,
  AdamW state), in MB per image: the slope between two batch sizes b and 2b, b such that b images' activations
  come to ~256 MiB by an estimate (64 with ``--quick``), well above the measurement's noise of ~10 MB; each
  growth is the lower of two steps (one step for the slowest configurations). The per-model part of the step
  (gradients, the optimizer's temporaries) drops out of the slope; the log prints it as "fixed" (the intercept,
  noisy by tens of MB), the table the growth measured at 2b. On CPU the steps run in a worker process (spawned
  once, idle while the main process times) that releases freed heap pages (``malloc_trim``), resets the
  kernel's resident-set high-water mark (``/proc/self/clear_refs``) and reads ``VmHWM`` minus ``VmRSS`` around
  the step, with the allocator settings of training (``keep_freed_memory``); on CUDA,
  ``torch.cuda.max_memory_allocated`` minus the allocated memory before it.

Three sweeps (fp32, the batch sized from a FLOP estimate so that a step takes ~0.5 s, at least 1 image):

1. tokens: images of 32, 64, 128 and 224 pixels at patch 4, 8 and 16, where the grid has 64 to 3,136 tokens
   (dim 192, depth 6, 3 heads): 64 tokens three ways, 196, 256 two ways, 784, 1,024 and 3,136;
2. depth 2, 4, 6, 8, 12 at 64 tokens (32 pixels, patch 4), dim 192;
3. width 96, 192, 384, 768 at 64 tokens, depth 6, heads of 64 (dim 96: 2 heads of 48, 96/64 not being whole).

Configurations shared by sweeps run once. From the token sweep it prints the log-log slope of time per image
against tokens over the three largest token counts, and where attention's quadratic term overtakes the linear
layers: by FLOPs (per block, attention's two N x N products cost 4 N^2 d against 24 N d^2 for qkv, projection and
the 4x MLP: equal at N = 6d) and measured (where the local slope passes 1.5, which is where the two terms of
a N + b N^2 are equal; and a fit of c + a N + b N^2 to the time per image, N* = a / b). A markdown table goes to
``benchmarks/scaling/table.md`` and plots to ``benchmarks/scaling/*.png``.

``--latency`` instead measures inference latency of a trained CIFAR-10 model (``--ckpt_path``) at batch 1 and 64:
eager, ``torch.compile`` (compilation excluded) and ONNX Runtime (exported with ``vit.tools.export.export_onnx``,
CPU provider, as many threads as torch), interleaved, median of ``--runs`` calls each; the table also goes to
``benchmarks/scaling/latency.md``.

Run (needs the ``bench`` extra, onnxruntime and matplotlib)::

    python benchmarks/scaling.py                 # the three sweeps, ~5-6 minutes on 2 cores
    python benchmarks/scaling.py --quick         # smoke run, under a minute (writes to a temporary folder)
    python benchmarks/scaling.py --latency       # eager / torch.compile / ONNX Runtime latency, batch 1 and 64
    python benchmarks/scaling.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import dataclasses
import datetime
import gc
import math
import multiprocessing
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import vit  # noqa: E402
from throughput import count_params, make_infer_step, make_train_step, run_mode, sync  # noqa: E402
from vit.train.runtime import keep_freed_memory  # noqa: E402

CONTENDERS = ("vit", "timm")
MLP_RATIO, CLASSES, NORM_EPS = 4, 10, 1e-6
OUT_DIR = Path(__file__).resolve().parent / "scaling"
DEFAULT_CKPT = Path("runs/cifar10_cpu15/version_0/checkpoints/best.ckpt")
# Assumed sustained training FLOP/s, only to size the batches (a step of ~target seconds); the timings do not use it.
ASSUMED_FLOPS = {"cpu": 150e9, "cuda": 100e12}
MAX_BATCH = {"cpu": 256, "cuda": 1024}


@dataclasses.dataclass(frozen=True)
class Config:
    image: int
    patch: int
    dim: int = 192
    depth: int = 6
    heads: int = 3

    @property
    def tokens(self) -> int:
        """Patch tokens (the CLS token comes on top)."""
        return (self.image // self.patch) ** 2

    @property
    def label(self) -> str:
        return f"{self.image}px p{self.patch} d{self.dim} L{self.depth} h{self.heads}"

    def train_flops(self) -> float:
        """Multiply-add FLOPs (x2) of one image's training step, ~3x the forward's blocks (CLS token included)."""
        n, d = self.tokens + 1, self.dim
        return 3 * self.depth * (24 * n * d * d + 4 * n * n * d)


def sweeps(quick: bool) -> dict[str, list[Config]]:
    if quick:
        return {
            "tokens": [Config(32, 4), Config(64, 8), Config(64, 4)],
            "depth": [Config(32, 4, depth=depth) for depth in (2, 6)],
            "width": [Config(32, 4, dim=dim, heads=heads) for dim, heads in ((96, 2), (192, 3))],
        }
    tokens = [Config(image, patch) for patch in (4, 8, 16) for image in (32, 64, 128, 224)]
    return {
        "tokens": sorted((c for c in tokens if 64 <= c.tokens <= 3136), key=lambda c: (c.tokens, c.patch)),
        "depth": [Config(32, 4, depth=depth) for depth in (2, 4, 6, 8, 12)],
        "width": [Config(32, 4, dim=dim, heads=heads) for dim, heads in ((96, 2), (192, 3), (384, 6), (768, 12))],
    }


def build(label: str, cfg: Config) -> nn.Module:
    """One contender at ``cfg``; the same architecture and parameter count in both."""
    torch.manual_seed(0)
    if label == "vit":
        return vit.ViT(
            image_size=cfg.image, patch_size=cfg.patch, num_classes=CLASSES, dim=cfg.dim, depth=cfg.depth,
            heads=cfg.heads, mlp_ratio=MLP_RATIO, qkv_bias=True, norm_eps=NORM_EPS,
        )
    from timm.models.vision_transformer import VisionTransformer  # its LayerNorms use eps 1e-6

    return VisionTransformer(
        img_size=cfg.image, patch_size=cfg.patch, embed_dim=cfg.dim, depth=cfg.depth, num_heads=cfg.heads,
        mlp_ratio=MLP_RATIO, qkv_bias=True, class_token=True, global_pool="token", num_classes=CLASSES,
    )


def batch_for(cfg: Config, target_s: float, device: torch.device) -> int:
    """A power of two giving a step of about ``target_s`` at the assumed FLOP rate; 1 at least."""
    images = target_s * ASSUMED_FLOPS[device.type] / cfg.train_flops()
    return int(min(MAX_BATCH[device.type], 2 ** max(0, round(math.log2(max(images, 1))))))


def memory_batches(cfg: Config, device: torch.device, mib: int) -> tuple[int, int]:
    """Two batch sizes b, 2b whose activations differ by ~``mib`` MiB or more (estimate: 16 floats per token and dim
    in each block; the fused attention kernels keep no N x N map)."""
    per_image = 4 * cfg.depth * 16 * (cfg.tokens + 1) * cfg.dim
    low = min(2 ** max(0, math.ceil(math.log2(mib * 2**20 / per_image))), MAX_BATCH[device.type] // 2)
    return low, 2 * low


def random_batch(cfg: Config, batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, cfg.image, cfg.image, generator=g)
    labels = torch.randint(0, CLASSES, (batch,), generator=g)
    return images.to(device), labels.to(device)


def cpu_name() -> str:
    """The CPU's model name as ``lscpu`` gives it (``/proc/cpuinfo`` where there is no lscpu)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
        match = re.search(r"^Model name:\s*(.+)$", out, re.MULTILINE)
    except (OSError, subprocess.CalledProcessError):
        match = None
    if match is None and os.path.exists("/proc/cpuinfo"):
        match = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.MULTILINE)
    return match.group(1).strip() if match else "unknown CPU"


# --- memory: in a worker process, so that the timing process's kept heap does not hide the step's growth ---

def _status_kib(field: str) -> int:
    return int(re.search(rf"^{field}:\s+(\d+) kB", Path("/proc/self/status").read_text(), re.MULTILINE).group(1))


def _init_worker(threads: int) -> None:
    torch.set_num_threads(threads)
    keep_freed_memory()  # the allocator of a training process (and of the timings)


def step_growth(step, device: torch.device) -> int:
    """Bytes by which one call of ``step`` raises memory at its peak above the memory held before it."""
    gc.collect()
    sync(device)
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        return torch.cuda.max_memory_allocated(device) - base
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc_trim(0)  # hand the kept free pages back: the step must fault in what it needs
    base = _status_kib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current resident size
    step()
    return (_status_kib("VmHWM") - base) * 1024


def probe_memory(cfg: Config, batches: tuple[int, int], repeats: int, device_name: str) -> dict[str, dict[int, int]]:
    """Per contender, the step's peak growth in bytes at each of two batch sizes (all steps warmed up first)."""
    device = torch.device(device_name)
    growth: dict[str, dict[int, int]] = {}
    for label in CONTENDERS:
        model = build(label, cfg).to(device).train()
        steps = {b: make_train_step(model, *random_batch(cfg, b, device), contextlib.nullcontext) for b in batches}
        for step in steps.values():  # AdamW state, the allocator's and oneDNN's first-call work: not per step
            step()
        # the lower of the repeats: a step that found the heap fragmented faults in pages it did not need
        growth[label] = {b: min(step_growth(step, device) for _ in range(repeats)) for b, step in steps.items()}
        del model, steps
    return growth


# --- the sweeps ---

@dataclasses.dataclass
class Result:
    cfg: Config
    batch: int
    ms: dict[str, float]  # ms per image, median over rounds
    mb: dict[str, float]  # MB per image: slope of the step's peak growth between two batch sizes
    mem_batch: int  # the larger of the two memory batches
    peak_mb: dict[str, float]  # the step's peak growth in MB at mem_batch, as measured

    @property
    def ratio(self) -> float:
        return self.ms["timm"] / self.ms["vit"]


def measure(cfg: Config, args, device: torch.device, pool) -> Result:
    batch = batch_for(cfg, args.target, device)
    est = batch * cfg.train_flops() / ASSUMED_FLOPS[device.type]
    costly = est > 1.0  # fewer rounds and warmup for the slowest configurations
    rounds = min(args.rounds, 3) if costly else args.rounds
    print(f"\n== {cfg.label}: {cfg.tokens} tokens, batch {batch} (a step estimated at {est:.2f} s), "
          f"{rounds} rounds", flush=True)
    models = {label: build(label, cfg).to(device).train() for label in CONTENDERS}
    counts = {label: count_params(m) for label, m in models.items()}
    if len(set(counts.values())) != 1:
        raise RuntimeError(f"the contenders differ in parameters at {cfg.label}: {counts}")
    images, labels = random_batch(cfg, batch, device)
    steps = {label: make_train_step(m, images, labels, contextlib.nullcontext) for label, m in models.items()}
    medians = run_mode(f"{cfg.tokens}t d{cfg.dim} L{cfg.depth}", steps, batch, rounds, 1, 1 if costly else 2, device)
    del models, steps, images, labels
    gc.collect()

    low, high = memory_batches(cfg, device, 64 if args.quick else 256)
    growth = pool.apply(probe_memory, (cfg, (low, high), 1 if costly else 2, device.type))
    mb = {k: (g[high] - g[low]) / (high - low) / 2**20 for k, g in growth.items()}
    fixed = {k: g[low] / 2**20 - mb[k] * low for k, g in growth.items()}
    result = Result(cfg, batch, {k: 1000 / v for k, v in medians.items()}, mb, high,
                    {k: g[high] / 2**20 for k, g in growth.items()})
    print(f"-> {cfg.tokens} tokens, {counts['vit']:,d} parameters: ms/image vit {result.ms['vit']:.2f} "
          f"timm {result.ms['timm']:.2f} (timm/vit {result.ratio:.2f}x); MB/image vit {mb['vit']:.2f} "
          f"timm {mb['timm']:.2f}; fixed MB vit {fixed['vit']:.0f} timm {fixed['timm']:.0f} "
          f"(step growth at batch {low}/{high}: " + ", ".join(
              f"{k} {g[low] / 2**20:.0f}/{g[high] / 2**20:.0f} MB" for k, g in growth.items()) + ")", flush=True)
    return result


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = statistics.fmean(lx), statistics.fmean(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)


def per_token_count(results: list[Result], label: str) -> tuple[list[int], list[float]]:
    """Distinct token counts and ms/image, the geometric mean over patch sizes that share a count."""
    by_tokens: dict[int, list[float]] = {}
    for r in results:
        by_tokens.setdefault(r.cfg.tokens, []).append(r.ms[label])
    tokens = sorted(by_tokens)
    return tokens, [statistics.geometric_mean(by_tokens[n]) for n in tokens]


def analyse_tokens(results: list[Result]) -> list[str]:
    """Exponent of time against tokens and where the quadratic term takes over, as printable lines."""
    import numpy as np

    dim, most = results[0].cfg.dim, max(r.cfg.tokens for r in results)
    lines = [f"By FLOPs, attention (4 N^2 d per block) overtakes the linear layers (24 N d^2) at N = 6d = "
             f"{6 * dim:,d} tokens (d = {dim}); at {most:,d} tokens it is {4 * (most + 1) / (24 * dim):.2f}x their "
             "FLOPs."]
    for label in CONTENDERS:
        tokens, ms = per_token_count(results, label)
        top = tokens[-3:]
        slope = loglog_slope(top, ms[-3:])
        local = [(math.sqrt(a * b), loglog_slope([a, b], [ta, tb]))
                 for a, b, ta, tb in zip(tokens, tokens[1:], ms, ms[1:])]
        where = next((i for i, (_, s) in enumerate(local) if s >= 1.5), None)
        if where is None:
            crossing = f"the local slope stays below 1.5 up to {tokens[-1]:,d} tokens"
        elif where == 0:
            crossing = f"the local slope is already {local[0][1]:.2f} at ~{local[0][0]:,.0f} tokens"
        else:
            (n0, s0), (n1, s1) = local[where - 1], local[where]
            n = math.exp(math.log(n0) + (1.5 - s0) / (s1 - s0) * (math.log(n1) - math.log(n0)))
            crossing = f"the local slope passes 1.5 at ~{n:,.0f} tokens"
        # ms/image = c + a N + b N^2 (N with the CLS token), least squares on relative error
        n_arr = np.array(tokens, dtype=float) + 1
        t_arr = np.array(ms)
        design = np.stack([np.ones_like(n_arr), n_arr, n_arr**2], axis=1) / t_arr[:, None]
        (c, a, b), *_ = np.linalg.lstsq(design, np.ones_like(t_arr), rcond=None)
        if len(tokens) < 4:
            fit = "too few token counts to fit c + aN + bN^2"
        elif a > 0 and b > 0:
            fit = f"fit c + aN + bN^2: N* = a/b = {a / b:,.0f} tokens"
        else:
            fit = "fit c + aN + bN^2: no crossover"
        lines.append(f"{label}: time per image ~ tokens^{slope:.2f} over {', '.join(f'{n:,d}' for n in top)} tokens; "
                     f"local slopes " + ", ".join(f"{s:.2f} (~{n:,.0f})" for n, s in local)
                     + f"; {crossing}; {fit}.")
    return lines


def markdown_table(results: list[Result]) -> list[str]:
    rows = ["| config | tokens | batch | vit ms/img | timm ms/img | timm/vit | vit MB/img | timm MB/img "
            "| step MB at batch (vit / timm) |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        c = r.cfg
        rows.append(f"| {c.image}px p{c.patch}, d{c.dim}, L{c.depth}, h{c.heads} | {c.tokens:,d} | {r.batch} "
                    f"| {r.ms['vit']:.2f} | {r.ms['timm']:.2f} | {r.ratio:.2f}x | {r.mb['vit']:.2f} "
                    f"| {r.mb['timm']:.2f} | {r.peak_mb['vit']:.0f} / {r.peak_mb['timm']:.0f} at {r.mem_batch} |")
    return rows


def plot(groups: dict[str, list[Result]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"vit": "tab:blue", "timm": "tab:orange"}
    markers = {4: "o", 8: "s", 16: "^"}
    written = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=120)
        plt.close(fig)
        written.append(out / name)

    tokens = groups["tokens"]
    for key, ylabel, name in (("ms", "training step, ms per image", "time_vs_tokens.png"),
                              ("mb", "step memory, MB per image", "memory_vs_tokens.png")):
        fig, ax = plt.subplots(figsize=(7, 5))
        for label in CONTENDERS:
            for patch in sorted({r.cfg.patch for r in tokens}):
                rs = [r for r in tokens if r.cfg.patch == patch]
                ax.plot([r.cfg.tokens for r in rs], [getattr(r, key)[label] for r in rs], marker=markers[patch],
                        color=colors[label], linestyle="-" if label == "vit" else "--", label=f"{label}, patch {patch}")
        xs = [r.cfg.tokens for r in tokens]
        y0 = min(getattr(r, key)["vit"] for r in tokens)
        lo, hi = min(xs), max(xs)
        for power, style in ((1, ":"), (2, "-.")):
            ax.plot([lo, hi], [y0, y0 * (hi / lo) ** power], color="grey", linestyle=style, linewidth=1,
                    label=f"~ tokens^{power}")
        if key == "ms" and 6 * tokens[0].cfg.dim <= 1.5 * hi:
            ax.axvline(6 * tokens[0].cfg.dim, color="grey", linewidth=1)
            ax.text(6 * tokens[0].cfg.dim, y0, " N = 6d", color="grey", va="bottom")
        ax.set(xscale="log", yscale="log", xlabel="tokens", ylabel=ylabel,
               title=f"{ylabel} (dim {tokens[0].cfg.dim}, depth {tokens[0].cfg.depth})")
        ax.legend(fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        save(fig, name)
    for group, attr, xlabel, log in (("depth", "depth", "depth (blocks)", False),
                                     ("width", "dim", "width (dim)", True)):
        fig, ax = plt.subplots(figsize=(6, 4.5))
        rs = sorted(groups[group], key=lambda r: getattr(r.cfg, attr))
        for label in CONTENDERS:
            ax.plot([getattr(r.cfg, attr) for r in rs], [r.ms[label] for r in rs], marker="o", color=colors[label],
                    label=label)
        ax.set(xlabel=xlabel, ylabel="training step, ms per image", title=f"time against {group}, 64 tokens")
        if log:
            ax.set(xscale="log", yscale="log")
            ax.set_xticks([getattr(r.cfg, attr) for r in rs], [str(getattr(r.cfg, attr)) for r in rs])
            ax.minorticks_off()
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        save(fig, f"time_vs_{group}.png")
    return written


def output_folder(args) -> Path:
    """``--out``, else benchmarks/scaling, or for a ``--quick`` smoke run a temporary folder."""
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "vit_scaling_quick" if args.quick
                                           else OUT_DIR)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_sweeps(args, device: torch.device, threads: int, header: list[str]) -> None:
    out = output_folder(args)
    groups = sweeps(args.quick)
    done: dict[Config, Result] = {}
    start = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(1, initializer=_init_worker, initargs=(threads,)) as pool:
        for group, configs in groups.items():
            for cfg in configs:
                if cfg not in done:
                    done[cfg] = measure(cfg, args, device, pool)
    results = {group: [done[c] for c in configs] for group, configs in groups.items()}
    analysis = analyse_tokens(results["tokens"])

    lines = header + [f"Sweeps took {time.perf_counter() - start:.0f} s. ms/img: median training step (forward, "
                      "backward, AdamW) per image; timm/vit > 1: vit faster; MB/img: the step's peak memory "
                      "growth per image (slope between two batch sizes b and 2b); step MB: the growth measured at 2b "
                      "(the log gives b's too, and the intercept).", ""]
    for group, rs in results.items():
        lines += [f"### {group}", ""] + markdown_table(rs) + [""]
    lines += ["### tokens: exponent and crossover", ""] + [f"- {line}" for line in analysis] + [""]
    print("\n" + "\n".join(lines))
    (out / "table.md").write_text("\n".join(lines))
    written = plot(results, out)
    print(f"wrote {out / 'table.md'} and " + ", ".join(p.name for p in written))


# --- latency ---

def run_latency(args, threads: int, header: list[str]) -> None:
    import numpy as np
    import onnxruntime as ort

    from vit.tools.common import load_model
    from vit.tools.export import export_onnx

    ckpt = Path(args.ckpt_path)
    if not ckpt.exists():
        sys.exit(f"error: no checkpoint at {ckpt}; pass --ckpt_path")
    model = load_model(ckpt).float()  # eval mode
    cfg = model.config
    print(f"{ckpt}: image {cfg.image_size}, patch {cfg.patch_size}, dim {cfg.dim}, depth {cfg.depth}, heads "
          f"{cfg.heads}, MLP ratio {cfg.mlp_ratio}, {count_params(model):,d} parameters")
    tmp = tempfile.TemporaryDirectory()
    onnx_path = Path(tmp.name) / "model.onnx"
    export_onnx(model, onnx_path)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
    compiled = torch.compile(model, dynamic=False)  # one static graph per batch size
    runs = args.runs or (10 if args.quick else 50)

    rows = {}
    for batch in (1, 64):
        g = torch.Generator().manual_seed(0)
        images = torch.randn(batch, model.in_channels, *model.image_size, generator=g)
        array = images.numpy()
        calls = {
            "eager": make_infer_step(model, images, contextlib.nullcontext),
            "compiled": make_infer_step(compiled, images, contextlib.nullcontext),
            "onnxruntime": lambda array=array: session.run(None, {"images": array}),
        }
        with torch.inference_mode():
            reference = model(images)
            started = time.perf_counter()
            got = compiled(images)
            print(f"batch {batch}: compile {time.perf_counter() - started:.1f} s; max |difference| from eager: "
                  f"compiled {(got - reference).abs().max().item():.1e}, onnxruntime "
                  f"{np.abs(session.run(None, {'images': array})[0] - reference.numpy()).max():.1e}", flush=True)
        for call in calls.values():  # warmup
            for _ in range(3):
                call()
        times: dict[str, list[float]] = {k: [] for k in calls}
        labels = list(calls)
        for r in range(runs):
            for label in labels[r % 3:] + labels[:r % 3]:
                started = time.perf_counter()
                calls[label]()
                times[label].append(time.perf_counter() - started)
        rows[batch] = {k: 1000 * statistics.median(v) for k, v in times.items()}
        print(f"batch {batch}: median ms per call over {runs} runs  "
              + "  ".join(f"{k} {v:.2f}" for k, v in rows[batch].items()), flush=True)
    tmp.cleanup()

    lines = header + [f"Inference latency of {ckpt} (dim {cfg.dim}, depth {cfg.depth}, {cfg.heads} heads, "
                      f"{count_params(model):,d} parameters), median of {runs} calls, interleaved:", "",
                      "| backend | batch 1, ms | batch 64, ms | batch 64, ms/image | speed-up over eager, batch 1 "
                      "| batch 64 |", "|---|---|---|---|---|---|"]
    for k in rows[1]:
        lines.append(f"| {k} | {rows[1][k]:.2f} | {rows[64][k]:.2f} | {rows[64][k] / 64:.3f} "
                     f"| {rows[1]['eager'] / rows[1][k]:.2f}x | {rows[64]['eager'] / rows[64][k]:.2f}x |")
    print("\n" + "\n".join(lines))
    out = output_folder(args)
    (out / "latency.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'latency.md'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer configurations, rounds and steps")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=None, help="timed rounds per configuration (default 7, quick "
                        "2; at most 3 for steps estimated over 1 s)")
    parser.add_argument("--target", type=float, default=None,
                        help="seconds a training step should take, to size batches (default 0.5, quick 0.1)")
    parser.add_argument("--out", help="folder for table.md and the plots, or latency.md (default "
                        "benchmarks/scaling; --quick: a temporary folder)")
    parser.add_argument("--latency", action="store_true", help="inference latency of a trained model instead")
    parser.add_argument("--ckpt_path", default=str(DEFAULT_CKPT), help="the model for --latency")
    parser.add_argument("--runs", type=int, default=None, help="--latency: calls per backend and batch (default 50)")
    args = parser.parse_args()
    args.rounds = args.rounds or (2 if args.quick else 7)
    args.target = args.target or (0.1 if args.quick else 0.5)
    if args.latency and args.device != "cpu":
        parser.error("--latency measures CPU latency (ONNX Runtime's CPU provider)")

    kept = keep_freed_memory()
    device = torch.device(args.device)
    threads = os.cpu_count() or 1
    torch.set_num_threads(threads)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    command = "python benchmarks/scaling.py" + "".join(" " + shlex.quote(a) for a in sys.argv[1:])
    header = [f"`{command}`, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {name}, "
              f"torch {torch.__version__}, {threads} threads, fp32, freed memory kept: {kept}", ""]
    print(header[0], flush=True)
    if args.latency:
        run_latency(args, threads, header)
    else:
        run_sweeps(args, device, threads, header)


if __name__ == "__main__":
    main()
