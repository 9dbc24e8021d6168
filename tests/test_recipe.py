"""The small-data recipe options of ViTClassifier do what they say."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import vit
from helpers import SMOKE, data_args
from vit.data.augment import mix
from vit.data.cifar10 import normalize, read_cifar10
from vit.train.cli import main
from vit.train.optim import MuonAdamW, orthogonalize

TINY = dict(size="micro", dim=32, depth=2, heads=2)


def with_trainer(module, total_steps):
    """``module`` attached to a stand-in Trainer that knows the run's length and the step it is at."""
    module.trainer = SimpleNamespace(estimated_stepping_batches=total_steps, global_step=0)
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
        module.trainer.global_step = step  # what LightningModule.global_step reads
        module.training_step((images, labels), step)
    assert tokens == [1 + 16] * 5 + [1 + 64] * 5  # a quarter of the 64 patches, then all of them


def test_low_res_phase_trains_on_downsampled_whole_images_then_full_size_with_patch_drop():
    module = with_trainer(vit.ViTClassifier(**TINY, patch_drop=0.75, low_res_size=16, low_res_until=0.4), 10)
    seen = []
    module.model.register_forward_pre_hook(lambda _, args: seen.append(tuple(args[0].shape[-2:])))
    tokens = []
    module.model.blocks[0].register_forward_pre_hook(lambda _, args: tokens.append(args[0].shape[1]))
    module.log = module.log_dict = lambda *args, **kwargs: None  # logging needs a real Trainer
    images, labels = torch.full((2, 3, 32, 32), 0.5), torch.arange(2)
    for step in range(10):
        module.trainer.global_step = step  # what LightningModule.global_step reads
        module.training_step((images, labels), step)
    assert seen == [(16, 16)] * 4 + [(32, 32)] * 6
    assert tokens == [1 + 16] * 4 + [1 + 16] * 6  # every patch of the small image, then a quarter of the large
    module.eval()
    assert module(torch.randn(2, 3, 32, 32)).shape == (2, 10)  # evaluation at full size
    with pytest.raises(ValueError, match="low_res_size 30 must be smaller than image_size 32 and divisible"):
        vit.ViTClassifier(**TINY, low_res_size=30)


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
        module.test_step((images, labels), 0)
        probs = (module.model(images).softmax(-1) + module.model(images.flip(-1)).softmax(-1)) / 2
    torch.testing.assert_close(seen["logits"].exp(), probs)


def test_shifted_views_are_the_image_moved_one_pixel_each_way_and_their_mirrors():
    images = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8)
    out = vit.nn.views(images, flip=True, shift=1).unflatten(0, (6, 2))
    torch.testing.assert_close(out[0], images)
    torch.testing.assert_close(out[1][..., 1:, 1:], images[..., :-1, :-1])  # moved down-right
    torch.testing.assert_close(out[2][..., :-1, :-1], images[..., 1:, 1:])  # moved up-left
    torch.testing.assert_close(out[3:], out[:3].flip(-1))
    with pytest.raises(ValueError, match="shift must be in"):
        vit.nn.views(images, shift=8)


def test_test_time_shift_averages_six_views_in_one_batch():
    module = vit.ViTClassifier(**TINY, tta_flip=True, tta_shift=1).eval()
    images, labels = torch.randn(4, 3, 32, 32), torch.arange(4)
    seen = {}
    module.test_metrics.update = lambda logits, _: seen.setdefault("logits", logits)
    with torch.no_grad():
        module.test_step((images, labels), 0)
        probs = torch.stack([module.model(v).softmax(-1) for v in vit.nn.views(images, True, 1).split(4)]).mean(0)
    torch.testing.assert_close(seen["logits"].exp(), probs)
    with pytest.raises(ValueError, match="tta_shift must be >= 0"):
        vit.ViTClassifier(**TINY, tta_shift=-1)


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


@pytest.mark.parametrize("shape", [(96, 32), (32, 96), (48, 48)])
def test_orthogonalize_pushes_every_singular_value_towards_one(shape):
    torch.manual_seed(0)
    update = torch.randn(*shape) @ torch.diag(torch.logspace(-1, 0, shape[1]))  # badly conditioned
    singular_values = torch.linalg.svdvals(orthogonalize(update))
    assert singular_values.min() > 0.5 and singular_values.max() < 1.3
    stacked = orthogonalize(torch.stack([update, 2 * update.flip(0)]))  # a stack: each matrix on its own
    torch.testing.assert_close(stacked, torch.stack([orthogonalize(update), orthogonalize(update.flip(0))]))


def test_muon_takes_the_block_matrices_and_trains():
    module = with_trainer(vit.ViTClassifier(**TINY, optimizer="muon", muon_lr=0.02, lr=1e-3), 100)
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    names = {id(p): n for n, p in module.model.named_parameters()}
    muon = next(g for g in optimizer.param_groups if g["muon"])
    assert {names[id(p)] for p in muon["params"]} == {
        n for n, p in module.model.named_parameters() if n.startswith("blocks.") and p.ndim == 2
    }
    assert muon["initial_lr"] == 0.02 and muon["weight_decay"] * 0.02 == pytest.approx(0.05 * 1e-3)
    images, labels = torch.randn(16, 3, 32, 32), torch.arange(16) % 10
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(module.model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_muon_groups_without_muon_are_exactly_adamw_and_tall_matrices_match_wide_ones():
    torch.manual_seed(0)
    weights = [torch.randn(4, 8), torch.randn(8, 4), torch.randn(8), torch.randn(3, 5)]
    ours = [torch.nn.Parameter(w.clone()) for w in weights]
    theirs = [torch.nn.Parameter(w.clone()) for w in weights[2:]]
    muon = MuonAdamW([{"params": ours[:2], "muon": True, "weight_decay": 0.0}, {"params": ours[2:]}],
                     lr=1e-2, weight_decay=0.1)
    adamw = torch.optim.AdamW(theirs, lr=1e-2, weight_decay=0.1)
    for seed in range(5):
        grads = [torch.randn_like(w, generator=torch.Generator().manual_seed(seed + i)) for i, w in enumerate(weights)]
        grads[1] = grads[0].mT  # the tall matrix sees the transpose of the wide one's gradient
        for p, g in zip(ours + theirs, grads + grads[2:]):
            p.grad = g.clone()
        muon.step()
        adamw.step()
    for x, y in zip(ours[2:], theirs):
        torch.testing.assert_close(x, y)
    # the tall matrix moves by the wide one's steps, transposed and scaled by sqrt(rows / cols) = sqrt(2)
    moved_wide, moved_tall = ours[0] - weights[0], ours[1] - weights[1]
    assert moved_wide.abs().min() > 0
    torch.testing.assert_close(moved_tall, 2**0.5 * moved_wide.mT)


def test_muon_state_round_trips_through_a_state_dict():
    torch.manual_seed(0)
    weights = [torch.randn(8, 4), torch.randn(4)]
    copies = [w.clone() for w in weights]

    def optimizer_for(params):
        params = [torch.nn.Parameter(p) for p in params]
        return params, MuonAdamW([{"params": params[:1], "muon": True}, {"params": params[1:]}], weight_decay=0.1)

    def step(params, optimizer, seed):
        torch.manual_seed(seed)
        optimizer.zero_grad()
        sum((p * torch.randn_like(p)).sum() for p in params).backward()
        optimizer.step()

    a, opt_a = optimizer_for(weights)
    for seed in range(3):
        step(a, opt_a, seed)
    b, opt_b = optimizer_for([p.detach().clone() for p in a])
    opt_b.load_state_dict(copy.deepcopy(opt_a.state_dict()))  # as if from a file: no shared tensors
    step(a, opt_a, 3)
    step(b, opt_b, 3)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert not torch.equal(a[0], copies[0])


def test_muon_refuses_what_is_not_a_matrix():
    with pytest.raises(ValueError, match="2-D weight matrices only"):
        MuonAdamW([{"params": [torch.nn.Parameter(torch.zeros(3))], "muon": True}])
