"""How far TAPE's E moves from its RoPE table (issue 15, claim C2): if E barely moves, a trained
TAPE model is a RoPE model and its machinery was not used.

Per layer l, on given inputs: ``move_l = ||E_l - E_0|| / ||E_0||`` (Frobenius norms over the
batch), E_0 being the RoPE table every layer starts from and E_l the E that layer l rotates q/k
with; and the share each update adds at layer l, ``||ΔE_attn|| / ||E_in||`` and
``||ΔE_mlp|| / ||E_in||``. Measured by wrapping the layers' hooks for one forward call.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import Tensor, nn

from tape.pe.tape import TAPELayer


def _rel(delta: Tensor, base: Tensor) -> float:
    return float(delta.double().norm() / base.double().norm().clamp_min(1e-30))


@contextlib.contextmanager
def _recording(layers: list[TAPELayer], record: dict[str, list[float]]) -> Iterator[None]:
    """Wrap each layer's after_mlp (where TAPE applies both E updates, every layer calls it) on
    the instance, then restore."""
    seen_e: list[Tensor] = []

    def wrap(layer: TAPELayer) -> None:
        after_mlp = layer.after_mlp

        def after_mlp_(state, mlp_out):  # noqa: ANN001, ANN202 - same signature as the hook
            seen_e.append(state.rot.detach())  # the E this layer rotated q and k with
            mid = layer.attention_updated(state)  # E after the attention update, before the mix
            new = after_mlp(state, mlp_out)
            record["attn"].append(_rel(mid - state.rot, state.rot))
            record["mlp"].append(_rel(new.rot - mid, mid))
            return new

        layer.after_mlp = after_mlp_

    for layer in layers:
        wrap(layer)
    try:
        yield
    finally:
        for layer in layers:  # drop the instance attributes: the class methods show again
            layer.__dict__.pop("after_mlp", None)
        if seen_e:
            e0 = seen_e[0]
            record["move"] = [_rel(e - e0, e0) for e in seen_e]


@torch.no_grad()
def e_movement(model: nn.Module, input_ids: Tensor) -> dict[str, float]:
    """Flat metrics for one forward call of ``model`` (our Decoder with pe=tape) on ``input_ids``
    (B, N): ``e_move_layer{l}`` for every layer l >= 1, ``e_move_last`` (the last layer's),
    ``e_update_attn_mean`` and ``e_update_mlp_mean`` (mean over the layers that update E).
    Empty for a model without TAPE layers."""
    layers = [m for m in model.modules() if isinstance(m, TAPELayer)]
    if not layers:
        return {}
    record: dict[str, list[float]] = {"attn": [], "mlp": [], "move": []}
    was_training = model.training
    model.eval()
    try:
        with _recording(layers, record):
            model(input_ids=input_ids)
    finally:
        model.train(was_training)
    out = {f"e_move_layer{l}": v for l, v in enumerate(record["move"]) if l > 0}
    out["e_move_last"] = record["move"][-1]
    n_updates = len(layers) - 1  # the last layer's E is never read, so it has no update maps
    out["e_update_attn_mean"] = sum(record["attn"][:n_updates]) / max(1, n_updates)
    out["e_update_mlp_mean"] = sum(record["mlp"][:n_updates]) / max(1, n_updates)
    return out
