"""Fresh-process probe: build one variant's training step, warm it up, then measure the peak
RSS of one step (``python -m tape.bench.rss_probe '<json spec>'``; prints one JSON line)."""

from __future__ import annotations

import json
import sys

import torch

from tape.bench.memory import rss_step_peak
from tape.bench.train_step import TrainStep
from tape.model import ModelConfig


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    autocast = getattr(torch, spec["autocast"]) if spec.get("autocast") else None  # e.g. "bfloat16"
    step = TrainStep(ModelConfig.from_dict(spec["model"]), spec["batch"], spec["seq_len"],
                     torch.device("cpu"), autocast=autocast, seed=spec.get("seed", 0))
    for _ in range(max(1, int(spec.get("warmup", 1)))):  # AdamW allocates its state on step 1
        step()
    print(json.dumps(rss_step_peak(step)))


if __name__ == "__main__":
    main(sys.argv[1:])
