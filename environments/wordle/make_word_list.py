"""Regenerate data/words.txt, the word list the wordle environment ships, from `wordfreq`.

Run once by a maintainer (`pip install wordfreq==3.1.1 && python make_word_list.py`); the wordle
environment itself never imports wordfreq. wordfreq (Apache-2.0 code, CC BY-SA 4.0 data) is no
longer updated upstream and pulls ~58 MB of dependencies, so its one use here — ranking English
words — is frozen into a small file instead.

The file keeps, from wordfreq's 100,000 most frequent English words (`top_n_list("en", 100000)`),
every lowercase ASCII word of 4 or 5 letters with its rank (1 = most frequent): 5-letter words
are the guesses and secret words, 4-letter ones tell plurals ("years") from answers. That is
enough to reproduce what the environment computed from wordfreq, for any `num_common_words`.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path

TOP_N = 100_000
OUT = Path(__file__).resolve().parent / "data" / "words.txt"
HEADER = """\
# wordle word list: rank and word, for the lowercase ASCII words of 4 or 5 letters among the
# {top_n:,} most frequent English words of wordfreq {version} (top_n_list("en", {top_n})), most
# frequent first. Derived from wordfreq's data: CC BY-SA 4.0, see ORIGIN.md. Made by
# make_word_list.py; do not edit by hand.
"""


def main() -> None:
    from wordfreq import top_n_list

    lines = [
        f"{rank} {word}\n"
        for rank, word in enumerate(top_n_list("en", TOP_N), 1)
        if len(word) in (4, 5) and word.isascii() and word.isalpha() and word.islower()
    ]
    OUT.write_text(HEADER.format(top_n=TOP_N, version=version("wordfreq")) + "".join(lines), encoding="utf-8")
    print(f"{OUT}: {len(lines)} words")


if __name__ == "__main__":
    main()
