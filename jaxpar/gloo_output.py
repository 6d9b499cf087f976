"""gloo's connection lines kept off standard output in a multi-process CPU run (jaxpar.cluster
starts the filter when it joins and finishes it before a one-line exit). Imports nothing of
jaxpar or JAX.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import sys
import threading


class QuietGloo:
    """gloo prints "[Gloo] Rank N is connected to M peer ranks. ..." on stdout for every group
    of devices a collective opens (39 lines in a 2-process run, some spliced into other lines
    by its threads). Standard output goes through a pipe whose reader drops those pieces and
    passes everything else on; JAXPAR_DEBUG=1 keeps them. `finish` (at exit, or before
    `lost`) passes on what is left."""

    # gloo writes each piece of its message separately, so pieces of several messages (and
    # of the lines around them) interleave: drop the constant pieces wherever they are, then
    # lines left holding only the numbers.
    PIECES = re.compile(
        rb"\[Gloo\] Rank | is connected to | peer ranks\. |"
        rb"Expected number of connected peer ranks is : "
    )
    NUMBERS = re.compile(rb"[\d\s]*")
    thread: threading.Thread | None = None
    original = -1

    @classmethod
    def start(cls) -> None:
        if cls.thread is not None:
            return
        sys.stdout.flush()
        read, write = os.pipe()
        cls.original = os.dup(1)
        os.dup2(write, 1)
        os.close(write)
        cls.thread = threading.Thread(target=cls._pump, args=(read,), daemon=True)
        cls.thread.start()
        atexit.register(cls.finish)

    @classmethod
    def _pump(cls, read: int) -> None:
        pending = b""
        while True:
            ready, _, _ = select.select([read], [], [], 0.3)
            if ready:
                chunk = os.read(read, 65536)
                if not chunk:  # every writer closed: the end
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                kept = [line for line in map(cls._clean, lines) if line is not None]
                if kept:
                    os.write(cls.original, b"".join(line + b"\n" for line in kept))
            elif pending and (rest := cls._clean(pending)) is not None:
                os.write(cls.original, rest)  # idle with a partial line (a prompt): pass it on
                pending = b""
        if pending and (rest := cls._clean(pending)) is not None:
            os.write(cls.original, rest)
        os.close(read)

    @classmethod
    def _clean(cls, line: bytes) -> bytes | None:
        """`line` without gloo's pieces; None if nothing but gloo's numbers was left."""
        kept = cls.PIECES.sub(b"", line)
        if line.strip() and cls.NUMBERS.fullmatch(kept):
            return None
        return kept

    @classmethod
    def finish(cls) -> None:
        """Pass on everything written so far and give standard output back."""
        sys.stdout.flush()
        if cls.thread is None:
            return
        thread, cls.thread = cls.thread, None
        os.dup2(cls.original, 1)  # closes the pipe's last writer: the reader drains and ends
        thread.join(timeout=2)
