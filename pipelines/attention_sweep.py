"""The attention operator by sequence length, forward and forward+backward (tape/bench/sweep.py):
``python -m pipelines.attention_sweep --device cuda [--out DIR]`` writes DIR/sweep.json and
DIR/sweep.md (default runs/benchmark/sweep/<time>/); a step of ``make gpu-measure``."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from tape.bench.sweep import SweepSettings, markdown, sweep


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    d = SweepSettings()
    p = argparse.ArgumentParser(prog="python -m pipelines.attention_sweep", description=__doc__)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU unless given")
    p.add_argument("--seq-lens", type=int, nargs="+", default=d.seq_lens)
    p.add_argument("--tokens", type=int, default=d.tokens, help="tokens a call (batch = tokens / N)")
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--n-heads", type=int, default=d.n_heads)
    p.add_argument("--variants", nargs="+", default=d.variants)
    p.add_argument("--bias-max-len", type=int, default=d.bias_max_len)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--repeats", type=int, default=d.repeats)
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype or ("bfloat16" if device.type == "cuda" else "float32"))
    settings = SweepSettings(seq_lens=args.seq_lens, tokens=args.tokens, d_model=args.d_model, n_heads=args.n_heads,
                             variants=args.variants, bias_max_len=args.bias_max_len, warmup=args.warmup,
                             repeats=args.repeats)
    out = args.out or Path("runs/benchmark/sweep") / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "pipelines.attention_sweep", *argv])

    def write(result: dict) -> None:  # after every length: a run cut off keeps what it measured
        (out / "sweep.json").write_text(json.dumps({"command": command, **result}, indent=1) + "\n")
        (out / "sweep.md").write_text(markdown(result, command) + "\n")
        print(f"wrote {out}/sweep.json and sweep.md ({len(result['rows'])} length(s))", flush=True)

    result = sweep(settings, device, dtype, log=lambda m: print(m, flush=True), on_length=write)
    print(markdown(result, command), flush=True)  # the log keeps the tables if the files are lost
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
