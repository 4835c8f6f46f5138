"""Prove the CUDA path on one GPU: ``python -m pipelines.gpu_check`` (``make gpu-check``).

Runs, each step in its own process with a time limit, and records verdicts, times and logs in
``results/gpu-check/<time>/`` (summary.json, summary.md, one log per step; committed, never
overwritten), the training runs in ``runs/gpu-check/<time>/runs``. Steps that time nothing run
``--jobs`` at a time (each its own process on the one GPU); timed steps run alone, after them.

``--suite core`` (the default, ``make gpu-check``; sized for 8 minutes on one H100), the proof:
1. every encoding's bf16 training step, cached generation and ``add_tape`` on CUDA
   (``pytest -m cuda tests/test_cuda_paths.py``);
2. the compiled Triton kernel and the sync-free training step (the other ``pytest -m cuda`` tests);
3. the TAPE model at the paper's 155M shape, N = 1024, bf16 autocast: Triton kernel vs SDPA vs
   float64 logits and gradients (``python -m pipelines.gpu_check model``);
4. ``pipelines.train`` on CUDA: six experiments' smoke presets (``SMOKE_EXPERIMENTS``; not SCROLLS,
   which needs a pretraining run and its data, nor the claim tasks) with bf16-mixed, FSDP on one GPU
   with gradient clipping on, and TAPE on addition/smoke through ``torch.compile`` (``compile=true``);
5. addition/smoke interrupted, resumed with ``ckpt_path=last`` and evaluated with
   ``pipelines.evaluate device=cuda``, each by its command line (``python -m pipelines.gpu_check resume``);
6. (timed) TAPE at Llama-2-7B's layer shape (head dim 128), N = 4096: bf16 autocast training step
   with the default backend against SDPA, and an fp32 forward (context extension's frozen dtype)
   through the kernel, with times and peak memory (``python -m pipelines.gpu_check llama7b``);
7. (timed) throughput dry runs of every paper preset on random weights: step time, tokens/s, peak
   memory, projected hours (``python -m pipelines.gpu_check throughput``; pipelines/throughput.py);
8. (timed) the efficiency benchmark at the paper's shape for paper Table 4's columns, TAPE (every
   way of computing A·V and A·E), RoPE, FIRE, T5 (``pipelines.benchmark device=cuda scale=paper``).

``--suite measure`` (``make gpu-measure``), every step timed: where a training step's time goes
(``python -m tape.bench.step_profile``: device busy time against wall time, kernels per step, the
costliest kernels, TAPE beside RoPE at batch 4, 16 and 32; then with ``--compile``, and compiled
with CUDA graphs, ``--compile-mode reduce-overhead``); the attention
operator by length, N = 1k to 16k, forward and forward+backward, with TFLOP/s
(``python -m pipelines.attention_sweep``; sweep.{md,json} in the record); the kernel's autotuning;
50 steps of each GPU claim preset and of the addressing tasks' GPU presets, with RoPE and with
TAPE, timed once warmed up (``python -m pipelines.gpu_check preset``; their projected minutes
replace the estimates); the benchmark of every encoding. ``--suite all`` runs both.

``--only WORD[,WORD...]`` runs the steps whose name contains a WORD and ``--budget SECONDS``
stops starting steps after SECONDS (a short GPU window runs a few at a time; the summary is
written after every step). ``--commit LABEL`` records the commit the tree was sent at (a device's
copy of the tree may carry an older .git, seen as ``<old>+dirty``).

``--pack DIR`` also writes the window as one archive, ``DIR/<time>.tar.gz``, rewritten after every
step (a device tool that brings back few files gets the whole record, even from a run cut off);
``--unpack ARCHIVE`` puts such a window into ``--records`` (never over an existing one, but by its
own continuation). ``--continue WINDOW`` (``make gpu-check CONTINUE=<window>``) runs, into that
window, the planned steps it has no outcome for or whose run ``--budget`` cut, when the kind of GPU,
driver, stack and code digest are the window's: a proof cut by a device's call limit is finished in
the next call; a failed step is never run again.

``--dry-run`` lists the steps and runs nothing (a wiring check on any machine); ``--render
results/gpu.md`` writes the results page from every window's summary, and refuses a summary
that did not run on a GPU: nothing GPU-shaped is ever written from a CPU run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict, dataclass, field, replace
from itertools import groupby
from pathlib import Path
from typing import Any, Callable, Sequence

from pipelines.gpu_page import render, summary_md
from pipelines.gpu_windows import pack_window, pending_steps, read_window, unpack_window

SMOKE_EXPERIMENTS = ("addition", "addition_c1", "pretrain", "flipflop", "word_problem", "context_extension")
GPU_PRESETS = ("addition_c1/gpu", "flipflop/gpu", "parity/gpu", "mqar/gpu", "selective_copy/gpu", "counting/gpu")
TIMED_STEPS = 50
CLOCK_AFTER = 10  # the timed presets' warm-up steps (compiles, allocator, autotuning): not timed
TIMED_PES = ("rope", "tape")  # a claim's fastest and slowest primary arm: its runs' minutes lie between
GPU = ("trainer=gpu", "logger=csv")
PATHS_TESTS = "tests/test_cuda_paths.py"
CORE_BENCHMARK_PES = ("tape", "rope", "fire", "t5")  # paper Table 4's columns; gpu-measure runs them all


SUITES = ("core", "measure", "all")
JOBS = 4
"""Untimed steps that run side by side on the GPU (each its own process; 16 cores on the H100 node)."""
MIN_LEFT_S = 10.0
"""No step starts with less of ``--budget`` left than this."""
STARTED = time.perf_counter()
"""When this process began (at import, before torch and the environment's probes): ``--budget``
counts from here, so its cut and the last pack come before a ``timeout`` around the command."""


@dataclass(frozen=True)
class Check:
    """One step: a command, its time limit (seconds), whether it times anything (timed steps run
    alone on the GPU; the others run ``--jobs`` at a time, the longest expected first), its suite:
    ``core`` is the proof (``make gpu-check``, at most 8 minutes), ``measure`` the longer
    measurements (``make gpu-measure``)."""

    name: str
    argv: tuple[str, ...]
    limit_s: int
    timed: bool = False
    suite: str = "core"
    workers: int = 1  # processes the step runs at once (pytest -n): they share its cores
    expected_s: int = 30
    """Wall time on a GPU (earlier windows; an estimate where none ran it): the side-by-side steps
    start longest first; a timed step does not start with less of ``--budget`` left."""


@dataclass
class Outcome:
    name: str
    command: str
    passed: bool
    wall_s: float
    returncode: int | None  # None: cut off at its limit
    log: str
    tail: list[str] = field(default_factory=list)
    budget_cut: bool = False  # cut off because --budget was spent, not by its own limit: not run out


def checks(runs_dir: Path, record_dir: Path | None = None, suite: str = "all") -> list[Check]:
    """The steps of ``suite`` in the order they start: untimed proofs first (side by side), then
    the timed steps one at a time. The benchmarks write their tables (small) into ``record_dir``,
    the window's record, when given."""
    py = (sys.executable,)
    n_workers = 4 if importlib.util.find_spec("xdist") else 1  # pytest-xdist: compiles in parallel
    workers = ("-n", str(n_workers)) if n_workers > 1 else ()
    pytest_cuda = (*py, "-m", "pytest", "-q", "-m", "cuda", *workers, "--durations=10")
    tables = record_dir or runs_dir  # the benchmarks' small tables travel with the window's record
    core = [Check("every encoding, cached decoding, add_tape on CUDA (pytest -m cuda tests/test_cuda_paths.py)",
                  (*pytest_cuda, PATHS_TESTS), 240, workers=n_workers, expected_s=120),
            Check("kernel and training step (pytest -m cuda)", (*pytest_cuda, "tests", f"--ignore={PATHS_TESTS}"), 240,
                  workers=n_workers, expected_s=155),
            Check("TAPE 155M: Triton vs SDPA vs float64", (*py, "-m", "pipelines.gpu_check", "model"), 120, expected_s=20)]
    for exp in SMOKE_EXPERIMENTS:
        core.append(Check(f"train {exp}/smoke, bf16-mixed", (*py, "-m", "pipelines.train", f"experiment={exp}/smoke",
                                                            *GPU, f"paths.runs_dir={runs_dir}"), 180))
    core += [
        Check("train addition/smoke, FSDP on one GPU, clipping on",
              (*py, "-m", "pipelines.train", "experiment=addition/smoke", "trainer=fsdp", "trainer.devices=1",
               "logger=csv", "trainer.gradient_clip_val=0.5", f"paths.runs_dir={runs_dir / 'fsdp'}"), 180,
              expected_s=20),
        Check("train TAPE on addition/smoke through torch.compile (compile=true), bf16-mixed",
              (*py, "-m", "pipelines.train", "experiment=addition/smoke", "pe=tape", "compile=true", *GPU,
               f"paths.runs_dir={runs_dir / 'compiled'}"), 300, expected_s=120),
        Check("train, interrupt, resume, evaluate addition/smoke on CUDA",
              (*py, "-m", "pipelines.gpu_check", "resume", "--runs", str(runs_dir / "resume")), 240, expected_s=65),
        Check("TAPE at Llama-2-7B layer shape, N=4096", (*py, "-m", "pipelines.gpu_check", "llama7b"), 240, timed=True,
              expected_s=40),
        Check("throughput of the paper presets, random weights",
              (*py, "-m", "pipelines.gpu_check", "throughput"), 480, timed=True, expected_s=180),
        Check("benchmark at the paper's shape", (*py, "-m", "pipelines.benchmark", "device=cuda", "scale=paper",
                                                 f"pes=[{','.join(CORE_BENCHMARK_PES)}]",
                                                 f"output_dir={tables / 'benchmark'}"), 420, timed=True,
              expected_s=120),
    ]
    # expected_s: the H100/H200 windows' wall times where a step ran (sweep 65 s, autotune 8 s,
    # 50 steps 64-98 s, the benchmark 227 s); the step profiles, never run, are guesses that
    # count their compiles. A step is not started with less --budget left than this.
    measure = [
        Check("where a 155M training step's time goes, TAPE vs RoPE, batch 4, 16 and 32 (profiler)",
              (*py, "-m", "tape.bench.step_profile", "--batches", "4,16,32"), 240, expected_s=120),
        Check("a 155M step compiled (torch.compile), RoPE vs TAPE, batch 4 (profiler)",
              (*py, "-m", "tape.bench.step_profile", "--compile", "--batches", "4"), 420, expected_s=240),
        Check("a 155M step compiled with CUDA graphs (mode reduce-overhead), RoPE vs TAPE, batch 4 (profiler)",
              (*py, "-m", "tape.bench.step_profile", "--compile-mode", "reduce-overhead", "--batches", "4"), 420,
              expected_s=240),
        Check("attention operator by length, N = 1k-16k, forward and backward",
              (*py, "-m", "pipelines.attention_sweep", "--device", "cuda", "--out", str(tables / "sweep")), 360,
              expected_s=90),
        Check("autotune the kernel's launch configs (bf16, head dims 64 and 128)",
              (*py, "-m", "tape.kernels.autotune", "--dtypes", "bfloat16", "--head-dims", "64,128"), 300,
              expected_s=30),
        *(Check(f"time {TIMED_STEPS} steps of {preset}, pe={pe}", (
            *py, "-m", "pipelines.gpu_check", "preset", "--experiment", preset, "--pe", pe, "--runs", str(runs_dir)),
            300, expected_s=100)
          for preset in GPU_PRESETS for pe in TIMED_PES),
        Check("benchmark of every encoding at the paper's shape", (
            *py, "-m", "pipelines.benchmark", "device=cuda", "scale=paper",
            f"output_dir={tables / 'benchmark-all'}"), 480, expected_s=240),
    ]
    measure = [replace(c, timed=True, suite="measure") for c in measure]
    chosen = {"core": core, "measure": measure, "all": core + measure}[suite]
    # the untimed proofs first, the longest expected first (so the side-by-side group ends
    # soonest), then the timed steps in their order
    return sorted(chosen, key=lambda c: (c.timed, 0 if c.timed else -c.expected_s))


def run_check(check: Check, log: Path, limit_s: float | None = None, threads: int | None = None) -> Outcome:
    """Run one step, its output to ``log``; a step past its limit (the check's own, or
    ``limit_s`` when that is shorter) fails. ``threads`` caps its CPU threads (OMP_NUM_THREADS)
    when it shares the machine with other steps."""
    env = None if threads is None else {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(threads))}
    budget_first = limit_s is not None and limit_s < check.limit_s
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(check.argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        try:
            code: int | None = proc.wait(timeout=limit_s if budget_first else check.limit_s)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            code = None
    lines = log.read_text(errors="replace").splitlines()
    return Outcome(check.name, shlex.join(check.argv), code == 0, time.perf_counter() - t0, code,
                   log.name, lines[-12:], budget_cut=code is None and budget_first)


def kill_tree(proc: subprocess.Popen) -> None:
    """Kill a step and every process it started (pytest's workers, the resume check's training
    legs): killing only the step left them on the GPU beside the timed steps that follow. They
    stay in this process group, so a ``timeout`` around make gpu-check still reaches them."""
    try:
        import psutil

        family = psutil.Process(proc.pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - no psutil, or the step has just ended: the step alone
        family = []
    for member in [*family, proc]:
        try:
            member.kill()
        except Exception:  # noqa: BLE001 - ended on its own meanwhile
            pass
    proc.wait()


def run_steps(steps: Sequence[Check], out_dir: Path, budget_s: float | None = None, jobs: int = JOBS,
              on_done: Callable[[list[Outcome]], None] = lambda done: None, log_prefix: str = "",
              started: float | None = None) -> list[Outcome]:
    """Run ``steps``: each run of consecutive untimed steps ``jobs`` at a time, each timed step
    alone. Step i logs to ``<out_dir>/<log_prefix><i>.log``; no step starts once ``budget_s`` is
    spent (less than MIN_LEFT_S left), nor a timed one with less left than it is expected to take
    (``--continue`` runs it in the next call), and a running one is cut there. ``on_done`` gets the
    outcomes so far, in step order, after each step ends. ``started``: when the budget began
    (``perf_counter``; default now). Returns them."""
    t0, done = time.perf_counter() if started is None else started, {}

    def attempt(i: int) -> Outcome | None:
        left = None if budget_s is None else budget_s - (time.perf_counter() - t0)
        if left is not None and left < max(MIN_LEFT_S, steps[i].expected_s if steps[i].timed else 0):
            print(f"skip {steps[i].name} ({max(left, 0):.0f} s of --budget {budget_s:.0f} s left)", flush=True)
            return None
        # side by side: split the cores, a step's share again among its own workers (pytest -n)
        shared = None if steps[i].timed else max(1, (os.cpu_count() or 1) // jobs // steps[i].workers)
        return run_check(steps[i], out_dir / f"{log_prefix}{i:02d}.log", left, shared)

    def finished(i: int, outcome: Outcome | None) -> None:
        if outcome is None:
            return
        done[i] = outcome
        verdict = "pass" if outcome.passed else "cut by --budget" if outcome.budget_cut else "FAIL"
        print(f"{verdict} {outcome.name} ({outcome.wall_s:.0f} s)", flush=True)
        on_done([done[k] for k in sorted(done)])

    for timed, group in groupby(range(len(steps)), key=lambda k: steps[k].timed):
        with ThreadPoolExecutor(max_workers=1 if timed else jobs) as pool:  # one worker: in order, alone
            futures = {pool.submit(attempt, k): k for k in group}
            for future in as_completed(futures):
                finished(futures[future], future.result())
    return [done[k] for k in sorted(done)]


PAPER_155M = dict(vocab_size=32000, n_layers=12, d_model=768, n_heads=12)


def model_check(n: int = 1024, batch: int = 2, device: str = "cuda",
                shape: dict | None = None) -> dict[str, float]:
    """The TAPE model (the paper's 155M shape by default) under bf16 autocast, Triton kernel
    against SDPA, both against float64 eager: max relative errors of the logits and of the
    gradients. Raises when the kernel's error exceeds max(2e-2, 3 x SDPA's own error)."""
    import torch

    from tape.model import DecoderLM, ModelConfig

    torch.manual_seed(0)
    cfg = dict(**(shape or PAPER_155M), max_seq_len=n, pe="tape")
    ids = torch.randint(0, cfg["vocab_size"], (batch, n), device=device)
    base = DecoderLM(ModelConfig(**cfg, attn_backend="eager")).to(device)
    results: dict[str, tuple[torch.Tensor, list[torch.Tensor]]] = {}
    for name, backend, dtype in (("float64", "eager", torch.float64), ("sdpa", "sdpa", torch.bfloat16),
                                 ("triton", "triton", torch.bfloat16)):
        model = DecoderLM(ModelConfig(**cfg, attn_backend=backend)).to(device)
        model.load_state_dict(base.state_dict())
        if dtype == torch.float64:
            model = model.double()
        model.zero_grad()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=dtype != torch.float64):
            logits = model(ids).logits.double()
        logits.logsumexp(-1).mean().backward()
        results[name] = (logits.detach(), [p.grad.double() for p in model.parameters() if p.grad is not None])

    def err(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))

    ref_logits, ref_grads = results["float64"]
    out = {}
    for name in ("sdpa", "triton"):
        logits, grads = results[name]
        out[f"{name}_logits"] = err(logits, ref_logits)
        out[f"{name}_grads"] = max(err(g, r) for g, r in zip(grads, ref_grads))
    for part in ("logits", "grads"):
        bound = max(2e-2, 3 * out[f"sdpa_{part}"])
        if out[f"triton_{part}"] > bound:
            raise AssertionError(f"Triton {part} error {out[f'triton_{part}']:.3g} > {bound:.3g}")
    return out


LLAMA_7B_LAYERS = dict(vocab_size=32000, n_layers=2, d_model=4096, n_heads=32, d_ff=11008)


def llama7b_check(n: int = 4096, device: str = "cuda", shape: dict | None = None) -> dict[str, float]:
    """TAPE in two layers of Llama-2-7B's shape (head dim 128): a bf16-autocast training step
    with the default backend (the Triton kernel on CUDA) and with SDPA, and an fp32 forward
    through each; max relative logit errors against SDPA, seconds (after one untimed warm-up
    call) and peak GiB per step (the step's own: the reference weights and logits stay on the
    host, and no earlier call's logits are held through it).
    Raises when the default backend's error exceeds 2e-2 (bf16) or 1e-3 (fp32)."""
    import torch

    from tape.model import DecoderLM, ModelConfig

    torch.manual_seed(0)
    cfg = dict(**(shape or LLAMA_7B_LAYERS), max_seq_len=n, pe="tape")
    ids = torch.randint(0, cfg["vocab_size"], (1, n), device=device)
    base = DecoderLM(ModelConfig(**cfg, attn_backend="sdpa")).state_dict()  # kept on the host
    out: dict[str, float] = {}
    logits: dict[str, torch.Tensor] = {}  # float64 copies on the host: not in a later run's peak
    for backend in ("sdpa", "auto"):
        model = DecoderLM(ModelConfig(**cfg, attn_backend=backend)).to(device)
        model.load_state_dict(base)
        for precision in ("bf16", "fp32"):
            for timed in (False, True):  # the first call compiles kernels and warms cuBLAS: untimed
                value = None  # the last call's logits are not held through this one's peak
                _reset_peak(device)
                t0 = time.perf_counter()
                with torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16"):
                    if precision == "bf16":
                        value = model(ids).logits
                        value.float().logsumexp(-1).mean().backward()
                    else:
                        with torch.no_grad():
                            value = model(ids).logits
                _sync(device)
                model.zero_grad(set_to_none=True)
            out[f"{backend}_{precision}_s"] = time.perf_counter() - t0
            out[f"{backend}_{precision}_peak_gib"] = _peak_gib(device)
            logits[f"{backend}_{precision}"] = value.detach().double().cpu()
            del value
    for precision, bound in (("bf16", 2e-2), ("fp32", 1e-3)):
        ref, got = logits[f"sdpa_{precision}"], logits[f"auto_{precision}"]
        out[f"auto_vs_sdpa_{precision}"] = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-12))
        if out[f"auto_vs_sdpa_{precision}"] > bound:
            raise AssertionError(f"{precision}: default backend differs from SDPA by "
                                 f"{out[f'auto_vs_sdpa_{precision}']:.3g} > {bound}")
    return out


ADDITION_SMOKE = ("experiment=addition/smoke", "logger=csv", "callbacks.rich_progress_bar=null")
SUMMARY_KEYS = ("mean_accuracy", "in_distribution_accuracy", "ood_accuracy")


Command = Callable[[Sequence[str], Path], "subprocess.CompletedProcess[str]"]
"""Runs a ``python -m`` command line in a folder, its output captured as text (the tests run
them forked from a warm interpreter, tests/warm_python.py)."""


def run_command(argv: Sequence[str], cwd: Path) -> "subprocess.CompletedProcess[str]":
    """``argv`` in ``cwd`` as a fresh process, its output captured as text."""
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd)


def resume_check(runs_dir: Path, device: str = "cuda", interrupt_at: int = 4,
                 run: Command = run_command) -> dict[str, Any]:
    """``experiment=addition/smoke`` through its command lines on ``device``: trained until a
    Ctrl-C at step ``interrupt_at`` (pipelines.callbacks.InterruptAt; the preset checkpoints every
    3 steps, so last.ckpt holds step 3), resumed with ``ckpt_path=last`` to its 6 steps, then
    re-evaluated by ``pipelines.evaluate device=<device>``. Seconds of each leg, the checkpoint's
    step and both evaluations' accuracies; raises when a leg does not end as it should."""
    from pipelines.checkpoints import read_checkpoint_step

    py, out = sys.executable, {}
    train = (py, "-m", "pipelines.train", *ADDITION_SMOKE, f"trainer={'gpu' if device == 'cuda' else 'cpu'}",
             f"paths.runs_dir={runs_dir}")

    def leg(name: str, argv: Sequence[str], ok: bool = True) -> None:
        t0 = time.perf_counter()
        done = run(argv, Path(__file__).resolve().parents[1])
        out[f"{name}_s"] = round(time.perf_counter() - t0, 1)
        if (done.returncode == 0) != ok:
            raise AssertionError(f"{name}: `{shlex.join(argv)}` exited {done.returncode}\n"
                                 f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")

    leg("interrupted", (*train, "+callbacks.interrupt._target_=pipelines.callbacks.InterruptAt",
                        f"+callbacks.interrupt.step={interrupt_at}"), ok=False)
    runs = sorted(runs_dir.glob("addition/smoke/*/*/*/checkpoints/last.ckpt"))
    if len(runs) != 1 or (runs[0].parents[1] / "metrics.json").exists():
        raise AssertionError(f"expected one unfinished run with checkpoints/last.ckpt, found {runs}")
    killed = runs[0]
    out["checkpoint_step"] = read_checkpoint_step(killed)
    leg("resumed", (*train, "ckpt_path=last"))
    finished = [p.parent for p in runs_dir.glob("addition/smoke/*/*/*/metrics.json")]
    metrics = json.loads(finished[0].joinpath("metrics.json").read_text()) if len(finished) == 1 else {}
    if metrics.get("resumed_from") != str(killed) or metrics.get("steps") != 6:
        raise AssertionError(f"the resumed run did not continue {killed} to step 6: {finished} {metrics}")
    leg("evaluated", (py, "-m", "pipelines.evaluate", f"run_dir={finished[0]}", f"device={device}"))
    again = [json.loads(p.read_text()) for p in finished[0].glob("eval/*/metrics.json")]
    if len(again) != 1:
        raise AssertionError(f"pipelines.evaluate wrote {len(again)} metrics.json under {finished[0] / 'eval'}")
    for key in SUMMARY_KEYS:
        out[f"run_{key}"], out[f"eval_{key}"] = metrics[key], again[0][key]
    return out


def preset_argv(experiment: str, pe: str, runs_dir: Path, steps: int = TIMED_STEPS,
                after: int = CLOCK_AFTER) -> tuple[str, ...]:
    """``pipelines.train`` for ``steps`` steps of a preset, validated once at the end, with a
    ``StepClock`` timing the steps after ``after`` into the run's step_clock.json. Lightning counts
    ``val_check_interval`` in batches: a preset that accumulates k batches a step validates after
    k * steps of them."""
    from pipelines.presets import preset_setting

    accumulate = int((preset_setting(experiment, pe) or {}).get("trainer.accumulate_grad_batches") or 1)
    return (sys.executable, "-m", "pipelines.train", f"experiment={experiment}", f"pe={pe}", "logger=csv",
            f"trainer.max_steps={steps}", f"trainer.val_check_interval={steps * accumulate}",
            f"paths.runs_dir={runs_dir}",
            "+callbacks.step_clock._target_=pipelines.callbacks.StepClock",
            "+callbacks.step_clock.path=${paths.output_dir}/step_clock.json", f"+callbacks.step_clock.after={after}")


def preset_check(experiment: str, pe: str, runs_dir: Path, steps: int = TIMED_STEPS,
                 after: int = CLOCK_AFTER, run: Command | None = None) -> dict[str, Any]:
    """A preset trained for ``steps`` steps by its command line: seconds a step once warmed up
    (steps ``after`` .. ``steps``), the run's training and wall time, and its whole run projected:
    the preset's ``trainer.max_steps`` at that pace plus what this run spent otherwise (start-up,
    warm-up, one validation and the evaluation; the full run validates more often)."""
    from pipelines.presets import preset_setting

    began = time.time()
    argv, root = preset_argv(experiment, pe, runs_dir, steps, after), Path(__file__).resolve().parents[1]
    done = subprocess.run(argv, cwd=root) if run is None else run(argv, root)  # None: its output streams
    clocks = [c for c in runs_dir.glob(f"{experiment}/{pe}/*/*/step_clock.json") if c.stat().st_mtime >= began]
    if done.returncode or len(clocks) != 1:
        raise AssertionError(f"experiment={experiment} pe={pe}: exited {done.returncode}, step clocks {clocks}")
    clock = json.loads(clocks[0].read_text())
    metrics = json.loads((clocks[0].parent / "metrics.json").read_text())
    total = (preset_setting(experiment, pe) or {}).get("trainer.max_steps")  # None: not composed
    other_s = metrics["wall_time_s"] - clock["s_per_step"] * steps
    return {"preset": experiment, "pe": pe, "steps": steps, "timed_steps": clock["steps"],
            "s_per_step": clock["s_per_step"], "train_time_s": metrics["train_time_s"],
            "wall_time_s": metrics["wall_time_s"], "preset_steps": total,
            "projected_min": None if total is None else (total * clock["s_per_step"] + other_s) / 60}


def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def _reset_peak(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()


def _peak_gib(device: str) -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else float("nan")


def environment() -> dict[str, str]:
    import torch

    from tape.vcs import code_digest, commit_label

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    gpu = torch.cuda.is_available()
    driver = "-"
    if gpu:
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=5).stdout.strip() or "-"
        except (OSError, subprocess.TimeoutExpired):
            pass
    return {"device": torch.cuda.get_device_name(0) if gpu else "cpu", "gpu": str(gpu), "driver": driver,
            "torch": torch.__version__, "triton": triton_version, "cuda": str(torch.version.cuda),
            "commit": commit_label(Path(__file__).resolve().parents[1]),
            "code": code_digest(Path(__file__).resolve().parents[1])}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipelines.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", nargs="?", choices=["model", "llama7b", "resume", "throughput", "preset"],
                   help="run one in-process step (used by the checks; resume's and preset's runs go to --runs)")
    p.add_argument("--experiment", help="preset: the experiment timed (e.g. flipflop/gpu)")
    p.add_argument("--pe", default="rope", help="preset: its encoding (default %(default)s)")
    p.add_argument("--only", metavar="WORD", help="run only the checks whose name contains WORD (or any of WORD,WORD,...)")
    p.add_argument("--suite", choices=SUITES, default=None,
                   help="core (the default): the proof, sized for 8 minutes (make gpu-check); measure: profiles, "
                        "the sweep, autotuning, timed presets, every encoding's benchmark (make gpu-measure); "
                        "all: both (the default with --only)")
    p.add_argument("--jobs", type=int, default=JOBS, help="untimed steps run side by side (default %(default)s)")
    p.add_argument("--runs", type=Path, default=Path("runs"))
    p.add_argument("--dry-run", action="store_true", help="list the checks; run nothing")
    p.add_argument("--budget", type=float, metavar="SECONDS",
                   help="start no step after SECONDS and cut the running one there (a short GPU window)")
    p.add_argument("--records", type=Path, default=Path("results/gpu-check"),
                   help="where each window's summary and logs go (<records>/<time>/)")
    p.add_argument("--commit", help="the commit the tree was sent at (a device's copy may carry an older .git)")
    p.add_argument("--render", type=Path, metavar="OUT",
                   help="write OUT (results/gpu.md) from every summary under --records")
    p.add_argument("--pack", type=Path, metavar="DIR",
                   help="also write the window as DIR/<time>.tar.gz after every step (one file to carry back)")
    p.add_argument("--unpack", type=Path, metavar="ARCHIVE",
                   help="extract a window packed by --pack into --records (never over an existing window but "
                        "by its own continuation)")
    p.add_argument("--continue", dest="resume", type=Path, metavar="WINDOW",
                   help="run the steps a window (its folder) planned and did not run, or ran until --budget cut "
                        "them, into that window: same kind of GPU, driver, stack and code only")
    args = p.parse_args(argv)
    if args.step == "model":
        print(json.dumps(model_check()))
        return 0
    if args.step == "llama7b":
        print(json.dumps(llama7b_check()))
        return 0
    if args.step == "resume":
        print(json.dumps(resume_check(args.runs)))
        return 0
    if args.step == "preset":
        if not args.experiment:
            p.error("preset needs --experiment <preset>, e.g. --experiment flipflop/gpu")
        print(json.dumps(preset_check(args.experiment, args.pe, args.runs)), flush=True)
        return 0
    if args.step == "throughput":
        from pipelines.throughput import throughput

        throughput(echo=True)  # one JSON line after each preset: the last holds them all
        return 0
    if args.unpack:
        print(f"unpacked {unpack_window(args.unpack, args.records)}; then make gpu-page")
        return 0
    if args.render:
        dirs = sorted(d.parent for d in args.records.glob("*/summary.json"))
        render(dirs, args.render)
        print(f"wrote {args.render} from {len(dirs)} summaries under {args.records}")
        return 0
    import torch

    if not torch.cuda.is_available() and not args.dry_run:
        print("pipelines.gpu_check: no CUDA device here; run it on a GPU machine (--dry-run lists the checks)",
              file=sys.stderr)
        return 2
    if args.resume:
        if args.dry_run or args.only or args.suite:
            p.error("--continue runs what its window planned; --dry-run, --only and --suite plan a new window")
        return continue_window(args.resume, args.runs, args.budget, args.jobs, args.commit, args.pack)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.records / stamp
    words = None if args.only is None else [w.strip().lower() for w in args.only.split(",") if w.strip()]
    suite = args.suite or ("core" if words is None else "all")
    steps = [c for c in checks(args.runs / "gpu-check" / stamp / "runs", out_dir, suite)
             if words is None or any(w in c.name.lower() for w in words)]
    if not steps:
        p.error(f"--only {args.only!r} matches no check; --dry-run lists them")
    if args.dry_run:
        for check in steps:
            how = "alone" if check.timed else "side by side"
            print(f"[{check.suite}, {how}, at most {check.limit_s} s] {check.name}: {shlex.join(check.argv)}")
        return 0
    out_dir.mkdir(parents=True)
    env = environment_as_sent(args.commit)
    plan = {"suite": suite, "only": args.only, "planned": [c.name for c in steps],
            "calls": [{"started": stamp, "commit": env["commit"]}]}
    archive = None if args.pack is None else args.pack / f"{stamp}.tar.gz"

    def record(done: list[Outcome]) -> None:
        write_summary(out_dir, env, done, plan)
        if archive is not None:
            pack_window(out_dir, archive)

    record([])  # the machine and the plan come back even if no step ends before the call does
    outcomes = run_steps(steps, out_dir, args.budget, args.jobs, on_done=record, started=STARTED)
    print(f"summary: {out_dir / 'summary.md'}" + (f"; packed: {archive}" if archive else ""))
    return 0 if outcomes and all(o.passed for o in outcomes) and len(outcomes) == len(steps) else 1


def environment_as_sent(commit: str | None) -> dict[str, str]:
    """``environment()``, its commit labelled with the one the tree was sent at (``--commit``)."""
    env = environment()
    if commit:
        env["commit"] = f"{commit} (git there: {env['commit']})"
    return env


SAME_RUN = ("device", "gpu", "driver", "torch", "triton", "cuda", "code")
"""What a continued window keeps: the machine, its stack and the code (not git's view of it)."""


def _set_aside(steps: Sequence[Check], window: Path, call: int) -> dict[str, str]:
    """Outputs that cut-off steps left inside the window (a sweep writes after each length) move
    to ``<name>.cut-<call>`` before the steps run again; returns the moves (window-relative)."""
    moved = {}
    for token in (t for c in steps for t in c.argv if str(window) in t):
        path = Path(token[token.index(str(window)):])
        if path.exists() and path != window and path.is_relative_to(window):
            aside, n = path.with_name(f"{path.name}.cut-{call}"), 1
            while aside.exists():  # a call that died before it recorded its moves left this name
                n += 1
                aside = path.with_name(f"{path.name}.cut-{call}-{n}")
            path.rename(aside)
            moved[path.relative_to(window).as_posix()] = aside.relative_to(window).as_posix()
    return moved


def continue_window(window: Path, runs: Path, budget_s: float | None, jobs: int, commit: str | None,
                    pack: Path | None) -> int:
    """Run the steps ``window`` planned and has no finished outcome for, with the kind of GPU,
    driver, stack and code that ran it (a call limit cut it: the same proof, finished in a later
    call). Outcomes merge in planned order; a step cut by the budget and run again keeps its cut
    outcome under ``superseded``. Returns 0 when every planned step has passed."""
    summary = read_window(window)
    env = environment_as_sent(commit)
    differs = [k for k in SAME_RUN if env.get(k) != summary["environment"].get(k)]
    if differs:
        was = ", ".join(f"{k}={summary['environment'].get(k)}" for k in differs)
        now = ", ".join(f"{k}={env.get(k)}" for k in differs)
        raise SystemExit(f"{window} ran with {was}; here {now}: a window continues only on the same kind of "
                         f"GPU, driver, stack and code. Run make gpu-check afresh.")
    pending = pending_steps(summary)
    kept = [o for o in summary["outcomes"] if o["name"] not in pending]
    if not pending:
        print(f"{window}: every planned step has an outcome; nothing to continue")
        return 0 if all(o["passed"] for o in kept) else 1
    calls = summary["calls"]
    call, started = len(calls) + 1, time.strftime("%Y%m%d-%H%M%S")
    # the start time too: a call that died before any outcome came back is retried as the same
    # call number, and its leftover runs (runs/ survives on a warm machine) failed the resume step
    steps = [c for c in checks(runs / "gpu-check" / f"{window.name}-call{call}-{started}" / "runs", window,
                               summary["suite"]) if c.name in pending]
    moved = _set_aside(steps, window, call)
    calls = [*calls, {"started": started, "commit": env["commit"],
                      "ran": [c.name for c in steps], "moved": moved}]
    plan = {k: summary[k] for k in ("suite", "only", "planned")} | {
        "calls": calls, "superseded": [*summary.get("superseded", []),
                                       *(o for o in summary["outcomes"] if o["name"] in pending)]}
    order = {name: i for i, name in enumerate(summary["planned"])}
    archive = None if pack is None else pack / f"{window.name}.tar.gz"

    def record(done: list[Outcome]) -> None:
        merged = sorted([*kept, *(asdict(o) for o in done)], key=lambda o: order[o["name"]])
        write_summary(window, summary["environment"], merged, plan)
        if archive is not None:
            pack_window(window, archive)

    record([])  # the moves and this call, at once: a retry after this call dies is the next call
    print(f"continuing {window} (call {call}): {len(steps)} step(s)", flush=True)
    outcomes = run_steps(steps, window, budget_s, jobs, on_done=record, log_prefix=f"call{call}-",
                         started=STARTED)
    print(f"summary: {window / 'summary.md'}" + (f"; packed: {archive}" if archive else ""))
    return 0 if len(outcomes) == len(steps) and all(o["passed"] for o in [*kept, *map(asdict, outcomes)]) else 1


def write_summary(out_dir: Path, env: dict[str, str], outcomes: Sequence[Outcome | dict],
                  plan: dict | None = None) -> None:
    """summary.json and summary.md of the steps run so far (``plan``: the suite, --only, the steps
    it meant to run and the calls that ran them)."""
    summary = {"dir": str(out_dir), "environment": env, **(plan or {}),
               "outcomes": [o if isinstance(o, dict) else asdict(o) for o in outcomes]}
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    (out_dir / "summary.md").write_text(summary_md(summary))


if __name__ == "__main__":
    raise SystemExit(main())
