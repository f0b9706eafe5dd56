"""The layers of a `TransformerStack` run one at a time with the stack's options, under an
optional per-layer `LayerControl` (survey §4.2.3, §4.2.4, §4.3, §5.4, §5.6)."""

import functools

from keras import ops

from keras_xf.layers.block_contract import split_results

# The extras a layer returns at the stack's own request, by the argument that asks for them.
_REQUESTS = {"return_attention_scores": "attention_scores", "return_bias_terms": "bias_terms"}


class LayerRunner:
    """Runs the layers of a `TransformerStack`, each step with every option of the stack.

    Layers are numbered `l = 1 … L` as in `TransformerStack` (`index = l − 1` in code):
    `Z^l` is the input of layer `l`, `Z^1 = z^0` the stack's input and `Z^{L+1}` its output
    before the final norm. The runner's state between layers (its `carry`) is a dict of
    tensors: `"hidden"`, the next layer's input `Z^l`; `"states"` `(z^0, …, z^{l−1})` with
    fusion or multi-step residuals; `"increments"` `(f^{l−1}, …, f^1)`, newest first, with
    multi-step residuals; `"caches"`, one cache per layer (the given ones until a layer
    writes its own); and what the layers share: `"attention_scores"`, the weights of the
    current group (`share_attention_maps`), and `"bias_terms"` of the first layer
    (`share_score_biases`).

    Layer `l` (`run_layer`): the block on `Z^l` (with its cache, and the shared weights or
    bias terms when the stack shares them), then `z^l` from the increment
    `f^l = Block^l(Z^l) − Z^l` by layer drop or the multi-step residual (`z^l =
    Block^l(Z^l)` without either), then `Z^{l+1} = φ_l(z^0, …, z^l)` with fusion
    (`Z^{l+1} = z^l` without). A skipped layer (`skip_layer`) is the identity, `f^l = 0`,
    combined in the same way; its block is not called, only its mixer sub-layer where the
    layer must leave a cache or shared attention weights behind (`fill_cache`). Under a
    `LayerControl` (`run`) each layer runs inside `keras.ops.cond`, whose skipping branch is
    taken when no row runs it.

    Args:
        stack: a `TransformerStack`.
        padding_mask, attention_mask, encoder_outputs, encoder_padding_mask,
            use_causal_mask, cache_index, training: the generic call arguments given to
            every block (see `TransformerStack.call`).
        cache: `None`, or a tuple with one cache per layer.
        mixer_kwargs: dict of mixer-specific call arguments given to every layer.
        share_bias_terms: bool, the first layer's `positions_only` score-bias terms serve
            every layer (a stack with shared score biases whose layers attend over the same
            positions); otherwise each layer computes them, with the same values.
    """

    def __init__(self, stack, padding_mask=None, attention_mask=None, encoder_outputs=None,
                 encoder_padding_mask=None, use_causal_mask=None, cache=None, cache_index=None,
                 training=None, mixer_kwargs=None, share_bias_terms=False):
        if cache is not None and len(cache) != stack.num_layers:
            raise ValueError(
                f"cache must hold one entry per layer ({stack.num_layers}). Received: "
                f"{len(cache)} entries"
            )
        self.stack = stack
        self.arguments = {
            "padding_mask": padding_mask,
            "attention_mask": attention_mask,
            "encoder_outputs": encoder_outputs,
            "encoder_padding_mask": encoder_padding_mask,
            "use_causal_mask": use_causal_mask,
            "cache_index": cache_index,
            "training": training,
        }
        self.cache = cache
        self.mixer_kwargs = dict(mixer_kwargs or {})
        self.share_bias_terms = share_bias_terms

    def start(self, inputs):
        """The carry before the first layer, `Z^1 = inputs`."""
        stack = self.stack
        carry = {"hidden": inputs}
        if stack.fusions or stack.multisteps:
            carry["states"] = (inputs,)
        if stack.multisteps:
            carry["increments"] = ()
        if self.cache is not None:
            carry["caches"] = tuple(self.cache)
        return carry

    def run(self, inputs, control):
        """Every layer under `control` (a `LayerControl`): `(carry, control_carry)`."""
        carry, state = self.start(inputs), control.start(inputs)
        for index in range(self.stack.num_layers):
            rows = control.rows(index, carry["hidden"], state)
            stopped = control.stopped(state)
            run = functools.partial(self._controlled_layer, index, control, rows, stopped)
            active = _active_rows(rows, stopped)
            if active is None:
                carry, state = run(carry, state)
                continue
            skip = functools.partial(self._skipped_layer, index, control, rows, stopped)
            carry, state = ops.cond(ops.any(active),
                                    lambda run=run, c=carry, s=state: run(c, s),
                                    lambda skip=skip, c=carry, s=state: skip(c, s))
        return carry, state

    def _controlled_layer(self, index, control, rows, stopped, carry, state):
        def update(inputs, outputs):
            return control.update(index, inputs, outputs, state)

        carry, _ = self.run_layer(index, carry, update=update, rows=rows, stopped=stopped)
        return carry, control.after(index, carry["hidden"], state, rows)

    def _skipped_layer(self, index, control, rows, stopped, carry, state):
        carry = self.skip_layer(index, carry, stopped=stopped)
        return carry, control.skipped(index, carry["hidden"], state, rows)

    def run_layer(self, index, carry, update=None, rows=None, stopped=None, output_length=None):
        """Layer `index` on `carry["hidden"]`: `(carry, extras)`, `extras` the block's extra
        results the caller asked for (a dict, or `None`).

        Args:
            update: optional function `(inputs, outputs) -> outputs` applied to the block's
                outputs before the stack combines them (e.g. a skip gate).
            rows: optional bool `[B]`: the rows that run the layer (the others pass it as
                the identity).
            stopped: optional bool `[B]`: the rows whose state stays as it is.
            output_length: optional int: the block computes the first positions only.
        """
        block = self.stack.blocks[index]
        inputs = carry["hidden"]
        requests = self._sharing_arguments(index, carry)
        first_rows = {} if output_length is None else {"output_length": output_length}
        results = block(inputs, **self.arguments, cache=self._layer_cache(index, carry),
                        **first_rows, **dict(self.mixer_kwargs, **requests))
        outputs, layer_cache, extras = split_results(results, self.cache is not None)
        carry = self._keep(index, carry, layer_cache, requests, extras)
        if extras is not None:
            internal = _requested(requests, self.mixer_kwargs)
            extras = {key: value for key, value in extras.items() if key not in internal}
        if update is not None:
            outputs = update(inputs, outputs)
        if rows is not None:
            outputs = ops.where(rows[:, None, None], ops.cast(outputs, inputs.dtype), inputs)
        carry = self._combine(index, inputs, outputs, carry)
        return _freeze(carry, inputs, stopped), extras or None

    def skip_layer(self, index, carry, stopped=None):
        """Layer `index` as the identity for every row; its mixer sub-layer runs only for the
        cache or shared weights it leaves behind (`fill_cache` of its block)."""
        inputs = carry["hidden"]
        requests = self._sharing_arguments(index, carry)
        if self.cache is not None or requests.keys() & _REQUESTS.keys():
            layer_cache, extras = self.stack.blocks[index].fill_cache(
                inputs, **self.arguments, cache=self._layer_cache(index, carry),
                **dict(self.mixer_kwargs, **requests))
            carry = self._keep(index, carry, layer_cache, requests, extras)
        carry = self._combine(index, inputs, None, carry)
        return _freeze(carry, inputs, stopped)

    def new_caches(self, carry):
        """The tuple of new caches after the last layer."""
        return carry["caches"]

    def _layer_cache(self, index, carry):
        return None if self.cache is None else carry["caches"][index]

    def _sharing_arguments(self, index, carry):
        """Layer `index` returns its attention weights when it starts a sharing group with
        later members and uses the group's otherwise; the first layer returns the shared
        bias terms and the others use them."""
        stack = self.stack
        arguments = {}
        k = stack.share_attention_maps
        if k > 1 and index % k:
            arguments["attention_weights"] = carry["attention_scores"]
        elif k > 1 and index + 1 < stack.num_layers:
            arguments["return_attention_scores"] = True
        if self.share_bias_terms and index:
            arguments["bias_terms"] = carry["bias_terms"]
        elif self.share_bias_terms and stack.num_layers > 1:
            arguments["return_bias_terms"] = True
        return arguments

    def _keep(self, index, carry, layer_cache, requests, extras):
        """The carry with the layer's new cache and the extras the stack asked for."""
        carry = dict(carry)
        if self.cache is not None:
            caches = list(carry["caches"])
            caches[index] = layer_cache
            carry["caches"] = tuple(caches)
        for request, key in _REQUESTS.items():
            if request in requests:
                carry[key] = extras[key]
        return carry

    def _combine(self, index, inputs, outputs, carry):
        """The carry after layer `index` from its block's `outputs` (`None`: the identity):
        layer drop or the multi-step residual on the increment, then fusion."""
        stack = self.stack
        carry = dict(carry)
        training = self.arguments.get("training")
        state = inputs if outputs is None else outputs
        if stack.multisteps:
            increment = ops.zeros_like(inputs) if outputs is None else outputs - inputs
            if stack.layer_dropper is not None and outputs is not None:
                increment = stack.layer_dropper(increment, training=training)
            carry["increments"] = (increment,) + carry["increments"]
            state = stack.multisteps[index](ops.stack(carry["states"][::-1], axis=-2),
                                            ops.stack(carry["increments"], axis=-2))
        elif stack.layer_dropper is not None and outputs is not None:
            state = inputs + stack.layer_dropper(outputs - inputs, training=training)
        if "states" in carry:
            carry["states"] = carry["states"] + (state,)
        if stack.fusions:
            state = stack.fusions[index](ops.stack(carry["states"], axis=-2), training=training)
        carry["hidden"] = state
        return carry


def _requested(requests, mixer_kwargs):
    """The extras asked for by the stack alone (not also by the caller)."""
    return {key for request, key in _REQUESTS.items()
            if request in requests and not mixer_kwargs.get(request)}


def _active_rows(rows, stopped):
    """Bool `[B]`: the rows that run a layer and have not stopped; `None`: every row."""
    if stopped is None:
        return rows
    running = ops.logical_not(stopped)
    return running if rows is None else ops.logical_and(rows, running)


def _freeze(carry, inputs, stopped):
    """The carry with the state of the `stopped` rows kept at `inputs`."""
    if stopped is not None:
        carry["hidden"] = ops.where(stopped[:, None, None], inputs, carry["hidden"])
    return carry
