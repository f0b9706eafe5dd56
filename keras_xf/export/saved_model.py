"""TensorFlow SavedModels (TensorFlow and JAX backends): `serve`, and `generate` for a
generating task."""

import keras

from keras_xf.export.endpoints import model_endpoints
from keras_xf.export.generate_endpoint import add_generate_endpoints
from keras_xf.export.generate_endpoint import resolve_generate_sampler
from keras_xf.export.signatures import free_signature
from keras_xf.export.signatures import jax2tf_kwargs


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
    model's `max_sequence_length`) and `with_gradient=False` (the artefact serves
    inference; jax2tf loses the constraints when it converts the gradient) unless you give
    them.

    `generate` (see `generate_signature`) runs `model.generate`'s cached loop with the sampler
    fixed at export time: it takes the prompts in keras-hub's dict form plus `max_length`,
    `stop_token_ids` and `seed`, and returns `{ids, mask}` as `model.generate` does for a
    dict. `generate_step` is the loop on prompts already packed (left-aligned at the output
    width, `stop_token_ids` holding at least one id: `[-1]` for none).

    Args:
        model: a built functional keras_xf model (`CausalLM`, `Seq2SeqLM`, ...), or the
            `ExportEndpoints` it declares (`model.export_endpoints()`).
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
    endpoints = model_endpoints(model)
    sampler = resolve_generate_sampler(endpoints, generate_sampler)
    if input_signature is None:
        input_signature = free_signature(endpoints)
    given_jax2tf_kwargs = kwargs.pop("jax2tf_kwargs", None)
    if backend == "jax":
        kwargs["jax2tf_kwargs"] = jax2tf_kwargs(endpoints, input_signature, given_jax2tf_kwargs)
    with portable_top_k():  # endpoints are traced as late as `write_out`
        archive = keras.export.ExportArchive()
        archive.track_and_add_endpoint("serve", endpoints.serve, input_signature, **kwargs)
        if sampler is not None:
            add_generate_endpoints(archive, endpoints, sampler, given_jax2tf_kwargs)
        archive.write_out(str(path), verbose=True if verbose is None else verbose)
    return path


class portable_top_k:
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
