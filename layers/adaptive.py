"""
Adaptive input and adaptive softmax (Baevski & Auli, 2019): the paper's WikiText-103 model (section 3.2.1,
cutoffs 20000 and 60000). The vocabulary, in order of frequency, is cut into bands; band i embeds in
h / factor^i dimensions and projects them to h, so that rare words cost few parameters. The softmax mirrors it,
with the same (tied) weights: the head scores the first band's words and one entry per other band,
  log p(w | x) = log p(band(w) | x) + log p(w | band(w), x)       (a two-level softmax)
"""

import torch
import torch.nn as nn
import torch.nn.functional as F


def check_bands(c):
    """Raise ValueError, in one line, for bands that cannot be (c: a t2r.Config)."""
    edges = [0, *c.adaptive_cutoffs, c.vocab_size]
    if c.adaptive_cutoffs and edges != sorted(set(edges)):
        raise ValueError(f"adaptive_cutoffs={c.adaptive_cutoffs} must increase strictly inside (0, "
                         f"vocab_size={c.vocab_size})")
    if c.adaptive_cutoffs and c.d_model // c.adaptive_factor ** len(c.adaptive_cutoffs) < 1:
        raise ValueError(f"adaptive_factor={c.adaptive_factor} leaves the last band no dimension of "
                         f"d_model={c.d_model}")
    if c.adaptive_cutoffs and (c.n_encoder_layer or not c.tie_embeddings):
        raise ValueError("the adaptive input and softmax are a tied language model's: set tie_embeddings, "
                         "and no encoder")


def band_edges(config) -> list:
    return list(zip([0, *config.adaptive_cutoffs], [*config.adaptive_cutoffs, config.vocab_size]))


class AdaptiveInput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.edges = band_edges(config)
        dims = [config.d_model // config.adaptive_factor ** i for i in range(len(self.edges))]
        self.bands = nn.ModuleList(nn.Embedding(hi - lo, d) for (lo, hi), d in zip(self.edges, dims))
        self.projections = nn.ModuleList(nn.Linear(d, config.d_model, bias=False) for d in dims)  # (h, d_i) each

    def forward(self, tokens):  # (B, T) -> (B, T, h)
        out = self.projections[0].weight.new_zeros(*tokens.shape, self.projections[0].out_features)
        for (lo, hi), band, projection in zip(self.edges, self.bands, self.projections):
            inside = (tokens >= lo) & (tokens < hi)
            out = out.index_put((inside,), projection(band(tokens[inside] - lo)).to(out.dtype))
        return out


class AdaptiveSoftmax(nn.Module):
    """Log-probabilities (B, T, V), normalised in float32: what a model's logits are for, since
    softmax(log p) = p, so the loss, sampling and beam search take them unchanged."""

    def __init__(self, config, tied: AdaptiveInput):
        super().__init__()
        self.tied = tied  # the input's embeddings and projections, shared (registered twice, stored once)
        self.band_entries = nn.Linear(config.d_model, len(tied.bands) - 1, bias=False)  # the head's other bands

    def forward(self, x):  # (B, T, h) -> (B, T, V)
        # each band's scores: x projected down to the band's size, against its embeddings: (x W_i) E_i^T
        wide = lambda t: t.to(torch.promote_types(t.dtype, torch.float32))  # float32 at least, under autocast too
        scores = [wide(F.linear(x @ p.weight, e.weight)) for e, p in zip(self.tied.bands, self.tied.projections)]
        head = torch.log_softmax(torch.cat([scores[0], wide(self.band_entries(x))], dim=-1), dim=-1)
        n0 = scores[0].shape[-1]
        tails = [head[..., n0 + i: n0 + i + 1] + torch.log_softmax(s, dim=-1) for i, s in enumerate(scores[1:])]
        return torch.cat([head[..., :n0], *tails], dim=-1)
