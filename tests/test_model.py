import pytest
import torch

import vit
from helpers import tiny_vit


# ---- patchification ---------------------------------------------------------------------------------------


def coded_image(channels=3, height=8, width=12):
    """Pixel (c, r, col) holds the number 10000*c + 100*r + col, so every token can be checked by hand."""
    c = torch.arange(channels).view(-1, 1, 1)
    r = torch.arange(height).view(1, -1, 1)
    col = torch.arange(width).view(1, 1, -1)
    return (10000 * c + 100 * r + col).float().unsqueeze(0)


def test_patchify_hand_built_image():
    p = 4
    image = coded_image()  # 2 x 3 grid of patches
    tokens = vit.patchify(image, p)
    assert tokens.shape == (1, 6, p * p * 3)
    for index in range(6):
        gr, gc = divmod(index, 3)  # row-major over the patch grid
        expected = [
            10000 * c + 100 * (gr * p + i) + (gc * p + j) for i in range(p) for j in range(p) for c in range(3)
        ]  # each patch flattened as (p1 p2 c): channel fastest
        assert tokens[0, index].tolist() == expected


def test_unpatchify_inverts_patchify():
    images = torch.randn(2, 3, 8, 12)
    assert torch.equal(vit.unpatchify(vit.patchify(images, 4), 4, (8, 12)), images)
    patches = torch.randn(2, 6, 48)
    assert torch.equal(vit.patchify(vit.unpatchify(patches, 4, (8, 12)), 4), patches)


def test_patch_embedding_is_a_linear_layer_on_patches():
    model = tiny_vit()
    images = torch.randn(3, 3, 16, 16)
    proj = model.patch_embed.proj
    expected = vit.patchify(images, 4) @ proj.weight.T + proj.bias
    torch.testing.assert_close(model.patch_embed(images), expected)


# ---- the model --------------------------------------------------------------------------------------------


def test_api_shapes():
    model = vit.ViT(image_size=32, patch_size=4, num_classes=10, dim=192, depth=6, heads=3)
    images = torch.randn(2, 3, 32, 32)
    assert model(images).shape == (2, 10)
    assert model.forward_features(images).shape == (2, 65, 192)
    assert model.attention_maps(images).shape == (6, 2, 3, 65, 65)
    backbone = vit.ViT(image_size=32, patch_size=4, num_classes=0, dim=192, depth=6, heads=3)
    assert backbone(images).shape == (2, 192)
    tokens = backbone.forward_features(images)
    torch.testing.assert_close(backbone(images), tokens[:, 0])
    assert model.forward_head(tokens, pre_logits=True).shape == (2, 192)


def test_cls_only_shortcut_equals_the_full_forward():
    """forward() runs only the CLS query through the last block; that must not change the logits."""
    model = tiny_vit().eval()
    images = torch.randn(3, 3, 16, 16)
    mask = torch.rand(17, 17) > 0.3
    for m in (None, mask):
        full = model.forward_head(model.forward_features(images, mask=m))
        torch.testing.assert_close(model(images, mask=m), full, rtol=1e-5, atol=1e-6)


def test_block_forward_cls_equals_the_first_row_of_forward():
    block = tiny_vit().blocks[0].eval()
    x = torch.randn(2, 17, 32)
    for mask in (None, torch.rand(17, 17) > 0.3, torch.rand(17) > 0.3):
        torch.testing.assert_close(block.forward_cls(x, mask=mask), block(x, mask=mask)[:, :1], rtol=1e-5, atol=1e-6)


def test_patch_drop_keeps_cls_and_a_share_of_patches_in_training_only():
    model = tiny_vit(patch_drop=0.5)
    images = torch.randn(2, 3, 16, 16)
    tokens = model.embed(images)
    assert tokens.shape == (2, 1 + 8, 32)
    full = model.eval().embed(images)
    assert full.shape == (2, 17, 32)
    torch.testing.assert_close(tokens[:, 0], full[:, 0])  # CLS first, always kept
    for b in range(2):  # every kept token is one of the image's own tokens, with its position embedding
        assert all((full[b, 1:] - t).abs().amax(-1).min() < 1e-6 for t in tokens[b, 1:])
    model.train()(images).sum().backward()
    assert model.patch_embed.proj.weight.grad is not None


def test_rectangular_images_and_mean_pool():
    model = tiny_vit(image_size=(16, 24), pool="mean").eval()
    images = torch.randn(2, 3, 16, 24)
    tokens = model.forward_features(images)
    assert tokens.shape == (2, 1 + 4 * 6, 32)
    torch.testing.assert_close(model(images), model.head(tokens[:, 1:].mean(1)))


@pytest.mark.parametrize("init", ["trunc_normal", "mimetic"])
def test_every_parameter_gets_a_gradient(init):
    model = tiny_vit(drop_path=0.1, dropout=0.1, attn_dropout=0.1, init=init)
    loss = model(torch.randn(4, 3, 16, 16)).logsumexp(-1).mean()
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert torch.isfinite(p.grad).all(), name


def test_mimetic_init_products_and_local_attention_at_step_0():
    torch.manual_seed(0)
    model = vit.ViT(image_size=32, patch_size=4, dim=128, depth=2, heads=4, init="mimetic")
    attn, d = model.blocks[0].attn, 32
    w_q, w_k, w_v = attn.qkv.weight.split(128)
    qk = w_q[:d].T @ w_k[:d]  # head 0's W_q^T W_k, rank 32 of 0.7 Z + 0.7 I
    vo = attn.proj.weight @ w_v  # 0.4 Z - 0.4 I
    assert qk.diag().mean() > 0.2 and qk.diag().mean() > 4 * (qk - qk.diag().diag()).abs().mean()
    torch.testing.assert_close(vo.diag().mean(), torch.tensor(-0.4), atol=0.02, rtol=0)
    torch.testing.assert_close(vo - vo.diag().diag(), torch.zeros(128, 128), atol=0.2, rtol=0)
    # A blank image leaves only the position embeddings: a patch attends most to a patch near it (with the
    # default init, to one ~5.5 grid steps away on average).
    maps = model.eval().attention_maps(torch.zeros(1, 3, 32, 32))[0, 0]  # (heads, 65, 65), block 0
    top = maps[:, 1:, 1:].argmax(-1)  # (heads, 64): the patch each patch attends to most
    rows, cols = torch.arange(64) // 8, torch.arange(64) % 8
    distance = ((rows[top] - rows).abs() + (cols[top] - cols).abs()).float()
    assert distance.mean() < 1.5 and (distance <= 2).float().mean() > 0.9


def test_attention_maps_equal_fused_forward():
    """The weights come from the reference path; running the blocks with them gives the fused output."""
    model = tiny_vit().eval()
    images = torch.randn(2, 3, 16, 16)
    maps = model.attention_maps(images)
    torch.testing.assert_close(maps.sum(-1), torch.ones(2, 2, 2, 17))
    x = model.embed(images)
    for block, weights in zip(model.blocks, maps):
        attn, reference = block.attn(block.norm1(x), need_weights=True)
        torch.testing.assert_close(reference, weights)
        by_hand = x + attn
        by_hand = by_hand + block.mlp(block.norm2(by_hand))
        x = block(x)
        torch.testing.assert_close(x, by_hand, rtol=1e-5, atol=1e-5)


def test_no_weight_decay_names():
    model = tiny_vit()
    exempt = model.no_weight_decay()
    assert {"cls_token", "pos_embed", "blocks.0.norm1.weight", "blocks.0.attn.qkv.bias", "head.bias"} <= exempt
    assert "blocks.0.attn.qkv.weight" not in exempt and "head.weight" not in exempt
    decayed = {n for n, p in model.named_parameters()} - exempt
    assert all(model.get_parameter(n).ndim == 2 for n in decayed)


def test_named_sizes():
    model = vit.ViT(**vit.size_config("tiny"))
    assert len(model.blocks) == 9 and model.config.dim == 192
    with pytest.raises(ValueError, match="unknown size 'huge'"):
        vit.size_config("huge")


# ---- CLS-token attention flow -----------------------------------------------------------------------------


def test_cls_output_depends_on_every_patch():
    model = tiny_vit(num_classes=0).eval()
    images = torch.randn(1, 3, 16, 16, requires_grad=True)
    # a random read-out: the plain sum of a LayerNorm output is constant and would have no gradient
    (model(images) * torch.randn(1, 32)).sum().backward()
    per_patch = vit.patchify(images.grad.abs(), 4).sum(-1)  # (1, N)
    assert (per_patch > 0).all()


def test_cls_attention_rows_sum_to_one_over_all_tokens():
    model = tiny_vit().eval()
    maps = model.attention_maps(torch.randn(3, 3, 16, 16))
    cls_rows = maps[:, :, :, 0, :]  # (depth, B, heads, 1 + N)
    assert cls_rows.shape[-1] == 17
    torch.testing.assert_close(cls_rows.sum(-1), torch.ones(cls_rows.shape[:-1]))
    assert (cls_rows[..., 1:] > 0).all()  # CLS reads the patches


def test_cls_reads_a_set_without_position_embeddings():
    model = tiny_vit(num_classes=0).eval()
    with torch.no_grad():
        model.pos_embed.zero_()
    images = torch.randn(2, 3, 16, 16)
    tokens = vit.patchify(images, 4)
    shuffled = vit.unpatchify(tokens[:, torch.randperm(tokens.shape[1])], 4, 16)
    assert not torch.equal(shuffled, images)
    torch.testing.assert_close(model(shuffled), model(images), rtol=1e-5, atol=1e-5)


def test_cls_blind_to_patches_under_a_mask():
    model = tiny_vit(num_classes=0).eval()
    mask = torch.ones(17, 17, dtype=torch.bool)
    mask[0, 1:] = False  # the CLS query may only attend to itself
    a, b = torch.randn(2, 1, 3, 16, 16)
    torch.testing.assert_close(model(a, mask=mask), model(b, mask=mask))
    assert not torch.allclose(model(a), model(b))


def test_a_key_mask_applies_to_every_query():
    model = tiny_vit().eval()
    keys = torch.rand(17) > 0.3
    keys[0] = True
    images = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(model(images, mask=keys), model(images, mask=keys.expand(17, 17)))


@pytest.mark.slow
def test_the_model_compiles_to_one_graph():
    """``torch.compile`` captures the forward whole, in training (PatchDropout included) and in eval: the GPU
    recipe compiles the model, and a graph break would run the pieces around it eagerly. ``aot_eager`` traces
    forward and backward without generating code, so this stays fast."""
    model = tiny_vit(patch_drop=0.5)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    images = torch.randn(4, 3, 16, 16)
    compiled(images).sum().backward()
    assert all(p.grad is not None for p in model.parameters())
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(images), model(images))


# ---- errors a user can act on ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(image_size=30, patch_size=4), ValueError, "image_size 30 is not divisible by patch_size 4"),
        (dict(image_size=(16, 18), patch_size=4), ValueError, "image_size 18 is not divisible by patch_size 4"),
        (dict(dim=30, heads=4), ValueError, "dim 30 is not divisible by heads 4"),
        (dict(pool="max"), ValueError, "unknown pool 'max'"),
        (dict(depth=0), ValueError, "depth must be a positive integer"),
        (dict(drop_path=1.5), ValueError, "drop_path must be in"),
        (dict(init="xavier"), ValueError, "unknown init 'xavier'"),
        (dict(dim=18, heads=2, init="mimetic"), ValueError, "needs dim divisible by 4"),
        (dict(mlp_ratio=-1.0), ValueError, "mlp_ratio must give the MLP at least one hidden unit, got -1.0"),
        (dict(image_size=0), ValueError, r"image_size must be positive, got \[0, 0\]"),
    ],
)
def test_bad_config(kwargs, error, message):
    with pytest.raises(error, match=message):
        tiny_vit(**kwargs)


@pytest.mark.parametrize(
    "images, error, message",
    [
        (torch.randn(2, 1, 16, 16), ValueError, "expected 3 channels, got 1"),
        (torch.randn(2, 3, 32, 32), ValueError, "expected images of size 16x16, got 32x32"),
        (torch.zeros(2, 3, 16, 16, dtype=torch.uint8), TypeError, "expected floating-point images, got torch.uint8"),
        (torch.randn(3, 16, 16), ValueError, r"shape \(B, C, H, W\)"),
        ([[1.0]], TypeError, "expected a torch.Tensor"),
        (torch.randn(2, 3, 16, 16, dtype=torch.float64), TypeError,
         r"images are torch.float64 but the model's weights are torch.float32; convert with images.to"),
    ],
)
def test_bad_input(images, error, message):
    with pytest.raises(error, match=message):
        tiny_vit()(images)


def test_masks_that_do_not_fit_are_named():
    model = tiny_vit(patch_drop=0.5)
    images = torch.randn(2, 3, 16, 16)
    with pytest.raises(ValueError, match="mask cannot be combined with patch_drop while training"):
        model(images, mask=torch.ones(17, dtype=torch.bool))  # sized for all 1 + 16 tokens
    model.eval()
    with pytest.raises(ValueError, match=r"mask of shape \(16,\) does not fit 17 queries and 17 keys"):
        model(images, mask=torch.ones(16, dtype=torch.bool))
    with pytest.raises(ValueError, match="x must be batched"):
        model.blocks[0].attn(torch.randn(17, 32))


def test_attention_maps_are_those_of_prediction_in_any_mode():
    model = tiny_vit(patch_drop=0.5, dropout=0.1).train()
    images = torch.randn(2, 3, 16, 16)
    maps = model.attention_maps(images)
    assert maps.shape == (2, 2, 2, 17, 17) and model.training  # all tokens, and the mode is restored
    torch.testing.assert_close(maps, model.eval().attention_maps(images))


def test_half_precision_position_embeddings_resample_and_frozen_ones_stay_frozen():
    model = tiny_vit(dynamic_img_size=True).to(torch.bfloat16)
    with torch.no_grad():
        assert model(torch.randn(1, 3, 8, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16  # a smaller grid
    with pytest.raises(ValueError, match="images of size 0x0 are not divisible into 4x4 patches"):
        model(torch.randn(1, 3, 0, 0, dtype=torch.bfloat16))
    model.pos_embed.requires_grad_(False)
    model.resize_pos_embed(8)
    assert model.pos_embed.dtype == torch.bfloat16 and not model.pos_embed.requires_grad
