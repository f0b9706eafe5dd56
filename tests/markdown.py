"""The ```python blocks of the project's Markdown pages, for the tests that run them."""

import re

BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.DOTALL | re.MULTILINE)


def python_blocks(path, section=None):
    """`(line, source)` of each ```python block of the Markdown file `path`, in order; `line`
    is the block's first line of code (1-based), for tracebacks that point into the page.
    With `section`, only the blocks under the `## <section>` heading."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start, end = 0, len(text)
    if section is not None:
        heading = re.search(rf"^## {re.escape(section)}\n", text, flags=re.MULTILINE)
        if heading is None:
            return []
        start = heading.end()
        following = re.search(r"^## ", text[start:], flags=re.MULTILINE)
        end = start + following.start() if following else end
    return [(text.count("\n", 0, match.start(1)) + 1, match.group(1))
            for match in BLOCK.finditer(text, start, end)]


def compiled(path, line, source):
    """`source` compiled as the lines of `path` it was read from."""
    return compile("\n" * (line - 1) + source, path, "exec")
