"""What every task's labels share: the value the loss skips."""

IGNORE_INDEX = -100  # label value the loss skips (prompt and padding); torch's cross_entropy default
