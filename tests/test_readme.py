"""The README a newcomer reads: short enough to read, every relative link in it resolves, and the
demo output it shows is what ``nanguard demo`` prints.

The demo test is in the end-to-end tier (``pytest -m slow``): it runs the demo in a fresh process
like the rest of that tier. Its timeout is a hang guard; no duration is asserted.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from urllib.parse import unquote

from _spawn import Spawn

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_LINES = 400
#: the HTML comment right before the ```text block that holds the demo's output
DEMO_MARKER = "<!-- demo-output: nanguard demo -->"

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,}).*?^ {0,3}\1[ \t]*$", re.M | re.S)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_INLINE_LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_REF_LINK = re.compile(r"^ {0,3}\[[^\]]+\]:[ \t]*<?([^\s>]+)>?(?:[ \t].*)?$", re.M)
_HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
_EXTERNAL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")  # https:, mailto:, ...

#: the one field of the demo's output that varies from run to run: the wall time to the catch
#: ("caught at step 4 after 1.01 s, ..."). Everything else is computed from a seeded run.
_DEMO_TIME = re.compile(r"(?m)^(caught at step \d+ after )\d+(?:\.\d+)? s\b")
#: what makes rich treat a pipe as a terminal
_TERMINAL_ENV = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def _without_code(markdown: str) -> str:
    """The prose of a markdown text: fenced blocks and code spans out (no links live there)."""
    return _CODE_SPAN.sub("", _FENCE.sub("", markdown))


def _relative_links(markdown: str) -> list[str]:
    prose = _without_code(markdown)
    links = _INLINE_LINK.findall(prose) + _REF_LINK.findall(prose)
    return [link for link in links if not _EXTERNAL.match(link)]


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation out, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text stays
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(markdown: str) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for heading in _HEADING.findall(_FENCE.sub("", markdown)):
        slug = _slug(heading)
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _broken(link: str, source: Path) -> str | None:
    """Why a relative link in the markdown file ``source`` does not resolve, or None."""
    path, _, anchor = link.partition("#")
    target = (source.parent / unquote(path)).resolve() if path else source
    if ROOT not in target.parents and target != ROOT:
        return f"{link}: outside the repository"
    if not target.exists():
        return f"{link}: no such file or folder ({target.relative_to(ROOT)})"
    if anchor and target.suffix == ".md" and unquote(anchor) not in _anchors(target.read_text(encoding="utf-8")):
        return f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}"
    return None


def _demo_block(markdown: str) -> str:
    """The ```text block right after the demo marker, without its fences."""
    assert markdown.count(DEMO_MARKER) == 1, f"README.md must hold {DEMO_MARKER!r} exactly once"
    after = markdown.split(DEMO_MARKER, 1)[1]
    m = re.match(r"\s*```text\n(.*?)\n```[ \t]*$", after, re.S | re.M)
    assert m, f"a ```text block must follow {DEMO_MARKER!r}"
    return m.group(1)


def _normalise(output: str) -> str:
    text, n = _DEMO_TIME.subn(r"\1<seconds> s", output.rstrip("\n"))
    assert n == 1, f"expected one 'caught at step N after T s' line, found {n}:\n{output}"
    return text


def test_readme_is_at_most_400_lines() -> None:
    n = len(README.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines; at most {MAX_LINES} (move detail to docs/)"


def test_readme_relative_links_resolve() -> None:
    text = README.read_text(encoding="utf-8")
    links = _relative_links(text)
    assert links, "no relative links found: the link pattern no longer matches the README"
    broken = [why for link in links if (why := _broken(link, README))]
    assert not broken, "broken links in README.md:\n" + "\n".join(broken)


def test_link_checker_sees_a_broken_link_and_a_broken_anchor() -> None:
    text = "see [a](docs/no-such-file.md), [b](README.md#no-such-heading), [c](https://x.org/y)\n"
    found = [why for link in _relative_links(text) if (why := _broken(link, README))]
    assert len(found) == 2 and "no such file" in found[0] and "no heading" in found[1], found


def test_demo_normalisation_touches_only_the_time() -> None:
    line = "caught at step 4 after 12.34 s, before the bad update reached the weights."
    assert _normalise(f"a 1.5 s\n{line}\n") == (
        "a 1.5 s\ncaught at step 4 after <seconds> s, before the bad update reached the weights.")


def test_readme_demo_output_is_the_demo_s_real_output(spawn: Spawn) -> None:
    shown = _demo_block(README.read_text(encoding="utf-8"))
    # the demo as a newcomer runs it from the repository: this checkout's source (its `source:`
    # lines are relative to the working directory), plain text (rich prints a panel when it is
    # told the pipe is a terminal), no NANGUARD_* setting of the calling shell
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("NANGUARD_") and k not in _TERMINAL_ENV}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT / "src"), env.get("PYTHONPATH")) if p)
    proc = spawn.nanguard("demo", cwd=ROOT, env=env, timeout=600)  # a hang guard only
    assert proc.returncode == 0, proc.stderr
    shown_lines, real_lines = _normalise(shown).splitlines(), _normalise(proc.stdout).splitlines()
    assert shown_lines == real_lines, (
        "the README's demo block is not what `nanguard demo` prints (paste its stdout after "
        f"{DEMO_MARKER!r}):\n{proc.stdout}")
