"""The efficiency benchmark runs on a tiny configuration and writes well-formed output.
Nothing here is timed: timings are only checked to be positive and ordered."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

import tape.pe
from tape.bench import make_variants
from tape.bench.attention_op import build_attention_op
from tape.bench.flops import META, count_flops, model_costs
from tape.bench.memory import rss_in_subprocess, saved_tensor_bytes
from tape.bench.timing import paired_ratio, time_interleaved
from tape.model import ModelConfig
from warm_python import run_module

REPO = Path(__file__).resolve().parents[1]
TAPE_LABELS = ["tape_fused", "tape_unfused", "tape_concat", "tape_padded", "tape_triton", "tape_flex"]
ALL_LABELS = [*TAPE_LABELS, *[v.label for v in make_variants([p for p in tape.pe.names() if p != "tape"])]]  # pes: all


def compose_benchmark(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return compose(config_name="benchmark", overrides=list(overrides))


# ---------------------------------------------------------------- building blocks
def test_variants_expand_tape_and_put_the_paper_columns_first():
    labels = [v.label for v in make_variants(["nope", "t5", "rope", "tape", "fire"])]
    assert labels == [*TAPE_LABELS, "rope", "fire", "t5", "nope"]
    assert [v.label for v in make_variants(["rope", "tape"], ["unfused"])] == ["tape_unfused", "rope"]
    with pytest.raises(ValueError, match="unknown PE"):
        make_variants(["rope", "sinusoid?"])
    with pytest.raises(ValueError, match="unknown tape_modes"):
        make_variants(["tape"], ["fast"])


def test_155m_counts_match_the_paper_table3_on_the_meta_device():
    rope = model_costs(ModelConfig(pe="rope"), batch=1, seq_len=1024)
    tape = model_costs(ModelConfig(pe="tape"), batch=1, seq_len=1024)
    assert rope["params"] == 162_417_408  # 154.89 x 2^20, the paper's RoPE column
    assert rope["flops"] == pytest.approx(321.10e9, rel=5e-3)
    assert 0 < tape["params"] - rope["params"] <= 12 * 38_160  # C·I + 2·H·I + H² per layer
    assert tape["flops"] > rope["flops"]


def test_attention_op_runs_for_every_variant_and_tape_counts_more_flops():
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=32, n_heads=4, max_seq_len=16)
    flops = {}
    for v in make_variants(tape.pe.names(),
                           ["fused", "unfused", "concat", "padded"]):
        cfg = v.config(base)
        out, rot = build_attention_op(cfg, 2, 16, torch.device("cpu"), torch.float32)()
        assert out.shape == (2, 4, 16, 8) and torch.isfinite(out).all()
        if v.pe == "tape":
            assert rot is not None and rot.shape == (2, 4, 16, 8)
        flops[v.label] = count_flops(build_attention_op(cfg, 2, 16, META, torch.float32))
    assert flops["tape_unfused"] > flops["tape_concat"] > flops["rope"] > 0
    assert flops["tape_padded"] > flops["tape_concat"]  # the zero-padded QKᵀ is counted at 2d


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_op_runs_in_half_precision_for_every_variant(dtype):
    """The paper-shape GPU benchmark times bf16 ops: TAPE rotates q, k in E's float32, and they
    must reach SDPA in v's dtype, as in the model (it crashed on the first H100 run)."""
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=32, n_heads=4, max_seq_len=16)
    for v in make_variants(tape.pe.names(), ["fused", "unfused", "concat", "padded"]):
        out, _ = build_attention_op(v.config(base), 2, 16, torch.device("cpu"), dtype)()
        assert out.dtype == dtype and torch.isfinite(out.float()).all(), v.label
        assert count_flops(build_attention_op(v.config(base), 2, 16, META, dtype)) > 0


def test_interleaved_timing_calls_each_variant_warmup_plus_repeats_times():
    calls = {"a": 0, "b": 0}

    def bump(name):
        return lambda: calls.__setitem__(name, calls[name] + 1)

    timings = time_interleaved({"a": bump("a"), "b": bump("b")}, warmup=2, repeats=5,
                               device=torch.device("cpu"))
    assert calls == {"a": 7, "b": 7}
    for t in timings.values():
        assert t.n == 5 and 0 <= t.min_s <= t.median_s <= t.max_s
    same = {"median": 1.0, "min": 1.0, "max": 1.0, "stderr": 0.0}
    assert paired_ratio(timings["a"], timings["a"]) == same
    assert all(t.cpu_median_s is not None and len(t.cpu_samples_s) == 5 for t in timings.values())


def test_paired_ratio_reports_cpu_time_and_a_standard_error():
    from tape.bench.timing import Timing

    num = Timing.of([2.0, 2.2, 1.8, 2.0], cpu_samples=[1.0, 1.0, 1.0, 1.0])
    den = Timing.of([1.0, 1.0, 1.0, 1.0], cpu_samples=[0.5, 0.5, 0.5, 0.5])
    wall, cpu = paired_ratio(num, den), paired_ratio(num, den, cpu=True)
    assert wall["median"] == pytest.approx(2.0) and wall["stderr"] > 0
    assert cpu == {"median": 2.0, "min": 2.0, "max": 2.0, "stderr": 0.0}


def test_saved_tensor_bytes_counts_each_storage_once_and_skips_weights():
    w = torch.nn.Parameter(torch.randn(64, 64))
    x = torch.randn(8, 64, requires_grad=True)
    # x * x saves x twice (one storage); x @ w saves x and w; the weight is excluded.
    assert saved_tensor_bytes(lambda: (x * x) @ w, exclude=[w]) == 2 * 8 * 64 * 4
    assert saved_tensor_bytes(lambda: x * x) == 8 * 64 * 4


def test_train_step_keeps_no_gradients_between_steps():
    from tape.bench.train_step import TrainStep

    cfg = ModelConfig(vocab_size=32, n_layers=1, d_model=16, n_heads=2, max_seq_len=8)
    step = TrainStep(cfg, batch=1, seq_len=8, device=torch.device("cpu"))
    before = [p.detach().clone() for p in step.model.parameters()]
    step()
    assert all(p.grad is None for p in step.model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(before, step.model.parameters()))  # it stepped


def test_train_step_memory_is_measured_with_one_model_resident(monkeypatch):
    """After the interleaved timing, each variant's memory comes from a fresh model alone on the
    device (a paper-shape GPU run ran out of memory with all 16 variants resident)."""
    import gc
    import weakref

    import tape.bench.run as bench_run

    alive: list[weakref.ref] = []
    most = {"memory": 0}
    real_build, real_probe = bench_run.TrainStep, bench_run.saved_tensor_bytes

    def build(*args, **kwargs):
        step = real_build(*args, **kwargs)
        alive.append(weakref.ref(step))
        return step

    def probe(fn, exclude=()):
        gc.collect()
        most["memory"] = max(most["memory"], sum(r() is not None for r in alive))
        return real_probe(fn, exclude)

    monkeypatch.setattr(bench_run, "TrainStep", build)
    monkeypatch.setattr(bench_run, "saved_tensor_bytes", probe)
    train = bench_run.TrainSettings(vocab_size=64, n_layers=1, d_model=32, n_heads=2, seq_len=32,
                                    warmup=1, repeats=2)
    settings = bench_run.BenchSettings(train=train, rss=False)
    out = bench_run._train_bench(make_variants(["tape", "rope"], ["fused", "unfused"]), settings,
                                 torch.device("cpu"), None, lambda msg: None)
    assert most["memory"] == 1
    rows = out["rows"]
    assert all(r["memory"]["saved_activation_bytes"] > 0 for r in rows.values())
    assert all("saved_by_tensor" in r["memory"] for r in rows.values())  # TAPE and RoPE rows only


def test_rss_probe_reports_a_step_peak_in_a_fresh_process():
    cfg = ModelConfig(vocab_size=32, n_layers=1, d_model=16, n_heads=2, max_seq_len=16, pe="rope")
    out = rss_in_subprocess({"model": cfg.to_dict(), "batch": 1, "seq_len": 16, "threads": 1})
    assert "error" not in out, out
    assert out["rss_peak_bytes"] >= out["rss_before_bytes"] > 0
    assert out["rss_step_peak_bytes"] >= 0


def test_the_rss_probe_steps_under_the_benchmarks_autocast(monkeypatch):
    """The fresh-process RSS step ran in fp32 while the timed steps of a bf16 benchmark used
    autocast (review): the spec carries the section's autocast and the probe applies it."""
    from tape.bench import rss_probe
    from tape.bench import run as bench_run

    specs, probed = [], []
    monkeypatch.setattr(bench_run, "rss_in_subprocess", lambda spec: specs.append(spec) or {})
    train = bench_run.TrainSettings(vocab_size=64, n_layers=1, d_model=32, n_heads=2, seq_len=16,
                                    warmup=1, repeats=1)
    bench_run._train_bench(make_variants(["rope"]), bench_run.BenchSettings(train=train, rss=True),
                           torch.device("cpu"), torch.bfloat16, lambda msg: None)
    assert [s["autocast"] for s in specs] == ["bfloat16"]

    real = rss_probe.TrainStep
    monkeypatch.setattr(rss_probe, "TrainStep", lambda *a, **k: probed.append(k.get("autocast")) or real(*a, **k))
    monkeypatch.setattr(rss_probe, "rss_step_peak", lambda step: {})
    rss_probe.main([json.dumps(specs[0])])
    assert probed == [torch.bfloat16]


def test_saved_bytes_leave_out_autocasts_copies_of_the_weights():
    """Under bf16 autocast the weights' bf16 copies autograd keeps were counted as activations,
    though weights are excluded (review: 8 % of RoPE's saved bytes in the H200 window)."""
    from tape.bench.train_step import TrainStep

    cfg = ModelConfig(vocab_size=512, n_layers=2, d_model=128, n_heads=4, max_seq_len=64, pe="rope")
    step = TrainStep(cfg, 1, 64, torch.device("cpu"), autocast=torch.bfloat16)
    step()
    params = list(step.model.parameters())
    weights_bf16 = sum(p.numel() * 2 for n, p in step.model.named_parameters()
                       if n.endswith("proj.weight") or n == "lm_head.weight")
    counted = saved_tensor_bytes(step.loss, exclude=params)
    with_copies = saved_tensor_bytes(step.loss, exclude=[])  # weights and their copies counted
    assert with_copies - counted >= weights_bf16  # every projection's bf16 copy is left out


# ---------------------------------------------------------------- the pipeline
def test_config_presets_and_overrides():
    from pipelines.benchmark import settings_from_config

    s = settings_from_config(compose_benchmark())
    assert (s.device, s.scale, s.op.seq_len, s.train.n_layers) == ("cpu", "cpu", 1024, 2)
    assert s.tape_modes == ["fused", "unfused", "concat", "padded", "triton", "flex"]
    s = settings_from_config(compose_benchmark("scale=paper", "device=cuda", "repeats=7"))
    assert (s.train.n_layers, s.train.vocab_size, s.op.repeats, s.train.repeats) == (12, 32000, 7, 7)
    with pytest.raises(ValueError, match="scale"):
        settings_from_config(compose_benchmark("scale=huge"))
    assert settings_from_config(compose_benchmark("pes=tape")).pes == ["tape"]  # was ['t', 'a', 'p', 'e']
    with pytest.raises(ValueError, match="backend='flashy'; choose one of"):  # before any table runs
        settings_from_config(compose_benchmark("backend=flashy"))
    for override, message in (("repeats=abc", "repeats='abc': give an integer >= 1"),
                              ("repeats=0", "repeats=0: give an integer >= 1"),
                              ("warmup=-1", "warmup=-1: give an integer >= 0"),
                              ("threads=abc", "threads='abc': give an integer >= 1"),
                              ("rss=maybe", "rss='maybe'; choose true, false or null")):
        with pytest.raises(ValueError, match=re.escape(message)):  # was a crash midway, or taken as true
            settings_from_config(compose_benchmark(override))


def test_a_sweep_leaves_only_hydras_record_under_runs_multirun(tmp_path):
    """`-m` made ./multirun/<date>/<time>/<job>/ in the current directory."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    done = run_module("pipelines.benchmark", ["-m", "scale=tiny", "pes=[rope]", "tape_modes=[fused]",
                                              f"output_dir={tmp_path / 'out'}", "seed=0,1"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "runs"]
    records = [p.relative_to(tmp_path).parts for p in (tmp_path / "runs").rglob("*") if p.is_file()]
    assert len(records) == 1 and records[0][:2] == ("runs", "multirun") and records[0][-1] == "multirun.yaml"
    assert len(list((tmp_path / "out").glob("efficiency*.json"))) == 2  # the first job's pair kept


def test_bad_settings_end_in_one_line_before_any_work(tmp_path):
    """They ended in tracebacks, some after the benchmark had run (an output_dir that is a file)."""
    afile = tmp_path / "a-file"
    afile.write_text("")
    done = run_module("pipelines.benchmark", ["scale=tiny", f"output_dir={afile}"], Path(__file__).resolve().parents[1])
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"pipelines.benchmark: output_dir={afile} is a file; give a directory"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error raised without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    from pipelines.benchmark import run

    with pytest.raises(ValueError, match="device=cuda but this machine has no usable CUDA GPU"):
        run(compose_benchmark("scale=tiny", "device=cuda", f"output_dir={tmp_path}"), [])


def assert_tables_well_formed(md: str) -> None:
    """Every markdown table has a header, a rule and rows, all with the same number of cells."""
    widths: list[int] = []
    for line in md.splitlines() + [""]:
        if line.startswith("|"):
            assert line.endswith("|")
            widths.append(line.count("|"))
        elif widths:
            assert len(set(widths)) == 1 and len(widths) >= 3, widths
            widths = []


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    """One tiny benchmark run through the pipeline: (output dir, overrides)."""
    from pipelines.benchmark import run

    out = tmp_path_factory.mktemp("bench")
    overrides = ["scale=tiny", f"output_dir={out}"]
    run(compose_benchmark(*overrides), overrides)
    return out, overrides


def test_tiny_run_writes_well_formed_markdown_and_json(tiny_run):
    tmp_path, overrides = tiny_run
    res = json.loads((tmp_path / "efficiency.json").read_text())
    assert res["command"] == "python -m pipelines.benchmark " + " ".join(overrides)
    assert {"machine", "versions", "git", "settings", "created_utc"} <= set(res)
    assert res["versions"]["torch"] == torch.__version__
    assert list(res["table3"]["rows"]) == ALL_LABELS
    t3 = res["table3"]["rows"]  # Table 3 counts TAPE fused with one QKᵀ, whatever the device ran
    assert t3["tape_fused"]["flops"] == t3["tape_triton"]["flops"] == t3["tape_flex"]["flops"] == t3["tape_concat"]["flops"]
    assert t3["tape_concat"]["flops"] < t3["tape_unfused"]["flops"]
    for section in ("attention_op", "train_step"):
        rows = res[section]["rows"]
        assert list(rows) == ALL_LABELS
        for row in (r for r in rows.values() if "not_run" not in r):
            t = row["time_s"]
            assert t["n"] > 0 and 0 < t["min_s"] <= t["median_s"] <= t["max_s"]
            assert row["flops"] > 0 and row["vs_rope"]["time"] > 0
        assert rows["rope"]["vs_rope"]["time"] == 1.0
    for section in ("attention_op", "train_step"):  # no GPU: the CUDA-only rows say so, no timings
        for label in ("tape_triton", "tape_flex"):
            row = res[section]["rows"][label]
            assert row["not_run"] == "not run: no GPU" and "time_s" not in row and row["flops"] > 0
    train = res["train_step"]["rows"]
    assert all(r["memory"]["saved_activation_bytes"] > 0 for r in train.values() if "not_run" not in r)
    assert train["tape_fused"]["memory"]["saved_activation_bytes"] > train["rope"]["memory"]["saved_activation_bytes"]
    summary = res["tape_vs_rope"]
    for section in ("attention_op", "train_step"):
        assert summary[section]["flop_lower_bound"] > 1.0
        assert summary[section]["fused"]["time"] > 0 and summary[section]["unfused"]["time"] > 0
        assert summary[section]["triton"]["not_run"] == "not run: no GPU"
    assert summary["train_step"]["fused"]["cpu_time_paired"]["median"] > 0
    gap = summary["train_step"]["saved_by_tensor_minus_rope"]["unfused"]
    fused_gap = train["tape_unfused"]["memory"]["saved_activation_bytes"] - train["rope"]["memory"]["saved_activation_bytes"]
    assert sum(gap.values()) == fused_gap  # the by-tensor gaps add up to the total gap
    assert summary["paper_table4"]["fused"] == pytest.approx(2.56 / 2.08)

    md = (tmp_path / "efficiency.md").read_text()
    for heading in ("## TAPE / RoPE", "## Parameters, FLOPs and MACs", "## (a) Attention operator",
                    "## (b) Training step", "## How this is measured"):
        assert heading in md
    for name in ("TAPE fused", "TAPE unfused", "TAPE concat", "TAPE padded", "TAPE Triton kernel",
                 "RoPE", "FIRE", "T5 bias", "ALiBi", "xPos", "RandPE", "NoPE"):
        assert f"| {name} |" in md
    assert "not run: no GPU" in md and "### Saved for backward by tensor" in md
    assert res["command"] in md and "not run for this file" in md
    assert_tables_well_formed(md)


def test_a_run_re_renders_from_its_json_alone(tiny_run, tmp_path, capsys):
    """``python -m tape.bench.render``: the markdown beside an efficiency.json, the same bytes
    as the run wrote (nothing else read); a missing file is named, nothing written."""
    import shutil

    from tape.bench.render import main

    copy = tmp_path / "efficiency.json"
    shutil.copy(tiny_run[0] / "efficiency.json", copy)
    assert main([str(copy)]) == 0
    assert (tmp_path / "efficiency.md").read_text() == (tiny_run[0] / "efficiency.md").read_text()
    assert main([str(tmp_path / "gone" / "efficiency.json")]) == 1
    assert "no such file" in capsys.readouterr().err and not (tmp_path / "gone").exists()


def test_cuda_results_render_with_memory_and_mfu_columns(tiny_run):
    """The CUDA-only fields (peak allocated, MFU) render into well-formed tables (no GPU needed)."""
    from tape.bench.render import default_notes, render_markdown

    res = json.loads((tiny_run[0] / "efficiency.json").read_text())
    res["settings"]["device"] = "cuda"
    res["machine"]["gpu"] = "NVIDIA H100 80GB HBM3"
    res["train_step"]["peak_bf16_flops"] = 989.4e12
    for section in ("attention_op", "train_step"):
        rows = res[section]["rows"]  # on a GPU the CUDA-only rows are timed like the others
        for mode in ("triton", "flex"):
            rows[f"tape_{mode}"] = dict(rows["tape_fused"], backend=mode)
            res["tape_vs_rope"][section][mode] = res["tape_vs_rope"][section]["fused"]
        for i, row in enumerate(rows.values()):
            row.setdefault("memory", {})["cuda_peak_bytes"] = 2**20 * (i + 1)
            row["vs_rope"]["memory"]["cuda_peak_bytes"] = (i + 1) / 3
            row["mfu"] = 0.25
    md = render_markdown(res, default_notes(res))
    assert "CUDA peak (MiB)" in md and "MFU %" in md and "not run: no GPU" not in md
    assert "not run for this file" not in md
    assert_tables_well_formed(md)


def test_the_command_line_entry_point_runs(tmp_path):
    proc = run_module("pipelines.benchmark", ["scale=tiny", "pes=[rope,tape]", f"output_dir={tmp_path}"], REPO)
    assert proc.returncode == 0, proc.stderr
    res = json.loads((tmp_path / "efficiency.json").read_text())
    assert list(res["attention_op"]["rows"]) == [*TAPE_LABELS, "rope"]
    assert (tmp_path / "efficiency.md").read_text().startswith("# Efficiency")


def test_the_default_output_is_a_run_directory_never_results():
    """Only the reproduction copies a benchmark into results/ (pipelines/reproduce.py)."""
    for scale in ("tiny", "cpu", "paper"):
        cfg = compose_benchmark(f"scale={scale}")
        assert cfg.output_dir == f"runs/benchmark/{scale}"
        assert not Path(cfg.output_dir).parts[0] == "results"


def test_operator_notes_name_every_registered_encoding():
    """The efficiency notes describe each encoding from its class attributes, so a new encoding
    is described without editing the renderer."""
    import tape.pe
    from tape.bench.render import encoding_operators

    text = encoding_operators()
    for name in tape.pe.names():
        if name != "tape":  # TAPE's operator has its own sentence
            assert tape.pe.display(name) in text, name
    bias = text.split("float32 bias")[0].rsplit(".", 1)[-1]  # the list before "compute a ... bias"
    assert "CoPE" in bias and "PaTH" in bias and "RoPE" not in bias.replace("p-RoPE", "")


# ---------------------------------------------------------------- the attention operator by length
def test_the_sweep_times_each_length_both_passes_and_says_what_did_not_run(tmp_path, capsys):
    """Tiny shapes on the CPU: every length gets rows, RoPE is the reference, CUDA-only paths and
    bias encodings past their length say why they did not run, and the CLI writes after each length."""
    from pipelines.attention_sweep import main as sweep_main

    args = ["--device", "cpu", "--seq-lens", "16", "32", "--tokens", "32", "--d-model", "32", "--n-heads", "2",
            "--variants", "rope", "tape_unfused", "tape_flex", "fire", "--bias-max-len", "16",
            "--warmup", "1", "--repeats", "2", "--out", str(tmp_path)]
    assert sweep_main(args) == 0
    res = json.loads((tmp_path / "sweep.json").read_text())
    assert res["command"] == "python -m pipelines.attention_sweep " + " ".join(args)
    rows = {int(n): r for n, r in res["rows"].items()}
    assert list(rows) == [16, 32] and rows[16]["rope"]["batch"] == 2 and rows[32]["rope"]["batch"] == 1
    for n, row in rows.items():
        assert row["rope"]["forward"]["vs_rope"] == row["rope"]["forward_backward"]["vs_rope"] == 1.0
        tape = row["tape_unfused"]
        assert tape["flops"]["forward"] > row["rope"]["flops"]["forward"]  # A·E and the E updates
        assert tape["flops"]["forward_backward"] > 2 * tape["flops"]["forward"]
        assert tape["forward_backward"]["tflops"] > 0 and tape["forward"]["time_s"]["median_s"] > 0
        assert row["tape_flex"]["not_run"] == "not run: no GPU" and "forward" not in row["tape_flex"]
    assert "forward" in rows[16]["fire"] and rows[32]["fire"]["not_run"].startswith("not run: a materialised")
    md = (tmp_path / "sweep.md").read_text()
    assert md.strip() in capsys.readouterr().out  # the log keeps the tables too
    assert "| tape_flex | not run: no GPU | not run: no GPU |" in md and "## Forward and backward" in md
    assert "| fastest TAPE path | two_calls | two_calls | |" in md  # the only TAPE path that ran
    assert_tables_well_formed(md)


@pytest.mark.parametrize("mode", ["unfused", "concat", "padded"])
def test_the_swept_backward_differentiates_tapes_e_as_layers_past_the_first_do(mode):
    """Past layer 0, E is computed, so backward owes it a gradient through A·E (for two SDPA
    calls, one more N x N product); the sweep timed and counted the op without it."""
    from tape.bench.sweep import _variants, _with_grads

    (variant,) = _variants([f"tape_{mode}"])
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=32, n_heads=2, max_seq_len=64, attn_backend="sdpa")
    cfg = variant.config(base)
    op = build_attention_op(cfg, 2, 16, torch.device("cpu"), torch.float64)
    grads = _with_grads(op)()
    assert grads[-1] is not None and grads[-1].shape == op.state.rot.shape and grads[-1].abs().sum() > 0


def test_the_fastest_tape_path_is_the_quickest_that_ran():
    from tape.bench.sweep import fastest_tape_path

    def timed(ms):
        return {"forward_backward": {"time_s": {"median_s": ms / 1e3}}}

    row = {"rope": timed(1.0), "tape_triton": timed(1.6), "tape_flex": timed(1.4),
           "tape_unfused": timed(2.0), "tape_concat": {"not_run": "not run: no GPU"}}
    assert fastest_tape_path(row) == "flex"
    assert fastest_tape_path({"rope": timed(1.0)}) is None


def test_a_length_that_runs_out_of_memory_is_told_and_the_sweep_goes_on(monkeypatch):
    import tape.bench.sweep as sweep_mod

    real = sweep_mod._one_length

    def short_of_memory(s, variants, n, *args):
        if n == 16:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB\nmore detail")
        return real(s, variants, n, *args)

    monkeypatch.setattr(sweep_mod, "_one_length", short_of_memory)
    settings = sweep_mod.SweepSettings(seq_lens=[16, 32], tokens=32, d_model=32, n_heads=2,
                                       variants=["rope", "tape_unfused"], warmup=1, repeats=1)
    res = sweep_mod.sweep(settings, torch.device("cpu"), torch.float32, log=lambda m: None)
    assert res["rows"][16]["rope"]["not_run"] == ("not run: out of memory at this length "
                                                  "(CUDA out of memory. Tried to allocate 9 GiB)")
    assert "forward_backward" in res["rows"][32]["tape_unfused"]
    md = sweep_mod.markdown(res, "python -m pipelines.attention_sweep")
    assert "| rope | not run: out of memory" in md and "| 1.00 |" in md  # FLOPs from the length that ran
    assert "FLOPs / RoPE's (N = 32) |" in md  # and the header names that length (the ratio falls with N)
    assert_tables_well_formed(md)


def test_the_sweep_refuses_a_variant_it_does_not_know_with_the_choices():
    from tape.bench.sweep import SweepSettings, sweep

    with pytest.raises(ValueError, match="--variants tape: name an encoding .* tape_<mode>, mode one of fused"):
        sweep(SweepSettings(variants=["rope", "tape"]), torch.device("cpu"), torch.float32)


def test_on_cuda_tape_fused_is_counted_with_one_qk():
    """On CUDA tape_fused=true runs one QKᵀ (the kernel or one [V | E] call); a GPU benchmark
    counted it as the CPU's call at 1024 keys (q and k padded to [V | E]'s width)."""
    from tape.bench.variants import counted_on

    variants = {v.label: v for v in make_variants(["tape"], ["fused", "triton"])}
    base = ModelConfig(vocab_size=8, n_layers=2, d_model=64, n_heads=4, max_seq_len=1024, attn_backend="auto")

    def op_flops(label: str, device: str) -> int:
        cfg = counted_on(variants[label], variants[label].config(base), torch.device(device))
        return count_flops(build_attention_op(cfg, 1, 1024, META, torch.float32, 0))

    assert op_flops("tape_fused", "cuda") == op_flops("tape_triton", "cuda")  # one QKᵀ, as the kernel
    assert op_flops("tape_fused", "cpu") > op_flops("tape_fused", "cuda")  # the CPU's padded call


def test_the_sweep_counts_tape_fused_as_it_runs_on_cuda(monkeypatch):
    """On CUDA tape_fused is one QKᵀ (the Triton kernel); the sweep counted the CPU's padded
    layout there (2.0x RoPE's fwd+bwd FLOPs, not 1.5x), inflating its TFLOP/s by 1.33."""
    import tape.bench.sweep as sweep_mod
    from tape.bench.variants import make_variants

    monkeypatch.setattr(sweep_mod, "not_run_reason", lambda v, device: "not run: counted only")
    monkeypatch.setattr(sweep_mod, "time_interleaved", lambda fns, warmup, repeats, device: {})
    settings = sweep_mod.SweepSettings(seq_lens=[1024], tokens=1024, d_model=64, n_heads=2, warmup=0, repeats=1)
    variants = [v for v in make_variants(["tape", "rope"], ["fused", "triton"]) if v.label in ("tape_fused", "tape_triton", "rope")]
    row = sweep_mod._one_length(settings, variants, 1024, torch.device("cuda"), torch.float32, log=lambda m: None)
    flops = {label: row[label]["flops"]["forward_backward"] for label in row}
    assert flops["tape_fused"] == flops["tape_triton"]
    assert 1.45 < flops["tape_fused"] / flops["rope"] < 1.6


def test_cuda_peaks_reports_the_step_added_and_the_total(monkeypatch):
    """The memory target is judged on a step's whole peak (weights and AdamW state in it); the
    added peak alone overstated TAPE / RoPE (1.155 against about 1.11 on the H200)."""
    from tape.bench import memory

    allocated = {"now": 100, "peak": 100}

    def step():
        allocated["peak"] = 160

    monkeypatch.setattr(memory, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: allocated["now"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: allocated.update(peak=allocated["now"]))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: allocated["peak"])
    assert memory.cuda_peaks(step, torch.device("cuda")) == {"cuda_peak_bytes": 60, "cuda_total_peak_bytes": 160}


def test_the_benchmark_tables_give_tflops_beside_time():
    """The issue asks for TFLOP/s beside time: the operator's and the step's tables have it, the
    counted FLOPs over the median time (here the H200 window's committed benchmark)."""
    import json
    from pathlib import Path

    from tape.bench.render import render_markdown

    res = json.loads(Path("results/gpu-check/20261127-185221/benchmark/efficiency.json").read_text())
    lines = render_markdown(res).splitlines()
    for section, unit in (("attention_op", "ms / call"), ("train_step", "s / step")):
        header = next(line for line in lines if f"| {unit} | TFLOP/s |" in line)
        rope = next(line for line in lines[lines.index(header):] if line.startswith("| RoPE"))
        row = res[section]["rows"]["rope"]
        want = f"{row['flops'] / row['time_s']['median_s'] / 1e12:.3g}"
        assert rope.split(" | ")[header.split(" | ").index("TFLOP/s")] == want
