"""The CLL Transformer (paper Eq. 3) as a specification: central path, LSL isolation, grouped
dispatch, residual removal, variants."""
import pytest
import torch

from cll_scale.model.config import PRESETS, ModelConfig
from cll_scale.model.model import (CLLTransformer, LangGroups, label_smoothed_loss, label_smoothed_loss_graph,
                                   projected_loss, projected_loss_graph, target_positions)

LANGS = ["en", "de", "fr", "cs"]          # en is central: de, fr, cs get LSLs


def make(variant="fcll", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(**{**PRESETS["tiny"], **kw}, vocab_size=60, languages=LANGS, central_language="en",
                      variant=variant, dropout=0.0, cll_dropout=0.0)
    return CLLTransformer(cfg).eval()


def batch(b=6, s=7, t=5, seed=1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, 60, (b, s), generator=g)
    tgt = torch.randint(4, 60, (b, t), generator=g)
    src[0, -2:] = 0      # some padding
    return src, tgt


def test_variants_resolve_to_the_papers_layouts():
    base = ModelConfig(**PRESETS["base"], languages=LANGS, central_language="en", variant="baseline")
    assert base.cll_layers == [] and base.residual_sublayer is None
    sd = ModelConfig(**PRESETS["base"], languages=LANGS, central_language="en", variant="sd")
    assert sd.cll_layers == [3] and sd.residual_sublayer == "ffn" and sd.residual_layer == 3   # layer N/2+1
    fcll = ModelConfig(**PRESETS["base"], languages=LANGS, central_language="en", variant="fcll")
    assert fcll.cll_layers == list(range(6)) and fcll.lsl_languages == ["de", "fr", "cs"]
    res = ModelConfig(**PRESETS["base"], languages=LANGS, variant="residual", residual_sublayer="self_attn")
    assert res.residual_sublayer == "self_attn" and res.lsl_languages == LANGS   # non-centered
    custom = ModelConfig(**PRESETS["base"], languages=LANGS, variant="custom", cll_layers=[0, 5])
    assert custom.cll_layers == [0, 5]
    with pytest.raises(ValueError, match="outside"):
        ModelConfig(**PRESETS["base"], languages=LANGS, variant="custom", cll_layers=[6])


def test_t_starts_at_0_1_per_layer_and_language():
    model = make()
    assert model.t_weights() == {x: pytest.approx([0.1, 0.1]) for x in ["de", "fr", "cs"]}


def _baseline_twin(fcll: CLLTransformer) -> CLLTransformer:
    """A Baseline model holding the FCLL model's shared weights (FFN, attention, embeddings)."""
    base = make("baseline")
    state = {k.replace(".ffn.ffn.", ".ffn."): v for k, v in fcll.state_dict().items() if not k.startswith("lsl.")}
    base.load_state_dict(state, strict=True)
    return base


def test_central_language_path_is_the_plain_ffn():
    fcll = make()
    base = _baseline_twin(fcll)
    src, tgt = batch()
    en = torch.zeros(len(src), dtype=torch.long)          # every target is the central language
    de = torch.ones(len(src), dtype=torch.long)
    prev = fcll.shift_right(tgt)
    with torch.no_grad():
        assert torch.equal(fcll(src, prev, en), base(src, prev, en))
        assert not torch.allclose(fcll(src, prev, de), base(src, prev, de))
        # switching the LSLs off (paper Table 10 ablation) gives the shared path for any language
        enc, mask = fcll.encode(src)
        off = fcll.decode(prev, enc, mask, de, use_lsl=False)
        assert torch.equal(off, base(src, prev, de))


def test_lsl_of_a_language_only_affects_sentences_with_that_target():
    model = make()
    src, tgt = batch()
    tgt_lang = torch.tensor([1, 2, 0, 1, 3, 2])               # de fr en de cs fr
    logits = model(src, model.shift_right(tgt), tgt_lang)
    de_params = [model.lsl[0]]                                # every layer's LSL and t of de
    for row in range(len(src)):
        grads = torch.autograd.grad(logits[row].sum(), de_params, retain_graph=True, allow_unused=True)
        touched = any(g is not None and g.abs().sum() > 0 for g in grads)
        assert touched == (tgt_lang[row].item() == 1), f"row {row}"


def test_grouped_dispatch_equals_one_sentence_at_a_time():
    model = make()
    src, tgt = batch(b=8)
    tgt_lang = torch.tensor([3, 1, 0, 2, 1, 3, 0, 2])
    prev = model.shift_right(tgt)
    groups = model.lang_groups(tgt_lang)
    assert groups.order is not None and [g[0] for g in groups.groups] == [-1, 0, 1, 2]
    with torch.no_grad():
        together = model(src, prev, tgt_lang)
        for i in range(len(src)):
            keep = src[i] != 0
            alone = model(src[i:i + 1, keep], prev[i:i + 1], tgt_lang[i:i + 1])
            torch.testing.assert_close(together[i:i + 1], alone, rtol=1e-5, atol=1e-5)


def test_lang_groups_sort_once_and_skip_sorted_batches():
    g = LangGroups.from_slots(torch.tensor([2, 2, 2]))
    assert g.groups == [(2, 0, 3)] and g.order is None
    g = LangGroups.from_slots(torch.tensor([-1, 0, 0, 1]))
    assert g.groups == [(-1, 0, 1), (0, 1, 3), (1, 3, 4)] and g.order is None
    g = LangGroups.from_slots(torch.tensor([1, -1, 1, 0]))
    assert g.groups == [(-1, 0, 1), (0, 1, 2), (1, 2, 4)]
    assert g.order.tolist() == [1, 3, 0, 2] and g.inverse.tolist() == [2, 0, 3, 1]


@pytest.mark.parametrize("sublayer", ["ffn", "self_attn"])
@pytest.mark.parametrize("pre_norm", [True, False])
def test_residual_removal_removes_exactly_one_residual(sublayer, pre_norm):
    model = make("residual", residual_sublayer=sublayer, pre_norm=pre_norm, encoder_layers=3)
    assert [layer.drop_residual for layer in model.encoder] == [None, sublayer, None]
    x = torch.randn(2, 5, 32)
    mask = torch.ones(2, 1, 1, 5, dtype=torch.bool)
    for i, layer in enumerate(model.encoder):
        attn = lambda h: layer.self_attn(h, mask=mask)   # noqa: E731
        keep_attn = layer.drop_residual != "self_attn"
        keep_ffn = layer.drop_residual != "ffn"
        if pre_norm:
            h = (x if keep_attn else 0) + attn(layer.norm1(x))
            want = (h if keep_ffn else 0) + layer.ffn(layer.norm2(h))
        else:
            h = layer.norm1((x if keep_attn else 0) + attn(x))
            want = layer.norm2((h if keep_ffn else 0) + layer.ffn(h))
        torch.testing.assert_close(layer(x, mask), want)
        assert (keep_attn and keep_ffn) == (i != 1)


def test_sd_has_cll_only_in_the_middle_decoder_layer():
    model = make("sd", decoder_layers=4, encoder_layers=4)
    assert [layer.cll for layer in model.decoder] == [False, False, True, False]
    assert model.encoder[2].drop_residual == "ffn"


def test_non_centered_models_give_every_language_an_lsl():
    torch.manual_seed(0)
    cfg = ModelConfig(**PRESETS["tiny"], vocab_size=60, languages=["de", "fr", "cs"], central_language=None)
    model = CLLTransformer(cfg)
    assert model.lang_slot.tolist() == [0, 1, 2] and len(model.lsl) == 3


def test_label_smoothed_loss_matches_torch():
    logits = torch.randn(3, 4, 11)
    target = torch.randint(1, 11, (3, 4))
    target[0, 2:] = 0
    loss, nll = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1)
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0,
                                            label_smoothing=0.1, reduction="sum")
    ref_nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=0,
                                                reduction="sum")
    torch.testing.assert_close(loss, ref)
    torch.testing.assert_close(nll, ref_nll)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_blocked_loss_gives_the_plain_ops_loss_and_gradient(dtype, monkeypatch):
    """The loss in blocks of rows (never the whole fp32 log-probabilities), from logits and from
    features through the tied projection (never the logits themselves), equals the plain-ops form
    in value, NLL and the gradients of every input, for blocks that do and do not divide the rows;
    pad rows get no gradient."""
    from cll_scale.model.model import _BlockedCrossEntropy
    torch.manual_seed(0)
    features = torch.randn(5, 7, 16).to(dtype)
    weight = (torch.randn(300, 16) * 0.7).to(dtype)
    target = torch.randint(1, 300, (5, 7))
    target[1, 4:] = 0
    results = {}
    for form, plain, blocked in (("logits", label_smoothed_loss_graph, label_smoothed_loss),
                                 ("features", projected_loss_graph, projected_loss)):
        for name, fn, block in (("plain", plain, None), ("one", blocked, 1 << 21), ("rows of 4", blocked, 4 * 300)):
            if block:
                monkeypatch.setattr(_BlockedCrossEntropy, "BLOCK_CPU", block)
                monkeypatch.setattr(_BlockedCrossEntropy, "MIN_ROWS", 1)
            h, w = features.clone().requires_grad_(), weight.clone().requires_grad_()
            inputs = (torch.nn.functional.linear(h, w).detach().requires_grad_(),) if form == "logits" else (h, w)
            loss, nll = fn(*inputs, target, 0, 0.1)
            (0.5 * loss).backward()
            assert all(x.grad.dtype == dtype for x in inputs) and not nll.requires_grad
            results[form, name] = (loss.detach(), nll, *(x.grad.float() for x in inputs))
    for (form, name), got in results.items():
        ref = results[form, "plain"]
        torch.testing.assert_close(got[0], ref[0], msg=f"{form} {name}")
        torch.testing.assert_close(got[1], ref[1], msg=f"{form} {name}")
        for grad, want in zip(got[2:], ref[2:]):
            # bf16 gradients: roundings of the same fp32 values, so within about one bf16 step of
            # them (the weight's per block, summed in fp32)
            torch.testing.assert_close(grad, want, atol=1e-5 if dtype == torch.float32 else 4e-3, rtol=1e-2,
                                       msg=f"{form} {name}")
        assert got[2].view(5, 7, -1)[1, 4:].abs().sum() == 0 and got[2].view(5, 7, -1)[0].abs().sum() > 0


def test_the_loss_of_the_non_pad_positions_alone_is_the_batch_loss():
    """The trainer and the validator take the loss of the non-pad target positions only
    (:func:`target_positions`): the same loss, NLL and gradients as over the whole padded batch,
    the kept positions in row order, and a batch without pad passed through as it is."""
    torch.manual_seed(0)
    features = torch.randn(4, 6, 16)
    weight = torch.randn(300, 16) * 0.7
    target = torch.randint(1, 300, (4, 6))
    target[0, 3:] = 0
    target[2, 1:] = 0
    ntokens = int((target != 0).sum())
    results = []
    for select in (False, True):
        h, w = features.clone().requires_grad_(), weight.clone().requires_grad_()
        x, t = target_positions(h, target, 0, ntokens) if select else (h, target)
        if select:
            assert x.shape == (ntokens, 16) and torch.equal(t, target[target != 0])
            torch.testing.assert_close(x, features[target != 0])
        loss, nll = projected_loss(x, w, t, 0, 0.1)
        loss.backward()
        results.append((loss.detach(), nll, h.grad, w.grad))
    for got, want in zip(*results):
        torch.testing.assert_close(got, want)
    full = torch.randint(1, 300, (2, 3))
    x, t = target_positions(features[:2, :3], full, 0, full.numel())
    assert torch.equal(t, full.reshape(-1)) and torch.equal(x, features[:2, :3].reshape(-1, 16))


def test_the_projected_loss_without_grad_computes_no_gradient_and_says_so():
    """Validation takes the loss under torch.no_grad(): no gradient work is done then (the forward
    would otherwise compute the gradients it carries), and a backward through such a loss fails
    with a clear message instead of a wrong gradient."""
    h, w = torch.randn(6, 8, requires_grad=True), torch.randn(50, 8, requires_grad=True)
    target = torch.randint(1, 50, (6,))
    with torch.no_grad():
        quiet, _ = projected_loss(h, w, target, 0, 0.1)
    loud, _ = projected_loss(h, w, target, 0, 0.1)
    torch.testing.assert_close(quiet, loud.detach())
    assert not quiet.requires_grad
    loss, _ = projected_loss(h.detach(), w.detach(), target, 0, 0.1)
    assert not loss.requires_grad


@pytest.mark.integration
def test_model_module_imports_no_deepspeed():
    import subprocess
    import sys
    code = ("import sys; sys.modules['deepspeed'] = None\n"
            "import cll_scale.model.model, cll_scale.model.export, cll_scale.data.stream\nprint('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr


def test_dropout_rate_scale_and_determinism():
    from cll_scale.model.model import dropout
    x = torch.ones(400, 500)
    torch.manual_seed(3)
    y = dropout(x, 0.1, True)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - 0.1) < 0.005
    # one 64-bit draw serves four neighbours: each position of the four drops at the rate, and
    # independently of the others (the top field has one random bit less: it must not bias it)
    quads = (dropout(torch.ones(1000, 400), 0.5, True) == 0).view(-1, 4).float()
    assert ((quads.mean(0) - 0.5).abs() < 0.01).all(), quads.mean(0)
    assert abs((quads[:, 0] * quads[:, 3]).mean().item() - 0.25) < 0.01
    assert abs((quads[:, 1] * quads[:, 2]).mean().item() - 0.25) < 0.01
    assert torch.allclose(y[y != 0], torch.full_like(y[y != 0], 1 / 0.9))
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.1, True), y)          # seeded: resumable
    assert dropout(x, 0.1, False) is x and dropout(x, 0.0, True) is x
    assert (dropout(torch.ones(3), 0.5, True) >= 0).all()  # odd sizes fall back to F.dropout


def test_each_language_keeps_its_lsls_in_one_parameter_and_old_exports_still_load():
    """One Parameter per non-central language (its LSL and t of every CLL layer): the engine sees
    one tensor per language, not five per language and layer. Exports written with the earlier
    per-layer layout (decoder.{i}.ffn.{w1,b1,w2,b2,t}.{slot}) load into the same model."""
    model = make()
    names = [n for n, _ in model.named_parameters() if n.startswith("lsl.")]
    assert names == ["lsl.0", "lsl.1", "lsl.2"]
    old = {k: v for k, v in model.state_dict().items() if not k.startswith("lsl.")}
    for slot in range(3):
        for layer, views in zip(model.cfg.cll_layers, model.lsl_views(slot)):
            for name, view in zip(("w1", "b1", "w2", "b2", "t"), views):
                old[f"decoder.{layer}.ffn.{name}.{slot}"] = view.detach().clone()
    other = make(seed=5)
    assert not torch.equal(other.lsl[0], model.lsl[0])
    other.load_state_dict(old, strict=True)
    src, tgt = batch()
    lang = torch.tensor([1, 2, 3, 1, 2, 3])
    with torch.no_grad():
        assert torch.equal(other(src, other.shift_right(tgt), lang), model(src, model.shift_right(tgt), lang))


def test_paper_preset_follows_the_authors_fairseq_model():
    """`paper`: 5+5 post-norm layers, LSL 512 -> 1024 -> 512, and fairseq's init — Xavier-uniform
    weights inside their bounds (q and each half of the fused k/v at gain 1/√2), zero biases."""
    torch.manual_seed(0)
    cfg = ModelConfig(**PRESETS["paper"], vocab_size=300, languages=["en", "de", "fr"], central_language="en")
    model = CLLTransformer(cfg)
    assert len(model.encoder) == len(model.decoder) == 5 and not cfg.pre_norm
    assert isinstance(model.enc_norm, torch.nn.Identity)
    w1, _, w2, _, _ = model.lsl_views(0)[0]
    assert w1.shape == (1024, 512) and w2.shape == (512, 1024)
    attn, ffn = model.encoder[0].self_attn, model.decoder[2].ffn.ffn
    bound = lambda w, gain=1.0: gain * (6 / sum(w.shape)) ** 0.5   # noqa: E731
    for w, gain in [(attn.q.weight, 2 ** -0.5), (attn.kv.weight[:512], 2 ** -0.5), (attn.kv.weight[512:], 2 ** -0.5),
                    (attn.out.weight, 1.0), (ffn.fc1.weight, 1.0)]:
        # inside the bound, and filling it (a torch default init of fc1 stays below 0.03 here)
        assert 0.9 * bound(w, gain) < w.abs().max().item() <= bound(w, gain) * (1 + 1e-6)   # float32 rounding
    assert all(b.abs().max() == 0 for b in (attn.q.bias, attn.kv.bias, ffn.fc1.bias, ffn.fc2.bias))
    torch_init = CLLTransformer(ModelConfig(**{**PRESETS["paper"], "init": "torch"}, vocab_size=300,
                                            languages=["en", "de"], central_language="en"))
    assert torch_init.encoder[0].self_attn.q.bias.abs().max() > 0
    with pytest.raises(ValueError, match="model.init"):
        ModelConfig(init="kaiming")


def test_compiled_blocks_trace_once_for_every_batch_shape_and_language():
    """compile_blocks: one graph per compiled block kind (encoder layer, self- and cross-attention,
    FFN, LSL) and one for the loss, whatever the batch shape or target language; forward and
    gradients equal eager ones under `aot_eager` (traced graphs, no code generation)."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    cfg = ModelConfig(**PRESETS["tiny"], vocab_size=100, languages=["en", "de", "fr", "cs"], central_language="en")
    eager, compiled = CLLTransformer(cfg), CLLTransformer(cfg)
    compiled.load_state_dict(eager.state_dict())
    compiled.compile_blocks("aot_eager")
    loss_fn = torch.compile(projected_loss_graph, backend="aot_eager", dynamic=True)
    for i, (b, s, t, lang) in enumerate([(4, 7, 9, 1), (6, 11, 5, 2), (3, 13, 8, 0), (8, 5, 6, 3), (5, 9, 12, 1)]):
        src, tgt = torch.randint(4, 100, (b, s)), torch.randint(4, 100, (b, t))
        results = []
        for model, fn in ((eager, projected_loss), (compiled, loss_fn)):
            torch.manual_seed(i)                      # the same dropout draws
            features = model(src, model.shift_right(tgt), torch.full((b,), lang), lang_runs=((lang, b),),
                             features_only=True)
            loss, _ = fn(features, model.embed.weight, tgt, 0, 0.1)
            model.zero_grad()
            loss.backward()
            results.append((loss.detach(), model.embed.weight.grad.clone(), model.lsl[0].grad))
        (l0, g0, lsl0), (l1, g1, lsl1) = results
        assert torch.allclose(l0, l1) and torch.allclose(g0, g1, atol=1e-6)
        assert (lsl0 is None) == (lsl1 is None) and (lsl0 is None or torch.allclose(lsl0, lsl1, atol=1e-6))
    assert counters["stats"]["unique_graphs"] == 6, dict(counters["stats"])
    assert counters["frames"]["ok"] == 6, dict(counters["frames"])


@pytest.mark.parametrize("pre_norm", [True, False])
def test_lsl_path_gets_its_own_dropout_once_as_the_authors_do(pre_norm):
    """Issue 34: the FFN output gets `dropout`, the LSL output `cll_dropout`, each once, before the
    sum. With `cll_dropout` 0 and the FFN silenced, the LSL path must then pass through a training
    forward untouched; the old rule (`double`) dropped it again with the layer's `dropout`."""
    h = torch.randn(3, 5, 32)
    results = {}
    for rule in ("authors", "double"):
        torch.manual_seed(0)
        cfg = ModelConfig(**PRESETS["tiny"], vocab_size=60, languages=LANGS, central_language="en", variant="fcll",
                          dropout=0.5, cll_dropout=0.0, lsl_dropout=rule, pre_norm=pre_norm)
        model = CLLTransformer(cfg)
        layer = model.decoder[0]
        torch.nn.init.zeros_(layer.ffn.ffn.fc2.weight)      # FFN(h) = 0: the sublayer is t · LSL(h) alone
        torch.nn.init.zeros_(layer.ffn.ffn.fc2.bias)
        groups = model.lang_groups(torch.full((3,), 1), ((1, 3),))
        ffn = lambda x: layer.ffn(x, groups)                 # noqa: E731
        layer.eval()
        expected = layer._sublayer(h, ffn, layer.norm3, layer.ffn_dropout)
        layer.train()
        results[rule] = torch.allclose(layer._sublayer(h, ffn, layer.norm3, layer.ffn_dropout), expected)
    assert results == {"authors": True, "double": False}
    # And the FFN path still gets `dropout` once under the authors' rule: half its elements zeroed.
    torch.manual_seed(0)
    cfg = ModelConfig(**PRESETS["tiny"], vocab_size=60, languages=LANGS, central_language="en", variant="fcll",
                      dropout=0.5, cll_dropout=0.0)
    layer = CLLTransformer(cfg).decoder[0].train()
    out = layer.ffn(h, None)             # the central language: FFN alone
    assert 0.4 < float((out == 0).float().mean()) < 0.6


def test_records_without_the_rule_read_as_the_rule_that_trained_them():
    cfg = ModelConfig(**PRESETS["tiny"], vocab_size=60, languages=LANGS, central_language="en")
    assert cfg.lsl_dropout == "authors"                       # the default since issue 34
    old = {k: v for k, v in cfg.to_json().items() if k != "lsl_dropout"}
    assert ModelConfig.from_json(old).lsl_dropout == "double"  # exports and configs written before it
    with pytest.raises(ValueError, match="lsl_dropout must be one of"):
        ModelConfig(**PRESETS["tiny"], languages=LANGS, lsl_dropout="once")


def test_host_language_runs_route_like_the_device_sort():
    model = make()
    src, tgt = batch()
    tgt_lang = torch.tensor([0, 0, 1, 2, 2, 3])
    by_device = model(src, model.shift_right(tgt), tgt_lang)
    by_host = model(src, model.shift_right(tgt), tgt_lang, lang_runs=((0, 2), (1, 1), (2, 2), (3, 1)))
    assert torch.equal(by_device, by_host)
    groups = model.lang_groups(tgt_lang, ((0, 2), (1, 1), (2, 2), (3, 1)))
    assert groups.order is None and [g[0] for g in groups.groups] == [-1, 0, 1, 2]
    shuffled = torch.tensor([3, 0, 1, 0, 2, 2])              # runs out of LSL order: sorted on the device
    runs = ((3, 1), (0, 1), (1, 1), (0, 1), (2, 2))
    assert model.lang_groups(shuffled, runs).order is not None
    assert torch.equal(model(src, model.shift_right(tgt), shuffled, lang_runs=runs),
                       model(src, model.shift_right(tgt), shuffled))


def test_the_names_that_extend_edits_are_the_models_own():
    """cll-extend grows a trained model by name (the tied embedding, one LSL Parameter per
    language): the names the model publishes are the ones its state holds."""
    cfg = ModelConfig(**{**PRESETS["tiny"], "vocab_size": 64, "languages": ["en", "de", "fr"], "central_language": "en",
                         "variant": "fcll"})
    names = dict(CLLTransformer(cfg).named_parameters())
    assert CLLTransformer.EMBEDDING in names
    assert [CLLTransformer.lsl_name(i) for i in range(len(cfg.lsl_languages))] == [n for n in names if n.startswith("lsl.")]


def test_a_bf16_training_pass_on_a_cpu_attends_with_the_math_kernel_and_the_same_numbers():
    """Issue 54: on a CPU in bf16 the flash kernel's backward was a quarter of the step; training
    there takes the math kernel. Inference, fp32 and other devices keep PyTorch's choice. The
    output and gradients are fp32's up to bf16 rounding."""
    import copy

    from cll_scale.model.model import Attention, attention_kernel
    math_kernel = type(torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH))
    q = torch.zeros(2, 4, 5, 16, dtype=torch.bfloat16)
    assert isinstance(attention_kernel(q), math_kernel)
    with torch.no_grad():
        assert not isinstance(attention_kernel(q), math_kernel)
    assert not isinstance(attention_kernel(q.float()), math_kernel)
    torch.manual_seed(0)
    attn = Attention(64, 4, 0.0, cross=False)
    x = torch.randn(3, 7, 64, requires_grad=True)
    ref = attn(x, causal=True)
    ref.square().sum().backward()
    x16 = x.detach().to(torch.bfloat16).requires_grad_()
    out = copy.deepcopy(attn).to(torch.bfloat16)(x16, causal=True)
    out.float().square().sum().backward()
    assert torch.allclose(out.float(), ref.detach(), atol=3e-2, rtol=3e-2)
    assert torch.allclose(x16.grad.float(), x.grad, atol=5e-2, rtol=5e-2)


def test_a_mixed_batch_trains_as_its_languages_would_apart():
    """Issue 54 runs a mixed batch's LSL element-wise work once over all its LSL rows. In training
    (dropout off, so the paths compare exactly) the loss and every gradient, the LSLs' and t_l's
    included, must equal the sum over the batch's one-language parts."""
    model = make().train()                                   # fcll: an LSL in every decoder layer
    src, tgt = batch()
    tgt_lang = torch.tensor([0, 0, 1, 2, 2, 3])              # en (central), de, fr ×2, cs
    runs = ((0, 2), (1, 1), (2, 2), (3, 1))

    def loss_and_grads(parts):
        model.zero_grad()
        total = 0.0
        for rows, lang_runs in parts:
            logits = model(src[rows], model.shift_right(tgt[rows]), tgt_lang[rows], lang_runs=lang_runs)
            loss, _ = label_smoothed_loss(logits, tgt[rows], 0, 0.1)
            total = total + loss
        total.backward()
        return total.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    whole, whole_grads = loss_and_grads([(slice(0, 6), runs)])
    start, parts = 0, []
    for lang, n in runs:
        parts.append((slice(start, start + n), ((lang, n),)))
        start += n
    apart, apart_grads = loss_and_grads(parts)
    assert torch.allclose(whole, apart, atol=1e-5)
    assert whole_grads.keys() == apart_grads.keys() and any(n.startswith("lsl") for n in whole_grads)
    for name, grad in whole_grads.items():
        assert torch.allclose(grad, apart_grads[name], atol=1e-5), name
