"""
A trained model made ready to decode, for generate.py, translate.py and train_mt.py's BLEU: eval mode, its T2R layers
folded (Eq. 8). What runs its step fast is support/fast_step.py's.
"""

from t2r import T2RFeatureMap, fold


def inference_model(model):
    """The model in eval mode, its T2R layers folded (Eq. 8: the feature map merges into W_q and W_k; the outputs are
    the same). A model without T2R layers is not copied."""
    return fold(model) if any(isinstance(m, T2RFeatureMap) for m in model.modules()) else model.eval()
