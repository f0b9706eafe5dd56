"""Hybrid stacks: TransformerStack / CausalLM with a list of block templates (recurrent or
averaging layers alternating with self-attention): layout, config, saving, training, cached
generation."""

import keras
import numpy as np
import pytest

from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from keras_xf.layers import TransformerStack
from keras_xf.models import CausalLM
from tests import layer_checks as checks
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import causal_lm
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch

B, T = 2, 8


def _block(mixer):
    return TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")


def test_stack_cycles_through_templates_and_round_trips():
    templates = [_block(RecurrentMixer("gru")), _block(MultiHeadAttention(HEADS)),
                 _block(AverageAttention())]
    stack = TransformerStack(templates, num_layers=4)
    kinds = [type(b.mixer).__name__ for b in stack.blocks]
    assert kinds == ["RecurrentMixer", "MultiHeadAttention", "AverageAttention",
                     "RecurrentMixer"]
    assert stack.final_norm and len({id(b.mixer) for b in stack.blocks}) == 4
    config = stack.get_config()
    assert isinstance(config["block"], list) and len(config["block"]) == 3
    clone = checks.check_config_round_trip(stack)
    assert [type(b.mixer).__name__ for b in clone.blocks] == kinds
    # A single template (not a list) keeps its config form.
    assert isinstance(TransformerStack(templates[0], 2).get_config()["block"], dict)
    with pytest.raises(ValueError, match="block"):
        TransformerStack([], num_layers=2)
    with pytest.raises(ValueError, match="share_attention_maps"):
        TransformerStack(templates[1:], num_layers=2, share_attention_maps=2)


def test_hybrid_causal_lm_trains_and_generates_with_cache(rng):
    """LSTM, average-attention and self-attention blocks in turn: training lowers the loss,
    and the cached generation loop (the states of the first two, the KV cache of the third)
    gives the same tokens as recomputing the whole prefix at every step."""
    keras.utils.set_random_seed(1)
    blocks = [_block(RecurrentMixer("lstm")), _block(AverageAttention()),
              _block(MultiHeadAttention(HEADS))]
    lm = randomize_embeddings(causal_lm(block=blocks, num_layers=3))
    assert lm._has_recurrent_cache()
    lm.compile(optimizer=keras.optimizers.Adam(1e-2))
    batch = token_batch(rng, lengths=[8, 6])
    labels = np.roll(batch["token_ids"], -1, axis=1)
    losses = lm.fit(batch, labels, epochs=3, batch_size=B, verbose=0).history["loss"]
    assert np.all(np.isfinite(losses)) and losses[-1] < losses[0]
    prompts = np.array([[3, 4, 5], [6, 7, 8]], "int32")
    cached = lm.generate(prompts, max_length=T)
    np.testing.assert_array_equal(cached, lm.generate(prompts, max_length=T, use_cache=False))


def test_hybrid_causal_lm_saving(rng, tmp_path):
    blocks = [_block(RecurrentMixer("gru", units=12)), _block(MultiHeadAttention(HEADS))]
    lm = causal_lm(block=blocks, num_layers=3)
    assert isinstance(lm.backbone.get_config()["block"], list)
    batch = token_batch(rng)
    loaded = checks.check_saving(lm, batch, tmp_path, atol=1e-5)
    kinds = [type(b.mixer).__name__ for b in loaded.backbone.transformer_stack.blocks]
    assert kinds == ["RecurrentMixer", "MultiHeadAttention", "RecurrentMixer"]
    assert isinstance(CausalLM.from_config(lm.get_config()), CausalLM)
