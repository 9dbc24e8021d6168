"""Export a trained ViT: safetensors weights with their config (loadable without pickle), and ONNX.

    vit-export --ckpt_path run.ckpt --safetensors vit.safetensors --onnx vit.onnx

The ONNX graph takes normalised images ``(batch, C, H, W)`` at the model's image size (any batch size) and
returns logits (or pooled features for a model without head); its metadata holds the config (``vit_config``) and,
when known, the class names, mean and std (``vit_data``), as JSON. ONNX needs ``pip install 'vit[export]'``.
"""

from __future__ import annotations

import json
import os
import warnings

import torch

from vit.nn.vit import ViT
from vit.tools.common import ToolParser, check_output_path, load_model_or_exit
from vit.weights import CONFIG_KEY, DATA_KEY, save_safetensors


def export_onnx(model: ViT, path: str | os.PathLike, *, opset: int = 17) -> None:
    """Write ``model`` as an ONNX graph for images at ``model.image_size`` with a dynamic batch dimension.

    Uses PyTorch's TorchScript-based exporter (``dynamo=False``), which needs no extra packages; attention
    exports as the ONNX ops of ``scaled_dot_product_attention`` and einops as Reshape/Transpose.
    """
    if model.pos_embed.dtype == torch.bfloat16:
        raise ValueError("the ONNX exporter cannot trace bfloat16 weights: export a float32 copy, model.float()")
    was_training = model.training
    model.eval()
    images = torch.zeros(1, model.in_channels, *model.image_size, dtype=model.pos_embed.dtype,
                         device=model.pos_embed.device)
    output = "logits" if model.num_classes else "features"
    with warnings.catch_warnings():
        # The input checks turn into constants: right, the graph is for one image size.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        # This exporter is deprecated in favour of dynamo=True, which needs onnxscript; it still works and is exact.
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        torch.onnx.export(
            model, (images,), str(path), dynamo=False, opset_version=opset,
            input_names=["images"], output_names=[output],
            dynamic_axes={"images": {0: "batch"}, output: {0: "batch"}},
        )
    model.train(was_training)
    import onnx  # the export extra; the exporter above needs it too

    graph = onnx.load(str(path))
    # what a deployment needs beside the graph: the architecture, and the classes and normalisation it expects
    for key, value in ((CONFIG_KEY, model.config.to_dict()), (DATA_KEY, model.data_info)):
        if value is not None:
            graph.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(graph, str(path))


def main(argv: list[str] | None = None) -> None:
    parser = ToolParser(prog="vit-export", description=__doc__.split("\n")[0])
    parser.add_argument("--ckpt_path", required=True, help="training checkpoint (.ckpt) or .safetensors")
    parser.add_argument("--weights", choices=["model", "ema"], default="model", help="which weights of a checkpoint")
    parser.add_argument("--image_size", type=int, nargs="+", help="resize the model to H [W] before exporting")
    parser.add_argument("--safetensors", help="write weights and config here (and <stem>.json beside it)")
    parser.add_argument("--onnx", help="write the ONNX graph here")
    parser.add_argument("--opset", type=int, default=17, help="ONNX opset version")
    args = parser.parse_args(argv)
    if not (args.safetensors or args.onnx):
        parser.error("nothing to do: pass --safetensors and/or --onnx")

    check_output_path(parser, "--safetensors", args.safetensors)
    check_output_path(parser, "--onnx", args.onnx)
    model = load_model_or_exit(parser, args.ckpt_path, weights=args.weights, image_size=args.image_size)
    if args.safetensors:
        try:
            save_safetensors(model, args.safetensors)
        except ValueError as err:
            parser.error(str(err))
        print(f"wrote {args.safetensors}")
    if args.onnx:
        if model.pos_embed.dtype == torch.bfloat16:
            model = model.float()
            print("bfloat16 weights exported to ONNX as float32 (the exporter cannot trace bfloat16)")
        export_onnx(model, args.onnx, opset=args.opset)
        print(f"wrote {args.onnx}")


if __name__ == "__main__":
    main()
