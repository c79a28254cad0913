"""MkDocs hooks.

* The generated pages (configuration and CLI references, benchmarks) are written afresh before every build, so the
  site cannot drift from the code (``docs/generate.py``).
* Every page speaks of the project, never of how it was developed: a page with first-person prose, a date of work, a
  host as a character, an issue number or a branch name is a warning, which ``mkdocs build --strict`` turns into a
  failed build. ``tests/test_docs.py`` applies the same check (``process_language``) to every tracked text file.
* Pages (the README, ``PAPER.md`` and the site) also speak in the present tense: a revision hash in prose, "now" as
  history ("is now", "now uses"), "before that change" or "an earlier invocation" is a warning too
  (``history_language``), and so is "the present code", "the earlier demo" or "the demo as committed": a record's
command and machine say what ran. Code comments and records are not read by it: a pinned model revision or a checksum in code
  is not history, and only the pages are.
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


# History told in a page's prose. Fenced code is blanked first (a command or its output may name a revision), and so
# is inline code with a space in it (a command); a lone `4baae99` in backticks is a revision named in prose. A
# revision is 7 to 12 hex digits with a digit and a letter among them, outside a path; 40-digit pins
# (`models.revisions`) and 64-digit checksums are not history.
HISTORY_LANGUAGE = re.compile(r"""
      (?<![\w/.:#@=+-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}(?![\w/.-])   # a revision: 4baae99, at 7c99e8a
    | \b(?:is|are|was|were|has|have|had|does|do)[ ]now\b                   # "is now", "has now"
    | \b[Nn]ow[ ](?:follows|uses|takes|runs|keeps|reads|writes|gives|chooses|picks|defaults|trains|needs|has|is
                  |are|does|includes|starts|stops|comes|goes|lands|prints|shows|holds|ships|checks|measures)\b
    | \b(?:before|after)[ ](?:that|this|the)[ ]change\b                  # "before that change"
    | \bearlier[ ](?:invocation|run|revision|version|commit)s?\b          # "an earlier invocation"
    | \bread[ ]back[ ]from[ ]an[ ]earlier\b
    | \b(?:[Tt]he[ ]present[ ]code|[Tt]he[ ]earlier[ ]demo|[Tt]he[ ]demo[ ]as[ ]committed)\b   # a record names what ran
    | \b(?:same|much|more|less|faster|slower)[ ](?:as|than)[ ]before\b   # "the same as before"
    | \b(?:used[ ]to|no[ ]longer)[ ](?:be|take|need|use|run|read|write|give)s?\b   # "used to take", "no longer needs"
""", re.VERBOSE)
FENCED = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[^\n]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]+`")


def process_language(text: str) -> list[tuple[int, str]]:
    """``(line number, the matched words)`` of every development-process phrase in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(0)) for m in PROCESS_LANGUAGE.finditer(text)]


def history_language(text: str) -> list[tuple[int, str]]:
    """``(line number, the matched words)`` of every revision hash or piece of history in a Markdown page's prose."""
    def blank(m: re.Match) -> str:
        return re.sub(r"[^\n]", " ", m.group(0))

    def command(m: re.Match) -> str:
        return blank(m) if re.search(r"\s", m.group(0)) else m.group(0)

    prose = CODE_SPAN.sub(command, FENCED.sub(blank, text))
    return [(prose.count("\n", 0, m.start()) + 1, m.group(0)) for m in HISTORY_LANGUAGE.finditer(prose)]


log = logging.getLogger("mkdocs.plugins.pgrank")


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate import write_all

    write_all()


def on_page_markdown(markdown: str, page, **kwargs) -> str:
    for line, words in process_language(markdown):
        log.warning("%s:%d: development-process language %r: say what the project does, and name the command",
                    page.file.src_uri, line, words)
    for line, words in history_language(markdown):
        log.warning("%s:%d: history %r: say what the project does, in the present tense; history is git log's",
                    page.file.src_uri, line, words)
    return markdown
