"""MkDocs hook: each word of the code in a table cell stays on one line.

Browsers break code at hyphens and, with Material's `word-break: break-word`, anywhere, so a narrow
column showed `--global-` / `batch-size`. Each run of non-space characters of an inline code in a
table cell is wrapped in `<span class="nowrap">` (docs/stylesheets/extra.css): a cell still wraps
between words and the table scrolls sideways when a word is wider than its column.
"""

import re

CELL = re.compile(r"<(td|th)\b[^>]*>.*?</\1>", re.DOTALL)
CODE = re.compile(r"<code>([^<]*)</code>")  # inline code with no markup inside
WORD = re.compile(r"\S+")


def on_page_content(html: str, **kwargs) -> str:
    def cell(match: re.Match[str]) -> str:
        return CODE.sub(code, match.group(0))

    def code(match: re.Match[str]) -> str:
        words = WORD.sub(lambda word: f'<span class="nowrap">{word.group(0)}</span>', match.group(1))
        return f"<code>{words}</code>"

    return CELL.sub(cell, html)
