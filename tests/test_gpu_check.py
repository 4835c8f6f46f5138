"""make gpu-check wired on a CPU: the checks it runs, its refusal without a GPU, and a results
page that is only ever written from a run on a GPU (the summaries below are test fixtures)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tarfile
import time
from dataclasses import replace
from pathlib import Path

import pytest

from pipelines import gpu_check, gpu_page, gpu_targets, gpu_windows
from warm_python import run_module


def warm(argv, cwd: Path):
    """gpu_check's ``python -m`` command lines forked from a warm interpreter (tests/warm_python.py)."""
    assert tuple(argv[:2]) == (sys.executable, "-m"), argv
    return run_module(argv[2], argv[3:], cwd)


def test_dry_run_lists_every_check(capsys: pytest.CaptureFixture) -> None:
    assert gpu_check.main(["--dry-run", "--suite", "all"]) == 0
    out = capsys.readouterr().out
    assert "pytest -q -m cuda" in out and "pipelines.gpu_check model" in out
    for exp in gpu_check.SMOKE_EXPERIMENTS:
        assert f"experiment={exp}/smoke trainer=gpu logger=csv" in out
    assert "trainer=fsdp trainer.devices=1" in out and "gradient_clip_val=0.5" in out
    assert "experiment=addition/smoke pe=tape compile=true trainer=gpu" in out
    assert "pipelines.benchmark device=cuda scale=paper" in out and "pipelines.gpu_check llama7b" in out
    assert "tape.kernels.autotune --dtypes bfloat16 --head-dims 64,128" in out
    for preset in gpu_check.GPU_PRESETS:  # RoPE's and TAPE's minutes: the arms' range
        for pe in ("rope", "tape"):
            assert f"pipelines.gpu_check preset --experiment {preset} --pe {pe} --runs" in out
    assert "pipelines.gpu_check resume --runs" in out and "pipelines.gpu_check throughput" in out
    assert "tape.bench.step_profile" in out
    lines = out.splitlines()  # the kernel tests are not run twice
    paths = next(line for line in lines if "every encoding" in line)
    assert paths.rstrip().endswith("tests/test_cuda_paths.py") and "--ignore" not in paths
    assert "--ignore=tests/test_cuda_paths.py" in next(line for line in lines if "kernel and training step" in line)
    # the benchmark's tables land in the window's record, which comes back with its summary
    bench = next(line for line in lines if "pipelines.benchmark" in line)
    assert "output_dir=results/gpu-check/" in bench and bench.rstrip().endswith("/benchmark")
    by_length = next(line for line in lines if "pipelines.attention_sweep" in line)
    assert "--device cuda --out results/gpu-check/" in by_length and by_length.rstrip().endswith("/sweep")


def test_the_core_suite_is_the_proof_and_times_alone_after_the_proofs(tmp_path: Path) -> None:
    """make gpu-check: every proof the issue asks for, the untimed ones first (side by side), then
    the timed ones; the profiles, sweep, autotuning and timed presets are gpu-measure's."""
    core = gpu_check.checks(tmp_path, suite="core")
    names = " | ".join(c.name for c in core)
    for word in ("pytest -m cuda", "Triton vs SDPA", "FSDP", "torch.compile", "resume", "Llama-2-7B",
                 "throughput", "benchmark at the paper's shape"):
        assert word in names
    assert not any(w in names for w in ("profiler", "by length", "autotune", "time 50 steps"))
    timed = [c.timed for c in core]
    assert timed == sorted(timed) and timed.count(True) == 3  # llama7b, throughput, benchmark
    side_by_side = [c.expected_s for c in core if not c.timed]
    assert side_by_side == sorted(side_by_side, reverse=True)  # the longest start first
    assert "kernel and training step" in core[0].name
    assert [c.name for c in core if c.timed] == ["TAPE at Llama-2-7B layer shape, N=4096",
                                                 "throughput of the paper presets, random weights",
                                                 "benchmark at the paper's shape"]
    bench = next(c for c in core if "benchmark" in c.name)
    assert "pes=[tape,rope,fire,t5]" in bench.argv  # paper Table 4's columns
    measure = gpu_check.checks(tmp_path, suite="measure")
    assert all(c.timed and c.suite == "measure" for c in measure)
    assert {c.name for c in gpu_check.checks(tmp_path)} == {c.name for c in core + measure}


def _sleeper(name: str, timed: bool, seconds: float, ok: bool = True, expected_s: int = 0) -> gpu_check.Check:
    """A step that prints its start and end times (perf_counter is per process: use time.time)."""
    code = (f"import os, time; a = time.time(); time.sleep({seconds}); "
            f"print(a, time.time(), os.environ.get('OMP_NUM_THREADS', 'unset')); raise SystemExit({0 if ok else 1})")
    return gpu_check.Check(name, (sys.executable, "-c", code), 30, timed=timed, expected_s=expected_s)


def test_untimed_steps_run_side_by_side_and_timed_steps_alone(tmp_path: Path) -> None:
    steps = [_sleeper("a", False, 1.5), _sleeper("b", False, 1.5, ok=False), _sleeper("c", False, 1.5),
             _sleeper("t1", True, 0.5), _sleeper("t2", True, 0.5)]
    seen: list[list[str]] = []
    outcomes = gpu_check.run_steps(steps, tmp_path, jobs=3, on_done=lambda done: seen.append([o.name for o in done]))
    assert [o.name for o in outcomes] == ["a", "b", "c", "t1", "t2"]  # step order, whatever the finish order
    assert [o.passed for o in outcomes] == [True, False, True, True, True]
    assert [o.log for o in outcomes] == ["00.log", "01.log", "02.log", "03.log", "04.log"]
    printed = {o.name: (tmp_path / o.log).read_text().split() for o in outcomes}
    spans = {name: [float(x) for x in words[:2]] for name, words in printed.items()}
    if "OMP_NUM_THREADS" not in os.environ:  # side by side, the cores are split; alone, untouched
        assert printed["a"][2] == str(max(1, (os.cpu_count() or 1) // 3)) and printed["t1"][2] == "unset"
    assert max(spans[n][0] for n in "abc") < min(spans[n][1] for n in "abc")  # all three overlapped
    assert spans["t1"][0] >= max(spans[n][1] for n in "abc")  # a timed step waits for the others
    assert spans["t2"][0] >= spans["t1"][1]  # and runs alone
    assert len(seen) == 5 and seen[-1] == ["a", "b", "c", "t1", "t2"]  # the summary after every step


def test_the_budget_stops_starting_steps(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    steps = [_sleeper("a", True, 0.1), _sleeper("b", True, 0.1)]
    outcomes = gpu_check.run_steps(steps, tmp_path, budget_s=5)  # under 10 s left: nothing starts
    assert outcomes == [] and capsys.readouterr().out.count("skip ") == 2


def test_a_timed_step_expected_to_outlast_the_budget_waits_for_the_next_call(tmp_path: Path, monkeypatch,
                                                                            capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(gpu_check, "MIN_LEFT_S", 0.5)
    steps = [_sleeper("long", True, 0.1, expected_s=60), _sleeper("short", True, 0.1, expected_s=1),
             _sleeper("side", False, 0.1, expected_s=60)]
    outcomes = gpu_check.run_steps(steps, tmp_path, budget_s=20)
    assert [o.name for o in outcomes] == ["short", "side"]  # an untimed step starts early: no skipping
    assert "skip long" in capsys.readouterr().out


def test_a_step_cut_at_its_limit_takes_the_processes_it_started_with_it(tmp_path: Path) -> None:
    """pytest's workers and the resume check's training legs outlived a cut step and kept the
    GPU busy beside the timed steps after it (review)."""
    psutil = pytest.importorskip("psutil")
    pid_file = tmp_path / "child.pid"
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    step = gpu_check.Check("spawner", (sys.executable, "-c", code), 3)
    outcome = gpu_check.run_check(step, tmp_path / "00.log")
    assert outcome.returncode is None and not outcome.passed and not outcome.budget_cut
    child = int(pid_file.read_text())
    for _ in range(50):  # killed; at most a zombie until init reaps it
        if not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"the step's child {child} outlived the cut")


def test_every_measure_step_says_how_long_it_takes(tmp_path: Path) -> None:
    """All measure steps had the default 30 s, so with --budget a minutes-long step started with
    30 s left and was cut (review)."""
    measure = gpu_check.checks(tmp_path / "runs", tmp_path / "w", "measure")
    assert all(c.timed and c.suite == "measure" for c in measure)
    assert all(c.expected_s > 30 for c in measure if "autotune" not in c.name)
    assert all(c.expected_s <= c.limit_s for c in measure)


def test_a_step_the_budget_stopped_keeps_the_older_verdict_on_the_page(tmp_path: Path) -> None:
    """A --budget cut is no verdict: it read 'cut off (time limit)' and hid an older pass."""
    records = tmp_path / "records"
    summary(records, gpu=True, fsdp_passed=True)
    later = summary(records, gpu=True, stamp="20261126-010000") / "summary.json"
    cut = json.loads(later.read_text())
    cut["outcomes"][1].update(passed=False, returncode=None, budget_cut=True)
    later.write_text(json.dumps(cut))
    page = gpu_page.page_md([json.loads((p / "summary.json").read_text()) for p in sorted(records.iterdir())])
    newest = page.split("## Newest verdict of each check")[1].split("## Window")[0]
    assert "| fsdp | pass | 20261126-000000 |" in newest
    assert "not finished (--budget spent; --continue runs it)" in page and "cut off (time limit)" not in page


def test_without_a_gpu_it_refuses_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    assert gpu_check.main(["--runs", str(tmp_path / "runs"), "--records", str(tmp_path / "records")]) == 2
    assert "no CUDA device" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_a_packed_window_is_rewritten_after_every_step(tmp_path: Path, monkeypatch) -> None:
    """--pack: the archive is rewritten after every step, so a window killed before its end still
    comes back whole to that point, as one file (the device tool brings back 8 files, 2 folders deep)."""
    pytest.importorskip("torch")
    import torch

    steps = [_sleeper("a", False, 0.1), _sleeper("b", False, 0.1, ok=False), _sleeper("t", True, 0.1)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a faked GPU: the steps are sleepers
    env = {"device": "fake", "gpu": "True", "driver": "-", "torch": "-", "triton": "-", "cuda": "-", "commit": "abc"}
    monkeypatch.setattr(gpu_check, "environment", lambda: env)
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: steps)
    packed: list[list[str]] = []
    real_pack = gpu_windows.pack_window

    def pack_and_look(window: Path, archive: Path) -> None:
        real_pack(window, archive)
        with tarfile.open(archive) as tar:
            packed.append(sorted(tar.getnames()))

    monkeypatch.setattr(gpu_check, "pack_window", pack_and_look)
    out = tmp_path / "out"
    assert gpu_check.main(["--records", str(tmp_path / "records"), "--runs", str(tmp_path / "runs"),
                           "--pack", str(out)]) == 1  # step b failed
    (archive,) = out.iterdir()  # one file, no partial one left
    stamp = archive.name.removesuffix(".tar.gz")
    assert len(packed) == 4 and all(f"{stamp}/summary.json" in names for names in packed)  # at once, then a step each
    assert {f"{stamp}/{i:02d}.log" for i in range(3)} <= set(packed[-1])
    window = gpu_windows.unpack_window(archive, tmp_path / "results")
    outcomes = json.loads((window / "summary.json").read_text())["outcomes"]
    assert [(o["name"], o["passed"]) for o in outcomes] == [("a", True), ("b", False), ("t", True)]
    assert (window / "02.log").read_text() == (tmp_path / "records" / stamp / "02.log").read_text()


def test_unpack_never_overwrites_a_window_and_refuses_what_is_not_one(tmp_path: Path) -> None:
    window = summary(tmp_path / "device", gpu=True)
    (window / "benchmark").mkdir()
    (window / "benchmark" / "efficiency.md").write_text("# tables\n")
    gpu_windows.pack_window(window, tmp_path / "out" / "w.tar.gz")
    records = tmp_path / "records"
    assert gpu_check.main(["--records", str(records), "--unpack", str(tmp_path / "out" / "w.tar.gz")]) == 0
    landed = records / window.name
    assert (landed / "benchmark" / "efficiency.md").read_text() == "# tables\n"
    (landed / "00.log").write_text("committed")
    with pytest.raises(SystemExit, match="never overwritten"):
        gpu_windows.unpack_window(tmp_path / "out" / "w.tar.gz", records)
    assert (landed / "00.log").read_text() == "committed"
    stray = tmp_path / "stray.tar.gz"
    with tarfile.open(stray, "w:gz") as tar:  # a folder that is no window: no summary.json
        tar.add(window / "benchmark", arcname="20261126-000001")
    with pytest.raises(SystemExit, match="not one gpu-check window"):
        gpu_windows.unpack_window(stray, records)
    assert not (records / "20261126-000001").exists()
    with pytest.raises(SystemExit, match="no such file"):
        gpu_windows.unpack_window(tmp_path / "missing.tar.gz", records)


def summary(tmp_path: Path, gpu: bool, stamp: str = "20261126-000000", fsdp_passed: bool = False) -> Path:
    run = tmp_path / stamp
    run.mkdir(parents=True)
    env = {"device": "NVIDIA H100 80GB HBM3" if gpu else "cpu", "gpu": str(gpu), "driver": "580.1",
           "torch": "2.11.0", "triton": "3.6.0", "cuda": "13.0", "commit": "0123456789ab"}
    outcomes = [{"name": "kernel", "command": "pytest -m cuda", "passed": True, "wall_s": 12.0,
                 "returncode": 0, "log": "00.log", "tail": []},
                {"name": "fsdp", "command": "train", "passed": fsdp_passed, "wall_s": 30.0,
                 "returncode": 0 if fsdp_passed else 1, "log": "01.log", "tail": ['{"err": 0.01}']}]
    (run / "summary.json").write_text(json.dumps({"dir": str(run), "environment": env, "outcomes": outcomes}))
    return run


def test_the_page_renders_from_gpu_runs_only(tmp_path: Path) -> None:
    page = tmp_path / "gpu.md"
    gpu = summary(tmp_path / "records", gpu=True)
    with pytest.raises(SystemExit, match="ran without a GPU"):
        gpu_page.render([gpu, summary(tmp_path / "cpu", gpu=False)], page)
    assert not page.exists()
    gpu_page.render([gpu], page)
    text = page.read_text()
    assert "NVIDIA H100 80GB HBM3" in text and "| kernel | pass |" in text and "| fsdp | FAIL |" in text
    assert "1 of 2 steps passed" in text and '- fsdp: `{"err": 0.01}`' in text
    assert "efficiency.md" not in text


def test_the_page_names_the_window_where_it_lies_and_its_benchmark_tables(tmp_path: Path) -> None:
    """A window written on a device (its summary's dir is the device's path) is rendered from where
    it was copied to, with the benchmark's tables when the window holds them."""
    window = summary(tmp_path / "records", gpu=True)
    recorded = json.loads((window / "summary.json").read_text())
    (window / "summary.json").write_text(json.dumps(recorded | {"dir": "/device/out/gpu-check/20261126-000000"}))
    (window / "benchmark").mkdir()
    (window / "benchmark" / "efficiency.md").write_text("# tables\n")
    gpu_page.render([window], tmp_path / "gpu.md")
    text = (tmp_path / "gpu.md").read_text()
    assert "/device/out" not in text and f"`{window}`: commit" in text
    assert f"`{window / 'benchmark' / 'efficiency.md'}`" in text and "by length" not in text
    assert gpu_page.FULL_SQUARE in text  # the TFLOP/s of a causal kernel count the whole square
    (window / "sweep").mkdir()
    (window / "sweep" / "sweep.md").write_text("# by length\n")
    gpu_page.render([window], tmp_path / "gpu.md")
    assert f"The attention operator by length: `{window / 'sweep' / 'sweep.md'}`" in (tmp_path / "gpu.md").read_text()


def test_the_page_shows_each_checks_newest_verdict(tmp_path: Path) -> None:
    """A later window that reruns a failed check replaces its verdict at the top; both windows stay."""
    records = tmp_path / "records"
    summary(records, gpu=True)
    rerun = summary(records, gpu=True, stamp="20261126-010000", fsdp_passed=True) / "summary.json"
    only_fsdp = json.loads(rerun.read_text())
    only_fsdp["outcomes"] = only_fsdp["outcomes"][1:]
    rerun.write_text(json.dumps(only_fsdp))
    assert gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")]) == 0
    text = (tmp_path / "gpu.md").read_text()
    newest = text.split("## Newest verdict of each check")[1].split("## Window")[0]
    assert "| fsdp | pass | 20261126-010000 |" in newest and "| kernel | pass | 20261126-000000 |" in newest
    assert text.index("## Window 20261126-010000") < text.index("## Window 20261126-000000")


def test_the_page_says_whether_make_gpu_check_ran_whole_and_passed(tmp_path: Path) -> None:
    """Parts of the proof spread over windows are not the proof: the page names only a window that
    ran the whole core suite with every step passing."""
    records = tmp_path / "records"
    summary(records, gpu=True, fsdp_passed=True)  # before the suites: no plan recorded
    partial = summary(records, gpu=True, stamp="20261126-010000", fsdp_passed=True) / "summary.json"
    data = json.loads(partial.read_text())
    partial.write_text(json.dumps({**data, "suite": "core", "only": None, "planned": ["kernel", "fsdp", "throughput"]}))
    assert not gpu_page.complete_core_run(json.loads(partial.read_text()))  # throughput never ran
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    text = (tmp_path / "gpu.md").read_text()
    assert "No window has yet run `make gpu-check` whole" in text and "(suite core: 3 steps planned)" in text
    whole = summary(records, gpu=True, stamp="20261126-020000", fsdp_passed=True) / "summary.json"
    whole.write_text(json.dumps({**json.loads(whole.read_text()), "suite": "core", "only": None,
                                 "planned": ["kernel", "fsdp"]}))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    text = (tmp_path / "gpu.md").read_text()
    assert "ran whole with every step passing in: 20261126-020000 (NVIDIA H100 80GB HBM3" in text
    only = {**json.loads(whole.read_text()), "only": "kernel,fsdp"}
    assert not gpu_page.complete_core_run(only)  # --only is never the whole proof


def test_the_page_renders_step_profiles_as_tables_and_judges_the_compiled_ratio(tmp_path: Path) -> None:
    """The profile's JSON line (a fixture shaped like tape.bench.step_profile's) becomes a table;
    a compiled profile's TAPE/RoPE step time is judged against the 1.10 target."""
    records = tmp_path / "records"
    path = summary(records, gpu=True) / "summary.json"
    data = json.loads(path.read_text())
    rows = {"rope": {"wall_ms": 20.0, "device_busy_ms": 18.0, "busy_share": 0.9, "kernels_per_step": 400.0},
            "tape_fused": {"wall_ms": 23.0, "device_busy_ms": 21.0, "busy_share": 0.91, "kernels_per_step": 520.0,
                           "wall_ms_vs_rope": 1.15, "kernels_per_step_vs_rope": 1.3}}
    profile = {"device": "NVIDIA H100 80GB HBM3", "seq_len": 1024, "compiled": True, "batch_4": rows}
    data["outcomes"].append({"name": "a 155M step compiled (torch.compile), RoPE vs TAPE, batch 4 (profiler)",
                             "command": "python -m tape.bench.step_profile --compile", "passed": True, "wall_s": 300.0,
                             "returncode": 0, "log": "02.log", "tail": ["compiling", json.dumps(profile)]})
    path.write_text(json.dumps(data))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    text = (tmp_path / "gpu.md").read_text()
    assert "| 4 | TAPE (auto) | 23.0 | 21.0 | 0.91 | 520 | 1.150 | 1.30 |" in text
    assert "Compiled TAPE / RoPE step time at batch 4: 1.150, target <= 1.1: missed" in text
    assert json.dumps(profile) not in text  # a table, not the raw line
    assert "CUDA graphs were skipped" not in text
    from pipelines.gpu_targets import profile_md

    rows["tape_fused"]["cudagraph_skips"] = 2
    graphs = {**profile, "compile_mode": "reduce-overhead"}
    assert any(line.startswith("CUDA graphs were skipped for TAPE (auto)") for line in profile_md(graphs))


def test_an_eager_profile_is_judged_only_where_ropes_device_is_busy() -> None:
    """Eager: a batch whose RoPE step keeps the device busy < 0.9 of the time is host-bound and not
    judged; a busier one is. Compiled ratios are judged at every batch, with the share beside."""
    from pipelines.gpu_targets import profile_md

    def rows(share: float, ratio: float) -> dict:
        return {"rope": {"wall_ms": 50.0, "device_busy_ms": 50.0 * share, "busy_share": share, "kernels_per_step": 2000.0},
                "tape_fused": {"wall_ms": 50.0 * ratio, "busy_share": share, "kernels_per_step": 2900.0,
                               "wall_ms_vs_rope": ratio, "kernels_per_step_vs_rope": 1.45}}

    profile = {"device": "NVIDIA H100 80GB HBM3", "seq_len": 1024, "compiled": False,
               "batch_4": rows(0.25, 1.69), "batch_32": rows(0.95, 1.08)}
    text = "\n".join(profile_md(profile))
    assert "Eager TAPE / RoPE at batch 4: 1.690, not judged: RoPE's device was busy 0.25" in text
    assert "Eager TAPE / RoPE step time at batch 32: 1.080, target <= 1.1: met" in text
    text = "\n".join(profile_md(profile | {"compiled": True}))
    assert "Compiled TAPE / RoPE step time at batch 4: 1.690, target <= 1.1: missed" in text
    assert "RoPE device-busy share 0.25, below 0.9" in text
    text = "\n".join(profile_md(profile | {"compiled": True, "compile_mode": "reduce-overhead"}))
    assert text.startswith("Compiled (torch.compile, mode reduce-overhead) training step")


def test_a_benchmark_whose_rope_step_is_host_bound_says_so(tmp_path: Path) -> None:
    """The H200 benchmark's RoPE ran at 6.9 % MFU: the targets table says the step is probably
    host-bound; at a high MFU it does not."""
    from pipelines.gpu_targets import targets_md

    efficiency = json.loads(Path("results/gpu-check/20261127-185221/benchmark/efficiency.json").read_text())
    assert any("6.9 % of the GPU's dense bf16 peak" in line for line in targets_md(efficiency))
    efficiency["train_step"]["rows"]["rope"]["mfu"] = 0.45
    assert not any("MFU" in line for line in targets_md(efficiency))


def test_a_window_that_counted_tape_fused_as_two_products_says_so() -> None:
    """bb65664 counted tape_fused=true on CUDA as the padded one-call layout (1.115x RoPE's step
    FLOPs) while the same kernel's own row counted 1.060x: the page names the discrepancy."""
    from pipelines.gpu_targets import targets_md

    efficiency = json.loads(Path("results/gpu-check/20261127-185221/benchmark/efficiency.json").read_text())
    note = [line for line in targets_md(efficiency) if line.startswith("FLOPs / RoPE of tape_fused=true")]
    assert len(note) == 1 and "(1.115) differ from the Triton kernel's (1.060)" in note[0]
    rows = efficiency["train_step"]["rows"]
    rows["tape_fused"]["flops"] = rows["tape_triton"]["flops"]  # counted as the current code does
    assert not any(line.startswith("FLOPs / RoPE of tape_fused") for line in targets_md(efficiency))


def test_the_page_says_which_tape_path_ran_the_training_step_fastest() -> None:
    """Paired over the benchmark's rounds against auto's CUDA path: on the H200 record (the kernel
    of bb65664) two SDPA calls ran the step 8 % faster than the Triton kernel; a path given the
    kernel's own times shows no difference; no per-round samples, no section."""
    import copy

    from pipelines.gpu_targets import fastest_path_md

    efficiency = json.loads(Path("results/gpu-check/20261127-185221/benchmark/efficiency.json").read_text())
    text = "\n".join(fastest_path_md(efficiency))
    assert "| two SDPA calls | 0.917 | [0.866, 0.972] |" in text and "| FlexAttention | 0.993 |" in text
    assert text.count("| faster |") == 2 and "Fastest step here: two SDPA calls" in text
    slow = copy.deepcopy(efficiency)
    rows = slow["train_step"]["rows"]
    for mode in ("unfused", "concat", "padded", "flex"):
        rows[f"tape_{mode}"]["time_s"]["samples_s"] = [1.2 * t for t in rows["tape_triton"]["time_s"]["samples_s"]]
    text = "\n".join(fastest_path_md(slow))
    assert text.count("| slower |") == 4 and "Fastest step here: the Triton kernel" in text
    import tape.model.attention as attention

    with pytest.MonkeyPatch.context() as patch:  # auto on two SDPA calls: the kernel is the one compared
        patch.setattr(attention, "CUDA_TAPE_PATH", "two_calls")
        text = "\n".join(fastest_path_md(efficiency))
    assert "`auto`'s path on CUDA (two SDPA calls)" in text and "| the Triton kernel | 1.090 | [1.029, 1.155] |" in text
    for row in rows.values():
        row["time_s"].pop("samples_s", None)
    assert fastest_path_md(slow) == []


def test_the_page_judges_the_operator_target_by_length_from_a_gpu_sweep(tmp_path: Path) -> None:
    """sweep/sweep.json of a window (a fixture shaped like tape/bench/sweep.py's) becomes a table
    against the 1.6 operator target, with the fastest path per length; a CPU sweep is not judged."""
    records = tmp_path / "records"
    window = summary(records, gpu=True)

    def timed(seconds: float, ratio: float, tflops: float) -> dict:
        return {"forward_backward": {"time_s": {"median_s": seconds}, "vs_rope": ratio, "tflops": tflops}}

    sweep = {"settings": {"device": "cuda:0", "dtype": "bfloat16", "d_model": 768, "n_heads": 12},
             "rows": {"1024": {"rope": timed(1.0, 1.0, 300.0), "tape_triton": timed(1.8, 1.8, 250.0),
                               "tape_flex": timed(1.5, 1.5, 290.0), "tape_unfused": {"not_run": "not run: x"}},
                      "2048": {"rope": timed(3.0, 1.0, 400.0), "tape_triton": timed(6.0, 2.0, 100.0)}}}
    (window / "sweep").mkdir()
    (window / "sweep" / "sweep.json").write_text(json.dumps(sweep))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    text = (tmp_path / "gpu.md").read_text()
    assert "| 1024 | triton | 1.800 | missed | 250.0 | 300.0 | 0.83 | met |" in text  # TFLOP/s share >= 0.6
    assert "| 1024 | flex | 1.500 | met | 290.0 | 300.0 | 0.97 | - |" in text and "| 1024 | two_calls |" not in text
    assert "| 2048 | triton | 2.000 | not judged | 100.0 | 400.0 | 0.25 | not judged |" in text  # N = 1024 only
    (window / "sweep" / "sweep.json").write_text(json.dumps({**sweep, "settings": {"device": "cuda", "dtype": "float32"}}))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    assert "| 1024 | triton | 1.800 | not judged |" in (tmp_path / "gpu.md").read_text()  # not bf16
    (window / "sweep" / "sweep.json").write_text(json.dumps(sweep))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    text = (tmp_path / "gpu.md").read_text()
    assert "N = 1024: flex; N = 2048: triton." in text
    (window / "sweep" / "sweep.json").write_text(json.dumps({**sweep, "settings": {"device": "cpu"}}))
    gpu_check.main(["--records", str(records), "--render", str(tmp_path / "gpu.md")])
    assert "Attention operator target by length" not in (tmp_path / "gpu.md").read_text()


def test_the_page_needs_a_summary(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="make gpu-check on a GPU"):
        gpu_check.main(["--records", str(tmp_path), "--render", str(tmp_path / "gpu.md")])


def test_the_model_check_runs_on_a_cpu_at_a_small_shape() -> None:
    """The same code at a tiny shape on CPU (the kernel under the Triton interpreter)."""
    from model_helpers import triton_interpreter_problem

    if triton_interpreter_problem():
        pytest.skip(triton_interpreter_problem())
    errors = gpu_check.model_check(n=24, batch=1, device="cpu",
                                   shape=dict(vocab_size=64, n_layers=2, d_model=32, n_heads=2))
    assert set(errors) == {"sdpa_logits", "sdpa_grads", "triton_logits", "triton_grads"}
    assert 0 < errors["sdpa_logits"] < 0.1 and errors["triton_grads"] < max(2e-2, 3 * errors["sdpa_grads"])


def test_the_llama7b_check_runs_on_a_cpu_at_head_dim_128() -> None:
    """Its code at a small width with Llama-2-7B's head dim; on CPU both backends are SDPA."""
    out = gpu_check.llama7b_check(n=32, device="cpu",
                                  shape=dict(vocab_size=64, n_layers=2, d_model=256, n_heads=2, d_ff=512))
    assert out["auto_vs_sdpa_bf16"] <= 2e-2 and out["auto_vs_sdpa_fp32"] <= 1e-3
    assert {"sdpa_bf16_s", "auto_fp32_s", "auto_bf16_peak_gib"} <= set(out)


def test_only_picks_checks_by_name(capsys: pytest.CaptureFixture) -> None:
    assert gpu_check.main(["--dry-run", "--only", "llama-2-7b"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "pipelines.gpu_check llama7b" in lines[0]
    assert gpu_check.main(["--dry-run", "--only", "by length,profiler"]) == 0  # --only looks in every suite
    assert len(capsys.readouterr().out.strip().splitlines()) == 4  # the sweep and three profiles
    with pytest.raises(SystemExit):
        gpu_check.main(["--dry-run", "--only", "no such check"])


@pytest.mark.slow
def test_the_resume_check_runs_on_a_cpu(tmp_path: Path) -> None:
    """Its three command lines on the CPU: interrupted at step 4 (last.ckpt at step 3), resumed
    to step 6, then evaluated again; both evaluations of the same weights agree."""
    out = gpu_check.resume_check(tmp_path / "runs", device="cpu", run=warm)
    assert out["checkpoint_step"] == 3 and {"interrupted_s", "resumed_s", "evaluated_s"} <= set(out)
    for key in gpu_check.SUMMARY_KEYS:
        assert out[f"eval_{key}"] == out[f"run_{key}"]


@pytest.mark.slow
def test_throughput_runs_every_paper_preset_on_a_cpu_at_a_tiny_shape(capsys: pytest.CaptureFixture) -> None:
    from pipelines.throughput import RECIPES, paper_presets, throughput

    tiny = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "task.batch_size=2",
            "task.seq_len=16")
    llama = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_heads=2, num_kv_heads=2)
    out = throughput("cpu", steps=1, warmup=1, layers=2, llama=llama, decoder_overrides=tiny,
                     extension_overrides=("model.context=32", "extend.context=64"), echo=True)
    presets = [p for p in paper_presets() if p != "context_extension/paper"]
    assert {"addition/paper", "pretrain/paper", "scrolls/paper"} <= set(presets)
    assert set(out) == {*presets, *(f"context_extension/paper:{r}" for r in RECIPES)}
    pretrain = out["pretrain/paper"]  # 16 micro-batches of 2 x 16 tokens a step, 10k steps
    assert pretrain["tokens_per_step"] == 16 * 32 and pretrain["steps"] == 10000
    assert pretrain["hours"] == pytest.approx(pretrain["step_s"] * 10000 / 3600)
    tape = out["context_extension/paper:tape"]  # 2 layers timed, projected to 32; 64 rows of 64 a step
    assert tape["step_s"] == pytest.approx(tape["measured_call_s"] * 16 * 64)
    assert tape["tokens_per_step"] == 64 * 64 and tape["steps"] == 1000
    last = capsys.readouterr().out.strip().splitlines()[-1]  # the line the results page shows
    assert set(json.loads(last)) == set(out)


def test_throughput_times_generated_tasks_at_their_real_batch_width() -> None:
    """addition/paper was timed at 256 x 80 tokens, its batches being padded to their longest
    sum (at most 3 x 20 + 4 = 64): 1.28x the real work (review)."""
    from pipelines.throughput import FILLED, compose_preset, micro_batch_shape

    addition = compose_preset("addition/paper", ("pe=tape",))
    assert micro_batch_shape(addition) == (256, 64) and int(addition.task.seq_len) == 80
    pretrain = compose_preset("pretrain/paper", ("pe=tape", *FILLED.get("pretrain/paper", ())))
    assert micro_batch_shape(pretrain) == (int(pretrain.task.batch_size), int(pretrain.task.seq_len))


def test_the_extension_peak_adds_what_a_layer_measures(monkeypatch) -> None:
    """The 32-layer peak was the measured one plus weights and optimizer state only: the
    activations gradient checkpointing keeps per layer were left out (review). A layer's share
    is now the peak's difference between two layer counts."""
    import tape.hf.io
    from pipelines import throughput

    built: list[int] = []
    real_build = tape.hf.io.build_llama
    monkeypatch.setattr(tape.hf.io, "build_llama",
                        lambda **kw: built.append(kw["num_layers"]) or real_build(**kw))
    monkeypatch.setattr(throughput, "_peak_gib", lambda device: 3.0 + 0.5 * built[-1])  # 0.5 GiB a layer
    llama = dict(vocab_size=64, hidden_size=64, intermediate_size=96, num_heads=2, num_kv_heads=2)
    row = throughput.extension_recipe("lora", "cpu", steps=1, warmup=1, layers=4, shape=llama,
                                      overrides=("model.context=32", "extend.context=64"))
    assert built == [4, 2] and row["peak_gib_per_layer"] == pytest.approx(0.5)
    assert row["peak_gib"] == pytest.approx(3.0 + 0.5 * 32) and row["measured_peak_gib"] == pytest.approx(5.0)


def test_the_page_judges_the_efficiency_targets_from_a_gpu_benchmark(tmp_path: Path) -> None:
    """The H200 window's committed benchmark: every TAPE path missed the step-time target."""
    import re
    import shutil

    from pipelines.gpu_targets import STEP_TIME_TARGET, targets_md, window_targets

    window = Path("results/gpu-check/20261127-185221")
    efficiency = json.loads((window / "benchmark" / "efficiency.json").read_text())
    rows = [line for line in targets_md(efficiency) if line.startswith("| ") and "step time" not in line]
    assert len(rows) == 6 and all(len(re.findall(r"(?<!\\)\|", r)) == 9 for r in rows)  # no bare | in a cell
    triton = next(r for r in rows if r.startswith("| the Triton kernel |"))
    ratio = efficiency["tape_vs_rope"]["train_step"]["triton"]["time_paired"]["median"]
    assert f"{ratio:.3f}" in triton and ("missed" in triton) == (ratio > STEP_TIME_TARGET)
    # this window recorded the step's added peak only: the column says so
    assert any("peak memory / RoPE (above the step's start" in line for line in targets_md(efficiency))
    # a path that did not run, and a run off the targets' shape: shown, never judged, no crash
    broken = json.loads(json.dumps(efficiency))
    broken["tape_vs_rope"]["train_step"]["triton"] = {"flops": 1.06}
    broken["train_step"]["config"]["n_layers"] = 2
    lines = targets_md(broken)
    assert "Not judged: the targets hold at the 155M shape, N = 1024, batch 4, bf16 (n_layers 2)." in lines[0]
    for key, value in (("batch", 1), ("vocab_size", 4096), ("n_heads", 6)):  # a smaller batch reads lower
        other = json.loads(json.dumps(efficiency))
        other["train_step"]["config"][key] = value
        assert f"bf16 ({key} {value})." in targets_md(other)[0]
    assert not any("| met |" in r or "| missed |" in r for r in lines)
    assert "| the Triton kernel | - ± - | not judged | - | not judged | - | 2.89 | 1.060 |" in lines
    cpu_window = tmp_path / "cpu"
    (cpu_window / "benchmark").mkdir(parents=True)
    efficiency["machine"]["device"] = "cpu"
    (cpu_window / "benchmark" / "efficiency.json").write_text(json.dumps(efficiency))
    assert window_targets(cpu_window) == [] and window_targets(tmp_path / "none") == []
    shutil.copytree(window, tmp_path / "gpu")
    assert window_targets(tmp_path / "gpu")[0] == "### Efficiency targets (TAPE / RoPE)"
    measured = tmp_path / "measure"  # a measure-suite window: the benchmark of every encoding only
    shutil.copytree(window / "benchmark", measured / "benchmark-all")
    assert window_targets(measured)[0] == "### Efficiency targets (TAPE / RoPE)"


def _fake_gpu(monkeypatch, steps: list[gpu_check.Check], code: str = "c0de") -> None:
    """A faked GPU whose checks are ``steps`` (sleepers) and whose code digest is ``code``."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    env = {"device": "fake", "gpu": "True", "driver": "-", "torch": "-", "triton": "-", "cuda": "-",
           "commit": "abc", "code": code}
    monkeypatch.setattr(gpu_check, "environment", lambda: dict(env))
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: steps)
    monkeypatch.setattr(gpu_check, "MIN_LEFT_S", 0.5)
    monkeypatch.setattr(gpu_check, "STARTED", time.perf_counter())  # --budget counts from here, as from a process start


def test_a_window_cut_by_the_budget_is_finished_by_a_second_call(tmp_path: Path, monkeypatch) -> None:
    """A call limit cut the proof: --continue runs what is left on the same machine and code, into
    the same window; unpacking the continued window replaces the committed one, losing nothing."""
    pytest.importorskip("torch")
    names = ("a", "t1", "t2")
    _fake_gpu(monkeypatch, [_sleeper("a", False, 0.1), _sleeper("t1", True, 20), _sleeper("t2", True, 0.1)])
    runs, results = tmp_path / "runs", tmp_path / "results"
    assert gpu_check.main(["--records", str(tmp_path / "device"), "--runs", str(runs), "--pack",
                           str(tmp_path / "out1"), "--budget", "2"]) == 1
    (archive,) = (tmp_path / "out1").iterdir()
    window = gpu_windows.unpack_window(archive, results)  # committed here
    first = json.loads((window / "summary.json").read_text())
    assert [(o["name"], o["passed"], o["budget_cut"]) for o in first["outcomes"]] == [("a", True, False),
                                                                                      ("t1", False, True)]
    assert not gpu_page.complete_core_run(first) and gpu_windows.pending_steps(first) == ["t1", "t2"]

    # the next call: the tree (the committed window with it) is copied to the device again
    _fake_gpu(monkeypatch, [_sleeper(n, n != "a", 0.1) for n in names])
    device_copy = tmp_path / "copy" / window.name
    shutil.copytree(window, device_copy)
    seen_runs: list[Path] = []
    monkeypatch.setattr(gpu_check, "checks", lambda runs_dir, record, suite: seen_runs.append(runs_dir) or
                        [_sleeper(n, n != "a", 0.1) for n in names])
    assert gpu_check.main(["--continue", str(device_copy), "--runs", str(runs), "--pack", str(tmp_path / "out2")]) == 0
    # a retried call 2 (one that died before any outcome came back) gets runs of its own
    (call2,) = seen_runs
    assert call2.parent.name.startswith(f"{window.name}-call2-") and len(call2.parent.name) > len(window.name) + 7
    continued = gpu_windows.unpack_window(tmp_path / "out2" / archive.name, results)
    assert continued == window
    done = json.loads((window / "summary.json").read_text())
    assert [o["name"] for o in done["outcomes"]] == list(names) and all(o["passed"] for o in done["outcomes"])
    assert [o["log"] for o in done["outcomes"]] == ["00.log", "call2-00.log", "call2-01.log"]
    assert [o["name"] for o in done["superseded"]] == ["t1"] and done["calls"][1]["ran"] == ["t1", "t2"]
    assert (window / "01.log").is_file()  # the cut step's first log is kept
    assert gpu_page.complete_core_run(done)
    page = gpu_page.page_md([done])
    assert "2 calls, same GPU, stack and code" in page
    assert f"ran whole with every step passing in: {window.name} (fake, commit abc; 2 calls" in page
    # nothing is left to continue
    assert gpu_check.main(["--continue", str(window), "--runs", str(runs)]) == 0


def test_a_window_continues_only_with_the_same_code(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("torch")
    _fake_gpu(monkeypatch, [_sleeper("a", True, 0.1), _sleeper("b", True, 0.1)])
    records = tmp_path / "records"
    assert gpu_check.main(["--records", str(records), "--runs", str(tmp_path), "--only", "a"]) == 0
    (window,) = records.iterdir()
    before = (window / "summary.json").read_text()
    _fake_gpu(monkeypatch, [_sleeper("a", True, 0.1), _sleeper("b", True, 0.1)], code="changed")
    with pytest.raises(SystemExit, match="code=c0de; here code=changed"):
        gpu_check.main(["--continue", str(window), "--runs", str(tmp_path)])
    assert (window / "summary.json").read_text() == before
    with pytest.raises(SystemExit, match="no summary.json"):
        gpu_check.main(["--continue", str(tmp_path / "nowhere"), "--runs", str(tmp_path)])


def test_a_continuation_sets_partial_outputs_aside_and_unpack_checks_every_file(tmp_path: Path,
                                                                               monkeypatch) -> None:
    """A cut step's partial tables move to <name>.cut-2 before it runs again; an archive that
    drops or changes a committed file is refused."""
    pytest.importorskip("torch")
    device = tmp_path / "device"

    _fake_gpu(monkeypatch, [])
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: [
        gpu_check.Check("sweep", (sys.executable, "-c", "import os, sys, time; d = sys.argv[1][6:]; "
                                  "os.makedirs(d); open(d + '/t.md', 'w').write('partial'); time.sleep(20)",
                                  f"--out={record}/sweep"), 30, timed=True, expected_s=0)])
    assert gpu_check.main(["--records", str(device), "--runs", str(tmp_path), "--pack", str(tmp_path / "o1"),
                           "--budget", "2"]) == 1
    (window,) = device.iterdir()
    results = tmp_path / "results"
    gpu_windows.unpack_window(tmp_path / "o1" / f"{window.name}.tar.gz", results)
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: [
        gpu_check.Check("sweep", (sys.executable, "-c", "import os, sys; d = sys.argv[1][6:]; "
                                  "os.makedirs(d); open(d + '/t.md', 'w').write('whole')",
                                  f"--out={record}/sweep"), 30, timed=True)])
    assert gpu_check.main(["--continue", str(window), "--runs", str(tmp_path), "--pack", str(tmp_path / "o2")]) == 0
    assert (window / "sweep" / "t.md").read_text() == "whole"
    assert (window / "sweep.cut-2" / "t.md").read_text() == "partial"
    archive = tmp_path / "o2" / f"{window.name}.tar.gz"

    (window / "sweep.cut-2" / "t.md").write_text("tampered")  # a continuation that changed a kept file
    gpu_windows.pack_window(window, tmp_path / "bad" / archive.name)
    with pytest.raises(SystemExit, match="does not continue it .sweep/t.md is not in it"):
        gpu_windows.unpack_window(tmp_path / "bad" / archive.name, results)
    assert (results / window.name / "sweep" / "t.md").read_text() == "partial"
    landed = gpu_windows.unpack_window(archive, results)
    assert (landed / "sweep" / "t.md").read_text() == "whole"
    assert (landed / "sweep.cut-2" / "t.md").read_text() == "partial"


def test_the_code_digest_follows_the_code_and_ignores_caches(tmp_path: Path) -> None:
    from tape.vcs import code_digest

    (tmp_path / "tape" / "__pycache__").mkdir(parents=True)
    (tmp_path / "tape" / "a.py").write_text("x = 1\n")
    first = code_digest(tmp_path)
    (tmp_path / "tape" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (tmp_path / "tape" / ".hidden").write_text("scratch")
    assert code_digest(tmp_path) == first
    (tmp_path / "tape" / "a.py").write_text("x = 2\n")
    assert code_digest(tmp_path) != first


def test_every_hydra_step_composes(tmp_path: Path) -> None:
    """Every train and benchmark command of either suite composes here, so a renamed key or
    preset fails in CI rather than in a GPU window."""
    from pipelines.preflight import compose_or_none

    configs = {"pipelines.train": "config", "pipelines.benchmark": "benchmark"}
    composed = 0
    for check in gpu_check.checks(tmp_path / "runs", tmp_path / "record"):
        argv = check.argv
        if argv[argv.index("-m") + 1:][:2] == ("pipelines.gpu_check", "preset"):  # a timed preset's train
            experiment, pe = argv[argv.index("--experiment") + 1], argv[argv.index("--pe") + 1]
            argv = gpu_check.preset_argv(experiment, pe, tmp_path / "runs")
        module = argv[argv.index("-m") + 1]
        if module in configs:
            overrides = list(argv[argv.index(module) + 1:])
            assert compose_or_none(configs[module], overrides) is not None, check.name
            composed += 1
    assert composed == len(gpu_check.SMOKE_EXPERIMENTS) + 2 * len(gpu_check.GPU_PRESETS) + 4


def test_the_budget_counts_from_when_the_process_began(tmp_path: Path, monkeypatch) -> None:
    """run_steps started its clock after torch's import and the environment's probes (nvidia-smi),
    so a slow start pushed the budget's cut past the `timeout` around the call: nothing came back."""
    monkeypatch.setattr(gpu_check, "MIN_LEFT_S", 0.5)
    began = time.perf_counter() - 20  # as if start-up took 20 s
    t0 = time.perf_counter()
    (cut,) = gpu_check.run_steps([_sleeper("long", False, 25)], tmp_path, budget_s=23, started=began)
    assert cut.budget_cut and not cut.passed and time.perf_counter() - t0 < 10
    assert gpu_check.STARTED <= t0  # the module's clock: set at import, before main() runs


def test_a_window_is_recorded_before_its_first_step_ends(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("torch")
    _fake_gpu(monkeypatch, [_sleeper("a", True, 0.1)])

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # `timeout` ended the call while the first step ran

    monkeypatch.setattr(gpu_check, "run_steps", killed)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--records", str(tmp_path / "device"), "--runs", str(tmp_path), "--pack", str(tmp_path / "o")])
    (archive,) = (tmp_path / "o").iterdir()
    window = gpu_windows.unpack_window(archive, tmp_path / "results")
    summary = json.loads((window / "summary.json").read_text())
    assert summary["environment"]["device"] == "fake" and summary["planned"] == ["a"] and summary["outcomes"] == []
    assert gpu_windows.pending_steps(summary) == ["a"]


def test_a_continuation_that_died_is_retried_as_the_next_call(tmp_path: Path, monkeypatch) -> None:
    """A call 2 that died before its first outcome left sweep.cut-2 unrecorded: the retry, again
    call 2, crashed renaming its new partial onto it. And an archive holding calls 2 and 3 was
    refused by unpack (the moves of all calls were merged into one)."""
    pytest.importorskip("torch")
    device, results = tmp_path / "device", tmp_path / "results"

    def sweep(text: str, sleep: float) -> list[gpu_check.Check]:
        code = (f"import os, sys, time; d = sys.argv[1][6:]; os.makedirs(d); open(d + '/t.md', 'w').write({text!r}); "
                f"time.sleep({sleep})")
        return [gpu_check.Check("sweep", (sys.executable, "-c", code, f"--out={device}/WINDOW/sweep"), 30, timed=True,
                                expected_s=0)]

    _fake_gpu(monkeypatch, [])
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: [
        replace(c, argv=tuple(a.replace(f"{device}/WINDOW", str(record)) for a in c.argv)) for c in sweep("partial", 20)])
    assert gpu_check.main(["--records", str(device), "--runs", str(tmp_path), "--pack", str(tmp_path / "o1"),
                           "--budget", "2"]) == 1
    (window,) = device.iterdir()
    gpu_windows.unpack_window(tmp_path / "o1" / f"{window.name}.tar.gz", results)  # committed: call 1

    real_run_steps = gpu_check.run_steps

    def dies(*args, **kwargs):
        (window / "sweep").mkdir()
        (window / "sweep" / "t.md").write_text("partial 2")  # written before the call died
        raise KeyboardInterrupt

    monkeypatch.setattr(gpu_check, "run_steps", dies)
    with pytest.raises(KeyboardInterrupt):
        gpu_check.main(["--continue", str(window), "--runs", str(tmp_path), "--pack", str(tmp_path / "o2")])
    calls = json.loads((window / "summary.json").read_text())["calls"]
    assert len(calls) == 2 and calls[1]["moved"] == {"sweep": "sweep.cut-2"}
    monkeypatch.setattr(gpu_check, "run_steps", real_run_steps)
    monkeypatch.setattr(gpu_check, "checks", lambda runs, record, suite: [
        replace(c, argv=tuple(a.replace(f"{device}/WINDOW", str(record)) for a in c.argv)) for c in sweep("whole", 0)])
    assert gpu_check.main(["--continue", str(window), "--runs", str(tmp_path), "--pack", str(tmp_path / "o2")]) == 0
    assert [(window / d / "t.md").read_text() for d in ("sweep.cut-2", "sweep.cut-3", "sweep")] == [
        "partial", "partial 2", "whole"]
    landed = gpu_windows.unpack_window(tmp_path / "o2" / f"{window.name}.tar.gz", results)  # calls 2 and 3 at once
    assert (landed / "sweep" / "t.md").read_text() == "whole" and (landed / "sweep.cut-2" / "t.md").read_text() == "partial"
    (window / "sweep.cut-4").mkdir()  # a name a call left unrecorded (it died at once): never renamed onto
    step = gpu_check.Check("sweep", (f"--out={window}/sweep",), 30)
    assert gpu_check._set_aside([step], window, 4) == {"sweep": "sweep.cut-4-2"}


def test_a_side_by_side_steps_workers_share_its_cores(tmp_path: Path, monkeypatch) -> None:
    """pytest -n 4 gave each of its workers the whole share of the step (40 threads on 16 cores)."""
    seen = {}
    def run_check(check, log, left, threads):
        seen[check.name] = threads
        return gpu_check.Outcome(check.name, "", True, 0.0, 0, log.name)

    monkeypatch.setattr(gpu_check, "run_check", run_check)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    gpu_check.run_steps([replace(_sleeper("pytest", False, 0), workers=4), _sleeper("train", False, 0)], tmp_path, jobs=4)
    assert seen == {"pytest": 1, "train": 4}
    (cuda_tests, paths_tests) = [c for c in gpu_check.checks(tmp_path, suite="core") if "pytest" in c.name]
    assert cuda_tests.workers == paths_tests.workers == (4 if "-n" in cuda_tests.argv else 1)


# ---------------------------------------------------------------------------- timed presets
class _Clocked:
    """What StepClock reads of a trainer and a module."""

    def __init__(self, max_steps: int) -> None:
        self.global_step, self.max_steps = 0, max_steps
        self.device = __import__("torch").device("cpu")


def test_the_step_clock_times_whole_optimizer_steps_after_the_warm_up(tmp_path: Path, monkeypatch) -> None:
    """Under accumulation a step's micro-batches share its global_step: the clock starts at the
    first batch end of step ``after`` and stops at the last step's, once."""
    from pipelines import callbacks

    ticks = iter(range(100))
    monkeypatch.setattr(callbacks, "_synced_clock", lambda module: float(next(ticks)))
    clock = callbacks.StepClock(str(tmp_path / "clock.json"), after=2)
    trainer = _Clocked(max_steps=5)
    for step in (0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5):  # two micro-batches a step; the step moves on the second
        trainer.global_step = step
        clock.on_train_batch_end(trainer, trainer, None, None, 0)
    assert json.loads((tmp_path / "clock.json").read_text()) == {"after": 2, "steps": 3, "seconds": 1.0,
                                                                 "s_per_step": 1 / 3}


@pytest.mark.parametrize(("experiment", "batches"), [("flipflop/gpu", 50), ("addition/paper", 100)])
def test_a_timed_preset_validates_only_after_its_last_step(experiment: str, batches: int, tmp_path: Path) -> None:
    """val_check_interval counts batches, not optimizer steps: a preset accumulating 2 batches a
    step (addition/paper) validated and saved a checkpoint at step 25, inside the timed steps."""
    argv = gpu_check.preset_argv(experiment, "rope", tmp_path, steps=50)
    assert "trainer.max_steps=50" in argv and f"trainer.val_check_interval={batches}" in argv


def test_a_timed_preset_reports_its_warmed_up_pace_and_projects_its_run(tmp_path: Path) -> None:
    """The timed presets printed nothing but Lightning's summary: their minutes were copied from
    a progress bar by hand, and only RoPE's. Run here on flipflop/smoke (6 steps: the whole
    preset, so the projection is the run itself)."""
    out = gpu_check.preset_check("flipflop/smoke", "tape", tmp_path, steps=6, after=2, run=warm)
    assert out["preset"] == "flipflop/smoke" and out["pe"] == "tape" and out["timed_steps"] == 4
    assert 0 < 4 * out["s_per_step"] <= out["train_time_s"] <= out["wall_time_s"]
    assert out["preset_steps"] == 6 and out["projected_min"] * 60 == pytest.approx(out["wall_time_s"])
    with pytest.raises(AssertionError, match="exited 1"):  # a preset that does not compose
        gpu_check.preset_check("flipflop/nosuch", "tape", tmp_path, steps=6, after=2, run=warm)


def test_the_page_tables_the_timed_presets_with_tape_over_rope(tmp_path: Path) -> None:
    def timed(pe: str, pace: float) -> dict:
        line = json.dumps({"preset": "flipflop/gpu", "pe": pe, "steps": 50, "timed_steps": 40, "s_per_step": pace,
                           "train_time_s": 9.0, "wall_time_s": 80.0, "preset_steps": 10000, "projected_min": 20.5})
        return {"name": f"time 50 steps of flipflop/gpu, pe={pe}", "passed": True, "tail": ["run dir: x", line]}

    other = {"name": "time 50 steps of counting/gpu", "passed": True, "tail": ['{"loss": 1.0}']}  # not ours
    summary = {"outcomes": [timed("rope", 0.05), other, timed("tape", 0.06)]}
    text = "\n".join(gpu_targets.timed_presets_md(summary["outcomes"]))
    assert "| flipflop/gpu | rope | 0.0500 | 40 | 80.0 | 10000 | 20.5 | - |" in text
    assert "| flipflop/gpu | tape | 0.0600 | 40 | 80.0 | 10000 | 20.5 | 1.200 |" in text
    assert "counting/gpu" not in text and text.count("| flipflop/gpu |") == 2
    assert gpu_page._numbers(summary) == []  # tabled, not repeated as raw JSON
