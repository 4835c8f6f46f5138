"""The paper's reference numbers (tape-spec E.1-E.4), always shown labelled as the paper's.

The numbers are conf/paper_numbers.yaml's (tape.paper loads it), each under its source in the
paper; this module arranges them for the report. Nothing here is ours: the renderer puts these
beside our numbers in columns whose headers say "paper".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tape.paper import paper_number

import tape.pe as pe_registry


@dataclass(frozen=True)
class PaperColumn:
    """One column of the paper's numbers: a header that names its source, and values by row."""

    header: str
    values: Mapping[str, float]
    note: str = ""


def _column(entry: Mapping[str, Any]) -> PaperColumn:
    return PaperColumn(header=f"paper {entry['source']} ({entry['setting']})", values=entry["values"],
                       note=entry["note"])


# E.1 arithmetic: mean accuracy (%) over the test grid, per PE.
ADDITION_FIG5 = _column(paper_number("addition.fig5"))
ADDITION_FIG2 = _column(paper_number("addition.fig2"))

# E.2 SCROLLS Table 1, in the paper's column order (headers and metrics: tape.data.scrolls.TASKS).
_TABLE1 = paper_number("scrolls.table1")
SCROLLS_ORDER: tuple[str, ...] = tuple(_TABLE1["columns"])
SCROLLS_MEDIAN_LENGTH: dict[str, int] = dict(zip(SCROLLS_ORDER, _TABLE1["median_length"]))
SCROLLS_TABLE1: dict[str, dict[str, float]] = {pe: dict(zip(SCROLLS_ORDER, values))
                                               for pe, values in _TABLE1["values"].items()}
# Not in the paper: NoPE's QA metrics from the authors' repository history (tape-spec E.2).
SCROLLS_NOPE_REPO_HISTORY: dict[str, float] = paper_number("scrolls.nope_repo_history.values")

# E.3 Table 2: Llama-2-7B extended to 8k; perplexity on Proof-pile (PP) and PG19.
_TABLE2 = paper_number("context_extension.table2")
EXTENSION_LENGTHS: tuple[int, ...] = tuple(_TABLE2["lengths"])
EXTENSION_TABLE2: dict[str, dict[tuple[str, int], float]] = {
    method: {(corpus, n): v for corpus, vals in by_corpus.items() for n, v in zip(EXTENSION_LENGTHS, vals)}
    for method, by_corpus in _TABLE2["values"].items()
}

# E.4 Fig. 3: passkey accuracy over 20 trials at the mean prompt lengths below.
_FIG3 = paper_number("context_extension.passkey_fig3")
PASSKEY_TOKENS: tuple[int, ...] = tuple(_FIG3["tokens"])
PASSKEY_FIG3: dict[str, tuple[float, ...]] = {m: tuple(v) for m, v in _FIG3["values"].items()}

# Display names of the context-extension methods (an encoding's own is its class's ``display``).
DISPLAY: dict[str, str] = {
    "base": "base (not extended)", "lora": "LoRA", "longlora": "LongLoRA", "theta": "Theta Scaling",
    "embed_norm": "embeddings and norms only",
}
ADDITION_PES = ("rope", "randpe", "nope", "fire", "tape")
PRETRAIN_PES = ("rope", "alibi", "randpe", "fire", "xpos", "nope", "tape")
SCROLLS_PES = ("rope", "alibi", "randpe", "fire", "xpos", "tape")
EXTENSION_METHODS = ("base", "lora", "longlora", "theta", "tape")


def display(name: str) -> str:
    """The paper's spelling of a PE or method name (unknown names unchanged); a row set apart,
    ``"tape [trainer.max_steps=600]"``, keeps its bracket, unless its one option names another
    method (``"fox [pe.fox_gate=cable]"`` -> ``"CABLE"``, tape.pe's ``variants``)."""
    base, bracket, rest = name.partition(" [")
    setting, close, after = rest.partition("]")
    key, equals, value = setting.partition("=")
    if bracket and close and equals and key.startswith("pe.") and "," not in setting:
        named = pe_registry.variant(base, key.removeprefix("pe."), value)
        if named:  # a row set apart by one option that names another method: "CABLE"
            return named + after
    return (DISPLAY.get(base) or pe_registry.display(base)) + bracket + rest
