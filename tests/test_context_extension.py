"""The context-extension experiment (pipelines.train experiment=context_extension/*): the smoke
preset end to end on an invented corpus, passkey training rows, the data/weights checks, the
presets, saving models."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import open_dict

pytest.importorskip("transformers")
from conftest import compose_config  # noqa: E402
from host_syncs import HostSyncs  # noqa: E402
from wandb_records import offline_runs  # noqa: E402
from pipelines.tasks.context_extension import run as extend, validate  # noqa: E402
from pipelines.tasks.context_extension.data import (  # noqa: E402
    ExtensionData, PackedRows, check_inputs, load_data, mixed_batches,
)
from pipelines.errors import PipelineConfigError  # noqa: E402
from pipelines.wandb_log import close_loggers  # noqa: E402
from tape.data.corpus import Document  # noqa: E402
from tape.data.passkey import FILLER, QUESTION, TASK, garbage_for_tokens, passkey_example, passkey_prompt  # noqa: E402
from tape.data.text import prepare_text_data  # noqa: E402
from tape.hf.io import build_llama, load_model, save_model  # noqa: E402
from tape.hf.recipes import RECIPES, apply_recipe  # noqa: E402
from tape.hf.loss import split_losses, weighted_loss  # noqa: E402
from tape.schedule import lr_factor  # noqa: E402
from warm_python import run_module  # noqa: E402

VOCAB = 512
NAMED = ["tape", "tape_mix", "lora", "longlora", "theta"]  # the presets' named recipes
WORDS = f"{TASK} {FILLER} {QUESTION} thou art the king of hills and seas".split()  # BPE learns the prompt's words


def invented(prefix: str, n: int, seed: int = 0) -> list[Document]:
    rng = random.Random(seed)
    return [Document(f"{prefix}/{i}", " ".join(rng.choice(WORDS) for _ in range(1500))) for i in range(n)]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> Path:
    """A prepared corpus (BPE of 512 tokens) of invented documents: no real corpus needed."""
    root = tmp_path_factory.mktemp("data")
    docs = {"books": invented("b", 30), "stdlib": invented("s", 3, seed=1)}
    prepare_text_data(root, vocab_size=VOCAB, load=docs.__getitem__)
    return root


def extend_cfg(tmp_path: Path, data_dir: Path, *overrides: str, name: str = "run"):
    cfg = compose_config("config", ["experiment=context_extension/smoke", "logger=none", *overrides])
    with open_dict(cfg):
        cfg.paths.root_dir = str(tmp_path)
        cfg.paths.runs_dir = str(tmp_path / "runs")
        cfg.paths.output_dir = str(tmp_path / "runs" / name)
        cfg.models_dir = str(tmp_path / "models")
        cfg.data.data_dir = str(data_dir)
        cfg.data.vocab_size = VOCAB
    return cfg


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path) as f:
        return list(csv.DictReader(f))


# ----------------------------------------------------------------------------- end to end
def test_smoke_preset_runs_every_recipe_then_reuses_the_models(tmp_path, data_dir):
    cfg = extend_cfg(tmp_path, data_dir, f"eval.multiple_choice_dir={arc_items(tmp_path / 'mc')}",
                     "eval.multiple_choice_benchmarks=[arc_easy]")
    metrics = extend(cfg)
    run = Path(cfg.paths.output_dir)
    for f in ("metrics.json", "perplexity.csv", "passkey.csv", "passkey.png", "tables.md", "config.yaml",
              "multiple_choice.csv", "multiple_choice_items.jsonl"):
        assert (run / f).is_file(), f
    assert json.loads((run / "metrics.json").read_text()) == pytest.approx(metrics)
    methods = ["base", *NAMED]
    ppl = _read_csv(run / "perplexity.csv")
    assert [(r["method"], r["corpus"], r["length"]) for r in ppl] == [
        (m, c, n) for m in methods for c in ("books", "stdlib") for n in ("32", "256")]
    assert all(1 < float(r["perplexity"]) < 10 * VOCAB for r in ppl)
    keys = _read_csv(run / "passkey.csv")
    assert [(r["method"], r["target_tokens"]) for r in keys] == [(m, n) for m in methods for n in ("128", "256")]
    assert all(float(r["mean_tokens"]) <= int(r["target_tokens"]) for r in keys)
    for recipe in NAMED:
        assert metrics[f"time_train_{recipe}_s"] > 0 and metrics[f"time_eval_{recipe}_s"] > 0
        assert not metrics[f"{recipe}_reused"] and metrics[f"{recipe}_steps"] == cfg.extend.steps
    assert 0 < metrics["lora_trainable_params"] == metrics["theta_trainable_params"] == metrics["longlora_trainable_params"]
    # the official TAPE leaves the post-attention map frozen at zero; tape_mix trains it
    assert 0 < metrics["tape_trainable_params"] < metrics["tape_mix_trainable_params"]
    assert "base_passkey_at_context" in metrics and isinstance(metrics["base_retrieves"], bool)
    assert metrics["base_steps"] == cfg.base.steps and "base_loss_passkey" in metrics
    assert [r["method"] for r in _read_csv(run / "multiple_choice.csv")] == methods
    assert len((run / "multiple_choice_items.jsonl").read_text().splitlines()) == 4 * len(methods)
    paired = (run / "tables.md").read_text().split("each model - base on the same items")[1]
    assert [line.split("|")[1].strip() for line in paired.splitlines() if line.startswith("| ")][1:] == NAMED

    again = extend(extend_cfg(tmp_path, data_dir, "logger=csv", name="again"))  # same settings: nothing trains
    assert again["base_reused"] and all(again[f"{r}_reused"] for r in NAMED)
    # ... and its loggers still get every stage's training curve, replayed from the saved models
    logged = _read_csv(tmp_path / "runs" / "again" / "csv" / "metrics.csv")
    for stage, steps in (("base", cfg.base.steps), *((r, cfg.extend.steps) for r in NAMED)):
        points = [(int(r["step"]), float(r[f"{stage}/loss"])) for r in logged if r.get(f"{stage}/loss")]
        assert points and points[-1][0] == steps and all(v > 0 for _, v in points), stage
    assert again["time_base_train_s"] == 0.0
    for k, v in metrics.items():  # the reused models evaluate to the same numbers
        if k.startswith(("ppl_", "passkey_")):
            assert again[k] == pytest.approx(v, rel=1e-5), k
    with pytest.raises(PipelineConfigError, match="already belongs"):
        extend(extend_cfg(tmp_path, data_dir, name="again"))  # a run directory is never reused


def test_maps_off_scores_the_tape_model_again_without_its_maps(tmp_path, data_dir, monkeypatch):
    """eval.maps_off=[tape]: the saved TAPE model is scored twice, the second time (method
    tape_maps_off) after switch_off_maps, whose effect tests/test_hf.py checks."""
    import pipelines.tasks.context_extension.runner as runner
    from tape.hf import TapeLlamaForCausalLM, switch_off_maps

    switched, loaded = [], []
    monkeypatch.setattr(runner, "switch_off_maps", lambda m: switched.append(m) or switch_off_maps(m))
    monkeypatch.setattr(runner, "load_model", lambda path, *a: loaded.append(path) or load_model(path, *a))
    cfg = extend_cfg(tmp_path, data_dir, "extend.recipes=[tape]", "eval.maps_off=[tape]")
    metrics = extend(cfg)
    assert len(switched) == 1 and isinstance(switched[0], TapeLlamaForCausalLM)
    assert [Path(p).name.split("-")[0] for p in loaded] == ["base", "tape"]  # each saved model loads once
    assert all(not p.any() for n, p in switched[0].named_parameters() if n.endswith("pe.w1.weight"))
    ppl = _read_csv(Path(cfg.paths.output_dir) / "perplexity.csv")
    assert list(dict.fromkeys(r["method"] for r in ppl)) == ["base", "tape", "tape_maps_off"]
    assert metrics["time_eval_tape_maps_off_s"] > 0 and "tape_maps_off_model" not in metrics
    assert {f"ppl_{c}_256_tape_maps_off" for c in ("books", "stdlib")} <= set(metrics)
    assert "passkey_256_tape_maps_off" in metrics


def arc_items(root: Path, n: int = 4) -> Path:
    """``n`` ARC-Easy items of invented words under root/arc_easy/test.jsonl."""
    (root / "arc_easy").mkdir(parents=True)
    (root / "arc_easy" / "test.jsonl").write_text("".join(
        json.dumps({"question": f"word {i}?", "choices": ["king", "queen", "land"], "answer": i % 3}) + "\n"
        for i in range(n)))
    return root


def test_base_only_run_sizes_the_base(tmp_path, data_dir):
    """extend.recipes=[] trains and evaluates the base alone (sizing it: does it retrieve at C?);
    its tables have no extended model to mark best. With eval.multiple_choice_dir, every model is
    also scored on those items (Table 9)."""
    items = arc_items(tmp_path / "mc")
    metrics = extend(extend_cfg(tmp_path, data_dir, "extend.recipes=[]", f"eval.multiple_choice_dir={items}",
                                "eval.multiple_choice_benchmarks=[arc_easy]", "eval.multiple_choice_max_items=3"))
    run = Path(tmp_path / "runs" / "run")
    assert {r["method"] for r in _read_csv(run / "passkey.csv")} == {"base"}
    assert "**" not in (run / "tables.md").read_text()
    assert "base_passkey_at_context" in metrics and not any(k.startswith("time_train_") for k in metrics)
    choice = _read_csv(run / "multiple_choice.csv")
    assert [(r["method"], r["benchmark"], r["group"], r["items"]) for r in choice] == [("base", "arc_easy", "all", "3")]
    assert metrics["mc_arc_easy_acc_base"] == pytest.approx(float(choice[0]["acc"]))
    assert "## MMLU / ARC accuracy" in (run / "tables.md").read_text()


def test_missing_multiple_choice_files_fail_before_the_run_dir(tmp_path, data_dir):
    cfg = extend_cfg(tmp_path, data_dir, f"eval.multiple_choice_dir={tmp_path / 'none'}")
    with pytest.raises(PipelineConfigError, match=r"eval.multiple_choice_dir=.*mmlu/test.jsonl not found"):
        extend(cfg)
    assert not Path(cfg.paths.output_dir).exists()


@pytest.mark.wandb
def test_smoke_in_bf16_mixed_with_fp16_frozen_weights(tmp_path, data_dir):
    """The paper preset's precision on CPU: bf16 autocast, frozen weights stored in fp16, LoRA
    merged into fp16 weights, TAPE saved beside them; evaluation stays finite."""
    cfg = extend_cfg(tmp_path, data_dir, "extend.recipes=[tape,lora]", "trainer.precision=bf16-mixed",
                     "model.frozen_dtype=float16", "logger=wandb")
    metrics = extend(cfg)
    close_loggers()  # what pipelines.train's task wrapper does after the run
    # W&B (offline) shows the experiment: the full resolved config, the tables and the figure.
    (run,) = offline_runs(Path(cfg.paths.output_dir))
    assert run.config["task"]["name"] == "context_extension" and run.config["extend"]["recipes"] == ["tape", "lora"]
    assert len(run.table("eval/perplexity")["data"]) == 12 and len(run.table("eval/passkey")["data"]) == 6
    assert run.image("eval/passkey_plot").read_bytes()[:4] == b"\x89PNG" and run.exit_code == 0
    ppl = [v for k, v in metrics.items() if k.startswith("ppl_")]
    assert len(ppl) == 12 and all(1 < v < 10 * VOCAB for v in ppl)
    model = load_model(metrics["tape_model"])  # fp32 on reload; trained in bf16-mixed
    assert type(model).__name__ == "TapeLlamaForCausalLM"
    assert json.loads((Path(metrics["lora_model"]) / "stage.json").read_text())["settings"]["frozen_dtype"] == "float16"


def _saved_after_recipe(base_dir: Path, out: Path, recipe: str, frozen: torch.dtype) -> tuple[dict, dict]:
    """(saved weights reloaded in fp32, fp32 reference of LoRA's merged q_proj) after ``recipe``
    with frozen weights in ``frozen`` and a LoRA update as training would leave it."""
    from pipelines.tasks.context_extension.stages import set_dtypes

    model = set_dtypes(apply_recipe(load_model(base_dir, frozen), recipe, target_context=64,
                                    original_context=32).train(), frozen)
    base = dict(load_model(base_dir, torch.float32).named_parameters())
    want, params = {}, dict(model.named_parameters())
    torch.manual_seed(1)
    with torch.no_grad():
        for name, p in params.items():
            if name.endswith("q_proj.lora_B.default.weight"):
                p.copy_(1e-3 * torch.randn_like(p))
                a = params[name.replace("lora_B", "lora_A")]
                key = name.removeprefix("base_model.model.").replace("lora_B.default.", "")
                want[key] = base[key] + 2.0 * p.float() @ a.float()  # alpha / r = 16 / 8
    save_model(model, out, {})
    return {n: p.detach() for n, p in load_model(out, torch.float32).named_parameters()}, want


def test_frozen_fp16_keeps_an_fp16_base_exactly_and_merges_lora_as_fp16(tmp_path):
    """The paper preset stored Llama-2's (fp16) frozen weights in bf16: every saved extended
    model was evaluated on bf16-rounded base weights beside the exact fp16 base, and LoRA merged
    into bf16 (10x the fp16 merge's rounding). fp16 storage keeps the base bit for bit."""
    assert compose_config("config", ["experiment=context_extension/paper"]).model.frozen_dtype == "float16"
    base_dir = tmp_path / "base"
    build_llama(64, 32, 64, 2, 2, 2, 32).half().save_pretrained(base_dir)  # as Llama-2-7b-hf ships
    base = dict(load_model(base_dir, torch.float32).named_parameters())
    q = "model.layers.0.self_attn.q_proj.weight"
    errors = {}
    for frozen in (torch.float16, torch.bfloat16):
        tape, _ = _saved_after_recipe(base_dir, tmp_path / f"tape-{frozen}", "tape", frozen)
        lora, want = _saved_after_recipe(base_dir, tmp_path / f"lora-{frozen}", "lora", frozen)
        errors[frozen] = (tape[q] - base[q]).abs().max().item(), (lora[q] - want[q]).pow(2).mean().sqrt().item()
    assert errors[torch.float16][0] == 0.0 and errors[torch.bfloat16][0] > 1e-5
    assert errors[torch.bfloat16][1] > 5 * errors[torch.float16][1]


# ----------------------------------------------------------------------------- passkey rows
def char_encode(text: str) -> list[int]:
    return [ord(c) % 250 + 3 for c in text]


def test_passkey_rows_are_seeded_fit_and_score_only_the_key():
    x, y = passkey_example(char_encode, 300, seed=7, seq_len=600, pad_id=0)
    x2, y2 = passkey_example(char_encode, 300, seed=7, seq_len=600, pad_id=0)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, passkey_example(char_encode, 300, seed=8, seq_len=600, pad_id=0)[0])
    prompt = passkey_prompt(300, 7)
    n_prompt, answer = len(char_encode(prompt.text)), char_encode(" " + str(prompt.key))
    scored = (y != -100).nonzero().flatten().tolist()
    assert scored == list(range(n_prompt, n_prompt + len(answer)))  # the key's tokens, nothing else
    assert y[scored].tolist() == answer and x[scored].tolist() == answer
    assert (x[n_prompt + len(answer):] == 0).all()  # right padding
    with pytest.raises(ValueError, match="does not fit"):
        passkey_example(char_encode, 300, seed=7, seq_len=n_prompt, pad_id=0)


def test_garbage_for_tokens_is_the_largest_filler_that_fits():
    n = garbage_for_tokens(char_encode, 500)
    longest = lambda g: max(len(char_encode(passkey_prompt(g, s).text)) for s in range(8)) + 6  # noqa: E731
    assert longest(n) <= 500 < longest(n + 16)
    with pytest.raises(ValueError, match="no filler"):
        garbage_for_tokens(char_encode, 50)


def test_mixed_batches_depend_on_seed_and_index_only():
    stream = torch.arange(5000) % 200
    data = ExtensionData(encode=char_encode, pad_id=0, vocab_size=256, eval_tokens={},
                         train_rows=lambda i, count, n, rng: torch.stack(
                             [stream[s: s + n] for s in rng.integers(0, 4400, count)]))
    batches = mixed_batches(data, seq_len=600, batch_size=4, passkey_rows=2, seed=3, garbage_range=(0, 200))
    a, b = batches(5), batches(5)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(batches(6)["input_ids"], a["input_ids"])
    assert a["passkey"].tolist() == [False, False, True, True]
    assert (a["labels"][:2] == a["input_ids"][:2]).all()  # text rows: every token a label
    assert ((a["labels"][2:] != -100).sum(1) <= 6).all()  # passkey rows: the key only


def test_hub_rows_are_the_eos_joined_documents_read_in_order():
    docs = ["ab", "c", "defgh", "ij"]
    rows = PackedRows(lambda: iter(docs), encode=lambda t: [ord(ch) for ch in t], eos_id=0)
    rng = np.random.default_rng(0)
    assert rows(0, 2, 3, rng).tolist() == [[97, 98, 0], [99, 0, 100]]  # batch 0: rows 0, 1
    assert rows(1, 2, 3, rng).tolist() == [[101, 102, 103], [104, 0, 105]]  # batch 1: rows 2, 3
    with pytest.raises(ValueError, match="packed into 3"):
        rows(2, 1, 4, rng)
    with pytest.raises(RuntimeError, match="ran out of documents"):
        rows(2, 2, 3, rng)  # only [106, 0] is left
    # the next stage starts again at batch 0 and gets the same rows as the first
    assert rows(0, 2, 3, rng).tolist() == [[97, 98, 0], [99, 0, 100]]


def test_hub_rows_skip_the_batches_of_other_ranks():
    rows = PackedRows(lambda: iter(["ab", "c", "defgh", "ij"]), encode=lambda t: [ord(ch) for ch in t], eos_id=0)
    rng = np.random.default_rng(0)
    assert rows(1, 1, 3, rng).tolist() == [[99, 0, 100]]  # rank 1 of 2: batches 1, 3, ...
    assert rows(3, 1, 3, rng).tolist() == [[104, 0, 105]]


def test_losses_average_text_and_passkey_tokens_separately():
    logits = torch.zeros(2, 3, 4)
    labels = torch.tensor([[1, 2, 3], [-100, -100, 1]])
    logits[0, 0, 2] = 5.0  # predicts the text row's first target well
    parts = split_losses(logits, labels, torch.tensor([False, True]))
    assert set(parts) == {"text", "passkey"}
    assert parts["passkey"].item() == pytest.approx(torch.log(torch.tensor(4.0)).item())
    assert parts["text"] < parts["passkey"]
    assert weighted_loss(parts, 2.0, logits).item() == pytest.approx((parts["text"] + 2 * parts["passkey"]).item())
    text_only = split_losses(logits, labels, None)  # no passkey rows: every scored token is text
    assert set(text_only) == {"text"} and weighted_loss(text_only, 2.0, logits) == text_only["text"]
    nll = torch.nn.functional.cross_entropy(logits[0, :2], labels[0, 1:])  # the text row's mean
    assert parts["text"].item() == pytest.approx(nll.item())
    assert lr_factor(0, 10, 100, "constant") == pytest.approx(0.1) and lr_factor(50, 10, 100, "constant") == 1.0
    assert lr_factor(100, 10, 100, "cosine", 0.1) == pytest.approx(0.1)


def test_the_split_loss_waits_for_no_gpu_when_the_parts_are_known() -> None:
    """``mask.any()`` and ``nll[mask]`` made every context-extension step wait for the GPU; the
    module finds the scored parts on the host before the batch moves (issue 21.7)."""
    from tape.hf.loss import scored_parts
    from tape.lightning import HFCausalLMModule

    logits = torch.randn(2, 3, 4, requires_grad=True)
    labels = torch.tensor([[1, 2, 3], [-100, -100, 1]])
    passkey = torch.tensor([False, True])
    batch = HFCausalLMModule.on_before_batch_transfer(None, {"labels": labels, "passkey": passkey}, 0)
    assert batch["scored_parts"] == scored_parts(labels, passkey) == ("text", "passkey")
    with HostSyncs() as syncs:
        parts = split_losses(logits, labels, passkey, batch["scored_parts"])
        weighted_loss(parts, 1.0, logits).backward()
    assert syncs.found == [] and set(parts) == {"text", "passkey"}


# ----------------------------------------------------------------------------- checks and presets
def test_presets_compose_cpu_is_the_default_and_validates(tmp_path):
    default = compose_config("config", ["experiment=context_extension/cpu"])
    assert default.experiment_name == "context_extension/cpu"
    validate(default)
    assert default.extend.recipes == NAMED and default.extend.context == 2 * default.model.context
    paper = compose_config("config", ["experiment=context_extension/paper"])
    assert (paper.extend.context, paper.extend.steps, paper.extend.lr, paper.extend.warmup_steps) == (8192, 1000, 2e-5, 50)
    assert paper.extend.batch_size * paper.extend.grad_accum == 64 and paper.data.source == "hub"
    # bf16 autocast with fp32 trainables; the official TAPE (row-sum post map frozen at zero)
    # and the corrected one (mixing post map, trained) side by side
    assert (paper.trainer.precision, paper.model.frozen_dtype) == ("bf16-mixed", "float16")
    assert paper.eval.dtype == "float16"  # the paper evaluated in fp16 (tape-spec D.3)
    validate_precision = compose_config("config", ["experiment=context_extension/paper", "trainer=fsdp"])
    with pytest.raises(PipelineConfigError, match="trainer=fsdp shards units of one dtype"):
        validate(validate_precision)
    for preset in (default, paper):
        assert preset.extend.recipes == NAMED
        assert dict(preset.recipes.tape) == {"recipe": "tape", "train_post_attn": False,
                                             "tape_options": {"post_attn": "rowsum"}}
        assert dict(preset.recipes.tape_mix) == {"recipe": "tape", "train_post_attn": True,
                                                 "tape_options": {"post_attn": "mix"}}


@pytest.mark.datasets
def test_paper_preset_fails_at_once_naming_weights_then_data(tmp_path, monkeypatch):
    cfg = compose_config("config", ["experiment=context_extension/paper"])
    with pytest.raises(PipelineConfigError, match=r"model\.pretrained_path.*hf download"):
        validate(cfg)
    with open_dict(cfg):
        cfg.model.pretrained_path = str(tmp_path / "nowhere")
    with pytest.raises(PipelineConfigError, match=r"model\.pretrained_path=.*nowhere"):
        validate(cfg)
    (tmp_path / "llama").mkdir()
    (tmp_path / "llama" / "config.json").write_text("{}")
    with open_dict(cfg):
        cfg.model.pretrained_path = str(tmp_path / "llama")
    with pytest.raises(PipelineConfigError, match=r"data\.eval_files\.pg19.*LongLoRA"):
        validate(cfg)
    for name in ("pg19", "proof_pile"):
        (tmp_path / f"{name}.bin").write_bytes(b"\0\0" * 10)
        with open_dict(cfg):
            cfg.data.eval_files[name] = str(tmp_path / f"{name}.bin")
    check_inputs(cfg)  # everything local is there; the training data is next
    with pytest.raises(PipelineConfigError, match=r"data\.hub_dataset=togethercomputer/RedPajama"):
        load_data(cfg)  # HF_HUB_OFFLINE=1 (conftest): fails at once, no network touched


@pytest.mark.datasets
def test_a_local_copy_of_the_hub_dataset_reads_offline(tmp_path):
    """The offline error told the user to point data.hub_dataset at a local copy, then refused
    it: the hub's reachability was checked before the name."""
    from pipelines.tasks.context_extension.data import _hub_documents

    copy = tmp_path / "redpajama"
    copy.mkdir()
    (copy / "train.jsonl").write_text("".join(json.dumps({"text": f"doc {i}"}) + "\n" for i in range(3)))
    cfg = compose_config("config", ["experiment=context_extension/paper", f"data.hub_dataset={copy}"])
    assert list(_hub_documents(cfg)) == ["doc 0", "doc 1", "doc 2"]  # HF_HUB_OFFLINE=1 (conftest)


def test_a_misnamed_books_split_names_its_key(tmp_path, data_dir):
    cfg = extend_cfg(tmp_path, data_dir, "data.eval_files.books=books_test")
    with pytest.raises(PipelineConfigError, match=r"data\.eval_files\.books=books_test: .*choose one of"):
        load_data(cfg)


def test_a_pretrained_model_is_not_fed_the_books_bpe(tmp_path):
    """A Llama of another vocabulary was extended on books-BPE ids, silently (or, smaller than
    the BPE, failed with an IndexError after the run began)."""
    llama = tmp_path / "llama"
    llama.mkdir()
    (llama / "config.json").write_text(json.dumps({"vocab_size": 32000}))
    cfg = compose_config("config", ["experiment=context_extension/smoke", f"model.pretrained_path={llama}"])
    assert cfg.data.source == "books"
    with pytest.raises(PipelineConfigError, match=r"vocabulary of 32000 tokens.*data\.source=hub"):
        check_inputs(cfg)
    with open_dict(cfg):
        cfg.data.vocab_size = 32000  # a model pretrained on a books BPE of its size: accepted
    check_inputs(cfg)


@pytest.mark.parametrize("override, key", [
    ("extend.context=260", "extend.context=260 must split into recipes.longlora.s2attn_groups"),
    ("extend.context=64", "extend.context=64 must exceed model.context"),
    ("extend.recipes=[yarn]", "recipes.yarn .* is missing"),
    ("recipes.tape.recipe=yarn", "recipes.tape.recipe=.yarn.: unknown recipe"),
    ("base.passkey_rows=17", "base.passkey_rows=17"),
    ("base.checkpoint_every=0", "base.checkpoint_every=0 must be >= 1"),
    ("model.frozen_dtype=bfloat16", "model.frozen_dtype=bfloat16 stores frozen weights .* trainer.precision=bf16-mixed"),
    ("trainer.precision=bf16-true", "trainer.precision=bf16-true would train the weights in low precision"),
    ("trainer.precision=64-true", "trainer.precision=64-true: choose"),
    ("eval.maps_off=[lora]", "eval.maps_off lists lora, whose recipe is not tape"),
    ("eval.maps_off=[embed_norm]", "eval.maps_off lists embed_norm, which extend.recipes does not train"),
    ("eval.maps_off=tape", "eval.maps_off='tape': a list of recipe names"),
])
def test_impossible_settings_name_their_key(override, key):
    with pytest.raises(PipelineConfigError, match=key.replace("[", r"\[")):
        validate(compose_config("config", ["experiment=context_extension/cpu", override]))


# ----------------------------------------------------------------------------- saved models
@pytest.mark.parametrize("recipe", RECIPES)
def test_saved_extended_model_reloads_with_the_same_logits(tmp_path, recipe):
    model = build_llama(64, 32, 48, 2, 2, 2, context=16, seed=0)
    model = apply_recipe(model, recipe, target_context=32, original_context=16, s2attn_groups=2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))  # as if trained: adapters and TAPE maps act
    ids = torch.randint(0, 64, (2, 32))
    model.eval()
    with torch.no_grad():
        before = model(input_ids=ids).logits
    save_model(model, tmp_path / recipe, {"recipe": recipe})
    with torch.no_grad():
        after = load_model(tmp_path / recipe)(input_ids=ids).logits
    assert (before - after).abs().max() < 1e-4
    with pytest.raises(FileExistsError):
        save_model(model, tmp_path / recipe, {})


# ----------------------------------------------------------------------------- resume and reuse
def _weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path / "model.safetensors"))


def test_killed_run_resumes_at_the_first_unfinished_stage_and_inside_it(tmp_path, data_dir, monkeypatch):
    from tape.lightning import HFCausalLMModule

    short = ["extend.recipes=[tape,lora]", "extend.steps=3", "extend.checkpoint_every=1"]
    step = HFCausalLMModule.training_step

    def dies_in_lora(self, batch, batch_idx):
        if self.hparams.stage == "lora" and self.trainer.global_step == 2:
            raise RuntimeError("killed")  # as a kill: after the checkpoint of step 2
        return step(self, batch, batch_idx)

    monkeypatch.setattr(HFCausalLMModule, "training_step", dies_in_lora)
    with pytest.raises(RuntimeError, match="killed"):
        extend(extend_cfg(tmp_path, data_dir, *short, name="killed"))
    models = tmp_path / "models"
    assert sorted(p.name.split("-")[0] for p in models.iterdir() if not p.name.endswith(".work")) == ["base", "tape"]
    work = [p for p in models.iterdir() if p.name.endswith(".work")]
    assert [p.name.split("-")[0] for p in work] == ["lora"] and (work[0] / "checkpoints" / "last.ckpt").is_file()

    monkeypatch.setattr(HFCausalLMModule, "training_step", step)
    resumed = extend(extend_cfg(tmp_path, data_dir, *short, name="resumed"))
    assert resumed["base_reused"] and resumed["tape_reused"] and not resumed["lora_reused"]
    assert resumed["lora_steps"] == 3 and not work[0].exists()
    info = json.loads((Path(resumed["lora_model"]) / "stage.json").read_text())
    assert info["resumed_from"].endswith("last.ckpt")

    clean = extend_cfg(tmp_path, data_dir, *short, name="clean")
    with open_dict(clean):
        clean.models_dir = str(tmp_path / "models_clean")
    uninterrupted = extend(clean)
    a, b = _weights(Path(resumed["lora_model"])), _weights(Path(uninterrupted["lora_model"]))
    assert a.keys() == b.keys()
    for k in a:  # the resumed stage replays exactly what an uninterrupted one does
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-6, msg=k)


def test_reuse_models_false_retrains_and_replaces_the_saved_models(tmp_path, data_dir):
    short = ["extend.recipes=[lora]", "base.steps=2"]
    first = extend(extend_cfg(tmp_path, data_dir, *short, name="first"))
    stamp = json.loads((Path(first["lora_model"]) / "stage.json").read_text())["stage_time_s"]
    again = extend(extend_cfg(tmp_path, data_dir, *short, "reuse_models=false", name="again"))
    assert not again["base_reused"] and not again["lora_reused"] and again["time_base_train_s"] > 0
    assert again["lora_model"] == first["lora_model"]  # same settings, same directory, replaced
    assert json.loads((Path(again["lora_model"]) / "stage.json").read_text())["stage_time_s"] != stamp
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "models").iterdir()) == ["base", "lora"]  # no leftovers


@pytest.mark.slow
def test_smoke_runs_on_two_ddp_processes(tmp_path, data_dir):
    """trainer=ddp on 2 CPU processes (gloo) through the real command line: Lightning relaunches
    it once; rank 0 saves the models and evaluates, both ranks train every stage."""
    import os

    root = Path(__file__).resolve().parents[1]
    args = ["experiment=context_extension/smoke", "logger=csv", "trainer=ddp", "trainer.accelerator=cpu",
            "trainer.devices=2", "extend.recipes=[tape]", f"paths.root_dir={tmp_path}", f"data.data_dir={data_dir}",
            f"data.vocab_size={VOCAB}"]
    env = {**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"}  # rank 0 forked warm, rank 1 fresh
    out = run_module("pipelines.train", args, root, env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "context_extension" / "smoke" / "llama" / "0").iterdir()
    metrics = json.loads((run / "metrics.json").read_text())
    for stage in ("base", "tape"):
        info = json.loads((Path(metrics[f"{stage}_model"]) / "stage.json").read_text())
        assert info["world_size"] == 2 and info["train"]["steps"] > 0
    assert [r["method"] for r in _read_csv(run / "passkey.csv")] == ["base"] * 2 + ["tape"] * 2
    header = (run / "csv" / "metrics.csv").read_text().splitlines()[0]
    assert "base/loss" in header and "tape/loss" in header  # rank 0 logged both stages
    assert not list((tmp_path / "runs" / "context_extension" / "models").glob("*.work"))


def test_extend_alias_runs_the_cpu_preset_unless_told_otherwise():
    from pipelines.extend import argv_with_experiment

    assert argv_with_experiment(["seed=1", "--cfg", "job"]) == [  # first: a flag may end the line
        "experiment=context_extension/cpu", "seed=1", "--cfg", "job"]
    assert argv_with_experiment(["experiment=context_extension/smoke", "threads=1"]) == [
        "experiment=context_extension/smoke", "threads=1"]


def test_extend_alias_reaches_the_configs_and_their_checks(tmp_path):
    """The command line itself: pipelines.extend composes conf/ and fails on a bad recipe with the
    config error, before anything is written (it once failed to find conf/ at all)."""
    root = Path(__file__).resolve().parents[1]
    done = run_module("pipelines.extend",
                      ["extend.recipes=[nope]", "logger=none", f"paths.runs_dir={tmp_path / 'runs'}"], root)
    assert done.returncode != 0 and "extend.recipes lists nope" in done.stderr, done.stderr[-2000:]
    assert "Primary config module" not in done.stderr and not list(tmp_path.rglob("command.txt"))


def test_the_paper_preset_decodes_passkeys_as_the_paper_without_a_cache():
    """eval_retrieval.py recomputes the prefix for every answer token (tape-spec D.3); the
    smaller presets keep the cache, equal to recomputation in fp32."""
    from pipelines.tasks.context_extension.stages import passkey_task_config

    paper = compose_config("config", ["experiment=context_extension/paper"])
    assert passkey_task_config(paper).kv_cache is False
    assert passkey_task_config(compose_config("config", ["experiment=context_extension/cpu"])).kv_cache is True


def test_evaluation_stage_uses_the_passkey_and_perplexity_tasks_protocols():
    """Context extension evaluates through task=passkey / task=perplexity: official draws with
    BOS first (not the python draws, which give other prompts), LongLoRA's window starts."""
    from pipelines.tasks.context_extension.data import ExtensionData
    from pipelines.tasks.context_extension.stages import evaluate_stage
    from tape.metrics.passkey import passkey_accuracy
    from tape.metrics.perplexity import sliding_window_perplexity

    torch.manual_seed(0)
    model = build_llama(vocab_size=300, context=512, hidden_size=32, intermediate_size=64,
                        num_layers=1, num_heads=2, num_kv_heads=2).eval()
    tokens = np.arange(256 + 3 * 256, dtype=np.int64) % 300  # n - L = 3 * 256 at L = 256
    data = ExtensionData(encode=char_encode, pad_id=0, vocab_size=300, train_rows=None,
                         eval_tokens={"toy": tokens}, bos_id=1)
    cfg = compose_config("config", ["experiment=context_extension/smoke"])
    with open_dict(cfg):
        cfg.eval.perplexity_lengths, cfg.eval.max_windows = [256], None
        cfg.eval.passkey_lengths, cfg.eval.passkey_trials = [400], 3
    ppl, keys, choice = evaluate_stage(cfg, "base", model, data)
    assert choice == []  # no eval.multiple_choice_dir
    assert ppl[0]["windows"] == len(range(0, len(tokens) - 256, 256)) == 3
    assert ppl[0]["perplexity"] == pytest.approx(
        sliding_window_perplexity(model, tokens, 256, 256, cfg.eval.batch_size, None)["perplexity"])
    n_garbage = keys[0]["n_garbage"]
    official = passkey_accuracy(model, char_encode, n_garbage, 3, 0, bos_id=1, draws="official")
    python = passkey_accuracy(model, char_encode, n_garbage, 3, 0, draws="python")
    assert keys[0]["target_tokens"] == 400 and keys[0]["method"] == "base"
    assert keys[0]["mean_tokens"] == official["mean_tokens"] != python["mean_tokens"]
    no_corpora = ExtensionData(encode=char_encode, pad_id=0, vocab_size=300, train_rows=None,
                               eval_tokens={}, bos_id=1)
    ppl, keys, _ = evaluate_stage(cfg, "base", model, no_corpora)  # no data.eval_files: passkey only
    assert ppl == [] and len(keys) == 1


def test_bad_passkey_length_and_ckpt_path_fail_before_the_run_dir(tmp_path, data_dir):
    cfg = extend_cfg(tmp_path, data_dir, "eval.passkey_lengths=[20]")
    with pytest.raises(PipelineConfigError, match=r"eval\.passkey_lengths"):
        extend(cfg)
    assert not Path(cfg.paths.output_dir).exists()
    cfg = extend_cfg(tmp_path, data_dir, "eval.passkey_kv_cache=maybe")
    with pytest.raises(PipelineConfigError, match="eval.passkey_kv_cache='maybe' must be true or false"):
        extend(cfg)
    assert not Path(cfg.paths.output_dir).exists()
    with pytest.raises(PipelineConfigError, match="ckpt_path=last: context extension resumes by itself"):
        extend(extend_cfg(tmp_path, data_dir, "ckpt_path=last"))


def test_gpu_trainer_without_a_gpu_fails_before_the_run_dir_is_claimed(tmp_path, data_dir):
    """Context extension goes through pipelines.train's accelerator check before its first stage."""
    from pipelines.train import train

    cfg = extend_cfg(tmp_path, data_dir, "trainer=gpu")
    with pytest.raises(PipelineConfigError, match="trainer.accelerator=gpu .* no usable CUDA GPU"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists() and not (tmp_path / "models").exists()


def test_base_check_reads_the_longest_passkey_length_within_the_context():
    """Filler-character lengths (the paper preset's) give measured token counts that never equal
    the context: the check takes the longest that fits, and flags a base that fails there."""
    from omegaconf import OmegaConf

    from pipelines.tasks.context_extension.runner import _base_check

    cfg = OmegaConf.create({"model": {"context": 4096}, "eval": {"min_base_passkey": 0.95}})
    rows = [{"target_tokens": t, "accuracy": a} for t, a in ((3930, 0.9), (823, 1.0), (4750, 0.1))]
    assert _base_check(cfg, rows) == {"base_passkey_at_context": 0.9, "base_passkey_tokens": 3930,
                                      "base_retrieves": False}
    assert _base_check(cfg, rows[2:]) == {}


@pytest.mark.parametrize("override, message", [
    ("base.schedule=cosin", r"base\.schedule=cosin: choose one of \['constant', 'cosine', 'linear'\]"),
    ("extend.schedule=lin", r"extend\.schedule=lin: choose one of"),
    ("extend.steps=abc", r"extend\.steps='abc' must be an integer"),
    ("base.steps=2.5", r"base\.steps=2\.5 must be an integer"),
    ("extend.steps=0", r"extend\.steps=0 must be >= 1"),
    ("base.batch_size=abc", r"base\.batch_size='abc' must be an integer"),
    ("extend.passkey_rows=abc", r"extend\.passkey_rows='abc' must be an integer"),
    ("base.warmup_steps=-1", r"base\.warmup_steps=-1 must be >= 0"),
    ("extend.context=abc", r"extend\.context='abc' must be an integer"),
    ("model.context=abc", r"model\.context='abc' must be an integer"),
    ("base.passkey_min_tokens=500", r"base\.passkey_min_tokens=500 must be <= model\.context=256"),
    ("base.lr=abc", r"base\.lr='abc' \(str\) is not one of: float"),
    ("extend.lr=0", r"extend\.lr=0: must be > 0"),
    ("extend.betas=[0.9,abc]", r"extend\.betas=\[0\.9, 'abc'\] must be two numbers in \[0, 1\)"),
    ("base.min_lr_ratio=2", r"base\.min_lr_ratio=2: must be in \[0, 1\]"),
    ("extend.weight_decay=-0.1", r"extend\.weight_decay=-0\.1: must be >= 0"),
    ("base.passkey_weight=abc", r"base\.passkey_weight='abc' must be a number >= 0"),
    ("extend.grad_clip=-1", r"extend\.grad_clip=-1 must be a number >= 0"),
    ("extend.gradient_checkpointing=yes", r"extend\.gradient_checkpointing='yes' must be true or false"),
    ("extend.recipes=tape", r"extend\.recipes='tape' must be a list of names"),
    ("eval.perplexity_lengths=[64,abc]", r"eval\.perplexity_lengths: 'abc' is not an integer"),
])
def test_malformed_section_values_name_their_key(override, message):
    """Every value of base.* / extend.* is checked by validate() (named as the user wrote it),
    not by a traceback from int() or, mid-run, by lr_factor naming optim.schedule."""
    with pytest.raises(PipelineConfigError, match=message):
        validate(compose_config("config", ["experiment=context_extension/cpu", override]))


def test_section_checks_pass_the_presets_and_null_grad_clip():
    validate(compose_config("config", ["experiment=context_extension/cpu", "base.grad_clip=null",
                                       "extend.schedule=linear", "base.passkey_rows=0",
                                       "base.passkey_min_tokens=500"]))


def test_misspelt_schedule_fails_before_anything_is_written(tmp_path):
    """base.schedule=cosin once trained the base, then crashed inside it naming optim.schedule,
    leaving a run directory without metrics.json and a models/ folder."""
    root = Path(__file__).resolve().parents[1]
    done = run_module("pipelines.extend", ["experiment=context_extension/smoke", "base.schedule=cosin", "logger=none",
                                           f"paths.runs_dir={tmp_path / 'runs'}"], root)
    assert done.returncode != 0, done.stderr[-2000:]
    assert "base.schedule=cosin: choose one of" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "optim.schedule" not in done.stderr
    assert not list(tmp_path.rglob("*"))  # no run directory, no models folder


def test_a_sweep_checks_every_jobs_stage_settings_before_the_first(tmp_path):
    """check_settings skipped validate() for tasks that run themselves: in `-m base.steps=2,abc`
    job 0 trained before job 1 was refused."""
    from pipelines.preflight import preflight
    from pipelines.train import check_settings

    argv = ["-m", "experiment=context_extension/smoke", "base.steps=2,abc", f"paths.runs_dir={tmp_path}"]
    with pytest.raises(PipelineConfigError, match=r"(?s)1 of the sweep's 2 jobs would fail.*base\.steps='abc'"):
        preflight("config", argv, check_settings)
