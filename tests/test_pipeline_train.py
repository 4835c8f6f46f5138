"""End-to-end smoke runs in-process: train + evaluate per PE, re-evaluation, exact resume,
W&B offline, and run directories that are never shared or overwritten."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import OmegaConf, open_dict

import tape.pe
from conftest import compose_config
from pipelines.errors import PipelineConfigError
from pipelines.evaluate import evaluate
from pipelines.run_dirs import claim_run_dir
from pipelines.train import train
from tape.report.runs import read_command

SUMMARY = ("mean_accuracy", "in_distribution_accuracy", "ood_accuracy")


@pytest.mark.parametrize("pe", tape.pe.names())
def test_smoke_train_and_evaluate(pe: str, make_cfg, capsys) -> None:
    cfg = make_cfg(f"pe={pe}")
    metrics = train(cfg)
    run = Path(cfg.paths.output_dir)
    assert f"run dir: {run}" in capsys.readouterr().out
    saved = json.loads((run / "metrics.json").read_text())
    assert saved["pe"] == pe and saved["scale"] == "smoke" and saved["steps"] == 6
    for key in SUMMARY:
        assert 0.0 <= saved[key] <= 100.0 and saved[key] == metrics[key]
    with open(run / "grid.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 6 * 6 and {int(r["n"]) for r in rows} == {2}
    assert (run / "heatmap.png").read_bytes()[:4] == b"\x89PNG"
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert list((run / "checkpoints").glob("best-step*.ckpt"))
    assert OmegaConf.load(run / "config.yaml").pe.name == pe  # resolved config saved
    assert (run / "command.txt").read_text().startswith("python -m pipelines.train ")


def test_evaluate_reproduces_the_run_and_writes_beside_it(make_cfg, tmp_path: Path) -> None:
    cfg = make_cfg("pe=rope", "logger=csv", "trainer.max_steps=30", "trainer.val_check_interval=15",
                   "optim.lr=3e-3")
    trained = train(cfg)
    run = Path(cfg.paths.output_dir)
    assert (run / "csv" / "metrics.csv").read_text().count("train/tokens_per_s") == 1

    def run_eval(*overrides: str, name: str) -> dict:
        ecfg = compose_config("evaluate", [f"run_dir={run}", *overrides])
        with open_dict(ecfg):
            ecfg.paths.output_dir = str(run / "eval" / name)
        return evaluate(ecfg)

    again = run_eval(name="a")
    assert {k: again[k] for k in SUMMARY} == {k: trained[k] for k in SUMMARY}
    assert again["steps"] == 30
    more = run_eval("task.examples_per_cell=3", "ckpt=best", name="b")
    assert more["n_examples"] == 36 * 3 and (run / "eval" / "b" / "heatmap.png").is_file()
    assert json.loads((run / "metrics.json").read_text()) == json.loads(
        json.dumps(trained))  # the run's own results are untouched
    with pytest.raises(PipelineConfigError, match="run_dir="):
        run_eval(name="c", *[f"run_dir={tmp_path / 'nope'}"])


class Kill(Callback):
    """Simulates a crash at the start of a given step (after the previous checkpoint)."""

    def __init__(self, at_step: int) -> None:
        self.at_step = at_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.at_step:
            raise RuntimeError("simulated crash")


def test_resume_equals_uninterrupted(make_cfg, tmp_path: Path) -> None:
    """RandPE draws random positions every step: the resumed run must replay them exactly."""
    common = ("pe=randpe", "trainer.max_steps=6", "trainer.val_check_interval=2")
    full = train(make_cfg(*common, runs_dir=tmp_path / "other"))
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="killed"), extra_callbacks=[Kill(at_step=4)])
    killed = tmp_path / "runs/addition/smoke/randpe/0/killed"
    assert not (killed / "metrics.json").exists()
    assert torch.load(killed / "checkpoints/last.ckpt", weights_only=False)["global_step"] == 4
    before = {p.name: p.stat().st_mtime_ns for p in (killed / "checkpoints").iterdir()}

    resumed = train(make_cfg(*common, "ckpt_path=last", name="resumed"))
    assert resumed["resumed_from"] == str(killed / "checkpoints/last.ckpt")
    after = {p.name: p.stat().st_mtime_ns for p in (killed / "checkpoints").iterdir()}
    assert after == before  # resuming writes to its own directory, never into the old run
    for key in (*SUMMARY, "val_loss", "val_exact_match"):
        assert resumed[key] == pytest.approx(full[key], rel=1e-6, abs=1e-9), key
    a = torch.load(tmp_path / "other/addition/smoke/randpe/0/run/checkpoints/last.ckpt",
                   weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "runs/addition/smoke/randpe/0/resumed/checkpoints/last.ckpt",
                   weights_only=False)["state_dict"]
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # A different PE's checkpoint is not "last" for this one.
    with pytest.raises(PipelineConfigError, match="ckpt_path=last"):
        train(make_cfg("pe=rope", "ckpt_path=last", name="x"))


def _val_rows(run: Path) -> dict[int, float]:
    with open(run / "csv" / "metrics.csv") as f:
        return {int(r["step"]): float(r["val/loss"]) for r in csv.DictReader(f) if r.get("val/loss")}


def test_a_resumed_run_keeps_the_best_checkpoint_curve_and_time(make_cfg, tmp_path: Path) -> None:
    """A resume writes a new directory: its best-*.ckpt was the best of its own validations only
    (Lightning drops the score when the directory changes), its CSV held only the validations
    after the resume (the claims' steps_to read it) and train_time_s only its own part."""
    common = ("pe=rope", "trainer.max_steps=9", "trainer.val_check_interval=3", "optim.lr=1.0",
              "optim.schedule=constant", "logger=csv", "evaluate=false")
    train(make_cfg(*common, runs_dir=tmp_path / "other"))
    full = tmp_path / "other/addition/smoke/rope/0/run"
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="killed"), extra_callbacks=[Kill(at_step=4)])
    killed = tmp_path / "runs/addition/smoke/rope/0/killed"
    before = torch.load(killed / "checkpoints/last.ckpt", weights_only=False)["callbacks"]["RunHistory"]
    resumed = train(make_cfg(*common, "ckpt_path=last", name="resumed"))
    run = tmp_path / "runs/addition/smoke/rope/0/resumed"
    curve = _val_rows(full)
    assert min(curve, key=curve.get) == 2  # logged at step 2 (after 3 steps): before the resume
    assert _val_rows(run) == curve
    assert [p.name for p in (run / "checkpoints").glob("best-*.ckpt")] == \
        [p.name for p in (full / "checkpoints").glob("best-*.ckpt")] == ["best-step3.ckpt"]
    assert resumed["train_time_s"] > before["train_time_s"] > 0


def test_last_ckpt_follows_every_validation_so_a_run_resumes_twice(make_cfg, tmp_path: Path) -> None:
    """Lightning 2.6 writes last.ckpt only where it saves a best one: a run killed after a
    validation that did not improve went back to its last improvement, and a resumed run that
    had not improved on the earlier best left no last.ckpt at all."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    from pipelines.run_history import RunCheckpoint

    common = ("pe=rope", "trainer.max_steps=12", "trainer.val_check_interval=3", "optim.lr=1.0",
              "optim.schedule=constant", "logger=csv", "evaluate=false")
    runs = tmp_path / "runs/addition/smoke/rope/0"
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="a"), extra_callbacks=[Kill(at_step=7)])
    assert torch.load(runs / "a/checkpoints/last.ckpt", weights_only=False)["global_step"] == 6
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, "ckpt_path=last", name="b"), extra_callbacks=[Kill(at_step=10)])
    assert torch.load(runs / "b/checkpoints/last.ckpt", weights_only=False)["global_step"] == 9
    done = train(make_cfg(*common, "ckpt_path=last", name="c"))
    assert done["resumed_from"] == str(runs / "b/checkpoints/last.ckpt") and done["steps"] == 12
    args = dict(dirpath=tmp_path, monitor="val/loss", mode="min", save_top_k=1, save_last=True)
    ours, lightnings = RunCheckpoint(**args), ModelCheckpoint(**args)
    assert ours._legacy_state_key == lightnings.state_key  # checkpoints from before it resume its state
    L.Trainer(callbacks=[ours, lightnings], logger=False)  # beside another ModelCheckpoint: no key clash


def test_ctrl_c_says_how_to_resume(make_cfg) -> None:
    """Lightning answers Ctrl-C with sys.exit(1) after shutting down, so the run ended '(failed)'
    without the hint that follows an interrupt."""
    import signal

    from pipelines.callbacks import InterruptAt

    try:
        with pytest.raises(RuntimeError, match="interrupted; resume it with ckpt_path=last"):
            train(make_cfg("pe=rope", name="stopped"), extra_callbacks=[InterruptAt(step=4)])
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Lightning ignores it afterwards
    assert train(make_cfg("pe=rope", "ckpt_path=last", name="resumed"))["steps"] == 6


@pytest.mark.wandb
def test_default_logger_is_wandb_offline_plus_csv_and_is_closed_on_failure(make_cfg) -> None:
    import wandb

    cfg = make_cfg("pe=nope", "logger=wandb", "evaluate=false")
    train(cfg)
    run = Path(cfg.paths.output_dir)
    assert list((run / "wandb").glob("offline-run-*"))
    assert (run / "csv" / "metrics.csv").is_file()
    assert wandb.run is None
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg("pe=nope", "logger=wandb", name="crash"), extra_callbacks=[Kill(at_step=1)])
    assert wandb.run is None  # a failed sweep job leaves no W&B run open for the next one


def test_a_run_directory_is_never_shared_or_overwritten(make_cfg, capsys) -> None:
    cfg = make_cfg("pe=rope", "evaluate=false")
    claim_run_dir(Path(cfg.paths.output_dir), cfg, "pipelines.train")
    recorded = read_command(Path(cfg.paths.output_dir) / "command.txt")
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?|unknown", recorded["commit"])
    assert "CPU cores" in recorded["machine"]
    import torch

    assert recorded["threads"] == str(torch.get_num_threads())  # CPU results depend on it
    assert recorded["versions"].startswith("python 3.") and f"torch {torch.__version__}" in recorded["versions"]
    with pytest.raises(PipelineConfigError, match="already belongs to another run"):
        train(cfg)  # same directory as a run that claimed it
    out = capsys.readouterr().out
    assert "(failed)" in out and cfg.paths.output_dir in out  # printed even on failure


ADDITION_PRESETS = [  # the 80 x 80 grid of Fig. 2's preset decodes ~160 prompt lengths: slow
    pytest.param(name, marks=pytest.mark.slow) if name == "addition/paper_fig2" else name
    for name in sorted(f"addition/{p.stem}"
                       for p in (Path(__file__).parents[1] / "conf/experiment/addition").glob("*.yaml"))
]


@pytest.mark.parametrize("preset", ADDITION_PRESETS)
def test_every_addition_preset_runs_end_to_end_when_shrunk(preset: str, make_cfg, tmp_path: Path) -> None:
    """Each preset's data, task and evaluation grid as written; only the model, the hardware,
    the number of steps and the examples are shrunk (lightning-hydra-template style)."""
    cfg = make_cfg(
        f"experiment={preset}", "model=tiny", "trainer.accelerator=cpu", "trainer.devices=1",
        "trainer.precision=32-true", "trainer.max_steps=1",
        "trainer.val_check_interval=${trainer.accumulate_grad_batches}",
        "task.batch_size=4", "task.val_examples=4", "task.examples_per_cell=1",
    )
    metrics = train(cfg)
    assert metrics["steps"] == 1 and metrics["scale"] == preset.split("/")[-1]
    assert metrics["n_cells"] == cfg.task.eval_max_digits ** 2


# ---------------------------------------------------------------------------- issue 14
def test_ckpt_path_last_refuses_a_finished_run(make_cfg, tmp_path: Path) -> None:
    """Issue 14.3: after a finished seed-5 run, seed=5 ckpt_path=last must not write a new
    "finished" run without val metrics or checkpoints."""
    train(make_cfg("seed=5", "trainer.max_steps=12", "trainer.val_check_interval=6"))
    again = make_cfg("seed=5", "ckpt_path=last", name="again")
    with pytest.raises(PipelineConfigError, match=r"ckpt_path=last: .* finished \(metrics.json\)"):
        train(again)
    assert not Path(again.paths.output_dir).exists()


def test_resume_refuses_a_checkpoint_of_another_config_naming_the_keys(make_cfg, tmp_path: Path) -> None:
    common = ("pe=rope", "trainer.max_steps=6", "trainer.val_check_interval=2")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="killed"), extra_callbacks=[Kill(at_step=4)])
    other = make_cfg(*common, "ckpt_path=last", "optim.lr=3e-3", "logger=csv", name="other")
    with pytest.raises(PipelineConfigError, match=r"optim\.lr=0\.003 where it had optim\.lr=0\.001"):
        train(other)
    assert not Path(other.paths.output_dir).exists()
    # logging and output paths may differ: this resumes
    resumed = train(make_cfg(*common, "ckpt_path=last", "logger=csv", name="resumed"))
    assert resumed["steps"] == 6 and resumed["resumed_from"].endswith("killed/checkpoints/last.ckpt")


def test_a_checkpoint_moved_out_of_its_run_is_checked_by_what_it_recorded(make_cfg, tmp_path: Path) -> None:
    """Without its run's config.yaml a checkpoint was resumed unchecked: a seed-0 trajectory was
    recorded as seed 5, and another PE failed inside fit with a raw state_dict error. It carries
    its run's config: data settings (a batch size) are checked too (review: a changed batch size
    and accumulation skipped batches). Older checkpoints are checked by their module's
    hyper_parameters."""
    common = ("pe=tape", "trainer.max_steps=6", "trainer.val_check_interval=2")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(make_cfg(*common, name="killed"), extra_callbacks=[Kill(at_step=4)])
    loose = tmp_path / "loose.ckpt"
    loose.write_bytes((tmp_path / "runs/addition/smoke/tape/0/killed/checkpoints/last.ckpt").read_bytes())
    batch = make_cfg(name="probe").task.batch_size
    for change, named in (("seed=5", r"seed=5 where it had seed=0"),
                          ("pe=rope", r"pe\.name=rope.* where it had .*pe\.name=tape"),
                          ("optim.lr=3e-3", r"optim\.lr=0\.003 where it had optim\.lr=0\.001"),
                          (f"task.batch_size={batch // 2}", rf"task\.batch_size={batch // 2} where it had "
                                                            rf"task\.batch_size={batch}")):
        cfg = make_cfg(*common, change, f"ckpt_path={loose}", name="x")
        with pytest.raises(PipelineConfigError, match=named):
            train(cfg)
        assert not Path(cfg.paths.output_dir).exists()
    assert train(make_cfg(*common, "logger=csv", f"ckpt_path={loose}", name="resumed-here"))["steps"] == 6
    state = torch.load(loose, weights_only=False)
    for callback in state["callbacks"].values():
        callback.pop("config", None)  # as checkpoints before 2026-11-29
    state["hyper_parameters"]["model"]["abacus_digit_ids"] = None  # as checkpoints before 2026-11-27
    torch.save(state, loose)
    with pytest.raises(PipelineConfigError, match=r"model\.pe=rope where it had model\.pe=tape"):
        train(make_cfg(*common, "pe=rope", f"ckpt_path={loose}", name="x"))
    assert train(make_cfg(*common, f"ckpt_path={loose}", name="resumed"))["steps"] == 6


def test_ckpt_path_last_takes_the_unfinished_run_of_this_arm(make_cfg, tmp_path: Path) -> None:
    """last took the newest run of experiment/pe/seed and refused it when it was another arm
    (model.abacus), though this arm's unfinished run was there."""
    common = ("pe=rope", "trainer.max_steps=6", "trainer.val_check_interval=2")
    for abacus, name in (("false", "a-without"), ("true", "b-with")):  # b-with is the newest
        with pytest.raises(RuntimeError, match="simulated crash"):
            train(make_cfg(*common, f"model.abacus={abacus}", name=name), extra_callbacks=[Kill(at_step=4)])
    resumed = train(make_cfg(*common, "model.abacus=false", "ckpt_path=last", name="resumed"))
    assert resumed["resumed_from"].endswith("a-without/checkpoints/last.ckpt")


def test_resuming_with_another_data_dir_is_not_a_changed_setting(tmp_path: Path) -> None:
    """paths may change on resume, but keys set from them (pretraining's task.data_dir from
    paths.data_dir, which follows the working directory) were counted as changed settings."""
    from pipelines.resume import check_resumable

    def pretrain_cfg(data_dir: Path):
        return compose_config("config", ["experiment=pretrain/smoke", f"paths.data_dir={data_dir}"])

    run = tmp_path / "killed"
    (run / "checkpoints").mkdir(parents=True)
    OmegaConf.save(pretrain_cfg(tmp_path / "data"), run / "config.yaml", resolve=True)
    torch.save({"state_dict": {}, "global_step": 1}, run / "checkpoints" / "last.ckpt")
    moved = pretrain_cfg(tmp_path / "moved")
    assert moved.task.data_dir == str(tmp_path / "moved")
    check_resumable(moved, run / "checkpoints" / "last.ckpt")
    with open_dict(moved):
        moved.task.data_dir = str(tmp_path / "set by hand")  # a setting of its own: still refused
    with pytest.raises(PipelineConfigError, match="task.data_dir="):
        check_resumable(moved, run / "checkpoints" / "last.ckpt")


def test_a_checkpoint_at_exactly_max_steps_is_refused_with_nothing_left_to_train(make_cfg, tmp_path: Path) -> None:
    """A checkpoint at step == trainer.max_steps whose run never wrote metrics.json (in its run
    or moved out of it) has nothing left to train: refused before anything is written."""
    first = make_cfg("trainer.max_steps=6", name="killed")
    run = Path(first.paths.output_dir)
    (run / "checkpoints").mkdir(parents=True)
    OmegaConf.save(first, run / "config.yaml", resolve=True)
    torch.save({"state_dict": {}, "global_step": 6}, run / "checkpoints" / "last.ckpt")
    loose = tmp_path / "loose.ckpt"
    config = OmegaConf.to_container(first, resolve=True)
    torch.save({"state_dict": {}, "global_step": 6, "callbacks": {"RunHistory": {"config": config}}}, loose)
    for target in (run, loose):
        cfg = make_cfg("trainer.max_steps=6", f"ckpt_path={target}", name="again")
        refused = r"is at step 6, and trainer\.max_steps=6; nothing is left to train"
        with pytest.raises(PipelineConfigError, match=refused):
            train(cfg)
        assert not Path(cfg.paths.output_dir).exists()


def test_a_corrupt_checkpoint_is_named_by_its_key_before_anything_is_written(make_cfg, tmp_path: Path) -> None:
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(b"not a checkpoint at all" * 10)
    cfg = make_cfg(f"ckpt_path={bad}")
    with pytest.raises(PipelineConfigError) as err:
        train(cfg)
    message = str(err.value)
    assert message.startswith(f"ckpt_path={bad} is not a readable Lightning checkpoint")
    assert "weights_only" not in message and "issue" not in message
    assert not Path(cfg.paths.output_dir).exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_trainer_without_a_gpu_fails_before_the_run_dir_is_claimed(make_cfg) -> None:
    cfg = make_cfg("trainer=gpu")
    with pytest.raises(PipelineConfigError, match="trainer.accelerator=gpu .* no usable CUDA GPU"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_gpu_checks_by_their_decisions_with_a_faked_device_count(monkeypatch) -> None:
    """The accelerator check on a (faked) 2-GPU machine: indices past the count are refused."""
    from pipelines.config_checks import check_accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    check_accelerator(OmegaConf.create({"accelerator": "gpu", "devices": [1]}))
    with pytest.raises(PipelineConfigError, match=r"trainer.devices=\[2\]: this machine has 2 GPU"):
        check_accelerator(OmegaConf.create({"accelerator": "gpu", "devices": [2]}))


def test_a_sharded_run_evaluates_and_counts_the_gathered_full_model(make_cfg, monkeypatch) -> None:
    """Under FSDP over two processes rank 0 evaluated its flat shards ('weight' must be 2-D) and
    counted half the parameters. The gathering path, forced on one process, gives the run's own
    numbers and leaves no extra checkpoint."""
    import pipelines.train as train_mod

    plain = train(make_cfg("pe=tape", name="plain"))
    monkeypatch.setattr(train_mod, "_sharded", lambda trainer: True)
    cfg = make_cfg("pe=tape", name="gathered")
    gathered = train(cfg)
    for key in ("n_params", *SUMMARY, "val_loss"):
        assert gathered[key] == plain[key], key
    assert not (Path(cfg.paths.output_dir) / "checkpoints" / "gathered.ckpt").exists()


def test_fsdp_on_a_cpu_is_refused_before_the_run_dir_is_claimed(make_cfg) -> None:
    """Lightning refused it inside the Trainer, after the run directory was claimed (two
    tracebacks and a failed run directory left behind)."""
    cfg = make_cfg("trainer=fsdp", "trainer.accelerator=cpu", "trainer.devices=2")
    with pytest.raises(PipelineConfigError, match="trainer=fsdp shards over GPUs only .* trainer=ddp"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_a_run_ends_with_a_summary_of_its_headline_metrics(make_cfg, capsys) -> None:
    cfg = make_cfg("pe=nope")
    metrics = train(cfg)
    out = capsys.readouterr().out
    assert "---- train done: experiment=addition/smoke pe=nope seed=0" in out
    assert f"mean_accuracy {metrics['mean_accuracy']:.4g}" in out and "val_loss" in out


def test_progress_bar_counts_steps_across_a_resume(make_cfg, capsys) -> None:
    """Issue 14.10: "Epoch 0/-2", and "600/499" on the bar after a resume."""
    def with_bar(*overrides: str, name: str):
        cfg = make_cfg("pe=rope", "trainer.max_steps=6", "trainer.val_check_interval=2", *overrides, name=name)
        with open_dict(cfg):
            cfg.callbacks.rich_progress_bar = {"_target_": "pipelines.callbacks.StepProgressBar"}
            cfg.trainer.enable_progress_bar = True
        return cfg

    with pytest.raises(RuntimeError, match="simulated crash"):
        train(with_bar(name="killed"), extra_callbacks=[Kill(at_step=4)])
    capsys.readouterr()
    train(with_bar("ckpt_path=last", name="resumed"))
    out = capsys.readouterr().out
    assert re.search(r"Training steps\s.*\b6/6\b", out), out
    assert "Epoch" not in out and "/-" not in out


def test_the_summary_shows_each_tasks_headline_metrics() -> None:
    """Issue 14.10: the last line showed only keys containing "accuracy"."""
    from pipelines.summaries import headline

    pretrain = {"task": "pretrain", "ppl_1x": 91.8, "ppl_4x": 97.3, "val_loss": 4.5, "train_time_s": 60.0}
    scrolls = {"task": "scrolls", "scrolls_score": 12.5, "f1": 12.5, "steps": 100}
    extend = {"ppl_books_512_tape": 80.5, "passkey_512_tape": 0.2, "time_eval_tape_s": 3.0}
    assert headline(pretrain) == {"ppl_1x": 91.8, "ppl_4x": 97.3, "val_loss": 4.5}
    assert headline(scrolls) == {"scrolls_score": 12.5, "f1": 12.5}
    assert headline(extend) == {"ppl_books_512_tape": 80.5, "passkey_512_tape": 0.2}
    flipflop = {"read_error_1x": 0.1, "read_error_2x": 4.5, "read_error_dense_2x": 1.2, "read_error_ood": 7.6}
    assert headline(flipflop) == {"read_error_1x": 0.1, "read_error_2x": 4.5, "read_error_ood": 7.6}


def test_evaluation_runs_at_the_precision_asked_for(make_cfg, monkeypatch) -> None:
    """Issue 21.4: every post-training evaluation ran in fp32, whatever the run trained with; and
    pipelines.evaluate follows its own precision=."""
    from pipelines import tasks

    task = tasks.get("addition")
    seen = []
    real = task.evaluate

    def recording(*args, **kwargs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return real(*args, **kwargs)

    monkeypatch.setattr(task, "evaluate", recording)
    cfg = make_cfg("pe=rope", "trainer.precision=bf16-mixed")
    train(cfg)
    cfg32 = compose_config("evaluate", [f"run_dir={cfg.paths.output_dir}", "precision=32-true",
                                        "task.examples_per_cell=1", "logger=none"])
    with open_dict(cfg32):
        cfg32.paths.output_dir = str(Path(cfg.paths.output_dir) / "eval" / "fp32")
    evaluate(cfg32)
    train(make_cfg("pe=rope", "eval_precision=16-mixed", name="fp16"))  # trained in fp32
    assert seen == [torch.bfloat16, torch.float32, torch.float16]


def test_an_unknown_eval_precision_is_refused_before_training(make_cfg) -> None:
    cfg = make_cfg("pe=rope", "eval_precision=fp16")
    with pytest.raises(PipelineConfigError, match="eval_precision=fp16: choose"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()
    with pytest.raises(PipelineConfigError, match="trainer.precision=bf17: choose"):  # not eval_precision
        train(make_cfg("pe=rope", "trainer.precision=bf17", name="typo"))


@pytest.mark.parametrize("overrides", [["trainer.precision=64-true"], ["trainer.precision=64-true", "evaluate=false"],
                                       ["eval_precision=64"]])
def test_fp64_is_refused_before_training(make_cfg, overrides) -> None:
    """64-true crashed at the optimizer after the run dir was claimed (weights train in fp32), and
    eval_precision=64 evaluated the fp32 weights while labelled fp64."""
    cfg = make_cfg("pe=rope", *overrides)
    with pytest.raises(PipelineConfigError, match=r"precision=64(-true)?: choose"):
        train(cfg)
    assert not Path(cfg.paths.output_dir).exists()


def test_an_evaluations_summary_names_the_run_it_read() -> None:
    from pipelines.summaries import run_summary

    job = {"entry": "evaluate", "cfg": {"run_dir": "runs/x/0/run", "task": {"name": "passkey"}},
           "metrics": {"passkey_1024": 1.0}}
    assert run_summary(job).splitlines()[0] == "---- evaluate done: run_dir=runs/x/0/run task=passkey"


def test_a_run_still_training_is_never_resumed_and_a_crashed_one_is(make_cfg) -> None:
    """Issue 23: ckpt_path=last attached to a run that was still training. A run directory is
    locked by its process (released when it ends, stale when the process is gone)."""
    import subprocess
    import sys
    import time

    from pipelines.resume import check_not_live, resolve_ckpt_path
    from pipelines.run_dirs import RUN_LOCK

    cfg = make_cfg("pe=rope", "evaluate=false", name="first")
    train(cfg)
    run = Path(cfg.paths.output_dir)
    assert not (run / RUN_LOCK).exists()  # released when the run ended
    code = ("import os, socket, sys, time; open(sys.argv[1], 'w').write(f'{os.getpid()} "
            "{socket.gethostname()}'); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run / RUN_LOCK)])
    try:
        for _ in range(200):
            if (run / RUN_LOCK).exists() and (run / RUN_LOCK).read_text():
                break
            time.sleep(0.05)
        resume = make_cfg("pe=rope", "evaluate=false", f"ckpt_path={run}", name="second")
        with pytest.raises(PipelineConfigError, match=rf"still training \(PID {holder.pid}\)"):
            resolve_ckpt_path(resume, Path(resume.paths.output_dir))
    finally:
        holder.kill()
        holder.wait()
    check_not_live(run)  # the holder is gone: its lock is stale and no longer blocks a resume
