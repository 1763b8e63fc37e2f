"""What bench/tta.py trains to a quality target: three workloads, each small enough for two cores.

- ``lm``: a byte-level causal transformer language model (2 pre-norm layers, d_model 64, 4 heads,
  context 32; its causal mask a bool buffer, as such models usually keep it: DDP broadcasts it)
  on real English text available offline: the Python language reference and library topics that
  CPython ships in ``pydoc_data.topics`` (about 465 KB). The first 90% trains, the last 10% is the
  validation text. Quality: validation loss (nats per byte, lower is better).
- ``cnn``: three convolutions and a 512-wide head on scikit-learn's bundled digits (1797 images of
  8x8 pixels, no download), 80/20 split. Quality: test accuracy (%).
- ``mlp``: communication-heavy: a 64-512-512-10 MLP (0.3M parameters, 1.2 MB of float32 gradients)
  on the digits with 16 rows per rank, so the gradients are large against the computation.

Every workload yields the same batches for every method (the seed fixes initial weights and data
order), and evaluates on the same held-out data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import numpy as np
import pydoc_data.topics
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


@dataclass(frozen=True)
class Workload:
    """One model, its data and its quality target. ``higher_is_better``: accuracy (True) or loss.
    ``steps``: the budget every method trains for (quality is compared at equal steps);
    ``target``: the quality uncompressed training reaches inside the budget."""

    name: str
    quality: str  # what `evaluate` returns
    higher_is_better: bool
    target: float
    steps: int
    eval_every: int
    lr: float
    make_model: Callable[[int], nn.Module]
    make_data: Callable[[int], "Data"]

    def reached(self, value: float) -> bool:
        return value >= self.target if self.higher_is_better else value <= self.target


class Data:
    """Batches for one rank (the same sequence for every method) and the held-out evaluation."""

    def batch(self, step: int, rank: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> float:
        raise NotImplementedError


# -- the language model -------------------------------------------------------------------------
CONTEXT = 32
VOCAB = 256


class ByteLM(nn.Module):
    def __init__(self, d_model: int = 64, layers: int = 2, heads: int = 4) -> None:
        super().__init__()
        self.token = nn.Embedding(VOCAB, d_model)
        self.position = nn.Parameter(torch.randn(CONTEXT, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)
        self.register_buffer("causal_mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool), 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[1]
        h = self.token(x) + self.position[:n]
        return self.head(self.encoder(h, mask=self.causal_mask[:n, :n], is_causal=True))


class Text(Data):
    ROWS = 16  # windows per rank per step
    EVAL_WINDOWS = 256

    def __init__(self, seed: int):
        text = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
        data = torch.tensor(list(text.encode("utf-8", "replace")), dtype=torch.long)
        cut = int(len(data) * 0.9)
        self.train, self.val, self.seed = data[:cut], data[cut:], seed
        starts = torch.randint(0, len(self.val) - CONTEXT - 1, (self.EVAL_WINDOWS,), generator=torch.Generator().manual_seed(1))
        self.eval_x, self.eval_y = self._windows(self.val, starts)

    @staticmethod
    def _windows(src: torch.Tensor, starts: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        idx = starts[:, None] + torch.arange(CONTEXT + 1)
        w = src[idx]
        return w[:, :-1], w[:, 1:]

    def batch(self, step: int, rank: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed((self.seed * 1_000_003 + step) * 64 + rank)
        return self._windows(self.train, torch.randint(0, len(self.train) - CONTEXT - 1, (self.ROWS,), generator=gen))

    def evaluate(self, model: nn.Module) -> float:
        with torch.no_grad():
            return F.cross_entropy(model(self.eval_x).reshape(-1, VOCAB), self.eval_y.reshape(-1)).item()


# -- the digits models ---------------------------------------------------------------------------
class Digits(Data):
    def __init__(self, seed: int, rows: int):
        x, y = load_digits(return_X_y=True)
        xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=seed, stratify=y)
        self.x_train, self.y_train = torch.tensor(xtr, dtype=torch.float32), torch.tensor(ytr)
        self.x_test, self.y_test = torch.tensor(xte, dtype=torch.float32), torch.tensor(yte)
        self.seed, self.rows = seed, rows

    def batch(self, step: int, rank: int, size: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Epoch e shuffles the rows with (seed, e); a step takes the next rows * size, rank r
        the r-th slice (an epoch's remainder is dropped)."""
        per_epoch = len(self.x_train) // (self.rows * size)
        epoch, k = divmod(step, per_epoch)
        order = torch.randperm(len(self.x_train), generator=torch.Generator().manual_seed(self.seed * 1_000_003 + epoch))
        idx = order[(k * size + rank) * self.rows :][: self.rows]
        return self.x_train[idx], self.y_train[idx]

    def evaluate(self, model: nn.Module) -> float:
        with torch.no_grad():
            return 100.0 * (model(self.x_test).argmax(1) == self.y_test).float().mean().item()


class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        )  # fmt: skip
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(128 * 4, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, 8, 8)))


def _seeded(make: Callable[[], nn.Module]) -> Callable[[int], nn.Module]:
    def build(seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return make()

    return build


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10))


WORKLOADS = {
    w.name: w
    for w in (
        Workload("lm", "validation loss", False, 2.20, 300, 20, 3e-3, _seeded(ByteLM), Text),
        Workload("cnn", "test accuracy %", True, 96.0, 200, 20, 1e-3, _seeded(DigitsCNN), lambda s: Digits(s, 32)),
        Workload("mlp", "test accuracy %", True, 95.5, 200, 20, 1e-3, _seeded(_mlp), lambda s: Digits(s, 16)),
    )
}


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def nonfinite(x: float) -> bool:
    return not np.isfinite(x)
