"""Early exit and layer skipping run through the stack's runner, so the stack's options apply:
shared layers, hybrid templates, layer drop, fusion and multi-step residuals (survey §4.2,
§5.5.2, §5.6). Each model is checked against a reference that does not use the runner: the
stack cut after the exit layer (`TransformerStack.prune`), the numpy oracle, or a decoder
that recomputes every layer from its stored inputs."""

import numpy as np
import pytest
from keras import ops

from keras_xf.layers import AverageAttention
from keras_xf.layers import FeedForward
from keras_xf.layers import MultiHeadAttention
from keras_xf.layers import RecurrentMixer
from keras_xf.layers import TransformerBlock
from keras_xf.models import CausalLM
from keras_xf.models import EarlyExitCausalLM
from keras_xf.models import EarlyExitClassifier
from keras_xf.models import LayerSkippingClassifier
from keras_xf.models import TextClassifier
from tests.layer_checks import randomize_weights
from tests.layer_checks import to_float64
from tests.layer_checks import to_numpy
from tests.models.adaptive.test_early_exit_causal_lm import MAX_LENGTH
from tests.models.adaptive.test_early_exit_causal_lm import PROMPTS
from tests.models.adaptive.test_early_exit_causal_lm import between
from tests.models.adaptive.test_early_exit_causal_lm import confident_lm
from tests.models.adaptive.test_early_exit_causal_lm import reference_decode
from tests.models.adaptive.test_layer_skipping_classifier import set_gates
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import SIZES
from tests.models.tiny import VOCAB
from tests.models.tiny import randomize_embeddings
from tests.models.tiny import token_batch
from tests.reference import early_exit as ref
from tests.reference import early_exit_decoding as ref_decoding

CLASSES, LAYERS = 3, 3


def block(mixer):
    return TransformerBlock(mixer, FeedForward(FFN), norm_placement="pre")


def hybrid_blocks():
    """Three mixer kinds in turn: recurrent, self-attention, cumulative averaging."""
    return [block(RecurrentMixer("gru")), block(MultiHeadAttention(HEADS)),
            block(AverageAttention())]


STACKS = {
    "shared_layers": lambda: {"stack_options": {"share_layers": "all"},
                              "norm_placement": "pre"},
    "hybrid": lambda: {"block": hybrid_blocks()},
}


def exit_classifier(rng, stack):
    model = EarlyExitClassifier(num_classes=CLASSES, num_layers=LAYERS,
                                **{**SIZES, **STACKS[stack]()})
    randomize_weights(model, rng, scale=0.5)
    return model


def pruned_exits(model, x):
    """Every exit's logits `[B, E, C]` and pooled states `[B, E + 1, d]` from the backbone's
    stack cut after each exit layer (`prune`): the reference the runner must reproduce."""
    mask = ops.cast(x["padding_mask"], "bool")
    stack = model.backbone.transformer_stack
    hidden = model.embed(x)
    states = [model.pooling(stack.output_state(hidden), padding_mask=mask)]
    logits = []
    for exit_index, layer in enumerate(model.exit_layers):
        cut = stack.prune(list(range(layer)))
        states.append(model.pooling(cut(hidden, padding_mask=mask, use_causal_mask=False),
                                    padding_mask=mask))
        logits.append(model.heads(states[-1], exit_index=exit_index))
    return (np.stack([to_numpy(v) for v in logits], 1),
            np.stack([to_numpy(v) for v in states], 1).astype("float64"))


@pytest.mark.parametrize("stack", sorted(STACKS))
def test_classifier_exits_equal_the_cut_stack(rng, stack):
    model = exit_classifier(rng, stack)
    x = token_batch(rng, batch=4, lengths=[8, 6, 3, 7])
    logits, _ = pruned_exits(model, x)
    np.testing.assert_allclose(to_numpy(model(x)), logits, atol=2e-5)


@pytest.mark.parametrize("criterion", ["max_probability", "patience"])
@pytest.mark.parametrize("stack", sorted(STACKS))
def test_predictor_exits_as_the_reference(rng, stack, criterion):
    model = exit_classifier(rng, stack)
    x = token_batch(rng, batch=4, lengths=[8, 6, 3, 7])
    logits, states = pruned_exits(model, x)
    threshold = 1 if criterion == "patience" else between(ref.max_probability(logits[:, 0]))
    expected_logits, expected_layers = ref.early_exits(logits, states, model.exit_layers,
                                                       criterion, threshold)
    result = model.early_exit_predictor(criterion, threshold).predict(x, verbose=0)
    np.testing.assert_array_equal(result["exit_layer"], expected_layers)
    np.testing.assert_allclose(result["logits"], expected_logits, atol=2e-5)
    if criterion == "max_probability":
        assert len(set(expected_layers.tolist())) > 1


def stored_inputs_decode(model, prompt, criterion, threshold):
    """Greedy decoding of one row with token-level adaptive depth and no cache: each
    layer's output at position `j` is its block run (causally) over the inputs it stored at
    positions `0 … j`, which for a token that exited below it is its exit state (the rule of
    `early_exit_decoding.adaptive_greedy_decode`, here with the model's own blocks)."""
    stack = model.backbone.transformer_stack
    tokens, exit_of = list(prompt), [0] * MAX_LENGTH
    inputs = [[] for _ in stack.blocks]
    for j in range(MAX_LENGTH - 1):
        x = to_numpy(model.backbone.embeddings(np.asarray(tokens, "int32")[None]))[0, j]
        adaptive = j + 1 >= len(prompt)
        previous_state = to_float64(stack.output_state(x[None, None]))[0, 0]
        previous_logits, count = None, 0
        for number, layer in enumerate(stack.blocks, 1):
            inputs[number - 1].append(x)
            x = to_numpy(layer(np.stack(inputs[number - 1])[None], use_causal_mask=True))[0, j]
            if number not in model.exit_layers:
                continue
            e = model.exit_layers.index(number)
            state = stack.output_state(x[None, None])
            logits = to_float64(model.exit_logits(e, state))[0, 0]
            state = to_float64(state)[0, 0]
            if e:
                count = count + 1 if logits.argmax() == previous_logits.argmax() else 0
            stop = number == len(stack.blocks) or (adaptive and ref_decoding.exits_here(
                criterion, threshold, logits, state, previous_state, count))
            previous_state, previous_logits = state, logits
            if stop:
                for above in inputs[number:]:
                    above.append(x)  # the exit state, copied upward
                break
        if adaptive:
            tokens.append(int(logits.argmax()))
            exit_of[j + 1] = number
    return tokens, exit_of


def check_generation(model, expected_tokens, expected_exits, criterion, threshold):
    tokens, exits = model.generate(PROMPTS, max_length=MAX_LENGTH, exit_criterion=criterion,
                                   exit_threshold=threshold, return_exit_layers=True)
    for row, prompt in enumerate(PROMPTS):
        np.testing.assert_array_equal(tokens[row], expected_tokens[row])
        np.testing.assert_array_equal(exits[row], expected_exits[row])
    generated = np.concatenate([e[len(p):] for e, p in zip(exits, PROMPTS)])
    assert len(set(generated.tolist())) > 1  # tokens exit at different layers


def first_exit_threshold(model, rng, criterion):
    if criterion == "patience":
        return 1
    logits = to_float64(model(token_batch(rng, batch=4)))[:, 0].reshape(-1, VOCAB)
    return between(ref.max_probability(logits))


@pytest.mark.parametrize("criterion", ["max_probability", "patience"])
def test_generation_with_exits_on_shared_layers_equals_the_numpy_oracle(rng, criterion):
    """Every layer is the same block (`share_layers="all"`); the numpy oracle runs that one
    block's weights at every depth."""
    model = confident_lm(rng, exit_heads="shared", stack_options={"share_layers": "all"})
    stack = model.backbone.transformer_stack
    assert all(layer is stack.blocks[0] for layer in stack.blocks)
    threshold = first_exit_threshold(model, rng, criterion)
    tokens, exits = reference_decode(model, criterion, threshold)
    check_generation(model, tokens, exits, criterion, threshold)


@pytest.mark.parametrize("criterion", ["max_probability", "patience"])
def test_generation_with_exits_on_a_hybrid_stack_equals_the_stored_inputs_decoder(rng,
                                                                                   criterion):
    """Recurrent, self-attention and averaging layers: the skipped layers' recurrent state,
    keys and values and running averages take the exit state, as the decoder that stores
    every layer's inputs computes."""
    model = EarlyExitCausalLM(num_layers=LAYERS, block=hybrid_blocks(), **SIZES)
    randomize_weights(model, rng, scale=0.5)
    model = randomize_embeddings(model)
    threshold = first_exit_threshold(model, rng, criterion)
    rows = [stored_inputs_decode(model, prompt, criterion, threshold) for prompt in PROMPTS]
    check_generation(model, [r[0] for r in rows], [r[1] for r in rows], criterion, threshold)


def test_layer_drop_takes_effect_in_early_exit(rng):
    """With `layer_drop`, each exit sees the increments rescaled by `ρ` at inference, as
    the cut stack computes; the bare chain of blocks (what a model's own loop computed
    before) gives other logits."""
    model = EarlyExitClassifier(num_classes=CLASSES, num_layers=LAYERS, norm_placement="pre",
                                stack_options={"layer_drop": 0.5}, **SIZES)
    randomize_weights(model, rng, scale=0.5)
    x = token_batch(rng, lengths=[8, 5])
    logits = to_numpy(model(x))
    np.testing.assert_allclose(logits, pruned_exits(model, x)[0], atol=2e-5)
    mask = ops.cast(x["padding_mask"], "bool")
    hidden = model.embed(x)
    for layer in model.blocks:
        hidden = layer(hidden, padding_mask=mask)
    chained = to_numpy(model.exit_logits(LAYERS - 1, hidden, mask))
    assert not np.allclose(logits[:, -1], chained, atol=1e-3)


def test_fusion_takes_effect_in_layer_skipping(rng):
    """Gates forced open: a layer-skipping classifier on an `"average"`-fusion stack is the
    text classifier on that stack, in training, at inference and in the predictor."""
    options = {"stack_options": {"fusion": "average"}, "norm_placement": "pre"}
    model = LayerSkippingClassifier(num_classes=CLASSES, num_layers=LAYERS, **options, **SIZES)
    plain = TextClassifier(num_classes=CLASSES, num_layers=LAYERS, **options, **SIZES)
    randomize_weights(model, rng, scale=0.5)
    set_gates(model, [30.0] * LAYERS)
    plain.backbone.set_weights(model.backbone.get_weights())
    plain.head.set_weights(model.head.get_weights())
    x = token_batch(rng, lengths=[8, 5])
    expected = to_numpy(plain(x))
    for training in (False, True):
        np.testing.assert_allclose(to_numpy(model(x, training=training)), expected, atol=1e-5)
    result = model.layer_skipping_predictor().predict(x, verbose=0)
    np.testing.assert_allclose(result["logits"], expected, atol=1e-5)
    unfused = TextClassifier(num_classes=CLASSES, num_layers=LAYERS, norm_placement="pre",
                             **SIZES)
    unfused.set_weights(plain.get_weights())
    assert not np.allclose(to_numpy(unfused(x)), expected, atol=1e-3)


def test_multistep_takes_effect_in_the_early_exit_lm(rng):
    """Adams–Bashforth residuals: the last exit is `CausalLM` on the same backbone, and
    generating with every token at full depth gives `CausalLM`'s tokens."""
    model = confident_lm(rng, stack_options={"multistep": "adams_bashforth_2"})
    plain = CausalLM(backbone=model.backbone)
    x = token_batch(rng, lengths=[8, 6])
    np.testing.assert_allclose(to_numpy(model(x))[:, -1], to_numpy(plain(x)), atol=1e-4)
    tokens, exits = model.generate(PROMPTS, max_length=MAX_LENGTH, return_exit_layers=True)
    assert tokens == plain.generate(PROMPTS, max_length=MAX_LENGTH)
    assert all(set(e[len(p):]) == {LAYERS} for e, p in zip(exits, PROMPTS))
