"""Asking a model for a sum: ``tape.data.addition.solve`` reverses the prompt into the trained
format, restricts decoding to an answer and reads the answer back in normal digit order; bad
input to the library's addition entry points fails with a clear message."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor, nn

from tape.data.addition import EOS, PLUS, TOKEN_ID, VOCAB_SIZE, decode, encode
from tape.metrics.arithmetic import solve
from tape.metrics.arithmetic import evaluate_grid
from tape.model import DecoderLM, ModelConfig


@dataclass
class Out:
    logits: Tensor  # (B, N, V)
    past_key_values: Tensor | None


class ReversedSumLM(nn.Module):
    """Reads a reversed prompt ("21+43=" is 12 + 34) and writes the reversed sum, then EOS, like a
    perfectly trained model. ``distract`` puts an even larger logit on '+', which a decoder that
    does not restrict itself to an answer would emit."""

    def __init__(self, distract: bool = False, vocab: int = VOCAB_SIZE) -> None:
        super().__init__()
        self.dummy = nn.Parameter(torch.zeros(1))
        self.distract, self.vocab = distract, vocab

    def forward(self, input_ids: Tensor, past_key_values: Tensor | None = None, use_cache: bool = False,
                **_: object) -> Out:
        seq = input_ids if past_key_values is None else torch.cat([past_key_values, input_ids], 1)
        logits = torch.zeros(seq.shape[0], input_ids.shape[1], self.vocab)
        for row, ids in enumerate(seq.tolist()):
            text = decode(ids)
            prompt, _, written = text.partition("=")
            a, b = prompt.split("+")
            target = encode(str(int(a[::-1]) + int(b[::-1]))[::-1]) + [EOS]
            logits[row, -1, target[min(len(written), len(target) - 1)]] = 10.0
            if self.distract:
                logits[row, -1, PLUS] = 20.0
        return Out(logits, seq if use_cache else None)


@settings(max_examples=60, deadline=None)
@given(a=st.integers(0, 10**12), b=st.integers(0, 10**12), distract=st.booleans())
def test_solve_returns_the_models_answer_in_normal_digit_order(a: int, b: int, distract: bool) -> None:
    assert solve(ReversedSumLM(distract), f"{a}+{b}=") == str(a + b)


def test_solve_reverses_the_prompt_and_the_answer() -> None:
    # 12 + 34: the model sees "21+43=" and writes "64"; forgetting either reversal gives 64 or 37.
    assert solve(ReversedSumLM(), "12+34=") == "46"
    assert solve(ReversedSumLM(), "905+7=") == "912"  # a carry into a longer answer


def test_solve_with_an_untrained_model_returns_a_number() -> None:
    torch.manual_seed(0)
    model = DecoderLM(ModelConfig(vocab_size=VOCAB_SIZE, n_layers=2, d_model=32, n_heads=4,
                                  max_seq_len=32, pe="tape"))
    for prompt in ("1+2=", "12+34=", "99999+1="):
        answer = solve(model, prompt)
        longest = max(len(x) for x in prompt[:-1].split("+")) + 1
        assert answer.isdigit() and 1 <= len(answer) <= longest and answer.isascii()


def test_solve_rejects_bad_prompts_and_non_addition_models() -> None:
    with pytest.raises(ValueError, match="character 'a' at position 2"):
        solve(ReversedSumLM(), "12a+3=")
    with pytest.raises(ValueError, match="one '=' at the end"):
        solve(ReversedSumLM(), "12+3")
    with pytest.raises(ValueError, match="fewer than the addition vocabulary's 18"):
        solve(ReversedSumLM(vocab=10), "1+2=")


def test_evaluate_grid_rejects_an_empty_grid() -> None:
    model = ReversedSumLM()
    with pytest.raises(ValueError, match=r"max_digits=0.*>= 1"):
        evaluate_grid(model, 0, 4, seed=0)  # returned [] before
    with pytest.raises(ValueError, match=r"examples_per_cell=0"):
        evaluate_grid(model, 2, 0, seed=0)


def test_generate_names_the_vocabulary_for_an_out_of_range_id() -> None:
    model = DecoderLM(ModelConfig(vocab_size=VOCAB_SIZE, n_layers=1, d_model=16, n_heads=2,
                                  max_seq_len=16, pe="rope"))
    good = torch.tensor([[TOKEN_ID["1"], PLUS, TOKEN_ID["2"], TOKEN_ID["="]]])
    assert model.generate(good, max_new_tokens=2).shape == (1, 6)
    for bad in (VOCAB_SIZE, 99, -1):
        with pytest.raises(ValueError, match=rf"token id {bad}.*\[0, 18\) \(vocab_size=18\)"):
            model.generate(torch.tensor([[1, bad, 2]]), max_new_tokens=2)  # was a bare IndexError


def test_generate_checks_a_hugging_face_models_vocabulary_too() -> None:
    transformers = pytest.importorskip("transformers")
    from tape.model.generate import greedy_generate

    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    model = transformers.LlamaForCausalLM(cfg).eval()
    assert greedy_generate(model, torch.tensor([[1, 39]]), 2).shape == (1, 4)
    with pytest.raises(ValueError, match=r"token id 40.*\(vocab_size=40\)"):
        greedy_generate(model, torch.tensor([[1, 40]]), 2)
