"""What the data is (class names, mean, std) travels with the weights: checkpoint, safetensors, ONNX, the tools."""

import json

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from helpers import tiny_vit, write_training_checkpoint
from vit.tools import export, predict
from vit.tools.common import class_names, normalize_for

CATS_DOGS = {"classes": ["cats", "dogs", "owls"], "mean": [0.5, 0.4, 0.3], "std": [0.2, 0.25, 0.3]}


def test_checkpoint_and_safetensors_carry_the_class_names_and_normalisation(tmp_path):
    model = tiny_vit(num_classes=3)
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", model, vit_data=CATS_DOGS)
    loaded = vit.ViT.from_checkpoint(ckpt)
    assert loaded.data_info == CATS_DOGS
    loaded.save_safetensors(tmp_path / "m.safetensors")
    assert vit.ViT.from_safetensors(tmp_path / "m.safetensors").data_info == CATS_DOGS
    assert class_names(loaded) == ["cats", "dogs", "owls"]
    images = torch.full((1, 3, 16, 16), 255, dtype=torch.uint8)
    torch.testing.assert_close(normalize_for(loaded, images)[0, :, 0, 0], torch.tensor([0.5 / 0.2, 0.6 / 0.25, 0.7 / 0.3]))


def test_a_new_head_forgets_the_old_names(tmp_path):
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=3), vit_data=CATS_DOGS)
    backbone = vit.ViT.from_checkpoint(ckpt, num_classes=5)
    assert backbone.head.out_features == 5 and backbone.data_info["classes"] is None
    assert backbone.data_info["mean"] == CATS_DOGS["mean"]


def test_old_files_without_names_are_cifar10_models(tmp_path):
    model = vit.ViT.from_checkpoint(write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=10)))
    assert model.data_info is None and class_names(model)[:2] == ["airplane", "automobile"]
    assert class_names(tiny_vit(num_classes=3)) == ["0", "1", "2"]


def test_predict_prints_the_models_own_class_names(tmp_path, capsys):
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=3), vit_data=CATS_DOGS)
    Image.fromarray(np.full((20, 20, 3), 90, np.uint8)).save(tmp_path / "pet.png")
    assert predict.main(["--ckpt_path", str(ckpt), str(tmp_path / "pet.png"), "--top_k", "3"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in CATS_DOGS["classes"])


def test_onnx_metadata_holds_config_and_data(tmp_path):
    onnx = pytest.importorskip("onnx")
    ckpt = write_training_checkpoint(tmp_path / "run.ckpt", tiny_vit(num_classes=3), vit_data=CATS_DOGS)
    export.main(["--ckpt_path", str(ckpt), "--onnx", str(tmp_path / "m.onnx")])
    props = {p.key: json.loads(p.value) for p in onnx.load(str(tmp_path / "m.onnx")).metadata_props}
    assert props["vit_data"] == CATS_DOGS and props["vit_config"]["num_classes"] == 3


def test_timm_models_bring_their_normalisation():
    timm = pytest.importorskip("timm")
    source = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, num_classes=3)
    model = vit.ViT.from_timm(source)
    assert model.data_info["mean"] == list(source.pretrained_cfg["mean"])
