"""What ``pipelines.evaluate`` evaluates: a finished run or a Hugging Face model directory.

``open_run(run_dir, ckpt, stage)`` gives a :class:`RunSource` that loads the model and knows
what the text tasks (passkey, perplexity) need from the run: its training context, its
tokenizer and its held-out text. Three kinds of directory:

- a run of ``pipelines.train`` (config.yaml + checkpoints/): our DecoderLM, from a checkpoint;
- a context-extension run (config.yaml with ``task.name: context_extension``): one of the Hugging
  Face models it trained, chosen with ``stage=`` (base, tape, lora, ...; metrics.json lists them);
- a Hugging Face model directory (config.json: a Llama, a TAPE-converted Llama, a saved stage).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import nn

import tape.pe as pe_registry
from pipelines import tasks
from pipelines.checkpoints import load_checkpoint
from pipelines.errors import PipelineConfigError
from tape.model import ModelConfig

HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")


def find_checkpoint(run_dir: Path, which: str) -> Path:
    """``last`` / ``best`` (the best-*.ckpt ModelCheckpoint kept) / a path to a .ckpt file."""
    ckpt_dir = run_dir / "checkpoints"
    if which == "last":
        found = [ckpt_dir / "last.ckpt"]
    elif which == "best":
        found = sorted(ckpt_dir.glob("best-*.ckpt"))
    else:
        found = [Path(which)]
        if not _inside(found[0], run_dir):
            raise PipelineConfigError(
                f"ckpt={which} is not a checkpoint of run_dir={run_dir}, and its evaluation would be "
                f"filed as that run's; pass ckpt=last, ckpt=best or a .ckpt under {ckpt_dir}, or the "
                "run_dir of the run that wrote it"
            )
    found = [p for p in found if p.is_file()]
    if not found:
        raise PipelineConfigError(
            f"ckpt={which}: no such checkpoint in {ckpt_dir}; pass ckpt=last, ckpt=best or a "
            ".ckpt path (was the run trained with callbacks=default?)"
        )
    return found[-1]


def _inside(path: Path, folder: Path) -> bool:
    """``path`` lies under ``folder``, as written (a symlinked checkpoints/ counts) or resolved."""
    def written(p: Path) -> Path:
        return Path(os.path.normpath(p.absolute()))

    return written(path).is_relative_to(written(folder)) or path.resolve().is_relative_to(folder.resolve())


def checkpoint_model(values: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's model values in today's layout: the flat PE options of older checkpoints
    under ``pe_options``, and, with Abacus, the digit ids that checkpoints from before 2026-11-27
    left null (ModelConfig then read null as the addition vocabulary's digits)."""
    values = pe_registry.legacy_options(dict(values))
    if values.get("abacus") and values.get("abacus_digit_ids") is None:
        from tape.data.addition import DIGIT_IDS

        values["abacus_digit_ids"] = list(DIGIT_IDS)
    return values


def run_books(data_dir: str, vocab_size: int, heldout_percent: int = 10) -> Any:
    """The books corpus a run trained on (its tokenizer and token files), built if missing."""
    from tape.data.corpus import CorpusUnavailable
    from tape.data.text import prepare_text_data

    try:
        return prepare_text_data(data_dir, int(vocab_size), int(heldout_percent))
    except (CorpusUnavailable, FileNotFoundError) as err:
        raise PipelineConfigError(f"the run's books corpus: {err}") from None


@dataclass
class RunSource:
    """One model to evaluate and what its run knows about its text."""

    run_dir: Path
    run_cfg: DictConfig | None  # the run's config.yaml (None for a bare model directory)
    context: int  # training context (tokens)
    ckpt: Path | None = None  # our DecoderLM runs
    model_dir: Path | None = None  # Hugging Face models
    stage: str | None = None

    @property
    def task_name(self) -> str | None:
        return str(self.run_cfg.task.name) if self.run_cfg is not None else None

    @cached_property
    def _checkpoint(self) -> dict[str, Any]:
        """The Lightning checkpoint, read once (on the CPU); a file that is not one (truncated,
        damaged) fails with the same message as ``pipelines.train ckpt_path=...``."""
        return load_checkpoint(self.ckpt, "ckpt")

    def model_config(self) -> ModelConfig | None:
        """The DecoderLM's config (None for Hugging Face models), read from the checkpoint."""
        if self.ckpt is None:
            return None
        return ModelConfig.from_dict(checkpoint_model(self._checkpoint["hyper_parameters"]["model"]))

    def labels(self) -> dict[str, Any]:
        """Who was evaluated, for metrics.json."""
        out: dict[str, Any] = {"run_dir": str(self.run_dir)}
        if self.run_cfg is not None:
            c = self.run_cfg
            out.update(pe=c.pe.name, scale=c.scale, seed=c.seed, experiment=c.experiment_name)
        if self.stage is not None:
            out["stage"] = out["pe"] = self.stage
        if self.ckpt is not None:
            out["checkpoint"] = str(self.ckpt)
        if self.model_dir is not None:
            out["model_dir"] = str(self.model_dir)
            out.setdefault("pe", _hf_label(self.model_dir))
        return out

    # ------------------------------------------------------------------ model
    def load_model(self, device: str, dtype: str = "float32") -> tuple[nn.Module, dict[str, Any]]:
        """The model on ``device`` in eval mode, and facts about it (steps trained). ``dtype``
        is a Hugging Face model's; a run's checkpoint loads float32 (precision= sets autocast)."""
        from tape.hf_names import DTYPES

        if dtype not in DTYPES:
            raise PipelineConfigError(f"dtype={dtype}: choose one of {list(DTYPES)}")
        if self.ckpt is not None and dtype != "float32":
            raise PipelineConfigError(f"dtype={dtype}: a run's checkpoint evaluates in float32 weights; "
                                      "choose its autocast with precision=bf16-mixed or 16-mixed instead")
        if self.ckpt is not None:
            from tape.lightning import CausalLMModule

            state = self._checkpoint
            del self.__dict__["_checkpoint"]  # the weights live in the model from here on
            hparams = state["hyper_parameters"]
            module = CausalLMModule(**{**hparams, "model": checkpoint_model(hparams["model"])})
            module.load_state_dict(state["state_dict"])
            return module.model.to(device).eval(), {"steps": int(state["global_step"])}
        from transformers import AutoModelForCausalLM

        import tape.hf  # noqa: F401 - registers TAPE models with AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(self.model_dir), dtype=DTYPES[dtype])
        return model.to(device).eval(), {}

    # ------------------------------------------------------------------ text
    def tokenizer_path(self) -> str:
        """The tokenizer the run trained with: our BPE's tokenizer.json or an HF directory."""
        c = self.run_cfg
        if c is not None and (path := tasks.get(self.task_name).trained_tokenizer(c)) is not None:
            return path
        if self.model_dir is not None and any((self.model_dir / f).is_file() for f in HF_TOKENIZER_FILES):
            return str(self.model_dir)
        what = f"a {self.task_name} run" if c is not None else f"{self.run_dir} (no tokenizer files)"
        raise PipelineConfigError(
            f"task.tokenizer is not set and {what} has no text tokenizer; pass "
            "task.tokenizer=<tokenizer.json of our BPE, or a Hugging Face tokenizer directory>"
        )

    def heldout_corpora(self, out_dir: Path) -> dict[str, str]:
        """Token files (uint16) of the run's held-out text, by corpus name. A streamed corpus's
        held-out tokens are written once into ``out_dir``."""
        c = self.run_cfg
        if c is not None and (files := tasks.get(self.task_name).heldout_files(c, out_dir)) is not None:
            return files
        raise PipelineConfigError(
            f"task.corpora is not set and {self.run_dir} has no held-out text of its own; pass "
            "+task.corpora.<name>=<path to a uint16 token file> (LongLoRA's pg19/test.bin, or "
            "np.array(ids, dtype=np.uint16).tofile(path))"
        )


def _hf_label(model_dir: Path) -> str:
    config = json.loads((model_dir / "config.json").read_text())
    return "tape" if "TapeLlamaForCausalLM" in (config.get("architectures") or []) else str(
        config.get("model_type", "hf"))


def _hf_context(model_dir: Path) -> int:
    config = json.loads((model_dir / "config.json").read_text())
    factor = float((config.get("rope_parameters") or config.get("rope_scaling") or {}).get("factor") or 1.0)
    return int(config.get("max_position_embeddings", 0) * factor)


def _extension_stage(run_dir: Path, run_cfg: DictConfig, stage: str | None) -> RunSource:
    metrics_path = run_dir / "metrics.json"
    metrics = json.loads(metrics_path.read_text()) if metrics_path.is_file() else {}
    stages = {k.removesuffix("_model"): v for k, v in metrics.items()
              if k.endswith("_model") and isinstance(v, str)}
    if stage is None or stage not in stages:
        raise PipelineConfigError(
            f"stage={stage}: {run_dir} is a context-extension run; choose the model to evaluate "
            f"with stage=<one of {sorted(stages) or 'none finished (metrics.json missing)'}>"
        )
    model_dir = Path(stages[stage])
    if not (model_dir / "config.json").is_file():
        raise PipelineConfigError(f"stage={stage}: its model {model_dir} is gone (config.json missing)")
    context = int(run_cfg.model.context if stage == "base" else run_cfg.extend.context)
    return RunSource(run_dir, run_cfg, context, model_dir=model_dir, stage=stage)


def open_run(run_dir: Path, ckpt: str = "last", stage: str | None = None) -> RunSource:
    """The model of ``run_dir`` (see the module docstring); a clear error when there is none."""
    if (run_dir / "config.yaml").is_file():
        run_cfg = OmegaConf.load(run_dir / "config.yaml")
        if run_cfg.task.name == "context_extension":
            return _extension_stage(run_dir, run_cfg, stage)
        if stage is not None:
            raise PipelineConfigError(f"stage={stage}: only context-extension runs have stages; "
                                      f"{run_dir} is a {run_cfg.task.name} run: drop stage=")
        return RunSource(run_dir, run_cfg, int(run_cfg.model.max_seq_len),
                         ckpt=find_checkpoint(run_dir, str(ckpt)))
    if (run_dir / "config.json").is_file():
        return RunSource(run_dir, None, _hf_context(run_dir), model_dir=run_dir)
    raise PipelineConfigError(
        f"run_dir={run_dir}: neither a run (config.yaml) nor a Hugging Face model (config.json) "
        "is there; pass the directory that pipelines.train printed as 'run dir: ...', or a "
        "saved model directory"
    )
