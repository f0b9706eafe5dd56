"""The per-layer control of early-exit inference: each row stops at the first exit whose
criterion holds (survey §5.6)."""

from keras import ops

from keras_xf.layers.blocks.layer_control import LayerControl
from keras_xf.ops.exit_criteria import exit_decision


class EarlyExitControl(LayerControl):
    """Stops each row of a stack's run at its first exit whose criterion holds.

    At each exit layer `l` (survey §5.6) the exit gives logits `p^l` and a state `s^l`; a row
    stops there when `exit_decision(criterion, threshold, …)` holds (`keras_xf.ops.
    exit_criteria`: entropy, maximum probability, state similarity with the previous exit's
    state, patience), always at the last layer. A stopped row keeps its logits and exit layer,
    and the stack freezes its state (the later layers cache the keys and values of the exit
    state); once every row has stopped the stack skips the remaining layers
    (`TransformerStack.run_layers`).

    Carry: `"logits"` float32 `[B, C]` (each row's answer, frozen once it stops),
    `"exit_layer"` int32 `[B]` (`1 … L`, 0 before any exit), `"done"` bool `[B]`, and what the
    criteria compare: `"previous_logits"`, `"states"` (the last exit's, the embeddings'
    before the first), `"count"` (the run of unchanged predictions).

    Args:
        exit_layers: increasing layer numbers `1 … L` carrying an exit, ending with `L`.
        num_layers: int `L`.
        num_outputs: int `C`, the width of the exits' logits.
        read_exit: function `(exit_index, state) -> (logits [B, C], states [B, d])`, both
            float32: exit number `exit_index` (0-based) on a layer's output state.
        read_state: function `state -> states [B, d]` (float32): what the criteria compare,
            from the stack's input.
        rule: `(criterion, threshold)` as `check_exit_rule` gives it, or `None`: no row stops
            before the last layer.
        eligible: optional bool `[B]`: the rows that may stop early (others stop at `L`).

    Example:
    >>> control = EarlyExitControl([2, 4], 4, num_classes, read_exit, read_state,
    ...                            rule=("entropy", 0.3))
    >>> carry = stack.run_layers(x, control)["control"]
    >>> carry["logits"], carry["exit_layer"]
    """

    def __init__(self, exit_layers, num_layers, num_outputs, read_exit, read_state, rule=None,
                 eligible=None):
        self.exit_layers = list(exit_layers)
        self.num_layers = num_layers
        self.num_outputs = num_outputs
        self.read_exit = read_exit
        self.read_state = read_state
        self.rule = rule
        self.eligible = eligible

    def start(self, state):
        batch = ops.shape(state)[0]
        no_logits = ops.zeros((batch, self.num_outputs), "float32")
        return {
            "logits": no_logits,
            "previous_logits": no_logits,
            "states": self.read_state(state),
            "count": ops.zeros((batch,), "int32"),
            "done": ops.zeros((batch,), "bool"),
            "exit_layer": ops.zeros((batch,), "int32"),
        }

    def stopped(self, carry):
        return carry["done"]

    def after(self, index, state, carry, rows):
        """Exit `l = index + 1` when the layer has one: the rows still running take its
        logits and stop where the rule holds."""
        layer = index + 1
        if layer not in self.exit_layers:
            return carry
        exit_index = self.exit_layers.index(layer)
        logits, states = self.read_exit(exit_index, state)
        done, count = carry["done"], carry["count"]
        if layer == self.num_layers:
            exits = ops.ones_like(done)
        elif self.rule is None:
            exits = ops.zeros_like(done)
        else:
            exits, count = exit_decision(self.rule[0], self.rule[1], logits, states,
                                         carry["previous_logits"], carry["states"], count,
                                         first=exit_index == 0)
            if self.eligible is not None:
                exits = ops.logical_and(exits, self.eligible)
        return dict(
            carry,
            logits=ops.where(done[:, None], carry["logits"], logits),
            exit_layer=ops.where(done, carry["exit_layer"], ops.cast(layer, "int32")),
            done=ops.logical_or(done, exits),
            count=ops.cast(count, "int32"),
            states=states,
            previous_logits=logits,
        )
