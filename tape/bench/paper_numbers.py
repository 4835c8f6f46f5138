"""The paper's efficiency numbers (tape-spec E.5), shown beside ours and always labelled as the paper's."""

from __future__ import annotations

# Table 3: 155M model, batch 1, sequence 1024. FLOPs and MACs in 1e9, parameters in 2^20.
TABLE3: dict[str, dict[str, float]] = {
    "tape": {"gflops": 365.65, "gmacs": 180.69, "params_2p20": 155.33},
    "rope": {"gflops": 321.10, "gmacs": 160.46, "params_2p20": 154.89},
    "fire": {"gflops": 331.97, "gmacs": 165.69, "params_2p20": 154.90},
    "t5": {"gflops": 321.10, "gmacs": 160.46, "params_2p20": 154.90},
}

# Table 4: attention-operator time per step (s) and throughput (it/s), averaged over 100 steps
# on one A100 (sizes not disclosed; tape-spec C.2). FIRE and T5 without flash attention.
TABLE4: dict[str, dict[str, float]] = {
    "tape_fused": {"time_s": 2.56e-4, "it_per_s": 3910},
    "tape_unfused": {"time_s": 5.63e-4, "it_per_s": 1775},
    "rope": {"time_s": 2.08e-4, "it_per_s": 4810},
    "fire": {"time_s": 5.56e-4, "it_per_s": 1799},
    "t5": {"time_s": 6.90e-4, "it_per_s": 1449},
}
