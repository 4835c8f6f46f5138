"""Efficiency benchmark entry point: ``python -m pipelines.benchmark [device=cuda scale=paper]``.

Composes conf/benchmark.yaml, runs ``tape.bench.run_benchmark`` and writes
``<output_dir>/efficiency.md`` and ``efficiency.json`` with the machine, versions and command.
``output_dir`` defaults to runs/benchmark/<scale>/; only the reproduction (pipelines/reproduce.py)
copies a run into results/.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig, OmegaConf

from tape.bench import BenchSettings, OpSettings, TrainSettings, run_benchmark
from tape.bench.run import ALL_PES
from pipelines.result_files import keep_earlier
from tape.vcs import git_state
from tape.bench.render import default_notes, render_markdown

REPO = Path(__file__).resolve().parents[1]


def settings_from_config(cfg: DictConfig) -> BenchSettings:
    """The scale preset with the top-level overrides applied, as plain dataclasses."""
    from tape.model.attention import BACKENDS

    if cfg.scale not in cfg.scales:
        raise ValueError(f"scale={cfg.scale!r}; choose one of {list(cfg.scales)}")
    if cfg.backend not in BACKENDS:  # checked here, not after the first tables have run
        raise ValueError(f"backend={cfg.backend!r}; choose one of {list(BACKENDS)}")

    preset = OmegaConf.to_container(cfg.scales[cfg.scale], resolve=True)
    op, train = dict(preset["op"]), dict(preset["train"])
    for key, least in (("warmup", 0), ("repeats", 1)):
        if cfg[key] is not None:
            op[key] = train[key] = _count(cfg, key, least)
    threads = None if cfg.threads is None else _count(cfg, "threads", 1)
    if cfg.rss is not None and not isinstance(cfg.rss, bool):
        raise ValueError(f"rss={cfg.rss!r}; choose true, false or null (the preset's)")
    return BenchSettings(
        device=str(cfg.device), scale=str(cfg.scale),
        pes=list(ALL_PES) if cfg.pes == "all" else [cfg.pes] if isinstance(cfg.pes, str) else list(cfg.pes),
        tape_modes=list(cfg.tape_modes), backend=str(cfg.backend),
        dtype=str(cfg.dtype), op=OpSettings(**op), train=TrainSettings(**train),
        rss=bool(preset.get("rss", False) if cfg.rss is None else cfg.rss),
        table3_batch=int(cfg.table3.batch), table3_seq_len=int(cfg.table3.seq_len),
        seed=_count(cfg, "seed", 0), threads=threads,
    )


def _count(cfg: DictConfig, key: str, least: int) -> int:
    """An integer setting of at least ``least``, or a ValueError naming it."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{key}={value!r}: give an integer >= {least}")
    return value


def command_line(overrides: list[str]) -> str:
    """The command that reproduces this run."""
    return " ".join(["python -m pipelines.benchmark", *(shlex.quote(o) for o in overrides)])


def write_outputs(result: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    """efficiency.json (everything) and efficiency.md (the tables and notes); an earlier pair
    there is kept, renamed efficiency-<its time>.{json,md}."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / "efficiency.md", out_dir / "efficiency.json"
    keep_earlier([js, md])
    js.write_text(json.dumps(result, indent=1, sort_keys=False) + "\n")
    md.write_text(render_markdown(result, default_notes(result)))
    return md, js


def run(cfg: DictConfig, overrides: list[str]) -> dict[str, Any]:
    """Run the benchmark described by ``cfg`` and write its files; returns the result dict."""
    settings = settings_from_config(cfg)
    if Path(cfg.output_dir).exists() and not Path(cfg.output_dir).is_dir():
        raise ValueError(f"output_dir={cfg.output_dir} is a file; give a directory")
    result = {
        "command": command_line(overrides),
        "argv": list(sys.argv),
        "created_utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "git": git_state(REPO),
    }
    result.update(run_benchmark(settings, log=lambda msg: print(f"[benchmark] {msg}", flush=True)))
    md, js = write_outputs(result, Path(cfg.output_dir))
    print(f"[benchmark] wrote {md} and {js}")
    return result


@hydra.main(version_base="1.3", config_path="../conf", config_name="benchmark")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    try:
        run(cfg, list(HydraConfig.get().overrides.task))
    except ValueError as err:  # a setting the benchmark refuses: one line (HYDRA_FULL_ERROR=1: the trace)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"pipelines.benchmark: {err}")


if __name__ == "__main__":
    main()
