"""Policy loss: hand-computed values for every term, masks, and micro-batch accumulation."""

from __future__ import annotations

import doctest
import math

import pytest
import torch

from arl.algo import loss as loss_mod
from arl.algo.loss import entropy_from_logits, loss_normalizers, policy_loss, token_logprobs

LN2 = math.log(2.0)


def test_docstring_examples():
    failures, tried = doctest.testmod(loss_mod)
    assert tried > 0 and failures == 0


def _ones_mask(b: int, n: int) -> torch.Tensor:
    return torch.ones(b, n)


# ------------------------------------------------------------------------------ log-prob helpers


def test_token_logprobs_alignment_and_temperature():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 7)
    ids = torch.randint(0, 7, (2, 5))
    for temp in (1.0, 0.7):
        got = token_logprobs(logits, ids, temperature=temp)
        ref = torch.log_softmax(logits / temp, dim=-1)
        assert got.shape == (2, 5)
        assert torch.all(got[:, 0] == 0)
        for b in range(2):
            for i in range(1, 5):  # position i: logits of i-1 scoring token i
                assert got[b, i].item() == pytest.approx(ref[b, i - 1, ids[b, i]].item(), abs=1e-6)


def test_token_logprobs_upcasts_bf16():
    logits = torch.randn(1, 4, 9).to(torch.bfloat16)
    assert token_logprobs(logits, torch.zeros(1, 4, dtype=torch.long)).dtype == torch.float32


def test_entropy_from_logits_matches_categorical():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6)
    got = entropy_from_logits(logits, temperature=0.5)
    p = torch.softmax(logits[:, :-1] / 0.5, dim=-1)
    want = -(p * p.log()).sum(dim=-1)
    torch.testing.assert_close(got[:, 1:], want)
    assert torch.all(got[:, 0] == 0)


# ----------------------------------------------------------------------------------- pg and clip


def test_ratio_one_is_plain_policy_gradient():
    logp = torch.full((2, 3), -1.3, requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss, m = policy_loss(logp, logp.detach(), adv, mask)
    assert loss.item() == pytest.approx(-(1 + 1 - 2) / 3)
    loss.backward()
    # d/dlogp of -A*exp(logp - old) at ratio 1 is -A, divided by the 3 response tokens
    torch.testing.assert_close(logp.grad, torch.tensor([[0.0, -1 / 3, -1 / 3], [0.0, 2 / 3, 0.0]]))
    assert m["ratio_mean"] == pytest.approx(1.0) and m["ratio_max"] == pytest.approx(1.0)
    assert m["clip_frac"] == 0.0 and m["approx_kl"] == pytest.approx(0.0)


def test_advantages_per_sample_equal_per_token():
    logp = torch.randn(2, 3)
    old = logp + 0.3 * torch.randn(2, 3)
    mask = _ones_mask(2, 3)
    a1, _ = policy_loss(logp, old, torch.tensor([0.5, -1.0]), mask)
    a2, _ = policy_loss(logp, old, torch.tensor([[0.5] * 3, [-1.0] * 3]), mask)
    torch.testing.assert_close(a1, a2)


def _four_cases(**kw):
    # ratios 1.5, 0.5, 0.5, 1.5 with A = +1, +1, -1, -1
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[1.5, 0.5, 0.5, 1.5]])).requires_grad_(True)
    adv = torch.tensor([[1.0, 1.0, -1.0, -1.0]])
    loss, m = policy_loss(logp, old, adv, _ones_mask(1, 4), **kw)
    loss.backward()
    return loss.item(), logp.grad, m


def test_ppo_clip_by_hand():
    loss, grad, m = _four_cases()
    # per token: -min(r*A, clip(r)*A) = -1.2 (clipped), -0.5, 0.8 (clipped), 1.5
    assert loss == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)
    assert m["clip_frac"] == pytest.approx(0.5)
    # clipped tokens get no gradient; unclipped: d(-A r)/dlogp = -A r
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.5 / 4, 0.0, 1.5 / 4]]))


def test_ppo_clip_asymmetric_eps():
    loss, _, m = _four_cases(clip_eps_low=0.2, clip_eps_high=0.28)
    assert loss == pytest.approx((-1.28 - 0.5 + 0.8 + 1.5) / 4)
    loss, _, _ = _four_cases(clip_eps_low=0.6, clip_eps_high=0.28)  # 0.5 now inside [0.4, 1.28]
    assert loss == pytest.approx((-1.28 - 0.5 + 0.5 + 1.5) / 4)


def test_dual_clip():
    old = torch.zeros(1, 3)
    logp = torch.log(torch.tensor([[5.0, 5.0, 2.0]])).requires_grad_(True)
    adv = torch.tensor([[-1.0, 1.0, -1.0]])
    plain, m0 = policy_loss(logp, old, adv, _ones_mask(1, 3))
    assert plain.item() == pytest.approx((5.0 - 1.2 + 2.0) / 3)
    dual, m = policy_loss(logp, old, adv, _ones_mask(1, 3), dual_clip=3.0)
    # A < 0, ratio 5: min(5, 3) = 3; A > 0 untouched; ratio 2 < 3 untouched
    assert dual.item() == pytest.approx((3.0 - 1.2 + 2.0) / 3)
    assert m["dual_clip_frac"] == pytest.approx(1 / 3) and "dual_clip_frac" not in m0  # measured or absent
    dual.backward()
    assert logp.grad[0, 0] == 0.0  # capped: constant in logp


# ----------------------------------------------------------------------------------- aggregation


def test_aggregations_by_hand_with_garbage_padding():
    nan, inf = float("nan"), float("inf")
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, nan, nan], [nan, nan, nan]])
    logp = torch.tensor([[0.0, 0.0, 0.0], [0.0, -inf, -inf], [-inf, -inf, -inf]], requires_grad=True)
    old = torch.tensor([[0.0, 0.0, 0.0], [0.0, nan, 0.0], [nan, 0.0, 0.0]])
    tok, _ = policy_loss(logp, old, adv, mask)
    assert tok.item() == pytest.approx(-(1 + 2 + 3 + 4) / 4)
    seq, _ = policy_loss(logp, old, adv, mask, agg="seq-mean-token-mean")
    assert seq.item() == pytest.approx(-(2 + 4) / 2)  # the empty sequence does not count
    seq.backward()
    assert torch.isfinite(logp.grad).all()
    torch.testing.assert_close(logp.grad[0], torch.tensor([-1 / 6, -2 / 6, -3 / 6]))
    assert logp.grad[1, 0] == pytest.approx(-4 / 2)


def test_all_zero_mask_gives_finite_zero():
    logp = torch.full((2, 3), -float("inf"), requires_grad=True)
    entropy = torch.randn(2, 3, requires_grad=True)
    for agg in ("token-mean", "seq-mean-token-mean"):
        loss, m = policy_loss(
            logp,
            torch.zeros(2, 3),
            torch.tensor([1.0, -1.0]),
            torch.zeros(2, 3),
            agg=agg,
            ref_logprobs=torch.zeros(2, 3),
            kl_coef=0.1,
            entropy=entropy,
            entropy_coef=0.01,
            engine_logprobs=torch.zeros(2, 3),
            is_cap=3.0,
            dual_clip=3.0,
        )
        assert loss.item() == 0.0
        loss.backward()
        assert torch.all(logp.grad == 0) and torch.all(entropy.grad == 0)
        assert all(math.isfinite(v) for v in m.values())
        assert m["num_tokens"] == 0.0


# ----------------------------------------------------------------------------- KL and entropy


def test_kl_k3_by_hand():
    logp = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[LN2, -1.0]])
    k3 = [2.0 - LN2 - 1.0, math.exp(-1.0) + 1.0 - 1.0]  # e^d - d - 1, d = ref - logp
    loss, m = policy_loss(
        logp, logp.detach(), torch.zeros(1), _ones_mask(1, 2), ref_logprobs=ref, kl_coef=0.5
    )
    assert m["kl"] == pytest.approx(sum(k3) / 2)
    assert loss.item() == pytest.approx(0.5 * sum(k3) / 2)
    loss.backward()
    # d/dlogp (e^d - d - 1) = 1 - e^d: pulls logp up towards a higher ref, down towards a lower one
    torch.testing.assert_close(logp.grad, 0.5 / 2 * torch.tensor([[1 - 2.0, 1 - math.exp(-1.0)]]))
    # kl_coef 0 logs the KL without adding it
    loss0, m0 = policy_loss(logp, logp.detach(), torch.zeros(1), _ones_mask(1, 2), ref_logprobs=ref)
    assert loss0.item() == 0.0 and m0["kl"] == pytest.approx(m["kl"])


def test_entropy_bonus():
    ent = torch.tensor([[1.0, 3.0, 100.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    lp = torch.zeros(1, 3)
    loss, m = policy_loss(lp, lp, torch.zeros(1), mask, entropy=ent, entropy_coef=0.01)
    assert loss.item() == pytest.approx(-0.01 * 2.0)
    assert m["entropy"] == pytest.approx(2.0)
    loss.backward()
    torch.testing.assert_close(ent.grad, torch.tensor([[-0.005, -0.005, 0.0]]))


# -------------------------------------------------------------------------- importance sampling


def test_truncated_is_token_level():
    logp = torch.zeros(1, 3, requires_grad=True)
    engine = torch.tensor([[-LN2, -math.log(10.0), LN2]], requires_grad=True)  # w = 2, 10 -> 3, 0.5
    loss, m = policy_loss(
        logp, logp.detach(), torch.ones(1), _ones_mask(1, 3), engine_logprobs=engine, is_cap=3.0
    )
    assert loss.item() == pytest.approx(-(2.0 + 3.0 + 0.5) / 3)
    assert m["is_weight_mean"] == pytest.approx(5.5 / 3)
    assert m["logprob_gap"] == pytest.approx((LN2 + math.log(10.0) + LN2) / 3)
    loss.backward()
    torch.testing.assert_close(logp.grad, -torch.tensor([[2.0, 3.0, 0.5]]) / 3)  # weights are constants
    assert engine.grad is None


def test_truncated_is_sequence_level():
    logp = torch.zeros(2, 2)
    engine = torch.tensor([[-LN2, -LN2], [LN2, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    # sequence weights: exp(2 ln2) = 4 -> capped 3; exp(-ln2) = 0.5 (the masked 0.0 is ignored)
    loss, m = policy_loss(
        logp, logp, torch.ones(2), mask, engine_logprobs=engine, is_cap=3.0, is_level="sequence"
    )
    assert loss.item() == pytest.approx(-(3.0 + 3.0 + 0.5) / 3)
    assert m["is_weight_mean"] == pytest.approx(6.5 / 3)


def test_engine_logprobs_without_cap_only_log_the_gap():
    logp = torch.zeros(1, 2)
    engine = torch.tensor([[-0.5, 0.25]])
    loss, m = policy_loss(logp, logp, torch.ones(1), _ones_mask(1, 2), engine_logprobs=engine)
    assert loss.item() == pytest.approx(-1.0)
    assert m["logprob_gap"] == pytest.approx(0.375) and "is_weight_mean" not in m  # no weight applied: absent
    inf_cap, _ = policy_loss(
        logp, logp, torch.ones(1), _ones_mask(1, 2), engine_logprobs=engine, is_cap=math.inf
    )
    assert inf_cap.item() == pytest.approx(-(math.exp(0.5) + math.exp(-0.25)) / 2)


def test_validation():
    lp, mask = torch.zeros(2, 3), torch.ones(2, 3)
    a = torch.zeros(2)
    with pytest.raises(ValueError, match="agg"):
        policy_loss(lp, lp, a, mask, agg="sum")
    with pytest.raises(ValueError, match="is_level"):
        policy_loss(lp, lp, a, mask, is_level="batch")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, lp, torch.zeros(3), mask)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, torch.zeros(2, 4), a, mask)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, lp, a, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(lp, lp, a, mask, entropy_coef=0.1)
    with pytest.raises(ValueError, match="is_cap"):
        policy_loss(lp, lp, a, mask, is_cap=3.0)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(lp, lp, a, mask, dual_clip=1.0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=0.0)


# ------------------------------------------------------------ micro-batch x gradient accumulation


class _TinyLM(torch.nn.Module):
    """Embedding + Linear: enough to have real logits and parameter gradients."""

    def __init__(self, vocab: int = 13, dim: int = 8):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, dim)
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.emb(ids)))


def _batch():
    g = torch.Generator().manual_seed(0)
    b, n, vocab = 6, 7, 13
    ids = torch.randint(0, vocab, (b, n), generator=g)
    # response tokens of very different counts per sequence, and one sequence with none
    lengths = [5, 1, 3, 0, 6, 2]
    mask = torch.zeros(b, n)
    for i, k in enumerate(lengths):
        mask[i, n - k :] = 1.0
    with torch.no_grad():
        base = token_logprobs(_TinyLM()(ids), ids)  # a different (untrained) policy: ratios != 1
    old = base + 0.3 * torch.randn(b, n, generator=g)
    return dict(
        ids=ids,
        mask=mask,
        old=old,
        ref=base + 0.2 * torch.randn(b, n, generator=g),
        engine=old + 0.2 * torch.randn(b, n, generator=g),
        adv=torch.randn(b, generator=g),
    )


def _grads(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("is_level", ["token", "sequence"])
def test_microbatch_accumulation_equals_full_batch(agg, is_level):
    data = _batch()
    kw = dict(
        agg=agg,
        kl_coef=0.05,
        entropy_coef=0.01,
        is_cap=2.0,
        is_level=is_level,
        clip_eps_high=0.28,
        dual_clip=1.5,  # low so some tokens hit it with this data
    )

    def loss_on(model, rows, **norm):
        ids = data["ids"][rows]
        logits = model(ids)
        return policy_loss(
            token_logprobs(logits, ids),
            data["old"][rows],
            data["adv"][rows],
            data["mask"][rows],
            ref_logprobs=data["ref"][rows],
            entropy=entropy_from_logits(logits),
            engine_logprobs=data["engine"][rows],
            **kw,
            **norm,
        )

    torch.manual_seed(1)
    model = _TinyLM()
    full, metrics = loss_on(model, slice(0, 6))
    # the data exercises every branch: clipping, dual-clip and capped IS weights
    assert metrics["clip_frac"] > 0 and metrics["dual_clip_frac"] > 0 and metrics["is_weight_mean"] != 1.0
    full.backward()
    want = _grads(model)

    model.zero_grad()
    norm = loss_normalizers(data["mask"])
    assert norm == {"num_tokens_global": 17, "num_seqs_global": 5}
    total = 0.0
    for rows in (slice(0, 2), slice(2, 5), slice(5, 6)):  # uneven micro-batches
        part, _ = loss_on(model, rows, **norm)
        part.backward()  # accumulate, no extra scaling
        total += part.item()
    assert total == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
    for got, exp in zip(_grads(model), want, strict=True):
        torch.testing.assert_close(got, exp, rtol=1e-5, atol=1e-7)

    # without the global normalisers, averaging micro-batch losses is not the full-batch loss
    naive = sum(loss_on(model, r)[0].item() for r in (slice(0, 2), slice(2, 5), slice(5, 6))) / 3
    assert naive != pytest.approx(full.item(), rel=1e-3)
