"""Width growth: a wider model initialised with tiled copies of trained matrices (survey §4.4)."""

import numbers

import keras
import numpy as np

from keras_xf.layers.attention.multi_head_attention import MultiHeadAttention
from keras_xf.layers.feedforward.feed_forward import FeedForward
from keras_xf.models.encoders.text_classifier import TextClassifier
from keras_xf.surgery.growth import BACKBONES
from keras_xf.surgery.growth import paired_weights
from keras_xf.surgery.growth import rebuild
from keras_xf.surgery.growth import rewrite
from keras_xf.surgery.growth import serialized

# Config entries multiplied by the factor, per class (subclasses included).
WIDTHS = (
    (BACKBONES, ("hidden_dim", "intermediate_dim", "num_heads", "num_key_value_heads")),
    (MultiHeadAttention, ("num_heads", "num_key_value_heads", "output_dim")),
    (FeedForward, ("hidden_dim", "output_dim")),
    (TextClassifier, ("head_intermediate_dim",)),
)


def width_arguments(cls):
    """The config entries of `cls` that grow with the width."""
    if not isinstance(cls, type):
        return ()
    return next((keys for kinds, keys in WIDTHS if issubclass(cls, kinds)), ())


def _input_axes(path):
    """Axes of a weight that index the units it reads: the first axis of kernels (`Dense`
    `[in, out]`, attention `[d, H, d_h]` and `[H, d_h, d]`) and of an untied output
    projection `[d, V]`; the second axis of mixture-of-experts kernels `expert_*`
    (`[M, in, out]`, one matrix per expert)."""
    name = path.split("/")[-1]
    if "kernel" not in name and name != "reverse_embeddings":
        return ()
    return (1,) if name.startswith("expert_") else (0,)


def tiled(value, shape, factor, rho, path):
    """`value` tiled to `shape` (each axis grown by `factor` or kept), divided by `rho` when
    an input axis was tiled: the block matrix `[[W/ρ … W/ρ] …]` of survey §4.4."""
    value = np.asarray(value)
    if len(shape) != value.ndim:
        raise ValueError(f"Cannot grow '{path}' from shape {value.shape} to {tuple(shape)}.")
    reps = []
    for old, new in zip(value.shape, shape):
        if new not in (old, old * factor):
            raise ValueError(
                f"Cannot grow '{path}' from shape {value.shape} to {tuple(shape)}: each "
                f"dimension must stay or grow by factor={factor}."
            )
        reps.append(new // old)
    out = np.tile(value, reps)
    if any(reps[axis] > 1 for axis in _input_axes(path)):
        out = out / rho
    return out


def grow_width(model, factor, rho=None):
    """A model `factor` times wider whose matrices are tiled copies of the trained ones.

    Survey §4.4 (wide models): a trained `d₁ × d₁` matrix `W₁` initialises the
    `k d₁ × k d₁` matrix of the wider model as the `k × k` block matrix of copies `W₁/ρ`.
    Here the residual width `d`, the feedforward hidden units `d_ffn`, the attention heads
    (query and key/value heads; the head width `d_h` is kept) and a classification head's
    hidden layer all grow by `k = factor`. Every weight is tiled `k` times along its grown
    axes; a weight whose input axis grew (a kernel's rows, an untied output projection) is
    divided by `ρ`, while weights that only produce grown units (their columns, biases,
    embeddings, norm scales and offsets) are copied as they are. Mixture-of-experts
    weights named `expert_*` (`[M, in, out]`) are treated per expert, their second axis
    being the input one.

    With `ρ = k` (the default) each grown unit holds `k` identical copies of a trained
    unit and every consumer sums them with weight `1/k`, so hidden units, heads (each copy
    computes the same attention) and the residual stream (`[x, …, x]`, whose mean and
    variance are those of `x`: LayerNorm and RMSNorm commute with the tiling) carry exact
    copies. The grown model then computes the same function at initialisation when its
    embeddings are untied (`tie_embeddings=False`: a tied table cannot be both copied for
    the input and divided for the output, so logits come out `k` times larger), positions
    are `"learned"`, `"rotary"` or `"none"` (a sinusoid table of width `k d` is not a
    tiling of the width-`d` one), the embedding is not scaled by `√d`, and the blocks are
    `MultiHeadAttention` + `FeedForward` with element-wise activations and no hooks whose
    values depend on the head count (ALiBi slopes). Otherwise the copies are only a
    starting point for further training, as the survey intends.

    Args:
        model: a keras_xf model built from a `TransformerBackbone` or `Seq2SeqBackbone`
            (`CausalLM`, `Seq2SeqLM`, `TextClassifier`, `TextEncoder`, or a backbone).
        factor: int `k ≥ 1`, the width multiplier.
        rho: positive float `ρ`; defaults to `factor`.

    Returns:
        A new, uncompiled model of the same class.

    Example:
    >>> wide = grow_width(lm, factor=2)  # hidden_dim, intermediate_dim, num_heads × 2
    >>> wide.compile(); wide.fit(x, y)
    """
    if isinstance(factor, bool) or not isinstance(factor, numbers.Integral) or factor < 1:
        raise ValueError(f"factor must be a positive int. Received: factor={factor!r}")
    factor = int(factor)
    rho = factor if rho is None else rho
    if isinstance(rho, bool) or not isinstance(rho, numbers.Real) or not rho > 0:
        raise ValueError(f"rho must be a positive number. Received: rho={rho!r}")
    tree = serialized(model)

    def widen(cls, config):
        keys = [k for k in width_arguments(cls) if isinstance(config.get(k), int)]
        for key in keys:
            config[key] *= factor
        return isinstance(cls, type) and issubclass(cls, BACKBONES)

    if not rewrite(tree, widen):
        raise ValueError(
            "grow_width needs a model built from a TransformerBackbone or Seq2SeqBackbone. "
            f"Received: model={model.__class__.__name__}"
        )
    grown = rebuild(model, tree)
    for source, target in paired_weights(model, grown):
        value = tiled(keras.ops.convert_to_numpy(source), target.shape, factor, rho, target.path)
        target.assign(value.astype(keras.backend.standardize_dtype(source.dtype)))
    return grown

