"""Export: safetensors with the config (no pickle), and ONNX that matches PyTorch."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

import vit
from helpers import tiny_vit, write_training_checkpoint
from vit.tools import export

# tiny_vit(**RECTANGULAR): the options an export must carry over, on a rectangular image
RECTANGULAR = dict(image_size=(16, 24), norm_eps=1e-6, pool="mean")


def test_safetensors_round_trip(tmp_path):
    model = tiny_vit(**RECTANGULAR).eval()
    path = tmp_path / "vit.safetensors"
    model.save_safetensors(path)
    loaded = vit.ViT.from_safetensors(path).eval()
    assert loaded.config == model.config
    assert json.loads((tmp_path / "vit.json").read_text()) == model.config.to_dict()
    images = torch.randn(2, 3, 16, 24)
    assert torch.equal(loaded(images), model(images))
    assert set(load_file(path)) == set(model.state_dict())  # plain tensors, readable by any safetensors reader


def test_safetensors_without_config_is_refused(tmp_path):
    path = tmp_path / "other.safetensors"
    save_file({"w": torch.zeros(2)}, path)
    with pytest.raises(ValueError, match="not written by ViT.save_safetensors"):
        vit.ViT.from_safetensors(path)


def test_onnx_matches_pytorch(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    model = tiny_vit(**RECTANGULAR).eval()
    path = tmp_path / "vit.onnx"
    export.export_onnx(model, path)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images = torch.randn(3, 3, 16, 24)  # another batch size than the export's
    (logits,) = session.run(None, {"images": images.numpy()})
    assert logits.shape == (3, 5)
    assert abs(logits - model(images).detach().numpy()).max() <= 1e-4


def test_export_command(tmp_path):
    pytest.importorskip("onnx")
    model = tiny_vit(**RECTANGULAR, num_classes=10).eval()
    ckpt = tmp_path / "run.ckpt"
    write_training_checkpoint(ckpt, model)
    onnx_path, st_path = tmp_path / "out.onnx", tmp_path / "out.safetensors"
    export.main(["--ckpt_path", str(ckpt), "--onnx", str(onnx_path), "--safetensors", str(st_path)])
    import onnx

    onnx.checker.check_model(str(onnx_path))
    images = torch.randn(1, 3, 16, 24)
    torch.testing.assert_close(vit.ViT.from_safetensors(st_path).eval()(images), model(images))


def test_safetensors_keep_their_dtype_and_never_overwrite_themselves(tmp_path):
    model = tiny_vit(**RECTANGULAR).eval().to(torch.bfloat16)
    model.save_safetensors(tmp_path / "vit.safetensors")
    loaded = vit.ViT.from_safetensors(tmp_path / "vit.safetensors")
    assert loaded.pos_embed.dtype == torch.bfloat16
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values()))
    with pytest.raises(ValueError, match="suffix other than .json"):
        model.save_safetensors(tmp_path / "vit.json")  # its config sidecar would replace the weights
