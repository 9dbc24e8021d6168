"""Fine-tuning from pretrained weights: vit.weights.load_pretrained (every source, adapted to the new task) and the
optimizer's layer-wise learning-rate decay and frozen parameters (vit.train.optim.param_groups)."""

import math

import pytest
import torch
from safetensors.torch import save_file

import vit
from helpers import tiny_vit, write_training_checkpoint
from vit.nn.embed import resample_pos_embed
from vit.train.optim import layer_id, make_optimizer, param_groups
from vit.weights import load_pretrained, save_safetensors
from vit.weights.pretrained import resample_patch_kernels


def trained_tiny_vit(**overrides) -> vit.ViT:
    """``tiny_vit`` with every tensor moved off its init, so that a weight that is not carried over shows."""
    model = tiny_vit(**overrides)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def timm_vit(**kwargs):
    timm_vt = pytest.importorskip("timm.models.vision_transformer")
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    model = timm_vt.VisionTransformer(**{**args, **kwargs}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def assert_same_except(model: vit.ViT, reference: vit.ViT, changed: set[str]) -> None:
    ours, theirs = model.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    for name in ours:
        if name not in changed:
            torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=0, msg=name)


# ---- sources --------------------------------------------------------------------------------------------------


def test_a_training_checkpoint_keeps_its_weights_and_takes_the_new_regularisation(tmp_path):
    source = trained_tiny_vit(dropout=0.2, patch_drop=0.5)
    path = write_training_checkpoint(tmp_path / "pre.ckpt", source)
    model = load_pretrained(path, num_classes=5, drop_path=0.1, size="base", pool="mean", norm_eps=1e-3)
    assert not model.training
    assert_same_except(model, source, set())
    config = model.config
    assert (config.dropout, config.patch_drop, config.drop_path) == (0.0, 0.0, 0.1)  # the new run's, not the old
    assert (config.dim, config.depth, config.heads, config.pool, config.norm_eps) == (32, 2, 2, "cls", 1e-5)
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(model(images), source(images))


def test_the_head_is_replaced_only_when_the_class_count_differs(tmp_path):
    source = trained_tiny_vit()
    path = write_training_checkpoint(tmp_path / "pre.ckpt", source)
    kept = load_pretrained(path)
    assert kept.num_classes == 5
    assert_same_except(kept, source, set())
    assert_same_except(load_pretrained(path, num_classes=5), source, set())

    new = load_pretrained(path, num_classes=3)
    assert new.num_classes == 3 and new.head.weight.shape == (3, 32) and new.head.bias.shape == (3,)
    assert_same_except(new, source, {"head.weight", "head.bias"})
    assert torch.all(new.head.bias == 0)
    backbone = load_pretrained(path, num_classes=0)
    assert isinstance(backbone.head, torch.nn.Identity) and backbone(torch.randn(1, 3, 16, 16)).shape == (1, 32)


def test_the_weight_average_of_a_checkpoint(tmp_path):
    source, average = trained_tiny_vit(), trained_tiny_vit()
    state = {f"model.{k}": v for k, v in source.state_dict().items()}
    state.update({f"ema_model.{k}": v for k, v in average.state_dict().items()})
    path = write_training_checkpoint(tmp_path / "pre.ckpt", source, state_dict=state)
    assert_same_except(load_pretrained(path, weights="ema"), average, set())
    save_safetensors(source, tmp_path / "export.safetensors")
    with pytest.raises(ValueError, match="weights='ema' needs a training checkpoint"):
        load_pretrained(tmp_path / "export.safetensors", weights="ema")


def test_another_image_size_resamples_the_position_embeddings(tmp_path):
    source = trained_tiny_vit()
    path = write_training_checkpoint(tmp_path / "pre.ckpt", source)
    model = load_pretrained(path, image_size=24)
    assert model.image_size == (24, 24) and model.pos_embed.shape == (1, 1 + 6 * 6, 32)
    torch.testing.assert_close(model.pos_embed, resample_pos_embed(source.pos_embed, (4, 4), (6, 6)))
    assert_same_except(model, source, {"pos_embed"})
    assert model(torch.randn(1, 3, 24, 24)).shape == (1, 5)
    wide = load_pretrained(path, image_size=(16, 32), dynamic_img_size=True)
    assert wide.grid_size == (4, 8) and wide.config.dynamic_img_size


def test_our_safetensors_export(tmp_path):
    source = trained_tiny_vit()
    source.data_info = {"classes": list("abcde"), "mean": [0.5] * 3, "std": [0.25] * 3}
    save_safetensors(source, tmp_path / "export.safetensors")
    model = load_pretrained(tmp_path / "export.safetensors", num_classes=2, dropout=0.1)
    assert model.config.dropout == 0.1 and model.head.weight.shape == (2, 32)
    assert_same_except(model, source, {"head.weight", "head.bias"})
    assert model.data_info == {"classes": None, "mean": [0.5] * 3, "std": [0.25] * 3}  # names left with the head

    save_safetensors(source.to(torch.bfloat16), tmp_path / "bf16.safetensors")
    assert load_pretrained(tmp_path / "bf16.safetensors").pos_embed.dtype == torch.float32  # trains in fp32


@pytest.mark.parametrize("suffix", [".pth", ".bin", ".safetensors", "wrapped.pth"])
def test_a_timm_state_dict(tmp_path, suffix):
    reference = timm_vit()
    state = reference.state_dict()
    path = tmp_path / f"timm{suffix}"
    if suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
        torch.save({"model": state, "epoch": 300} if suffix.startswith("wrapped") else state, path)
    images = torch.randn(2, 3, 16, 16)
    model = load_pretrained(path, heads=2)
    assert model.config.norm_eps == 1e-6 and model.num_classes == 3
    torch.testing.assert_close(model(images), reference(images), rtol=0, atol=1e-5)

    new = load_pretrained(path, heads=2, num_classes=7, image_size=32)
    assert new.head.weight.shape == (7, 32) and new.pos_embed.shape == (1, 1 + 8 * 8, 32)
    torch.testing.assert_close(new.blocks[1].mlp.fc2.weight, reference.blocks[1].mlp.fc2.weight)


def test_a_timm_state_dict_needs_heads(tmp_path):
    path = tmp_path / "timm.pth"
    torch.save(timm_vit(embed_dim=192, num_heads=3, depth=1).state_dict(), path)
    with pytest.raises(ValueError, match=r"'.*timm.pth' is a timm state dict.*pass --model.heads \(timm's ViTs of "
                                         r"width 192 use 3\)"):
        load_pretrained(path)
    with pytest.raises(ValueError, match="dim 192 is not divisible by heads 5"):
        load_pretrained(path, heads=5)


def test_timm_names_load_through_timm(monkeypatch):
    timm = pytest.importorskip("timm")
    reference = timm_vit()
    calls = []

    def create_model(name, pretrained=False, **kwargs):
        calls.append((name, pretrained))
        return reference

    monkeypatch.setattr(timm, "create_model", create_model)
    model = load_pretrained("timm:vit_tiny_patch16_224", num_classes=4, heads=2)
    assert calls == [("vit_tiny_patch16_224", True)] and model.head.weight.shape == (4, 32)
    torch.testing.assert_close(model.blocks[0].attn.qkv.weight, reference.blocks[0].attn.qkv.weight)
    with pytest.raises(ValueError, match="heads is 4 but the pretrained weights in 'timm:vit_tiny_patch16_224' have "
                                         "heads 2"):
        load_pretrained("timm:vit_tiny_patch16_224", heads=4)


@pytest.mark.parametrize("error", [OSError("We couldn't connect to 'https://huggingface.co'"),
                                   RuntimeError("Unknown model (vit_nonexistent)")])
def test_timm_names_offline_give_one_clear_error(monkeypatch, error):
    timm = pytest.importorskip("timm")

    def create_model(name, pretrained=False, **kwargs):
        raise error

    monkeypatch.setattr(timm, "create_model", create_model)
    with pytest.raises(ValueError, match=r"could not create timm model 'vit_small_patch16_224' .*download the "
                                         r"weights file .* pass its path instead of timm:vit_small_patch16_224"):
        load_pretrained("timm:vit_small_patch16_224", num_classes=5)


# ---- what is refused -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, stored", [("dim", 64, 32), ("depth", 3, 2), ("heads", 4, 2),
                                                  ("mlp_ratio", 2.0, 4.0)])
def test_an_explicit_architecture_that_differs_is_refused(tmp_path, field, value, stored):
    path = write_training_checkpoint(tmp_path / "pre.ckpt", trained_tiny_vit())
    with pytest.raises(ValueError, match=rf"{field} is {value} but the pretrained weights in '.*pre.ckpt' have "
                                         rf"{field} {stored}: drop --model.{field} .* or set it to {stored}"):
        load_pretrained(path, **{field: value})
    load_pretrained(path, **{field: stored})  # the same value, or None (not given), is fine
    load_pretrained(path, **{field: None})


def test_bad_sources_and_fields_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="'.*missing.ckpt' do not exist"):
        load_pretrained(tmp_path / "missing.ckpt")
    with pytest.raises(IsADirectoryError, match="is a folder"):
        load_pretrained(tmp_path)
    path = write_training_checkpoint(tmp_path / "pre.ckpt")
    with pytest.raises(ValueError, match=r"unknown ViT config fields \['lr'\]"):
        load_pretrained(path, lr=0.1)
    with pytest.raises(ValueError, match="image_size 18 is not divisible by patch_size 4"):
        load_pretrained(path, image_size=18)

    torch.save({"optimizer": {"lr": torch.tensor(1.0)}}, tmp_path / "other.pth")
    with pytest.raises(ValueError, match=r"'.*other.pth' is neither .* nor a state dict: .*\(its keys: optimizer\)"):
        load_pretrained(tmp_path / "other.pth", heads=2)
    torch.save({"encoder.weight": torch.zeros(2)}, tmp_path / "other.bin")
    with pytest.raises(ValueError, match=r"'.*other.bin' is neither .* nor a timm ViT state dict .*encoder.weight"):
        load_pretrained(tmp_path / "other.bin", heads=2)
    torch.save({"model": torch.nn.Linear(2, 2)}, tmp_path / "evil.pth")  # a module: code, not plain data
    with pytest.raises(ValueError, match="refused to load '.*evil.pth'"):
        load_pretrained(tmp_path / "evil.pth", heads=2)
    (tmp_path / "junk.safetensors").write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="'.*junk.safetensors' is not a readable safetensors file"):
        load_pretrained(tmp_path / "junk.safetensors")
    pytest.importorskip("timm")
    torch.save(timm_vit(qk_norm=True).state_dict(), tmp_path / "variant.pth")
    with pytest.raises(ValueError, match="'.*variant.pth': unsupported timm ViT feature: qk-norm"):
        load_pretrained(tmp_path / "variant.pth", heads=2)


# ---- another patch size: FlexiViT's resampling ----------------------------------------------------------------


def test_resampled_kernels_see_upsampled_patches_as_the_old_ones_saw_the_patches():
    kernels = torch.randn(8, 3, 4, 4, dtype=torch.float64)
    new = resample_patch_kernels(kernels, 6)
    assert new.shape == (8, 3, 6, 6)
    patches = torch.randn(5, 3, 4, 4, dtype=torch.float64)
    upsampled = torch.nn.functional.interpolate(patches, size=(6, 6), mode="bicubic", antialias=True)
    torch.testing.assert_close(torch.einsum("bchw,dchw->bd", upsampled, new),
                               torch.einsum("bchw,dchw->bd", patches, kernels))
    assert resample_patch_kernels(kernels, 4) is kernels


def test_resampled_kernels_match_timm():
    layers = pytest.importorskip("timm.layers")
    kernels = torch.randn(8, 3, 16, 16)
    for size in (4, 8, 24):
        torch.testing.assert_close(resample_patch_kernels(kernels, size),
                                   layers.resample_patch_embed(kernels, [size, size]), rtol=1e-4, atol=1e-4)


def test_another_patch_size_resamples_the_patch_embedding(tmp_path):
    source = trained_tiny_vit()  # 16x16 images in 4x4 patches
    path = write_training_checkpoint(tmp_path / "pre.ckpt", source)
    model = load_pretrained(path, patch_size=2)
    assert model.patch_size == 2 and model.grid_size == (8, 8) and model.pos_embed.shape == (1, 65, 32)
    assert model.patch_embed.proj.weight.shape == (32, 2 * 2 * 3)
    assert_same_except(model, source, {"patch_embed.proj.weight", "pos_embed"})
    assert model(torch.randn(1, 3, 16, 16)).shape == (1, 5)

    # 8x8 patches of a 2x upsampled image: each patch's token is the old one of the same patch at 4x4
    big = load_pretrained(path, patch_size=8, image_size=32)
    patches = torch.randn(3, 3, 4, 4)
    upsampled = torch.nn.functional.interpolate(patches, size=(8, 8), mode="bicubic", antialias=True)
    flat = lambda x: x.permute(0, 2, 3, 1).flatten(1)  # noqa: E731 - (p1 p2 c), as patchify
    torch.testing.assert_close(big.patch_embed.proj(flat(upsampled)), source.patch_embed.proj(flat(patches)),
                               rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="image_size 16 is not divisible by patch_size 5"):
        load_pretrained(path, patch_size=5)


# ---- the optimizer: layer-wise learning-rate decay, frozen parameters ------------------------------------------


def groups_before_layer_decay(model, *, weight_decay, lr, muon_lr=None):
    """param_groups as it was before layer decay (a copy of the old code), to compare against."""
    exempt = model.no_weight_decay()
    params = dict(model.named_parameters())
    matrices = {n for n, p in params.items() if muon_lr is not None and n.startswith("blocks.") and p.ndim == 2}
    groups = [
        {"params": [p for n, p in params.items() if n not in exempt | matrices], "weight_decay": weight_decay,
         "name": "decay"},
        {"params": [p for n, p in params.items() if n in exempt], "weight_decay": 0.0, "name": "no_decay"},
    ]
    if matrices:
        groups.append({"params": [params[n] for n in sorted(matrices)], "lr": muon_lr, "muon": True,
                       "weight_decay": weight_decay * lr / muon_lr, "name": "muon"})
    return groups


def same_groups(a, b):
    assert [{k: v for k, v in g.items() if k != "params"} for g in a] == \
        [{k: v for k, v in g.items() if k != "params"} for g in b]
    assert [[id(p) for p in g["params"]] for g in a] == [[id(p) for p in g["params"]] for g in b]


@pytest.mark.parametrize("muon_lr", [None, 0.02])
def test_without_layer_decay_the_groups_are_as_before(muon_lr):
    model = tiny_vit()
    same_groups(param_groups(model, weight_decay=0.05, lr=1e-3, muon_lr=muon_lr),
                groups_before_layer_decay(model, weight_decay=0.05, lr=1e-3, muon_lr=muon_lr))


@pytest.mark.parametrize("muon_lr", [None, 0.02])
def test_layer_decay_scales_each_layer(muon_lr):
    model = tiny_vit(depth=3)
    names = {id(p): n for n, p in model.named_parameters()}
    groups = param_groups(model, weight_decay=0.05, lr=1e-3, muon_lr=muon_lr, layer_decay=0.5)
    seen = [names[id(p)] for g in groups for p in g["params"]]
    assert sorted(seen) == sorted(names.values())  # every parameter in exactly one group

    expected_layers = {"patch_embed.proj.weight": 0, "cls_token": 0, "pos_embed": 0, "blocks.0.norm1.weight": 1,
                       "blocks.2.mlp.fc2.weight": 3, "norm.weight": 4, "head.bias": 4}
    assert {n: layer_id(n, 3) for n in expected_layers} == expected_layers
    for group in groups:
        kind, layer = group["name"].rsplit("_layer", 1)
        scale = 0.5 ** (3 + 1 - int(layer))
        assert group["lr_scale"] == pytest.approx(scale)
        base = muon_lr if kind == "muon" else 1e-3
        assert group["lr"] == pytest.approx(base * scale)
        assert group["weight_decay"] == {"decay": 0.05, "no_decay": 0.0, "muon": 0.05 * 1e-3 / (muon_lr or 1)}[kind]
        assert all(layer_id(names[id(p)], 3) == int(layer) for p in group["params"])
        exempt = model.no_weight_decay()
        assert all((names[id(p)] in exempt) == (kind == "no_decay") for p in group["params"])
    by_name = {g["name"]: g for g in groups}
    assert by_name["decay_layer4"]["lr"] == 1e-3 and by_name["decay_layer0"]["lr"] == pytest.approx(1e-3 / 16)
    assert ("muon_layer1" in by_name) == (muon_lr is not None)

    # the schedule multiplies each group's scaled rate
    scaled = [g["lr"] for g in groups]
    optimizer = make_optimizer(groups, lr=1e-3, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.1)
    assert [g["lr"] for g in optimizer.param_groups] == pytest.approx([0.1 * lr for lr in scaled])
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    optimizer.step()
    scheduler.step()


def test_layer_decay_must_be_a_share():
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="layer_decay must be in"):
            param_groups(tiny_vit(), weight_decay=0.05, lr=1e-3, layer_decay=bad)
    ones = param_groups(tiny_vit(), weight_decay=0.05, lr=1e-3, layer_decay=1.0)
    assert all(g["lr"] == 1e-3 and g["lr_scale"] == 1.0 for g in ones)


@pytest.mark.parametrize("layer_decay", [None, 0.7])
def test_frozen_parameters_are_left_out(layer_decay):
    model = tiny_vit()
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith("head."))
    groups = param_groups(model, weight_decay=0.05, lr=1e-3, muon_lr=0.02, layer_decay=layer_decay)
    assert sorted(g["name"] for g in groups) == (["decay", "no_decay"] if layer_decay is None else
                                                 ["decay_layer3", "no_decay_layer3"])
    assert {id(p) for g in groups for p in g["params"]} == {id(model.head.weight), id(model.head.bias)}
    assert all(g["lr"] == 1e-3 for g in groups if layer_decay)

    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    optimizer = make_optimizer(groups, lr=1e-3, betas=(0.9, 0.999))
    torch.nn.functional.cross_entropy(model(torch.randn(4, 3, 16, 16)), torch.arange(4)).backward()
    optimizer.step()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert changed == {"head.weight", "head.bias"}

    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trainable parameters"):
        param_groups(model, weight_decay=0.05, lr=1e-3)


def test_layer_decay_scale_formula_is_beit_s():
    model = tiny_vit(depth=4)
    groups = param_groups(model, weight_decay=0.0, lr=1.0, layer_decay=0.75)
    scales = {int(g["name"].rsplit("_layer", 1)[1]): g["lr"] for g in groups}
    assert scales == {i: pytest.approx(0.75 ** (5 - i)) for i in range(6)}
    assert math.isclose(scales[5], 1.0)


def test_classifier_starts_from_pretrained_weights_and_records_the_architecture(tmp_path):
    source = tiny_vit(num_classes=5)
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", source)
    module = vit.ViTClassifier(pretrained=str(ckpt), num_classes=3, image_size=16, freeze_backbone=True)
    model = module.model
    assert model.training and model.head.out_features == 3 and model.config.dim == 32
    torch.testing.assert_close(model.blocks[1].mlp.fc1.weight, source.blocks[1].mlp.fc1.weight)
    assert [n for n, p in model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    # a checkpoint of this run rebuilds the same network without the file it started from
    assert module.hparams.pretrained is None and module.hparams.dim == 32 and module.hparams.depth == 2
    assert vit.ViTClassifier(**{k: v for k, v in module.hparams.items()}).model.config.depth == 2
