"""`from_gguf` on GGUF files written from tiny random `transformers` models as llama.cpp writes
them (`tests/checkpoints/gguf_files.py`): logits and greedy tokens equal `transformers`
loading the same file, for float and quantised tensor types; the file's tokenizer equals
`transformers`' GGUF tokenizer; unsupported architectures and tensor types are named."""

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers reads GGUF files through it

from keras_xf.checkpoints import from_gguf  # noqa: E402
from keras_xf.models import CausalLM  # noqa: E402
from tests.checkpoints.gguf_files import tiny_model  # noqa: E402
from tests.checkpoints.gguf_files import write_gguf  # noqa: E402
from tests.checkpoints.hf_checks import assert_logits_equal  # noqa: E402
from tests.checkpoints.hf_checks import batch  # noqa: E402
from tests.checkpoints.hf_checks import keras_logits  # noqa: E402
from tests.checkpoints.hf_checks import reference_logits  # noqa: E402
from tests.preprocessing.folders import SHAKESPEARE  # noqa: E402
from tests.preprocessing.folders import VOCABULARY_SIZE  # noqa: E402

Q = gguf.GGMLQuantizationType


def _hf_from_gguf(path):
    return transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name).eval()


def _greedy_hf(model, ids, steps):
    import torch

    out = model.generate(torch.tensor(ids, dtype=torch.long), max_new_tokens=steps,
                         do_sample=False, attention_mask=torch.ones_like(torch.tensor(ids)))
    return out.numpy()[:, ids.shape[1]:]


def _greedy_keras(model, ids, steps):
    out = model.generate({"token_ids": np.pad(ids, ((0, 0), (0, steps))),
                          "padding_mask": np.pad(np.ones_like(ids, bool), ((0, 0), (0, steps)))},
                         max_length=ids.shape[1] + steps, stop_token_ids=None)
    return np.asarray(out["token_ids"])[:, ids.shape[1]:]


def _compare(path, references=None, atol=1e-4):
    """Logits on a right-padded batch and 6 greedy tokens: keras_xf's load of `path` against
    each of `references` (`transformers` loading the same file, when `None`)."""
    model = from_gguf(path)
    ids, mask = batch(vocabulary_size=VOCABULARY_SIZE)
    logits = keras_logits(model, ids, mask)
    prompt = ids[:1, :5]
    tokens = _greedy_keras(model, prompt, 6)
    for reference in references or [_hf_from_gguf(path)]:
        assert_logits_equal(logits, reference_logits(reference, ids, mask), mask, atol=atol)
        np.testing.assert_array_equal(tokens, _greedy_hf(reference, prompt, 6))
    return model


@pytest.mark.parametrize("kind", ["llama", "mistral", "qwen2"])
def test_float32_file_equals_transformers(kind, tmp_path):
    source = tiny_model(kind)
    path = write_gguf(source, tmp_path / f"{kind}.gguf")
    # transformers' reading, and the model written out (the q/k permutation undone; Mistral,
    # a `llama` file, with a window longer than the batch).
    model = _compare(path, [_hf_from_gguf(path), source])
    assert isinstance(model, CausalLM)


def test_gemma_file_equals_the_model_it_was_written_from(tmp_path):
    # transformers reads no Gemma (1) GGUF files: the reference is the model written out,
    # whose norm scales llama.cpp stores as 1 + w; tied embeddings (no output.weight).
    source = tiny_model("gemma", tie=True)
    path = write_gguf(source, tmp_path / "gemma.gguf")
    model = _compare(path, [source])
    assert model.backbone.tie_embeddings and model.backbone.embedding_scale


def _types(kind):
    """Each tensor's type for a file of `kind`: matrices `kind`, except the embeddings kept
    F16 for the K-quants (their rows of 32 are shorter than a 256-value block) and the
    attention matrices Q8_0."""
    def types(name, array):
        if kind in (Q.Q4_K, Q.Q6_K):
            if "ffn_down" in name:
                return kind
            return Q.F16 if name in ("token_embd.weight", "output.weight") else Q.Q8_0
        return kind
    return types


@pytest.mark.parametrize("kind", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q4_K,
                                  Q.Q6_K], ids=lambda k: k.name)
def test_quantised_file_equals_transformers(kind, tmp_path):
    # ffn_down's rows are 256 values (one K-quant super-block) for the K-quants.
    source = tiny_model("llama", intermediate_size=256 if kind in (Q.Q4_K, Q.Q6_K) else 64)
    path = write_gguf(source, tmp_path / f"{kind.name}.gguf", types=_types(kind))
    model = _compare(path)
    # The quantised weights are the file's, not the source model's.
    ids, mask = batch(vocabulary_size=VOCABULARY_SIZE)
    difference = np.abs(keras_logits(model, ids, mask) - reference_logits(source, ids, mask))
    assert difference.max() > (1e-6 if kind == Q.F16 else 1e-3)


def test_tokenizer_equals_transformers(tmp_path):
    path = write_gguf(tiny_model("llama"), tmp_path / "llama.gguf")
    model = from_gguf(path)
    tokenizer = model.preprocessor.tokenizer
    reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    texts = SHAKESPEARE[:4] + ["<|im_start|>user\nWho's there?<|im_end|>", "  Nay, answer me"]
    assert tokenizer(texts) == [reference(t)["input_ids"] for t in texts]
    assert tokenizer.special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                        "pad_token": "<pad>"}
    assert tuple(model.stop_token_ids) == (1,)
    conversation = [{"role": "user", "content": "To be?"}]
    assert tokenizer.apply_chat_template(conversation, add_generation_prompt=True) == (
        reference.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False))
    ids = tokenizer(["To be, or not to be"])[0]
    assert tokenizer.detokenize([ids]) == [reference.decode(ids, skip_special_tokens=True)]
    text = model.generate(["To be, or"], max_length=12)[0]
    assert text.startswith("To be, or")


@pytest.mark.parametrize("kind", ["llama", "gemma"])
def test_sentencepiece_tokenizer_equals_transformers(kind, tmp_path):
    # Gemma's tokenizer turns spaces into ▁ without a prefix and takes its merges in the
    # vocabulary's order; Llama's prefixes ▁ and merges by score.
    from tests.checkpoints.gguf_files import SENTENCEPIECE_TOKENS

    source = tiny_model(kind, vocabulary_size=len(SENTENCEPIECE_TOKENS))
    path = write_gguf(source, tmp_path / "sp.gguf", tokenizer="sentencepiece")
    model = from_gguf(path)
    tokenizer = model.preprocessor.tokenizer
    # Byte fallback (é, ?), a leading space, the start token llama.cpp adds by default.
    texts = ["To be or not to be", "that is the question:", " to be, é?", "Tobe"]
    if kind == "llama":
        reference = transformers.AutoTokenizer.from_pretrained(str(tmp_path),
                                                               gguf_file=path.name)
        expected = [reference(t)["input_ids"] for t in texts]
        assert tokenizer.detokenize(expected) == [
            reference.decode(ids, skip_special_tokens=True) for ids in expected]
    else:  # AutoTokenizer reads no Gemma (1) file: transformers' GGUF converter itself
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer, get_gguf_tokenizer)

        architecture, vocabulary, _ = get_gguf_tokenizer(str(path))
        reference, _ = convert_gguf_tokenizer(architecture, vocabulary)
        expected = [[1] + reference.encode(t, add_special_tokens=False).ids for t in texts]
        assert tokenizer.detokenize(expected) == [
            reference.decode(ids, skip_special_tokens=True) for ids in expected]
    assert tokenizer(texts) == expected
    assert all(ids[0] == 1 for ids in expected)  # <s>
    assert {3 + 0xC3, 3 + 0xA9} <= set(expected[2])  # é as its two byte tokens
    assert tokenizer.special_tokens == {"bos_token": "<s>", "eos_token": "</s>",
                                        "unk_token": "<unk>"}
    ids = np.asarray([expected[0]], "int32")
    np.testing.assert_array_equal(_greedy_keras(model, ids, 4), _greedy_hf(source, ids, 4))


def test_bfloat16_policy(tmp_path):
    source = tiny_model("llama")
    path = write_gguf(source, tmp_path / "l.gguf", types=lambda name, array: Q.Q8_0)
    model = from_gguf(path, dtype="bfloat16")
    assert {v.dtype for v in model.weights} == {"bfloat16"}
    ids, mask = batch(vocabulary_size=VOCABULARY_SIZE)
    expected = keras_logits(from_gguf(path), ids, mask)
    actual = keras_logits(model, ids, mask).astype("float32")
    difference = np.abs(actual - expected)[mask.astype(bool)]
    assert difference.mean() < 0.03 and difference.max() < 0.3  # bfloat16 rounding only


def test_file_without_a_vocabulary_takes_ids(tmp_path):
    model = from_gguf(write_gguf(tiny_model("qwen2"), tmp_path / "q.gguf", tokenizer=None))
    assert model.preprocessor is None and tuple(model.stop_token_ids) == ()


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "phi.gguf"
    writer = gguf.GGUFWriter(str(path), "phi3")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"architecture 'phi3', which keras_xf does not load\. "
                                         r"Loadable GGUF architectures: \['gemma', 'llama', "
                                         r"'qwen2'\]"):
        from_gguf(path)


def test_unsupported_tensor_type_is_named(tmp_path):
    def types(name, array):
        return Q.TQ2_0 if name == "blk.1.ffn_down.weight" else Q.F32

    path = write_gguf(tiny_model("llama", intermediate_size=256), tmp_path / "t.gguf",
                      types=types)
    with pytest.raises(ValueError, match=r"'blk\.1\.ffn_down\.weight' is "
                                         r"TQ2_0 \(1 in all\)\. Supported types: \['F32', "):
        from_gguf(path)


def test_unreadable_settings_are_named(tmp_path):
    def write(path, change, drop=()):
        source = tiny_model("llama")
        reader_path = write_gguf(source, tmp_path / "base.gguf")
        reader = gguf.GGUFReader(str(reader_path))
        writer = gguf.GGUFWriter(str(path), "llama")
        for field in reader.fields.values():
            if field.name.startswith(("GGUF.", "general.architecture")) or field.name in drop:
                continue
            value = field.contents()
            kind = field.types[0]
            sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, value, kind, sub_type=sub)
        tensors = {t.name: np.array(t.data) for t in reader.tensors}
        change(writer, tensors)
        for name, array in tensors.items():
            writer.add_tensor(name, array)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    frequencies = write(tmp_path / "rope.gguf", lambda w, t: t.update(
        {"rope_freqs.weight": np.ones(4, np.float32)}))
    with pytest.raises(ValueError, match=r"has rope_freqs\.weight \(per-dimension rotary"):
        from_gguf(frequencies)
    yarn = write(tmp_path / "yarn.gguf", lambda w, t: w.add_string("llama.rope.scaling.type",
                                                                     "yarn"))
    with pytest.raises(ValueError, match=r"rope scaling 'yarn'; keras_xf reads 'none' and "
                                         "'linear'"):
        from_gguf(yarn)
    unigram = write(tmp_path / "t5.gguf", lambda w, t: w.add_tokenizer_model("t5"),
                    drop=("tokenizer.ggml.model",))
    with pytest.raises(ValueError, match=r"has tokenizer model 't5'; keras_xf builds \['gpt2', "
                                         r"'llama'\]"):
        from_gguf(unigram)
    partial = write(tmp_path / "partial.gguf", lambda w, t: w.add_rope_dimension_count(4),
                    drop=("llama.rope.dimension_count",))
    with pytest.raises(ValueError, match=r"key length 8, value length 8 and 4 rotary "
                                         "dimensions"):
        from_gguf(partial)


def test_docstring_example_runs(tmp_path):
    import doctest

    path = write_gguf(tiny_model("llama"), tmp_path / "model-Q8_0.gguf",
                      types=lambda name, array: Q.Q8_0)
    namespace = {"from_gguf": from_gguf}
    examples = doctest.DocTestParser().get_examples(from_gguf.__doc__)
    assert examples
    for example in examples:
        source = example.source.replace('"path/to/model-Q8_0.gguf"', repr(str(path)))
        assert "path/to/" not in source, source
        exec(source, namespace)
    assert isinstance(namespace["model"], CausalLM)


def test_keras_file_round_trip_keeps_the_tokenizer(tmp_path):
    import keras

    model = from_gguf(write_gguf(tiny_model("qwen2"), tmp_path / "q.gguf",
                                 types=lambda name, array: Q.Q4_0))
    model.save(tmp_path / "lm.keras")
    loaded = keras.saving.load_model(tmp_path / "lm.keras")
    ids, mask = batch(vocabulary_size=VOCABULARY_SIZE)
    np.testing.assert_allclose(keras_logits(loaded, ids, mask), keras_logits(model, ids, mask),
                               atol=1e-6)
    assert tuple(loaded.stop_token_ids) == (1,)
    assert loaded.preprocessor.tokenizer(["To be, or"]) == model.preprocessor.tokenizer(
        ["To be, or"])
