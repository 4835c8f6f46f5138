"""A new encoding is ``tape/pe/<x>.py`` plus ``conf/pe/<x>.yaml``: added to a copy of the project
with no other file changed, it is property-tested, trains from the command line, is benchmarked
and has its display name in tables."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from project_copy import copy_project, run_python

TOY_ENCODING = textwrap.dedent('''
    """Toy: a learned per-head linear distance penalty (a learnable ALiBi), for the extension test."""

    from __future__ import annotations

    from dataclasses import dataclass

    import torch
    from torch import Tensor, nn

    from tape.pe import register
    from tape.pe.base import LayerPE, PEOptions, PositionalEncoding, PositionState


    @dataclass
    class ToyOptions(PEOptions):
        toy_slope: float = 0.5

        def problems(self, cfg) -> list[str]:
            return [] if self.toy_slope >= 0 else [f"toy_slope={self.toy_slope} must be >= 0"]


    class ToyLayer(LayerPE):
        def __init__(self, n_heads: int, slope: float) -> None:
            super().__init__()
            self.slope = nn.Parameter(torch.full((n_heads,), slope))
            self.init_slope = slope

        def attn_bias(self, state: PositionState) -> Tensor:
            dist = (state.query_pos[:, None, :, None] - state.key_pos[:, None, None, :]).float()
            return -self.slope.float()[None, :, None, None] * dist  # (B, H, N, T)

        def init_weights(self, std: float) -> None:
            with torch.no_grad():
                self.slope.fill_(self.init_slope)


    @register("toy")
    class Toy(PositionalEncoding):
        display = "Toy bias"
        Options = ToyOptions

        def make_layer(self, layer_idx: int) -> LayerPE:
            return ToyLayer(self.cfg.n_heads, self.opts.toy_slope)
''')
TOY_CONF = "name: toy\ntoy_slope: 0.5\n"


@pytest.fixture(scope="module")
def project_with_toy(tmp_path_factory) -> Path:
    return copy_project(tmp_path_factory.mktemp("project"),
                        {"tape/pe/toy.py": TOY_ENCODING, "conf/pe/toy.yaml": TOY_CONF})


@pytest.mark.slow
def test_a_new_encoding_is_property_tested_and_its_options_checked(project_with_toy):
    proc = run_python(project_with_toy, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                      "tests/test_pe_properties.py", "tests/test_pipeline_config.py", "-k", "toy or registered_pe")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    passed = int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert passed >= 8  # every property of tests/test_pe_properties.py ran on "toy"
    bad = run_python(project_with_toy, "-c", "import tape.pe; from tape.model import ModelConfig; "
                     "tape.pe.check(ModelConfig(vocab_size=8, n_layers=1, d_model=16, n_heads=2, pe='toy', "
                     "pe_options={'toy_slope': -1.0}))")
    assert bad.returncode != 0 and "toy_slope=-1.0 must be >= 0" in bad.stderr


@pytest.mark.slow
def test_a_new_encoding_trains_is_benchmarked_and_displayed(project_with_toy, tmp_path):
    train = run_python(project_with_toy, "-m", "pipelines.train", "experiment=addition/smoke", "pe=toy",
                       "pe.toy_slope=0.25", "logger=none", "trainer.max_steps=3", f"paths.runs_dir={tmp_path}/runs")
    assert train.returncode == 0, train.stderr[-3000:]
    bench = run_python(project_with_toy, "-m", "pipelines.benchmark", "scale=tiny", "pes=[rope,toy]",
                       f"output_dir={tmp_path}/bench")
    assert bench.returncode == 0, bench.stderr[-3000:]
    rows = json.loads((tmp_path / "bench" / "efficiency.json").read_text())["attention_op"]["rows"]
    assert "toy" in rows and "Toy bias" in (tmp_path / "bench" / "efficiency.md").read_text()
    shown = run_python(project_with_toy, "-c", "from tape.report.paper import display; "
                       "from tape.bench.run import ALL_PES; print(display('toy'), 'toy' in ALL_PES)")
    assert shown.stdout.split() == ["Toy", "bias", "True"], shown.stderr
