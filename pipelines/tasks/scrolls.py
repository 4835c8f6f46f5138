"""SCROLLS fine-tuning from a pretrained run, generation and the official-style scoring
(tape-spec D.2, paper Table 1). One run = one SCROLLS dataset (``task.dataset``).

``task.pretrained_run`` names a finished ``pipelines.train`` pretraining run (its directory, or
``last`` = the newest finished run of ``task.pretrain_experiment`` with this PE and seed trained as
that preset is, not a claim arm beside it; without one, the newest, with a warning). The
fine-tuning model adopts that run's model and PE config (only ``max_seq_len`` becomes
``task.lengths.seq_len``), starts from its ``checkpoints/last.ckpt`` and uses its tokenizer.
Data come from ``task.data_dir`` (local JSONL) or the hub (``tau/scrolls``); with neither, the run
fails at once with what to do. Evaluation generates on the validation split (greedy for QA/NLI,
seeded sampling for summaries, as the paper), writes ``predictions.json`` ({id: prediction}) and
``scores.json``, ``predictions_scored.jsonl`` (per example: prediction, references, score) and
returns the task's metric.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from pipelines.config_checks import require_packages
from pipelines.errors import PipelineConfigError, RunNotThereYet
from pipelines.models import model_config
from pipelines.presets import is_preset_run, preset_setting
from pipelines.result_files import Row, read_jsonl_rows
from pipelines.tasks import register
from pipelines.tasks.base import Task, WandbTable
from tape.data.scrolls import (
    TASKS, Lengths, ScrollsDataError, get_task, group_references, load_scrolls, prompt_ids,
    suffix_tokens, training_row,
)
from tape.metrics.scrolls import SCORE_KEY, compute_scores, score_file
from tape.model.generate import TopKTopPSampler, argmax_choice, greedy_generate
from tape.report.runs import Run, find_runs
from tape.report.settings import describe, differences

if TYPE_CHECKING:
    from tape.lightning import FineTuneDataModule

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- pretrained run
def _find_pretrained(cfg: DictConfig) -> Path:
    value = cfg.task.get("pretrained_run")
    if value in (None, ""):
        raise PipelineConfigError(
            "task.pretrained_run is not set: SCROLLS fine-tunes a pretrained model. Pass the run "
            "directory that `python -m pipelines.train experiment=pretrain/<scale> pe=<pe>` printed, "
            "or task.pretrained_run=last for the newest finished one with this pe and seed"
        )
    if value == "last":  # the run the report and the reproduction count as this PE's and seed's
        folder = f"{cfg.task.pretrain_experiment}/{cfg.pe.name}/{cfg.seed}"  # this PE's and seed's runs only
        pattern = f"{folder}/*/metrics.json"
        key = (str(cfg.task.pretrain_experiment), str(cfg.pe.name), int(cfg.seed))
        finished = sorted((r for r in find_runs(cfg.paths.runs_dir, under=folder)
                           if r.finished and (r.experiment, r.pe, r.seed) == key), key=lambda r: r.name)
        if not finished:
            raise RunNotThereYet(
                f"task.pretrained_run=last: no finished run matches {Path(cfg.paths.runs_dir) / pattern}; "
                f"pretrain first (python -m pipelines.train experiment={cfg.task.pretrain_experiment} "
                f"pe={cfg.pe.name} seed={cfg.seed})"
            )
        return _preset_run(finished, *key[:2]).path
    run = Path(str(value))
    for need in ("config.yaml", "checkpoints/last.ckpt", "metrics.json"):  # metrics.json: it finished
        if not (run / need).is_file():
            raise PipelineConfigError(f"task.pretrained_run={value}: {run / need} not found; pass "
                                      "the directory of a finished pretraining run")
    return run


def _preset_run(finished: Sequence[Run], experiment: str, pe: str) -> Run:
    """The newest of ``finished`` (oldest first) trained as the pretraining preset is, so a claim
    arm beside it (an ablation, a longer run) is not fine-tuned as the PE's model; without one,
    the newest run, with a warning naming how it differs."""
    fitting = [r for r in finished if is_preset_run(r.config(), experiment, pe)]
    if fitting:
        return fitting[-1]
    chosen = finished[-1]
    differs = describe(differences(chosen.config(), preset_setting(experiment, pe)))
    log.warning("task.pretrained_run=last: no run of %s pe=%s is the preset's setting; taking the newest, %s "
                "(%s)", experiment, pe, chosen.path, differs)
    return chosen


def prepare(cfg: DictConfig) -> None:
    """Adopt the pretrained run's model, PE and vocabulary (in place, before validation)."""
    run = _find_pretrained(cfg)
    run_cfg = OmegaConf.load(run / "config.yaml")
    if run_cfg.task.name != "pretrain":
        raise PipelineConfigError(f"task.pretrained_run={run} is a {run_cfg.task.name!r} run, not pretraining")
    if run_cfg.pe.name != cfg.pe.name:
        raise PipelineConfigError(
            f"task.pretrained_run={run} was pretrained with pe={run_cfg.pe.name}; pass "
            f"pe={run_cfg.pe.name} (run directories are named by PE)"
        )
    seq_len = int(cfg.task.lengths.seq_len)
    with open_dict(cfg):
        cfg.task.pretrained_run = str(run)
        cfg.task.pretrained = run_cfg.task  # how to rebuild the tokenizer at evaluation
        cfg.task.vocab_size = int(run_cfg.task.vocab_size)
        cfg.pe = run_cfg.pe
        # the architecture is the pretrained run's; gradient checkpointing is this run's choice
        recompute = bool(cfg.model.get("gradient_checkpointing", False))
        cfg.model = OmegaConf.merge(run_cfg.model, {"max_seq_len": seq_len,
                                                    "gradient_checkpointing": recompute})
        # RandPE's range grows to the fine-tuning length when that is longer (as the paper's code)
        if cfg.model.get("randpe_max_position") and cfg.model.randpe_max_position < seq_len:
            cfg.model.randpe_max_position = seq_len


def initialize(model: torch.nn.Module, cfg: DictConfig) -> None:
    """Load the pretrained weights (every tensor must match: same model, same PE)."""
    ckpt = Path(cfg.task.pretrained_run) / "checkpoints" / "last.ckpt"
    try:
        state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    except Exception as err:  # truncated or foreign file
        raise PipelineConfigError(f"task.pretrained_run: cannot read {ckpt} ({err})") from err
    weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    model.load_state_dict(weights, strict=True)


# ---------------------------------------------------------------------------- tokenizer
class TokenizerView:
    """encode / decode / bos / eos / pad of the pretrained run's tokenizer."""

    def __init__(self, pretrain_task: DictConfig) -> None:
        if pretrain_task.corpus == "books":
            from tape.data.text import prepare_text_data

            tok = prepare_text_data(pretrain_task.data_dir, int(pretrain_task.vocab_size),
                                    int(pretrain_task.heldout_percent)).tokenizer()
            self.encode: Callable[[str], list[int]] = tok.encode
            self.decode: Callable[[Sequence[int]], str] = tok.decode
            self.bos_id, self.eos_id, self.pad_id = tok.bos_id, tok.eos_id, tok.pad_id
        else:
            from pipelines.tasks.pretrain import hf_tokenizer

            tok = hf_tokenizer(pretrain_task)
            self.encode = lambda text: tok.encode(text, add_special_tokens=False)
            self.decode = lambda ids: tok.decode(ids, skip_special_tokens=True)
            self.bos_id, self.eos_id = tok.bos_token_id, tok.eos_token_id
            self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def lengths_for(t: DictConfig, tok: TokenizerView) -> Lengths:
    """task.lengths, with summary_tail null = the instruction's length under this tokenizer."""
    values = OmegaConf.to_container(t.lengths, resolve=True)
    if values.get("summary_tail") is None:
        values["summary_tail"] = suffix_tokens(tok.encode)
    try:
        return Lengths(**values)
    except ValueError as err:
        raise PipelineConfigError(f"task.lengths: {err}") from err


# ---------------------------------------------------------------------------- task interface
def validate(cfg: DictConfig) -> None:
    t = cfg.task
    if t.dataset not in TASKS:
        raise PipelineConfigError(f"task.dataset={t.dataset!r}; choose one of {list(TASKS)}")
    for key in ("batch_size", "val_rows"):
        if int(t[key]) < 1:
            raise PipelineConfigError(f"task.{key}={t[key]} must be >= 1")
    values = {k: v for k, v in OmegaConf.to_container(t.lengths, resolve=True).items() if v is not None}
    try:
        Lengths(**values)
    except ValueError as err:
        raise PipelineConfigError(f"task.lengths: {err}") from err
    model_config(cfg)  # the adopted model must still be a valid one
    require_packages(f"task=scrolls task.dataset={t.dataset}",
                     "datasets", *(("rouge_score",) if TASKS[t.dataset].metric == "rouge" else ()))


def _load(t: DictConfig, splits: Sequence[str]) -> Any:
    try:
        return load_scrolls(t.dataset, t.data_dir or None, splits)
    except ScrollsDataError as err:
        raise PipelineConfigError(str(err)) from err


def _rows(data: Any, t: DictConfig, tok: TokenizerView, lengths: Lengths, limit: int | None) -> list[dict]:
    rows = []
    for row in data:
        if row["output"] is None:
            continue
        rows.append(training_row(t.dataset, row["input"], row["output"], tok.encode, bos_id=tok.bos_id,
                                 eos_id=tok.eos_id, pad_id=tok.pad_id, lengths=lengths,
                                 answer_prefix=t.answer_prefix))
        if limit is not None and len(rows) >= limit:
            break
    return rows


def datamodule(cfg: DictConfig) -> FineTuneDataModule:
    from tape.lightning import FineTuneDataModule  # Lightning: after the checks

    t = cfg.task
    data = _load(t, ("train", "validation"))
    tok = TokenizerView(t.pretrained)
    lengths = lengths_for(t, tok)
    return FineTuneDataModule(
        _rows(data["train"], t, tok, lengths, t.get("max_train_rows")),
        _rows(data["validation"], t, tok, lengths, int(t.val_rows)),
        batch_size=int(t.batch_size), seed=cfg.seed, vocab_size=int(t.vocab_size),
    )


@torch.no_grad()
def predict(model: Any, t: DictConfig, tok: TokenizerView, lengths: Lengths, examples: Sequence[Any]) -> dict[str, str]:
    """{id: generated text}: greedy for QA/NLI, seeded top-k / top-p sampling for summaries."""
    spec = get_task(t.dataset)
    max_new = lengths.summary_answer if spec.is_summary else lengths.qa_answer
    device = next(model.parameters()).device
    out: dict[str, str] = {}
    for i, ex in enumerate(examples):
        prompt = prompt_ids(spec, ex.input, tok.encode, tok.bos_id, lengths, generation=True)
        choose = argmax_choice
        if spec.generation.do_sample:
            choose = TopKTopPSampler(spec.generation.top_k, spec.generation.top_p, seed=int(t.eval_seed) + i)
        ids = torch.tensor([prompt], device=device)
        new = greedy_generate(model, ids, max_new, eos_token_id=tok.eos_id, choose=choose)[0, len(prompt):]
        new = new.tolist()
        if tok.eos_id in new:
            new = new[: new.index(tok.eos_id)]
        out[ex.id] = tok.decode(new).strip()
    return out


def write_scored_predictions(predictions: dict[str, str], refs: dict[str, list[str]], metric: str,
                             path: Path) -> None:
    """One JSON line per example: id, prediction, references and its score (the task's metric in
    %, best over references), so a reader sees which examples a model gets right."""
    with open(path, "x") as f:
        for key, refs_i in refs.items():
            score = compute_scores(metric, [predictions[key]], [refs_i])[SCORE_KEY[metric]]
            f.write(json.dumps({"id": key, "prediction": predictions[key], "references": refs_i,
                                "score": score}, ensure_ascii=False) + "\n")


def predictions_rows(rows: list[Row], cfg: DictConfig) -> list[Row]:
    """SCROLLS predictions with their references joined one per line (a table cell is text)."""
    return [{**r, "references": "\n".join(r["references"])} for r in rows]


def evaluate(model: Any, task_cfg: DictConfig, out_dir: Path, title: str) -> dict[str, Any]:
    """Generate on validation -> predictions.json, scores.json, predictions_scored.jsonl; the
    metric for metrics.json."""
    t0 = time.perf_counter()
    t = task_cfg
    tok = TokenizerView(t.pretrained)
    lengths = lengths_for(t, tok)
    rows = list(_load(t, ("validation",))["validation"])
    examples = group_references(rows)
    if t.get("eval_examples"):
        examples = examples[: int(t.eval_examples)]
    refs = {ex.id: list(ex.outputs) for ex in examples}
    predictions = predict(model, t, tok, lengths, examples)
    pred_path = out_dir / "predictions.json"
    with open(pred_path, "x") as f:
        json.dump(predictions, f, indent=1, ensure_ascii=False)
    scores = score_file(t.dataset, pred_path, refs, out_dir / "scores.json")
    write_scored_predictions(predictions, refs, scores["metric"], out_dir / "predictions_scored.jsonl")
    metrics: dict[str, Any] = {"scrolls_task": t.dataset, "scrolls_metric": scores["metric"],
                               "num_examples": len(examples)}
    metrics.update({k.replace("/", "_"): v for k, v in scores.items()
                    if isinstance(v, float) and k != "mean_prediction_length_characters"})
    metrics["mean_prediction_chars"] = scores["mean_prediction_length_characters"]
    metrics["eval_time_s"] = time.perf_counter() - t0
    return metrics


@register("scrolls")
class Scrolls(Task):
    """SCROLLS fine-tuning of a pretrained run, scored generation."""

    wandb_tables = {"predictions_scored.jsonl": WandbTable("eval/predictions", read_jsonl_rows, predictions_rows)}
    prepare = staticmethod(prepare)
    prepare_reads_runs = True  # adopts task.pretrained_run's model and vocabulary
    initialize = staticmethod(initialize)
    validate = staticmethod(validate)
    datamodule = staticmethod(datamodule)
    evaluate = staticmethod(evaluate)

    def trained_tokenizer(self, run_cfg: DictConfig) -> str:
        """The pretrained run's tokenizer (fine-tuning keeps it)."""
        from pipelines.tasks import pretrain

        return pretrain.trained_tokenizer(run_cfg.task.pretrained)

    def heldout_files(self, run_cfg: DictConfig, out_dir: Path) -> dict[str, str]:
        """The pretrained run's held-out text."""
        from pipelines.tasks import pretrain

        return pretrain.heldout_files(run_cfg.task.pretrained, out_dir)
