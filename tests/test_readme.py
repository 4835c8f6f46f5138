"""The README's usage example runs as written."""

import re
import subprocess
from pathlib import Path

import pytest


def test_readme_python_example_runs():
    text = (Path(__file__).parents[1] / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, "README has no python example"
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)  # noqa: S102
    assert namespace["out"].shape == (2, 12)
    assert namespace["logits"].shape == (2, 16, 64)


REPO = Path(__file__).parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    return LINK.findall(path.read_text())


def test_readme_links_stay_inside_the_repository():
    """Issue 14.12: the README linked ../shared/*.md, which a clone does not have."""
    for doc in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in _links(doc):
            if doc.name != "README.md" and target.startswith(("http://", "https://")):
                continue  # the method notes cite the paper and the official code
            assert not target.startswith(("http://", "https://", "/")), f"{doc.name}: {target}"
            resolved = (doc.parent / target.split("#")[0]).resolve()
            assert resolved.is_relative_to(REPO.resolve()), f"{doc.name} links outside the repo: {target}"
            assert resolved.exists(), f"{doc.name} links to a missing file: {target}"
    assert "docs/DESIGN.md" in _links(REPO / "README.md") and "docs/tape-spec.md" in _links(REPO / "README.md")


def test_readme_commands_name_what_exists_and_run_in_the_venv():
    """Issue 14.11/12: commands that work as written after `make install`."""
    text = (REPO / "README.md").read_text()
    assert "source .venv/bin/activate" in text and ".venv/bin/python -m pipelines.train" in text
    assert "huggingface-cli" not in text and "hf download" in text
    assert "CUDA_VISIBLE_DEVICES" in text and "trainer.devices=[1]" in text
    code = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S)) + "\n" + "\n".join(
        re.findall(r"`([^`\n]+)`", text))
    for module in set(re.findall(r"python -m (pipelines\.\w+)", code)):
        assert (REPO / (module.replace(".", "/") + ".py")).is_file(), module
    for preset in set(re.findall(r"experiment=([\w/]+)", code)):
        if "<" not in preset:
            assert (REPO / "conf/experiment" / f"{preset}.yaml").is_file(), preset
    targets = set(re.findall(r"^([\w-]+):", (REPO / "Makefile").read_text(), flags=re.M))
    for target in set(re.findall(r"\bmake ([a-z][\w-]*)", code)):
        assert target in targets, f"make {target}"


# Each README command and the test that runs it (or its smoke equivalent).
RUN_BY = {
    "make install": ".ci/run",
    "source .venv/bin/activate": ".ci/run",
    "make test": ".ci/run",
    "python -m pipelines.train experiment=addition/cpu pe=tape seed=0":
        "tests/test_pipeline_train.py::test_every_addition_preset_runs_end_to_end_when_shrunk",
    "python -m pipelines.train experiment=addition/cpu pe=tape seed=0 ckpt_path=last":
        "tests/test_pipeline_train.py::test_resume_equals_uninterrupted",
    "python -m pipelines.evaluate run_dir=runs/addition/cpu/tape/0/<time>-<id>":
        "tests/test_pipeline_train.py::test_evaluate_reproduces_the_run_and_writes_beside_it",
    "python -m pipelines.train -m experiment=pretrain/cpu pe=rope,tape seed=0,1":
        "tests/test_pipeline_cli.py::test_multirun_gives_each_job_its_own_dir_and_survives_a_failed_job",
    "make reproduce-table": "tests/test_reproduce.py::test_main_cpu_renders_the_report_after_running",
    "make reproduce-table PROFILE=tables": "tests/test_reproduce.py::test_execute_runs_what_is_left_then_skips_everything",
    "make report": "tests/test_records.py::test_a_fresh_clone_renders_results_byte_for_byte",
    "make report RUNS=runs OUT=runs/report":
        "tests/test_records.py::test_a_render_from_records_is_the_same_bytes_wherever_they_are",
}


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    lines = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S)).splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def test_every_readme_command_is_run_by_a_named_test():
    """Issue 24: each command of the README runs in the suite or in CI, as written or shrunk."""
    commands = _readme_commands()
    assert set(commands) == set(RUN_BY), set(commands) ^ set(RUN_BY)
    ci = (REPO / ".ci" / "run").read_text()
    for command, where in RUN_BY.items():
        if where == ".ci/run":
            assert command.split()[-1] in ci or command.startswith("source"), command
            continue
        path, name = where.split("::")
        assert f"def {name}(" in (REPO / path).read_text(), where


@pytest.mark.parametrize("command, expands_to", [
    ("make reproduce-table", "-m pipelines.reproduce --profile cpu --jobs 2 --seeds 0"),
    ("make reproduce-table PROFILE=tables", "-m pipelines.reproduce --profile tables"),
    ("make report", "-m pipelines.report"),
    ("make report RUNS=runs OUT=runs/report", "-m pipelines.report --runs runs --out runs/report"),
    ("make report REPORT_ARGS=--carry-over", "-m pipelines.report --carry-over"),
])
def test_readme_make_commands_expand_to_the_tested_entry_points(command: str, expands_to: str):
    out = subprocess.run([*command.split(), "-n"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and expands_to in " ".join(out.stdout.split()), out.stdout + out.stderr
