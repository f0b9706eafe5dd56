"""Chat templates render as `transformers` renders them (jinja2, the same settings), from
`tokenizer_config.json` or `chat_template.jinja`."""

import jinja2
import pytest

pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from keras_xf.preprocessing import HuggingFaceTokenizer  # noqa: E402
from keras_xf.preprocessing import render_chat_template  # noqa: E402
from tests.preprocessing import folders  # noqa: E402

CHAT = [{"role": "user", "content": "To be, or not to be?"},
        {"role": "assistant", "content": "  That is the question.  "},
        {"role": "user", "content": "Whether 'tis nobler?"}]
WITH_SYSTEM = [{"role": "system", "content": "Speak verse."}] + CHAT[:1]
# Whitespace control, loop controls, `tojson` (no HTML escaping) and a namespace.
JINJA_FILE = """{% set ns = namespace(turns=0) %}
{% for message in messages %}
  {% if message.role == 'system' %}{% continue %}{% endif %}
  {% set ns.turns = ns.turns + 1 %}
[{{ ns.turns }}] {{ message | tojson }}{{ eos_token }}
{% endfor %}
{%- if add_generation_prompt %}[{{ ns.turns + 1 }}] {% endif %}"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return folders.write_tokenizer_folder(tmp_path_factory.mktemp("chat"))


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("chat", [CHAT, WITH_SYSTEM], ids=["chat", "with_system"])
def test_rendering_equals_transformers(folder, chat, add_generation_prompt):
    rendered = HuggingFaceTokenizer(folder).apply_chat_template(
        chat, add_generation_prompt=add_generation_prompt)
    for reference in (transformers.AutoTokenizer.from_pretrained(str(folder)),
                      transformers.PreTrainedTokenizerFast(
                          tokenizer_file=str(folder / "tokenizer.json"), bos_token="<s>",
                          eos_token="</s>", pad_token="<pad>",
                          chat_template=folders.CHAT_TEMPLATE)):
        assert rendered == reference.apply_chat_template(
            chat, add_generation_prompt=add_generation_prompt, tokenize=False)
    assert rendered.startswith("<s>") and "<|im_start|>user" in rendered


def test_a_batch_of_conversations_and_ids_equal_transformers(folder):
    tokenizer = HuggingFaceTokenizer(folder)
    reference = transformers.AutoTokenizer.from_pretrained(str(folder))
    batch = [CHAT, WITH_SYSTEM]
    assert tokenizer.apply_chat_template(batch, add_generation_prompt=True) == \
        reference.apply_chat_template(batch, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    expected = reference.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True,
                                             return_dict=False)
    assert ids == list(expected)


def test_the_jinja_file_takes_precedence(tmp_path):
    path = folders.write_tokenizer_folder(tmp_path, template_file=JINJA_FILE)
    tokenizer = HuggingFaceTokenizer(path)
    reference = transformers.AutoTokenizer.from_pretrained(str(path))
    assert tokenizer.chat_template == JINJA_FILE
    for prompt in (True, False):
        rendered = tokenizer.apply_chat_template(WITH_SYSTEM + CHAT[1:],
                                                 add_generation_prompt=prompt)
        assert rendered == reference.apply_chat_template(
            WITH_SYSTEM + CHAT[1:], add_generation_prompt=prompt, tokenize=False)
    assert '"That is' not in rendered and '"content": "  That is' in rendered


def test_template_errors_and_missing_templates(folder, tmp_path):
    with pytest.raises(jinja2.exceptions.TemplateError, match="Unknown role: narrator"):
        HuggingFaceTokenizer(folder).apply_chat_template([{"role": "narrator", "content": "x"}])
    folders.write_tokenizer_folder(tmp_path, tokenizer_config=False)
    with pytest.raises(ValueError, match="chat_template=None"):
        HuggingFaceTokenizer(tmp_path).apply_chat_template(CHAT)
    rendered = HuggingFaceTokenizer(tmp_path).apply_chat_template(
        CHAT[:1], chat_template="{{ messages[0].content }}")
    assert rendered == CHAT[0]["content"]
    with pytest.raises(ValueError, match="conversation must be a list"):
        render_chat_template("{{ 1 }}", "hello")
    with pytest.raises(ValueError, match="Each message must be a dict"):
        render_chat_template("{{ 1 }}", ["hello"])
    with pytest.raises(ValueError, match="chat_template must be a string"):
        render_chat_template(3, CHAT)


def test_the_sandbox_refuses_python_internals(folder):
    with pytest.raises(jinja2.exceptions.SecurityError):
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
                             CHAT)
