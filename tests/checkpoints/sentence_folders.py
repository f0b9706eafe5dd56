"""Tiny sentence-transformers folders, written the way real ones are: a random BERT with a
WordPiece tokenizer saved by `transformers`, wrapped in `SentenceTransformer` modules and saved
with `SentenceTransformer.save`. Shared by the checkpoint tests and the README's test."""

import pathlib

from tests.checkpoints.hf_checks import perturbed

WIDTH, MAX_LENGTH = 16, 24
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + (
    "the a cat dog sat on mat ran far and big small red blue over under fox jumped "
    "quick brown lazy ##s ##ed ##ing").split()


def wordpiece_tokenizer(lowercase=True):
    """A WordPiece `tokenizers.Tokenizer` over `WORDS`, `[CLS] $A [SEP]`, lower-casing unless
    told not to."""
    import tokenizers

    models, normalizers, pre_tokenizers, processors = (
        tokenizers.models, tokenizers.normalizers, tokenizers.pre_tokenizers,
        tokenizers.processors)
    tokenizer = tokenizers.Tokenizer(models.WordPiece({w: i for i, w in enumerate(WORDS)},
                                                      unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tokenizer


def write_transformer_folder(folder, architecture="bert", lowercase=True):
    """A perturbed two-layer `BertModel` (with its pooler), or a one-layer `RobertaModel`
    (padding id 0: positions from 1), and the tokenizer (`wordpiece_tokenizer(lowercase)`),
    saved in `folder`."""
    import torch
    import transformers

    sizes = dict(vocab_size=len(WORDS), hidden_size=WIDTH, num_attention_heads=2,
                 intermediate_size=32, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.0)
    if architecture == "bert":
        model = transformers.BertModel(transformers.BertConfig(
            **sizes, num_hidden_layers=2, max_position_embeddings=32))
    else:
        model = transformers.RobertaModel(transformers.RobertaConfig(
            **sizes, num_hidden_layers=1, max_position_embeddings=34, pad_token_id=0,
            type_vocab_size=1))
    torch.manual_seed(0)
    perturbed(model).save_pretrained(folder)
    transformers.BertTokenizerFast(
        tokenizer_object=wordpiece_tokenizer(lowercase), unk_token="[UNK]", pad_token="[PAD]",
        cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]").save_pretrained(folder)
    return folder


def write_sentence_folder(transformer_folder, folder, pooling, dense=None, normalize=False,
                          seed=1, do_lower_case=False, prompts=None, default_prompt_name=None):
    """`SentenceTransformer(modules=[Transformer, Pooling(pooling), Dense?, Normalize?],
    prompts=prompts, default_prompt_name=default_prompt_name)` over `transformer_folder`,
    its Transformer module lowercasing when `do_lower_case`, saved in `folder`."""
    import sentence_transformers as st
    import torch
    from sentence_transformers.sentence_transformer import modules

    stack = [modules.Transformer(str(transformer_folder), max_seq_length=MAX_LENGTH,
                                 do_lower_case=do_lower_case),
             modules.Pooling(WIDTH, pooling_mode=pooling)]
    if dense is not None:
        torch.manual_seed(seed)
        stack.append(perturbed(modules.Dense(WIDTH, **dense), seed))
    if normalize:
        stack.append(modules.Normalize())
    st.SentenceTransformer(modules=stack, device="cpu", prompts=prompts,
                           default_prompt_name=default_prompt_name).save(str(folder))
    return pathlib.Path(folder)
