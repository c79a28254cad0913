"""MkDocs hooks.

* The generated pages (configuration and CLI references, benchmarks) are written afresh before every build, so the
  site cannot drift from the code (``docs/generate.py``).
* Every page speaks of the project, never of how it was developed: a page with first-person prose, a date of work, a
  host as a character, an issue number or a branch name is a warning, which ``mkdocs build --strict`` turns into a
  failed build. ``tests/test_docs.py`` applies the same check (:func:`process_language`) to every tracked text file.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

MONTHS = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Sept|Oct|Nov|Dec)[a-z]*"

# Each alternative names one kind of development-process language; the comments say what it catches.
PROCESS_LANGUAGE = re.compile(rf"""
      (?<![\w/.-])I[ ](?=[a-z])                              # first person: "I measured", "I ran"
    | (?<![\w/.-])I'(?:m|ve|d|ll)\b
    | (?<![\w/.-])(?:[Mm]y|me|myself)[ ](?=[a-z])            # "my run", "gave me"
    | \b\d{{1,2}}[ ]{MONTHS}\b                                 # dates of work: "23 Nov", "23 Nov 2026"
    | \b{MONTHS}[ ]\d{{1,2}},?[ ]20\d\d\b                      # "Nov 23, 2026"
    | \b(?:this|that|earlier|later|previous|next|another|first|second|third|no)[ ]sessions?\b  # "an earlier session"
    | \bsessions?[ ]since\b | \bsession's\b
    | \b(?:AVX2|AVX-512|AVX2-only|AMX|AMX-BF16|\d+-core|earlier|this|that|older|newer|same)(?:[ -][\w-]+)?[ ]hosts?\b
    | \b(?:[Aa]cross|[Ee]ach|[Bb]oth)[ ]hosts\b                        # hosts as characters: "the AVX2 host", "this host"
    | \b[Ii]ssues?[ ]\#?\d+\b | (?<![\w&/\#])\#\d+\b           # issue numbers: "issue 12", "#12"
    | \b(?:fix|feature|feat|bugfix|hotfix)-\d+\b | \bon[ ](?:the[ ])?branch\b   # branch names: "on branch fix-13"
    | \bmeasured[ ]here\b                                     # "measured here": where is "here"?
""", re.VERBOSE)


def process_language(text: str) -> list[tuple[int, str]]:
    """``(line number, the matched words)`` of every development-process phrase in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in PROCESS_LANGUAGE.finditer(text)]


log = logging.getLogger("mkdocs.plugins.pgrank")


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate import write_all

    write_all()


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    for line, words in process_language(markdown):
        log.warning("%s:%d: development-process language %r: say what the project does, and name the command",
                    page.file.src_uri, line, words)
    return markdown
