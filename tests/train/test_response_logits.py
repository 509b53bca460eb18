"""The update asks the model for the logits of response-predicting positions only: same log-probs,
entropies and gradients as computing every position's logits and masking them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from arl.algo import entropy_from_logits, predicting_positions, token_logprobs
from arl.train.update import response_logits, rows_of, sequence_logprobs


@pytest.fixture(scope="module")
def model(tiny_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32)


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    """Three right-padded rows: a step-mode row (prompt, then one response), a traj-mode row (two
    responses with an observation between), and a row whose prompt is longer than the others'."""
    g = torch.Generator().manual_seed(1)
    width = 14
    lengths = [9, 12, 14]
    spans = [[(6, 9)], [(3, 5), (8, 12)], [(11, 14)]]
    ids = torch.randint(3, vocab, (3, width), generator=g)
    attention = torch.zeros(3, width, dtype=torch.long)
    response = torch.zeros(3, width)
    for r, (n, rs) in enumerate(zip(lengths, spans, strict=True)):
        attention[r, :n] = 1
        ids[r, n:] = 0
        for a, b in rs:
            response[r, a:b] = 1
    position = (attention.cumsum(1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": attention, "position_ids": position,
            "response_mask": response, "logprobs": torch.zeros(3, width)}


def test_predicting_positions_cover_every_response_token():
    mask = _batch(50)["response_mask"]
    keep = predicting_positions(mask)
    assert keep.tolist() == [2, 3, 5, 6, 7, 8, 9, 10, 11, 12]  # 0, 1, 4 and 13 predict no response token
    assert predicting_positions(torch.zeros(2, 5)).numel() == 0


def test_kept_logits_give_the_full_logits_values_and_gradients(model):
    rows = rows_of(_batch(model.config.vocab_size), np.arange(3), torch.device("cpu"))
    mask = rows["response_mask"]

    def masked(kept: bool):
        model.zero_grad(set_to_none=True)
        if kept:
            keep = predicting_positions(mask)
            logits = response_logits(model, rows, keep)
            assert logits.shape[1] == keep.numel() < rows["input_ids"].shape[1]
            logp = token_logprobs(logits, rows["input_ids"], 0.7, positions=keep)
            ent = entropy_from_logits(logits, 0.7, positions=keep, length=logp.shape[1])
        else:
            logits = model(input_ids=rows["input_ids"], attention_mask=rows["attention_mask"],
                           position_ids=rows["position_ids"]).logits
            logp = token_logprobs(logits, rows["input_ids"], 0.7)
            ent = entropy_from_logits(logits, 0.7)
        ((logp + 0.1 * ent) * mask).sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return (logp * mask).detach(), (ent * mask).detach(), grads

    full_lp, full_ent, full_grads = masked(kept=False)
    kept_lp, kept_ent, kept_grads = masked(kept=True)
    torch.testing.assert_close(kept_lp, full_lp, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(kept_ent, full_ent, atol=1e-5, rtol=1e-5)
    assert full_grads.keys() == kept_grads.keys() and full_grads
    for name in full_grads:
        torch.testing.assert_close(kept_grads[name], full_grads[name], atol=1e-5, rtol=1e-4, msg=name)
    assert kept_lp[mask.bool()].lt(0).all()  # real log-probs at every response token


def test_sequence_logprobs_are_the_response_tokens_log_probs(model):
    batch = _batch(model.config.vocab_size)
    with torch.no_grad():
        got = sequence_logprobs(model, batch, range(3), 1.0, micro_batch_size=2)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    want = token_logprobs(logits, batch["input_ids"])
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(got[mask], want[mask], atol=1e-5, rtol=1e-5)


def test_kept_positions_are_validated():
    ids = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="predict"):
        token_logprobs(torch.zeros(1, 1, 5), ids, positions=torch.tensor([3]))  # the last token predicts nothing
    with pytest.raises(ValueError, match="positions"):
        token_logprobs(torch.zeros(1, 2, 5), ids, positions=torch.tensor([1]))
    with pytest.raises(ValueError, match="length"):
        entropy_from_logits(torch.zeros(1, 1, 5), positions=torch.tensor([1]))
