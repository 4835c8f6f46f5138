"""What W&B shows of a run, read back from the offline run files as `wandb sync` would upload
them: the full resolved config, each task's results as tables, its figures, one W&B run across
a resume, and an exit record for a run that failed."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf

from conftest import compose_config
from pipelines import wandb_log
from pipelines.train import train
from test_pipeline_train import Kill  # raises at a step, after the previous checkpoint
from wandb_records import offline_runs


@pytest.mark.wandb
def test_wandb_run_holds_the_full_config_the_grid_table_and_the_heatmap(make_cfg) -> None:
    cfg = make_cfg("pe=rope", "logger=wandb")
    train(cfg)
    (run,) = offline_runs(Path(cfg.paths.output_dir))
    resolved = OmegaConf.to_container(cfg, resolve=True)
    # The whole resolved config, not only the LightningModule's hyperparameters.
    for key in ("task", "pe", "optim", "trainer", "paths", "logger", "experiment_name", "scale"):
        assert run.config[key] == resolved[key], key
    assert run.config["trainer"]["max_steps"] == 6 and run.config["task"]["name"] == "addition"
    assert set(resolved["model"]) <= set(run.config["model"])  # the ModelConfig built from it
    assert run.group == "addition/smoke" and run.name == "rope-seed0"

    grid = run.table("eval/grid")
    assert grid["columns"] == ["len_a", "len_b", "n", "correct", "digits", "digits_correct", "accuracy"]
    saved = wandb_log.read_csv_rows(Path(cfg.paths.output_dir) / "grid.csv")
    assert [row[:6] for row in grid["data"]] == [list(r.values()) for r in saved]  # 36 cells
    assert len(grid["data"]) == 36
    assert all(row[6] == pytest.approx(100 * row[3] / row[2]) for row in grid["data"])
    assert run.image("eval/heatmap").read_bytes()[:4] == b"\x89PNG"
    metrics = json.loads((Path(cfg.paths.output_dir) / "metrics.json").read_text())
    assert run.summary["eval/mean_accuracy"] == pytest.approx(metrics["mean_accuracy"])
    assert run.exit_code == 0


@pytest.mark.wandb
def test_a_resumed_run_continues_the_wandb_run_it_resumes(make_cfg, tmp_path: Path) -> None:
    common = ("pe=nope", "logger=wandb", "trainer.max_steps=6", "trainer.val_check_interval=2")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="killed"), extra_callbacks=[Kill(at_step=4)])
    killed = tmp_path / "runs/addition/smoke/nope/0/killed"
    (first,) = offline_runs(killed)
    assert first.exit_code == 1  # the failed run has its exit record
    steps = [h["trainer/global_step"] for h in first.history if "trainer/global_step" in h]
    assert steps and max(steps) == 4  # it died after the step-4 checkpoint

    cfg = make_cfg(*common, "ckpt_path=last", name="resumed")
    train(cfg)
    (second,) = offline_runs(Path(cfg.paths.output_dir))
    assert second.run_id == first.run_id  # the same W&B run, continued (resume="allow")
    assert second.config["ckpt_path"] == "last" and second.exit_code == 0
    steps = [h["trainer/global_step"] for h in second.history if "trainer/global_step" in h]
    assert min(steps) == 4 and max(steps) == 6  # its history goes on from the checkpoint
    assert wandb_log.resumed_run_id(killed / "checkpoints" / "last.ckpt") == first.run_id
    # A fresh run (no checkpoint) and a checkpoint from a run without W&B start a new W&B run.
    assert wandb_log.resumed_run_id(None) is None
    assert wandb_log.resumed_run_id(tmp_path / "elsewhere" / "checkpoints" / "last.ckpt") is None


@pytest.mark.wandb
def test_every_result_file_becomes_a_table_and_every_figure_an_image(tmp_path: Path, make_cfg) -> None:
    """Pretraining perplexity, context extension's passkey and perplexity by corpus, SCROLLS
    predictions with references and scores: whatever a task wrote, W&B gets as a table."""
    from lightning.pytorch.loggers import WandbLogger

    from pipelines.tasks.context_extension.report import PASSKEY_FIELDS, plot_passkey
    from pipelines.result_files import write_csv
    from pipelines.tasks.scrolls import write_scored_predictions

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "perplexity.csv").write_text(  # pretraining: the corpus is a config key
        "multiplier,length,perplexity,nll,windows,scored_tokens\n1,64,91.5,4.5,8,512\n2,128,97.25,4.6,4,512\n")
    passkey = [{"method": "tape", "target_tokens": n, "n_garbage": 10 * n, "mean_tokens": n - 3.5,
                "trials": 4, "accuracy": acc} for n, acc in ((64, 1.0), (128, 0.5))]
    write_csv(passkey, PASSKEY_FIELDS, run_dir / "passkey.csv")
    plot_passkey(passkey, run_dir / "passkey.png", "passkey")
    write_scored_predictions({"q1": "the king", "q2": "a queen"},
                             {"q1": ["the king", "a king"], "q2": ["the land"]}, "f1",
                             run_dir / "predictions_scored.jsonl")
    (run_dir / "flipflop.csv").write_text("multiplier,sparsity,length,reads,errors,read_error\n2,sparse,128,50,3,6.0\n")
    (run_dir / "word_problem.csv").write_text("multiplier,length,token_accuracy,sequence_accuracy\n2,32,55.5,1.0\n")
    (run_dir / "word_problem_positions.csv").write_text("multiplier,position,token_accuracy\n1,1,100.0\n1,2,40.5\n")
    cfg = make_cfg("experiment=pretrain/smoke", "logger=wandb")
    logger = WandbLogger(save_dir=str(run_dir), offline=True, project="tape-repro")
    wandb_log.log_results([logger], run_dir, cfg, step=3)
    logger.experiment.finish()

    (run,) = offline_runs(run_dir)
    ppl = run.table("eval/perplexity")
    assert ppl["columns"] == ["corpus", "multiplier", "length", "perplexity", "nll", "windows", "scored_tokens"]
    assert ppl["data"] == [["books", 1, 64, 91.5, 4.5, 8, 512], ["books", 2, 128, 97.25, 4.6, 4, 512]]
    key = run.table("eval/passkey")
    assert key["columns"] == PASSKEY_FIELDS and [r[-1] for r in key["data"]] == [1.0, 0.5]
    assert run.table("eval/flipflop")["data"] == [[2, "sparse", 128, 50, 3, 6.0]]
    assert run.table("eval/word_problem")["data"] == [[2, 32, 55.5, 1.0]]
    assert run.table("eval/word_problem_positions")["data"] == [[1, 1, 100.0], [1, 2, 40.5]]
    preds = run.table("eval/predictions")
    assert preds["columns"] == ["id", "prediction", "references", "score"]
    assert preds["data"] == [["q1", "the king", "the king\na king", 100.0], ["q2", "a queen", "the land", 0.0]]
    assert run.image("eval/passkey_plot").read_bytes()[:4] == b"\x89PNG"
    assert run.history[-1]["trainer/global_step"] == 3


def test_every_entry_point_of_a_reproduction_logs_to_its_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TAPE_WANDB_GROUP", "reproduce-20261123-000000")
    for name, experiment in (("config", "addition/cpu"), ("config", "pretrain/cpu"),
                             ("config", "scrolls/cpu"), ("config", "context_extension/cpu")):
        cfg = compose_config(name, [f"experiment={experiment}", "logger=wandb"])
        assert cfg.logger.wandb.group == "reproduce-20261123-000000", experiment
        tags = OmegaConf.to_container(cfg.logger.wandb.tags, resolve=True)
        assert tags[0].startswith(f"experiment:{experiment}"), tags


class Terminate(Callback):
    """Sends this process SIGTERM at a step, as a scheduler or `kill` would."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.wandb
def test_a_terminated_run_leaves_an_exit_record(make_cfg) -> None:
    import wandb

    cfg = make_cfg("pe=nope", "logger=wandb", "trainer.max_steps=6", "trainer.val_check_interval=2")
    with pytest.raises(SystemExit):  # Lightning turns SIGTERM into SIGTERMException at the next step
        train(cfg, extra_callbacks=[Terminate(at_step=3)])
    (run,) = offline_runs(Path(cfg.paths.output_dir))
    assert run.exit_code == 1 and wandb.run is None
    assert not (Path(cfg.paths.output_dir) / "metrics.json").exists()


@pytest.mark.wandb
def test_offline_runs_can_be_viewed_locally_with_the_pinned_wandb(tmp_path) -> None:
    """make wandb-view runs `wandb leet`: it must exist in the pinned wandb, needing no login."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    recipe = re.search(r"^wandb-view:.*\n(\t.+\n)+", (repo / "Makefile").read_text(), flags=re.M).group(0)
    assert "\t$(BIN)/wandb leet" in recipe
    # without RUN=: the newest wandb/ folder under the runs (bare `wandb leet` looked in ./wandb)
    for name, stamp in (("old", 1_000_000_000), ("new", 1_100_000_000)):
        folder = tmp_path / "runs" / "addition" / "cpu" / name / "0" / "t" / "wandb"
        folder.mkdir(parents=True)
        os.utime(folder, (stamp, stamp))
    dry = subprocess.run(["make", "-s", "-n", "-C", str(repo), "wandb-view", f"RUNS={tmp_path / 'runs'}"],
                         capture_output=True, text=True, timeout=60)
    assert f"wandb leet {tmp_path}/runs/addition/cpu/new/0/t/wandb\n" in dry.stdout, dry.stdout
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb_cli), "leet", "--help"], capture_output=True, text=True, timeout=120,
                         env={"PATH": str(wandb_cli.parent), "WANDB_MODE": "offline", "HOME": str(tmp_path)})
    assert out.returncode == 0 and "locally" in out.stdout, out.stderr
