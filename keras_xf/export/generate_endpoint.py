"""The `generate` and `generate_step` endpoints of a generating task's SavedModel: the task's
cached loop (`GenerationSteps.generate_step`) with the sampler fixed at export time."""

import copy

import keras
from keras import ops

from keras_xf.export.endpoints import model_endpoints
from keras_xf.export.signatures import dict_inputs
from keras_xf.export.signatures import free_signature
from keras_xf.export.signatures import jax2tf_kwargs
from keras_xf.generation.prompts import shortest_prompt
from keras_xf.generation.sampling import get_sampler

# Samplers whose loop is keras-hub's `(prompt, cache, index, mask)` loop (not beam search).
GENERATE_SAMPLERS = ("greedy", "random", "top_k", "top_p")


def generate_signature(model):
    """`{name: tf.TensorSpec}` of the `generate` endpoint: the model's inputs (the prompt ids
    and int32 mask under its `prompt_keys`, and the task's other inputs), `max_length`
    (int32 scalar: the output width), `stop_token_ids` (int32 `[S]`, empty for none) and
    `seed` (int32 scalar: the sampler's seed, as `TopKSampler(seed=seed)`). `model`: a
    keras_xf model or its `ExportEndpoints`."""
    import tensorflow as tf

    specs = {name: tf.TensorSpec(spec.shape, spec.dtype, name=name)
             for name, spec in free_signature(model_endpoints(model))[0].items()}
    return {**specs,
            "max_length": tf.TensorSpec((), tf.int32, name="max_length"),
            "stop_token_ids": tf.TensorSpec((None,), tf.int32, name="stop_token_ids"),
            "seed": tf.TensorSpec((), tf.int32, name="seed")}


def resolve_generate_sampler(endpoints, sampler):
    """The sampler of the `generate` endpoint, or `None` for no endpoint."""
    generation = endpoints.generation
    if sampler is False or (sampler is None and generation is None):
        return None
    if generation is None:
        raise ValueError(
            "generate_sampler is for models that generate (CausalLM, Seq2SeqLM, "
            f"VisionLanguageLM). Received: generate_sampler={sampler!r} for "
            f"{type(endpoints.serve).__name__}"
        )
    resolved = get_sampler(generation.default_sampler if sampler is None else sampler)
    import keras_hub

    kinds = (keras_hub.samplers.GreedySampler, keras_hub.samplers.RandomSampler,
             keras_hub.samplers.TopKSampler, keras_hub.samplers.TopPSampler)
    if type(resolved) not in kinds:
        raise ValueError(
            f"The exported generate endpoint supports the samplers {GENERATE_SAMPLERS}. "
            f"Received: generate_sampler={sampler!r} ({type(resolved).__name__}); pass "
            "generate_sampler= one of those, or False for no generate endpoint."
        )
    return resolved


def seeded_sampler(model, sampler, seed):
    """A copy of `sampler` whose loop starts its seed generators at `[seed, 0]` (the state of
    `SeedGenerator(seed)`) and carries them as loop variables.

    A SavedModel endpoint cannot keep the sampler's seed state in a variable, and a loop
    body cannot update one that a `StatelessScope` maps (the body is traced once). The model
    weights are read before the loop and mapped in the body's scope, so that on JAX they stay
    the archive's stateless inputs.
    """
    seed_variables = list(sampler.variables)
    weights = list(model.variables)

    def run_loop(cond, body, model=None, loop_vars=None, maximum_iterations=None):
        values = [(variable, variable.value) for variable in weights]
        states = [ops.cast(ops.stack([seed, ops.zeros_like(seed)]), variable.dtype)
                  for variable in seed_variables]

        def seeded_cond(states, *loop_vars):
            return cond(*loop_vars)

        def seeded_body(states, *loop_vars):
            mapping = values + list(zip(seed_variables, states))
            with keras.StatelessScope(state_mapping=mapping) as scope:
                loop_vars = body(*loop_vars)
            states = [scope.get_current_value(variable) for variable in seed_variables]
            return (states, *loop_vars)

        _, *loop_vars = ops.while_loop(seeded_cond, seeded_body, (states, *loop_vars),
                                       maximum_iterations=maximum_iterations)
        return loop_vars

    seeded = copy.copy(sampler)
    seeded.run_loop = run_loop
    return seeded


def add_generate_endpoints(archive, endpoints, sampler, given_jax2tf_kwargs=None):
    """Adds `generate_step` (the cached loop of `GenerationSteps.generate_step` on packed
    prompts, lowered with jax2tf on JAX) and `generate` (TensorFlow ops that pack the prompts
    to `max_length`, around `generate_step`)."""
    import tensorflow as tf

    generation = endpoints.generation
    ids_key, mask_key = generation.prompt_keys

    def generate_step(inputs):
        inputs = dict(inputs)
        stop_token_ids = inputs.pop("stop_token_ids")
        seed = inputs.pop("seed")
        # The whole width is prefilled and the loop starts at the shortest prompt's end, as
        # `model.generate`'s does; a recurrent state must see each token once: the loop feeds
        # the prompt from 1.
        start = 1 if generation.recurrent_state else shortest_prompt(inputs[mask_key])
        return generation.generate_step(
            inputs, stop_token_ids=stop_token_ids,
            sampler=seeded_sampler(endpoints.serve, sampler, seed), use_cache=True,
            prefill_length=start)

    if keras.config.backend() == "tensorflow":
        # XLA, as `model.generate` compiles it: the same kernels, hence the same random draws
        # for a seed (TensorFlow's stateless random ops differ between XLA and its own
        # kernels). A SavedModel keeps the function's jit_compile flag.
        generate_step = tf.function(generate_step, jit_compile=True, autograph=False)

    signature = generate_signature(endpoints)
    step_signature = {name: spec for name, spec in signature.items() if name != "max_length"}
    kwargs = {}
    if keras.config.backend() == "jax":
        # The user's shapes describe `serve`; the rest (platforms, ...) applies here too.
        given = {key: value for key, value in (given_jax2tf_kwargs or {}).items()
                 if key not in ("polymorphic_shapes", "polymorphic_constraints")}
        # jax2tf dimension variables are at least 1: `generate` passes `[-1, *stop ids]`.
        kwargs["jax2tf_kwargs"] = jax2tf_kwargs(
            endpoints, free_signature(endpoints), given,
            extra_shapes={"stop_token_ids": "(stops,)", "seed": "()"})
    step = archive.add_endpoint("generate_step", generate_step, [step_signature], **kwargs)

    pad = generation.pad_token_id
    extra_sequences = sorted({name[: -len("token_ids")] for name in dict_inputs(endpoints)
                              if name.endswith("token_ids") and name != ids_key})

    def left_aligned(token_ids, padding_mask):
        # Prompt tokens first, in order (a stable sort of "is padding"), as `pack_prompts`.
        mask = tf.cast(padding_mask, tf.bool)
        order = tf.argsort(tf.cast(tf.logical_not(mask), tf.int32), axis=1, stable=True)
        mask = tf.gather(mask, order, batch_dims=1)
        token_ids = tf.gather(token_ids, order, batch_dims=1)
        return tf.where(mask, token_ids, tf.cast(pad, token_ids.dtype)), mask

    @tf.function(autograph=False)
    def generate(inputs):
        inputs = dict(inputs)
        max_length = inputs.pop("max_length")
        stop_token_ids = inputs.pop("stop_token_ids")
        seed = inputs.pop("seed")
        token_ids, mask = left_aligned(inputs.pop(ids_key), inputs.pop(mask_key))
        lengths = tf.reduce_sum(tf.cast(mask, tf.int32), axis=1)
        checks = [
            tf.debugging.assert_positive(
                lengths, message=f"Every prompt in {ids_key} needs at least one token"),
            tf.debugging.assert_less_equal(
                lengths, max_length, message=f"A prompt in {ids_key} is longer than max_length"),
        ]
        with tf.control_dependencies(checks):
            extra = tf.maximum(max_length - tf.shape(token_ids)[1], 0)
            token_ids = tf.pad(token_ids, [[0, 0], [0, extra]], constant_values=pad)
            mask = tf.pad(mask, [[0, 0], [0, extra]])
        packed = {ids_key: token_ids[:, :max_length],
                  mask_key: tf.cast(mask[:, :max_length], tf.int32)}
        for prefix in extra_sequences:  # Seq2SeqLM's source: packed as `generate` packs it
            ids, extra_mask = left_aligned(inputs.pop(f"{prefix}token_ids"),
                                           inputs.pop(f"{prefix}padding_mask"))
            packed.update({f"{prefix}token_ids": ids,
                           f"{prefix}padding_mask": tf.cast(extra_mask, tf.int32)})
        outputs = step({**packed, **inputs,
                        "stop_token_ids": tf.concat([[-1], stop_token_ids], axis=0),
                        "seed": seed})
        return {ids_key: outputs[ids_key], mask_key: tf.cast(outputs[mask_key], tf.bool)}

    generate.get_concrete_function(signature)  # the first: the serving signature
    # A bool padding mask is accepted too (keras-hub's generate takes either).
    generate.get_concrete_function({
        name: tf.TensorSpec(spec.shape, tf.bool, name=name) if name.endswith("padding_mask")
        else spec for name, spec in signature.items()})
    archive.add_endpoint("generate", generate)
