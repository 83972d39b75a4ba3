"""Per-row seeded sampling inside one batched `model.generate`: the Gumbel-max trick as a logits processor.

transformers samples a whole batch from torch's global RNG, so a row's tokens depend on which rows share its batch
and on everything else that drew from that RNG before. `SeededSampler` instead gives every row its own
`torch.Generator` (seeded by the request's seed; unseeded rows draw from the global RNG) and turns each step into
an argmax that `generate`'s greedy decoding (`do_sample=False`) takes:

    token = argmax_i (z_i + g_i),   z = logits / T with the top-p tail set to -inf,   g_i iid Gumbel(0, 1)

which is an exact draw from softmax(z), i.e. from softmax(logits / T) renormalised over the nucleus (the Gumbel-max
trick). Each row draws one vocabulary-sized vector of noise per step from its own generator, so its draws are the
same whatever its position in the batch, the batch's size or the other rows' seeds.

Temperature and top-p are applied here, not by transformers (which would do them after every custom processor), so
an engine passes the raw logits' processors first (e.g. `HFEngine`'s logprob recorder, which records
log_softmax(logits / T) of the unperturbed logits) and this one last.

Top-p keeps the smallest set of most likely tokens whose mass reaches `top_p` (at least one token), as
transformers' `TopPLogitsWarper` does; ties at the boundary are kept or cut by sort order.

Limits: the noise is reproducible, the logits only nearly: a different batch (left padding, batch size) sums the
same float products in another order (~1e-6 apart in float32, more in bfloat16), so a seeded row can still draw
a different token where two candidates' perturbed scores are that close. A seed's stream differs between device
types (a CPU and a CUDA generator), so reproducibility holds on one kind of device. Greedy (`temperature == 0`)
needs no sampler.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class SeededSampler:
    """A logits processor: scores -> temperature-scaled, top-p-truncated logits plus per-row Gumbel noise."""

    def __init__(
        self, seeds: Sequence[int | None], temperature: float, top_p: float, device: torch.device | str = "cpu"
    ) -> None:
        if temperature <= 0.0:
            raise ValueError("SeededSampler samples; greedy decoding (temperature 0) needs no sampler")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        self.temperature = temperature
        self.top_p = top_p
        self.device = torch.device(device)
        self.generators = [None if s is None else _generator(s, self.device) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise ValueError(f"the sampler was built for {len(self.generators)} rows, got {scores.shape[0]}")
        z = truncate_top_p(scores.float() / self.temperature, self.top_p)
        return z + self.gumbel(scores.shape[1], z.device)  # type: ignore[return-value]

    def gumbel(self, vocab: int, device: torch.device) -> torch.Tensor:
        """One row of Gumbel(0, 1) noise per generator, each from its own stream (the global RNG for None)."""
        rows = [torch.rand(vocab, generator=g, device=device, dtype=torch.float32) for g in self.generators]
        u = torch.stack(rows)
        # u = 0 gives -inf (that token cannot win); u < 1 always, so the inner log never reaches 0
        return -torch.log(-torch.log(u))


def truncate_top_p(z: torch.Tensor, top_p: float) -> torch.Tensor:
    """Logits (rows, vocab) with every token outside each row's top-p nucleus set to -inf."""
    if top_p >= 1.0:
        return z
    probs, order = torch.softmax(z, dim=-1).sort(dim=-1, descending=True)
    # a token is cut when the tokens more likely than it already hold top_p of the mass; the first never is
    cut_sorted = (probs.cumsum(dim=-1) - probs) >= top_p
    cut = torch.zeros_like(cut_sorted).scatter(-1, order, cut_sorted)
    return z.masked_fill(cut, float("-inf"))


def _generator(seed: int, device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
