"""Context extension (tape-spec B, D.3; the paper's Table 2 and Fig. 3) end to end:
``python -m pipelines.train experiment=context_extension/cpu``.

Pretrains (or loads) a RoPE Llama at context C, extends it to ``extend.context`` with each
named recipe of ``extend.recipes`` (tape = the official TAPE variant, tape_mix, lora, longlora,
theta; ``recipes.<name>`` gives the base recipe and its options), then evaluates the base and
every recipe on rank 0: perplexity per corpus and length (LongLoRA protocol), passkey
accuracy per length and, given ``eval.multiple_choice_dir``, MMLU / ARC accuracy. Every training
stage is a Lightning fit with the ``trainer`` preset (see stages.py). The run directory
runs/<experiment>/llama/<seed>/<time>-<id>/ gets config.yaml, command.txt, metrics.json (flat,
with each stage's wall time), perplexity.csv, passkey.csv, multiple_choice.csv (with MMLU / ARC),
tables.md and passkey.png. Trained models live in ``models_dir`` and are reused by later runs
with identical settings.

Unlike the other tasks this one runs several fits, so it sets ``runs_itself`` and
``pipelines.train`` hands it the whole run (``run(cfg)``). checks.py holds the config checks
(no Lightning or transformers, so a typo reports in seconds), runner.py the run, stages.py the
fits and the evaluation, data.py the corpora and report.py the tables and figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from pipelines.tasks import register
from pipelines.tasks.base import Task
from pipelines.tasks.context_extension.checks import validate
from pipelines.tasks.context_extension.data import heldout_files, trained_tokenizer


def run(cfg: DictConfig) -> dict[str, Any]:
    """The whole run (runner.py; imported here, so a config check loads no Lightning)."""
    from pipelines.tasks.context_extension.runner import run as run_stages

    return run_stages(cfg)


@register("context_extension")
class ContextExtension(Task):
    """Pretrain (or load) a base Llama, extend its context with each recipe, evaluate them all."""

    runs_itself = True
    validate = staticmethod(validate)
    run = staticmethod(run)

    def trained_tokenizer(self, run_cfg: DictConfig) -> str:
        return trained_tokenizer(run_cfg)

    def heldout_files(self, run_cfg: DictConfig, out_dir: Path) -> dict[str, str]:
        return heldout_files(run_cfg)
