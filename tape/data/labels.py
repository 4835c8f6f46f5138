"""What every task's labels and batches share: the value the loss skips, the padding id."""

IGNORE_INDEX = -100  # label value the loss skips (prompt and padding); torch's cross_entropy default
PAD_ID = 0  # the padding id of the addition and flip-flop vocabularies and of the BPE tokenizer
