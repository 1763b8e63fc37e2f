"""The allreduce algorithm table (csrc/collectives/algorithm_table.cc, zcoll._C.allreduce_algorithms())
against everything that names its algorithms: Python's names (zcoll.ALGORITHMS), the benchmark's
`-a` list (zcoll_allreduce_perf --help), and docs/algorithms.md, whose section per algorithm opens
with a `Cost:` formula that must agree with the table's cost function. No mpirun needed.
"""

from __future__ import annotations

import math
import re

import pytest
import zcoll
from mpi_util import BIN_DIR, ROOT, run
from zcoll import _C

DOCS = ROOT / "docs" / "algorithms.md"
TABLE = _C.allreduce_algorithms()
NAMES = [row["name"] for row in TABLE]
SEGMENT = 128 * 1024  # the cost functions' default segment_bytes (ZCOLL_SEGMENT_BYTES' default)


def allreduce_sections() -> dict:
    """name -> text of each `### name` section under `## Allreduce` in docs/algorithms.md."""
    text = DOCS.read_text()
    part = text.split("\n## Allreduce\n", 1)[1].split("\n## ", 1)[0]
    chunks = re.split(r"^### (.+)$", part, flags=re.MULTILINE)
    return {chunks[i].strip().strip("`"): chunks[i + 1] for i in range(1, len(chunks), 2)}


SECTIONS = allreduce_sections()

# A formula as docs/algorithms.md writes it: products by juxtaposition ("2(p-1)/p S beta"),
# `log2 X` applying to the atom X, p' the largest power of two <= p. Left-to-right * and /, as
# the C++ cost functions compute.
_TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|([A-Za-z_][A-Za-z_0-9]*'?)|([-+/*()]))")


def to_python(formula: str) -> str:
    out, pos, operand_before = [], 0, False
    tokens = []
    while pos < len(formula.rstrip()):
        m = _TOKEN.match(formula, pos)
        assert m, f"cannot read {formula[pos:]!r} in {formula!r}"
        tokens.append(m.groups())
        pos = m.end()
    i = 0
    while i < len(tokens):
        number, name, op = tokens[i]
        starts_operand = number is not None or name is not None or op == "("
        if starts_operand and operand_before:
            out.append("*")
        if name == "log2":
            i += 1
            arg_number, arg_name, _ = tokens[i]
            assert arg_number or arg_name, f"log2 takes a name or number in {formula!r}"
            out.append(f"log2({(arg_name or arg_number).replace(chr(39), '_prime')})")
            operand_before = True
        elif number is not None or name is not None:
            out.append((name or number).replace("'", "_prime"))
            operand_before = True
        else:
            out.append(op)
            operand_before = op == ")"
        i += 1
    return " ".join(out)


def evaluate(formula: str, variables: dict) -> float:
    return eval(to_python(formula), {"__builtins__": {}, "log2": math.log2}, dict(variables))


def cost_line(name: str) -> str:
    m = re.search(r"^Cost: (.*)$", SECTIONS[name], flags=re.MULTILINE)
    assert m, f"docs/algorithms.md: the section of {name!r} has no 'Cost:' line"
    return m.group(1)


def fold_formula() -> str:
    m = re.search(r"fold = `([^`]*)` when p is not a power of two", DOCS.read_text())
    assert m, "docs/algorithms.md: the definition of fold is missing"
    return m.group(1)


def variables(nbytes: float, p: int, nodes: int, alpha: float, beta: float, gamma: float) -> dict:
    pp = 2 ** math.floor(math.log2(p))
    v = {
        "p": p,
        "p_prime": pp,
        "S": nbytes,
        "N": nodes,
        "L": p / nodes,
        "seg": min(nbytes, SEGMENT),
        "nseg": max(1, math.ceil(nbytes / SEGMENT)),
        "alpha": alpha,
        "beta": beta,
        "gamma": gamma,
    }
    v["fold"] = 0.0 if pp == p else evaluate(fold_formula(), v)
    return v


def test_table_lists_the_builtins_in_code_order():
    assert NAMES[:9] == list(_C.Algorithm.__members__)[:9]
    assert [row["code"] for row in TABLE] == list(range(len(TABLE)))
    assert len(set(NAMES)) == len(NAMES)
    needs = {row["name"]: row["needs"] for row in TABLE}
    assert needs["mpi"] == ("native_allreduce",) and needs["shm"] == ("shared_memory",)
    assert needs["ordered_ring"] == ("topology",) and needs["ring"] == ()


@pytest.mark.parametrize("name", NAMES)
def test_python_accepts_the_name(name):
    assert name in zcoll.ALGORITHMS
    assert getattr(_C.Algorithm, name).name == name


def test_python_names_nothing_else():
    assert sorted(zcoll.ALGORITHMS) == sorted(NAMES)


def test_benchmark_lists_every_algorithm():
    rc, out = run([str(BIN_DIR / "zcoll_allreduce_perf"), "--help"])
    assert rc == 0, out
    listed = re.search(r"-a ALGOS\s+comma-separated algorithms: (.*?), or all", out, flags=re.DOTALL)
    assert listed, out
    names = [n.strip() for n in listed.group(1).split(",")]
    assert sorted(names) == sorted(NAMES), out


@pytest.mark.parametrize("name", NAMES)
def test_docs_have_a_section(name):
    assert name in SECTIONS, f"docs/algorithms.md has no '### {name}' section under '## Allreduce'"
    line = cost_line(name)
    row = TABLE[NAMES.index(name)]
    if row["cost"] is None:
        assert line.startswith("none"), f"{name}: no cost function, but the docs give {line!r}"
    else:
        assert line.startswith("`") and line.count("`") == 2, f"{name}: a formula in backquotes, not {line!r}"


POINTS = [  # (bytes, ranks, nodes)
    (4096, 2, 1),
    (4096, 3, 1),
    (1 << 20, 4, 1),
    (3_000_000, 6, 1),
    (3_000_000, 8, 1),
    (1 << 24, 5, 1),
    (1 << 20, 4, 2),
    (3_000_000, 8, 2),
    (3_000_000, 8, 4),
]


@pytest.mark.parametrize("name", [row["name"] for row in TABLE if row["cost"] is not None])
def test_cost_function_agrees_with_the_docs(name):
    formula = cost_line(name).strip("`")
    cost = TABLE[NAMES.index(name)]["cost"]
    for nbytes, p, nodes in POINTS:
        if nodes > 1 and name != "hierarchical":
            continue
        alpha, beta, gamma = 2e-6, 1e-9, 3e-10
        want = evaluate(formula, variables(nbytes, p, nodes, alpha, beta, gamma))
        got = cost(nbytes, p, alpha, beta, gamma, nodes=nodes)
        assert got == pytest.approx(want, rel=1e-12), (name, nbytes, p, nodes, formula, to_python(formula))


def test_the_formula_reader():
    assert to_python("2(p-1)/p S beta") == "2 * ( p - 1 ) / p * S * beta"
    assert to_python("log2 p' (alpha + S beta)") == "log2(p_prime) * ( alpha + S * beta )"
    v = variables(1000, 6, 1, 1.0, 1.0, 1.0)
    assert evaluate("2 log2 p' alpha + fold", v) == 2 * 2 + (2 + 2000 + 1000)


def hierarchical_crossover(ranks: int, nodes: int) -> float:
    """Rule 3's lower bound as docs/algorithms.md derives it from the two-tier model:
    N (N-1-log2 N) alpha_link / ((L-1)(N-1) beta_link), alpha_link / beta_link = 8 KiB (16 KiB
    halved for a 2:1 oversubscribed fabric)."""
    n, per = nodes, ranks / nodes
    return 8192 * n * (n - 1 - math.log2(n)) / ((per - 1) * (n - 1))


def test_auto_on_many_nodes_keeps_hierarchical_to_its_latency_range():
    """auto's rules 2, 3 and 6 (auto_select.cc, docs/algorithms.md): on at most 2 nodes (or an
    unknown count) recursive doubling up to 8 KiB and hierarchical above, at every size; on more,
    halving-doubling up to 8 KiB or hierarchical's crossover with it, whichever is larger,
    hierarchical from there up to ranks x 4 KiB (before MPI's own), the ring above."""

    def pick(nbytes, ranks, nodes):
        return zcoll.choose_algorithm(nbytes, ranks, shared_memory=False, node_hierarchy=True, nodes=nodes)

    for nodes in (0, 2):
        assert pick(64 << 20, 8 if nodes else 4, nodes) == "hierarchical"
        assert pick(4096, 8 if nodes else 4, nodes) == "recursive_doubling"
    for ranks, nodes in ((64, 8), (256, 32), (1024, 128)):
        limit = ranks * 4096
        cross = hierarchical_crossover(ranks, nodes)
        assert pick(limit, ranks, nodes) == "hierarchical", (ranks, nodes)
        assert pick(limit + 4, ranks, nodes) == "ring", (ranks, nodes)
        assert pick(4096, ranks, nodes) == "halving_doubling", (ranks, nodes)
        assert pick(max(math.ceil(cross), 8192) + 4, ranks, nodes) == "hierarchical", (
            "not MPI's: its edge is a one-node one"
        )
        if cross > 8192:
            assert pick(math.floor(cross) - 4, ranks, nodes) == "halving_doubling", (ranks, nodes)
    # the simulated cells (docs/scale.md): hierarchical fastest at 16 KiB on 64 ranks and 64 KiB on
    # 256, halving-doubling at 64 KiB on 1,024 (hierarchical 1.89x its time), hierarchical at 256
    # KiB there (halving-doubling 1.54x its time on the 2:1 tree)
    assert pick(16384, 64, 8) == "hierarchical"
    assert pick(65536, 256, 32) == "hierarchical"
    assert pick(65536, 1024, 128) == "halving_doubling"
    assert pick(256 << 10, 1024, 128) == "hierarchical"
    assert pick(1 << 20, 1024, 128) == "hierarchical"
    # a measured ring order still beats rank order's ring where hierarchical does not apply
    many = zcoll.choose_algorithm(
        16 << 20, 64, shared_memory=False, node_hierarchy=True, nodes=8, ordered_ring_gain=4.0
    )
    assert many == "ordered_ring"


def test_auto_costs_the_small_sizes_at_a_slow_nodes_links():
    """Rules 2-3 with a slow node (slow_node_factor f, from the probe): halving-doubling only up
    to 8 KiB / f or hierarchical's crossover at the slow node's links (S* / f), hierarchical from
    there. One node's links 4x slower on 8 nodes of 8 (docs/scale.md, star_slow_node): S* 5.3
    -> 1.3 KiB, so 4 KiB runs hierarchical (halving-doubling took 1.33-1.40x its time there);
    never recursive doubling from 3 nodes. f <= 1 (a healthy fabric) or unknown changes nothing."""

    def pick(nbytes, ranks, nodes, factor):
        return zcoll.choose_algorithm(
            nbytes, ranks, shared_memory=False, node_hierarchy=True, nodes=nodes, slow_node_factor=factor
        )

    for ranks, nodes in ((64, 8), (256, 32), (1024, 128)):
        for nbytes in (1024, 4096, 8192, 65536, 1 << 20, 16 << 20):
            want = pick(nbytes, ranks, nodes, 0.0)
            assert pick(nbytes, ranks, nodes, 1.0) == want, (ranks, nbytes)
            assert pick(nbytes, ranks, nodes, 0.5) == want, "a factor below 1 is a healthy fabric"
    assert pick(4096, 64, 8, 4.0) == "hierarchical"
    assert pick(2048, 64, 8, 4.0) == "halving_doubling", "8 KiB / 4"
    assert pick(2052, 64, 8, 4.0) == "hierarchical"
    assert pick(4096, 64, 8, 1.5) == "halving_doubling", "8 KiB / 1.5 is still above 4 KiB"
    for factor in (2.0, 4.0, 16.0):
        for nbytes in (64, 4096, 8192):
            assert pick(nbytes, 24, 3, factor) != "recursive_doubling", (factor, nbytes)
    # above 8 KiB the crossover with halving-doubling falls by the factor: 1,024 ranks, 64 KiB
    assert pick(65536, 1024, 128, 1.0) == "halving_doubling"
    assert pick(65536, 1024, 128, 4.0) == "hierarchical"
    assert pick(1 << 20, 64, 8, 4.0) == "ring", "the ring's side of rule 3 is unchanged"


def test_auto_on_two_nodes_reads_the_node_link_ratio():
    """Rule 6 (auto_select.cc): on 2 equal nodes (or an unknown count) hierarchical at every size
    above MPI's range while the measured node/link bandwidth ratio is unknown (0) or at least 2,
    the ring (or a measured ring order's) below 2: the simulated platform's 20 / 12.5 GB/s = 1.6
    made hierarchical 1.08-1.18x the ring's time on 2 nodes x 8 (docs/scale.md). From 3 nodes on
    the ratio changes nothing (rule 3 and the ring decide there)."""

    def pick(nbytes, ranks, nodes, ratio, gain=1.0):
        return zcoll.choose_algorithm(
            nbytes,
            ranks,
            shared_memory=False,
            node_hierarchy=True,
            nodes=nodes,
            ordered_ring_gain=gain,
            node_link_ratio=ratio,
        )

    for nodes, ranks in ((2, 16), (2, 4), (0, 4)):
        for nbytes in (256 << 10, 1 << 20, 16 << 20, 256 << 20):
            assert pick(nbytes, ranks, nodes, 0.0) == "hierarchical", "unknown: the test bed's choice"
            assert pick(nbytes, ranks, nodes, 2.0) == "hierarchical"
            assert pick(nbytes, ranks, nodes, 50.0) == "hierarchical", "shared memory >> 1 Gbit/s"
            assert pick(nbytes, ranks, nodes, 1.6) == "ring", (nodes, ranks, nbytes)
            assert pick(nbytes, ranks, nodes, 1.99) == "ring"
            assert pick(nbytes, ranks, nodes, 1.6, gain=4.0) == "ordered_ring"
        # below rule 6, the ratio changes nothing
        assert pick(4096, ranks, nodes, 1.6) == pick(4096, ranks, nodes, 0.0) == "recursive_doubling"
        assert pick(65536, ranks, nodes, 1.6) == pick(65536, ranks, nodes, 0.0) == "mpi"
    for ranks, nodes in ((64, 8), (256, 32), (1024, 128)):
        for nbytes in (4096, 65536, 256 << 10, 1 << 20, 16 << 20):
            assert pick(nbytes, ranks, nodes, 1.6) == pick(nbytes, ranks, nodes, 0.0), (ranks, nbytes)
    # the documented signature still answers without the new keyword
    assert (
        zcoll.choose_algorithm(1 << 20, 16, shared_memory=False, node_hierarchy=True, nodes=2)
        == "hierarchical"
    )
