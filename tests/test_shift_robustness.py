"""Table 8's measurements (tape/metrics/shift_robustness.py) and their table in the report."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from model_helpers import tiny_model
from tape.metrics.shift_robustness import attention_change, dot_product_change, shift_robustness
from tape.report.render import render
from test_report import make_run

IDS = torch.randint(1, 37, (2, 16), generator=torch.Generator().manual_seed(0))


def _layers(out: dict[str, float], kind: str) -> list[float]:
    return [v for k, v in sorted(out.items()) if k.startswith(kind)]


def test_attention_change_counts_the_mass_moved_onto_prepended_keys():
    before = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]]]])  # (1, 1, 2, 2)
    after = torch.zeros(1, 1, 3, 3)
    after[0, 0, 1:] = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.5, 0.5]])  # the text at positions 1, 2
    assert attention_change(before, after, prepended=1) == pytest.approx((0.4 + 0.0) / 2)


def test_dot_product_change_is_zero_for_the_same_rows_and_relative_otherwise():
    e = torch.randn(1, 2, 5, 4, generator=torch.Generator().manual_seed(1))
    assert dot_product_change(e, torch.cat([torch.randn(1, 2, 3, 4), e], dim=2), prepended=3) == 0.0
    assert dot_product_change(e, 2 * e, prepended=0) == pytest.approx(300.0)  # Gram x4: +300 %


@pytest.mark.parametrize("pe", ["rope", "tape"])
def test_a_shift_of_positions_moves_rope_and_tape_by_rounding_only(pe):
    out = shift_robustness(tiny_model(pe, n_layers=3), IDS, bos_id=0)
    assert max(_layers(out, "shift_attn_shift")) < 1e-5
    assert max(_layers(out, "shift_pe_shift")) < 1e-3  # % of the Gram matrix
    assert min(_layers(out, "shift_attn_add")) > 1e-2  # prepended tokens do move attention


def test_the_ablation_without_equivariance_moves_under_a_shift():
    out = shift_robustness(tiny_model("tape", n_layers=3, tape_equivariant=False), IDS, bos_id=0)
    assert max(_layers(out, "shift_pe_shift")) > 1e-3
    assert max(_layers(out, "shift_attn_shift")) > 1e-5


def test_tapes_e_moves_with_prepended_tokens_past_layer_one_ropes_does_not():
    rope = shift_robustness(tiny_model("rope", n_layers=3), IDS, bos_id=0)
    tape = shift_robustness(tiny_model("tape", n_layers=3), IDS, bos_id=0)
    assert max(_layers(rope, "shift_pe_add")) < 1e-3  # RoPE's table depends on i - j alone
    assert tape["shift_pe_add_layer1"] < 1e-3 < tape["shift_pe_add_layer3"]  # layer 1 is the RoPE table


def test_a_pe_without_rotation_reports_attention_only_and_the_backend_is_restored():
    model = tiny_model("alibi", n_layers=2)
    before = [b.attn.backend for b in model.layers]
    out = shift_robustness(model, IDS, bos_id=0)
    assert out and not any(k.startswith("shift_pe") for k in out)
    assert [b.attn.backend for b in model.layers] == before


def test_the_report_renders_table8_from_the_runs_that_measured_it(tmp_path: Path):
    runs = tmp_path / "runs"
    cfg = {"task": {"name": "pretrain", "seq_len": 64}}
    for seed in (0, 1):
        make_run(runs, "pretrain/cpu", "tape", seed, f"20261206-10000{seed}-aaaaaa-{seed}",
                 {"task": "pretrain", "ppl_1x": 90.0, "shift_attn_add_layer1": 0.05 + 0.01 * seed,
                  "shift_attn_shift_layer1": 0.0, "shift_pe_add_layer1": 1.0, "shift_pe_shift_layer1": 0.0}, cfg)
    make_run(runs, "pretrain/cpu", "rope", 0, "20261122-100000-aaaaaa-0",
             {"task": "pretrain", "ppl_1x": 91.0}, cfg)  # an older run: in the perplexity table only
    render(runs, tmp_path / "results")
    with open(tmp_path / "results/tables/pretrain_cpu_shift_attn.csv", newline="") as f:
        rows = {r["PE"]: r for r in csv.DictReader(f)}
    assert set(rows) == {"TAPE"} and rows["TAPE"]["seeds"] == "2"
    assert float(rows["TAPE"]["add L1"]) == pytest.approx(5.5)  # x 10^-2
    assert (tmp_path / "results/tables/pretrain_cpu_shift_pe.csv").is_file()
