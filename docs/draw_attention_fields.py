"""Writes `docs/attention.md` and its pictures: every attention variant of keras_xf drawn as
the attention field of one head on a fixed random input of 16 tokens.

    python docs/draw_attention_fields.py            # (or `make docs`)

Each entry's usage is two lines of Python that build `attention`; the script runs exactly
those lines, so the page cannot drift from the library. The picture is the float32 weight
matrix α (query i down, key j across) that `attention(x, return_attention_scores=True)`
returns for head 0, with masked keys in white.
"""

import os
import pathlib

os.environ.setdefault("KERAS_BACKEND", "jax")

import keras  # noqa: E402
import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import keras_xf.layers  # noqa: E402

LENGTH, WIDTH = 16, 32
DOCS = pathlib.Path(__file__).resolve().parent
IMAGES = DOCS / "images" / "attention"

# (title, survey section, what it is, two lines of usage, call arguments as Python source;
# `head=h` picks the head drawn)
ENTRIES = [
    ("Full multi-head attention", "§2.3",
     "Every query attends to every key; the reference for the fields below.",
     "attention = MultiHeadAttention(num_heads=2)", ""),
    ("Causal mask", "§2.6",
     "Query i sees keys j ≤ i (decoders).",
     "attention = MultiHeadAttention(num_heads=2, causal=True)", ""),
    ("Relative position representations (Shaw)", "§4.1.3",
     "Learned PE(i, j) = u_clip(j−i, k_rpr) added to the keys (and values, and optionally "
     "queries) inside the scores.",
     "rpr = RelativePositionEmbedding(max_distance=4, use_values=True)\n"
     "attention = MultiHeadAttention(num_heads=2, biases=[rpr])", ""),
    ("T5 relative position buckets", "§4.1.3",
     "One learned scalar per head and log-spaced distance bucket.",
     "bias = RelativePositionBias(num_buckets=8, max_distance=16, bidirectional=True)\n"
     "attention = MultiHeadAttention(num_heads=2, biases=[bias])", ""),
    ("ALiBi", "§6 (summary)",
     "A fixed linear penalty −m_h·|i−j| with geometric per-head slopes.",
     "attention = MultiHeadAttention(num_heads=2, causal=True, biases=[AlibiBias()])", ""),
    ("Locality prior, Gaussian (additive)", "§4.1.1",
     "−γ·(i−j)²/2σ² added to the scores.",
     "prior = LocalityPrior(distance=\"gaussian\", sigma=2.0, gamma=1.0)\n"
     "attention = MultiHeadAttention(num_heads=2, biases=[prior])", ""),
    ("Locality prior, β-mixture", "§4.1.1",
     "(1−β)·Softmax(scores) + β·Softmax(−γG) with G = |i−j|.",
     "prior = LocalityPrior(form=\"mixture\", distance=\"absolute\", gamma=1.0, beta=0.5)\n"
     "attention = MultiHeadAttention(num_heads=2, biases=[prior])", ""),
    ("Locality prior, multiplicative", "§4.1.1",
     "scores ⊙ G′ with G′ = exp(−γ|i−j|).",
     "prior = LocalityPrior(form=\"multiplicative\", distance=\"absolute\", gamma=0.5)\n"
     "attention = MultiHeadAttention(num_heads=2, multiplier=prior)", ""),
    ("Syntax matrix, additive", "§3.2",
     "A per-example matrix M [B, T, T] added to the scores at call time (here: 4-token "
     "phrases, −5 outside them), on all heads or the `guided_heads` only.",
     "M = np.kron(np.eye(4), np.ones((4, 4)))[None]  # 1 inside each phrase\n"
     "attention = MultiHeadAttention(num_heads=2, guided_heads=[0])",
     "attention_bias=(M - 1) * 5"),
    ("Syntax matrix, multiplicative", "§3.2",
     "The scores multiplied by M at call time (here a soft, distance-decaying matrix).",
     "M = 1 / (1 + np.abs(np.subtract.outer(np.arange(16), np.arange(16))))[None]\n"
     "attention = MultiHeadAttention(num_heads=2)",
     "attention_multiplier=M"),
    ("Multi-branch attention", "§3.3",
     "Two attention branches mixed by α (fixed or learned); only the second sees M. The "
     "picture is α·α_Att + (1−α)·α_AttSyn with the phrase matrix above.",
     "M = np.kron(np.eye(4), np.ones((4, 4)))[None]\n"
     "attention = BranchMix(MultiHeadAttention(num_heads=2), alpha=0.5)",
     "attention_bias=(M - 1) * 5"),
    ("Low-dimensional queries and keys", "§5.3.2",
     "Scores computed in d′ = 4 dimensions per head instead of d/h = 16.",
     "attention = MultiHeadAttention(num_heads=2, qk_dim=4)", ""),
    ("Local window (sliding, causal)", "§4.1.2, §5.1",
     "Keys in [i − w_left, i + w_right]; computed block-sparsely in O(n·w) memory, and "
     "decoded with a rolling cache of w_left + 1 slots.",
     "field = LocalPattern(window_left=3, window_right=0)\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field, causal=True)", ""),
    ("Chunked", "§5.1",
     "Attention within fixed chunks; block-sparse.",
     "attention = MultiHeadAttention(num_heads=2, pattern=ChunkedPattern(chunk_size=4))", ""),
    ("Strided", "§5.1",
     "Windows of `window` keys every `stride` positions (stride = window is chunked); "
     "block-sparse.",
     "attention = MultiHeadAttention(num_heads=2, pattern=StridedPattern(window=6, stride=3))",
     ""),
    ("Dilated window", "§5.1",
     "Keys at distances 0, d, 2d, … up to window·d.",
     "attention = MultiHeadAttention(num_heads=2, pattern=DilatedPattern(window=3, dilation=2))",
     ""),
    ("Global tokens", "§5.1",
     "Global positions attend everywhere and are attended by every query.",
     "field = HybridPattern([DilatedPattern(window=1), GlobalPattern(global_positions=[0, 8])])\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", ""),
    ("Fixed random field", "§5.1",
     "Each query gets a few random keys, drawn once from a seed and saved with the model.",
     "field = RandomPattern(num_random=3, max_length=16, seed=1)\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", ""),
    ("Hybrid: local + global + random", "§5.1",
     "The union of a local window, global tokens and random keys.",
     "field = HybridPattern([DilatedPattern(window=1), GlobalPattern(num_global=1), "
     "RandomPattern(num_random=2, max_length=16, seed=1)])\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", ""),
    ("Per-head fields (head 1 shown)", "§5.1",
     "Head h uses the h-th field: here head 0 a window, head 1 global tokens.",
     "field = PerHeadPattern([DilatedPattern(window=1), GlobalPattern(num_global=2)])\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", "head=1"),
    ("Learned field by hashing (LSH)", "§5.1",
     "Queries and keys hashed by random rotations; attention within the same bucket.",
     "field = HashingPattern(num_buckets=4, seed=0)\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", ""),
    ("Learned field by clustering", "§5.1",
     "Queries and keys assigned to the nearest learned centroid; attention within a cluster.",
     "field = ClusteringPattern(num_clusters=3, seed=0)\n"
     "attention = MultiHeadAttention(num_heads=2, pattern=field)", ""),
    ("Key selection (compressed attention)", "§5.3.1",
     "Each query keeps its n′ top-scoring keys.",
     "attention = CompressedAttention(num_heads=2, method=\"selection\", compressed_length=4)",
     ""),
    ("Linformer projection (compressed attention)", "§5.3.1",
     "Keys and values projected from n = 16 to n′ = 4 positions (the columns are the n′ "
     "compressed keys).",
     "attention = CompressedAttention(num_heads=2, method=\"projection\", compressed_length=4,\n"
     "                                max_length=16)", ""),
]

# Variants without an attention field of their own: usage only.
WITHOUT_FIELD = [
    ("Attention-map sharing across layers", "§5.4",
     "Layers 0, k, 2k, … compute their attention weights and the next k − 1 layers reuse "
     "them (each still has its own values and output projection): the field is the first "
     "layer's.",
     "block = TransformerBlock(MultiHeadAttention(num_heads=2), FeedForward(64))\n"
     "stack = TransformerStack(block, num_layers=6, share_attention_maps=3)"),
    ("Product-key memory", "§5.3.2",
     "A feedforward replacement: each token reads the top-k of num_keys² memory slots found "
     "through two sets of sub-keys.",
     "memory = ProductKeyMemory(num_keys=32, top_k=4)\n"
     "block = TransformerBlock(MultiHeadAttention(num_heads=2), memory)"),
]


def _slug(title):
    keep = "".join(c.lower() if c.isascii() and c.isalnum() else "_" for c in title)
    return "_".join(part for part in keep.split("_") if part)


def _namespace():
    namespace = {"np": np, "keras": keras}
    namespace.update({name: getattr(keras_xf.layers, name) for name in dir(keras_xf.layers)
                      if not name.startswith("_")})
    return namespace


def _weights(attention, x, kwargs):
    """Head-major float32 weights `[H, T, S]` of `attention` on `x`."""
    if isinstance(attention, keras_xf.layers.BranchMix):
        # α·Att + (1−α)·AttSyn: the two branches' weights, mixed as the layer mixes outputs.
        attention(x, **kwargs)  # builds both branches
        plain = attention.attention(x, return_attention_scores=True)["attention_scores"]
        syntax = attention.syntax_attention(
            x, return_attention_scores=True, **kwargs)["attention_scores"]
        alpha = keras.ops.convert_to_numpy(attention.mixing_weight())
        mixed = alpha * keras.ops.convert_to_numpy(plain)
        return (mixed + (1 - alpha) * keras.ops.convert_to_numpy(syntax))[0]
    weights = attention(x, return_attention_scores=True, **kwargs)["attention_scores"]
    return keras.ops.convert_to_numpy(weights)[0]


def field(code, call):
    """Runs the usage `code` and returns `(weights [T, S] of the drawn head, attention)`."""
    namespace = _namespace()
    exec(code, namespace)
    attention = namespace["attention"]
    kwargs = eval(f"dict({call})", namespace)
    head = kwargs.pop("head", 0)
    keras.utils.set_random_seed(0)
    x = np.random.default_rng(0).standard_normal((1, LENGTH, WIDTH)).astype("float32")
    return _weights(attention, x, kwargs)[head], attention


def _draw(weights, path, title):
    figure, axis = plt.subplots(figsize=(2.6, 2.6), dpi=100)
    shown = np.ma.masked_where(weights <= 0, weights)
    axis.imshow(shown, cmap="viridis", interpolation="nearest")
    axis.set_title(title, fontsize=8)
    axis.set_xlabel("key j", fontsize=7)
    axis.set_ylabel("query i", fontsize=7)
    axis.tick_params(labelsize=6)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main():
    IMAGES.mkdir(parents=True, exist_ok=True)
    lines = [
        "# Attention variants",
        "",
        "Every variant plugs into `MultiHeadAttention` through the score pipeline of the design",
        "page (`position=`, `biases=[...]`, `multiplier=`, `pattern=`, or a subclass), so each one",
        "composes with every block and model (`TransformerBlock(mixer=attention, ...)`, then",
        "`CausalLM(block=...)` or `TextClassifier(block=...)`). Each picture is the attention",
        "weight matrix of one head, at initialisation, on a random input of 16 tokens (query i",
        "down, key j across; white = no weight), drawn by `docs/draw_attention_fields.py` from",
        "the lines of usage printed under it (`make docs` redraws them). The layers are imported",
        "from `keras_xf.layers`.",
        "",
    ]
    for title, section, what, code, call in ENTRIES:
        weights, _ = field(code, call)
        image = IMAGES / f"{_slug(title)}.png"
        _draw(weights, image, title)
        lines += [
            f"## {title} (survey {section})",
            "",
            what,
            "",
            f"![{title}](images/attention/{image.name})",
            "",
            "```python",
            code + (f"\noutputs = attention(x, {call})" if call and "head=" not in call else ""),
            "```",
            "",
        ]
    for title, section, what, code in WITHOUT_FIELD:
        namespace = _namespace()
        exec(code, namespace)  # the usage must run
        lines += [f"## {title} (survey {section})", "", what, "", "```python", code, "```", ""]
    (DOCS / "attention.md").write_text("\n".join(lines))
    print(f"wrote {DOCS / 'attention.md'} and {len(ENTRIES)} pictures in {IMAGES}")


if __name__ == "__main__":
    main()
