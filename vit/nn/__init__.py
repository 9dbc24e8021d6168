"""The network, in plain PyTorch and einops: nothing here imports Lightning, weight files or tools.

One idea per file: ``attention`` (the attention primitive and the multi-head module), ``embed`` (patch tokens and
position embeddings), ``block`` (the pre-norm encoder block), ``init`` (mimetic initialisation), ``config`` (the
architecture as data), ``vit`` (the model), ``rollout`` (where the model looks) and ``tta`` (test-time views).
"""

from vit.nn.attention import MultiHeadAttention, attend
from vit.nn.block import Block
from vit.nn.config import SIZES, ViTConfig, size_config
from vit.nn.embed import patchify, unpatchify
from vit.nn.rollout import attention_rollout
from vit.nn.tta import tta_probs, views
from vit.nn.vit import ViT

__all__ = ["SIZES", "Block", "MultiHeadAttention", "ViT", "ViTConfig", "attend", "attention_rollout", "patchify",
           "size_config", "tta_probs", "unpatchify", "views"]
