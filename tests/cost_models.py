"""Synthetic cost models of compression="auto" (no MPI): kernel rates and a link, for the tests
of zcoll.tune (the decision, the trials, drift)."""

from __future__ import annotations

from zcoll.observe.step_model import LinkModel
from zcoll.tune import compression_model as cm

MIB = 1 << 20


def codecs(encode_gbs: float = 4.0):
    """Synthetic kernel rates: every codec encodes and decodes at encode_gbs GB/s."""
    rate = 1.0 / (encode_gbs * 1e9)
    out = {}
    for m, payload in (
        ("bf16", 0.5),
        ("int8", 0.2578),
        ("int4", 0.1328),
        ("sign", 0.0352),
        ("top10%", 0.2),
        ("top1%", 0.02),
    ):
        out[m] = {
            "encode_s_per_byte": rate,
            "decode_s_per_byte": rate,
            "payload_ratio": payload,
            "exchange": "allgather" if m.startswith("top") else "ring",
        }
    return out


def model(
    gbps: float, alpha: float = 50e-6, compressed_alpha: float = 150e-6, ranks: int = 2
) -> cm.CostModel:
    link = LinkModel(alpha, 8.0 / (gbps * 1e9), 2.0 * (ranks - 1) / ranks, "none", codecs(), ranks)
    return cm.CostModel(link, {m: compressed_alpha for m in codecs()} | {"none": alpha})
