"""A GPT demo that looks like real work: a nanoGPT-shaped decoder on byte tokens of Python source.

Why this model: the digits and MNIST CNNs say nothing about what researchers train. This is GPT-2
small's shape (12 layers, 768 wide, 12 heads, 1,024 positions; about 124 M parameters with the
50,304-row embedding of trainer/configs/gpt.yaml), pre-norm blocks, fused-QKV causal attention
through ``scaled_dot_product_attention`` (flash or memory-efficient kernels where the GPU has
them), a 4x GELU MLP and the output head tied to the token embedding. The shape follows karpathy's
nanoGPT ``model.py``; the code is written here.

Why bytes of the standard library's source: nothing may be downloaded at run time, so the text has
to come from what the machine already has. The Python standard library ships about 12 MB of real
source (code is what many language models are trained on), read in a fixed order, so the data is
the same on every run with the same Python. The tokenizer is the identity on UTF-8 bytes (256 ids):
deterministic, nothing to train or ship. A byte model needs only 256 embedding rows; the full-size
config keeps GPT-2's padded 50,304 anyway, so its parameters, memory and FLOPs (the output head is
about a third of them at 1,024 tokens) are those of GPT-2 124M, which plans and MFU compare
against. The unused rows cost compute but not correctness: their logits just learn to stay low.
"""

from __future__ import annotations

import hashlib
import logging
import math
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

log = logging.getLogger(__name__)

#: Byte-level tokens: one id per UTF-8 byte.
BYTE_VOCAB = 256
#: Folders of the standard library left out of the corpus: tests (generated data, odd encodings) and
#: third-party packages (they differ from machine to machine).
SKIPPED_PARTS = frozenset({"site-packages", "dist-packages", "idlelib", "test", "tests", "__pycache__"})


class CausalSelfAttention(nn.Module):
    """Multi-head causal attention: one QKV projection, SDPA with ``is_causal``, one output projection."""

    def __init__(self, width: int, heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(f"model_args.width: {width} is not a multiple of heads {heads} (e.g. 768 / 12)")
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(width, 3 * width, bias=bias)
        self.proj = nn.Linear(width, width, bias=bias)
        self.proj_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        shape = (batch, length, self.heads, width // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head width)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        return self.proj_dropout(self.proj(y.transpose(1, 2).contiguous().view(batch, length, width)))


class Block(nn.Module):
    """Pre-norm transformer block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, width: int, heads: int, dropout: float, bias: bool) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, bias=bias)
        self.attn = CausalSelfAttention(width, heads, dropout, bias)
        self.norm2 = nn.LayerNorm(width, bias=bias)
        self.mlp = nn.Sequential(
            nn.Linear(width, 4 * width, bias=bias),
            nn.GELU(approximate="tanh"),
            nn.Linear(4 * width, width, bias=bias),
            nn.Dropout(dropout),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, vocab); the trainer's ``loss: auto`` scores them."""

    def __init__(
        self, layers: int, width: int, heads: int, context: int, vocab_size: int, dropout: float, bias: bool
    ) -> None:
        super().__init__()
        self.layers, self.width, self.context = layers, width, context
        self.token_embedding = nn.Embedding(vocab_size, width)
        self.position_embedding = nn.Embedding(context, width)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(width, heads, dropout, bias) for _ in range(layers))
        self.norm = nn.LayerNorm(width, bias=bias)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.token_embedding.weight  # tied: one matrix reads and writes tokens
        self.apply(self._init)
        for name, param in self.named_parameters():  # GPT-2: residual projections scaled by depth
            if name.endswith(("attn.proj.weight", "mlp.2.weight")):
                nn.init.normal_(param, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.context:
            raise ValueError(f"a sequence of {length} tokens is longer than the context {self.context}")
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))

    def flops_per_sample(self) -> float:
        """Training FLOPs for one sequence of ``context`` tokens (forward + backward), PaLM's count.

        6 per weight per token (2 forward, 4 backward) for every matrix that multiplies: the linear
        layers, the output head among them (the token table it shares is otherwise a lookup, as is the
        position table; norms and biases are not matmuls). Plus the attention scores and their use:
        12 x layers x width x context per token. Causal masking is not subtracted, as nanoGPT and PaLM
        do not: MFU stays comparable with theirs. The trainer uses this instead of counting with
        FlopCounterMode (whose first use costs about a second, and which misses the CPU's fused
        attention kernel).
        """
        weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        per_token = 6 * weights + 12 * self.layers * self.width * self.context
        return float(per_token * self.context)

    @property
    def tokens_per_sample(self) -> int:
        """Tokens in one training sample (a full context window): tokens/s = samples/s x this."""
        return self.context


def gpt(
    layers: int = 12,
    width: int = 768,
    heads: int = 12,
    context: int = 1024,
    vocab_size: int = BYTE_VOCAB,
    dropout: float = 0.0,
    bias: bool = False,
) -> GPT:
    """A GPT decoder (``model: trainer.gpt:gpt``); the defaults are GPT-2 small's shape over bytes.

    ``vocab_size`` must cover the byte tokenizer's 256 ids; 50,304 (GPT-2's 50,257 padded to a
    multiple of 64) makes the model GPT-2 124M's size, as trainer/configs/gpt.yaml does.
    """
    if vocab_size < BYTE_VOCAB:
        raise ValueError(
            f"model_args.vocab_size: {vocab_size} is below the byte tokenizer's {BYTE_VOCAB} ids "
            f"(use {BYTE_VOCAB}, or 50304 for GPT-2 small's size)"
        )
    return GPT(layers, width, heads, context, vocab_size, dropout, bias)


def corpus_files(root: Path | None = None) -> Iterator[Path]:
    """The standard library's ``.py`` files in a fixed order (names sorted, folders walked in that
    order), tests and site-packages left out; lazily, so a small corpus reads only its first files."""
    base = Path(sysconfig.get_paths()["stdlib"]) if root is None else root
    for entry in sorted(base.iterdir(), key=lambda p: p.name):
        if entry.name in SKIPPED_PARTS:
            continue
        if entry.is_dir() and not entry.is_symlink():
            yield from corpus_files(entry)
        elif entry.suffix == ".py" and entry.is_file():
            yield entry


def corpus_bytes(max_bytes: int | None = None, root: Path | None = None) -> bytes:
    """Up to ``max_bytes`` of the corpus: the files one after another, each ended by a newline."""
    parts, size = [], 0
    for path in corpus_files(root):
        text = path.read_bytes() + b"\n"
        parts.append(text)
        size += len(text)
        if max_bytes is not None and size >= max_bytes:
            break
    data = b"".join(parts)
    return data if max_bytes is None else data[:max_bytes]


def tokens(
    context: int = 1024, max_bytes: int | None = None, eval_fraction: float = 0.05
) -> tuple[TensorDataset, TensorDataset]:
    """Next-token pairs (``data: trainer.gpt:tokens``): (input ids, the same ids one to the right).

    The corpus is cut into windows of ``context`` tokens; the last ``eval_fraction`` of them are the
    held-out set (the end of the corpus, never seen in training). Inputs and targets are two views
    of one int64 tensor, so the data costs 8 bytes a token, not 16.
    """
    if context < 1:
        raise ValueError(f"data_args.context: must be >= 1 (got {context})")
    if not 0.0 <= eval_fraction < 1.0:
        raise ValueError(f"data_args.eval_fraction: must be in [0, 1) (got {eval_fraction})")
    raw = corpus_bytes(max_bytes)
    windows = (len(raw) - 1) // context
    if windows < 2:
        raise ValueError(
            f"data_args: {len(raw):,} bytes make fewer than 2 windows of context {context} "
            "(raise max_bytes or lower context)"
        )
    stream = torch.frombuffer(bytearray(raw[: windows * context + 1]), dtype=torch.uint8).long()
    inputs = stream[:-1].view(windows, context)
    targets = stream[1:].view(windows, context)
    held = max(1, round(windows * eval_fraction)) if eval_fraction > 0 else 0
    cut = windows - held
    digest = hashlib.sha256(raw).hexdigest()[:12]
    log.info("token data: %s bytes of Python %s source (sha256 %s), %d train and %d eval windows of %d",
             f"{len(raw):,}", sysconfig.get_python_version(), digest, cut, held, context)  # fmt: skip
    return TensorDataset(inputs[:cut], targets[:cut]), TensorDataset(inputs[cut:], targets[cut:])
