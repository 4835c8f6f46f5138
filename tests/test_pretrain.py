"""From-scratch pretraining (pipelines/tasks/pretrain.py): smoke runs per PE with perplexity at
1x/2x/4x, the presets, the streamed (paper-scale) text path, and bad input named by key."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from conftest import INVENTED_VOCAB, compose_config
from pipelines.errors import PipelineConfigError
from pipelines.models import model_config
from pipelines.tasks import pretrain
from pipelines.train import train
from test_pipeline_train import Kill
from tape.data.streaming import PackedTextStream, open_text_stream, pack_blocks

VOCAB = INVENTED_VOCAB


@pytest.fixture(scope="module")
def data_dir(invented_text_data: Path) -> Path:
    return invented_text_data


def pretrain_cfg(make_cfg, data_dir: Path, *overrides: str, name: str = "run"):
    return make_cfg("experiment=pretrain/smoke", f"task.data_dir={data_dir}",
                    f"task.vocab_size={VOCAB}", "task.heldout_percent=20", *overrides, name=name)


@pytest.mark.parametrize("pe", ["rope", "tape", "randpe", "alibi"])
def test_smoke_pretrain_reports_perplexity_at_each_length(pe, make_cfg, data_dir) -> None:
    cfg = pretrain_cfg(make_cfg, data_dir, f"pe={pe}")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["task"] == "pretrain" and saved["pe"] == pe and saved["steps"] == 4
    for m in (1, 2, 4):
        # an untrained-ish model over a 300-token vocabulary: finite, above 1, near uniform
        assert 1.0 < saved[f"ppl_{m}x"] < 5 * VOCAB and saved[f"ppl_{m}x"] == metrics[f"ppl_{m}x"]
    with open(run / "perplexity.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["length"]) for r in rows] == [16, 32, 64]
    assert all(int(r["windows"]) == 2 and int(r["scored_tokens"]) == 2 * (int(r["length"]) - 1)
               for r in rows)


def test_null_eval_max_windows_scores_every_window(make_cfg, data_dir) -> None:
    """conf/task/pretrain.yaml documents null as every window; validate refused it as a non-integer."""
    from tape.metrics.perplexity import window_starts

    cfg = pretrain_cfg(make_cfg, data_dir, "pe=rope", "task.eval_max_windows=null", "task.eval_multipliers=[1]")
    train(cfg)
    with open(Path(cfg.paths.output_dir) / "perplexity.csv") as f:
        (row,) = list(csv.DictReader(f))
    every = window_starts(len(pretrain.heldout_tokens(cfg.task)), int(row["length"]), int(cfg.task.eval_stride))
    assert int(row["windows"]) == len(every) > 2  # the smoke preset's own cap is 2


def test_pretraining_learns_the_corpus(make_cfg, data_dir) -> None:
    cfg = pretrain_cfg(make_cfg, data_dir, "pe=rope", "trainer.max_steps=60",
                       "trainer.val_check_interval=30", "optim.lr=3e-3", "task.batch_size=8")
    metrics = train(cfg)
    # 17 distinct words drawn uniformly: a model that learned the words is far below uniform (300)
    assert metrics["ppl_1x"] < 60 and metrics["val_loss"] < 4.1


def test_resume_continues_the_block_stream(make_cfg, data_dir) -> None:
    full = train(pretrain_cfg(make_cfg, data_dir, "pe=rope", "evaluate=false", name="full"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(pretrain_cfg(make_cfg, data_dir, "pe=rope", "evaluate=false", name="killed"),
              extra_callbacks=[Kill(at_step=2)])
    again = train(pretrain_cfg(make_cfg, data_dir, "pe=rope", "evaluate=false", "ckpt_path=last",
                               name="resumed"))
    assert again["steps"] == 4 and again["resumed_from"].endswith("killed/checkpoints/last.ckpt")
    assert again["val_loss"] == pytest.approx(full["val_loss"], rel=1e-6)


def test_cpu_preset_runs_when_shrunk(make_cfg, data_dir) -> None:
    cfg = pretrain_cfg(make_cfg, data_dir, "experiment=pretrain/cpu", "model=tiny", "pe=tape",
                       "trainer.max_steps=1", "trainer.val_check_interval=1", "task.batch_size=2",
                       "task.val_blocks=2", "task.eval_max_windows=1")
    metrics = train(cfg)
    assert cfg.task.seq_len == 64 and metrics["steps"] == 1
    assert set(cfg.task.eval_multipliers) == {1, 2, 4} and "ppl_4x" in metrics


@pytest.mark.datasets
def test_paper_preset_matches_the_spec() -> None:
    cfg = compose_config("config", ["experiment=pretrain/paper", "pe=tape"])
    mc = model_config(cfg)
    assert (mc.n_layers, mc.d_model, mc.n_heads, mc.ffn_dim, mc.vocab_size) == (12, 768, 12, 3072, 32000)
    assert not mc.tie_embeddings and mc.max_seq_len == 1024
    assert cfg.task.batch_size * cfg.trainer.accumulate_grad_batches * 4 == 512  # on 4 GPUs
    assert cfg.trainer.max_steps == 10_000 and cfg.optim.lr == 1e-4
    assert cfg.optim.warmup_steps == 0.02 * cfg.trainer.max_steps and cfg.optim.schedule == "linear"
    assert cfg.task.corpus == "stream" and cfg.task.text_source == "allenai/c4"
    pretrain.validate(cfg)
    with pytest.raises(PipelineConfigError, match="task.tokenizer_path"):
        pretrain.datamodule(cfg)  # the Llama tokenizer must be given, before any data is read


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["task.corpus=c4"], "task.corpus"),
        (["task.eval_multipliers=[]"], "task.eval_multipliers"),
        (["model.vocab_size=100"], "model.vocab_size"),
        (["pe=randpe", "model.randpe_max_position=32"], "randpe_max_position"),
        (["task.batch_size=0"], "task.batch_size"),
    ],
)
def test_impossible_settings_fail_before_training(overrides, key) -> None:
    cfg = compose_config("config", ["experiment=pretrain/smoke", *overrides])
    with pytest.raises(PipelineConfigError, match=key.replace(".", r"\.")):
        pretrain.validate(cfg)


def test_missing_tokenizer_dir_is_named(tmp_path) -> None:
    cfg = compose_config("config", ["experiment=pretrain/paper", f"task.tokenizer_path={tmp_path / 'none'}"])
    with pytest.raises(PipelineConfigError, match="task.tokenizer_path"):
        pretrain.datamodule(cfg)


def test_pack_blocks_concatenates_with_bos_and_drops_the_tail() -> None:
    docs = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    assert list(pack_blocks(docs, 4, bos_id=1)) == [[1, 5, 6, 7], [1, 8, 1, 9], [10, 11, 12, 13]]
    assert list(pack_blocks(docs, 5, bos_id=None)) == [[5, 6, 7, 8, 9]]
    assert list(pack_blocks(docs, 4, bos_id=None, eos_id=2)) == [[5, 6, 7, 2], [8, 2, 9, 10], [11, 12, 13, 2]]


def write_c4_shards(root: Path, docs_per_split: int = 30, words: int = 5) -> Path:
    """C4's layout: c4-<split>.<k>-of-<n>.json.gz files of {"text", "url"} lines."""
    shard_dir = root / "c4" / "en"
    shard_dir.mkdir(parents=True)
    for split in ("train", "validation"):
        with gzip.open(shard_dir / f"c4-{split}.00000-of-00001.json.gz", "wt") as f:
            for i in range(docs_per_split):
                text = " ".join(str(i if split == "train" else 100 + i) for _ in range(words))
                f.write(json.dumps({"text": text, "url": "x"}) + "\n")
    return shard_dir


@pytest.mark.datasets
def test_stream_reads_local_c4_shards(tmp_path) -> None:
    shard_dir = write_c4_shards(tmp_path)
    data = open_text_stream(str(shard_dir))
    assert {int(row["text"].split()[0]) for row in open_text_stream(str(shard_dir), "validation")} == set(range(100, 130))
    encode = lambda text: [int(w) + 10 for w in text.split()]  # noqa: E731
    stream = PackedTextStream(data, encode, bos_id=1, seq_len=6, batch_size=2, seed=0, start=3)
    batches = list(stream)
    assert [int(b["batch_index"]) for b in batches] == list(range(3, 3 + len(batches)))
    assert len(batches) == 30 * 6 // 6 // 2  # 30 docs of 6 tokens (BOS + 5) = 30 blocks
    seen = sorted(int(b["input_ids"][r, 1]) - 10 for b in batches for r in range(2))
    assert seen == list(range(30))  # every training document once, shuffled
    ranks = [list(PackedTextStream(data, encode, 1, 6, 1, seed=0, rank=r, world_size=2)) for r in (0, 1)]
    firsts = [{int(b["input_ids"][0, 1]) for b in rs} for rs in ranks]
    assert firsts[0].isdisjoint(firsts[1]) and len(firsts[0] | firsts[1]) == 30  # ranks split documents


@pytest.mark.datasets
def test_paper_path_streams_shards_with_a_hugging_face_tokenizer(make_cfg, data_dir, tmp_path) -> None:
    """The stream corpus end to end offline: local C4-layout shards, a tokenizer directory."""
    from tape.data.text import TextData

    shard_dir = write_c4_shards(tmp_path, docs_per_split=200, words=40)
    tok_dir = tmp_path / "tokenizer"
    TextData(next(data_dir.glob("books-*"))).tokenizer().to_transformers().save_pretrained(tok_dir)
    cfg = pretrain_cfg(make_cfg, data_dir, "pe=rope", "task.corpus=stream",
                       f"task.text_source={shard_dir}", f"task.tokenizer_path={tok_dir}",
                       "task.heldout_tokens=2000")
    metrics = train(cfg)
    assert metrics["steps"] == 4 and metrics["ppl_4x"] > 1.0


def test_stream_source_missing_says_what_to_do(tmp_path) -> None:
    with pytest.raises(FileNotFoundError, match="task.text_source"):
        open_text_stream(str(tmp_path / "nowhere"))


@pytest.mark.datasets
@pytest.mark.parametrize("source", ["hub", "train_only"])
def test_an_unreadable_stream_is_refused_before_the_run_starts(source, make_cfg, data_dir, tmp_path,
                                                                monkeypatch) -> None:
    """The hub offline was found after the hub client's retries (~23 s), with tracebacks; shards
    without a validation split only when the held-out set was read."""
    import tape.data.hub

    monkeypatch.setattr(tape.data.hub, "hub_reachable", lambda timeout=3.0: False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # conftest sets it: the check must not need it
    text = "allenai/c4"
    if source == "train_only":
        text = write_c4_shards(tmp_path)
        next(text.glob("c4-validation.*")).unlink()
    cfg = pretrain_cfg(make_cfg, data_dir, "pe=rope", "task.corpus=stream", f"task.text_source={text}",
                       f"task.tokenizer_path={tmp_path}")
    reason = "hub is not reachable" if source == "hub" else "no validation shards"
    with pytest.raises(PipelineConfigError, match=f"task.text_source=.*{reason}"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_linear_schedule_warms_up_then_decays_to_the_floor() -> None:
    from tape.schedule import lr_factor

    assert lr_factor(0, 10, 110, "linear", 0.0) == pytest.approx(0.1)
    assert lr_factor(10, 10, 110, "linear", 0.0) == 1.0
    assert lr_factor(60, 10, 110, "linear", 0.0) == pytest.approx(0.5)
    assert lr_factor(110, 10, 110, "linear", 0.001) == pytest.approx(0.001)
    with pytest.raises(ValueError, match="optim.schedule"):
        lr_factor(20, 10, 110, "polynomial", 0.0)


def test_a_slow_data_build_says_what_it_is_doing(monkeypatch, tmp_path, caplog) -> None:
    """Issue 14.10: the first books build took 47 s and printed nothing."""
    import logging
    import time

    from omegaconf import OmegaConf

    import pipelines.tasks.pretrain as pretrain_task
    import tape.data.text as text

    monkeypatch.setattr(pretrain_task, "BUILD_NOTICE_S", 0.05)
    monkeypatch.setattr(text, "prepare_text_data", lambda *a, **k: time.sleep(0.3) or "data")
    t = OmegaConf.create({"data_dir": str(tmp_path), "vocab_size": 300, "heldout_percent": 20})
    with caplog.at_level(logging.INFO, logger="pipelines.pretrain"):
        assert pretrain_task._books(t) == "data"
    said = caplog.text
    assert f"building the tokenizer and token files under task.data_dir={tmp_path}" in said
    assert "books corpus ready in" in said
    caplog.clear()
    monkeypatch.setattr(text, "prepare_text_data", lambda *a, **k: "data")  # already built
    with caplog.at_level(logging.INFO, logger="pipelines.pretrain"):
        pretrain_task._books(t)
    assert "books corpus" not in caplog.text
