"""The training-step profile (tape/bench/step_profile.py) on CPU at a tiny shape."""

from __future__ import annotations

import json

import pytest

from tape.bench import step_profile


def test_busy_time_is_the_union_of_kernel_intervals() -> None:
    assert step_profile._busy_us([(0, 10), (5, 12), (20, 25)]) == 17  # overlap counted once, gap not
    assert step_profile._busy_us([(3, 4)]) == 1 and step_profile._busy_us([]) == 0


def test_a_cpu_profile_counts_operators_and_tapes_extra_work(capsys: pytest.CaptureFixture) -> None:
    assert step_profile.main(["--device", "cpu", "--batches", "1,2", "--seq-len", "16"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["device"] == "cpu" and set(out) == {"device", "seq_len", "batch_1", "batch_2"}
    for batch in ("batch_1", "batch_2"):
        rows = out[batch]
        assert set(rows) == set(step_profile.VARIANTS)
        assert all(row["wall_ms"] > 0 for row in rows.values())
        # TAPE's per-layer maps dispatch more operators than RoPE's rotation alone
        assert rows["tape_fused"]["ops_per_step"] > rows["rope"]["ops_per_step"] > 0
        assert rows["tape_fused"]["ops_per_step_vs_rope"] == pytest.approx(
            rows["tape_fused"]["ops_per_step"] / rows["rope"]["ops_per_step"])
