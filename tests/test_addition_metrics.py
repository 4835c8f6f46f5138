"""Addition grid metric and heatmap: exact match, cell means, tidy CSV, a valid PNG."""

from __future__ import annotations

import math
import struct
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn

from tape.data.addition import EOS, cell_examples, decode, encode
from tape.metrics.arithmetic import (
    Cell, digits_right, evaluate_grid, exact_match, merge_grids, read_grid_csv, summarize,
    write_grid_csv,
)
from tape.report.heatmap import plot_heatmap


class Oracle(nn.Module):
    """A stand-in DecoderLM whose greedy decoding writes the true (reversed) sum, optionally
    wrong whenever the first operand has more than ``wrong_above`` digits."""

    def __init__(self, wrong_above: int = 10**9) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.wrong_above = wrong_above

    def generate(self, prompts: Tensor, max_new_tokens: int, eos_token_id: int) -> Tensor:
        rows = []
        for row in prompts.tolist():
            a, b = decode(row).rstrip("=").split("+")
            answer = encode(str(int(a[::-1]) + int(b[::-1]))[::-1])
            if len(a) > self.wrong_above:
                answer[0] = 4 + (answer[0] - 4 + 1) % 10  # off by one in the lowest digit
            new = (answer + [eos_token_id] * max_new_tokens)[:max_new_tokens]
            rows.append(row + new)
        return torch.tensor(rows)


def test_exact_match_rules() -> None:
    gold = [[5, 6, EOS], [5, 6, EOS], [5, 6, EOS], [5, EOS]]
    generated = torch.tensor([
        [5, 6, EOS, 9, 9],   # right; tokens after the answer are ignored
        [5, 6, 7, EOS, 9],   # one digit too many: EOS missing at the gold position
        [5, EOS, 6, EOS, 9], # stops early: after the first EOS everything counts as PAD
        [5, EOS, 4, 4, 4],   # right
    ])
    assert exact_match(generated, gold) == [True, False, False, True]


def test_oracle_scores_100_and_a_model_wrong_out_of_distribution_splits_the_means() -> None:
    cells = evaluate_grid(Oracle(), max_digits=4, examples_per_cell=3, seed=0, batch_size=7)
    assert len(cells) == 16 and all(c.n == 3 and c.correct == 3 for c in cells)
    assert summarize(cells, train_digits=2)["mean_accuracy"] == 100.0

    cells = evaluate_grid(Oracle(wrong_above=2), max_digits=4, examples_per_cell=3, seed=0)
    m = summarize(cells, train_digits=2)
    assert m["in_distribution_accuracy"] == 100.0
    # Wrong exactly in the 8 cells with len_a in {3, 4}; right in the other 4 OOD cells.
    assert m["ood_accuracy"] == pytest.approx(100.0 * 4 / 12)
    assert m["mean_accuracy"] == pytest.approx(100.0 * 8 / 16)
    assert m["n_cells"] == 16 and m["n_examples"] == 48


def test_digits_right_counts_answer_digits_at_their_place() -> None:
    gold = [[5, 6, 7, EOS], [5, 6, 7, EOS], [5, 6, 7, EOS], [5, EOS]]
    generated = torch.tensor([
        [5, 6, 7, EOS, 9],  # all 3
        [5, 9, 7, EOS, 9],  # a wrong middle digit: 2 of 3
        [5, EOS, 6, 7, 9],  # stops early: what follows the EOS is PAD, 1 of 3
        [4, 6, 6, 6, 6],    # 0 of 1
    ])
    assert digits_right(generated, gold) == [3, 2, 1, 0]


def test_digits_after_an_early_eos_earn_nothing_even_where_they_line_up() -> None:
    """After the first EOS everything is PAD: a 7 that lines up with the gold's third digit
    behind an early EOS is not credited (only the leading 5 is)."""
    gold = [[5, 6, 7, EOS]]
    generated = torch.tensor([[5, EOS, 7, EOS, 9]])
    assert digits_right(generated, gold) == [1]
    assert exact_match(generated, gold) == [False]


def test_oracle_wrong_in_one_digit_keeps_most_digit_accuracy() -> None:
    cells = evaluate_grid(Oracle(wrong_above=2), max_digits=4, examples_per_cell=3, seed=0)
    m = summarize(cells, train_digits=2)
    assert m["in_distribution_digit_accuracy"] == 100.0
    # the 8 cells with len_a in {3, 4}: every answer misses its units digit alone
    expected = []
    for c in cells:
        if c.len_a <= 2 and c.len_b <= 2:
            continue
        lengths = [len(str(ex.a + ex.b)) for ex in cell_examples(0, c.len_a, c.len_b, 3)]
        right = sum(n - 1 for n in lengths) if c.len_a > 2 else sum(lengths)
        assert (c.digits, c.digits_correct) == (sum(lengths), right)
        expected.append(100.0 * right / sum(lengths))
    assert m["ood_digit_accuracy"] == pytest.approx(sum(expected) / len(expected))
    assert m["ood_accuracy"] < m["ood_digit_accuracy"] < 100.0
    assert "ood_digit_accuracy" not in summarize([Cell(1, 1, 1, 1)], 1)  # old grids: no digits


def test_summarize_is_a_mean_over_cells_not_examples() -> None:
    cells = [Cell(1, 1, 10, 10), Cell(1, 2, 100, 0)]
    m = summarize(cells, train_digits=1)
    assert m["mean_accuracy"] == 50.0  # not 10/110
    assert m["in_distribution_accuracy"] == 100.0 and m["ood_accuracy"] == 0.0
    assert math.isnan(summarize([Cell(1, 1, 1, 1)], train_digits=1)["ood_accuracy"])


def test_grid_csv_roundtrip_never_overwrites_and_merges(tmp_path: Path) -> None:
    cells = [Cell(1, 1, 4, 3), Cell(1, 2, 4, 0)]
    write_grid_csv(cells, tmp_path / "grid.csv")
    assert read_grid_csv(tmp_path / "grid.csv") == cells
    assert (tmp_path / "grid.csv").read_text().splitlines()[0] == "len_a,len_b,n,correct"
    with pytest.raises(FileExistsError):
        write_grid_csv(cells, tmp_path / "grid.csv")
    assert merge_grids(cells[1:], cells[:1]) == cells
    with pytest.raises(ValueError, match="two grids"):
        merge_grids(cells, cells[:1])
    with_digits = [Cell(1, 1, 4, 3, 8, 7), Cell(1, 2, 4, 0, 8, 2)]
    write_grid_csv(with_digits, tmp_path / "digits.csv")
    assert read_grid_csv(tmp_path / "digits.csv") == with_digits
    assert (tmp_path / "digits.csv").read_text().splitlines()[0] == "len_a,len_b,n,correct,digits,digits_correct"
    (tmp_path / "bad.csv").write_text("len_a,len_b,n,correct,digits\n1,1,1,1,1\n")
    with pytest.raises(ValueError, match="expected columns"):
        read_grid_csv(tmp_path / "bad.csv")


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_heatmap_is_a_png_with_the_grid_and_the_training_box(tmp_path: Path) -> None:
    cells = [Cell(i, j, 10, (i * j) % 11) for i in range(1, 7) for j in range(1, 7)]
    fig = plot_heatmap(cells, train_digits=3, title="rope: mean 42.00%", path=tmp_path / "h.png")
    width, height = _png_size(tmp_path / "h.png")
    assert width > 100 and height > 100
    ax = fig.axes[0]
    grid = ax.images[0].get_array()
    assert grid.shape == (6, 6)  # rows len_a 1..6, columns len_b 1..6
    assert grid[1, 4] == pytest.approx(100.0 * ((2 * 5) % 11) / 10)  # [len_a - 1, len_b - 1]
    box = ax.patches[0]
    assert (box.get_width(), box.get_height()) == (3, 3)
    assert ax.get_title() == "rope: mean 42.00%"
    assert len(fig.axes) == 2  # the colour bar
    with pytest.raises(FileExistsError):
        plot_heatmap(cells, 3, "again", tmp_path / "h.png")
