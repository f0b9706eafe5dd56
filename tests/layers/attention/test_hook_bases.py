"""Hook base classes: abilities declared as class attributes with defaults, and hooks of the
wrong kind refused with an error naming the argument."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import AttentionPattern
from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import FeedForwardLayer
from keras_xf.layers import LinearAttention
from keras_xf.layers import LocalPattern
from keras_xf.layers import LocalityPrior
from keras_xf.layers import MixtureOfExperts
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import PositionHook
from keras_xf.layers import RelativePositionBias
from keras_xf.layers import RelativePositionEmbedding
from keras_xf.layers import RotaryEmbedding
from keras_xf.layers import ScoreBias
from keras_xf.layers import ScoreMultiplier
from keras_xf.layers import SequenceMixer
from keras_xf.layers import StateSpaceMixer
from tests import layer_checks as checks

B, T, D, H = 2, 5, 8, 2


def test_base_classes_declare_their_defaults():
    assert ScoreBias.has_value_term is False and ScoreBias.mixes_weights is False
    assert PositionHook.rotates_pairs is False
    assert AttentionPattern.uses_states is False and AttentionPattern.supports_decoding is True
    assert AttentionPattern.block_sparse is False and AttentionPattern.cache_slots is None
    assert SequenceMixer.cache_is_recurrent is False
    assert FeedForwardLayer.uses_padding_mask is False


def test_library_hooks_subclass_their_bases_and_override_what_they_do():
    assert isinstance(AlibiBias(), ScoreBias) and isinstance(RelativePositionBias(), ScoreBias)
    assert RelativePositionEmbedding(2, use_values=True).has_value_term is True
    assert RelativePositionEmbedding(2).has_value_term is False
    assert LocalityPrior(form="mixture", beta=0.3).mixes_weights is True
    assert isinstance(LocalityPrior(form="multiplicative"), ScoreMultiplier)
    assert RotaryEmbedding().rotates_pairs is True and isinstance(RotaryEmbedding(), PositionHook)
    local = LocalPattern(window_left=2)
    assert local.block_sparse is True and local.cache_slots == 3
    assert MultiHeadAttention(H).cache_is_recurrent is False
    for mixer in (LinearAttention(H), StateSpaceMixer(), AverageAttention()):
        assert isinstance(mixer, SequenceMixer) and mixer.cache_is_recurrent is True
    assert MixtureOfExperts(num_experts=2, intermediate_dim=8).uses_padding_mask is True
    assert isinstance(FeedForward(8), FeedForwardLayer) and FeedForward(8).uses_padding_mask is False


def test_neutral_hooks_leave_attention_unchanged(rng):
    x = rng.normal(size=(B, T, D)).astype("float32")
    plain = MultiHeadAttention(H)
    expected = checks.to_numpy(plain(x, use_causal_mask=True))
    hooked = MultiHeadAttention(H, position=PositionHook(), biases=[ScoreBias()],
                                multiplier=ScoreMultiplier(), pattern=AttentionPattern())
    hooked(x)
    hooked.set_weights(plain.get_weights())
    np.testing.assert_allclose(checks.to_numpy(hooked(x, use_causal_mask=True)), expected,
                               atol=1e-5)
    positions = keras.ops.arange(T, dtype="int32")
    assert tuple(ScoreBias()(x, x, positions, positions[:3]).shape) == (1, 1, T, 3)
    np.testing.assert_array_equal(
        checks.to_numpy(ScoreMultiplier()(x, x, positions, positions)), 1.0)


def test_rotary_needs_even_qk_dim_by_attribute_not_by_name():
    with pytest.raises(ValueError, match="qk_dim must be even"):
        MultiHeadAttention(H, qk_dim=3, position=RotaryEmbedding())

    @keras.saving.register_keras_serializable(package="keras_xf_tests")
    class PairRotation(PositionHook):
        rotates_pairs = True

    with pytest.raises(ValueError, match="qk_dim must be even"):
        MultiHeadAttention(H, qk_dim=3, position=PairRotation())
    MultiHeadAttention(H, qk_dim=3, position=PositionHook())


@pytest.mark.parametrize(
    "hooks,match",
    [
        ({"pattern": AlibiBias()}, "pattern must be an instance of AttentionPattern"),
        ({"position": AlibiBias()}, "position must be an instance of PositionHook"),
        ({"multiplier": AlibiBias()}, "multiplier must be an instance of ScoreMultiplier"),
        ({"biases": [AlibiBias(), RotaryEmbedding()]},
         r"biases\[1\] must be an instance of ScoreBias"),
        ({"biases": AlibiBias()}, "biases must be a list of ScoreBias layers"),
        ({"pattern": "local"}, "pattern must be a Keras layer or a serialised layer config"),
    ],
)
def test_a_hook_of_the_wrong_kind_raises_naming_the_argument(hooks, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(H, **hooks)


def test_hooks_given_as_configs_round_trip():
    layer = MultiHeadAttention(
        H,
        position=keras.saving.serialize_keras_object(RotaryEmbedding()),
        biases=[keras.saving.serialize_keras_object(AlibiBias())],
        multiplier=keras.saving.serialize_keras_object(ScoreMultiplier()),
        pattern=keras.saving.serialize_keras_object(LocalPattern(window_left=2)),
    )
    clone = checks.check_config_round_trip(layer)
    assert isinstance(clone.position, RotaryEmbedding) and isinstance(clone.biases[0], AlibiBias)
    assert isinstance(clone.multiplier, ScoreMultiplier)
    assert isinstance(clone.pattern, LocalPattern)
