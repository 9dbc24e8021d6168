"""The backbone in other people's code: timm weights, other image sizes, intermediate features."""

import copy
import subprocess
import sys

import pytest
import torch

import vit
from helpers import tiny_vit, write_training_checkpoint


def timm_vit(**kwargs):
    timm_vt = pytest.importorskip("timm.models.vision_transformer")
    args = dict(img_size=16, patch_size=4, embed_dim=32, depth=2, num_heads=2, num_classes=3)
    args.update(kwargs)
    model = timm_vt.VisionTransformer(**args).eval()
    with torch.no_grad():  # move norms and biases off their init so that every tensor matters
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


# ---- timm ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(img_size=32, patch_size=4, embed_dim=48, depth=2, num_heads=3, num_classes=10),
        dict(img_size=(16, 24), patch_size=8, embed_dim=32, depth=3, num_heads=4, num_classes=0, qkv_bias=False,
             mlp_ratio=2.5),
        dict(in_chans=1, depth=1, num_classes=7, global_pool="avg", fc_norm=False),
    ],
)
def test_from_timm_gives_the_same_logits(kwargs):
    reference = timm_vit(**kwargs)
    height, width = reference.patch_embed.img_size
    images = torch.randn(2, reference.patch_embed.proj.in_channels, height, width)
    expected = reference(images)
    model = vit.ViT.from_timm(reference).eval()
    torch.testing.assert_close(model(images), expected, rtol=0, atol=1e-5)

    pool = "mean" if kwargs.get("global_pool") == "avg" else None
    state = reference.state_dict()
    heads = reference.blocks[0].attn.num_heads
    from_state = vit.ViT.from_timm(state, heads=heads, image_size=(height, width), pool=pool)
    torch.testing.assert_close(from_state.eval()(images), expected, rtol=0, atol=1e-5)
    assert from_state.config == model.config


def test_from_timm_state_dict_infers_square_size_and_needs_heads():
    reference = timm_vit(img_size=24)
    model = vit.ViT.from_timm(reference.state_dict(), heads=2)
    assert model.image_size == (24, 24) and model.config.norm_eps == 1e-6
    with pytest.raises(ValueError, match="heads is required"):
        vit.ViT.from_timm(reference.state_dict())
    with pytest.raises(ValueError, match="heads are read from the timm model"):
        vit.ViT.from_timm(reference, heads=2)


@pytest.mark.parametrize(
    "kwargs, feature",
    [
        (dict(reg_tokens=2), "register tokens"),
        (dict(class_token=False, global_pool="avg"), "fc_norm"),
        (dict(global_pool="avg"), "fc_norm"),
        (dict(fc_norm=True), "fc_norm"),
        (dict(init_values=1e-5), "LayerScale"),
        (dict(qk_norm=True), "qk-norm"),
        (dict(pre_norm=True), "pre_norm"),
        (dict(global_pool="map"), "attention pooling"),
        (dict(final_norm=False), "no final norm"),
        (dict(no_embed_class=True), "no_embed_class"),
        (dict(dynamic_img_size=True), "dynamic image size"),
        (dict(act_layer="gelu_tanh"), "only exact GELU"),
        (dict(norm_layer="rmsnorm"), "RmsNorm"),
        (dict(global_pool="max", fc_norm=False), "global_pool='max'"),
    ],
)
def test_from_timm_refuses_other_architectures(kwargs, feature):
    with pytest.raises(ValueError, match=feature):
        vit.ViT.from_timm(timm_vit(**kwargs))


@pytest.mark.slow
def test_import_vit_does_not_import_timm():
    """Neither `import vit` nor the network's modules load timm, onnx or Lightning: those sit above the network."""
    for module in ("vit", "vit.nn.vit"):
        code = (f"import sys, {module}; heavy = [m for m in ('timm', 'onnx', 'lightning') if m in sys.modules]; "
                "assert not heavy, heavy")
        subprocess.run([sys.executable, "-c", code], check=True)


# ---- any image size -------------------------------------------------------------------------------------------


def test_resize_to_the_same_size_is_identity():
    model = tiny_vit().eval()
    images = torch.randn(2, 3, 16, 16)
    before, pos_embed = model(images), model.pos_embed.detach().clone()
    model.resize_pos_embed(16)
    assert torch.equal(model.pos_embed, pos_embed)
    assert torch.equal(model(images), before)


@pytest.mark.parametrize("size", [(64, 64), (48, 40)])
def test_resized_model_runs_at_other_sizes(size):
    model = tiny_vit(num_classes=5)
    cls_pos = model.pos_embed[:, 0].detach().clone()
    model.resize_pos_embed(size)
    grid = (size[0] // 4, size[1] // 4)
    assert model.image_size == size and model.grid_size == grid and model.config.image_size == size
    assert model.pos_embed.shape == (1, 1 + grid[0] * grid[1], 32)
    assert torch.equal(model.pos_embed[:, 0], cls_pos)
    logits = model(torch.randn(2, 3, *size))
    assert logits.shape == (2, 5) and torch.isfinite(logits).all()
    with pytest.raises(ValueError, match="not divisible by patch_size 4"):
        model.resize_pos_embed(30)


def test_dynamic_img_size_equals_a_resized_copy_and_trains_the_original_embeddings():
    model = tiny_vit(image_size=32, dynamic_img_size=True).eval()
    images = torch.randn(2, 3, 16, 24)
    resized = copy.deepcopy(model)
    resized.resize_pos_embed((16, 24))
    torch.testing.assert_close(model(images), resized(images))
    model(images).sum().backward()
    assert model.pos_embed.grad.abs().sum() > 0  # the resampling is differentiable
    with pytest.raises(ValueError, match="not divisible into 4x4 patches"):
        model(torch.randn(2, 3, 16, 18))
    with pytest.raises(ValueError, match="expected images of size 32x32, got 16x24"):
        tiny_vit(image_size=32).eval()(images)  # without the option the size stays checked


def test_resampling_keeps_a_constant_embedding_constant():
    model = tiny_vit()
    with torch.no_grad():
        model.pos_embed.fill_(0.5)
    model.resize_pos_embed((28, 8))  # upsampling one side, downsampling (antialiased) the other
    torch.testing.assert_close(model.pos_embed, torch.full_like(model.pos_embed, 0.5))


def test_state_dict_of_another_size_loads_resized():
    source = tiny_vit(image_size=16)
    target = tiny_vit(image_size=32)
    target.load_state_dict(source.state_dict())
    source.resize_pos_embed(32)
    torch.testing.assert_close(target.pos_embed, source.pos_embed)
    assert target.image_size == (32, 32)


def test_loaded_models_come_back_ready_to_predict(tmp_path):
    """A run's config keeps its training-only randomness (patch_drop here): loaders return eval mode, so two
    forwards of the same images agree, and agree with the trained model's own evaluation."""
    trained = tiny_vit(patch_drop=0.75, dropout=0.1).eval()
    path = tmp_path / "run.ckpt"
    write_training_checkpoint(path, trained)
    trained.save_safetensors(tmp_path / "vit.safetensors")
    images = torch.randn(4, 3, 16, 16)
    for model in (vit.ViT.from_checkpoint(path), vit.ViT.from_safetensors(tmp_path / "vit.safetensors")):
        assert not model.training
        torch.testing.assert_close(model(images), trained(images))


def test_state_dict_of_another_architecture_names_tensors_and_shapes():
    with pytest.raises(RuntimeError, match=r"size mismatch for blocks\.0\.attn\.qkv\.weight.*\[144, 48\]"):
        tiny_vit().load_state_dict(tiny_vit(dim=48).state_dict())


def test_from_checkpoint_at_another_image_size(tmp_path):
    trained = tiny_vit().eval()
    path = tmp_path / "run.ckpt"
    write_training_checkpoint(path, trained)
    model = vit.ViT.from_checkpoint(path, image_size=(24, 32)).eval()
    assert model.image_size == (24, 32) and model.config.image_size == (24, 32)
    assert torch.isfinite(model(torch.randn(1, 3, 24, 32))).all()
    images = torch.randn(1, 3, 16, 16)
    torch.testing.assert_close(vit.ViT.from_checkpoint(path)(images), trained(images))


# ---- intermediate features ------------------------------------------------------------------------------------


def test_forward_intermediates():
    model = tiny_vit(depth=3).eval()
    images = torch.randn(2, 3, 16, 16)
    last_two = model.forward_intermediates(images, layers=2)
    assert len(last_two) == 2 and all(t.shape == (2, 17, 32) for t in last_two)
    first, last = model.forward_intermediates(images, layers=[0, -1], norm=True)
    torch.testing.assert_close(last, model.forward_features(images))
    torch.testing.assert_close(first, model.norm(model.blocks[0](model.embed(images))))
    torch.testing.assert_close(last_two[1], model.forward_intermediates(images, layers=[2])[0])
    with pytest.raises(ValueError, match=r"block indices \[3\] out of range"):
        model.forward_intermediates(images, layers=[0, 3])
    with pytest.raises(ValueError, match="layers=4"):
        model.forward_intermediates(images, layers=4)
    with pytest.raises(ValueError, match="empty list"):
        model.forward_intermediates(images, layers=[])


def test_from_timm_keeps_the_dtype():
    source = timm_vit().double()
    model = vit.ViT.from_timm(source)
    images = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    assert model.pos_embed.dtype == torch.float64
    torch.testing.assert_close(model(images), source(images))


def test_a_file_that_is_no_checkpoint_is_not_called_unsafe(tmp_path):
    path = tmp_path / "notes.ckpt"
    path.write_text("notes")
    with pytest.raises(ValueError, match=r"not a readable PyTorch checkpoint \(neither a zip archive nor a pickle\)"):
        vit.ViT.from_checkpoint(path)
