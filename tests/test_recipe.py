"""The small-data recipe options of ViTClassifier do what they say."""

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import vit
from conftest import SMOKE, data_args
from vit.augment import mix
from vit.cifar10 import normalize, read_cifar10
from vit.cli import main

TINY = dict(size="micro", dim=32, depth=2, heads=2)


def with_trainer(module, total_steps):
    module._trainer = SimpleNamespace(estimated_stepping_batches=total_steps)
    return module


def test_warmup_then_cosine_per_step_and_decay_only_on_weights():
    module = with_trainer(vit.ViTClassifier(**TINY, lr=1e-3, warmup_fraction=0.1, min_lr_ratio=0.01), 100)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    assert config["lr_scheduler"]["interval"] == "step"
    lrs = []
    for _ in range(100):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)  # linear warmup over 10 steps
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:]))  # then strictly decreasing
    assert lrs[-1] == pytest.approx(1e-5, rel=0.05)  # down to min_lr_ratio * lr
    decay, no_decay = optimizer.param_groups
    names = {id(p): n for n, p in module.model.named_parameters()}
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0
    assert {"cls_token", "pos_embed", "norm.weight", "head.bias"} <= {names[id(p)] for p in no_decay["params"]}
    assert all(p.ndim == 2 for p in decay["params"])


def test_patch_drop_stops_after_its_share_of_the_steps():
    module = with_trainer(vit.ViTClassifier(**TINY, patch_drop=0.75, patch_drop_until=0.5), 10)
    tokens = []
    module.model.blocks[0].register_forward_pre_hook(lambda _, args: tokens.append(args[0].shape[1]))
    module.log = module.log_dict = lambda *args, **kwargs: None  # logging needs a real Trainer
    images, labels = torch.randn(2, 3, 32, 32), torch.arange(2)
    for step in range(10):
        module._trainer.global_step = step  # what LightningModule.global_step reads
        module.training_step((images, labels), step)
    assert tokens == [1 + 16] * 5 + [1 + 64] * 5  # a quarter of the 64 patches, then all of them


def test_mixup_trains_on_soft_targets():
    module = vit.ViTClassifier(**TINY, mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1)
    images, labels = torch.randn(8, 3, 32, 32), torch.arange(8)
    torch.manual_seed(0)
    loss = module.training_step((images, labels), 0)
    torch.manual_seed(0)
    mixed, targets = mix(images, labels, 10, mixup_alpha=0.8, cutmix_alpha=1.0)
    torch.testing.assert_close(targets.sum(-1), torch.ones(8))
    expected = F.cross_entropy(module.model(mixed), targets, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)


def test_test_time_flip_averages_the_two_views():
    module = vit.ViTClassifier(**TINY, tta_flip=True).eval()
    images, labels = torch.randn(4, 3, 32, 32), torch.arange(4)
    seen = {}
    module.test_metrics.update = lambda logits, _: seen.setdefault("logits", logits)
    with torch.no_grad():
        module._evaluate((images, labels), "test")
        probs = (module.model(images).softmax(-1) + module.model(images.flip(-1)).softmax(-1)) / 2
    torch.testing.assert_close(seen["logits"].exp(), probs)


def test_ema_weights_differ_and_are_what_test_evaluates(fake_data, workdir):
    main(["fit", "--config", SMOKE, *data_args(fake_data), "--model.ema_decay", "0.9"])
    last = workdir / "runs" / "smoke" / "version_0" / "checkpoints" / "last.ckpt"
    raw, ema = vit.ViT.from_checkpoint(last).eval(), vit.ViT.from_checkpoint(last, weights="ema").eval()
    assert any(not torch.equal(a, b) for a, b in zip(raw.parameters(), ema.parameters()))

    images, labels = read_cifar10(fake_data, train=False, verify=False)
    with torch.no_grad():
        x = normalize(images)
        losses = {"model": F.cross_entropy(raw(x), labels).item(), "ema": F.cross_entropy(ema(x), labels).item()}
    for eval_ema, name in (("false", "model"), ("true", "ema")):
        tested = main(["test", "--ckpt_path", str(last), *data_args(fake_data), "--model.eval_ema", eval_ema])
        assert tested.trainer.callback_metrics["test/loss"].item() == pytest.approx(losses[name], rel=1e-5)
