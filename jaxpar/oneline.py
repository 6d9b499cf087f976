"""Errors as the one line a user sees: `error: what is wrong and how to fix it` on stderr.
Imports nothing of jaxpar, so every entry point can use it before anything else loads."""

from __future__ import annotations

import os
import sys


def first_line(error: BaseException) -> str:
    """The first line of an error's message ('' for an empty one)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


def joined(error: BaseException) -> str:
    """Every line of an error's message joined by '; ' (config_flags' messages span several
    lines; a KeyError's quotes are taken off); its type's name if it says nothing."""
    text = str(error).strip()
    if len(text) > 1 and text[0] == text[-1] and text[0] in "'\"":  # KeyError-style quoting
        text = text[1:-1].replace("\\n", "\n").replace("\\'", "'")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def print_error(message: str) -> None:
    """`error: MESSAGE` on stderr, at once."""
    print(f"error: {message}", file=sys.stderr, flush=True)


def run_main(main, interrupted: str) -> None:
    """`sys.exit(main())` for an entry point, with Ctrl-C as one line (`error: interrupted:
    ...`, exit status 130, as `python -m jaxpar.train` says it) instead of a traceback. It leaves at once (os._exit): XLA's threads,
    stopped inside a compile, can crash the interpreter's shutdown."""
    try:
        status = main()
    except KeyboardInterrupt:
        sys.stdout.flush()
        print_error(f"interrupted: {interrupted}")
        os._exit(130)
    sys.exit(status)
