"""Find inside a rollout: occurrences of a query in what a message block draws, highlighted.

Matches are looked for in the *rendered* lines of a block (plain text or markdown, wrapped at the
block's width), not in its source: what is highlighted is what the reader sees, a markdown
`**word**` is found as "word", and the line of each match is known, so the view can scroll to it.
A match that a wrapped line splits in two is not found (a query is usually a word or two).
Case-insensitive.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.segment import Segment
from rich.style import Style

MATCH_STYLE = Style(color="black", bgcolor="yellow")
CURRENT_STYLE = Style(color="black", bgcolor="dark_orange", bold=True, underline=True)


def find_spans(text: str, query: str) -> list[tuple[int, int]]:
    """Non-overlapping case-insensitive occurrences of `query` in `text`, as (start, end) offsets."""
    needle = query.lower()
    haystack = text.lower()
    if not needle or len(haystack) != len(text):  # a lowercase that changes lengths: compare as is
        haystack, needle = text, query
    if not needle:
        return []
    spans, at = [], haystack.find(needle)
    while at >= 0:
        spans.append((at, at + len(needle)))
        at = haystack.find(needle, at + len(needle))
    return spans


def _highlight_line(
    line: list[Segment], query: str, first: int, current: int | None
) -> tuple[list[Segment], int]:
    """`line` with its occurrences of `query` styled (occurrence `current`, counted over the whole
    block, in CURRENT_STYLE); `first` is the count before this line. Returns the line and how many
    occurrences it has."""
    text = "".join(segment.text for segment in line)
    spans = find_spans(text, query)
    if not spans:
        return line, 0
    cells = [(cell_len(text[:start]), cell_len(text[:end])) for start, end in spans]
    cuts = sorted({edge for span in cells for edge in span} | {cell_len(text)})
    pieces = list(Segment.divide(line, cuts))
    result: list[Segment] = list(pieces[0]) if cuts[0] > 0 else []
    # pieces[i + 1] spans cuts[i]..cuts[i + 1] (pieces[0] is everything before the first cut)
    for i, piece in enumerate(pieces[1:]):
        start = cuts[i]
        number = next((n for n, (a, b) in enumerate(cells) if a <= start < b), None)
        if number is None:
            result += piece
            continue
        style = CURRENT_STYLE if first + number == current else MATCH_STYLE
        result += Segment.apply_style(piece, post_style=style)
    return result, len(spans)


@dataclass(frozen=True)
class BlockMatches:
    """Where `query` occurs in one block at one width: the rendered line of each occurrence."""

    lines: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.lines)


def locate(console: Console, renderable: RenderableType, width: int, query: str) -> BlockMatches:
    """The rendered line of each occurrence of `query` in `renderable` drawn `width` cells wide."""
    if not query or width <= 0:
        return BlockMatches(())
    lines = console.render_lines(renderable, console.options.update_width(width), pad=False)
    found: list[int] = []
    for number, line in enumerate(lines):
        found += [number] * len(find_spans("".join(segment.text for segment in line), query))
    return BlockMatches(tuple(found))


class Highlighted:
    """`renderable` with every occurrence of `query` highlighted, occurrence `current` (counted
    from 0 in this renderable) the most."""

    def __init__(self, renderable: RenderableType, query: str, current: int | None = None) -> None:
        self.renderable = renderable
        self.query = query
        self.current = current

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        lines = console.render_lines(self.renderable, options, pad=False)
        seen = 0
        for line in lines:
            styled, count = _highlight_line(line, self.query, seen, self.current)
            seen += count
            yield from styled
            yield Segment.line()


def total(matches: Iterable[BlockMatches]) -> int:
    return sum(match.count for match in matches)
