"""Vision Transformer backbone: image patches through a Transformer encoder (survey §6.4)."""

import keras

from keras_xf.layers.embeddings.class_token import ClassToken
from keras_xf.layers.embeddings.patch_embedding import PatchEmbedding
from keras_xf.layers.embeddings.patch_position_embedding import PatchPositionEmbedding
from keras_xf.models.backbones.arguments import block_template
from keras_xf.models.backbones.arguments import check_image_shape
from keras_xf.models.backbones.arguments import check_model_arguments
from keras_xf.models.backbones.arguments import check_stack_options
from keras_xf.models.backbones.arguments import record_config
from keras_xf.models.backbones.functional_model import FunctionalModel
from keras_xf.models.backbones.functional_model import layer_dtype
from keras_xf.models.backbones.block_factory import build_stack
from keras_xf.models.backbones.block_factory import prepare_block

POSITIONS = ("learned", "sinusoidal_2d", "none")


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
        class_token_position: bool, give the `[CLS]` token a learned position vector of its
            own (`ClassToken(position=True)`), as ViT checkpoints do.
        num_key_value_heads: int for MQA / GQA in the default block.
        activation: feedforward activation of the default block (`"gelu"`).
        norm_placement: `"pre"` (default, with a final norm) or `"post"` for the default block.
        normalization: `"layer_norm"`, `"rms_norm"` or `"offset_rms_norm"` for the default
            block.
        dropout: float, dropout of the embeddings and of the default block.
        depth_initialization: optional dict, the stack's depth-aware initialisation of its
            projection kernels (survey §4.2.2; see `TransformerStack`).
        stack_options: optional dict of further `TransformerStack` arguments (fusion,
            layer drop, parameter sharing, multi-step residuals; see `TransformerBackbone`).
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
        class_token_position=False,
        num_key_value_heads=None,
        activation="gelu",
        norm_placement="pre",
        normalization="layer_norm",
        dropout=0.0,
        depth_initialization=None,
        stack_options=None,
        dtype=None,
        **kwargs,
    ):
        check_model_arguments(locals())
        image_shape = check_image_shape(image_shape, patch_size)
        stack_options = check_stack_options(stack_options)
        if positions not in POSITIONS:
            raise ValueError(f"positions must be one of {POSITIONS}. Received: positions={positions!r}")
        block = block_template(block, locals())
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
        if class_token_position and not class_token:
            raise ValueError("class_token_position=True needs class_token=True. Received: "
                             "class_token=False")
        self.class_token = None
        if class_token:
            self.class_token = ClassToken(position=class_token_position, dtype=policy,
                                          name="class_token")
        self.embedding_dropout = None
        if dropout > 0:
            self.embedding_dropout = keras.layers.Dropout(
                dropout, dtype=policy, name="embedding_dropout"
            )
        self.transformer_stack = build_stack(
            template, num_layers, policy, "transformer_stack",
            depth_initialization=depth_initialization, stack_options=stack_options,
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
        record_config(self, locals(), attributes={"class_token": "use_class_token"})

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
