"""wiki-search: answer questions by searching and reading an encyclopedia with tools (ToolEnv).

Tools: `search_pages(query)` (BM25-ranked pages with a snippet), `view_sections(page_id)` and
`read_section(section_id)`. The index is SQLite FTS5 (BM25 ranking, Porter stemming) from the
standard library: no server, no download. The default corpus is a seeded encyclopedia of
fictional inventions, people, cities, companies, rivers and countries whose facts are spread
over sections of different pages ("In which city was the inventor of the X born?" needs the
invention's page, then the inventor's), so questions can only be answered by searching.
`corpus_path` indexes your own folder of .md/.txt files or a JSONL corpus instead, with
questions from `questions_path`. Reward: normalized exact match of the `<answer>`, or a judge
model's yes/no when `judge_model` is set (see workbench.envs.judge).
"""

from __future__ import annotations

import json
import random
import re
import sqlite3
import string
import threading
from pathlib import Path
from typing import Any

from wiki_search_corpus import Page, generate_encyclopedia, make_page, slugify  # beside this file

from workbench.envs import Parser, Rubric, ToolEnv, XMLParser
from workbench.types import Example, Messages, State

SYSTEM_PROMPT = (
    "Answer the question using the encyclopedia tools: search_pages finds pages, view_sections "
    "lists a page's sections, read_section reads one. Facts are often spread over several pages: "
    "follow them step by step. When you know the answer, reply with just the answer inside "
    "<answer> tags, e.g. <answer>Lake Orvin</answer>."
)


# ----- reading a user corpus ------------------------------------------------------------
_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def markdown_sections(text: str, title: str | None) -> tuple[str | None, list[tuple[str, str]]]:
    """(title, [(heading, text)]): a leading `# Title` names the page; every heading starts a
    section; text before the first heading is the 'Introduction'."""
    sections: list[tuple[str, list[str]]] = [("Introduction", [])]
    in_code = False  # '# comment' inside a ``` block is code, not a heading
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            in_code = not in_code
        match = None if in_code else _HEADING.match(line)
        if (
            match
            and match.group(1) == "#"
            and title is None
            and len(sections) == 1
            and not "".join(sections[0][1]).strip()
        ):
            title = match.group(2)
        elif match:
            sections.append((match.group(2), []))
        else:
            sections[-1][1].append(line)
    return title, [(heading, "\n".join(body)) for heading, body in sections]


def read_corpus(path: Path) -> list[Page]:
    """Pages from a folder of .md/.txt files (one page per file) or a JSONL file whose lines are
    `{"title", "text"}` or `{"title", "sections": [{"heading", "text"}]}` (optional "id")."""
    if not path.exists():
        raise FileNotFoundError(f"corpus_path not found: {path}")
    pages: list[Page] = []
    used: set[str] = set()
    if path.suffix == ".jsonl":
        for number, record in _jsonl(path):
            if "title" not in record or ("text" not in record and "sections" not in record):
                raise ValueError(f"{path}:{number}: a corpus line needs 'title' and 'text' (or 'sections')")
            if "sections" in record:
                sections = [
                    (s.get("heading") or s.get("title") or "Section", s.get("text") or s.get("content") or "")
                    for s in record["sections"]
                ]
            else:
                sections = markdown_sections(record["text"], record["title"])[1]
            pages.append(
                make_page(
                    record["title"], sections, _unique_id(record.get("id") or slugify(record["title"]), used)
                )
            )
    else:
        files = (
            [path]
            if path.is_file()
            else sorted(p for p in path.rglob("*") if p.suffix in (".md", ".txt") and p.is_file())
        )
        for file in files:
            title, sections = markdown_sections(file.read_text(encoding="utf-8", errors="replace"), None)
            page_id = slugify(str(file.relative_to(path).with_suffix("")) if path.is_dir() else file.stem)
            pages.append(
                make_page(
                    title or file.stem.replace("_", " ").replace("-", " "),
                    sections,
                    _unique_id(page_id, used),
                )
            )
    pages = [p for p in pages if p.sections]
    if not pages:
        raise ValueError(f"no documents with text in {path} (expected .md/.txt files or a .jsonl corpus)")
    return pages


def _unique_id(page_id: str, used: set[str]) -> str:
    candidate, n = page_id, 2
    while candidate in used:
        candidate, n = f"{page_id}-{n}", n + 1
    used.add(candidate)
    return candidate


def read_questions(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise FileNotFoundError(f"questions_path not found: {path}")
    rows = []
    for number, record in _jsonl(path):
        if "question" not in record or "answer" not in record:
            raise ValueError(f"{path}:{number}: a question line needs 'question' and 'answer'")
        rows.append(
            {"question": record["question"], "answer": str(record["answer"]), "info": record.get("info", {})}
        )
    if not rows:
        raise ValueError(f"no questions in {path}")
    return rows


def _jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict):
                raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
            records.append((number, record))
    return records


# ----- search index ------------------------------------------------------------------------
_STOPWORDS = frozenset(
    "a an and are at by did does for from how in is it of on or the to was were what when "
    "where which who whom whose why with".split()
)


class WikiIndex:
    """BM25 search over pages (SQLite FTS5), plus the three tools the model calls."""

    def __init__(self, pages: list[Page], results: int = 5) -> None:
        self.pages = {p.page_id: p for p in pages}
        self.sections = {s.section_id: s for p in pages for s in p.sections}
        self.results = results
        # Tools run in worker threads (ToolEnv); one connection shared under a lock.
        self._lock = threading.Lock()
        self._db = sqlite3.connect(":memory:", check_same_thread=False)
        self._db.execute(
            "CREATE VIRTUAL TABLE pages USING fts5(page_id UNINDEXED, title, body, tokenize='porter unicode61')"
        )
        self._db.executemany(
            "INSERT INTO pages VALUES (?, ?, ?)",
            [(p.page_id, p.title, "\n".join(f"{s.heading}. {s.text}" for s in p.sections)) for p in pages],
        )

    def search(self, query: str, limit: int | None = None) -> list[tuple[str, str, str]]:
        """(page_id, title, snippet) of the best pages, best first."""
        words = re.findall(r"\w+", query.lower())
        terms = [w for w in words if w not in _STOPWORDS] or words
        if not terms:
            return []
        match = " OR ".join(f'"{t}"' for t in terms)  # quoted: user text never reaches FTS5 syntax
        with self._lock:
            return self._db.execute(
                "SELECT page_id, title, snippet(pages, 2, '', '', ' … ', 20) FROM pages WHERE pages MATCH ? "
                "ORDER BY bm25(pages, 0.0, 5.0, 1.0) LIMIT ?",
                (match, limit or self.results),
            ).fetchall()

    def page(self, page_id: str) -> Page:
        page = self.pages.get(page_id.strip()) or self.pages.get(slugify(page_id))
        if page is None:
            raise KeyError(f"no page '{page_id}'; use a page_id from search_pages")
        return page

    # The tools: names, type hints and docstrings become the schemas the model sees.
    def search_pages(self, query: str) -> str:
        """Search the encyclopedia; returns the best matching pages with their ids and a snippet.

        Args:
            query: words to look for, e.g. a name or a topic
        """
        hits = self.search(query)
        if not hits:
            return "No pages found. Try other words."
        return "\n".join(
            f"{page_id} | {title} | {snippet.replace(chr(10), ' ')}" for page_id, title, snippet in hits
        )

    def view_sections(self, page_id: str) -> str:
        """List the sections of a page (their ids and headings).

        Args:
            page_id: a page id from search_pages
        """
        page = self.page(page_id)
        return f"{page.title}\n" + "\n".join(f"{s.section_id} | {s.heading}" for s in page.sections)

    def read_section(self, section_id: str) -> str:
        """Read one section of a page.

        Args:
            section_id: a section id from view_sections, like "page-id:section"
        """
        section = self.sections.get(section_id.strip())
        if section is None:
            raise KeyError(f"no section '{section_id}'; use a section_id from view_sections")
        return f"{section.heading}\n{section.text}"

    @property
    def tools(self) -> list[Any]:
        return [self.search_pages, self.view_sections, self.read_section]


# ----- rewards -----------------------------------------------------------------------------
def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation and the articles a/an/the, collapse whitespace (SQuAD-style)."""
    text = "".join(c for c in text.lower() if c not in string.punctuation)
    return " ".join(w for w in text.split() if w not in ("a", "an", "the"))


def exact_match_reward(completion: Messages, answer: str, parser: Parser) -> float:
    """1.0 when the `<answer>` equals the reference answer after normalization."""
    parsed = parser.parse_answer(completion)
    return float(parsed is not None and normalize_answer(parsed) == normalize_answer(answer))


def format_reward(completion: Messages, parser: Parser) -> float:
    """1.0 when the final message holds exactly one `<answer>`."""
    finals = [m for m in completion if m.get("role") == "assistant"][-1:]
    return parser.format_score(finals) if finals else 0.0


def num_tool_calls(state: State) -> float:
    """How many tools the model called (a metric)."""
    return float(state.get("tool_calls", 0))


# ----- environment -------------------------------------------------------------------------
class WikiSearchEnv(ToolEnv):
    def __init__(self, index: WikiIndex, **kwargs: Any) -> None:  # kwargs: ToolEnv's named arguments
        super().__init__(tools=index.tools, **kwargs)
        self.index = index

    def reference_completion(self, example: Example) -> Messages | None:
        """For generated questions: search each page on the path, read its section, answer."""
        hops = example.info.get("hops")
        if not hops:
            return None
        messages: Messages = []
        for n, section_id in enumerate(hops):
            page = self.index.pages[section_id.split(":")[0]]
            for name, args in (
                ("search_pages", {"query": page.title}),
                ("read_section", {"section_id": section_id}),
            ):
                call_id = f"call_{n}_{name}"
                messages.append(
                    {
                        "role": "assistant",
                        "content": "",
                        "tool_calls": [
                            {
                                "id": call_id,
                                "type": "function",
                                "function": {"name": name, "arguments": json.dumps(args)},
                            }
                        ],
                    }
                )
                messages.append(
                    {"role": "tool", "tool_call_id": call_id, "content": getattr(self.index, name)(**args)}
                )
        messages.append({"role": "assistant", "content": f"<answer>{example.answer}</answer>"})
        return messages


def load_environment(
    num_train_examples: int = 1000,
    num_eval_examples: int = 100,
    num_inventions: int = 60,
    corpus_path: str | None = None,
    questions_path: str | None = None,
    max_turns: int = 10,
    judge_model: str | None = None,
    judge_base_url: str | None = None,
    judge_api_key_var: str | None = None,
    system_prompt: str = SYSTEM_PROMPT,
    seed: int = 0,
) -> WikiSearchEnv:
    """num_train_examples/num_eval_examples: questions per split (disjoint; train gets what is
    left); num_inventions: size of the generated encyclopedia (about 3 pages per invention);
    corpus_path: your .md/.txt folder or .jsonl corpus instead (needs questions_path, a JSONL of
    {"question", "answer"}); max_turns: model turns, tool calls included; judge_model: grade
    answers with this model (yes/no) instead of exact match — an endpoint id, or an OpenAI model
    with judge_base_url (default https://api.openai.com/v1) and judge_api_key_var (default
    OPENAI_API_KEY); system_prompt: the instruction (GEPA optimizes it); seed: corpus and split seed."""
    if corpus_path is not None:
        if questions_path is None:
            raise ValueError(
                "corpus_path needs questions_path: a JSONL file with one "
                '{"question": ..., "answer": ...} per line'
            )
        pages, questions = read_corpus(Path(corpus_path)), read_questions(Path(questions_path))
    else:
        pages, questions = generate_encyclopedia(num_inventions, seed)
        if questions_path is not None:
            questions = read_questions(Path(questions_path))
    rng = random.Random(seed)
    questions = list(questions)
    rng.shuffle(questions)
    # Few questions (a small hand-written file): evaluate on all of them and train on all of them.
    eval_rows = questions[:num_eval_examples]
    train_rows = questions[num_eval_examples : num_eval_examples + num_train_examples] or list(eval_rows)

    parser = XMLParser(["answer"], answer_field="answer")
    if judge_model is None:
        rubric = Rubric(
            [exact_match_reward, format_reward, num_tool_calls], weights=[1.0, 0.0, 0.0], parser=parser
        )
    else:
        from workbench.envs.judge import JudgeRubric

        rubric = JudgeRubric(
            [exact_match_reward, format_reward, num_tool_calls],
            weights=[0.0, 0.0, 0.0],
            parser=parser,
            judge_model=judge_model,
            judge_base_url=judge_base_url,
            judge_api_key_var=judge_api_key_var,
        )
        rubric.add_reward_func(rubric.judge_reward, weight=1.0)
    return WikiSearchEnv(
        WikiIndex(pages),
        dataset=train_rows,
        eval_dataset=eval_rows,
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
    )
