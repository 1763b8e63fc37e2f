"""`zcoll probe` on the command line (zcoll.tools.probe_command): --help, and a saved result
analysed again with other rules."""

import sys

from link_matrices import synthetic_result
from mpi_util import run
from zcoll.observe import probe


def test_help():
    rc, out = run([sys.executable, "-m", "zcoll", "probe", "--help"], timeout=60)
    assert rc == 0 and "round-robin tournament" in out and "--hotspot-ratio" in out, out
    rc, out = run([sys.executable, "-m", "zcoll", "--help"], timeout=60)
    assert rc == 0 and "probe" in out, out


def test_reanalyse_a_saved_result(tmp_path):
    synthetic_result().save(tmp_path / "in.json")
    rc, out = run([sys.executable, "-m", "zcoll", "probe", "--from", tmp_path / "in.json", "--out", tmp_path / "o",
                   "--hotspot-ratio", "0.2", "--no-png"], timeout=60)
    assert rc == 0, out
    assert "hotspots (bandwidth below 0.2x" in out and "  none" in out, out
    assert probe.load(tmp_path / "o" / "probe.json").analysis.rules["hotspot_ratio"] == 0.2
    assert not (tmp_path / "o" / "heatmap.png").exists()
