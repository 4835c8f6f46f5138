"""The paper's numbers live in conf/paper_numbers.yaml alone: the claims quote them by key, the
report and the benchmark read them through tape.paper, and no Python module restates one."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from tape.paper import load_paper_numbers, paper_number
from tape.report.claim_registry import CLAIMS_FILE, load_claims

REPO = Path(__file__).resolve().parents[1]
DECIMAL = re.compile(r"(?<![\w.])\d+\.\d+(?![\w.])")  # 41.42, 132.0; not "A.7" or "2x"


def _floats(node: object) -> list[float]:
    if isinstance(node, dict):
        return [f for v in node.values() for f in _floats(v)]
    if isinstance(node, list):
        return [f for v in node for f in _floats(v)]
    return [node] if isinstance(node, float) else []


def test_every_entry_names_its_source_in_the_paper() -> None:
    for group, entries in load_paper_numbers().items():
        for name, entry in entries.items():
            assert entry.get("source"), f"{group}.{name}: no source"


def test_every_number_a_claim_quotes_is_the_data_files() -> None:
    """Each decimal number of a claim's `paper` text is one of the paper numbers it names, and
    each number it names is in its text."""
    for claim in load_claims().claims:
        quoted = {float(x) for x in DECIMAL.findall(claim.paper)}
        named = set(claim.paper_numbers.values())
        assert quoted == named, f"claim {claim.id}: its text quotes {sorted(quoted)}, paper_numbers {sorted(named)}"


def test_the_paper_effects_follow_from_the_data_file() -> None:
    """conf/claims.yaml's paper_effect deltas, recomputed from conf/paper_numbers.yaml as each
    claim's translation says."""
    fig2 = paper_number("addition.fig2.values")
    fig6 = paper_number("addition.fig6.values")
    table6 = paper_number("ablation.table6.values")
    symmetry = paper_number("ablation.table6_symmetry.values")
    width = paper_number("ablation.table7.values")
    table2 = paper_number("context_extension.table2.values")
    expected = {
        "C1": round((fig2["tape"] - fig2["rope"]) / 0.75, 1),  # whole-grid mean -> OOD cells (75 %)
        "C1g": round(fig2["tape"] - fig2["rope"], 1),  # the paper's own metric
        "C1y": round((fig6["tape_yarn"] - fig6["tape"]) / 0.75, 1),
        "C2": round(math.log(table6["tape"][0] / table6["neither"][0]), 4),  # perplexity -> nats
        "C2e": round(math.log(symmetry["tape"][0] / symmetry["neither"][0]), 4),
        "C2w": round(math.log(width["i48"][0] / width["i12"][0]), 4),  # the default 4H against H
        "C7": round(math.log(table2["tape"]["pg19"][3] / table2["lora"]["pg19"][3]), 4),  # 8,192 tokens
        "C7s": round(math.log(table2["tape"]["proof_pile"][3] / table2["lora"]["proof_pile"][3]), 4),
    }
    deltas = {c.id: c.paper_delta for c in load_claims().claims if c.paper_delta is not None}
    assert deltas == expected


def test_a_claim_naming_a_missing_paper_number_is_refused(tmp_path: Path) -> None:
    raw = yaml.safe_load(CLAIMS_FILE.read_text())
    raw["claims"][0]["paper_numbers"] = ["addition.fig9.values.tape"]
    bad = tmp_path / "claims.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ValueError, match=r"claim C1: paper_numbers: 'addition.fig9.values.tape': .*'fig9'"):
        load_claims(bad)


def test_no_python_module_restates_a_paper_number() -> None:
    numbers = _floats(load_paper_numbers())
    spelled = {f"{v:.2f}" for v in numbers if v >= 2} | {f"{v:.3f}" for v in numbers if v < 10}
    found = [(path.relative_to(REPO), s) for path in [*REPO.glob("tape/**/*.py"), *REPO.glob("pipelines/**/*.py")]
             for s in spelled if re.search(rf"(?<![\d.]){re.escape(s)}(?!\d)", path.read_text())]
    assert not found, f"paper numbers written in code (read them with tape.paper.paper_number): {found}"
