"""A small byte-level BPE trained on the local corpus: the right vocabulary for CPU-scale models.

Digits are split one per token, as Llama's tokenizer does, so a number is as many tokens as it
has digits (passkeys, verse numbers). Ids 0, 1, 2 are ``<pad>``, ``<s>`` (BOS) and ``</s>``
(EOS); ``encode`` never adds them, and encodes their literal text ("<s>" in a regex) as text.
Built on Hugging Face ``tokenizers`` (trains ~10 MB in seconds);
:meth:`BPETokenizer.to_transformers` gives the ``PreTrainedTokenizerFast`` that the Hugging Face
side (``save_pretrained`` next to a model) expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS = "<pad>", "<s>", "</s>"
SPECIAL_TOKENS = [PAD, BOS, EOS]


class BPETokenizer:
    """encode(text) -> ids and decode(ids) -> text, with the special ids as attributes."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        tokenizer.encode_special_tokens = True  # a literal "<s>" in a document is text, not BOS
        self.tokenizer = tokenizer
        ids = [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS]
        if ids != [0, 1, 2]:
            raise ValueError(f"expected {SPECIAL_TOKENS} at ids 0, 1, 2, found {ids}")
        self.pad_id, self.bos_id, self.eos_id = ids

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tokenizer.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def save(self, path: str | Path) -> None:
        self.tokenizer.save(str(path))

    @classmethod
    def load(cls, path: str | Path) -> "BPETokenizer":
        if not Path(path).is_file():
            raise FileNotFoundError(f"tokenizer file {path} not found")
        return cls(Tokenizer.from_file(str(path)))

    def to_transformers(self) -> Any:
        """The same vocabulary as a ``transformers.PreTrainedTokenizerFast``."""
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_object=self.tokenizer, pad_token=PAD, bos_token=BOS,
                                       eos_token=EOS, unk_token=None,
                                       split_special_tokens=True)  # literal "<s>" is text, as in encode()


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """Train a byte-level BPE of ``vocab_size`` tokens (specials included) on ``texts``."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} must be >= {256 + len(SPECIAL_TOKENS)} "
                         "(256 bytes + the special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)


@dataclass(frozen=True)
class TextTokenizer:
    """What evaluation needs from any tokenizer: text -> ids (no special tokens) and the BOS id."""

    encode: Callable[[str], list[int]]
    bos_id: int | None
    source: str


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """Our BPE (a ``tokenizer.json`` file) or a Hugging Face tokenizer directory (Llama's)."""
    path = Path(path)
    if path.is_file():
        bpe = BPETokenizer.load(path)
        return TextTokenizer(bpe.encode, bpe.bos_id, str(path))
    if path.is_dir():
        from transformers import AutoTokenizer

        hf = AutoTokenizer.from_pretrained(str(path))
        return TextTokenizer(lambda text: hf(text, add_special_tokens=False)["input_ids"],
                             hf.bos_token_id, str(path))
    raise FileNotFoundError(
        f"tokenizer {path} not found: give a tokenizer.json of our BPE (built under data_dir by "
        "prepare_text_data) or a Hugging Face tokenizer directory (e.g. the Llama-2 model directory)"
    )
