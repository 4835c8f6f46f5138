"""Perplexity windows and the passkey prompt, checked on hand-made data."""

import math

import numpy as np
import pytest
import torch

from tape.data.passkey import FILLER, KEY_LINE, QUESTION, TASK, garbage_chars, passkey_accuracy, passkey_prompt
from tape.metrics.perplexity import load_token_file, sliding_window_perplexity, window_starts


def test_window_starts_every_stride_full_windows_only():
    assert window_starts(1000, 256, 256) == [0, 256, 512]  # 768 + 256 > 1000: dropped
    assert window_starts(1024, 256, 256) == [0, 256, 512, 768]
    assert window_starts(100, 256) == []
    assert window_starts(10_000, 256, 256, max_windows=3) == [0, 4864, 9728]


class _Recorder(torch.nn.Module):
    """Uniform logits over the vocabulary; records every window it is shown."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.seen = vocab, []
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids):
        self.seen.append(input_ids.clone())
        return type("Out", (), {"logits": torch.zeros(*input_ids.shape, self.vocab)})()


def test_perplexity_over_a_token_file(tmp_path):
    path = tmp_path / "test.bin"
    np.arange(1100, dtype=np.uint16).tofile(path)
    tokens = load_token_file(path)
    assert len(tokens) == 1100 and tokens[1099] == 1099
    model = _Recorder(vocab=2000)
    result = sliding_window_perplexity(model, tokens, seq_len=512, stride=256, batch_size=2)
    windows = torch.cat(model.seen)
    assert [int(w[0]) for w in windows] == [0, 256, 512]  # 768 + 512 > 1100
    assert all(torch.equal(w, torch.arange(s, s + 512)) for w, s in zip(windows, [0, 256, 512]))
    assert result["windows"] == 3 and result["scored_tokens"] == 3 * 511
    assert math.isclose(result["perplexity"], 2000.0, rel_tol=1e-4)  # uniform over 2000 tokens


def test_missing_token_file_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="pg19/test.bin"):
        load_token_file(tmp_path / "pg19.bin")


def test_passkey_prompt_deterministic_with_the_key_line_once():
    a, b, c = passkey_prompt(4096, seed=3), passkey_prompt(4096, seed=3), passkey_prompt(4096, seed=4)
    assert a == b and a.text != c.text
    assert 1 <= a.key < 50000
    assert a.text.count(KEY_LINE.format(key=a.key)) == 1
    assert a.text.count(str(a.key)) == 2  # both mentions inside the key line, nowhere else
    assert a.text.startswith(TASK) and a.text.endswith(QUESTION)
    filler_chars = len(a.text) - len(TASK) - len(QUESTION) - len(KEY_LINE.format(key=a.key)) - 4
    assert filler_chars == 4096
    assert not any(ch.isdigit() for ch in FILLER)


def test_garbage_lengths_follow_longlora():
    assert [garbage_chars(i) for i in (1, 2, 8)] == [3072, 7168, 29696]


def test_passkey_accuracy_with_an_oracle_and_a_wrong_model():
    """A model that copies the key scores 1, one that answers 0 scores 0."""
    vocab = {ch: i for i, ch in enumerate(sorted(set(TASK + FILLER + KEY_LINE + QUESTION + "0123456789 \n{}")))}
    encode = lambda text: [vocab[ch] for ch in text]  # noqa: E731 - a character tokenizer

    class Oracle(torch.nn.Module):
        def __init__(self, cheat: bool):
            super().__init__()
            self.cheat, self.dummy = cheat, torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, past_key_values=None, **kwargs):
            # the "cache" is simply every id seen so far
            seen = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], 1)
            logits = torch.zeros(*input_ids.shape, len(vocab))
            for b, row in enumerate(seen.tolist()):
                text = "".join(k for t in row for k, v in vocab.items() if v == t)
                key = " " + text.split("The pass key is ")[1].split(".")[0]
                answered = text.split(QUESTION)[1]
                nxt = key[len(answered)] if self.cheat else "0"
                logits[b, -1, vocab[nxt]] = 1.0
            return type("Out", (), {"logits": logits, "past_key_values": seen})()

    assert passkey_accuracy(Oracle(True), encode, 300, trials=3)["accuracy"] == 1.0
    assert passkey_accuracy(Oracle(False), encode, 300, trials=3)["accuracy"] == 0.0
