"""Loading and saving weights: training checkpoints, safetensors exports and timm models, on top of the network.

The network never imports this package. The loaders are also reachable as ``ViT`` class methods (timm's and
torchvision's habit: ``ViT.from_checkpoint(path)``); they are attached here, one layer up, so that the
dependency still points one way. Every loader returns the model in eval mode.
"""

from vit.nn.vit import ViT
from vit.weights.checkpoint import CONFIG_KEY, DATA_KEY, load_checkpoint, load_checkpoint_file
from vit.weights.pretrained import load_pretrained
from vit.weights.safetensors import load_safetensors, save_safetensors
from vit.weights.timm import vit_from_timm

ViT.from_checkpoint = staticmethod(load_checkpoint)
ViT.from_safetensors = staticmethod(load_safetensors)
ViT.from_timm = staticmethod(vit_from_timm)
ViT.save_safetensors = save_safetensors

__all__ = ["CONFIG_KEY", "DATA_KEY", "load_checkpoint", "load_checkpoint_file", "load_pretrained", "load_safetensors",
           "save_safetensors", "vit_from_timm"]
