"""Vision Transformer backbone: image patches through a Transformer encoder (survey §6.4)."""

import numbers

import keras

from keras_xf.layers.blocks.transformer_stack import TransformerStack
from keras_xf.layers.embeddings.class_token import ClassToken
from keras_xf.layers.embeddings.patch_embedding import PatchEmbedding
from keras_xf.layers.embeddings.patch_position_embedding import PatchPositionEmbedding
from keras_xf.models.backbone import FunctionalModel
from keras_xf.models.backbone import layer_dtype
from keras_xf.models.block_factory import default_block
from keras_xf.models.block_factory import prepare_block

POSITIONS = ("learned", "sinusoidal_2d", "none")


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive int. Received: {name}={value!r}")
    return int(value)


def _image_shape(image_shape, patch_size):
    try:
        shape = tuple(image_shape)
    except TypeError:
        shape = ()
    if len(shape) != 3 or any(
        isinstance(v, bool) or not isinstance(v, numbers.Integral) or v <= 0 for v in shape
    ):
        raise ValueError(
            "image_shape must be (height, width, channels) of positive ints. "
            f"Received: image_shape={image_shape!r}"
        )
    height, width, _ = shape
    if height % patch_size or width % patch_size:
        raise ValueError(
            "The image height and width must be divisible by patch_size. Received: "
            f"image_shape={shape}, patch_size={patch_size}"
        )
    return tuple(int(v) for v in shape)


@keras.saving.register_keras_serializable(package="keras_xf")
class VisionBackbone(FunctionalModel):
    """Images to contextual patch states (ViT): `H^L = Stack([x_cls, E(x_n) + p_n])`.

    Survey §6.4: an `H × W × C` image is cut into `N = HW/P²` patches, each flattened and
    mapped linearly to `d` (`PatchEmbedding`), summed with its position embedding
    (`PatchPositionEmbedding`), optionally preceded by a learned `[CLS]` token (`ClassToken`)
    and encoded by a Transformer encoder (no causal mask, no padding). The layers come from
    one block template (`block=`), so any non-causal mixer composes into the model (GQA, a
    state-space mixer, linear attention, ...); without a template a pre-norm
    `MultiHeadAttention` + GELU `FeedForward` block is built, as in ViT.

    Args:
        image_shape: `(height, width, channels)`, height and width divisible by `patch_size`.
        patch_size: int, the patch side `P`.
        num_layers: int, `L`.
        hidden_dim: int, `d`.
        num_heads: int (needed without `block`).
        intermediate_dim: int, `d_ffn` (needed without `block`).
        block: optional `TransformerBlock` template.
        positions: `"learned"` (default), `"sinusoidal_2d"` or `"none"`.
        class_token: bool, prepend a learned `[CLS]` token (output length `N + 1`).
        num_key_value_heads: int for MQA / GQA in the default block.
        activation: feedforward activation of the default block (`"gelu"`).
        norm_placement: `"pre"` (default, with a final norm) or `"post"` for the default block.
        normalization: `"layer_norm"` or `"rms_norm"` for the default block.
        dropout: float, dropout of the embeddings and of the default block.
        dtype: a dtype policy name or object.

    Inputs: `{"images": [B, H, W, C]}` (channels last; integer images are cast).
    Outputs: `[B, N (+1), d]` hidden states, the `[CLS]` state first when `class_token`.

    Example:
    >>> backbone = VisionBackbone(image_shape=(8, 8, 1), patch_size=2, num_layers=2,
    ...                           hidden_dim=32, num_heads=4, intermediate_dim=64)
    >>> h = backbone({"images": np.zeros((2, 8, 8, 1), "float32")})  # [2, 17, 32]
    """

    def __init__(
        self,
        image_shape,
        patch_size,
        num_layers,
        hidden_dim,
        num_heads=None,
        intermediate_dim=None,
        block=None,
        positions="learned",
        class_token=True,
        num_key_value_heads=None,
        activation="gelu",
        norm_placement="pre",
        normalization="layer_norm",
        dropout=0.0,
        dtype=None,
        **kwargs,
    ):
        patch_size = _positive_int("patch_size", patch_size)
        image_shape = _image_shape(image_shape, patch_size)
        num_layers = _positive_int("num_layers", num_layers)
        hidden_dim = _positive_int("hidden_dim", hidden_dim)
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}. Received: positions={positions!r}")
        if not isinstance(class_token, bool):
            raise ValueError(f"class_token must be a bool. Received: class_token={class_token!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be a float in [0, 1). Received: dropout={dropout!r}")
        if block is None:
            block = default_block(
                num_heads,
                intermediate_dim,
                num_key_value_heads=num_key_value_heads,
                activation=activation,
                norm_placement=norm_placement,
                normalization=normalization,
                dropout=dropout,
            )
        template = prepare_block(block, "none")
        policy = layer_dtype(dtype)
        grid = (image_shape[0] // patch_size, image_shape[1] // patch_size)

        # Layers
        self.patch_embedding = PatchEmbedding(
            patch_size, hidden_dim, dtype=policy, name="patch_embedding"
        )
        self.position_embedding = None
        if positions != "none":
            self.position_embedding = PatchPositionEmbedding(
                grid, kind=positions, dtype=policy, name="position_embedding"
            )
        self.class_token = ClassToken(dtype=policy, name="class_token") if class_token else None
        self.embedding_dropout = None
        if dropout > 0:
            self.embedding_dropout = keras.layers.Dropout(
                dropout, dtype=policy, name="embedding_dropout"
            )
        self.transformer_stack = TransformerStack(
            template, num_layers, dtype=policy, name="transformer_stack"
        )

        # Functional model
        images = keras.Input(shape=image_shape, name="images")
        hidden = self.patch_embedding(images)
        if self.position_embedding is not None:
            hidden = hidden + self.position_embedding(hidden)
        if self.class_token is not None:
            hidden = self.class_token(hidden)
        if self.embedding_dropout is not None:
            hidden = self.embedding_dropout(hidden)
        hidden = self.transformer_stack(hidden)
        super().__init__(inputs={"images": images}, outputs=hidden, dtype=dtype, **kwargs)

        # Config
        self.image_shape = image_shape
        self.patch_size = patch_size
        self.num_layers = num_layers
        self.hidden_dim = hidden_dim
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.block = keras.saving.serialize_keras_object(block) if isinstance(
            block, keras.layers.Layer) else block
        self.positions = positions
        self.use_class_token = class_token
        self.num_key_value_heads = num_key_value_heads
        self.activation = activation
        self.norm_placement = norm_placement
        self.normalization = normalization
        self.dropout = dropout

    @property
    def grid_size(self):
        """`(rows, cols)` of the patch grid."""
        return (self.image_shape[0] // self.patch_size, self.image_shape[1] // self.patch_size)

    @property
    def num_patches(self):
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self):
        """Positions before the patches in the output (1 with a `[CLS]` token, else 0)."""
        return int(self.use_class_token)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "image_shape": list(self.image_shape),
                "patch_size": self.patch_size,
                "num_layers": self.num_layers,
                "hidden_dim": self.hidden_dim,
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "block": self.block,
                "positions": self.positions,
                "class_token": self.use_class_token,
                "num_key_value_heads": self.num_key_value_heads,
                "activation": self.activation,
                "norm_placement": self.norm_placement,
                "normalization": self.normalization,
                "dropout": self.dropout,
            }
        )
        return config
