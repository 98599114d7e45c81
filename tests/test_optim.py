"""The optimizer of every training command as a specification, in plain PyTorch: a step whose
gradients or loss are not finite changes nothing (weights, both moments, the step count), clipping
bounds the gradients by their global norm exactly as ``clip_grad_norm_`` does, and the optimizer
and schedule state round trip to the identical next step. One process, no process group (world
size 1: no all-reduce)."""
import io
import math

import pytest
import torch

from cll_scale.training.optim import GuardedAdamW, OptimConfig

ADAMW = dict(lr=0.1, betas=(0.9, 0.98), eps=1e-8, weight_decay=0.01)


def new_params(seed: int = 0) -> list[torch.nn.Parameter]:
    """A weight matrix and a bias: two tensors, so that "global norm" means across tensors."""
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(3, 4, generator=g)), torch.nn.Parameter(torch.randn(3, generator=g))]


def give_grads(params, seed: int, scale: float = 1.0, poison: float | None = None) -> None:
    """Gradients drawn from ``seed`` times ``scale``; ``poison`` replaces one element of the bias's."""
    g = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=g) * scale
    if poison is not None:
        params[1].grad[0] = poison


def values(params) -> list[torch.Tensor]:
    return [p.detach().clone() for p in params]


def moments(opt) -> list[dict[str, torch.Tensor]]:
    """Per parameter: AdamW's step count and both moments."""
    return [{k: v.clone() for k, v in opt.state[p].items()} for group in opt.param_groups for p in group["params"]]


def equal(a: list, b: list) -> bool:
    if len(a) != len(b):
        return False
    if a and isinstance(a[0], dict):
        return all(x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x) for x, y in zip(a, b))
    return all(torch.equal(x, y) for x, y in zip(a, b))


def global_norm(params) -> float:
    return math.sqrt(sum(float(p.grad.double().square().sum()) for p in params))


# -- a step that is not finite is skipped ---------------------------------------------------------

@pytest.mark.parametrize("poison", [float("nan"), float("inf"), float("-inf")])
def test_a_step_with_a_non_finite_gradient_changes_nothing(poison):
    params = new_params()
    opt = GuardedAdamW(params, clip_norm=1.0, **ADAMW)
    give_grads(params, seed=1)
    opt.step()
    assert bool(opt.last_ok)
    before, state = values(params), moments(opt)
    give_grads(params, seed=2, poison=poison)
    opt.step()
    assert equal(values(params), before) and equal(moments(opt), state)
    assert all(float(s["step"]) == 1 for s in moments(opt))           # the skipped step is not counted
    assert not bool(opt.last_ok) and not torch.isfinite(opt.grad_norm)
    assert opt.steps_called == 2          # calls, skipped or not: the trainer counts skips from last_ok


def test_a_non_finite_loss_skips_a_step_whose_gradients_are_finite():
    """The trainer sets loss_ok when a microbatch's loss was not finite on this rank; the gradients
    may still be finite (the loss was masked), and the step must still change nothing."""
    params = new_params()
    opt = GuardedAdamW(params, clip_norm=1.0, **ADAMW)
    give_grads(params, seed=1)
    opt.loss_ok = torch.tensor(False)
    opt.step()
    assert equal(values(params), new_params()) and all(float(s["step"]) == 0 for s in moments(opt))
    assert not bool(opt.last_ok) and torch.isfinite(opt.grad_norm)
    opt.loss_ok = torch.tensor(True)
    opt.step()
    assert bool(opt.last_ok) and not equal(values(params), new_params())


def test_skipped_steps_leave_no_trace_in_the_steps_after_them():
    """Skipped first and in the middle: the run afterwards is bit for bit the run that never met
    those steps (AdamW's bias correction counts only the steps taken)."""
    skipping, clean = new_params(), new_params()
    a, b = GuardedAdamW(skipping, clip_norm=1.0, **ADAMW), GuardedAdamW(clean, clip_norm=1.0, **ADAMW)
    for seed, poison in ((9, float("nan")), (1, None), (8, float("inf")), (2, None), (3, None)):
        give_grads(skipping, seed, poison=poison)
        a.step()
        if poison is None:
            give_grads(clean, seed)
            b.step()
    assert equal(values(skipping), values(clean)) and equal(moments(a), moments(b))
    assert a.steps_called == 5 and b.steps_called == 3


# -- clipping --------------------------------------------------------------------------------------

SCALES = (0.1, 10.0, 1000.0, 0.05)        # global gradient norms about 0.4, 40, 4000, 0.2


def test_gradients_are_clipped_to_their_global_norm_before_the_update():
    """clip_norm=1: a step's gradients with a global norm above 1 are scaled, all tensors by one
    factor, to norm 1 (those below are left alone); grad_norm reports the norm before clipping; and
    the weights follow exactly what AdamW does after torch.nn.utils.clip_grad_norm_(params, 1)."""
    guarded, reference, unclipped = new_params(), new_params(), new_params()
    opt = GuardedAdamW(guarded, clip_norm=1.0, **ADAMW)
    ref = torch.optim.AdamW(reference, fused=True, **ADAMW)
    raw = torch.optim.AdamW(unclipped, fused=True, **ADAMW)
    for seed, scale in enumerate(SCALES):
        give_grads(guarded, seed, scale)
        norm = global_norm(guarded)
        opt.step()
        assert float(opt.grad_norm) == pytest.approx(norm, rel=1e-6)
        assert global_norm(guarded) == pytest.approx(min(norm, 1.0), rel=1e-5)
        give_grads(reference, seed, scale)
        torch.nn.utils.clip_grad_norm_(reference, 1.0)
        ref.step()
        give_grads(unclipped, seed, scale)
        raw.step()
    torch.testing.assert_close(values(guarded), values(reference), rtol=1e-6, atol=1e-7)
    diff = max(float((a - b).abs().max()) for a, b in zip(values(guarded), values(unclipped)))
    assert diff > 1e-3, "clipping made no difference: the test would not see it missing"


def test_clip_norm_zero_leaves_the_gradients_alone():
    guarded, plain = new_params(), new_params()
    opt, ref = GuardedAdamW(guarded, clip_norm=0.0, **ADAMW), torch.optim.AdamW(plain, fused=True, **ADAMW)
    for seed, scale in enumerate(SCALES):
        give_grads(guarded, seed, scale)
        give_grads(plain, seed, scale)
        opt.step()
        ref.step()
        assert global_norm(guarded) == pytest.approx(global_norm(plain))
    assert equal(values(guarded), values(plain))


# -- state round trip and schedule ------------------------------------------------------------------

def test_optimizer_and_schedule_state_round_trip_to_the_identical_next_step():
    """What a checkpoint keeps of the optimizer (state_dict through torch.save) and of the schedule
    gives, in a new optimizer over the restored weights, the very step the original takes next."""
    cfg = OptimConfig(lr=1e-2, warmup_steps=3, clip_norm=1.0)

    def build(params):
        opt = GuardedAdamW(params, clip_norm=cfg.clip_norm, **cfg.adamw_kwargs())
        return opt, cfg.scheduler(opt)
    params = new_params()
    opt, sched = build(params)
    for seed in range(4):
        give_grads(params, seed, scale=3.0)
        opt.step()
        sched.step()
    buffer = io.BytesIO()
    torch.save({"weights": values(params), "optim": opt.state_dict(), "sched": sched.state_dict()}, buffer)
    give_grads(params, 4, scale=3.0)
    opt.step()
    sched.step()
    buffer.seek(0)
    saved = torch.load(buffer)
    restored = new_params(seed=1)
    with torch.no_grad():
        for p, w in zip(restored, saved["weights"]):
            p.copy_(w)
    opt2, sched2 = build(restored)
    opt2.load_state_dict(saved["optim"])
    sched2.load_state_dict(saved["sched"])
    give_grads(restored, 4, scale=3.0)
    opt2.step()
    sched2.step()
    assert equal(values(restored), values(params)) and equal(moments(opt2), moments(opt))
    assert sched2.get_last_lr() == sched.get_last_lr()
    # Weights alone are not enough: a new optimizer (no moments, step count 0) steps elsewhere.
    fresh = [torch.nn.Parameter(w.clone()) for w in saved["weights"]]
    opt3, _ = build(fresh)
    give_grads(fresh, 4, scale=3.0)
    opt3.step()
    assert not equal(values(fresh), values(params))


def test_the_schedule_warms_up_linearly_then_decays_as_one_over_sqrt_step():
    """Paper App. A: lr × min(step / warmup, sqrt(warmup / step)), step 0 counted as 1;
    schedule_offset continues a schedule as if that many steps were done."""
    def lrs(**kw):
        opt = GuardedAdamW(new_params(), **OptimConfig(lr=2.0, **kw).adamw_kwargs())
        sched, out = OptimConfig(lr=2.0, **kw).scheduler(opt), []
        for _ in range(9):
            out.append(sched.get_last_lr()[0])
            opt.step()
            sched.step()
        return out
    expected = [0.5, 0.5, 1.0, 1.5, 2.0, 2 * math.sqrt(4 / 5), 2 * math.sqrt(4 / 6), 2 * math.sqrt(4 / 7),
                2 * math.sqrt(4 / 8)]
    assert lrs(warmup_steps=4) == pytest.approx(expected)
    assert lrs(warmup_steps=4, schedule_offset=4) == pytest.approx(expected[4:] + [2 * math.sqrt(4 / s)
                                                                               for s in range(9, 13)])
