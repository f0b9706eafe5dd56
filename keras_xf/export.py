"""Export keras_xf models for serving: SavedModel (TensorFlow, JAX), ONNX and `.pt2` (PyTorch).

keras_xf's models take a dict of int32 `[batch, length]` tensors, and the inputs of one
sequence (`token_ids`, `padding_mask`, `segment_ids`; or `encoder_…` / `decoder_…`) must share
their batch and length. Keras' own `model.export` does not know that: on JAX it gives every
`None` dimension its own symbol, so attention cannot broadcast a `[batch, a]` padding mask
against `[batch, b]` queries. The helpers here declare the shared dimensions and otherwise use
what Keras supports on each backend. Inputs whose dimensions after the batch are static
(`images` `[batch, H, W, C]` of a `VisionClassifier`) keep only the batch dynamic.

`model.export(path, format=...)` (Keras' signature, overridden by keras_xf's
`FunctionalModel`) goes through `export_model` to the functions below:

| backend    | `"tf_saved_model"` (default)  | `"onnx"`                         | `"torch"`      |
|------------|-------------------------------|----------------------------------|----------------|
|            | `export_saved_model`          | `export_onnx`                    | `export_torch` |
| tensorflow | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| jax        | yes, dynamic batch and length | no: convert the SavedModel       | no             |
| torch      | no (Keras needs `torch_xla`)  | yes, dynamic batch and length    | yes (`.pt2`)   |

Every unsupported combination raises a `ValueError` that says why and what to use instead.
The SavedModel of a generating task (`CausalLM`, `Seq2SeqLM`, `VisionLanguageLM`) also has a
`generate` endpoint: `model.generate`'s cached loop (see `export_saved_model`); on PyTorch
their generation exports as two programs that a short loop of the caller's runs: the prefill
(`export_prefill`: context and prompts into the cache) and the cached decoding step
(`export_decode_step`). A model quantised with `model.quantize("int8")` (its `Dense` and
`EinsumDense` kernels and its `TokenEmbedding` table int8) exports through the same functions.
See `docs/export.md`.

Example:
>>> lm.export("/tmp/lm")                   # TensorFlow or JAX backend: export_saved_model
>>> import tensorflow as tf
>>> tf.saved_model.load("/tmp/lm").serve({"token_ids": ids, "padding_mask": mask})
"""

import keras
import numpy as np

# Input-name endings that mark the tensors of one sequence; the prefix before the ending names
# the sequence ("" for `token_ids`, "encoder_" for `encoder_token_ids`, ...).
SEQUENCE_INPUT_SUFFIXES = ("token_ids", "padding_mask", "segment_ids")


def export_model(model, filepath, format="tf_saved_model", verbose=None, input_signature=None,
                 **kwargs):
    """What `model.export(filepath, format, verbose, input_signature, **kwargs)` does for a
    keras_xf model (`FunctionalModel.export`): Keras' `export` with keras_xf's dynamic shapes.

    - `"tf_saved_model"` (the default; TensorFlow and JAX): `export_saved_model`.
    - `"onnx"` (PyTorch): `export_onnx`; `opset_version` is its keyword.
    - `"torch"` (PyTorch): `export_torch`; other keywords go to `torch.export.export`.
    - `"openvino"`, `"litert"`: Keras' own export, unchanged.

    A model whose inputs are not a dict has no shared dimensions to declare and goes to
    Keras' own export as it is.

    Raises:
        ValueError: for a format the backend cannot export (`"tf_saved_model"` on PyTorch,
            `"onnx"` on TensorFlow / JAX, `"torch"` on TensorFlow / JAX), saying what to use.
    """
    if not isinstance(getattr(model, "_inputs_struct", None), dict):
        return keras.Model.export(model, filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "tf_saved_model":
        return export_saved_model(model, filepath, verbose=verbose,
                                  input_signature=input_signature, **kwargs)
    if format == "onnx":
        if input_signature is not None and keras.config.backend() == "torch":
            raise ValueError(
                "model.export(format='onnx') on PyTorch derives the ONNX inputs itself (dynamic "
                "batch and lengths, see keras_xf.export.export_onnx). Received: "
                f"input_signature={input_signature!r}. For Keras' fixed-shape ONNX export call "
                "keras.Model.export(model, path, format='onnx', input_signature=...)."
            )
        return export_onnx(model, filepath, verbose=bool(verbose), **kwargs)
    if format == "torch":
        return export_torch(model, filepath, verbose=verbose, input_signature=input_signature,
                            **kwargs)
    return keras.Model.export(model, filepath, format=format, verbose=verbose,
                              input_signature=input_signature, **kwargs)


def export_saved_model(model, path, verbose=False, input_signature=None, generate_sampler=None,
                       **kwargs):
    """Writes a TensorFlow SavedModel whose `serve` endpoint runs `model` (inference mode), and
    for a generating task (`CausalLM`, `Seq2SeqLM`, `VisionLanguageLM`) a `generate` endpoint.

    `model.export(path)` (the default format) comes here for keras_xf models. `serve` takes a
    dict of int32 tensors named as the model's inputs and accepts any batch size and sequence
    length (each sequence's inputs sharing theirs). On JAX the computation is lowered with
    `jax2tf` (native serialization, for the platform JAX runs on); pass `jax2tf_kwargs` to
    change that (e.g. `{"native_serialization_platforms": ("cpu", "cuda")}`). keras_xf fills
    in `polymorphic_shapes` (shared batch and per-sequence length symbols for the free
    dimensions of the signature), `polymorphic_constraints` (each length at most the
    backbone's `max_sequence_length`) and `with_gradient=False` (the artefact serves
    inference; jax2tf loses the constraints when it converts the gradient) unless you give
    them.

    `generate` (see `generate_signature`) runs `model.generate`'s cached loop with the sampler
    fixed at export time: it takes the prompts in keras-hub's dict form plus `max_length`,
    `stop_token_ids` and `seed`, and returns `{ids, mask}` as `model.generate` does for a
    dict. `generate_step` is the loop on prompts already packed (left-aligned at the output
    width, `stop_token_ids` holding at least one id: `[-1]` for none).

    Args:
        model: a built functional keras_xf model (`CausalLM`, `Seq2SeqLM`, ...).
        path: the SavedModel folder to write.
        verbose: bool, whether Keras prints the endpoint summary.
        input_signature: `[{name: keras.InputSpec}]` of `serve`; defaults to
            `input_signature(model)` (every dimension but fixed feature sizes free).
        generate_sampler: the sampler of `generate`: `"greedy"`, `"random"`, `"top_k"`,
            `"top_p"` or such a keras-hub sampler (its `k`, `p`, `temperature` are fixed in
            the artefact; its seed comes from the `seed` input); `None`: the model's compile
            sampler (greedy by default); `False`: no `generate` endpoint.
        **kwargs: passed on to Keras' `ExportArchive.add_endpoint` (`jax2tf_kwargs`,
            `is_static`).

    Returns:
        `path`. Load it with `tf.saved_model.load(path)`; call `.serve(inputs)` and
        `.generate(inputs)`.

    Raises:
        ValueError: on the PyTorch backend (see `export_onnx` and `export_torch`), or for a
            `generate_sampler` that is not one of the four above (beam search) or given for a
            model that does not generate.
    """
    backend = keras.config.backend()
    if backend == "torch":
        raise ValueError(
            "A SavedModel (model.export(path), format='tf_saved_model') cannot be written from "
            "the PyTorch backend: Keras exports a torch model as a SavedModel only through "
            "`torch_xla` (StableHLO), which has no release for this torch version, and its "
            "torch SavedModel path does not accept dict inputs. Use "
            "model.export(path, format='onnx') (keras_xf.export.export_onnx) or "
            "model.export('model.pt2', format='torch') (export_torch) instead, or export from "
            "the TensorFlow or JAX backend."
        )
    if backend not in ("tensorflow", "jax"):
        raise ValueError(
            f"export_saved_model needs the TensorFlow or JAX backend. Received: {backend}"
        )
    sampler = _generate_sampler(model, generate_sampler)
    if input_signature is None:
        input_signature = _free_signature(model)
    given_jax2tf_kwargs = kwargs.pop("jax2tf_kwargs", None)
    if backend == "jax":
        kwargs["jax2tf_kwargs"] = _jax2tf_kwargs(model, input_signature, given_jax2tf_kwargs)
    with _portable_top_k():  # endpoints are traced as late as `write_out`
        archive = keras.export.ExportArchive()
        archive.track_and_add_endpoint("serve", model, input_signature, **kwargs)
        if sampler is not None:
            _add_generate_endpoints(archive, model, sampler, given_jax2tf_kwargs)
        archive.write_out(str(path), verbose=True if verbose is None else verbose)
    return path


class _portable_top_k:
    """On JAX, `keras.ops.top_k` (top-k / top-p samplers, expert routers) computed with a
    stable sort while exporting.

    `jax.lax.top_k` lowers to `chlo.top_k`, which this JAX serializes as a StableHLO
    `composite` that the TensorFlow runtime's (older) StableHLO cannot read back, so the
    SavedModel fails when called. A stable descending sort gives the same values and
    indices (ties: lower index first). Nothing changes on other backends."""

    def __enter__(self):
        self._original = None
        if keras.config.backend() != "jax":
            return self
        import jax
        import jax.numpy as jnp

        def top_k(x, k, sorted=True):
            x = jnp.asarray(x)
            indices = jnp.broadcast_to(jnp.arange(x.shape[-1], dtype="int32"), x.shape)
            values, indices = jax.lax.sort((-x, indices), dimension=x.ndim - 1,
                                           is_stable=True, num_keys=1)
            return -values[..., :k], indices[..., :k]

        self._original = keras.ops.top_k
        keras.ops.top_k = top_k
        return self

    def __exit__(self, *exc_info):
        if self._original is not None:
            keras.ops.top_k = self._original
        return False


def _jax2tf_kwargs(model, signature, given=None, extra_shapes=None):
    """`jax2tf_kwargs` with keras_xf's defaults filled in where `given` has none;
    `extra_shapes` adds polymorphic shapes for inputs that are not the model's."""
    jax2tf_kwargs = dict(given or {})
    shapes = _polymorphic_shapes(model, signature)
    if shapes is not None:
        jax2tf_kwargs.setdefault("polymorphic_shapes", [{**shapes, **(extra_shapes or {})}])
        jax2tf_kwargs.setdefault("polymorphic_constraints",
                                  _length_constraints(model, signature))
    # An inference artefact: jax2tf's gradient function drops the constraints above.
    jax2tf_kwargs.setdefault("with_gradient", False)
    return jax2tf_kwargs


# Exported generation -----------------------------------------------------------------------
# Samplers whose loop is keras-hub's `(prompt, cache, index, mask)` loop (not beam search).
GENERATE_SAMPLERS = ("greedy", "random", "top_k", "top_p")


def generate_signature(model):
    """`{name: tf.TensorSpec}` of the `generate` endpoint: the model's inputs (the prompt ids
    and int32 mask under `model.prompt_keys`, and the task's other inputs), `max_length`
    (int32 scalar: the output width), `stop_token_ids` (int32 `[S]`, empty for none) and
    `seed` (int32 scalar: the sampler's seed, as `TopKSampler(seed=seed)`)."""
    import tensorflow as tf

    specs = {name: tf.TensorSpec(spec.shape, spec.dtype, name=name)
             for name, spec in _free_signature(model)[0].items()}
    return {**specs,
            "max_length": tf.TensorSpec((), tf.int32, name="max_length"),
            "stop_token_ids": tf.TensorSpec((None,), tf.int32, name="stop_token_ids"),
            "seed": tf.TensorSpec((), tf.int32, name="seed")}


def _generate_sampler(model, sampler):
    """The sampler of the `generate` endpoint, or `None` for no endpoint."""
    from keras_xf.generation.sampling import get_sampler

    generates = callable(getattr(model, "generate_step", None)) and hasattr(model, "prompt_keys")
    if sampler is False or (sampler is None and not generates):
        return None
    if not generates:
        raise ValueError(
            "generate_sampler is for models that generate (CausalLM, Seq2SeqLM, "
            f"VisionLanguageLM). Received: generate_sampler={sampler!r} for {type(model).__name__}"
        )
    resolved = model.sampler if sampler is None else get_sampler(sampler)
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


def _seeded_sampler(model, sampler, seed):
    """A copy of `sampler` whose loop starts its seed generators at `[seed, 0]` (the state of
    `SeedGenerator(seed)`) and carries them as loop variables.

    A SavedModel endpoint cannot keep the sampler's seed state in a variable, and a loop
    body cannot update one that a `StatelessScope` maps (the body is traced once). The model
    weights are read before the loop and mapped in the body's scope, so that on JAX they stay
    the archive's stateless inputs.
    """
    import copy

    from keras import ops

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


def _add_generate_endpoints(archive, model, sampler, jax2tf_kwargs=None):
    """Adds `generate_step` (the cached loop of `model.generate_step` on packed prompts,
    lowered with jax2tf on JAX) and `generate` (TensorFlow ops that pack the prompts to
    `max_length`, around `generate_step`)."""
    import tensorflow as tf

    from keras_xf.generation.prompts import prefill_length

    ids_key, mask_key = model.prompt_keys
    recurrent = model._has_recurrent_cache()

    def generate_step(inputs):
        inputs = dict(inputs)
        stop_token_ids = inputs.pop("stop_token_ids")
        seed = inputs.pop("seed")
        # A recurrent state must see each token once: the loop feeds the prompt from 1.
        start = 1 if recurrent else prefill_length(inputs[mask_key])
        return model.generate_step(inputs, stop_token_ids=stop_token_ids,
                                   sampler=_seeded_sampler(model, sampler, seed),
                                   use_cache=True, prefill_length=start)

    if keras.config.backend() == "tensorflow":
        # XLA, as `model.generate` compiles it: the same kernels, hence the same random draws
        # for a seed (TensorFlow's stateless random ops differ between XLA and its own
        # kernels). A SavedModel keeps the function's jit_compile flag.
        generate_step = tf.function(generate_step, jit_compile=True, autograph=False)

    signature = generate_signature(model)
    step_signature = {name: spec for name, spec in signature.items() if name != "max_length"}
    kwargs = {}
    if keras.config.backend() == "jax":
        # The user's shapes describe `serve`; the rest (platforms, ...) applies here too.
        given = {key: value for key, value in (jax2tf_kwargs or {}).items()
                 if key not in ("polymorphic_shapes", "polymorphic_constraints")}
        # jax2tf dimension variables are at least 1: `generate` passes `[-1, *stop ids]`.
        kwargs["jax2tf_kwargs"] = _jax2tf_kwargs(
            model, _free_signature(model), given,
            extra_shapes={"stop_token_ids": "(stops,)", "seed": "()"})
    step = archive.add_endpoint("generate_step", generate_step, [step_signature], **kwargs)

    pad = model.pad_token_id
    extra_sequences = sorted({name[: -len("token_ids")] for name in _dict_inputs(model)
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


def export_onnx(model, path, opset_version=None, verbose=False):
    """Writes an ONNX model (PyTorch backend) with dynamic batch and sequence lengths.

    The graph is captured with `torch.export` (batch and each sequence's length symbolic,
    lengths bounded by the backbone's `max_sequence_length`) and translated by torch's
    dynamo ONNX exporter, which needs the `onnx` and `onnxscript` packages. Keras'
    `model.export(format="onnx")` gives the same result for fixed shapes only: with dynamic
    shapes it falls back to the TorchScript tracer, which cannot trace Keras'
    `LayerNormalization` with a symbolic length.

    The ONNX inputs are named as the model's inputs (int32); run it with
    `onnxruntime.InferenceSession(path).run(None, inputs)`.

    Args:
        model: a built functional keras_xf model.
        path: the `.onnx` file to write.
        opset_version: int, the ONNX opset; torch's default when `None`.
        verbose: bool, whether torch prints its export steps.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX (export a SavedModel and convert it), or when
            `onnx` / `onnxscript` are not installed.
    """
    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            "keras_xf.export.export_onnx (model.export(format='onnx')) supports the PyTorch "
            f"backend only. Received: {backend}. "
            "On TensorFlow and JAX, Keras' ONNX export needs `tf2onnx` / `jax2onnx` (not part "
            "of keras_xf's set-up), and Keras' JAX ONNX path gives each input its own length. "
            "Export a SavedModel with model.export(path) (export_saved_model) and convert it: "
            "`python -m tf2onnx.convert --saved-model PATH --output model.onnx`."
        )
    for package in ("onnx", "onnxscript"):
        _require(package, "export_onnx")
    import torch

    names, program = _torch_export_program(model)
    with _quiet_torch_export():
        onnx_program = torch.onnx.export(
            program,
            dynamo=True,
            input_names=names,
            opset_version=opset_version,
            verbose=verbose,
        )
        onnx_program.optimize()
        onnx_program.save(str(path))
    return path


def export_torch(model, path, verbose=False, input_signature=None, **kwargs):
    """Writes a `torch.export` ExportedProgram (`.pt2`, PyTorch backend) with dynamic shapes.

    This is Keras' `model.export(path, format="torch")` with keras_xf's shared batch / length
    dimensions (what `model.export(path, format="torch")` does for keras_xf models). Load it
    with `torch.export.load(path).module()` and call that with the dict of int32 tensors.

    Args:
        model: a built functional keras_xf model.
        path: the file to write; must end with `.pt2`.
        verbose: bool, whether Keras prints a message.
        input_signature: defaults to `input_signature(model)`; with a signature of your own,
            `dynamic_shapes` is not filled in (pass it in `kwargs`).
        **kwargs: passed to `torch.export.export` (`strict`, `dynamic_shapes`, ...).

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX, or when `path` does not end with `.pt2`.
    """
    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            f"export_torch (model.export(format='torch')) needs the PyTorch backend "
            f"(torch.export). Received: {backend}. Use model.export(path) (a SavedModel, "
            "export_saved_model) on TensorFlow and JAX."
        )
    if not str(path).endswith(".pt2"):
        raise ValueError(f"export_torch writes a `.pt2` file. Received: path={path}")
    if input_signature is None:
        input_signature = _free_signature(model)
        kwargs.setdefault("dynamic_shapes", [(_torch_dynamic_shapes(model)[0],)])
    with _quiet_torch_export():
        keras.Model.export(model, str(path), format="torch", input_signature=input_signature,
                           verbose=verbose, **kwargs)
    return path


def export_decode_step(model, path, format="onnx", opset_version=None):
    """Writes a generating task's cached decoding step (PyTorch backend) as ONNX or `.pt2`.

    PyTorch has no SavedModel, so its artefacts hold the pieces of `model.generate`'s loop and
    the caller runs the loop (`docs/export.md` has the greedy loop that reproduces
    `model.generate`'s tokens): `export_prefill` encodes the context and the prompts into
    the cache, this step (`GenerativeTask._decode_token`, the step the loop runs) feeds one
    token. Inputs: `token_ids` int32 `[B, 1]` (the token at `cache_index`), `cache_index`
    int64 scalar, and `cache_0`, `cache_1`, … (the flattened cache: `export_prefill`'s
    outputs; for a `CausalLM` also zeros of `model.init_cache(B, L)`'s shapes, the loop then
    starting at index 1). Outputs: float32 logits `[B, V]` for position `cache_index + 1`,
    then `new_cache_0`, `new_cache_1`, … (the `.pt2` module takes and returns the same
    tensors positionally). Batch, output width `L` (at most the text's
    `max_sequence_length`) and a `Seq2SeqLM`'s source length are dynamic.

    Args:
        model: a built `CausalLM`, `Seq2SeqLM` or `VisionLanguageLM`.
        path: the file to write (`.onnx`, or `.pt2` for `format="torch"`).
        format: `"onnx"` (needs `onnx` and `onnxscript`) or `"torch"`.
        opset_version: int, the ONNX opset; torch's default when `None`.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX (their SavedModel has a `generate` endpoint), for a
            model that does not generate, or an unknown `format`.
    """
    import torch

    _check_generation_export(model, path, format, "export_decode_step")
    samples = _GenerationSamples(model)
    structure = samples.cache()

    class _DecodeStep(torch.nn.Module):
        """One cached step on flat tensors (ONNX inputs and outputs are flat)."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, token_ids, cache_index, *cache):
            cache = keras.tree.pack_sequence_as(structure, list(cache))
            logits, _, cache = self.wrapped._decode_token(token_ids, cache, cache_index)
            return (logits, *keras.tree.flatten(cache))

    flat = keras.tree.flatten(structure)
    names = ["token_ids", "cache_index"] + [f"cache_{i}" for i in range(len(flat))]
    return _write_program(
        model, _DecodeStep(model),
        (torch.ones((2, 1), dtype=torch.int32), torch.tensor(1, dtype=torch.int64), *flat),
        ({0: samples.batch}, None, samples.cache_shapes()),
        names, ["logits"] + [f"new_{name}" for name in names[2:]],
        path, format, opset_version,
    )


def export_prefill(model, path, format="onnx", opset_version=None):
    """Writes a generating task's prefill (PyTorch backend) as ONNX or `.pt2`: the cache that
    `export_decode_step`'s loop starts from.

    The program encodes the context once (a `Seq2SeqLM`'s source through the encoder, a
    `VisionLanguageLM`'s images through the vision encoder; a `CausalLM` has none), writes it
    into an empty cache of the output width (cross-attention keys and values, or the image
    prefix), and writes the prompt tokens in one parallel pass, as `model.generate`'s
    prefill does. Inputs, by name: the prompts `token_ids` (`decoder_token_ids` for a
    `Seq2SeqLM`), int32 `[B, L]`, left-aligned and padded to the output width `L`; then
    `encoder_token_ids` and `encoder_padding_mask` (int32 `[B, S]`, `Seq2SeqLM`) or
    `images` (float32 `[B, H, W, C]`, `VisionLanguageLM`). Outputs: `cache_0`, `cache_1`,
    … , the decoding step's cache inputs. The loop starts at the shortest prompt's length:
    the step overwrites every cache position it attends to from there on. A model whose
    decoder keeps a recurrent state (which must see each token once) gets only the context
    written; its loop starts at index 1. Batch, `L` and `S` are dynamic.

    Args:
        model: a built `CausalLM`, `Seq2SeqLM` or `VisionLanguageLM`.
        path: the file to write (`.onnx`, or `.pt2` for `format="torch"`).
        format: `"onnx"` (needs `onnx` and `onnxscript`) or `"torch"`.
        opset_version: int, the ONNX opset; torch's default when `None`.

    Returns:
        `path`.

    Raises:
        ValueError: on TensorFlow or JAX, for a model that does not generate, or an unknown
            `format`.
    """
    import torch

    _check_generation_export(model, path, format, "export_prefill")
    samples = _GenerationSamples(model)
    extras = samples.extras()
    extra_names = list(extras)
    recurrent = model._has_recurrent_cache()

    class _Prefill(torch.nn.Module):
        """Context and prompts into the cache, on flat tensors."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, token_ids, *extras):
            return tuple(keras.tree.flatten(
                _prefilled_cache(self.wrapped, token_ids, dict(zip(extra_names, extras)),
                                 recurrent)))

    ids_key = model.prompt_keys[0]
    count = len(keras.tree.flatten(samples.cache()))
    return _write_program(
        model, _Prefill(model),
        (torch.ones((2, samples.length), dtype=torch.int32),
         *(torch.from_numpy(value) for value in extras.values())),
        # `forward(token_ids, *extras)`: torch.export sees the extras as one tuple, if any.
        ({0: samples.batch, 1: samples.dims["length"]},
         *([tuple(samples.extra_shapes()[name] for name in extra_names)] if extras else [])),
        [ids_key] + extra_names, [f"cache_{i}" for i in range(count)],
        path, format, opset_version,
    )


def _prefilled_cache(model, token_ids, extras, recurrent):
    """`model.generate`'s cache after its prefill over the whole width of `token_ids`."""
    from keras import ops

    context = model._generation_context(**extras)
    batch_size, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    cache = model._init_generation_cache(batch_size, length, context)
    _, cache = model._prefill(None if recurrent else token_ids, cache, context)
    return cache


def _check_generation_export(model, path, format, function):
    from keras_xf.models.generative.generative_task import GenerativeTask

    backend = keras.config.backend()
    if backend != "torch":
        raise ValueError(
            f"{function} is the PyTorch backend's generation export. Received: {backend}."
            " On TensorFlow and JAX, model.export(path) writes a SavedModel with a `generate` "
            "endpoint."
        )
    if not isinstance(model, GenerativeTask):
        raise ValueError(
            f"{function} exports a CausalLM's, Seq2SeqLM's or VisionLanguageLM's generation. "
            f"Received: {model!r}"
        )
    if format not in ("onnx", "torch"):
        raise ValueError(f"format must be 'onnx' or 'torch'. Received: format={format!r}")
    if format == "onnx":
        for package in ("onnx", "onnxscript"):
            _require(package, function)
    if format == "torch" and not str(path).endswith(".pt2"):
        raise ValueError(f"format='torch' writes a `.pt2` file. Received: path={path}")


class _GenerationSamples:
    """Tracing samples of a generating task's inputs and cache, and their torch.export
    dynamic dimensions: batch, output width `length`, and `encoder_length` (a `Seq2SeqLM`'s
    source)."""

    # torch.export specialises sizes 0 and 1: trace at batch 2 and lengths of at least 2.
    batch_size = 2

    def __init__(self, model):
        import torch

        self.model = model
        # Lengths fit the text's position table where it has one (rotary: unbounded).
        self.max_length = getattr(model._output_embeddings, "max_sequence_length", None)
        self.length = min(6, self.max_length or 6)
        self.encoder_length = min(5, self.max_length or 5)
        self.batch = torch.export.Dim("batch", min=1)
        self.dims = {"length": self._dim("length", 2, self.max_length),
                     "encoder_length": self._dim("encoder_length", 2, self.max_length)}

    @staticmethod
    def _dim(name, low, high):
        import torch

        return torch.export.Dim(name, min=low) if high is None else torch.export.Dim(
            name, min=low, max=int(high))

    def extras(self, encoder_length=None):
        """The task's inputs besides the prompts, as numpy (`generate`'s extras)."""
        shapes = {name: tuple(tensor.shape[1:]) for name, tensor in _dict_inputs(self.model).items()
                  if name not in self.model.prompt_keys}
        length = encoder_length or self.encoder_length
        extras = {}
        for name, shape in shapes.items():
            if len(shape) > 1:  # images: static size
                extras[name] = np.full((self.batch_size,) + shape, 0.5, "float32")
            else:
                extras[name] = np.ones((self.batch_size, length), "int32")
        return extras

    def extra_shapes(self):
        return {name: {0: self.batch} if value.ndim > 2
                else {0: self.batch, 1: self.dims["encoder_length"]}
                for name, value in self.extras().items()}

    def cache(self, length=None, encoder_length=None):
        from keras import ops

        extras = {name: ops.convert_to_tensor(value)
                  for name, value in self.extras(encoder_length).items()}
        context = self.model._generation_context(**extras)
        return self.model._init_generation_cache(self.batch_size, length or self.length, context)

    def cache_shapes(self):
        """Per flat cache tensor, `{axis: Dim}`: the axes that follow the output width or the
        source length (an image prefix adds its fixed length: a dimension of its own)."""
        base = keras.tree.flatten(self.cache())
        longer = keras.tree.flatten(self.cache(length=self.length + 1))
        wider = keras.tree.flatten(self.cache(encoder_length=self.encoder_length + 1))
        shapes = []
        for x, y, z in zip(base, longer, wider):
            axes = {0: self.batch}
            for axis, (a, b, c) in enumerate(zip(x.shape, y.shape, z.shape)):
                if a != b:
                    offset = a - self.length
                    name = "length" if not offset else f"length_plus_{offset}"
                    if name not in self.dims:
                        self.dims[name] = self._dim(
                            name, 2 + offset,
                            None if self.max_length is None else self.max_length + offset)
                    axes[axis] = self.dims[name]
                elif a != c:
                    axes[axis] = self.dims["encoder_length"]
            shapes.append(axes)
        return tuple(shapes)


def _write_program(model, module, args, dynamic_shapes, input_names, output_names, path, format,
                   opset_version):
    """Captures `module(*args)` with torch.export and writes it as `.pt2` or ONNX."""
    import torch

    was_training = model.training
    model.eval()
    try:
        with _quiet_torch_export(), torch.no_grad():
            program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes,
                                          strict=False)
    finally:
        model.train(was_training)
    if format == "torch":
        torch.export.save(program, str(path))
        return path
    with _quiet_torch_export():
        onnx_program = torch.onnx.export(program, dynamo=True, input_names=input_names,
                                         output_names=output_names,
                                         opset_version=opset_version, verbose=False)
        onnx_program.optimize()
        onnx_program.save(str(path))
    _int64_scatter_indices(str(path))
    return path


def _int64_scatter_indices(path):
    """Casts int32 `ScatterND` indices to int64 in the ONNX file at `path`: torch's exporter
    keeps the int32 positions of Keras' cache writes, which ONNX's `ScatterND` (int64 indices
    only) and onnxruntime reject."""
    import onnx

    model = onnx.load(path)
    graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type
             for value in list(graph.value_info) + list(graph.input) + list(graph.output)}
    nodes, cast = [], set()
    for node in graph.node:
        if node.op_type == "ScatterND" and types.get(node.input[1]) == onnx.TensorProto.INT32:
            name = f"{node.input[1]}_int64"
            if name not in cast:
                nodes.append(onnx.helper.make_node("Cast", [node.input[1]], [name],
                                                   to=onnx.TensorProto.INT64))
                cast.add(name)
            node.input[1] = name
        nodes.append(node)
    if cast:
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, path)


def input_signature(model):
    """`[{name: keras.InputSpec([None, None], dtype, name=name)}]`: the model's dict inputs,
    with every dimension but fixed feature sizes left free (Keras' export convention: one
    positional argument holding the whole dict)."""
    return _free_signature(model)


def _free_signature(model):
    # A second name: `export_saved_model` and `export_torch` take an `input_signature` argument.
    inputs = _dict_inputs(model)
    return [
        {
            name: keras.InputSpec(
                shape=(None,) + tuple(tensor.shape[1:]), dtype=tensor.dtype, name=name
            )
            for name, tensor in inputs.items()
        }
    ]


def sequence_dimensions(model):
    """`{input name: (batch symbol, length symbol)}`: inputs of one sequence share a symbol.

    `token_ids` / `padding_mask` → `("batch", "length")`; `encoder_token_ids` →
    `("batch", "encoder_length")`; an input with another name gets a length of its own; an
    input of rank above 2 with static trailing dimensions (`images`) → `("batch",)`.
    """
    dims = {}
    for name, tensor in _dict_inputs(model).items():
        if len(tensor.shape) > 2:
            dims[name] = ("batch",)  # a fixed-shape input (images): only the batch is free
            continue
        for suffix in SEQUENCE_INPUT_SUFFIXES:
            if name.endswith(suffix):
                dims[name] = ("batch", f"{name[: -len(suffix)]}length")
                break
        else:
            dims[name] = ("batch", f"{name}_length")
    return dims


# ----------------------------------------------------------------------------------------
def _dict_inputs(model):
    if not isinstance(model, keras.Model) or not model.built:
        raise ValueError(f"Export needs a built keras.Model. Received: {model!r}")
    inputs = getattr(model, "_inputs_struct", None)
    if not isinstance(inputs, dict):
        raise ValueError(
            "keras_xf.export handles functional models with dict inputs (keras_xf's models). "
            f"Received inputs: {inputs!r}; use `model.export` directly."
        )
    for name, tensor in inputs.items():
        fixed_shape = len(tensor.shape) > 2 and None not in tensor.shape[1:]
        if len(tensor.shape) != 2 and not fixed_shape:
            raise ValueError(
                "keras_xf.export expects [batch, length] inputs, or inputs whose dimensions "
                f"after the batch are static (images). Received: {name} with shape {tensor.shape}"
            )
    return inputs


def _polymorphic_shapes(model, signature):
    """jax2tf `polymorphic_shapes` for the dict argument, e.g. `"(batch, length)"`: the free
    dimensions of `signature` get keras_xf's shared symbols, the others their size. `None`
    when `signature` is not one dict with the model's input names (Keras' defaults apply)."""
    inputs = _dict_inputs(model)
    if not (isinstance(signature, (list, tuple)) and len(signature) == 1
            and isinstance(signature[0], dict) and set(signature[0]) == set(inputs)):
        return None
    shapes = {}
    for name, dims in sequence_dimensions(model).items():
        sizes = tuple(signature[0][name].shape)
        symbols = list(dims) + [None] * (len(sizes) - len(dims))
        shapes[name] = "({})".format(", ".join(
            str(size) if size is not None or symbol is None else symbol
            for size, symbol in zip(sizes, symbols)
        ))
    return shapes


def _length_constraints(model, signature):
    """`("length <= 512", ...)` for the lengths left free in `signature`: lengths fit the
    backbone's position table (learned positions slice it, which jax2tf must prove in
    bounds)."""
    max_length = _max_length(model)
    if max_length is None:
        return ()
    lengths = sorted({dims[1] for name, dims in sequence_dimensions(model).items()
                      if len(dims) > 1 and tuple(signature[0][name].shape)[1] is None})
    return tuple(f"{length} <= {max_length}" for length in lengths)


def _max_length(model):
    backbone = getattr(model, "backbone", model)
    length = getattr(backbone, "max_sequence_length", None)
    return int(length) if length else None


def _torch_dynamic_shapes(model):
    """torch.export `dynamic_shapes` for the dict argument, and a sample batch for tracing."""
    import torch

    max_length = _max_length(model)
    # torch.export specialises dimensions whose sample value is 0 or 1: trace with 2 and 3.
    sample_length = 3 if max_length is None else min(3, max_length)
    symbols = {"batch": torch.export.Dim("batch", min=1)}
    shapes, sample = {}, {}
    for name, dims in sequence_dimensions(model).items():
        tensor = _dict_inputs(model)[name]
        dtype = getattr(torch, keras.backend.standardize_dtype(tensor.dtype))
        if len(dims) == 1:  # a fixed-shape input: only the batch is dynamic
            shapes[name] = {0: symbols[dims[0]]}
            sample[name] = torch.ones((2,) + tuple(tensor.shape[1:]), dtype=dtype)
            continue
        batch, length = dims
        if length not in symbols:
            symbols[length] = torch.export.Dim(length, min=1, max=max_length)
        shapes[name] = {0: symbols[batch], 1: symbols[length]}
        sample[name] = torch.ones((2, sample_length), dtype=dtype)
    return shapes, sample


def _torch_export_program(model):
    """`(input names, ExportedProgram)` of `model` called on a flat tuple of its inputs."""
    import torch

    dynamic_shapes, sample = _torch_dynamic_shapes(model)
    names = list(sample)

    class _FlatInputs(torch.nn.Module):
        """Calls the model with a dict rebuilt from positional tensors (ONNX inputs are flat)."""

        def __init__(self, wrapped):
            super().__init__()
            self.wrapped = wrapped

        def forward(self, *tensors):
            return self.wrapped(dict(zip(names, tensors)), training=False)

    was_training = model.training
    model.eval()
    try:
        with _quiet_torch_export():
            program = torch.export.export(
                _FlatInputs(model),
                tuple(sample[name] for name in names),
                # `forward(*tensors)`: torch.export sees one argument, the tuple.
                dynamic_shapes=[tuple(dynamic_shapes[name] for name in names)],
                strict=False,
            )
    finally:
        model.train(was_training)
    return names, program


def _require(package, function):
    import importlib.util

    if importlib.util.find_spec(package) is None:
        raise ValueError(
            f"{function} needs the `{package}` package: pip install onnx onnxscript "
            "(and onnxruntime to run the result)."
        )


class _quiet_torch_export:
    """Silences the warnings torch.export / torch.onnx raise for Keras' layer bookkeeping."""

    # torch.onnx logs one warning per torchvision operator it cannot register.
    _LOGGER = "torch.onnx._internal.exporter._registration"

    def __enter__(self):
        import logging
        import warnings

        self._context = warnings.catch_warnings()
        self._context.__enter__()
        for message in (
            r".*not properly registered as a submodule.*",
            r".*created when tracing.*",
            r".*Unable to find the path of the module.*",
            r".*get_attr.*",
            r".*LeafSpec.*",
        ):
            warnings.filterwarnings("ignore", message=message)
        self._logger = logging.getLogger(self._LOGGER)
        self._level = self._logger.level
        self._logger.setLevel(logging.ERROR)
        return self

    def __exit__(self, *exc_info):
        self._logger.setLevel(self._level)
        return self._context.__exit__(*exc_info)
