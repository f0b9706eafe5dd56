"""`.keras` round trips of every model (safe_mode=True), and across backends: a model saved
under another Keras backend loads here and gives the same outputs."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_xf.layers import AlibiBias
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import TransformerBlock
from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqBackbone
from keras_xf.models import TransformerBackbone
from tests.models.tiny import FFN
from tests.models.tiny import SIZES
from tests.models.tiny import VOCAB
from tests.models.tiny import WIDTH
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import seq2seq_batch
from tests.models.tiny import seq2seq_lm
from tests.models.tiny import text_classifier
from tests.models.tiny import text_encoder
from tests.layer_checks import to_numpy
from tests.models.tiny import token_batch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BACKENDS = ["tensorflow", "jax", "torch"]


def custom_causal_lm():
    """A custom pre-norm GELU block with grouped-query attention, rotary positions, untied."""
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=4, head_dim=4, num_key_value_heads=2),
        feedforward=FeedForward(hidden_dim=FFN, activation="gelu"),
        norm_placement="pre",
    )
    return CausalLM(vocabulary_size=VOCAB, num_layers=2, hidden_dim=WIDTH, block=block,
                    max_sequence_length=12, position="rotary", tie_embeddings=False,
                    pad_token_id=3)


def bloom_like_causal_lm():
    """BLOOM's layout: ALiBi attention, no positions, a LayerNorm on the embeddings."""
    block = TransformerBlock(
        mixer=MultiHeadAttention(num_heads=4, biases=[AlibiBias()]),
        feedforward=FeedForward(hidden_dim=FFN, activation="gelu_tanh"),
        norm_placement="pre",
    )
    return CausalLM(vocabulary_size=VOCAB, num_layers=1, hidden_dim=WIDTH, block=block,
                    max_sequence_length=12, position="none",
                    embedding_normalization="layer_norm", embedding_epsilon=1e-6)


MODELS = {
    "causal_lm_custom_rotary_gqa": custom_causal_lm,
    "causal_lm_alibi_embedding_norm": bloom_like_causal_lm,
    "seq2seq_lm": lambda: seq2seq_lm(start_token_id=2),
    "seq2seq_lm_separate": lambda: seq2seq_lm(share_embeddings=False, source_vocabulary_size=20,
                                              position="rotary"),
    "text_encoder": lambda: text_encoder(projection_dim=8, pooling="max"),
    # BERT-like embeddings: segments, a LayerNorm of the sum, RoBERTa's position offset.
    "text_encoder_segments": lambda: text_encoder(
        position="learned", num_segments=2, embedding_normalization="layer_norm",
        embedding_epsilon=1e-6, position_offset=2, pooling="cls", projection_dim=WIDTH,
        projection_activation="tanh", normalize=False),
    "text_classifier": lambda: text_classifier(num_classes=3, head_intermediate_dim=8),
    # [CLS] pooling: the last layer computes the first position alone.
    "text_classifier_cls": lambda: text_classifier(num_classes=3, num_layers=2, pooling="cls"),
    "transformer_backbone": lambda: TransformerBackbone(**SIZES, num_layers=1, causal=True),
    "seq2seq_backbone": lambda: Seq2SeqBackbone(**SIZES, num_layers=1),
}


def inputs_for(name, rng):
    if "seq2seq" in name:
        batch = seq2seq_batch(rng, source_lengths=[8, 4])
        batch["encoder_token_ids"] %= 20
        return batch
    batch = token_batch(rng, lengths=[8, 5])
    if "segments" in name:
        batch["segment_ids"] = (np.arange(8)[None, :] >= np.array([[4], [2]])).astype("int32")
    return batch


def outputs_of(model, batch):
    return keras.tree.map_structure(to_numpy, model(batch, training=False))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_keras_round_trip(tmp_path, rng, name):
    model = randomize_embeddings(MODELS[name]())
    batch = inputs_for(name, rng)
    expected = outputs_of(model, batch)
    path = str(tmp_path / f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert type(loaded) is type(model)
    assert loaded.get_config() == model.get_config()
    assert loaded.count_params() == model.count_params()
    if hasattr(model, "generate"):  # pad / start ids are in the config; no compiled loops
        assert len(loaded._generate_functions) == 0
    keras.tree.map_structure(
        lambda e, a: np.testing.assert_allclose(a, e, atol=1e-6, rtol=1e-6),
        expected, outputs_of(loaded, batch),
    )


# --- Across backends ---------------------------------------------------------------------

WORKER = textwrap.dedent(
    """
    import sys
    import keras
    import numpy as np
    from tests.models.test_saving import custom_causal_lm, randomize_embeddings

    keras.utils.set_random_seed(7)
    model = randomize_embeddings(custom_causal_lm(), seed=7)
    rng = np.random.default_rng(7)
    ids = rng.integers(1, 32, size=(2, 8)).astype("int32")
    mask = np.ones_like(ids)
    mask[1, 5:] = 0
    inputs = {"token_ids": ids, "padding_mask": mask}
    # One compiled call on JAX (eager JAX compiles every op separately).
    if keras.config.backend() == "jax":
        logits = model.predict_on_batch(inputs)
    else:
        logits = model(inputs)
    model.save(sys.argv[1] + "/model.keras")
    np.savez(sys.argv[1] + "/outputs.npz", token_ids=ids, padding_mask=mask,
             logits=keras.ops.convert_to_numpy(logits), backend=keras.config.backend())
    """
)


def saving_backend(here):
    """The backend that saves the model this backend loads: each of the three saves once."""
    if here not in BACKENDS:
        return "jax"
    return BACKENDS[(BACKENDS.index(here) - 1) % len(BACKENDS)]


@pytest.fixture(scope="module", autouse=True)
def other_backend_model(tmp_path_factory):
    """Starts the worker when this module starts, so that it runs beside the round-trip tests;
    `test_model_saved_on_another_backend_loads_here` waits for it."""
    out_dir = tmp_path_factory.mktemp("other_backend")
    backend = saving_backend(keras.config.backend())
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="3")
    process = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(out_dir)],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    yield backend, out_dir, process
    if process.poll() is None:
        process.kill()
        process.communicate()


def test_model_saved_on_another_backend_loads_here(other_backend_model):
    backend, out_dir, process = other_backend_model
    assert backend != keras.config.backend()
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-3000:]
    saved = np.load(out_dir / "outputs.npz")
    assert str(saved["backend"]) == backend
    loaded = keras.saving.load_model(str(out_dir / "model.keras"), safe_mode=True)
    assert isinstance(loaded, CausalLM)
    logits = to_numpy(loaded({"token_ids": saved["token_ids"],
                              "padding_mask": saved["padding_mask"]}))
    np.testing.assert_allclose(logits, saved["logits"], atol=1e-5, rtol=1e-5)
