"""Depth growth: a deeper model initialised by stacking the trained layers (survey §4.2.2)."""

import numbers

import keras

from keras_xf.surgery.growth import BACKBONES
from keras_xf.surgery.growth import paired_weights
from keras_xf.surgery.growth import rebuild
from keras_xf.surgery.growth import rewrite
from keras_xf.surgery.growth import serialized


def grow_depth(model, times):
    """A model `times` deeper whose layer stack repeats the trained one (shallow-to-deep).

    Survey §4.2.2 (shallow-to-deep training): after training an `L`-layer model, a deeper
    model is made "by stacking the shallow model" and trained further; repeating the step
    gives `L · 2^I` layers after `I` rounds. Layer `l` of the new `times · L`-layer stack
    copies the trained layer `l mod L` (the whole trained stack repeated `times` times, as
    the survey describes, rather than each layer repeated in place), in every stack of the
    model (encoder and decoder of a `Seq2SeqLM`). Embeddings, final norms and heads are
    copied. The deeper model computes a different function (the stack is applied `times`
    times); it is a starting point for further training.

    Args:
        model: a keras_xf model built from a `TransformerBackbone` or `Seq2SeqBackbone`.
        times: int `≥ 1`, the depth multiplier.

    Returns:
        A new, uncompiled model of the same class with `times · L` layers per stack.

    Example:
    >>> deep = grow_depth(lm, times=2)  # 2 layers -> 4: blocks 0, 1, 0, 1
    >>> deep.compile(); deep.fit(x, y)
    """
    if isinstance(times, bool) or not isinstance(times, numbers.Integral) or times < 1:
        raise ValueError(f"times must be a positive int. Received: times={times!r}")
    times = int(times)
    tree = serialized(model)
    depths = []

    def deepen(cls, config):
        if not (isinstance(cls, type) and issubclass(cls, BACKBONES)):
            return False
        depths.append(config["num_layers"])
        config["num_layers"] *= times
        if config.get("num_decoder_layers") is not None:
            if config["num_decoder_layers"] != config["num_layers"] // times:
                raise ValueError(
                    "grow_depth needs equally deep encoder and decoder stacks. Received: "
                    f"num_layers={depths[-1]}, num_decoder_layers={config['num_decoder_layers']}"
                )
            config["num_decoder_layers"] *= times
        return True

    if not rewrite(tree, deepen):
        raise ValueError(
            "grow_depth needs a model built from a TransformerBackbone or Seq2SeqBackbone. "
            f"Received: model={model.__class__.__name__}"
        )
    if len(depths) != 1:
        raise ValueError(f"grow_depth needs one backbone. Received: {len(depths)} backbones")
    layers = depths[0]
    grown = rebuild(model, tree)
    for source, target in paired_weights(model, grown, block_index=lambda l: l % layers):
        # A copy: one backend buffer must not back two variables (JAX donates them).
        target.assign(keras.ops.convert_to_numpy(source))
    return grown
