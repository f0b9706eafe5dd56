"""Every public model checks its call inputs and its hyperparameters the same way on every
backend: a `ValueError` naming the input or argument, with what was expected and received."""

import numpy as np
import pytest

from keras_xf.models import CausalLM
from keras_xf.models import Seq2SeqBackbone
from keras_xf.models import TextClassifier
from keras_xf.models import TextEncoder
from keras_xf.models import TransformerBackbone
from keras_xf.models import VisionBackbone
from keras_xf.models import VisionClassifier
from keras_xf.models import VisionLanguageEncoder
from tests.models.tiny import FFN
from tests.models.tiny import HEADS
from tests.models.tiny import SIZES
from tests.models.tiny import WIDTH

IMAGE = (4, 4, 1)
VISION = dict(image_shape=IMAGE, patch_size=2, num_layers=1, hidden_dim=WIDTH, num_heads=HEADS,
              intermediate_dim=FFN)
TEXT_MODELS = {
    "TransformerBackbone": lambda: TransformerBackbone(num_layers=1, **SIZES),
    "CausalLM": lambda: CausalLM(num_layers=1, **SIZES),
    "TextClassifier": lambda: TextClassifier(2, num_layers=1, **SIZES),
    "TextEncoder": lambda: TextEncoder(num_layers=1, **SIZES),
    "VisionLanguageEncoder": lambda: VisionLanguageEncoder(
        vocabulary_size=SIZES["vocabulary_size"], max_sequence_length=8, **VISION),
}
IMAGE_MODELS = {
    "VisionBackbone": lambda: VisionBackbone(**VISION),
    "VisionClassifier": lambda: VisionClassifier(3, **VISION),
    "VisionLanguageEncoder": TEXT_MODELS["VisionLanguageEncoder"],
}


def ids(length=5, batch=2):
    return np.ones((batch, length), "int32")


def text_inputs(model, **changes):
    inputs = {"token_ids": ids(), "padding_mask": ids()}
    if "images" in model.input:
        inputs["images"] = np.zeros((2,) + IMAGE, "float32")
    inputs.update(changes)
    return {k: v for k, v in inputs.items() if v is not None}


@pytest.fixture(scope="module", params=sorted(TEXT_MODELS))
def text_model(request):
    return TEXT_MODELS[request.param]()


@pytest.mark.parametrize(
    "changes,match",
    [
        (dict(padding_mask=ids(6)), r"padding_mask must have shape \[batch, length\] = \(2, 5\), "
         r"matching token_ids.shape=\(2, 5\). Received: padding_mask.shape=\(2, 6\)"),
        (dict(padding_mask=ids(5, batch=3)), r"Received: padding_mask.shape=\(3, 5\)"),
        (dict(padding_mask=np.ones((2,), "int32")),
         r"padding_mask must have rank 2 \[batch, length\]. Received: padding_mask.shape=\(2,\)"),
        (dict(token_ids=np.ones((2, 5, 1), "int32")),
         r"token_ids must have rank 2 \[batch, length\]. Received: token_ids.shape=\(2, 5, 1\)"),
        (dict(padding_mask=None), r"Missing: \['padding_mask'\]"),
        (dict(segment_ids=ids()), r"unexpected: \['segment_ids'\]"),
    ],
)
def test_bad_text_inputs_raise_naming_the_input(text_model, changes, match):
    with pytest.raises(ValueError, match=match):
        text_model(text_inputs(text_model, **changes))


def test_text_inputs_must_be_a_dict(text_model):
    with pytest.raises(ValueError, match=r"expects a dict of inputs with keys \[.*'token_ids'"):
        text_model(ids())


@pytest.mark.parametrize("name", sorted(IMAGE_MODELS))
def test_bad_images_raise_naming_the_input(name):
    model = IMAGE_MODELS[name]()
    inputs = text_inputs(model) if "token_ids" in model.input else {}
    for images, match in [
        (np.zeros((2, 4, 4, 3), "float32"),
         r"images must have shape \[batch, 4, 4, 1\] \(\[batch, height, width, channels\]\). "
         r"Received: images.shape=\(2, 4, 4, 3\)"),
        (np.zeros((2, 8, 8, 1), "float32"), r"images.shape=\(2, 8, 8, 1\)"),
        (np.zeros((2, 4, 4), "float32"), r"images must have rank 4 .*images.shape=\(2, 4, 4\)"),
    ]:
        with pytest.raises(ValueError, match=match):
            model({**inputs, "images": images})


def test_seq2seq_backbone_checks_encoder_and_decoder_masks():
    model = Seq2SeqBackbone(num_layers=1, **SIZES)
    inputs = {"encoder_token_ids": ids(5), "encoder_padding_mask": ids(5),
              "decoder_token_ids": ids(3), "decoder_padding_mask": ids(3)}
    assert model(inputs)["decoder_sequence_output"].shape == (2, 3, WIDTH)
    with pytest.raises(ValueError, match=r"encoder_padding_mask must have shape .* matching "
                       r"encoder_token_ids.shape=\(2, 5\). Received: .*=\(2, 3\)"):
        model({**inputs, "encoder_padding_mask": ids(3)})
    with pytest.raises(ValueError, match=r"decoder_padding_mask must have shape .* matching "
                       r"decoder_token_ids.shape=\(2, 3\). Received: .*=\(2, 5\)"):
        model({**inputs, "decoder_padding_mask": ids(5)})
    with pytest.raises(ValueError, match=r"encoder_padding_mask must have shape"):
        model.encode(ids(5), ids(4))


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: TransformerBackbone(**{**SIZES, "num_layers": 0}), "num_layers=0"),
        (lambda: TransformerBackbone(**{**SIZES, "hidden_dim": 8.0}, num_layers=1),
         "hidden_dim must be a positive int. Received: hidden_dim=8.0"),
        (lambda: TransformerBackbone(**{**SIZES, "num_heads": -2}, num_layers=1),
         "num_heads=-2"),
        (lambda: TransformerBackbone(**SIZES, num_layers=1, dropout=1.0),
         r"dropout must be a number in \[0, 1\). Received: dropout=1.0"),
        (lambda: TransformerBackbone(**SIZES, num_layers=1, causal="yes"),
         "causal must be a bool. Received: causal='yes'"),
        (lambda: Seq2SeqBackbone(**SIZES, num_layers=1, num_decoder_layers=0),
         "num_decoder_layers=0"),
        (lambda: TextEncoder(**SIZES, num_layers=1, projection_dim=0), "projection_dim=0"),
        (lambda: TextEncoder(**SIZES, num_layers=1, pooling="first"),
         r"pooling must be one of \('cls', 'mean', 'max'\). Received: pooling='first'"),
        (lambda: TextClassifier(2, **SIZES, num_layers=1, head_dropout=-0.1),
         "head_dropout=-0.1"),
        (lambda: TextClassifier(2, backbone=VisionBackbone(**VISION)),
         "backbone must be a TransformerBackbone. Received: backbone=VisionBackbone"),
        (lambda: VisionBackbone(**{**VISION, "patch_size": True}), "patch_size=True"),
        (lambda: VisionClassifier(0, **VISION), "num_classes=0"),
    ],
)
def test_bad_hyperparameters_raise_naming_the_argument(make, match):
    with pytest.raises(ValueError, match=match):
        make()


@pytest.mark.parametrize(
    "make,model_name",
    [
        (lambda: TextClassifier(2, num_layers=1, fusion="average", **SIZES),
         "TransformerBackbone"),
        (lambda: TransformerBackbone(num_layers=1, hiden_dim=4, **SIZES), "TransformerBackbone"),
        (lambda: CausalLM(num_layers=1, fusion="average", **SIZES), "TransformerBackbone"),
        (lambda: VisionBackbone(fusion="average", **VISION), "VisionBackbone"),
        (lambda: Seq2SeqBackbone(num_layers=1, fusion="average", **SIZES), "Seq2SeqBackbone"),
    ],
)
def test_unknown_arguments_raise_instead_of_being_dropped(make, model_name):
    with pytest.raises(ValueError, match=model_name + r" does not take the arguments "
                       r"\['(fusion|hiden_dim)'\]: expected those of .*Received: "):
        make()
