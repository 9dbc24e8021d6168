import math

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.v2 import functional as TF

from vit.data import augment
from vit.data.augment import OPS, SIGNED, BatchAugment, apply_ops, magnitude_table, mix

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def cifar_like(n=8, seed=0):
    """Noise, smooth and flat images: edge cases for the histogram and min/max ops."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    images[n // 3 :] = F.avg_pool2d(images[n // 3 :].float(), 5, 1, 2).to(torch.uint8)
    images[-1, 0] = 77  # one constant channel
    return images


def torchvision_op(image, name, m):
    """One op exactly as torchvision.transforms.v2's _AutoAugmentBase applies it (nearest, fill None)."""
    nearest = TF.InterpolationMode.NEAREST
    shear = math.degrees(math.atan(m))
    return {
        "Identity": lambda: image,
        "ShearX": lambda: TF.affine(image, 0.0, [0, 0], 1.0, [shear, 0.0], nearest, None, center=[0, 0]),
        "ShearY": lambda: TF.affine(image, 0.0, [0, 0], 1.0, [0.0, shear], nearest, None, center=[0, 0]),
        "TranslateX": lambda: TF.affine(image, 0.0, [int(m), 0], 1.0, [0.0, 0.0], nearest, None),
        "TranslateY": lambda: TF.affine(image, 0.0, [0, int(m)], 1.0, [0.0, 0.0], nearest, None),
        "Rotate": lambda: TF.rotate(image, m, nearest),
        "Brightness": lambda: TF.adjust_brightness(image, 1.0 + m),
        "Color": lambda: TF.adjust_saturation(image, 1.0 + m),
        "Contrast": lambda: TF.adjust_contrast(image, 1.0 + m),
        "Sharpness": lambda: TF.adjust_sharpness(image, 1.0 + m),
        "Posterize": lambda: TF.posterize(image, int(m)),
        "Solarize": lambda: TF.solarize(image, 255.0 * m),
        "AutoContrast": lambda: TF.autocontrast(image),
        "Equalize": lambda: TF.equalize(image),
    }[name]()


# ---- crop and flip --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("policy", ["none", "trivial", "randaugment"])
def test_shape_dtype_device_preserved(device, policy):
    images = cifar_like(16).to(device)
    out = BatchAugment(policy=policy, erasing=0.5)(images)
    assert out.shape == images.shape and out.dtype == torch.uint8 and out.device == images.device


def windows(images, padding, mirrored):
    """Every crop (and its mirror image if ``mirrored``) of the zero-padded images: (B, K, C, H, W)."""
    h, w = images.shape[-2:]
    padded = F.pad(images, (padding,) * 4)
    shifts = range(2 * padding + 1)
    crops = [padded[..., top : top + h, left : left + w] for top in shifts for left in shifts]
    crops += [crop.flip(-1) for crop in crops] if mirrored else []
    return torch.stack(crops, dim=1)


@pytest.mark.parametrize("flip", [False, True])
def test_crop_only_shifts_content(flip):
    torch.manual_seed(0)
    images = cifar_like(32)
    out = BatchAugment(crop_padding=4, flip=flip)(images)
    matches = (windows(images, 4, flip) == out.unsqueeze(1)).flatten(2).all(-1)  # (B, K)
    assert matches.any(dim=1).all()
    assert len(matches.float().argmax(1).unique()) > 10  # the offsets vary
    if flip:
        assert not matches[:, : 9 * 9].any(dim=1).all()  # some images came out mirrored


def test_flip_rate_is_half():
    torch.manual_seed(0)
    images = torch.randint(0, 256, (4000, 3, 4, 4), dtype=torch.uint8)
    out = BatchAugment(crop_padding=0, flip=True)(images)
    flipped = (out == images.flip(-1)).flatten(1).all(1)
    assert ((out == images).flatten(1).all(1) | flipped).all()
    assert abs(flipped.float().mean().item() - 0.5) < 0.03  # 4 sigma


# ---- policy ops against torchvision ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["trivial", "randaugment"])
@pytest.mark.parametrize("name", OPS)
def test_op_matches_torchvision_at_every_magnitude(policy, name):
    """Bit-exact with torchvision's uint8 tensor kernel for every magnitude bin and sign."""
    images = cifar_like(3)
    table = magnitude_table(policy, 32, 32)
    k = OPS.index(name)
    signs = (1.0, -1.0) if name in SIGNED else (1.0,)
    magnitudes = torch.tensor([s * float(m) for m in table[k] for s in signs], dtype=torch.float64)
    batch = images.repeat(len(magnitudes), 1, 1, 1)  # every image at every magnitude
    m = magnitudes.repeat_interleave(len(images))
    out = apply_ops(batch, torch.full_like(m, k, dtype=torch.int64), m)
    expected = torch.stack([torchvision_op(image, name, float(mi)) for image, mi in zip(batch, m)])
    assert torch.equal(out, expected)


def test_apply_ops_mixed_batch_keeps_image_order():
    images = cifar_like(28)
    op = torch.arange(28) % len(OPS)
    m = magnitude_table("trivial", 32, 32)[op, 20]
    out = apply_ops(images, op, m)
    for i in range(28):
        assert torch.equal(out[i], torchvision_op(images[i], OPS[op[i]], float(m[i])))


def spy_on_ops(monkeypatch):
    calls = []

    def spy(images, op, magnitude):
        calls.append((op, magnitude))
        return images

    monkeypatch.setattr(augment, "apply_ops", spy)
    return calls


def test_trivial_draws_ops_bins_and_signs_uniformly(monkeypatch):
    calls = spy_on_ops(monkeypatch)
    torch.manual_seed(0)
    n = 14000
    BatchAugment(crop_padding=0, flip=False, policy="trivial")(torch.zeros(n, 3, 8, 8, dtype=torch.uint8))
    [(op, magnitude)] = calls
    counts = torch.bincount(op, minlength=len(OPS)).float()
    assert (counts - n / len(OPS)).abs().max() < 4 * math.sqrt(n / len(OPS))  # 4 sigma
    table = magnitude_table("trivial", 8, 8)
    rotate = op == OPS.index("Rotate")
    bins = (magnitude[rotate].abs().unsqueeze(1) == table[OPS.index("Rotate")]).float().argmax(1)
    assert len(bins.unique()) == 31
    assert abs((magnitude[rotate] < 0).float().mean().item() - 0.5) < 0.08
    assert (magnitude[op == OPS.index("Solarize")] >= 0).all()  # unsigned ops keep their sign


def test_randaugment_applies_num_ops_at_fixed_magnitude(monkeypatch):
    calls = spy_on_ops(monkeypatch)
    BatchAugment(policy="randaugment", num_ops=3, magnitude=5)(cifar_like(64))
    assert len(calls) == 3
    table = magnitude_table("randaugment", 32, 32)
    for op, magnitude in calls:
        assert torch.equal(magnitude.abs(), table[op, 5])


# ---- random erasing -------------------------------------------------------------------------------------------


def test_erasing_zeroes_one_rectangle():
    torch.manual_seed(0)
    images = torch.randint(1, 256, (500, 3, 32, 32), dtype=torch.uint8)  # no zeros before erasing
    out = BatchAugment(crop_padding=0, flip=False, erasing=0.5)(images)
    zero = (out == 0).all(1)  # (B, H, W)
    erased = zero.flatten(1).any(1)
    assert abs(erased.float().mean().item() - 0.5) < 0.1
    assert torch.equal(out[~erased], images[~erased])
    for mask in zero[erased]:
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        box = (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1)
        assert mask.sum() == box  # a filled rectangle
        assert 0.01 <= box / mask.numel() <= 0.35


# ---- argument checks ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "autoaugment"}, "policy"),
        ({"magnitude": 31}, "magnitude"),
        ({"num_ops": -1}, "num_ops"),
        ({"crop_padding": -1}, "crop_padding"),
        ({"erasing": 1.5}, "erasing"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BatchAugment(**kwargs)


def test_rejects_float_images():
    with pytest.raises(ValueError, match="uint8"):
        BatchAugment()(torch.zeros(2, 3, 8, 8))


# ---- mixup / cutmix -------------------------------------------------------------------------------------------


def mix_inputs(b=8, num_classes=10):
    torch.manual_seed(0)
    images = torch.rand(b, 3, 16, 16)
    targets = torch.arange(b) % num_classes  # partners i and b-1-i have different labels
    return images, targets


def weight_of_own_label(soft, targets):
    return soft.gather(1, targets.view(-1, 1)).squeeze(1)


def test_mixup_pixels_match_lambda():
    images, targets = mix_inputs()
    out, soft = mix(images, targets, 10, mixup_alpha=0.8, cutmix_alpha=0.0)
    lam = weight_of_own_label(soft, targets)
    assert torch.allclose(lam, lam[0].expand_as(lam))  # one lambda for the batch
    assert torch.allclose(out, lam[0] * images + (1 - lam[0]) * images.flip(0), atol=1e-6)
    assert torch.allclose(soft.sum(1), torch.ones(8))


def test_cutmix_pastes_a_box_and_lambda_is_its_complement():
    images, targets = mix_inputs()
    for seed in range(20):
        torch.manual_seed(seed)
        out, soft = mix(images, targets, 10, mixup_alpha=0.0, cutmix_alpha=1.0)
        from_partner = (out == images.flip(0)).all(1) & (out != images).any(1)  # (B, H, W)
        assert ((out == images).all(1) | from_partner).all()
        lam = weight_of_own_label(soft, targets)
        area = from_partner[0].float().mean()
        assert torch.allclose(lam, (1 - area).expand_as(lam))
        assert torch.allclose(soft.sum(1), torch.ones(8))


def test_mix_prob_zero_leaves_inputs_unchanged():
    images, targets = mix_inputs()
    out, soft = mix(images, targets, 10, prob=0.0)
    assert torch.equal(out, images)
    assert torch.equal(soft, F.one_hot(targets, 10).float())


def test_mix_label_smoothing_rows_sum_to_one():
    images, targets = mix_inputs()
    _, soft = mix(images, targets, 10, label_smoothing=0.1)
    assert torch.allclose(soft.sum(1), torch.ones(8))
    assert soft.min() >= 0.1 / 10 - 1e-7


def test_mix_needs_a_positive_alpha():
    images, targets = mix_inputs()
    with pytest.raises(ValueError, match="alpha"):
        mix(images, targets, 10, mixup_alpha=0.0, cutmix_alpha=0.0)
