"""Models with `TransformerBackbone(reversible=True)`: a `ReversibleStack` in a CausalLM and a
TextClassifier (survey §5.4) trains, decodes with the cache, generates and saves."""

import keras
import numpy as np
import pytest

from keras_xf.layers import ReversibleStack
from tests.layer_checks import to_numpy
from tests.models.tiny import causal_lm
from tests.models.tiny import check_decoding_equals_full_pass
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import text_classifier
from tests.models.tiny import token_batch


def test_cached_decoding_and_generate_equal_the_full_pass(rng):
    model = randomize_embeddings(causal_lm(num_layers=3, reversible=True))
    assert isinstance(model.backbone.transformer_stack, ReversibleStack)
    check_decoding_equals_full_pass(model, token_batch(rng), max_length=7)


def test_training_step_matches_plain_autodiff(rng):
    # One SGD step through the recomputing gradient gives the weights that ordinary
    # autodiff of the same stack gives.
    batch = token_batch(rng)
    labels = batch["token_ids"]
    models = []
    for recompute in (True, False):
        keras.utils.set_random_seed(0)
        model = causal_lm(num_layers=2, reversible=True)
        model.backbone.transformer_stack.recompute = recompute
        model.compile(optimizer=keras.optimizers.SGD(0.5), loss="sparse_categorical_crossentropy")
        models.append(model)
    models[1].set_weights(models[0].get_weights())
    for model in models:
        model.fit(batch, labels, batch_size=len(labels), epochs=1, verbose=0, shuffle=False)
    for ours, reference in zip(models[0].get_weights(), models[1].get_weights()):
        np.testing.assert_allclose(ours, reference, atol=1e-5)


def test_saving_round_trip_and_pooled_classifier(rng, tmp_path):
    batch = token_batch(rng)
    for model in (causal_lm(num_layers=2, reversible=True),
                  text_classifier(num_layers=2, reversible=True)):
        path = str(tmp_path / f"{model.name}.keras")
        model.save(path)
        loaded = keras.saving.load_model(path, safe_mode=True)
        assert loaded.backbone.reversible
        np.testing.assert_allclose(to_numpy(loaded(batch)), to_numpy(model(batch)), atol=1e-5)


@pytest.mark.parametrize("name, value", [("share_attention_maps", 2),
                                         ("depth_initialization", {"method": "model_depth"}),
                                         ("stack_options", {"layer_drop": 0.1}),
                                         ("reversible", 1)])
def test_bad_arguments_raise(name, value):
    with pytest.raises(ValueError, match=name):
        causal_lm(num_layers=2, **{"reversible": True, name: value})
