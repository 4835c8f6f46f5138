"""The Hydra config tree: every preset composes and instantiates; bad input fails early, by name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, WandbLogger
from omegaconf import OmegaConf, open_dict

import tape.pe
from conftest import CONF_DIR, compose_config
from pipelines.config_checks import check_compile, check_trainer
from pipelines.errors import PipelineConfigError
from pipelines.hydra_conf import instantiate_group
from pipelines.models import model_config
from pipelines.preflight import hydra_overrides, only_prints, preflight, unknown_choice
from pipelines import tasks
from pipelines.tasks import addition
from pipelines.train import build_module
from tape.model import DecoderLM

TRAIN_FAMILIES = ("addition", "pretrain", "scrolls")  # experiments run by pipelines.train
PRESETS = sorted(
    str(p.relative_to(CONF_DIR / "experiment").with_suffix(""))
    for family in TRAIN_FAMILIES for p in (CONF_DIR / "experiment" / family).glob("*.yaml")
)


def test_every_registered_pe_has_a_config_and_its_options_are_its_options_fields() -> None:
    files = {p.stem for p in (CONF_DIR / "pe").glob("*.yaml")}
    assert files == set(tape.pe.names())
    for name in files:
        pe = OmegaConf.load(CONF_DIR / "pe" / f"{name}.yaml")
        assert pe.name == name
        assert set(pe) - {"name"} <= set(tape.pe.get(name).Options.names()), name


def test_addition_has_smoke_cpu_and_paper_presets() -> None:
    assert {"addition/smoke", "addition/cpu", "addition/paper"} <= set(PRESETS)


@pytest.mark.parametrize("preset", PRESETS)
def test_preset_composes_validates_and_instantiates(preset: str, tmp_path: Path) -> None:
    """Each preset as written (sizes included) passes every check; its trainer, loggers and
    callbacks instantiate once shrunk to CPU."""
    cfg = compose_config("config", [f"experiment={preset}", "pe=tape"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
    assert cfg.experiment_name.startswith(preset) and cfg.scale == preset.split("/")[-1]
    check_trainer(cfg)
    try:
        tasks.get(cfg.task.name).validate(cfg)
    except PipelineConfigError as err:  # only for a package the preset reads with, missing here
        assert "package is not installed: pip install" in str(err), err
        pytest.skip(f"optional: {err}")
    mc = model_config(cfg)
    assert mc.pe == "tape" and mc.max_seq_len == cfg.task.seq_len
    assert cfg.logger.wandb.offline is True  # default: CSV + W&B offline
    if importlib.util.find_spec("wandb") is not None:  # W&B's logger needs the package (optional)
        assert {type(lg) for lg in instantiate_group(cfg.logger)} == {CSVLogger, WandbLogger}
    assert any(isinstance(cb, ModelCheckpoint) for cb in instantiate_group(cfg.callbacks))
    with open_dict(cfg):
        cfg.trainer.accelerator, cfg.trainer.precision = "cpu", "32-true"
    assert instantiate(cfg.trainer, logger=False).max_steps == cfg.trainer.max_steps


def test_paper_preset_matches_the_spec() -> None:
    cfg = compose_config("config", ["experiment=addition/paper"])
    mc = model_config(cfg)
    assert (mc.n_layers, mc.d_model, mc.n_heads) == (16, 1024, 16)
    assert (cfg.task.max_digits, cfg.task.eval_max_digits, cfg.task.examples_per_cell) == (20, 40, 100)
    assert cfg.task.batch_size * cfg.trainer.accumulate_grad_batches == 512
    assert cfg.trainer.max_steps == 20000 and cfg.optim.lr == 1e-4
    assert cfg.trainer.precision == "bf16-mixed"


def test_arith16_has_the_cramming_ffn_width_and_117_5m_parameters() -> None:
    cfg = compose_config("config", ["experiment=addition/paper", "pe=rope"])
    assert cfg.model.d_ff == 1024  # GELU-GLU: 2048 units before the GLU, 1024 after
    with torch.device("meta"):  # counts without allocating 470 MB
        model = DecoderLM(model_config(cfg))
    assert round(model.num_parameters() / 1e6, 1) == 117.5


def test_fig2_preset_trains_on_40_digits_and_tests_an_80_grid() -> None:
    cfg = compose_config("config", ["experiment=addition/paper_fig2"])
    fig5 = compose_config("config", ["experiment=addition/paper"])
    assert (cfg.task.max_digits, cfg.task.eval_max_digits, cfg.task.examples_per_cell) == (40, 80, 100)
    assert cfg.experiment_name == "addition/paper_fig2" and cfg.scale == "paper_fig2"
    assert cfg.task.seq_len >= 3 * 40 + 4  # the longest training sum fits
    addition.validate(cfg)
    for key in ("trainer", "optim", "model"):  # everything but the lengths as Fig. 5's preset
        a, b = OmegaConf.to_container(cfg[key]), OmegaConf.to_container(fig5[key])
        a.pop("max_seq_len", None), b.pop("max_seq_len", None)
        assert a == b, key
    assert model_config(cfg).max_seq_len == 128


def test_scrolls_paper_uses_gradient_checkpointing() -> None:
    cfg = compose_config("config", ["experiment=scrolls/paper", "pe=tape"])
    assert model_config(cfg).gradient_checkpointing is True
    assert cfg.task.answer_prefix == ""  # Llama's tokenizer: the answer's own '▁', as the official rows
    assert model_config(compose_config("config", ["experiment=scrolls/cpu"])).gradient_checkpointing is False


def test_scrolls_cpu_rows_fit_with_the_instruction_of_pretrain_cpus_tokenizer() -> None:
    """The instruction takes 12 tokens under pretrain/cpu's books BPE (7 under Llama's): with
    summary_head 300 the longest summary row was 513 > 512 tokens, and every dataset failed."""
    from tape.data.scrolls import Lengths

    lengths = dict(compose_config("config", ["experiment=scrolls/cpu"]).task.lengths)
    Lengths(**{**lengths, "summary_tail": 16})  # raises when a row would not fit


@pytest.mark.parametrize("trainer", ["cpu", "gpu", "ddp", "fsdp"])
def test_trainer_presets_compose(trainer: str) -> None:
    cfg = compose_config("config", ["experiment=addition/smoke", f"trainer={trainer}"])
    assert cfg.trainer.max_steps == 6  # the preset's steps survive the hardware choice
    if trainer == "fsdp":  # FSDP gets a callable policy (a ListConfig crashed it), see test_ce_training
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer

        from tape.hf.llama import TapeDecoderLayer
        from tape.model.decoder import Block

        policy = instantiate(cfg.trainer.strategy).kwargs["auto_wrap_policy"]
        assert isinstance(policy, ModuleWrapPolicy)  # one FSDP unit per decoder block
        assert policy._module_classes == {Block, LlamaDecoderLayer, TapeDecoderLayer}


def test_logger_choices() -> None:
    online = compose_config("config", ["logger=wandb_online"])
    assert online.logger.wandb.offline is False and "csv" in online.logger
    assert set(compose_config("config", ["logger=csv"]).logger) == {"csv"}
    assert not compose_config("config", ["logger=none"]).logger
    tags = compose_config("config", ["experiment=addition/cpu", "pe=fire", "seed=3"]).logger.wandb
    assert list(tags.tags) == ["experiment:addition/cpu", "task:addition", "pe:fire", "arm:fire", "scale:cpu", "seed:3"]
    assert tags.group == "addition/cpu" and tags.project == "tape-repro" and tags.name == "fire-seed3"


def test_unknown_preset_lists_the_choices() -> None:
    message = unknown_choice(["pe=tape", "experiment=addition/cpu,addition/huge"])
    assert message.startswith("experiment=addition/huge: no such experiment config")
    assert "addition/smoke" in message and "addition/cpu" in message and "addition/paper" in message
    assert "rope" in unknown_choice(["pe=rotary"])
    assert unknown_choice(["experiment=addition/cpu", "pe=rope,tape", "seed=1", "task.seq_len=4",
                           "hydra.run.dir=x"]) is None
    with pytest.raises(MissingConfigException):
        compose_config("config", ["experiment=addition/huge"])  # Hydra alone would not list them
    with pytest.raises(MissingConfigException) as err:
        compose_config("config", ["pe=rotary"])
    assert "rope" in str(err.value) and "tape" in str(err.value)


def test_unknown_key_is_refused() -> None:
    with pytest.raises(ConfigCompositionException, match="task.max_digit"):
        compose_config("config", ["task.max_digit=5"])


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["task.seq_len=12"], "task.seq_len"),  # longest smoke example is 13 tokens
        (["task.eval_max_digits=2"], "task.eval_max_digits"),
        (["task.examples_per_cell=0"], "task.examples_per_cell"),
        (["pe=randpe", "pe.randpe_max_position=20"], "pe.randpe_max_position"),
        (["model.d_model=30"], "d_model"),
        (["pe=rope", "model.n_heads=4", "model.d_model=36"], "head dim"),
        (["trainer.val_check_interval=4"], "trainer.val_check_interval"),
        (["trainer.accumulate_grad_batches=2"], "trainer.val_check_interval"),
        (["model.vocab_size=10"], "model.vocab_size"),
        (["compile=yes"], "compile"),
        (["compile=true", "trainer=fsdp"], "trainer=fsdp"),
        (["optim.lr=abc"], "optim.lr='abc'"),  # a comparison's TypeError, named as a misspelt key
        (["model.abacus=no"], "abacus='no'"),  # was taken as true
    ],
)
def test_impossible_combinations_fail_before_training_naming_the_key(
    overrides: list[str], key: str
) -> None:
    cfg = compose_config("config", ["experiment=addition/smoke", *overrides])
    with pytest.raises(PipelineConfigError, match=key.replace(".", r"\.")):
        check_trainer(cfg)
        addition.validate(cfg)


def test_randpe_range_that_covers_the_grid_is_accepted() -> None:
    cfg = compose_config("config", ["experiment=addition/smoke", "pe=randpe",
                                    "pe.randpe_max_position=22"])
    addition.validate(cfg)  # 3 * 6 + 4 = 22 positions for the 6-digit test grid


def test_unknown_task_is_named() -> None:
    with pytest.raises(PipelineConfigError, match="task.name='sorting'"):
        tasks.get("sorting")


def test_module_gets_the_composed_model_and_optimizer() -> None:
    cfg = compose_config("config", ["experiment=addition/smoke", "pe=fire", "pe.fire_mlp_width=8",
                                    "optim.lr=0.01"])
    module = build_module(cfg)
    assert module.model.cfg.pe == "fire" and module.model.cfg.pe_options["fire_mlp_width"] == 8
    assert module.model.cfg.vocab_size == 18 and module.hparams.lr == 0.01
    assert module.hparams.total_steps == cfg.trainer.max_steps


def test_compile_reaches_the_module_and_stays_out_of_its_checkpoint() -> None:
    cfg = compose_config("config", ["experiment=addition/smoke", "compile=true"])
    check_trainer(cfg)
    module = build_module(cfg)
    assert module.compile_model is True and "compile_model" not in module.hparams
    assert build_module(compose_config("config", ["experiment=addition/smoke"])).compile_model is False
    with pytest.raises(PipelineConfigError, match="drop compile=true"):
        check_compile(cfg, runs_itself=True)  # context extension trains Hugging Face Llama itself


def test_hydras_own_flags_pass_the_preflight(tmp_path: Path) -> None:
    """`--cfg job` (print the config) used to reach the override parser as an override "job"
    and end in a traceback; flags and their values are Hydra's, and a print-only call is not checked."""
    argv = ["experiment=addition/smoke", "--cfg", "job", "-cn", "config", "--multirun", "--cfg=all", "seed=1"]
    assert hydra_overrides(argv) == ["experiment=addition/smoke", "seed=1"]
    assert only_prints(argv) and only_prints(["--info"]) and not only_prints(["-m", "seed=1,2"])
    runs = tmp_path / "runs"
    preflight("config", ["experiment=addition/smoke", f"paths.runs_dir={runs}", "--cfg", "job"])
    assert not runs.exists()  # nothing checked or created for a call that only prints
    preflight("config", ["experiment=addition/smoke", f"paths.runs_dir={runs}", "-cn", "config"])
    assert runs.is_dir()  # checked (writable) with the flag's value left out of the overrides


def test_a_sweep_with_one_bad_value_is_refused_before_any_job_starts(tmp_path: Path) -> None:
    """`-m seed=0,x` checked its first job only: job 0 trained, then job 1 failed. Every job's
    settings are checked first; the message names each failing job's swept values."""
    from pipelines.train import check_settings

    argv = ["-m", "experiment=addition/smoke", "seed=0,x,2", "task.seq_len=16,12", f"paths.runs_dir={tmp_path}"]
    with pytest.raises(PipelineConfigError) as err:
        preflight("config", argv, check_settings)
    message = str(err.value)
    assert message.startswith("4 of the sweep's 6 jobs would fail their checks, so none was started")
    assert "seed=0 task.seq_len=12, seed=2 task.seq_len=12: task.max_digits=3 needs 13-token" in message
    assert "seed=x task.seq_len=16, seed=x task.seq_len=12: seed='x' must be an integer" in message
    with pytest.raises(PipelineConfigError, match=r"seed=-1: seed=-1 must be in \[0, 2\*\*32\)"):
        preflight("config", ["-m", "experiment=addition/smoke", "seed=0,-1", f"paths.runs_dir={tmp_path}"],
                  check_settings)  # NumPy refuses negative seeds: job 1 crashed after job 0 trained
    preflight("config", ["-m", "experiment=addition/smoke", "seed=0,1", f"paths.runs_dir={tmp_path}"],
              check_settings)  # a good sweep passes
    with pytest.raises(PipelineConfigError, match="1 of the sweep's 1 jobs would fail"):  # a one-job -m too:
        preflight("config", ["-m", "experiment=addition/smoke", "seed=x", f"paths.runs_dir={tmp_path}"],
                  check_settings)  # it left runs/multirun/<time>/multirun.yaml behind
    preflight("config", ["experiment=addition/smoke", "seed=x", f"paths.runs_dir={tmp_path}"],
              check_settings)  # a single run: its task checks it, as before


def test_sweep_jobs_are_the_product_and_a_large_sweep_checks_each_value_once() -> None:
    from pipelines.preflight import sweep_jobs

    jobs = sweep_jobs(["experiment=addition/smoke", "pe=rope,tape", "seed=range(0,3)"])
    assert [label for label, _ in jobs] == [f"pe={pe} seed={s}" for pe in ("rope", "tape") for s in range(3)]
    assert jobs[-1][1] == ["experiment=addition/smoke", "pe=tape", "seed=2"]
    big = sweep_jobs(["pe=rope,tape", "seed=range(0,40)"], most=64)  # 80 jobs: 2 + 40 checked, one repeated
    assert len(big) == 41 and ("pe=tape seed=0", ["pe=tape", "seed=0"]) in big
    assert sweep_jobs(["seed=1"]) == [("", ["seed=1"])]


def test_the_multirun_flag_goes_first_wherever_it_was_given() -> None:
    from pipelines.entry import multirun_flag_first

    assert multirun_flag_first(["a=1", "-m", "b=2,3"]) == ["-m", "a=1", "b=2,3"]
    assert multirun_flag_first(["a=1", "--cfg", "job", "--multirun"]) == ["--multirun", "a=1", "--cfg", "job"]
    assert multirun_flag_first(["a=1"]) == ["a=1"]


def test_a_sweep_job_waiting_for_another_run_does_not_stop_the_others(tmp_path: Path) -> None:
    """SCROLLS with task.pretrained_run=last over PEs: one PE's missing pretraining is that job's
    error at its turn (as before); the PEs that have one still fine-tune."""
    from pipelines.errors import RunNotThereYet
    from pipelines.train import check_settings

    cfg = compose_config("config", ["experiment=scrolls/smoke", "task.pretrained_run=last",
                                    f"paths.runs_dir={tmp_path}"])
    with pytest.raises(RunNotThereYet, match="task.pretrained_run=last: no finished run matches"):
        check_settings(cfg)
    preflight("config", ["-m", "experiment=scrolls/smoke", "pe=rope,tape", "task.pretrained_run=last",
                         f"paths.runs_dir={tmp_path}"], check_settings)


def test_compose_or_none_matches_hydra_and_leaves_a_running_jobs_hydra_alone() -> None:
    """The loader-based composition gives compose()'s config (with the hydra node when asked,
    version base 1.3), and inside an initialised Hydra (a running job) leaves it initialised."""
    from hydra import compose, initialize_config_dir, version
    from hydra.core.global_hydra import GlobalHydra

    from pipelines.hydra_conf import compose_or_none

    overrides = ["experiment=addition/smoke", "pe=rope", "trainer.max_steps=7"]
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        expected = compose(config_name="config", overrides=overrides, return_hydra_config=True)
        before = version.getbase()
        got = compose_or_none("config", overrides, hydra=True)
        assert GlobalHydra.instance().is_initialized()
        assert version.getbase() == before
    GlobalHydra.instance().clear()
    assert got is not None
    plain = OmegaConf.to_container(got, resolve=False)
    wanted = OmegaConf.to_container(expected, resolve=False)
    for node in (plain, wanted):
        node["hydra"]["job"].pop("name")  # the job's name: "app" under initialize, unset outside
    assert plain == wanted
    assert got.hydra.runtime.version_base == "1.3"
    assert "hydra" not in compose_or_none("config", overrides)
    assert compose_or_none("config", ["experiment=no_such/preset"]) is None
