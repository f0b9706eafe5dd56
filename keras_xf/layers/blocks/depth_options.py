"""The checks and layers of a stack's depth options: layer fusion, layer drop and linear
multi-step residuals (survey §4.2.3, §4.2.4, §4.3)."""

from keras_xf.layers.blocks.layer_drop import RESCALES
from keras_xf.layers.blocks.layer_drop import LayerDrop
from keras_xf.layers.blocks.layer_fusion import LayerFusion
from keras_xf.layers.blocks.layer_fusion import check_fusion
from keras_xf.layers.blocks.multistep_residual import MultiStepResidual
from keras_xf.layers.blocks.multistep_residual import check_multistep
from keras_xf.layers.blocks.multistep_residual import layer_coefficients
from keras_xf.ops.checks import check_bool
from keras_xf.ops.checks import check_rate
from keras_xf.ops.checks import check_seed


def check_depth_options(fusion, fusion_normalization, layer_drop, layer_drop_rescale,
                        layer_drop_seed, multistep, learn_multistep):
    """Raises a `ValueError` naming the argument for a bad option; returns the checked
    `(multistep, layer_drop_seed)` (a preset name resolved, a seed as an int or `None`)."""
    check_fusion(fusion, fusion_normalization)
    checked = check_multistep(multistep)
    check_bool("learn_multistep", learn_multistep)
    if fusion is not None and checked is not None:
        raise ValueError(
            "fusion and multistep both define how a layer combines the earlier layer "
            f"outputs; pass one of them. Received: fusion={fusion!r}, multistep={multistep!r}"
        )
    check_rate("layer_drop", layer_drop)
    if layer_drop_rescale not in RESCALES:
        raise ValueError(f"layer_drop_rescale must be one of {RESCALES}. Received: "
                         f"layer_drop_rescale={layer_drop_rescale!r}")
    return checked, check_seed(layer_drop_seed, "layer_drop_seed")


def depth_option_layers(num_layers, epsilon, fusion, fusion_normalization, layer_drop,
                        layer_drop_rescale, layer_drop_seed, multistep, learn_multistep,
                        dtype):
    """`(fusions, dropper, multisteps)` for checked options: fusion `l` makes the input of
    layer `l + 1` (the stack's output for the last), one `LayerFusion` per layer or none;
    the `LayerDrop` (its `rate` the checked rate); one `MultiStepResidual` per layer or
    none."""
    fusions = []
    if fusion is not None:
        fusions = [LayerFusion(fusion, index + 2, normalization=fusion_normalization,
                               epsilon=epsilon, dtype=dtype, name=f"fusion_{index}")
                   for index in range(num_layers)]
    dropper = LayerDrop(layer_drop, layer_drop_rescale, layer_drop_seed, dtype=dtype,
                        name="layer_drop")
    multisteps = []
    if multistep is not None:
        multisteps = [MultiStepResidual(*layer_coefficients(multistep, index),
                                        trainable_coefficients=learn_multistep, dtype=dtype,
                                        name=f"multistep_{index}")
                      for index in range(num_layers)]
    return fusions, dropper, multisteps
