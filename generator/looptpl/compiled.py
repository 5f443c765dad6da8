"""copier, with the Jinja code of each template file compiled once per process instead of once per render.

Copier compiles every file name and file of the template each time it renders, and `looptpl update`
renders the template two or three times: compiling was a third of a render's time. What Jinja compiles
from a source depends on the source and on the environment's settings, so the code is kept per source
and settings. Copier builds every render's environment the same way from the template's copier.yml
(the same extensions, delimiters and filters, some filters wrapped anew each time), so the settings
are named here by the environment's class, delimiters and options, its extensions' classes, and the
names of its filters and tests.
"""

from collections.abc import Callable
from types import ModuleType
from typing import Any

# Environment attributes that change what Jinja's lexer, parser or code generator make of a source.
SETTINGS = (
    "block_start_string",
    "block_end_string",
    "variable_start_string",
    "variable_end_string",
    "comment_start_string",
    "comment_end_string",
    "line_statement_prefix",
    "line_comment_prefix",
    "trim_blocks",
    "lstrip_blocks",
    "newline_sequence",
    "keep_trailing_newline",
    "optimized",
    "is_async",
    "finalize",
    "autoescape",
)
MAX_ENTRIES = 4096  # about eight renders of every template file and name of both backends


def copier() -> ModuleType:
    """The copier module (imported here: it is slow to import, and only rendering needs it), its
    compilations cached."""
    import copier as module
    import jinja2

    if not hasattr(jinja2.Environment.compile, "cache"):
        jinja2.Environment.compile = cached(jinja2.Environment.compile)  # type: ignore[method-assign]
    return module


def cached(compile: Callable[..., Any]) -> Callable[..., Any]:
    """`jinja2.Environment.compile` that keeps what it compiled from a source under its settings."""
    cache: dict[tuple[Any, ...], Any] = {}

    def compile_once(
        environment: Any,
        source: Any,
        name: str | None = None,
        filename: str | None = None,
        raw: bool = False,
        defer_init: bool = False,
    ) -> Any:
        if not isinstance(source, str):  # a parsed template: nothing to recognise it by
            return compile(environment, source, name, filename, raw, defer_init)
        key = (settings(environment), source, name, filename, raw, defer_init)
        if key not in cache:
            if len(cache) >= MAX_ENTRIES:
                cache.clear()
            cache[key] = compile(environment, source, name, filename, raw, defer_init)
        return cache[key]

    compile_once.cache = cache  # type: ignore[attr-defined]
    return compile_once


def settings(environment: Any) -> tuple[Any, ...]:
    """What, besides the source, decides the code Jinja compiles in `environment`."""
    return (
        type(environment),
        *(getattr(environment, name) for name in SETTINGS),
        tuple(type(extension) for extension in environment.extensions.values()),
        tuple(environment.filters),
        tuple(environment.tests),
    )
