"""SCROLLS fine-tuning end to end on the invented fixture: a tiny pretraining run, then one QA
and one summarisation task fine-tuned, generated and scored; bad input named by key; sampling."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from conftest import INVENTED_VOCAB, compose_config
from pipelines.errors import PipelineConfigError
from pipelines.tasks import scrolls as scrolls_task
from pipelines.train import train
from tape.model.generate import TopKTopPSampler
from wandb_records import offline_runs

FIXTURE = Path(__file__).parent / "fixtures" / "scrolls"
VOCAB = INVENTED_VOCAB


@pytest.fixture(scope="module")
def data_dir(invented_text_data: Path) -> Path:
    return invented_text_data


@pytest.fixture(scope="module")
def pretrained(data_dir, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny TAPE pretraining run shared by the tests, under runs/pretrain/smoke/tape/0/."""
    runs = tmp_path_factory.mktemp("shared") / "runs"
    cfg = compose_config("config", [
        "experiment=pretrain/smoke", "pe=tape", "logger=none", f"task.data_dir={data_dir}",
        f"task.vocab_size={VOCAB}", "task.heldout_percent=20", "evaluate=false",
        "callbacks.rich_progress_bar=null", "+trainer.enable_progress_bar=false"])
    with open_dict(cfg):
        cfg.paths.runs_dir = str(runs)
        cfg.paths.output_dir = str(runs / "pretrain/smoke/tape/0/20261122-120000-abcdef")  # as hydra names it
    train(cfg)
    assert (Path(cfg.paths.output_dir) / "metrics.json").is_file()
    return Path(cfg.paths.output_dir)


def scrolls_cfg(make_cfg, *overrides: str, name: str = "ft", runs_dir: Path | None = None):
    return make_cfg("experiment=scrolls/smoke", "pe=tape", f"task.data_dir={FIXTURE}", *overrides,
                    name=name, runs_dir=runs_dir)


@pytest.mark.datasets
@pytest.mark.wandb
@pytest.mark.parametrize(("dataset", "metric"), [
    ("qasper", "f1"), pytest.param("gov_report", "rouge_geometric_mean", marks=pytest.mark.rouge_score)])
def test_finetune_generate_and_score(dataset, metric, make_cfg, pretrained) -> None:
    cfg = scrolls_cfg(make_cfg, f"task.dataset={dataset}", f"task.pretrained_run={pretrained}",
                      "logger=wandb")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    assert metrics["scrolls_task"] == dataset and metrics["steps"] == 4
    assert 0.0 <= metrics[metric] <= 100.0 and metrics["scrolls_score"] == metrics[metric]
    preds = json.loads((run / "predictions.json").read_text())
    ids = [json.loads(line)["id"] for line in (FIXTURE / dataset / "validation.jsonl").read_text().splitlines()]
    assert list(preds) == list(dict.fromkeys(ids))[:2] and all(isinstance(v, str) for v in preds.values())
    scores = json.loads((run / "scores.json").read_text())
    assert scores["task"] == dataset and scores["num_predicted"] == len(preds)
    # Per example: prediction, references and score, in W&B as a table too.
    scored = [json.loads(line) for line in (run / "predictions_scored.jsonl").read_text().splitlines()]
    refs = {}
    for line in (FIXTURE / dataset / "validation.jsonl").read_text().splitlines():
        row = json.loads(line)
        refs.setdefault(row["id"], []).append(row["output"])
    assert [r["id"] for r in scored] == list(preds) and [r["prediction"] for r in scored] == list(preds.values())
    assert all(r["references"] == refs[r["id"]] and 0.0 <= r["score"] <= 100.0 for r in scored)
    if metric == "f1":  # the task's score is the mean of the examples' scores
        assert sum(r["score"] for r in scored) / len(scored) == pytest.approx(scores["f1"], abs=1e-4)
    (logged,) = offline_runs(run)
    table = logged.table("eval/predictions")
    assert table["data"] == [[r["id"], r["prediction"], "\n".join(r["references"]), r["score"]] for r in scored]
    saved = OmegaConf.load(run / "config.yaml")
    assert saved.task.pretrained_run == str(pretrained) and saved.model.max_seq_len == 128
    assert saved.model.d_model == OmegaConf.load(pretrained / "config.yaml").model.d_model


def test_fine_tuning_starts_from_the_pretrained_weights(make_cfg, pretrained) -> None:
    cfg = scrolls_cfg(make_cfg, f"task.pretrained_run={pretrained}")
    scrolls_task.prepare(cfg)
    from pipelines.train import build_module

    module = build_module(cfg)
    scrolls_task.initialize(module.model, cfg)
    state = torch.load(pretrained / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    for name, value in module.model.state_dict().items():
        assert torch.equal(value, state[f"model.{name}"]), name


@pytest.mark.parametrize("recompute", [True, False])
def test_gradient_checkpointing_is_this_runs_choice_not_the_pretrained_runs(recompute, make_cfg, pretrained) -> None:
    cfg = scrolls_cfg(make_cfg, f"task.pretrained_run={pretrained}",
                      f"model.gradient_checkpointing={recompute}")
    scrolls_task.prepare(cfg)
    assert cfg.model.gradient_checkpointing is recompute  # the architecture is adopted, this is kept
    assert cfg.model.d_model == OmegaConf.load(pretrained / "config.yaml").model.d_model


def test_pretrained_run_last_finds_the_newest_finished_run(make_cfg, pretrained) -> None:
    cfg = scrolls_cfg(make_cfg, "task.pretrained_run=last", runs_dir=pretrained.parents[4])
    scrolls_task.prepare(cfg)
    assert cfg.task.pretrained_run == str(pretrained)


def test_pretrained_run_last_prefers_the_presets_run_to_a_newer_claim_arm(make_cfg, pretrained, tmp_path) -> None:
    """`last` took the newest finished run of the PE and seed, in cpu-full an ablation arm (TAPE
    without its attention update) or a longer RoPE run, and fine-tuned it as the PE's (review)."""
    import shutil

    from omegaconf import OmegaConf

    from pipelines.presets import preset_setting
    from tape.report.settings import differences

    folder = tmp_path / "runs" / "pretrain" / "smoke" / "tape" / "0"
    preset_run, arm = folder / "20261122-120000-aaaaaa", folder / "20261122-130000-bbbbbb"  # the arm is newer
    for run in (preset_run, arm):
        shutil.copytree(pretrained, run)
        config = OmegaConf.load(run / "config.yaml")
        for key, _ in differences(OmegaConf.to_container(config), preset_setting("pretrain/smoke", "tape")).items():
            OmegaConf.update(config, key, preset_setting("pretrain/smoke", "tape")[key])  # as the preset trains
        if run == arm:
            OmegaConf.update(config, "pe.tape_attn_update", False)
        OmegaConf.save(config, run / "config.yaml")
    cfg = scrolls_cfg(make_cfg, "task.pretrained_run=last", runs_dir=tmp_path / "runs")
    scrolls_task.prepare(cfg)
    assert cfg.task.pretrained_run == str(preset_run) and cfg.pe.tape_attn_update is True
    (preset_run / "metrics.json").unlink()  # only the arm is finished: taken, with a warning
    cfg = scrolls_cfg(make_cfg, "task.pretrained_run=last", runs_dir=tmp_path / "runs", name="ft2")
    scrolls_task.prepare(cfg)
    assert cfg.task.pretrained_run == str(arm)
    with pytest.raises(PipelineConfigError, match="metrics.json not found"):  # named explicitly: refused
        scrolls_task.prepare(scrolls_cfg(make_cfg, f"task.pretrained_run={preset_run}", name="ft3"))


def test_fine_tuning_runs_of_several_seeds_pool_as_one_setting() -> None:
    """Each seed's run records its own pretraining run's path: the table kept one seed a cell."""
    from tape.report.settings import same_setting

    a = {"task": {"pretrained_run": "/runs/pretrain/cpu/tape/0/x", "dataset": "qasper"}, "seed": 0}
    b = {"task": {"pretrained_run": "/runs/pretrain/cpu/tape/1/y", "dataset": "qasper"}, "seed": 1}
    assert same_setting(a, b)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ([], "task.pretrained_run is not set"),
        (["task.pretrained_run=/nowhere"], "task.pretrained_run=/nowhere"),
        (["task.pretrained_run=last"], "task.pretrained_run=last: no finished run"),
    ],
)
def test_missing_pretrained_run_is_named(overrides, match, make_cfg) -> None:
    cfg = scrolls_cfg(make_cfg, *overrides)
    with pytest.raises(PipelineConfigError, match=match):
        scrolls_task.prepare(cfg)


def test_pe_must_match_the_pretrained_run(make_cfg, pretrained) -> None:
    cfg = make_cfg("experiment=scrolls/smoke", "pe=rope", f"task.pretrained_run={pretrained}")
    with pytest.raises(PipelineConfigError, match="pass pe=tape"):
        scrolls_task.prepare(cfg)


@pytest.mark.datasets
def test_no_data_fails_at_once_and_says_where_to_get_it(make_cfg, pretrained, tmp_path) -> None:
    cfg = scrolls_cfg(make_cfg, f"task.pretrained_run={pretrained}", f"task.data_dir={tmp_path / 'empty'}",
                      name="nodata")
    with pytest.raises(PipelineConfigError, match="tau/scrolls") as err:
        train(cfg)
    assert "task.data_dir" in str(err.value)
    assert not Path(cfg.paths.output_dir).exists()  # checked before the run directory is claimed


@pytest.mark.parametrize(("overrides", "key"), [
    (["task.dataset=squad"], "task.dataset"),
    (["task.lengths.seq_len=64"], "task.lengths"),
    (["task.batch_size=0"], "task.batch_size"),
])
def test_impossible_settings_are_named(overrides, key, make_cfg) -> None:
    cfg = scrolls_cfg(make_cfg, *overrides)
    with pytest.raises(PipelineConfigError, match=key.replace(".", r"\.")):
        scrolls_task.validate(cfg)


def test_sampler_top_k_1_is_greedy_and_seeded_sampling_repeats() -> None:
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    assert TopKTopPSampler(top_k=1)(logits).equal(logits.argmax(-1))
    a = [TopKTopPSampler(top_k=5, seed=7)(logits) for _ in range(2)]
    assert a[0].equal(a[1])
    top5 = logits.topk(5, dim=-1).indices
    draws = torch.stack([TopKTopPSampler(top_k=5, seed=s)(logits) for s in range(40)])  # (40, 3)
    assert all(int(d) in top5[row].tolist() for row in range(3) for d in draws[:, row])
    # top_p: a token holding >= p of the mass alone is always chosen
    peaked = torch.tensor([[10.0, 0.0, 0.0, 0.0]])
    assert all(int(TopKTopPSampler(top_p=0.9, seed=s)(peaked)) == 0 for s in range(20))
    with pytest.raises(ValueError, match="top_p"):
        TopKTopPSampler(top_p=0.0)
