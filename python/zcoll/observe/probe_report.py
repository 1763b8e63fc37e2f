"""The outputs of `zcoll probe`: the printed report and the files (probe.py lists them)."""

from __future__ import annotations

import base64
import csv
import html
import io
import itertools
from pathlib import Path
from typing import List

import numpy as np

from .placement import Placement, node_smoothed
from .probe import ProbeResult


def _rank_label(r: ProbeResult, i: int) -> str:
    return f"{i} (n{r.node_of[i]})"


def _matrix_text(r: ProbeResult, m: np.ndarray, fmt: str) -> List[str]:
    labels = [_rank_label(r, i) for i in range(r.size)]
    width = max(9, max(len(l) for l in labels) + 1)
    lines = [" " * width + "".join(f"{i:>{width}}" for i in range(r.size))]
    for i in range(r.size):
        cells = "".join(f"{'-':>{width}}" if i == j or not np.isfinite(m[i, j]) else f"{m[i, j]:>{width}{fmt}}"
                        for j in range(r.size))
        lines.append(f"{labels[i]:<{width}}{cells}")
    return lines


def _hop_bandwidth(r: ProbeResult, perm, hop) -> float:
    """The bandwidth placement used for the hop (its node pair's median)."""
    return float(node_smoothed(r.bandwidth, r.node_of)[perm[hop[0]], perm[hop[1]]])


def format_report(r: ProbeResult, written: List[Path] = ()) -> str:
    a = r.analysis
    out = [f"zcoll probe: {r.size} ranks on {len(r.nodes)} nodes; {r.info.get('mpi', '')}"
           f" (measured in {r.info.get('seconds', '?')} s)", "", "nodes (shared memory; ZCOLL_NODE_ID where set):"]
    for k, ranks in enumerate(r.nodes):
        out.append(f"  node {k} ({r.hosts[ranks[0]]}): ranks {' '.join(map(str, ranks))}")
    if r.size > 1:
        out += ["", "bandwidth, MB/s (row rank sends to column rank):", *_matrix_text(r, r.bandwidth / 1e6, ".1f")]
        out += ["", "latency, us one way (min of the ping-pongs):", *_matrix_text(r, r.latency * 1e6, ".1f")]
    out += ["", "memory copy, GB/s: " + "  ".join(f"{i}: {v / 1e9:.1f}" for i, v in enumerate(r.memcpy))]
    if a is None or r.size < 2:
        return "\n".join(out)
    rules = a.rules
    out += ["", f"tiers (links by bandwidth, cut at {rules['tier_gap']:g}x gaps; groups with under "
                f"{rules['tier_min_share']:.0%} of a kind's links join the nearest tier):"]
    for t in a.tiers:
        out.append(f"  {t.name:<14} {t.links:>4} links  {t.bandwidth / 1e6:10.1f} MB/s  {t.latency * 1e6:8.1f} us")
    out += ["", f"hotspots (bandwidth below {rules['hotspot_ratio']:g}x the tier's median, or latency over 2x "
                "and 20 us above it):"]
    if not a.hotspots:
        out.append("  none")
    for h in a.hotspots:
        pairs = " ".join(f"{i}->{j}" for i, j in h.pairs)
        out.append(f"  {h.describe()}  [ranks {pairs}]")
    if a.slow_nodes:
        out += ["", "slow nodes (every inter-node link slow): " + ", ".join(f"node {k}" for k in a.slow_nodes)]
    if a.placement is not None:
        out += ["", *_placement_text(r, a.placement, written)]
    if written:
        out += ["", "written: " + " ".join(str(p) for p in written)]
    return "\n".join(out)


def _placement_text(r: ProbeResult, p: Placement, written) -> List[str]:
    now = _hop_bandwidth(r, list(range(r.size)), p.current_hop)
    lines = [f"placement (traffic: {p.traffic}):",
             f"  now: slowest transfer rank {p.current_hop[0]} -> {p.current_hop[1]} over a "
             f"{now / 1e6:.1f} MB/s link"]
    if not p.improves:
        lines.append("  no placement found that makes it at least 10% faster: keep this one")
        return lines
    new = _hop_bandwidth(r, p.perm, p.suggested_hop)
    lines += [
        f"  suggested: rank r runs where rank perm[r] runs now, perm = {p.perm}",
        f"  then: slowest transfer rank {p.suggested_hop[0]} -> {p.suggested_hop[1]} over a {new / 1e6:.1f} MB/s "
        f"link: {p.speedup():.2f}x faster (sum of transfer times {p.current_total / p.suggested_total:.2f}x)",
        f"  hosts in rank order: {' '.join(p.hosts)}",
        f"  hydra: mpirun -launcher ... -hosts {','.join(dict.fromkeys(p.hosts))} -rankmap "
        + ",".join(str(list(dict.fromkeys(p.hosts)).index(h)) for h in p.hosts),
        "  srun: SLURM_HOSTFILE=placement.hosts srun --distribution=arbitrary ...; "
        "Open MPI: mpirun --rankfile rankfile ...",
    ]
    return lines


# -- files -----------------------------------------------------------------------------------------
def write_outputs(r: ProbeResult, out: Path, png: bool = True, page: bool = True) -> List[Path]:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "probe.json"]
    r.save(written[0])
    written += _write_csvs(r, out)
    a = r.analysis
    if a is not None and a.placement is not None and a.placement.improves:
        written += _write_placement(a.placement, out)
    image = None
    if png and r.size > 1:
        image = heatmap_png(r)
        (out / "heatmap.png").write_bytes(image)
        written.append(out / "heatmap.png")
    if page:
        (out / "report.html").write_text(html_page(r, image, written))
        written.append(out / "report.html")
    return written


def _write_csvs(r: ProbeResult, out: Path) -> List[Path]:
    hot = {}
    tier_of = {}
    if r.analysis:
        for h in r.analysis.hotspots:
            for pair in h.pairs:
                hot.setdefault(pair, h.link)
        for l in r.analysis.links:
            for pair in l.pairs:
                tier_of[pair] = (l.name(), r.analysis.tiers[l.tier].name)
    with open(out / "links.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["src", "dst", "src_node", "dst_node", "src_host", "dst_host", "bandwidth_MBps", "latency_us",
                    "latency_median_us", "link", "tier", "hotspot"])
        for i, j in itertools.permutations(range(r.size), 2):
            name, tier = tier_of.get((i, j), ("", ""))
            w.writerow([i, j, r.node_of[i], r.node_of[j], r.hosts[i], r.hosts[j], f"{r.bandwidth[i, j] / 1e6:.3f}",
                        f"{r.latency[i, j] * 1e6:.2f}", f"{r.latency_median[i, j] * 1e6:.2f}", name, tier,
                        hot.get((i, j), "")])
    for name, m, scale in (("bandwidth.csv", r.bandwidth, 1e-6), ("latency.csv", r.latency, 1e6)):
        with open(out / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["MB/s" if name.startswith("b") else "us", *range(r.size)])
            for i in range(r.size):
                w.writerow([i, *("" if i == j else f"{m[i, j] * scale:.3f}" for j in range(r.size))])
    return [out / "links.csv", out / "bandwidth.csv", out / "latency.csv"]


def _write_placement(p: Placement, out: Path) -> List[Path]:
    (out / "placement.hosts").write_text("".join(f"{h}\n" for h in p.hosts))
    lines = ["# hydra machinefile (mpirun -f machinefile): ranks fill the lines in order"]
    runs = [(h, len(list(g))) for h, g in itertools.groupby(p.hosts)]
    if len(runs) != len(set(p.hosts)):
        lines.append("# a host holds ranks that are not consecutive: hydra makes each line its own node here;"
                     " prefer -hosts/-rankmap as printed by zcoll probe")
    lines += [f"{h}:{n}" for h, n in runs]
    (out / "machinefile").write_text("\n".join(lines) + "\n")
    slot = {}
    rank_lines = []
    for rank, h in enumerate(p.hosts):
        rank_lines.append(f"rank {rank}={h} slot={slot.get(h, 0)}")
        slot[h] = slot.get(h, 0) + 1
    (out / "rankfile").write_text("\n".join(rank_lines) + "\n")
    return [out / "placement.hosts", out / "machinefile", out / "rankfile"]


def heatmap_png(r: ProbeResult) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2))
    panels = ((axes[0], r.bandwidth / 1e6, "bandwidth MB/s (row -> column)", "viridis", "bandwidth"),
              (axes[1], r.latency * 1e6, "latency us (one way, min)", "magma_r", "latency"))
    for ax, m, title, cmap, what in panels:
        hot = {pair for h in r.hotspots if h.what == what for pair in h.pairs}
        shown = np.ma.masked_invalid(np.where(m > 0, m, np.nan))
        finite = shown.compressed()
        norm = LogNorm(vmin=finite.min(), vmax=max(finite.max(), finite.min() * 1.01)) if finite.size else None
        im = ax.imshow(shown, cmap=cmap, norm=norm)
        fig.colorbar(im, ax=ax, shrink=0.8)
        ax.set_title(title)
        ax.set_xlabel("to rank")
        ax.set_ylabel("from rank")
        ticks = range(r.size)
        ax.set_xticks(ticks)
        ax.set_yticks(ticks)
        ax.set_yticklabels([_rank_label(r, i) for i in ticks])
        for k in range(1, r.size):  # node boundaries
            if r.node_of[k] != r.node_of[k - 1]:
                ax.axhline(k - 0.5, color="white", lw=1.5)
                ax.axvline(k - 0.5, color="white", lw=1.5)
        for i, j in hot:
            ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="red", lw=2.5))
        if r.size <= 16:
            for i, j in itertools.permutations(range(r.size), 2):
                if np.isfinite(m[i, j]) and m[i, j] > 0:
                    red, green, blue, _ = im.cmap(im.norm(m[i, j]))
                    light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5
                    ax.text(j, i, f"{m[i, j]:.3g}", ha="center", va="center", fontsize=7,
                            color="black" if light else "white")
    fig.suptitle(f"zcoll probe: {r.size} ranks, {len(r.nodes)} nodes (hotspots outlined red)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def html_page(r: ProbeResult, image, written) -> str:
    img = f'<img src="data:image/png;base64,{base64.b64encode(image).decode()}">' if image else ""
    return (
        "<!doctype html><meta charset=utf-8><title>zcoll probe</title>"
        "<style>body{font-family:sans-serif;margin:2em}pre{background:#f6f6f6;padding:1em}</style>"
        f"<h1>zcoll probe: {r.size} ranks, {len(r.nodes)} nodes</h1>{img}"
        f"<pre>{html.escape(format_report(r, [p.name for p in written]))}</pre>"
    )
