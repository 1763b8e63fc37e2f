"""zcoll.observe.probe_report: the files `zcoll probe` writes and its printed report."""

from link_matrices import synthetic_result
from zcoll.observe import placement, probe_report


def test_files_and_report(tmp_path):
    r = synthetic_result()
    written = probe_report.write_outputs(r, tmp_path)
    names = {p.name for p in written}
    assert {"probe.json", "links.csv", "bandwidth.csv", "latency.csv", "heatmap.png", "report.html"} <= names
    assert "placement.hosts" not in names  # nothing to gain with two nodes
    assert (tmp_path / "heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = (tmp_path / "links.csv").read_text().splitlines()
    assert len(rows) == 1 + 12
    assert sum("node 1 -> node 0" in row.split(",")[-1] for row in rows) == 4
    text = probe_report.format_report(r, written)
    assert "node 1 -> node 0: 31.0 MB/s, 0.25x the 125.0 MB/s of inter-node" in text
    assert "node 0 (node0): ranks 0 1" in text


def test_placement_files(tmp_path):
    p = placement.Placement([0, 2, 1, 3], ["a", "b", "a", "b"], "ring", 2.0, 1.0, 4.0, 3.0, (0, 1), (1, 2), True)
    probe_report._write_placement(p, tmp_path)
    assert (tmp_path / "placement.hosts").read_text() == "a\nb\na\nb\n"
    assert (tmp_path / "rankfile").read_text() == "rank 0=a slot=0\nrank 1=b slot=0\nrank 2=a slot=1\nrank 3=b slot=1\n"
    machinefile = (tmp_path / "machinefile").read_text()
    assert machinefile.splitlines()[-4:] == ["a:1", "b:1", "a:1", "b:1"] and "rankmap" in machinefile
