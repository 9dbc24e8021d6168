"""The pre-norm encoder block and its parts: the MLP and stochastic depth."""

from __future__ import annotations

from torch import Tensor, nn

from vit.nn.attention import MultiHeadAttention


class DropPath(nn.Module):
    """Stochastic depth: drop a sample's whole residual branch with probability ``p`` while training."""

    def __init__(self, p: float = 0.0) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if self.p == 0.0 or not self.training:
            return x
        keep = x.new_empty(x.shape[0], *([1] * (x.dim() - 1))).bernoulli_(1.0 - self.p)
        return x * keep / (1.0 - self.p)


class Mlp(nn.Module):
    """Two linear layers with GELU between: the position-wise feed-forward of a block."""

    def __init__(self, dim: int, hidden_dim: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm encoder block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(
        self,
        dim: int,
        heads: int,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = True,
        dropout: float = 0.0,
        attn_dropout: float = 0.0,
        drop_path: float = 0.0,
        norm_eps: float = 1e-5,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=norm_eps)
        self.attn = MultiHeadAttention(dim, heads, qkv_bias=qkv_bias, attn_dropout=attn_dropout, proj_dropout=dropout)
        self.norm2 = nn.LayerNorm(dim, eps=norm_eps)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), dropout)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """``(B, N, dim) -> (B, N, dim)``; ``mask`` (True = may attend) broadcasts to ``(B, heads, N, N)``."""
        x = x + self.drop_path(self.attn(self.norm1(x), mask=mask))
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x

    def forward_cls(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        """The same block's output for token 0 alone: ``(B, N, dim) -> (B, 1, dim)``, equal to ``forward(x)[:, :1]``.

        A CLS-pooled classifier reads nothing else from its last block, so only the CLS row goes through the query
        and output projections and the MLP; it still attends to all ``N`` tokens, and with a single query the
        attention folds the key/value projections into it instead of projecting all ``N`` tokens (see
        ``MultiHeadAttention``). That saves nearly all of the last block.
        """
        h = self.norm1(x)
        if mask is not None and mask.dim() >= 2 and mask.shape[-2] > 1:
            mask = mask[..., :1, :]  # the CLS query's row
        x = x[:, :1] + self.drop_path(self.attn(h[:, :1], context=h, mask=mask))
        x = x + self.drop_path(self.mlp(self.norm2(x)))
        return x
