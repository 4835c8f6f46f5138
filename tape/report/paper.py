"""The paper's reference numbers (tape-spec E.1-E.4), always shown labelled as the paper's.

Transcribed from tape-spec section E, which cites the paper (Zhu et al., ICML 2025) and, where
marked, the authors' repository history. Nothing here is ours: the renderer puts these beside
our numbers in columns whose headers say "paper".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import tape.pe as pe_registry


@dataclass(frozen=True)
class PaperColumn:
    """One column of the paper's numbers: a header that names its source, and values by row."""

    header: str
    values: Mapping[str, float]
    note: str = ""


# E.1 arithmetic: mean accuracy (%) over the test grid, per PE.
ADDITION_FIG5 = PaperColumn(
    header="paper Fig. 5 (train <= 20 digits, test <= 40)",
    values={"rope": 26.12, "randpe": 26.12, "fire": 39.44, "tape": 41.42},
    note="the paper's appendix Fig. 5 (v1; the ICLR submission's caption printed FIRE 49.44); "
         "no NoPE value is given",
)
ADDITION_FIG2 = PaperColumn(
    header="paper Fig. 2 (train <= 40 digits, test <= 80)",
    values={"rope": 26.32, "randpe": 26.56, "nope": 22.45, "fire": 26.98, "tape": 32.82},
    note="the paper's main Fig. 2",
)

# E.2 SCROLLS Table 1, in the paper's column order (headers and metrics: tape.data.scrolls.TASKS).
SCROLLS_ORDER = ("qasper", "contract_nli", "narrative_qa", "quality", "qmsum", "summ_screen_fd",
                 "gov_report")
SCROLLS_MEDIAN_LENGTH: dict[str, int] = {
    "qasper": 5472, "contract_nli": 2148, "narrative_qa": 57829, "quality": 7171,
    "qmsum": 14197, "summ_screen_fd": 9046, "gov_report": 8841,
}
SCROLLS_TABLE1: dict[str, dict[str, float]] = {
    pe: dict(zip(SCROLLS_ORDER, values))
    for pe, values in {
        "rope": (8.39, 65.00, 1.77, 0.04, 6.34, 5.63, 9.71),
        "alibi": (8.25, 69.62, 4.11, 0.0, 9.92, 9.78, 18.81),
        "randpe": (13.44, 62.01, 4.63, 0.38, 8.43, 8.31, 8.93),
        "fire": (3.41, 71.26, 0.48, 1.25, 8.78, 7.42, 11.03),
        "xpos": (9.02, 71.75, 4.83, 0.24, 10.73, 9.38, 16.38),
        "tape": (11.52, 72.80, 6.79, 11.60, 12.42, 10.34, 15.18),
    }.items()
}
# Not in the paper: NoPE's QA metrics from the authors' repository history (tape-spec E.2).
SCROLLS_NOPE_REPO_HISTORY: dict[str, float] = {
    "qasper": 14.62, "contract_nli": 71.46, "narrative_qa": 11.64, "quality": 23.68,
}

# E.3 Table 2: Llama-2-7B extended to 8k; perplexity on Proof-pile (PP) and PG19.
EXTENSION_LENGTHS = (1024, 2048, 4096, 8192)
EXTENSION_TABLE2: dict[str, dict[tuple[str, int], float]] = {
    method: {
        (corpus, n): v
        for corpus, vals in zip(("proof_pile", "pg19"), (values[:4], values[4:]))
        for n, v in zip(EXTENSION_LENGTHS, vals)
    }
    for method, values in {
        "lora": (3.828, 3.369, 3.064, 2.867, 9.791, 9.098, 8.572, 8.199),
        "longlora": (3.918, 3.455, 3.153, 2.956, 9.989, 9.376, 8.948, 8.645),
        "theta": (3.864, 3.415, 3.121, 2.934, 9.257, 8.640, 8.241, 7.999),
        "tape": (3.641, 3.196, 2.901, 2.708, 8.226, 7.642, 7.278, 7.063),
    }.items()
}

# E.4 Fig. 3: passkey accuracy over 20 trials at the mean prompt lengths below.
PASSKEY_TOKENS = (891, 1982, 2802, 3895, 4986, 5805, 6898, 7990)
PASSKEY_FIG3: dict[str, tuple[float, ...]] = {
    "lora": (0.40, 0.40, 0.35, 0.35, 0.30, 0.35, 0.40, 0.35),
    "longlora": (0.40, 0.35, 0.40, 0.35, 0.50, 0.50, 0.50, 0.45),
    "theta": (1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 0.95),
    "tape": (1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 0.95, 1.00),
}

# Display names of the context-extension methods (an encoding's own is its class's ``display``).
DISPLAY: dict[str, str] = {
    "base": "base (not extended)", "lora": "LoRA", "longlora": "LongLoRA", "theta": "Theta Scaling",
}
ADDITION_PES = ("rope", "randpe", "nope", "fire", "tape")
PRETRAIN_PES = ("rope", "alibi", "randpe", "fire", "xpos", "nope", "tape")
SCROLLS_PES = ("rope", "alibi", "randpe", "fire", "xpos", "tape")
EXTENSION_METHODS = ("base", "lora", "longlora", "theta", "tape")


def display(name: str) -> str:
    """The paper's spelling of a PE or method name (unknown names unchanged); a row set apart,
    ``"tape [trainer.max_steps=600]"``, keeps its bracket."""
    base, bracket, rest = name.partition(" [")
    return (DISPLAY.get(base) or pe_registry.display(base)) + bracket + rest
