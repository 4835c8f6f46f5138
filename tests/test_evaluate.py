"""pipelines.evaluate on finished runs: the run's own evaluation, task=passkey / task=perplexity on
a pretraining run and on Hugging Face Llama directories (a TAPE one included), a missing
run_dir, RandPE's trained range, printing and logging the metrics, and the device choice."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from conftest import INVENTED_VOCAB, compose_config
from pipelines import evaluate as evaluate_mod
from pipelines.errors import PipelineConfigError
from pipelines.evaluate import evaluate, resolve_device, run_dir_problem
from pipelines.train import train
from tape.data.text import TextData
from warm_python import run_module

REPO = Path(__file__).resolve().parents[1]


def run_eval(run: Path, *overrides: str, name: str = "e") -> dict:
    cfg = compose_config("evaluate", [f"run_dir={run}", *overrides])
    with open_dict(cfg):
        cfg.paths.output_dir = str(run / "eval" / name)
    return evaluate(cfg)


def finished_run(runs: Path, *overrides: str) -> Path:
    """Train a smoke preset with a CSV logger into runs/<experiment>/<pe>/0/run."""
    cfg = compose_config("config", [*overrides, "logger=csv", "callbacks.rich_progress_bar=null",
                                    "+trainer.enable_progress_bar=false"])
    with open_dict(cfg):
        cfg.paths.runs_dir = str(runs)
        cfg.paths.output_dir = str(runs / cfg.experiment_name / cfg.pe.name / "0" / "run")
    train(cfg)
    return Path(cfg.paths.output_dir)


@pytest.fixture(scope="module")
def pretrained(invented_text_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished tiny TAPE pretraining run (books BPE of the invented corpus)."""
    return finished_run(tmp_path_factory.mktemp("eval") / "runs", "experiment=pretrain/smoke", "pe=tape",
                        f"task.data_dir={invented_text_data}", f"task.vocab_size={INVENTED_VOCAB}",
                        "task.heldout_percent=20")


@pytest.fixture(scope="module")
def tokenizer_json(invented_text_data: Path) -> Path:
    return TextData(invented_text_data / f"books-bpe{INVENTED_VOCAB}-h20").tokenizer_path


def tiny_llama_dir(path: Path, tape: bool = False) -> Path:
    from transformers import LlamaConfig, LlamaForCausalLM

    from tape.hf import add_tape

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=INVENTED_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64))
    if tape:
        model = add_tape(model)
    model.save_pretrained(path)
    return path


# ---------------------------------------------------------------------------- run_dir
def test_missing_run_dir_is_one_line_naming_the_key_and_creates_nothing(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    for args in ([], [f"run_dir={tmp_path / 'nope'}"]):
        out = run_module("pipelines.evaluate", args, tmp_path, env, timeout=120)
        assert out.returncode != 0
        lines = out.stderr.strip().splitlines()
        assert len(lines) == 1 and "run_dir=" in lines[0], out.stderr[-2000:]
        assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []  # neither outputs/ nor nope/eval/...


def test_a_misspelt_key_or_device_is_named_with_the_fix_and_creates_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("seed: 0\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}
    for args, message in ((["task=passkey", "task.trails=3"], "unknown key task.trails; did you mean task.trials"),
                          (["devce=cpu"], "unknown key devce; did you mean device?")):
        out = run_module("pipelines.evaluate", [f"run_dir={run}", *args], tmp_path, env, timeout=120)
        assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
        assert "run_dir;" not in out.stderr  # a mandatory key given on the command line is known
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]  # no eval/ directory
    with pytest.raises(PipelineConfigError, match="device=gpu: choose auto, cpu, cuda or cuda:<index>"):
        resolve_device("gpu")
    assert resolve_device("cpu") == "cpu"


def test_run_dir_problem_names_the_key() -> None:
    assert "run_dir=" in run_dir_problem(["task=passkey"])
    assert "run_dir=/no/such/dir" in run_dir_problem(["run_dir=/no/such/dir"])


# ---------------------------------------------------------------------------- addition runs
@pytest.fixture(scope="module")
def randpe_addition(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished addition smoke run with RandPE: positions trained in [0, 32)."""
    return finished_run(tmp_path_factory.mktemp("add") / "runs", "experiment=addition/smoke", "pe=randpe")


def test_randpe_range_check_applies_to_reevaluation(randpe_addition: Path) -> None:
    # 40-digit operands need 3 * 40 + 4 = 124 positions; RandPE trained on [0, 2 * 16)
    with pytest.raises(PipelineConfigError, match=r"task\.eval_max_digits.*124|124.*task\.eval_max_digits"):
        run_eval(randpe_addition, "task.eval_max_digits=40", name="far")
    assert not (randpe_addition / "eval" / "far" / "metrics.json").exists()


@pytest.mark.parametrize("change, message", [
    ("stage=tape", "stage=tape: only context-extension runs have stages"),  # was ignored
    ("dtype=float99", r"dtype=float99: choose one of \['float32'"),  # was ignored
    ("dtype=bfloat16", "dtype=bfloat16: a run's checkpoint evaluates in float32 weights; choose its autocast"),
    ("task.examples_per_cell=abc", "task.examples_per_cell='abc' must be an integer"),
    ("task.eval_batch_size=0", "task.eval_batch_size=0 must be >= 1"),
    ("task.eval_seed=-3", "task.eval_seed=-3 must be >= 0"),
    ("+task.trials=3", r"task.trials: the run's task \(addition\) has no such setting; its settings are batch_size"),
])
def test_a_bad_change_to_the_runs_evaluation_is_named_before_its_dir_is_claimed(
        randpe_addition: Path, change: str, message: str) -> None:
    """They failed inside the evaluation with tracebacks (or, for another task's key, were
    ignored), each after <run>/eval/<id>/ was claimed."""
    with pytest.raises(PipelineConfigError, match=message):
        run_eval(randpe_addition, change, name="bad")
    assert not (randpe_addition / "eval" / "bad").exists()


def test_a_grid_beyond_the_abacus_table_is_refused_before_the_eval_dir_is_claimed(tmp_path: Path) -> None:
    """Re-evaluated past model.abacus_max_index, the addition evaluation refused only after
    <run>/eval/<id>/ was claimed."""
    run = finished_run(tmp_path / "runs", "experiment=addition/smoke", "model.abacus=true",
                       "model.abacus_max_index=8", "model.abacus_max_offset=0", "trainer.max_steps=2", "trainer.val_check_interval=2")
    with pytest.raises(PipelineConfigError, match=r"task.eval_max_digits=9 gives answers of 10 digits: "
                                                  r"Abacus index 10 > model.abacus_max_index=8"):
        run_eval(run, "task.eval_max_digits=9", "task.examples_per_cell=1", name="wide")
    assert not (run / "eval" / "wide").exists()


def test_the_evaluations_preflight_leaves_paths_runs_dir_alone(randpe_addition: Path, tmp_path: Path) -> None:
    """It created an empty ./runs (paths.runs_dir) that an evaluation never writes to."""
    from pipelines.preflight import preflight

    preflight("evaluate", [f"run_dir={randpe_addition}", f"paths.runs_dir={tmp_path / 'runs'}"])
    assert not (tmp_path / "runs").exists()


def test_reevaluation_prints_and_logs_its_metrics(randpe_addition: Path, capsys) -> None:
    own_csv = (randpe_addition / "csv" / "metrics.csv").read_text()
    metrics = run_eval(randpe_addition, "task.examples_per_cell=1", name="again")
    printed = capsys.readouterr().out
    assert "mean_accuracy" in printed and f"{metrics['mean_accuracy']:.6g}" in printed
    logged = list(csv.DictReader(open(randpe_addition / "eval" / "again" / "csv" / "metrics.csv")))
    assert float(logged[-1]["eval/mean_accuracy"]) == pytest.approx(metrics["mean_accuracy"])
    assert (randpe_addition / "csv" / "metrics.csv").read_text() == own_csv  # the run's log untouched
    assert metrics["device"] == "cpu"


@pytest.mark.wandb
def test_reevaluation_logs_to_wandb_named_after_the_run(randpe_addition: Path) -> None:
    """logger=wandb resolves the run's names (experiment, PE, seed) from the evaluated run."""
    from pipelines.wandb_log import close_loggers
    from wandb_records import offline_runs

    metrics = run_eval(randpe_addition, "task.examples_per_cell=1", "logger=wandb", name="wb")
    close_loggers()
    (run,) = offline_runs(randpe_addition / "eval" / "wb")
    assert run.name == "randpe-seed0" and run.summary["eval/mean_accuracy"] == pytest.approx(metrics["mean_accuracy"])


def test_the_gpu_is_used_when_there_is_one(randpe_addition: Path, monkeypatch) -> None:
    """The device decision with CUDA faked: the model is moved to cuda (the move is recorded, not
    made, so the evaluation still runs here on CPU tensors)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("tape.bench.machine.machine_summary", lambda: "faked GPU")  # it would query the GPU
    assert resolve_device("auto") == "cuda" and resolve_device("cpu") == "cpu"
    moved = []
    original = torch.nn.Module.to

    def record(self, *args, **kwargs):
        moved.extend(str(a) for a in args if isinstance(a, (str, torch.device)))
        return self

    monkeypatch.setattr(torch.nn.Module, "to", record)
    metrics = run_eval(randpe_addition, "task.examples_per_cell=1", "logger=none", "precision=32", name="gpu")
    assert "cuda" in moved and metrics["device"] == "cuda"
    monkeypatch.setattr(torch.nn.Module, "to", original)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(PipelineConfigError, match="device=cuda"):
        resolve_device("cuda")


def test_passkey_on_an_addition_run_asks_for_a_tokenizer(randpe_addition: Path) -> None:
    with pytest.raises(PipelineConfigError, match="task.tokenizer"):
        run_eval(randpe_addition, "task=passkey", name="pk")


def test_passkey_kv_cache_must_be_a_bool(pretrained: Path) -> None:
    """``task.kv_cache=no`` is the string 'no', which Python reads as true: cached decoding when
    the user asked for the paper's recomputation."""
    with pytest.raises(PipelineConfigError, match="task.kv_cache='no' must be true or false"):
        run_eval(pretrained, "task=passkey", "task.lengths=[256]", "task.kv_cache=no", name="pk-bad")
    assert not (pretrained / "eval" / "pk-bad").exists()


# ---------------------------------------------------------------------------- pretraining runs
def test_passkey_on_a_pretraining_run(pretrained: Path, capsys) -> None:
    metrics = run_eval(pretrained, "task=passkey", "task.lengths=[256,320]", "task.trials=3", name="pk")
    out = pretrained / "eval" / "pk"
    assert metrics["task"] == "passkey" and metrics["pe"] == "tape" and metrics["steps"] == 4
    assert {"passkey_256", "passkey_320", "passkey_mean"} <= set(metrics)
    assert all(0.0 <= metrics[k] <= 1.0 for k in ("passkey_256", "passkey_320"))
    rows = list(csv.DictReader(open(out / "passkey.csv")))
    assert [int(r["target_tokens"]) for r in rows] == [256, 320]
    assert all(int(r["max_tokens"]) <= int(r["target_tokens"]) for r in rows)  # BOS and answer included
    saved = OmegaConf.load(out / "config.yaml").task
    assert saved.tokenizer.endswith("tokenizer.json") and saved.draws == "official" and saved.bos
    assert "passkey_256" in capsys.readouterr().out
    logged = list(csv.DictReader(open(out / "csv" / "metrics.csv")))
    assert float(logged[-1]["eval/passkey_256"]) == pytest.approx(metrics["passkey_256"])


def multiple_choice_data(root: Path) -> Path:
    """Six MMLU items of two subjects (with a few-shot file) and three ARC-Easy items."""
    words = "the king and queen of the land".split()
    for name, n, subjects in (("mmlu/test", 6, ("anatomy", "philosophy")), ("mmlu/fewshot", 4, ("anatomy", "philosophy")),
                              ("arc_easy/test", 3, ("",))):
        path = root / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({
            "question": f"{words[i % 7]} of the {words[(i + 2) % 7]}?", "choices": [words[(i + j) % 7] for j in range(4)],
            "answer": i % 4, "subject": subjects[i % len(subjects)]}) + "\n" for i in range(n)))
    return root


def test_multiple_choice_on_a_pretraining_run(pretrained: Path, tmp_path: Path) -> None:
    data = multiple_choice_data(tmp_path / "mc")
    metrics = run_eval(pretrained, "task=multiple_choice", f"task.data_dir={data}", "task.benchmarks=[mmlu,arc_easy]",
                       "task.shots.mmlu=2", name="mc")
    out = pretrained / "eval" / "mc"
    rows = {(r["benchmark"], r["group"]): r for r in csv.DictReader(open(out / "multiple_choice.csv"))}
    assert set(rows) == {("mmlu", "stem"), ("mmlu", "humanities"), ("mmlu", "all"), ("arc_easy", "all")}
    items = [json.loads(line) for line in open(out / "multiple_choice_items.jsonl")]
    assert [i["benchmark"] for i in items] == ["mmlu"] * 6 + ["arc_easy"] * 3
    assert all(len(i["loglikelihoods"]) == 4 and max(i["loglikelihoods"]) < 0 for i in items)
    mmlu = [i["correct"] for i in items if i["benchmark"] == "mmlu"]
    assert float(rows["mmlu", "all"]["acc"]) == pytest.approx(100 * sum(mmlu) / 6) == metrics["mc_mmlu_acc"]
    assert int(rows["mmlu", "stem"]["items"]) == 3 and int(rows["mmlu", "all"]["shots"]) == 2
    assert {"mc_mmlu_stem_acc", "mc_mmlu_humanities_acc_norm", "mc_arc_easy_acc_norm"} <= set(metrics)
    assert OmegaConf.load(out / "config.yaml").task.tokenizer.endswith("tokenizer.json")


def test_multiple_choice_on_a_tape_llama_directory(tmp_path: Path, tokenizer_json: Path) -> None:
    model_dir = tiny_llama_dir(tmp_path / "model", tape=True)
    data = multiple_choice_data(tmp_path / "mc")
    with pytest.raises(PipelineConfigError, match="task.data_dir is not set"):
        run_eval(model_dir, "task=multiple_choice", f"task.tokenizer={tokenizer_json}", name="a")
    metrics = run_eval(model_dir, "task=multiple_choice", f"task.tokenizer={tokenizer_json}", f"task.data_dir={data}",
                       "task.benchmarks=[arc_easy]", name="b")
    assert metrics["pe"] == "tape" and 0.0 <= metrics["mc_arc_easy_acc"] <= 100.0


def test_perplexity_on_a_pretraining_run_reads_its_heldout_text(pretrained: Path) -> None:
    metrics = run_eval(pretrained, "task=perplexity", "task.max_windows=3", name="ppl")
    assert {"ppl_heldout_16", "ppl_heldout_32", "ppl_heldout_64"} <= set(metrics)  # 1x, 2x, 4x of 16
    assert all(1.0 < metrics[f"ppl_heldout_{n}"] < 5 * INVENTED_VOCAB for n in (16, 32, 64))
    rows = list(csv.DictReader(open(pretrained / "eval" / "ppl" / "perplexity.csv")))
    assert [int(r["windows"]) for r in rows] == [3, 3, 3]


def test_passkey_and_perplexity_refuse_pipelines_train(make_cfg) -> None:
    from pipelines import tasks

    for name in ("passkey", "perplexity"):
        with pytest.raises(PipelineConfigError, match="pipelines.evaluate run_dir="):
            tasks.get(name).validate(make_cfg(f"task={name}"))


# ---------------------------------------------------------------------------- Hugging Face models
@pytest.mark.parametrize("tape", [False, True], ids=["llama", "tape-llama"])
def test_passkey_and_perplexity_on_a_llama_directory(tape: bool, tmp_path: Path, tokenizer_json: Path) -> None:
    model_dir = tiny_llama_dir(tmp_path / "model", tape=tape)
    tokens = tmp_path / "test.bin"
    np.random.default_rng(0).integers(3, INVENTED_VOCAB, 64 + 2 * 256, dtype=np.uint16).tofile(tokens)
    pk = run_eval(model_dir, "task=passkey", f"task.tokenizer={tokenizer_json}", "task.lengths=[256]",
                  "task.trials=2", name="pk")
    assert pk["pe"] == ("tape" if tape else "llama") and 0.0 <= pk["passkey_256"] <= 1.0
    ppl = run_eval(model_dir, "task=perplexity", f"+task.corpora.test={tokens}", "task.lengths=[64]",
                   name="ppl")
    rows = list(csv.DictReader(open(model_dir / "eval" / "ppl" / "perplexity.csv")))
    assert int(rows[0]["windows"]) == 2  # range(0, 576 - 64, 256)
    assert 1.0 < ppl["ppl_test_64"] < 5 * INVENTED_VOCAB
    assert json.loads((model_dir / "eval" / "ppl" / "metrics.json").read_text())["model_dir"] == str(model_dir)


def test_a_missing_tokenizer_or_corpus_is_named(tmp_path: Path) -> None:
    model_dir = tiny_llama_dir(tmp_path / "model")  # no tokenizer files, no held-out text
    with pytest.raises(PipelineConfigError, match="task.tokenizer is not set"):
        run_eval(model_dir, "task=passkey", name="a")
    with pytest.raises(PipelineConfigError, match="task.tokenizer=/no/tokenizer"):
        run_eval(model_dir, "task=passkey", "task.tokenizer=/no/tokenizer", "task.lengths=[256]", name="b")
    with pytest.raises(PipelineConfigError, match="task.corpora"):
        run_eval(model_dir, "task=perplexity", name="c")
    with pytest.raises(PipelineConfigError, match="task=passkey, task=perplexity or task=multiple_choice"):
        run_eval(model_dir, name="d")  # a bare model has no evaluation of its own


def test_a_context_extension_run_evaluates_the_chosen_stage(tmp_path: Path, tokenizer_json: Path) -> None:
    run = tmp_path / "runs/context_extension/smoke/llama/0/run"
    run.mkdir(parents=True)
    model_dir = tiny_llama_dir(tmp_path / "models" / "tape-abc", tape=True)
    # the fields of a context-extension run's config.yaml that pipelines.evaluate reads
    cfg = {"experiment_name": "context_extension/smoke", "scale": "smoke", "seed": 0,
           "task": {"name": "context_extension"}, "pe": {"name": "llama"},
           "model": {"context": 128, "pretrained_path": None}, "extend": {"context": 256},
           "data": {"source": "books", "data_dir": "unused", "vocab_size": INVENTED_VOCAB, "eval_files": {}},
           "logger": {"csv": {"_target_": "lightning.pytorch.loggers.CSVLogger", "save_dir": str(run),
                              "name": "csv", "version": ""}}}
    (run / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(cfg)))
    (run / "metrics.json").write_text(json.dumps({"base_model": str(tmp_path / "models/base"),
                                                  "tape_model": str(model_dir)}))
    with pytest.raises(PipelineConfigError, match=r"stage=None.*base.*tape"):
        run_eval(run, "task=passkey", name="a")
    metrics = run_eval(run, "stage=tape", "task=passkey", f"task.tokenizer={tokenizer_json}",
                       "task.trials=1", name="b")
    assert metrics["stage"] == "tape" and metrics["model_dir"] == str(model_dir)
    assert set(k for k in metrics if k.startswith("passkey_") and k[8:].isdigit()) == {"passkey_256", "passkey_512"}
    assert (run / "eval" / "b" / "csv" / "metrics.csv").is_file()  # the run's CSV logger, in the eval dir
    assert not (run / "csv").exists()  # never into the run's own files


def test_every_trial_prompt_fits_its_token_length(tokenizer_json: Path) -> None:
    """Fillers were sized on 8 prompts of another draw rule than the evaluation's 20: a 192-token
    point held a 193-token prompt (the books BPE), and a RandPE run at 192 positions failed."""
    from pipelines.tasks import passkey
    from tape.data.passkey import MAX_KEY, passkey_prompt
    from tape.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(tokenizer_json))
    task = compose_config("evaluate", ["run_dir=x", "task=passkey"]).task
    with open_dict(task):
        task.lengths = list(range(256, 1025, 16))  # this small BPE: 222 tokens without filler
    answer = len(tok.encode(str(task.answer_prefix) + str(MAX_KEY)))
    for target, n_garbage in passkey.sizes(task, tok, bos=True):
        longest = max(len(tok.encode(passkey_prompt(n_garbage, s, task.draws).text))
                      for s in passkey.trial_seeds(task)) + 1 + answer
        assert longest <= target, (target, n_garbage)


def test_paper_passkey_sizes_are_in_the_task_config() -> None:
    from tape.data.passkey import PAPER_FILLER_CHARS

    task = OmegaConf.load(REPO / "conf/task/passkey.yaml")
    task.filler_chars = "${.paper_filler_chars}"  # what the paper preset sets
    assert tuple(task.filler_chars) == PAPER_FILLER_CHARS
    assert evaluate_mod.RERUN_KEYS == tuple(OmegaConf.load(REPO / "conf/evaluate.yaml").task)


def test_evaluation_precision_follows_the_request() -> None:
    """auto: bf16 autocast on a GPU, fp32 on a CPU; a training precision maps to its autocast."""
    import contextlib
    import warnings

    from pipelines.precision import eval_autocast

    assert isinstance(eval_autocast("cpu", "auto"), contextlib.nullcontext)
    assert isinstance(eval_autocast("cuda", "32-true"), contextlib.nullcontext)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the context is only inspected
        on_gpu = eval_autocast("cuda", "auto")
    assert (on_gpu.device, on_gpu.fast_dtype) == ("cuda", torch.bfloat16)
    with eval_autocast("cpu", "bf16-mixed"):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    with pytest.raises(PipelineConfigError, match="precision=bf16: choose"):
        eval_autocast("cpu", "bf16")
    with pytest.raises(PipelineConfigError, match="precision=64: choose"):  # would evaluate fp32 weights
        eval_autocast("cpu", "64")


def test_reevaluation_defaults_to_the_precision_the_run_evaluated_at(tmp_path: Path) -> None:
    """A run that evaluated under bf16 autocast was re-evaluated in fp32 by default on a CPU (and
    a 32-true run in bf16 on a GPU): another number than its metrics.json (review)."""
    run = finished_run(tmp_path / "runs", "experiment=addition/smoke", "eval_precision=bf16-mixed")
    own = json.loads((run / "metrics.json").read_text())
    again = run_eval(run, "logger=none", name="default")
    assert again["precision"] == "bf16-mixed"
    assert again["digit_accuracy"] == pytest.approx(own["digit_accuracy"])
    assert run_eval(run, "logger=none", "precision=32", name="fp32")["precision"] == "32"
    assert evaluate_mod.run_precision("auto", None, "cuda") == "bf16-mixed"  # a model directory
    assert evaluate_mod.run_precision("auto", None, "cpu") == "32"


def test_a_bad_precision_is_refused_before_the_eval_dir_is_claimed(pretrained: Path) -> None:
    with pytest.raises(PipelineConfigError, match="precision=fp8: choose"):
        run_eval(pretrained, "precision=fp8", name="fp8")
    assert not (pretrained / "eval" / "fp8").exists()  # it was claimed, then refused


def test_passkey_with_default_lengths_works_and_a_too_short_length_names_the_fix(pretrained: Path) -> None:
    """Issue 23: the documented `pipelines.evaluate run_dir=<pretrain run> task=passkey` ran into
    "needs 101 tokens > 64" at the run's own context; the defaults now start at 128 tokens."""
    metrics = run_eval(pretrained, "task=passkey", "task.trials=1", name="defaults")
    assert {"passkey_256", "passkey_512"} <= set(metrics)  # this tiny BPE needs 222 tokens a prompt
    with pytest.raises(PipelineConfigError, match=r"give longer prompts, e\.g\. task\.lengths=\[256,512\]"):
        run_eval(pretrained, "task=passkey", "task.lengths=[64]", name="short")
    assert not (pretrained / "eval" / "short").exists()  # refused before the directory was claimed


def test_a_truncated_checkpoint_is_refused_like_train_does_and_leaves_nothing(pretrained: Path) -> None:
    ckpt = pretrained / "checkpoints" / "last.ckpt"
    broken = pretrained / "checkpoints" / "truncated.ckpt"
    broken.write_bytes(ckpt.read_bytes()[:4096])
    try:
        with pytest.raises(PipelineConfigError, match="is not a readable Lightning checkpoint"):
            run_eval(pretrained, f"ckpt={broken}", name="broken")
    finally:
        broken.unlink()
    assert not (pretrained / "eval" / "broken").exists()


def test_another_runs_checkpoint_is_not_filed_as_this_runs_evaluation(pretrained: Path, tmp_path: Path) -> None:
    """An addition checkpoint evaluated with a flip-flop run_dir gave read errors of 100, written
    into that run's eval/ as its own evaluation (and into its record)."""
    loose = tmp_path / "elsewhere.ckpt"
    loose.write_bytes((pretrained / "checkpoints" / "last.ckpt").read_bytes())
    with pytest.raises(PipelineConfigError, match=r"ckpt=.*elsewhere\.ckpt is not a checkpoint of run_dir="):
        run_eval(pretrained, f"ckpt={loose}", name="loose")
    assert not (pretrained / "eval" / "loose").exists()
    linked = tmp_path / "linked-run"  # a run whose checkpoints/ is a link elsewhere is still its own
    linked.mkdir()
    for name in ("config.yaml", "metrics.json"):
        (linked / name).write_bytes((pretrained / name).read_bytes())
    (linked / "checkpoints").symlink_to(pretrained / "checkpoints")
    assert run_eval(linked, f"ckpt={linked / 'checkpoints' / 'last.ckpt'}", name="linked")["steps"] > 0


def test_perplexity_names_its_protocol_and_reproduces_the_runs_own_number(pretrained: Path) -> None:
    """Issue 23: task=perplexity gave 90.35 where the run logged 91.12, unexplained: the paper's
    protocol scores every window, the run's own evaluation eval_max_windows of them."""
    own = json.loads((pretrained / "metrics.json").read_text())
    run_cfg = OmegaConf.load(pretrained / "config.yaml")
    length, windows, stride = (int(run_cfg.task[k]) for k in ("seq_len", "eval_max_windows", "eval_stride"))
    every = run_eval(pretrained, "task=perplexity", name="all-windows")
    assert f"the run's own ppl_<m>x used {windows} evenly spread windows at stride {stride}" in every["protocol"]
    same = run_eval(pretrained, "task=perplexity", f"task.max_windows={windows}", f"task.stride={stride}",
                    name="same")
    assert "protocol" not in same
    assert same[f"ppl_heldout_{length}"] == pytest.approx(own["ppl_1x"], rel=1e-6)


def test_a_sweep_evaluates_into_the_runs_eval_dir_and_a_failure_leaves_nothing(
        randpe_addition: Path, tmp_path: Path) -> None:
    """`-m` wrote whole evaluations into ./multirun/ of the current directory, after running the
    jobs before a bad value; a failed evaluation left an empty eval/ in a run outside runs/."""
    run = tmp_path / "elsewhere" / "run"
    shutil.copytree(randpe_addition, run, ignore=shutil.ignore_patterns("eval"))
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1"}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return run_module("pipelines.evaluate", [f"run_dir={run}", "logger=csv", *args], cwd, env)

    out = cli("task.examples_per_cell=-1")
    assert out.returncode != 0 and "task.examples_per_cell=-1 must be >= 1" in out.stderr
    assert not (run / "eval").exists()
    for sweep in ("task.examples_per_cell=1,-2", "precision=32,64"):
        out = cli("-m", sweep)
        assert out.returncode != 0 and "1 of the sweep's 2 jobs would fail their checks, so none was started" in out.stderr
        assert not (run / "eval").exists() and not any(cwd.iterdir())
    out = cli("-m", "task.examples_per_cell=1,2")
    assert out.returncode == 0, out.stderr[-2000:]
    evals = sorted((run / "eval").iterdir())
    assert [p.name[-2:] for p in evals] == ["-0", "-1"] and all((p / "metrics.json").is_file() for p in evals)
    assert [p.name for p in cwd.iterdir()] == ["runs"]  # runs/multirun/<time>-<id>/multirun.yaml only
    assert [p.name for p in (cwd / "runs" / "multirun").iterdir()][0] and not list(cwd.glob("runs/multirun/*/*/"))


@pytest.mark.wandb
def test_wandb_online_without_a_login_is_refused_before_evaluating(randpe_addition: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """evaluate ran the evaluation, claimed its folder, then failed in W&B with two tracebacks."""
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no `wandb login`
    monkeypatch.setenv("WANDB_API_KEY", "")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    with pytest.raises(PipelineConfigError, match="logger=wandb_online needs a W&B login"):
        run_eval(randpe_addition, "logger=wandb_online", "task.examples_per_cell=1", name="online")
    assert not (randpe_addition / "eval" / "online").exists()


def test_an_evaluations_wandb_run_holds_its_config_tables_and_figures(randpe_addition: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The evaluation's offline W&B run had only its scalar metrics: no config, no grid, no heatmap."""
    pytest.importorskip("wandb")
    logged: dict[str, object] = {}
    monkeypatch.setattr(evaluate_mod.wandb_log, "log_config",
                        lambda loggers, cfg: logged.setdefault("config", OmegaConf.to_container(cfg)))
    monkeypatch.setattr(evaluate_mod.wandb_log, "log_results",
                        lambda loggers, run_dir, cfg, step: logged.setdefault("results", sorted(
                            evaluate_mod.wandb_log.result_tables(run_dir, cfg))))
    run_eval(randpe_addition, "logger=wandb", "task.examples_per_cell=1", name="wandb")
    config = logged["config"]
    assert config["task"]["name"] == "addition" and config["evaluated"]["pe"] == "randpe"
    assert config["evaluated"]["run_dir"] == str(randpe_addition) and logged["results"] == ["eval/grid"]
