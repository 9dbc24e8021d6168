"""Attention rollout and the attention-map picture."""

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import tiny_vit, write_training_checkpoint
from vit.tools import attention_maps
from vit.nn.rollout import attention_rollout


def test_rollout_rows_sum_to_one():
    model = tiny_vit(num_classes=10, depth=3).eval()
    rollout = attention_rollout(model, torch.randn(3, 3, 16, 16))
    assert rollout.shape == (3, 17)
    torch.testing.assert_close(rollout.sum(-1), torch.ones(3))
    assert (rollout >= 0).all()


def test_rollout_of_one_block_is_its_head_mean_mixed_with_the_residual():
    model = tiny_vit(num_classes=10, depth=1).eval()
    images = torch.randn(2, 3, 16, 16)
    weights = model.attention_maps(images)[0].mean(dim=1)  # (B, T, T), rows sum to 1
    torch.testing.assert_close(attention_rollout(model, images), 0.5 * weights[:, 0] + 0.5 * torch.eye(17)[0])


def test_rollout_multiplies_blocks_first_to_last():
    model = tiny_vit(num_classes=10, depth=2).eval()
    images = torch.randn(2, 3, 16, 16)
    eye = torch.eye(17)
    a1, a2 = (0.5 * m.mean(dim=1) + 0.5 * eye for m in model.attention_maps(images))
    torch.testing.assert_close(attention_rollout(model, images), (a2 @ a1)[:, 0])


def test_cls_that_sees_only_itself_rolls_out_to_itself():
    model = tiny_vit(num_classes=10, depth=3).eval()
    mask = torch.ones(17, 17, dtype=torch.bool)
    mask[0, 1:] = False
    rollout = attention_rollout(model, torch.randn(2, 3, 16, 16), mask=mask)
    torch.testing.assert_close(rollout, torch.eye(17)[0].expand(2, -1))


@pytest.fixture
def checkpoint(tmp_path):
    model = tiny_vit(num_classes=10, depth=3, image_size=32).eval()
    path = tmp_path / "run.ckpt"
    write_training_checkpoint(path, model)
    return path


def decode(path):
    with Image.open(path) as image:
        image.load()
        return image


def test_attention_maps_png_from_image_files(checkpoint, tmp_path):
    files = []
    for name, size in [("a.png", (40, 60)), ("b.jpg", (20, 20))]:
        files.append(tmp_path / name)
        Image.fromarray(np.random.randint(0, 256, (*size, 3), dtype=np.uint8)).save(files[-1])
    out = tmp_path / "attn.png"
    attention_maps.main(["--ckpt_path", str(checkpoint), "--out", str(out), *map(str, files)])
    image = decode(out)
    assert image.format == "PNG" and image.width > 2 * 128 and image.height > 128


def test_attention_maps_png_from_cifar(checkpoint, tmp_path, monkeypatch):
    def fake_cifar(data_dir, train):
        assert data_dir == "somewhere" and not train
        return torch.randint(0, 256, (10, 3, 32, 32), dtype=torch.uint8), torch.arange(10)

    monkeypatch.setattr(attention_maps, "read_cifar10", fake_cifar)
    out = tmp_path / "attn.png"
    args = ["--ckpt_path", str(checkpoint), "--out", str(out), "--num-images", "3", "--data-dir", "somewhere"]
    attention_maps.main(args)
    assert decode(out).size[0] > 3 * 2 * 128
