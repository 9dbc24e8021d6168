"""vit-predict: image files in, top-k classes out."""

import csv
import json
import re

import numpy as np
import pytest
import torch
from PIL import Image

import vit
from helpers import tiny_vit, write_training_checkpoint
from vit.tools import common, predict


def save_checkpoint(path, num_classes=10):
    model = tiny_vit(num_classes=num_classes, depth=1)
    write_training_checkpoint(path, model)
    return model.eval()


def random_image(path, size):
    Image.fromarray(np.random.randint(0, 256, (*size, 3), dtype=np.uint8)).save(path)
    return path


@pytest.fixture
def inputs(tmp_path):
    folder = tmp_path / "photos"
    (folder / "nested").mkdir(parents=True)
    random_image(folder / "big.jpg", (300, 200))
    random_image(folder / "nested" / "small.PNG", (8, 8))
    (folder / "notes.txt").write_text("not an image, and not picked up from a folder")
    broken = tmp_path / "broken.png"
    broken.write_text("not an image either")
    return folder, broken


def test_predicts_every_image_and_reports_the_bad_file(tmp_path, inputs, capsys):
    folder, broken = inputs
    model = save_checkpoint(tmp_path / "run.ckpt")
    out = tmp_path / "out.json"
    args = ["--ckpt_path", str(tmp_path / "run.ckpt"), str(broken), str(folder), "--top-k", "3", "--output", str(out)]
    code = predict.main(args)
    assert code == 0
    captured = capsys.readouterr()
    assert f"{broken}: error" in captured.err
    results = json.loads(out.read_text())
    assert [r["file"] for r in results] == [str(broken), str(folder / "big.jpg"), str(folder / "nested" / "small.PNG")]
    assert "error" in results[0]
    for result in results[1:]:
        probs = [p["probability"] for p in result["predictions"]]
        assert len(probs) == 3 and probs == sorted(probs, reverse=True)
        assert all(p["label"] in vit.data.cifar10.CIFAR10_CLASSES for p in result["predictions"])
        assert f"{result['file']}: {result['predictions'][0]['label']}" in captured.out

    # the same numbers as the model on the resized, normalised image
    image = common.load_image(folder / "big.jpg", (16, 16))
    expected = model(vit.data.cifar10.normalize(image[None])).softmax(-1)[0]
    top = results[1]["predictions"][0]
    assert top["probability"] == pytest.approx(expected.max().item(), abs=1e-6)
    assert top["index"] == expected.argmax().item()


def test_csv_output_and_class_indices(tmp_path, inputs):
    folder, _ = inputs
    save_checkpoint(tmp_path / "run.ckpt", num_classes=4)
    out = tmp_path / "out.csv"
    assert predict.main(["--ckpt_path", str(tmp_path / "run.ckpt"), str(folder), "--output", str(out)]) == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * 4  # top-k is capped at the number of classes
    assert {row["label"] for row in rows} == {"0", "1", "2", "3"}


def test_exit_code_is_nonzero_only_when_every_file_fails(tmp_path, inputs):
    _, broken = inputs
    save_checkpoint(tmp_path / "run.ckpt")
    assert predict.main(["--ckpt_path", str(tmp_path / "run.ckpt"), str(broken), str(tmp_path / "missing.png")]) == 1


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-size", "0"], "--batch_size must be positive, got 0"),
        (["--ckpt_path", "{tmp}/nope.ckpt"], r"checkpoint '.*nope.ckpt' does not exist"),
        (["--ckpt_path", "{tmp}/bad.safetensors"], r"'.*bad.safetensors' is not a readable safetensors file"),
        (["--output", "{tmp}/nowhere/out.csv"], r"--output '.*out.csv': the folder '.*nowhere' does not exist"),
        (["--device", "bogus"], r"unknown --device 'bogus'"),
        (["--ckpt_path", "{tmp}/vit.safetensors", "--weights", "ema"], r"is an export, which holds one set of weights"),
    ],
)
def test_bad_arguments_are_one_error_line(tmp_path, inputs, capsys, args, message):
    folder, _ = inputs
    save_checkpoint(tmp_path / "run.ckpt")
    (tmp_path / "bad.safetensors").write_bytes(b"\xff" * 64)
    vit.ViT.from_checkpoint(tmp_path / "run.ckpt").save_safetensors(tmp_path / "vit.safetensors")
    argv = ["--ckpt_path", str(tmp_path / "run.ckpt"), str(folder)] + [a.format(tmp=tmp_path) for a in args]
    with pytest.raises(SystemExit) as exit_info:
        predict.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and re.search(message, err) and "Traceback" not in err


def test_attention_maps_needs_at_least_one_image(tmp_path, capsys):
    from vit.tools import attention_maps

    save_checkpoint(tmp_path / "run.ckpt")
    with pytest.raises(SystemExit):
        attention_maps.main(["--ckpt_path", str(tmp_path / "run.ckpt"), "--num-images", "0"])
    assert "--num_images must be positive, got 0" in capsys.readouterr().err


def test_16_bit_grey_images_keep_their_brightness(tmp_path):
    grey = np.full((8, 8), 32896, dtype=np.uint16)  # 128 x 257: mid-grey on the 16-bit scale
    Image.fromarray(grey).save(tmp_path / "grey16.png")
    assert Image.open(tmp_path / "grey16.png").mode.startswith("I")
    image = common.load_image(tmp_path / "grey16.png", (8, 8))
    assert image.shape == (3, 8, 8) and (image == 128).all()


def test_photos_are_seen_upright_and_oversized_files_are_skipped(tmp_path, capsys, monkeypatch):
    upright = np.random.randint(0, 256, (8, 12, 3), dtype=np.uint8)
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: the stored pixels are to be turned 90 degrees clockwise for display
    Image.fromarray(upright).transpose(Image.Transpose.ROTATE_90).save(tmp_path / "photo.png", exif=exif)
    assert torch.equal(common.load_image(tmp_path / "photo.png", (8, 12)), torch.from_numpy(upright).permute(2, 0, 1))

    save_checkpoint(tmp_path / "run.ckpt")
    random_image(tmp_path / "small.png", (8, 8))
    random_image(tmp_path / "huge.png", (16, 16))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # PIL refuses more than twice this: 256 pixels here
    assert predict.main(["--ckpt_path", str(tmp_path / "run.ckpt"), str(tmp_path / "huge.png"),
                         str(tmp_path / "small.png")]) == 0
    captured = capsys.readouterr()
    assert "huge.png: error: Image size (256 pixels) exceeds limit" in captured.err and "small.png: " in captured.out


def test_half_precision_exports_predict_and_draw(tmp_path, capsys):
    from vit.tools import attention_maps

    model = save_checkpoint(tmp_path / "run.ckpt")
    model.to(torch.bfloat16).save_safetensors(tmp_path / "bf16.safetensors")
    image = random_image(tmp_path / "a.png", (16, 16))
    assert predict.main(["--ckpt_path", str(tmp_path / "bf16.safetensors"), str(image), "--top-k", "1"]) == 0
    attention_maps.main(["--ckpt_path", str(tmp_path / "bf16.safetensors"), "--out", str(tmp_path / "m.png"),
                         str(tmp_path)])
    assert Image.open(tmp_path / "m.png").size[0] > 0
    for args, message in ((["--out", str(tmp_path / "m.png"), str(tmp_path / "broken.png")], "cannot identify image"),
                          (["--out", str(tmp_path / "m.xyz"), str(image)], "--out must end in")):
        (tmp_path / "broken.png").write_text("not an image")
        with pytest.raises(SystemExit):
            attention_maps.main(["--ckpt_path", str(tmp_path / "run.ckpt"), *args])
        assert message in capsys.readouterr().err
