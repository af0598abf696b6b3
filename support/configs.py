"""Which model a saved config describes (build_model: the paper's, a checkpoint family's, the window hybrid's, the
short convolution's, SRU++'s), and the feature sizes the result tables show (feature_sizes). Configs are saved as
plain dicts; a checkpoint written before the families had a config of their own holds every field, at its default
where the paper's model is meant."""

from dataclasses import fields

from after_t2r import ConvConfig, WindowConfig, conv_model, window_model
from decay import DecayConfig, decay_model
from families import FamilyConfig, FamilyLM
from sru import SRUConfig, SRUppLM
from t2r import Config, Seq2SeqTransformer, TransformerLM


def is_sru(config: dict) -> bool:
    """Whether a checkpoint's config is an SRU++ language model (sru.py), not a transformer (t2r.py)."""
    return config.get("arch") == "sru++"


FAMILY_DEFAULTS = {f.name: f.default for f in fields(FamilyConfig) if f.name not in {g.name for g in fields(Config)}}


def config_of(saved: dict) -> Config:
    """The config class of a saved dict: the paper's where every other field is absent or at its default."""
    saved = dict(saved)
    if saved.get("short_conv"):
        return ConvConfig(**saved)
    saved.pop("short_conv", None)
    if saved.get("decay"):
        return DecayConfig(**saved)
    saved.pop("decay", None)
    if saved.get("window"):
        return WindowConfig(**saved)
    saved.pop("window", None)  # 0: no window, as checkpoints before wrote it
    if any(saved.get(name, default) != default for name, default in FAMILY_DEFAULTS.items()) or "positions" in saved:
        return FamilyConfig(**saved)
    return Config(**{name: value for name, value in saved.items() if name not in FAMILY_DEFAULTS})


def build_model(config):
    """The model a config (or its saved dict) describes, with fresh weights."""
    if isinstance(config, dict) and is_sru(config):
        return SRUppLM(SRUConfig(**config))
    config = config_of(config) if isinstance(config, dict) else config
    if isinstance(config, ConvConfig):
        return conv_model(config)
    if isinstance(config, DecayConfig):
        return decay_model(config)
    if isinstance(config, WindowConfig):
        return window_model(config)
    if isinstance(config, FamilyConfig):
        return FamilyLM(config)
    return Seq2SeqTransformer(config) if config.n_encoder_layer else TransformerLM(config)


def feature_sizes(config) -> tuple:
    """(k of the converted causal attention, k of the cross attention) as the tables report them, None where
    the attention is softmax (a translator's cross attention; a language model has none). elu has k = d."""
    def k(kinds, size):
        kinds = set(kinds) - {"softmax"}
        return None if not kinds else config.d_model // config.n_head if kinds == {"elu"} else size
    cross = k([config.cross_attn], config.cross_feature_size) if config.n_encoder_layer else None
    return k(config.layer_kinds(), config.feature_size), cross
