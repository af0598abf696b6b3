"""
A trained model made ready to decode, for generate.py, translate.py and train_mt.py's BLEU: eval mode, its T2R layers
folded (Eq. 8), and, where asked, its recurrent step compiled.
"""

import copy

import torch

from t2r import T2RFeatureMap, fold


def inference_model(model):
    """The model in eval mode, its T2R layers folded (Eq. 8: the feature map merges into W_q and W_k; the outputs are
    the same). A model without T2R layers is not copied."""
    return fold(model) if any(isinstance(m, T2RFeatureMap) for m in model.modules()) else model.eval()


def compile_step(model):
    """A shallow copy of model whose step runs its layers and output head through torch.compile (the first steps
    compile; it pays off over long generations); the caller's model is left as it is. The embedding and the position
    counter stay outside, so a new position does not recompile."""
    compiled = copy.copy(model)
    compiled.step_layers = torch.compile(compiled.step_layers)
    return compiled
