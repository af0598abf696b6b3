"""
Checkpoints: saved with checksums of their tensors and of everything else they hold (a flipped byte is refused, not
loaded), never with weights that are not finite, loaded with torch.load(weights_only=True), and built into the model
they hold.
"""

import os
import zlib

import torch
from torch.utils._pytree import tree_flatten

from support.configs import build_model
from support.runtime import UserError, atomic_write


CHECKSUMS = ("checksum", "checksum_all")  # what save_checkpoint adds: of the tensors (as before), of everything


def tensor_checksum(checkpoint: dict) -> int:
    """CRC-32 of every tensor's bytes in a checkpoint, in order (the checksums aside): torch.load does not check the
    zip's own CRCs, so a flipped byte in the weights would load silently. What checkpoints before checksum_all hold."""
    crc = 0
    for leaf in tree_flatten({k: v for k, v in checkpoint.items() if k not in CHECKSUMS})[0]:
        if torch.is_tensor(leaf):
            crc = zlib.crc32(tensor_bytes(leaf), crc)
    return crc


def tensor_bytes(tensor):
    return tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()


def checksum_all(value, crc: int = 0) -> int:
    """CRC-32 of everything a checkpoint holds (the checksums aside): every name, every value's repr, every tensor's
    dtype, shape and bytes; a flipped bit in its config (norm_eps 1e-5 -> 0.655) changes it too."""
    if torch.is_tensor(value):
        return zlib.crc32(tensor_bytes(value), zlib.crc32(f"{value.dtype}{tuple(value.shape)}".encode(), crc))
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in CHECKSUMS:
                crc = checksum_all(item, zlib.crc32(repr(key).encode(), crc))
        return crc
    if isinstance(value, (list, tuple)):
        for item in value:
            crc = checksum_all(item, crc)
        return zlib.crc32(f"{type(value).__name__}{len(value)}".encode(), crc)
    return zlib.crc32(repr(value).encode(), crc)


def non_finite_weights(weights: dict) -> list:
    """The names of the floating-point tensors holding a NaN or an inf."""
    return [name for name, t in weights.items()
            if torch.is_tensor(t) and t.is_floating_point() and not torch.isfinite(t).all()]


def save_checkpoint(path: str, checkpoint: dict):
    """Weights that are not finite are never saved (the last good checkpoint stays the one to resume); the tensors'
    checksum goes with them. An interrupted or failed save never leaves a half checkpoint (atomic_write)."""
    broken = non_finite_weights(checkpoint.get("model", {}))
    if broken:
        raise UserError(f"not saving {path}: its weights hold NaN or inf ({broken[0]}; the updates diverged): lower "
                        f"--lr, then --resume from the last checkpoint saved (or start again if none was)")
    try:
        with atomic_write(path) as tmp, open(tmp, "wb") as f:  # a file object: a full disk is an OSError with errno
            torch.save({**checkpoint, "checksum": tensor_checksum(checkpoint),
                        "checksum_all": checksum_all(checkpoint)}, f)
    except (OSError, RuntimeError) as error:  # a full disk, a read-only folder
        reason = error.strerror if isinstance(error, OSError) and error.strerror else str(error).splitlines()[0][:120]
        raise UserError(f"could not write {path} ({reason}): free some space or make the folder writable, then "
                        f"--resume; the last complete checkpoint is kept") from None


def load_checkpoint(path: str, what: str = "checkpoint") -> dict:
    if not os.path.isfile(path):
        raise UserError(f"no {what} at {path}: train one first, or pass the right path")
    checkpoint = read_checked(path, what)
    if not isinstance(checkpoint.get("config"), dict) or not isinstance(checkpoint.get("args", {}), dict):
        raise UserError(f"{path} is not a t2r checkpoint (its config, or its args, is not a dict)")
    return checkpoint


def read_checked(path: str, what: str = "checkpoint", fix: str = "delete it and retrain, or restore a good copy"
                 ) -> dict:
    """A saved dict of weights, refused in one line (ending with `fix`) if it is unreadable, if its tensors differ
    from the checksum save_checkpoint wrote with them (older files have none) or if its weights are not finite."""
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated zip, pickle garbage, a file that is not a checkpoint
        raise UserError(f"{what} {path} is unreadable ({type(error).__name__}): it is truncated or corrupt; "
                        f"{fix}") from None
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("model"), dict):
        raise UserError(f"{path} is not a t2r checkpoint (no model weights in it)")
    if "checksum" in checkpoint and checkpoint["checksum"] != tensor_checksum(checkpoint):
        raise UserError(f"{what} {path} is corrupt: its tensors do not match the checksum saved with them; {fix}")
    if "checksum_all" in checkpoint and checkpoint["checksum_all"] != checksum_all(checkpoint):
        raise UserError(f"{what} {path} is corrupt: what it holds besides its tensors (its config, its flags) does not "
                        f"match the checksum saved with it; {fix}")
    broken = non_finite_weights(checkpoint["model"])
    if broken:
        raise UserError(f"{what} {path} holds NaN or inf weights ({broken[0]}): it cannot be used; {fix}")
    return checkpoint


def model_from_checkpoint(checkpoint: dict, path: str = "checkpoint"):
    """The model a checkpoint holds, with its weights: a transformer, a translator or an SRU++ LM."""
    config = checkpoint["config"]
    try:
        model = build_model(config)
        model.load_state_dict(checkpoint["model"])
    except (TypeError, ValueError, RuntimeError, AttributeError) as error:
        first_line = str(error).strip().splitlines()[0]
        raise UserError(f"{path} holds a model this code cannot build ({first_line}): it is damaged, hand-made, "
                        f"or from another version") from None
    return model
