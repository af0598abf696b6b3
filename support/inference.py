"""
A trained model made ready to decode, for generate.py, translate.py and train_mt.py's BLEU: eval mode, its T2R layers
folded (Eq. 8). What runs its step fast is support/fast_step.py's; prefill_by_steps is the reference every parallel
prefill (t2r.py's TransformerBase.prefill) is held to, and what `--prefill step` runs.
"""

from t2r import FoldedT2RFeatureMap, T2RFeatureMap, fold


def inference_model(model):
    """The model in eval mode, its T2R layers folded (Eq. 8: the feature map merges into W_q and W_k; the outputs are
    the same). A model without T2R layers is not copied."""
    return fold(model) if any(isinstance(m, T2RFeatureMap) for m in model.modules()) else model.eval()


def is_folded(model) -> bool:  # whether `fold` merged a T2R feature map into W_q and W_k
    return any(isinstance(m, FoldedT2RFeatureMap) for m in model.modules())


def prefill_by_steps(model, tokens, state, chunk: int = 0):
    """The reference prefill: each of tokens (B, T) through model.step (chunk: unused, a step holds one position);
    generate.py's and translate.py's --prefill step."""
    for t in range(tokens.shape[1]):
        logits, state = model.step(tokens[:, t], state)
    return logits, state
