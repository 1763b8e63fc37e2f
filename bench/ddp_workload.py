"""What bench/ddp_step.py trains: the digits data, three models and the configurations compared.

Data: scikit-learn's bundled digits (1797 images of 8x8 pixels, shipped with the package: no
download), scaled to [0, 1], split 80/20 stratified by the seed. Every model takes the flat 64
pixels of a batch, so one data path serves all three.

Models (parameters, float32 gradient bytes per step):
- ``mlp``: 64-1024-1024-1024-10, ReLU (2,176,010; 8.7 MB): the baseline model.
- ``cnn``: three 3x3 convolutions (32, 64, 128 channels, two 2x2 max-pools) on the 1x8x8 image,
  then 512-512-10 (about 0.36M; 1.4 MB).
- ``transformer``: the 8 rows of 8 pixels as 8 tokens, a linear embedding to d_model 128 plus a
  learned position embedding, 4 post-norm encoder layers (4 heads, feed-forward 512, no dropout),
  mean over tokens, 128-10 (about 0.8M; 3.2 MB).

Configurations (``CONFIGS``): how one model is trained, in the tables' order. ``compute`` has no DDP
at all (each rank trains alone: the step without communication); the others are DDP models on
the gloo group (torch's own hooks) or on the zcoll group (no hook: DDP's own allreduce through
the zcoll backend; compressed: ``zcoll.torch.apply_gradient_compression`` with error feedback).
``FIXED``: the zcoll configurations with one method throughout, which compression='auto' is judged
against.

Run as a script, it checks that the optimizers step alike (``--optimizer adam-fused`` stands in
for torch's default Adam): each one trains the mlp from the same initial weights on the same
batch for a few steps, and the parameters are saved for comparison::

    python bench/ddp_workload.py --optimizers adam,adam-fused --steps 2 --save steps.pt
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

MODELS = ("mlp", "cnn", "transformer")


# -- data -----------------------------------------------------------------------------------------
@dataclass
class Digits:
    x_train: torch.Tensor  # (n, 64) float32 in [0, 1]
    y_train: torch.Tensor  # (n,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor


def load_digits(seed: int) -> Digits:
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    x, y = sk_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(x / 16.0, y, test_size=0.2, random_state=seed, stratify=y)
    f32, i64 = torch.float32, torch.long
    return Digits(
        torch.tensor(xtr, dtype=f32),
        torch.tensor(ytr, dtype=i64),
        torch.tensor(xte, dtype=f32),
        torch.tensor(yte, dtype=i64),
    )


class Batches:
    """This rank's batches, the same sequence for every configuration: epoch e shuffles the training
    rows with seed (seed, e); a step takes the next `batch * size` rows and rank r the r-th slice of
    `batch` (the remainder of an epoch is dropped). `next()` returns (x, y, epoch)."""

    def __init__(self, data: Digits, batch: int, rank: int, size: int, seed: int):
        self.data, self.batch, self.rank, self.size, self.seed = data, batch, rank, size, seed
        self.per_epoch = len(data.x_train) // (batch * size)
        if self.per_epoch == 0:
            raise ValueError(f"batch {batch} x {size} ranks exceeds the {len(data.x_train)} training rows")
        self.step = 0
        self._order: Optional[torch.Tensor] = None

    def next(self) -> Tuple[torch.Tensor, torch.Tensor, int]:
        epoch, k = divmod(self.step, self.per_epoch)
        if k == 0 or self._order is None:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._order = torch.randperm(len(self.data.x_train), generator=gen)
        first = (k * self.size + self.rank) * self.batch
        idx = self._order[first : first + self.batch]
        self.step += 1
        return self.data.x_train[idx], self.data.y_train[idx], epoch


# -- models ---------------------------------------------------------------------------------------
class DigitsCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4
            nn.Conv2d(64, 128, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 2x2
        )
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(128 * 4, 512), nn.ReLU(), nn.Linear(512, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x.view(-1, 1, 8, 8)))


class DigitsTransformer(nn.Module):
    def __init__(self, d_model: int = 128, layers: int = 4, heads: int = 4, ff: int = 512) -> None:
        super().__init__()
        self.embed = nn.Linear(8, d_model)
        self.position = nn.Parameter(torch.randn(8, d_model) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = self.embed(x.view(-1, 8, 8)) + self.position  # 8 rows of 8 pixels
        return self.head(self.encoder(tokens).mean(dim=1))


def make_model(name: str, seed: int) -> nn.Module:
    """The model `name` with the initial weights of `seed` (the same on every rank and in every
    configuration)."""
    torch.manual_seed(seed)
    if name == "mlp":
        return nn.Sequential(
            nn.Linear(64, 1024),
            nn.ReLU(),
            nn.Linear(1024, 1024),
            nn.ReLU(),
            nn.Linear(1024, 1024),
            nn.ReLU(),
            nn.Linear(1024, 10),
        )
    if name == "cnn":
        return DigitsCNN()
    if name == "transformer":
        return DigitsTransformer()
    raise ValueError(f"unknown model {name!r}; choose from {', '.join(MODELS)}")


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


OPTIMIZERS = ("adam", "adam-fused")


def make_optimizer(name: str, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam as torch's default runs it on the CPU (a loop over the parameters), or its fused CPU
    kernel. The default's sqrt is ~5x slower per element on exact zeros (pytorch/pytorch#91962),
    and Adam's second moment stays exactly 0 wherever a gradient has been 0 at every step (ReLUs
    that never fired, top-k entries never sent): its time depends on how the model was trained,
    not only on its size. Measured here (2M floats, one thread): the default 5.9-6.4 ms with no
    zeros, 6.2-9.1 ms with 6%, 10-11 ms with half; fused 1.7-1.9 ms in all three."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
    return torch.optim.Adam(model.parameters(), lr=lr, fused=name == "adam-fused")


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(model(x), y)


def accuracy_on_test_set(model: nn.Module, data: Digits) -> float:
    with torch.no_grad():
        return (model(data.x_test).argmax(1) == data.y_test).float().mean().item()


# -- configurations -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One way to train. `group`: which process group its DDP model uses (None: no DDP);
    `compressor`: a zcoll compressor factory (zcoll configurations); `gloo_hook`: torch's hook."""

    name: str
    group: Optional[str]
    compressor: Optional[Callable[[], Any]] = None
    gloo_hook: Optional[str] = None
    auto: bool = False  # a zcoll.AutoCompression: decides within its first auto_decided() steps
    # another model trained exactly like `zcoll`: two identical set-ups timed side by side show
    # how far apart the benchmark's noise alone puts them (an A/A test)
    control: bool = False

    @property
    def ddp(self) -> bool:
        return self.group is not None


def _zcoll() -> Any:
    import zcoll

    return zcoll


CONFIGS: Dict[str, Config] = {
    c.name: c
    for c in [
        Config("compute", None),
        Config("gloo", "gloo"),
        Config("gloo-fp16", "gloo", gloo_hook="fp16"),
        Config("gloo-powersgd", "gloo", gloo_hook="powersgd"),
        Config("zcoll", "zcoll"),
        Config("zcoll-again", "zcoll", control=True),
        Config("zcoll-fp16", "zcoll", compressor=lambda: _zcoll().HalfPrecision("fp16")),
        Config("zcoll-bf16", "zcoll", compressor=lambda: _zcoll().HalfPrecision("bf16", error_feedback=True)),
        Config("zcoll-int8", "zcoll", compressor=lambda: _zcoll().GradientQuantizer(bits=8)),
        Config("zcoll-int4", "zcoll", compressor=lambda: _zcoll().GradientQuantizer(bits=4)),
        Config("zcoll-sign", "zcoll", compressor=lambda: _zcoll().GradientQuantizer(bits=1)),
        Config("zcoll-top10%", "zcoll", compressor=lambda: _zcoll().TopK(ratio=0.1)),
        Config("zcoll-top1%", "zcoll", compressor=lambda: _zcoll().TopK(ratio=0.01)),
        # checks every AUTO_CHECK_EVERY steps: predicted vs measured communication within a short
        # timed run (judged also over the library's default interval, in blocks of them)
        Config("zcoll-auto", "zcoll", auto=True, compressor=lambda: _auto("auto", check_every=AUTO_CHECK_EVERY)),
        # the same choices without the guard: what the guard costs auto
        Config(
            "zcoll-auto-unguarded",
            "zcoll",
            auto=True,
            compressor=lambda: _auto("unguarded", check_every=AUTO_CHECK_EVERY, guard=False),
        ),
        # the guard alone (one method, escalated when its sampled error grows): its overhead
        # against zcoll-sign / zcoll-top1%, its accuracy against zcoll
        Config("zcoll-guarded-sign", "zcoll", auto=True, compressor=lambda: _guarded("sign")),
        Config("zcoll-guarded-top1%", "zcoll", auto=True, compressor=lambda: _guarded("top1%")),
    ]
}
FIXED = [
    "zcoll",
    "zcoll-fp16",
    "zcoll-bf16",
    "zcoll-int8",
    "zcoll-int4",
    "zcoll-top10%",
    "zcoll-sign",
    "zcoll-top1%",
]


def auto_decided() -> int:
    """The step by which a default zcoll.AutoCompression has decided, at the latest (its start
    step, the screen and the longest final)."""
    auto = _zcoll().AutoCompression()
    return auto.trials.end


AUTO_METRICS_DIR: Optional[str] = None  # where auto configurations write their JSON-lines logs
AUTO_CHECK_EVERY = 10  # zcoll-auto's check interval (the library's default: 50 steps)


def _auto(name: str, **options: Any) -> Any:
    """A zcoll.AutoCompression writing its log to AUTO_METRICS_DIR (rank 0's pid in the name)."""
    import os

    path = None
    if AUTO_METRICS_DIR:
        path = os.path.join(AUTO_METRICS_DIR, f"zcoll-guard-{name}-{os.getpid()}.jsonl")
    return _zcoll().AutoCompression(metrics_path=path, **options)


def _guarded(method: str) -> Any:
    """One method under the guard, with the calibrated residual bound (escalated to int4 and on
    while error feedback owes more than a gradient)."""
    bound = _zcoll().tune.RESIDUAL_BOUND
    return _auto(method.rstrip("%"), methods=[method], residual_bound=bound)


POWERSGD_RANK = 4  # matrix_approximation_rank of the PowerSGD hook (the baseline's)
POWERSGD_START = 2  # start_powerSGD_iter: DDP's minimum with error feedback (buckets rebuild at step 1)


def wrap(
    config: Config,
    module: nn.Module,
    groups: Dict[str, Any],
    bucket_mb: Optional[float],
    hook_wrapper: Callable[[Callable], Callable] = lambda hook: hook,
) -> nn.Module:
    """`module` as `config` trains it: itself (compute), or a DDP model on the config's group with
    DDP's default buckets (bucket_mb None: bucket_cap_mb=25) or `bucket_mb`, and its hook.
    hook_wrapper: applied to torch's hooks before registering them (the profiler times a hook it
    did not register through ``zcoll.torch.tracer.timed_hook``)."""
    if not config.ddp:
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    caps = {} if bucket_mb is None else {"bucket_cap_mb": bucket_mb}
    ddp = DDP(module, process_group=groups[config.group], **caps)
    if config.gloo_hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        ddp.register_comm_hook(groups[config.group], hook_wrapper(default_hooks.fp16_compress_hook))
    elif config.gloo_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        state = psgd.PowerSGDState(
            process_group=groups[config.group],
            matrix_approximation_rank=POWERSGD_RANK,
            start_powerSGD_iter=POWERSGD_START,
        )
        ddp.register_comm_hook(state, hook_wrapper(psgd.powerSGD_hook))
    elif config.compressor is not None:
        import zcoll.torch

        zcoll.torch.apply_gradient_compression(ddp, config.compressor(), plain=True)
    return ddp


def parse_buckets(text: str, allow_suggested: bool = True) -> List[str]:
    """Bucket settings from a comma-separated list: ``default`` (DDP's), ``suggested`` (the
    profiler's, when allowed) or a cap in MB. Raises ValueError naming a bad one."""
    out = [b for b in text.split(",") if b]
    for b in out:
        if b == "default" or (b == "suggested" and allow_suggested):
            continue
        try:
            ok = float(b) > 0
        except ValueError:
            ok = False
        if not ok:
            kinds = "default, suggested or" if allow_suggested else "default or"
            raise ValueError(f"bad bucket setting {b!r}: {kinds} a cap in MB")
    if not out:
        raise ValueError("no bucket setting given")
    return out


def parameters_of(model: nn.Module) -> List[torch.Tensor]:
    inner = model.module if hasattr(model, "module") else model
    return list(inner.parameters())


# -- the optimizers' check ------------------------------------------------------------------------
def step_each_optimizer(names: List[str], steps: int, seed: int = 0, rows: int = 64) -> Dict[str, Any]:
    """The mlp trained `steps` steps by each named optimizer from the same initial weights on the
    same `rows` training rows: {"start": parameters, name: {"parameters": ..., "fused": bool}}."""
    data = load_digits(seed=seed)
    x, y = data.x_train[:rows], data.y_train[:rows]
    models = [make_model("mlp", seed=seed) for _ in names]
    opts = [make_optimizer(name, m, lr=1e-3) for name, m in zip(names, models)]
    saved: Dict[str, Any] = {"start": [p.detach().clone() for p in models[0].parameters()]}
    for _ in range(steps):
        for m, o in zip(models, opts):
            o.zero_grad()
            loss_of(m, x, y).backward()
            o.step()
    for name, m, o in zip(names, models, opts):
        parameters = [p.detach().clone() for p in m.parameters()]
        saved[name] = {"parameters": parameters, "fused": bool(o.defaults["fused"])}
    return saved


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--optimizers", default=",".join(OPTIMIZERS), help="comma-separated optimizer names")
    p.add_argument("--steps", type=int, default=2, help="steps each optimizer takes (default 2)")
    p.add_argument("--seed", type=int, default=0, help="of the weights and the data split (default 0)")
    p.add_argument("--save", required=True, help="torch.save the start and each optimizer's parameters here")
    args = p.parse_args(argv)
    saved = step_each_optimizer(args.optimizers.split(","), args.steps, args.seed)
    torch.save(saved, args.save)
    names = [n for n in saved if n != "start"]
    first = saved[names[0]]["parameters"]
    for name in names[1:]:
        diff = max((a - b).abs().max().item() for a, b in zip(first, saved[name]["parameters"]))
        print(f"{name} vs {names[0]} after {args.steps} steps: largest difference {diff:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
