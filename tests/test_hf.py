"""TAPE in Hugging Face Llama models and the context-extension recipes, on tiny random
configs built here (no download)."""

import copy

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("transformers")
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM  # noqa: E402

from tape.hf import TapeLlamaForCausalLM, add_tape, switch_off_maps  # noqa: E402
from tape.hf.recipes import apply_recipe, trainable_parameters  # noqa: E402
from tape.hf.io import enable_checkpointing  # noqa: E402
from tape.hf.s2attn import shifted_sparse_attention  # noqa: E402
from tape.model.generate import greedy_generate  # noqa: E402

ROPES = {
    "mha": (4, {"rope_type": "default", "rope_theta": 10000.0}),
    "gqa-pi": (2, {"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
    "mqa": (1, {"rope_type": "default", "rope_theta": 10000.0}),
}


def tiny_llama(kv: int = 4, rope: dict | None = None, layers: int = 3, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=kv, max_position_embeddings=32,
                      rope_parameters=rope or {"rope_type": "default", "rope_theta": 10000.0})
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(15)  # sharp attention: positions matter
    return model


def _randomize_tape(model, std: float = 0.1):
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".pe." in name:
                p.normal_(0, std)


@pytest.mark.parametrize("case", ROPES)
def test_add_tape_is_identity_at_init(case):
    kv, rope = ROPES[case]
    model = tiny_llama(kv, rope)
    ids = torch.randint(0, 50, (2, 30))
    with torch.no_grad():
        before = model(ids).logits
        tape_model = add_tape(model)
        after = tape_model(ids).logits
    assert isinstance(tape_model, TapeLlamaForCausalLM)
    assert (before - after).abs().max() <= 1e-5
    _randomize_tape(tape_model)
    with torch.no_grad():
        assert (tape_model(ids).logits - before).abs().max() > 1e-3  # TAPE's weights act


@pytest.mark.parametrize("case", ROPES)
@pytest.mark.parametrize("options", [{}, {"post_attn": "rowsum", "zero_init": "w2"}])
def test_switching_off_trained_maps_gives_back_the_llama(case, options):
    """Maps trained anywhere (every TAPE weight random), then switched off: the logits are the
    Llama's again, though W2 and the gate keep their trained values."""
    kv, rope = ROPES[case]
    model = tiny_llama(kv, rope)
    ids = torch.randint(0, 50, (2, 30))
    with torch.no_grad():
        before = model(ids).logits
        tape_model = add_tape(model, **options)
        _randomize_tape(tape_model)
        assert (tape_model(ids).logits - before).abs().max() > 1e-3
        assert switch_off_maps(tape_model) == 2  # every layer but the last updates E
        after = tape_model(ids).logits
    assert (after - before).abs().max() <= 1e-5
    assert any(p.abs().sum() > 0 for n, p in tape_model.named_parameters() if ".pe.w2" in n)  # not all zeroed
    with pytest.raises(TypeError, match="add_tape"):
        switch_off_maps(tiny_llama())


def _layer_e(model, ids):
    """E after every layer's update, (B, He, N, d) each, from forward hooks."""
    rots = []
    hooks = [layer.register_forward_hook(lambda _m, _a, out: rots.append(out[1])) for layer in model.model.layers]
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    return rots


@pytest.mark.parametrize("case", ["mha", "gqa-pi"])
def test_official_recipe_maps_only_rescale_the_rotary_table(case):
    """With the post-attention map at zero (the official recipe freezes it there), the PE-MLP
    mixes E's heads, which all start as the one rotary table: every layer's E is that table times
    a scalar per token and head, so its angles stay RoPE's. A trained post map mixes E across
    tokens (A·E) and moves them."""
    kv, rope = ROPES[case]
    ids = torch.randint(0, 50, (2, 30))
    for post_map_trained in (False, True):
        model = add_tape(tiny_llama(kv, rope), post_attn="rowsum")
        _randomize_tape(model, std=1.0)
        if not post_map_trained:
            with torch.no_grad():
                for layer in model.model.layers:
                    if layer.pe.post_attn is not None:
                        layer.pe.post_attn.weight.zero_()
        off = copy.deepcopy(model)
        switch_off_maps(off)
        table = _layer_e(off, ids)[0]  # (B, He, N, d): the rotary table, E of every layer there
        for e in _layer_e(model, ids)[:-1]:  # the last layer does not update E
            scale = (e * table).sum(-1, keepdim=True) / (table * table).sum(-1, keepdim=True)  # (B, He, N, 1)
            off_the_table = (e - scale * table).abs().max()
            assert (scale - 1).abs().max() > 1e-2  # the MLP acts
            assert (off_the_table > 1e-3) if post_map_trained else (off_the_table < 1e-5), off_the_table


@pytest.mark.parametrize("case", ["mha", "gqa-pi"])
@pytest.mark.parametrize("cast", ["to_bf16", "half"])
def test_casting_a_tape_model_keeps_its_rotary_frequencies_fp32(case, cast):
    kv, rope = ROPES[case]
    model = add_tape(tiny_llama(kv, rope))
    rotary = model.model.rotary_emb
    before = {name: buf.clone() for name, buf in rotary.named_buffers()}
    model = model.to(torch.bfloat16) if cast == "to_bf16" else model.half()
    low = torch.bfloat16 if cast == "to_bf16" else torch.float16
    assert model.model.embed_tokens.weight.dtype == low  # the weights did cast
    for name, buf in rotary.named_buffers():  # layer 0's E comes from these: never rounded
        assert buf.dtype == torch.float32 and torch.equal(buf, before[name]), name
    ids = torch.randint(0, 50, (1, 12))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits.float()).all()
    assert all(torch.equal(buf, before[n]) for n, buf in model.double().model.rotary_emb.named_buffers())


def test_add_tape_rejects_other_models_and_double_conversion():
    with pytest.raises(TypeError, match="LlamaForCausalLM"):
        add_tape(torch.nn.Linear(2, 2))
    model = add_tape(tiny_llama())
    with pytest.raises(ValueError, match="already"):
        add_tape(model)


def test_save_and_reload_round_trip(tmp_path):
    model = add_tape(tiny_llama(2), post_attn="rowsum", position_size=8)
    _randomize_tape(model)
    ids = torch.randint(0, 50, (2, 20))
    model.save_pretrained(tmp_path)
    reloaded = TapeLlamaForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.tape["post_attn"] == "rowsum" and reloaded.config.tape["position_size"] == 8
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


@pytest.mark.parametrize("case", ROPES)
def test_from_pretrained_on_a_plain_llama_dir_equals_the_llama(case, tmp_path):
    kv, rope = ROPES[case]
    plain = tiny_llama(kv, rope)
    plain.save_pretrained(tmp_path)
    ids = torch.randint(0, 50, (2, 24))
    model, info = TapeLlamaForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert any(".pe." in k for k in info["missing_keys"])  # TAPE's maps were not in the checkpoint
    model.eval()
    with torch.no_grad():
        # equal up to float rounding (E and the rotation run in float32 on their own path);
        # TAPE's maps left random would differ by orders of magnitude more
        torch.testing.assert_close(model(ids).logits, plain(ids).logits, atol=1e-5, rtol=0)
        for layer in model.model.layers[:-1]:
            assert not layer.pe.post_attn.weight.any() and not layer.pe.w1.weight.any()
            assert layer.pe.x_proj.weight.std() > 0.01  # the gate is drawn, as in add_tape
    assert isinstance(TapeLlamaForCausalLM.from_pretrained(tmp_path), TapeLlamaForCausalLM)


def test_saved_tape_model_loads_through_automodel(tmp_path):
    model = add_tape(tiny_llama(2), post_attn="rowsum", position_size=8)
    _randomize_tape(model)
    model.save_pretrained(tmp_path / "tape")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "tape").eval()
    assert type(reloaded) is TapeLlamaForCausalLM and reloaded.config.model_type == "tape_llama"
    assert reloaded.config.tape["post_attn"] == "rowsum" and reloaded.config.tape["position_size"] == 8
    ids = torch.randint(0, 50, (2, 20))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    tiny_llama(2).save_pretrained(tmp_path / "plain")  # a plain Llama stays a plain Llama
    assert type(AutoModelForCausalLM.from_pretrained(tmp_path / "plain")) is LlamaForCausalLM


def test_tape_model_saved_with_the_llama_model_type_still_loads(tmp_path):
    import json

    model = add_tape(tiny_llama(2))
    _randomize_tape(model)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["model_type"] = "llama"  # as models saved before TapeLlamaConfig existed
    (tmp_path / "config.json").write_text(json.dumps(config))
    reloaded = TapeLlamaForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 50, (2, 20))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)


def test_hf_generate_without_cache_works_and_with_cache_names_greedy_generate():
    model = add_tape(tiny_llama(2))
    _randomize_tape(model)
    prompt = torch.randint(0, 50, (1, 6))
    ours = greedy_generate(model, prompt, 5)
    hf = model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=False)
    assert hf.shape[1] > 6 and torch.equal(hf, ours[:, : hf.shape[1]])  # HF stops at EOS, if drawn
    with pytest.raises(TypeError, match="greedy_generate"):  # asking HF for a cache names ours
        model.generate(prompt, max_new_tokens=5, do_sample=False, use_cache=True)


@pytest.mark.parametrize("kv, dtype, atol", [(2, torch.float32, 1e-5), (4, torch.float64, 1e-12),
                                             (1, torch.float64, 1e-12)])
def test_tape_llama_cached_generation_matches_recomputation(kv, dtype, atol):
    """In a float64 model E is float64 too (it was float32: cached and recomputed logits differed
    by 8e-8 with 4 key/value heads)."""
    model = add_tape(tiny_llama(kv)).to(dtype)
    _randomize_tape(model)
    prompt = torch.randint(0, 50, (2, 6))
    a, la = greedy_generate(model, prompt, 8, return_logits=True)
    b, lb = greedy_generate(model, prompt, 8, use_cache=False, return_logits=True)
    assert torch.equal(a, b) and torch.allclose(la, lb, atol=atol, rtol=0)


@pytest.mark.parametrize("how", ["ours", "hf_reentrant"])
def test_activation_checkpointing_recomputes_layers_and_keeps_gradients(how):
    """Layers run once more in backward, whoever enables checkpointing: a TAPE layer that was
    HF's checkpointing layer was checkpointed twice in transformers 5.23, and failed in
    backward with the reentrant variant that HF and peft setups pass."""
    grads, calls, count = [], [], [0]
    for ckpt in (False, True):
        model = add_tape(tiny_llama(2))
        _randomize_tape(model)
        model.train()
        for layer in model.model.layers:  # a layer's q projection runs once per layer call
            layer.self_attn.q_proj.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        if ckpt and how == "ours":
            enable_checkpointing(model)  # transformers 5.17 (the GPU image) and 5.23
        elif ckpt:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
        count[0] = 0
        ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        calls.append(count[0])
    assert calls == [3, 6]  # each of the 3 layers runs again in the backward pass
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


# ----------------------------------------------------------------------------- recipes
C, H, HKV, I, V, L = 64, 4, 2, 16, 50, 3
EMB_NORM = V * C + (2 * L + 1) * C  # embed_tokens + every RMSNorm
TAPE_LAYER = C * I + HKV * I + I * HKV + HKV * H  # x_proj + w1 + w2 + post_attn (layers but the last)
LORA_LAYER = 8 * (C + H * 16) + 8 * (C + HKV * 16) * 2 + 8 * (H * 16 + C)  # q, k, v, o with r = 8


@pytest.mark.parametrize(
    "recipe, kwargs, expected",
    [
        ("tape", {}, (L - 1) * TAPE_LAYER + EMB_NORM),
        ("tape", {"train_post_attn": False}, (L - 1) * (TAPE_LAYER - HKV * H) + EMB_NORM),
        ("lora", {}, L * LORA_LAYER + EMB_NORM),
        ("longlora", {}, L * LORA_LAYER + EMB_NORM),
        ("theta", {}, L * LORA_LAYER + EMB_NORM),
        ("embed_norm", {}, EMB_NORM),
    ],
)
def test_recipe_trains_exactly_its_parameters(recipe, kwargs, expected):
    model = apply_recipe(tiny_llama(HKV), recipe, target_context=64, **kwargs)
    trained = trainable_parameters(model)
    assert sum(trained.values()) == expected
    for name in trained:
        assert any(k in name for k in (".pe.", "lora_", "embed", "norm")), name
        assert "lm_head" not in name
    if recipe == "tape" and not kwargs:
        assert any(".post_attn." in n for n in trained)
    if recipe == "tape" and kwargs:
        assert not any(".post_attn." in n for n in trained)


@pytest.mark.parametrize("recipe, theta", [("lora", 10000.0), ("theta", 1e6)])
def test_recipes_interpolate_positions_by_target_over_original(recipe, theta):
    model = apply_recipe(tiny_llama(), recipe, target_context=64)  # original 32 -> factor 2
    config = model.config
    assert config.rope_parameters["factor"] == 2.0 and config.rope_parameters["rope_theta"] == theta
    inv = model.base_model.model.model.rotary_emb.inv_freq
    expected = 1.0 / (theta ** (torch.arange(0, 16, 2).float() / 16)) / 2.0
    assert torch.allclose(inv, expected)


def test_embed_norm_control_interpolates_positions_and_keeps_the_base_function():
    """The control recipe changes only the rotary table (PI x2): at positions 0, 2, 4, ... it
    computes what the base does at 0, 1, 2, ..., and nothing else differs."""
    base = tiny_llama()
    model = apply_recipe(tiny_llama(), "embed_norm", target_context=64)
    assert type(model) is type(base) and model.config.rope_parameters["factor"] == 2.0
    inv = model.model.rotary_emb.inv_freq
    assert torch.allclose(inv, base.model.rotary_emb.inv_freq / 2.0)
    ids = torch.randint(0, 50, (1, 8))
    with torch.no_grad():
        assert not torch.allclose(model(ids).logits, base(ids).logits, atol=1e-4)
        torch.testing.assert_close(model(ids, position_ids=2 * torch.arange(8)[None]).logits, base(ids).logits,
                                   atol=1e-5, rtol=1e-5)


def test_recipes_compose_with_a_linear_base_and_refuse_other_scalings():
    """A base already interpolating linearly extends by the product of the factors; a llama3 or
    yarn base would lose its own scaling to the recipe's linear one, so it is refused."""
    model = apply_recipe(tiny_llama(rope={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
                         "lora", target_context=64)  # max_position_embeddings 32 -> factor 2, times 2
    assert model.config.rope_parameters["factor"] == 4.0
    inv = model.base_model.model.model.rotary_emb.inv_freq
    assert torch.allclose(inv, 1.0 / (500.0 ** (torch.arange(0, 16, 2).float() / 16)) / 4.0)
    llama3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
              "high_freq_factor": 4.0, "original_max_position_embeddings": 8}
    with pytest.raises(ValueError, match="rope_type='llama3'"):
        apply_recipe(tiny_llama(rope=llama3), "tape", target_context=64)
    kept = apply_recipe(tiny_llama(rope=llama3), "lora", target_context=32)  # no interpolation
    assert kept.config.rope_parameters["rope_type"] == "llama3"


def test_position_ids_of_one_row_serve_every_row_of_the_batch():
    """HF Llama accepts position_ids (1, N) for a batch; so does a TAPE Llama (E once per row)."""
    model = add_tape(tiny_llama(kv=2))
    _randomize_tape(model)
    ids = torch.randint(0, 50, (3, 12))
    with torch.no_grad():
        shared = model(ids, position_ids=torch.arange(5, 17)[None]).logits
        full = model(ids, position_ids=torch.arange(5, 17).expand(3, 12)).logits
    assert torch.equal(shared, full)
    with pytest.raises(ValueError, match=r"position_ids has shape \(2, 12\)"):
        model(ids, position_ids=torch.arange(12).expand(2, 12))


def test_unknown_recipe_lists_the_choices():
    with pytest.raises(ValueError, match="longlora"):
        apply_recipe(tiny_llama(), "yarn", target_context=64)


def test_longlora_uses_s2attn_in_training_and_full_attention_in_eval():
    ids = torch.randint(0, 50, (2, 32))
    lora = apply_recipe(tiny_llama(HKV), "lora", target_context=64)
    longlora = apply_recipe(tiny_llama(HKV), "longlora", target_context=64)
    with torch.no_grad():
        assert torch.allclose(lora.eval()(input_ids=ids).logits, longlora.eval()(input_ids=ids).logits, atol=1e-5)
        diff = (lora.train()(input_ids=ids).logits - longlora.train()(input_ids=ids).logits).abs().max()
    assert diff > 1e-3


# ----------------------------------------------------------------------------- S²-Attn
def _s2_reference(q, k, v, n_groups):
    """Per-head masks written out: plain heads attend within [j*g, (j+1)*g); shifted heads
    within [j*g - g/2, (j+1)*g - g/2) (the head and tail of the sequence are separate groups)."""
    b, h, n, d = q.shape
    g = n // n_groups
    i = torch.arange(n)
    causal = i[None, :] <= i[:, None]
    plain = causal & ((i[:, None] // g) == (i[None, :] // g))
    shifted = causal & (((i[:, None] + g // 2) // g) == ((i[None, :] + g // 2) // g))
    mask = torch.stack([plain] * (h // 2) + [shifted] * (h - h // 2))[None]  # (1, H, N, N)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


@pytest.mark.parametrize("n_groups, heads", [(2, 4), (4, 4), (4, 5), (8, 3)])
def test_s2attn_matches_written_out_masks(n_groups, heads, monkeypatch):
    """Values and gradients of the written-out masks, for HF's token-major q, k, v; every SDPA
    call takes 4-D inputs without a mask (what CUDA's flash kernels need)."""
    q, k, v = (torch.randn(2, 16, heads, 8, dtype=torch.float64).transpose(1, 2).requires_grad_()
               for _ in range(3))
    sdpa, calls = F.scaled_dot_product_attention, []

    def spy(*args, **kwargs):
        calls.append((args[0].dim(), kwargs.get("attn_mask"), kwargs.get("is_causal")))
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    out = shifted_sparse_attention(q, k, v, n_groups)
    monkeypatch.undo()
    assert calls and all(c == (4, None, True) for c in calls)
    expected = _s2_reference(q, k, v, n_groups)
    assert torch.allclose(out, expected, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    want = torch.autograd.grad(expected, (q, k, v), grad)
    assert all(torch.allclose(a, b, atol=1e-12) for a, b in zip(got, want))


def test_s2attn_with_one_group_is_full_causal_attention():
    q, k, v = (torch.randn(2, 4, 16, 8, dtype=torch.float64) for _ in range(3))
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.allclose(shifted_sparse_attention(q, k, v, 1), full, atol=1e-12)


def test_s2attn_rejects_lengths_that_do_not_split():
    q = torch.randn(1, 4, 18, 8)
    with pytest.raises(ValueError, match="groups"):
        shifted_sparse_attention(q, q, q, 4)


def test_checkpointing_is_enabled_by_either_transformers_name() -> None:
    """transformers 5.17 (the GPU image) has only gradient_checkpointing_enable; 5.23 adds
    activation_checkpointing_enable: the helper takes whichever the model has."""
    called: list[str] = []

    class Old(torch.nn.Module):
        def gradient_checkpointing_enable(self) -> None:
            called.append("gradient")

    class New(Old):
        def activation_checkpointing_enable(self) -> None:
            called.append("activation")

    enable_checkpointing(Old())
    enable_checkpointing(New())
    assert called == ["gradient", "activation"]


def test_generate_with_default_settings_runs_uncached_and_equals_the_cached_decoder(tmp_path) -> None:
    """Issue 23: generate() with defaults raised (HF cannot build TAPE's cache); TAPE models now
    default to use_cache=False, and greedy output equals our cached greedy decoder's."""
    model = add_tape(tiny_llama(2)).eval()
    _randomize_tape(model)
    ids = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > 7 and torch.equal(out, greedy_generate(model, ids, 5)[:, : out.shape[1]])  # HF stops at EOS
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert torch.equal(again.generate(ids, max_new_tokens=5, do_sample=False), out)


def test_a_fresh_process_loads_a_saved_tape_model_after_one_import(tmp_path) -> None:
    """Hugging Face's AutoModel knows tape_llama once `import tape.hf` ran (documented in
    docs/experiments.md); without it transformers does not recognise the model type."""
    import subprocess
    import sys

    add_tape(tiny_llama(2)).save_pretrained(tmp_path)
    code = ("import sys, tape.hf; from transformers import AutoModelForCausalLM; "
            "m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); print(type(m).__name__)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("TapeLlamaForCausalLM"), out.stderr[-2000:]
