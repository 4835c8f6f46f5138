"""Perplexity windows and the passkey prompt, checked on hand-made data."""

import math

import numpy as np
import pytest
import torch

from tape.data.passkey import (
    FILLER, KEY_LINE, PAPER_FILLER_CHARS, QUESTION, TASK, draw_trial, garbage_chars,
    passkey_prompt,
)
from tape.metrics.passkey import passkey_accuracy, passkey_trial
from tape.metrics.perplexity import load_token_file, sliding_window_perplexity, window_starts


def test_window_starts_every_stride_full_windows_only():
    assert window_starts(1000, 256, 256) == [0, 256, 512]  # 768 + 256 > 1000: dropped
    assert window_starts(1024, 256, 256) == [0, 256, 512]  # range(0, n - L, 256): 768 is not a start
    assert window_starts(100, 256) == []
    assert window_starts(10_000, 256, 256, max_windows=3) == [0, 4864, 9728]


def _longlora_window_starts(n_tokens: int, seq_len: int) -> list[int]:
    """The start loop of LongLoRA's eval_distributed.py (and TAPE's perplexity script), written
    out: ``list(range(0, len(data) - seq_length, sliding_window))`` with sliding_window 256."""
    starts, i = [], 0
    while i < n_tokens - seq_len:
        starts.append(i)
        i += 256
    return starts


@pytest.mark.parametrize("seq_len", [256, 512])
def test_window_count_equals_longlora_when_n_minus_l_is_a_multiple_of_256(tmp_path, seq_len):
    path = tmp_path / "test.bin"
    n = seq_len + 4 * 256  # (n - L) % 256 == 0: the case where the old count had one extra window
    np.arange(n, dtype=np.uint16).tofile(path)
    model = _Recorder(vocab=n)
    result = sliding_window_perplexity(model, load_token_file(path), seq_len=seq_len, stride=256)
    expected = _longlora_window_starts(n, seq_len)
    assert result["windows"] == len(expected) == 4
    assert [int(w[0]) for w in torch.cat(model.seen)] == expected


class _Recorder(torch.nn.Module):
    """Uniform logits over the vocabulary; records every window it is shown."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.seen = vocab, []
        self.dummy = torch.nn.Parameter(torch.zeros(()))

    def forward(self, input_ids, use_cache=True):
        assert use_cache is False  # a Hugging Face model would keep every window's KV cache
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


def test_a_token_file_of_another_vocabulary_is_named(tmp_path):
    """Ids past the model's vocabulary failed with a bare IndexError inside the embedding."""
    from omegaconf import OmegaConf

    from pipelines.errors import PipelineConfigError
    from pipelines.tasks import perplexity

    path = tmp_path / "llama.bin"
    np.array([5, 31999, 7] * 100, dtype=np.uint16).tofile(path)
    task = OmegaConf.create({"corpora": {"pg19": str(path)}, "lengths": [16], "token_dtype": "uint16",
                             "stride": 8, "batch_size": 1, "max_windows": None})
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(300, 4)
    with pytest.raises(PipelineConfigError, match=r"task.corpora.pg19: token id 31999 .* vocabulary of 300"):
        perplexity.rows(model, task)


def test_protocol_note_names_a_run_that_scored_every_window():
    """A pretraining run with eval_max_windows=null scored every window: a re-evaluation at another
    stride says so (it was taken for a non-pretraining run, with no note)."""
    from omegaconf import OmegaConf

    from pipelines.tasks import perplexity

    source = type("Source", (), {"run_cfg": OmegaConf.create({"task": {"eval_max_windows": None, "eval_stride": 64}}),
                                 "context": 16})()
    task = OmegaConf.create({"corpora": {"heldout": "x.bin"}, "lengths": [16], "max_windows": None, "stride": 256})
    perplexity.adopt(task, source, None)
    note = perplexity.protocol_note(task, [{"windows": 3}])
    assert "the run's own ppl_<m>x used every window at stride 64" in note and "task.max_windows=null" in note
    task.stride = 64
    assert perplexity.protocol_note(task, [{"windows": 3}]) == ""


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


def test_paper_filler_sizes_are_eval_retrieval_test_points():
    # floor(3.75 * i * 1000 / 1024) * 1024 characters, i = 1..8 (--max_tokens 8192 --interval 1000)
    assert PAPER_FILLER_CHARS == (3072, 7168, 10240, 14336, 18432, 21504, 25600, 29696)


# (offset, key) of trials 0..19 at 3072 filler characters, computed with the official procedure:
# np.random.seed(i); offset = np.random.randint(0, 3072); key = np.random.randint(1, 50000).
OFFICIAL_DRAWS_3072 = [
    (2732, 43568), (1061, 33004), (2575, 6638), (1898, 1689), (1146, 8367), (2915, 18639),
    (2954, 41188), (175, 49690), (451, 25941), (382, 20829), (1289, 40062), (1945, 36544),
    (1867, 38556), (338, 47281), (2667, 13657), (2693, 49016), (2729, 48367), (2671, 34960),
    (275, 25721), (1629, 10863),
]


def test_official_draws_match_eval_retrieval_for_trials_0_to_19():
    state = np.random.get_state()
    assert [draw_trial(3072, i, "official") for i in range(20)] == OFFICIAL_DRAWS_3072
    assert draw_trial(3072, 0, "official") == (2732, 43568)  # the audit's trial 0
    for n_garbage in (7168, 29696):  # the same procedure at other lengths, run here
        for i in range(20):
            np.random.seed(i)
            want = (np.random.randint(0, n_garbage), np.random.randint(1, 50000))
            np.random.set_state(state)
            assert draw_trial(n_garbage, i, "official") == want
    prompt = passkey_prompt(3072, 0, "official")
    assert prompt.key == 43568
    assert prompt.text.index(KEY_LINE.format(key=43568)) == len(TASK) + 1 + 2732 + 1
    assert np.random.get_state()[1][0] == state[1][0]  # the global RNG is left alone
    with pytest.raises(ValueError, match="official"):
        draw_trial(3072, 0, "numpy")


def test_passkey_prompt_starts_with_bos_when_given():
    seen = []

    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, **kwargs):
            seen.append(input_ids.clone())
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 300), "past_key_values": None})()

    encode = lambda text: [3 + (ord(ch) % 250) for ch in text]  # noqa: E731
    prompt = passkey_prompt(100, 0, "official")
    _, n_bos = passkey_trial(Echo(), encode, prompt, bos_id=1)
    assert seen[0][0, 0] == 1 and seen[0][0, 1:].tolist() == encode(prompt.text)
    _, n_plain = passkey_trial(Echo(), encode, prompt)
    assert seen[-1][0, 0] != 1 and n_bos == n_plain + 1


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


def test_passkey_accuracy_runs_one_prompt_per_seed_from_seed_on():
    """Trial t is the prompt of seed + t: ``trials`` distinct prompts (and keys), not one
    prompt scored ``trials`` times."""
    prompts = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, past_key_values=None, **kwargs):
            if past_key_values is None:  # a trial's first call: its whole prompt
                prompts.append(input_ids[0].tolist())
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 300), "past_key_values": input_ids})()

    encode = lambda text: [3 + (ord(ch) % 250) for ch in text]  # noqa: E731
    passkey_accuracy(Recorder(), encode, 300, trials=3, seed=5)
    expected = [passkey_prompt(300, 5 + t) for t in range(3)]
    assert prompts == [encode(p.text) for p in expected]
    assert len({p.key for p in expected}) == 3


@pytest.mark.parametrize("kv_cache", [True, False])
def test_passkey_decodes_with_a_cache_or_from_the_whole_prefix(kv_cache: bool):
    """kv_cache=False is eval_retrieval.py's decoding: every answer token from a forward over the
    whole prefix, with no cache asked for (a Hugging Face model builds one unless told not to)."""
    calls = []

    class Recorder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.dummy = torch.nn.Parameter(torch.zeros(()))

        def forward(self, input_ids, past_key_values=None, use_cache=None, **kwargs):
            calls.append((input_ids.shape[1], past_key_values is not None, use_cache))
            logits = torch.zeros(*input_ids.shape, 300)
            logits[:, -1, 7] = 1.0
            return type("Out", (), {"logits": logits, "past_key_values": input_ids if use_cache else None})()

    encode = lambda text: [3 + (ord(ch) % 250) for ch in text]  # noqa: E731
    prompt = passkey_prompt(300, 0, "official")
    _, n = passkey_trial(Recorder(), encode, prompt, bos_id=1, kv_cache=kv_cache)
    steps = len(encode(" " + str(prompt.key)))
    if kv_cache:
        assert calls == [(n, False, True)] + [(1, True, True)] * (steps - 1)
    else:
        assert calls == [(n + i, False, False) for i in range(steps)]
