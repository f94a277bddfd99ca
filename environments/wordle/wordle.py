"""wordle: guess a secret 5-letter word in at most 6 turns, with per-letter feedback (multi-turn).

Each turn the model writes its guess inside `<guess>` tags; the environment answers with the
Wordle colours (🟩 right letter, right spot · 🟨 in the word, wrong spot · ⬛ not in the word)
and the same in words. A guess that is not a 5-letter word from the word list, or a reply with
no `<guess>`, gets a message saying what was wrong and still uses up the turn. The game ends
on the winning guess or after `max_turns` turns.

Words come from data/words.txt, shipped here: English words ranked by frequency, frozen once from
`wordfreq`'s data (CC BY-SA 4.0, see data/ORIGIN.md; make_word_list.py made it), so nothing
is imported or downloaded. Answers are common 5-letter words, split by a seeded shuffle into
disjoint train and eval sets; any 5-letter word among the 100,000 most frequent English words
is accepted as a guess.
Rewards replay the game from the completion, so hand-written transcripts score the same way.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from workbench.envs import MultiTurnEnv, Rubric, XMLParser
from workbench.types import Example, Messages, State

WORD_LENGTH = 5
MAX_GUESSES = 6
GUESS_VOCABULARY_SIZE = 100_000  # most frequent English words searched for valid guesses
WORDS_FILE = "words.txt"  # in data/: "rank word" lines, 4- and 5-letter words of that top 100,000

SYSTEM_PROMPT = (
    "You are playing Wordle. Guess the secret 5-letter English word. Write each guess inside "
    "<guess> tags, e.g. <guess>crane</guess>. After each guess you get feedback per letter: "
    "G (🟩) = right letter in the right spot, Y (🟨) = in the word but in another spot, "
    "- (⬛) = not in the word. Use the feedback to narrow down the word."
)

# wordfreq's list is lowercased, so names, places, brands, slang, word fragments and offensive
# words look like ordinary words. They stay valid guesses but are never the secret word.
NOT_ANSWERS = frozenset(
    """
aaron abbas abdul adele adler adolf agnes ahmad ahmed aires akbar akron alexa alice allah allan allen
alvin andre angie angus anita anton ariel arent asean asses assad assam aston avery baden baird barca
barry basel bates bauer becky bella belle benny betsy biden bitch blair blake blanc boise boone boris
bosch bowen bowie boyle brady braun brent brett brian brock brody bronx bruce bruno bryan bryce bubba
buffy burke burma busch byrne byron caleb cairo calif carey carla carlo carly carol casey cathy cecil
cesar chang cheng chevy chile china ching chloe chris chung cindy cisco clara clare clark claus clint
clive clyde cohen colin comey comin conan congo conor cooke corey covid craig cyril cyrus czech damon
danny dante darcy daryl david davey davis debra della denis denny derek devon dewey dhabi diana diane
didnt diego dildo dixie dixon dolly donna doris dover doyle drake dubai duffy dunno dylan eaton eddie
edgar edith edwin egypt elena elias eliot eliza ellen ellie ellis elton elvis emery emily erica ernie
ernst essex esque ethan ethel facto fanny fargo fedex felix fiona flynn floyd foley franz freud fritz
garde garry garth gavin geoff gerry getty ghana gibbs giles glenn gmail gomez gonna gotta gould gregg
grimm gucci gupta haiti haley hamas hanna hanoi haram harry hayes hazel heidi hella helen henri henry
hicks hindi hindu hogan homer honda horny huang idaho india intel inter intra iraqi irene irish irwin
isaac islam italy jacob jaime jamal james jamie janet japan jared jason jenna jenny jerry jesse jesus
jimmy jolie jonah jonas jones jonny jorge joyce judah judas jules julia julie julio kabul kanye karen
kathy katie keith kelly kenny kenya kerry kevin kinda kirby klaus klein kraft kumar kurds kylie kyoto
kyrie lamar lanka larry laura leeds leigh lenin lenny leroy levin lewis lgbtq libya lilly linda linux
lloyd lmfao locke logan lopez louie louis lowry lucia lydia maher maine malay malik malta mamma mandy
manny marco maria marie mario marin marta marty mason mater mayer mazda mccoy mcgee mckay mecca megan
messi meyer miami mikey milan miley mitch molly monte monty moore moran morse moses msnbc multi myers
nadal nadia naomi nancy negro nepal nicki nicky nigel niger nigga nikki nikon nixon nokia nolan norma
notre novak obama ofthe olsen olson ollie omaha oprah ortiz orion osaka osama outta paddy paige palin
paolo papua paris patel patty paula paulo payne pedro peggy pence penis pepsi percy perez perry perth
peter piper plato pluto polly poole porno porto pratt prima pussy putin qaeda qatar quinn quran rahul
ralph ramon ramos randy raped reese reich renee reyes rhode ricky riley roche roger rolex romeo rosen
rosie rossi rowan royce rubin rubio rufus ryder sachs salem sally sammy santa santo sarah sasha saudi
saxon sayin scots scott sears semen serie shane shaun shawn shite shiva silva simon sinai singh sioux
skype sloan smith snoop socio sofia sonia sonny soooo spain sperm stacy starr stein steph steve sudan
sunni susan swiss syria tamil tammy tampa tanya tatum teddy terry tesco tesla texas tibet timmy titus
tokyo tomas tommy torah tracy trent trump tryin tudor tulsa turin tyler tyson upton usher vance vicky
vijay vince vitro volvo wales wally walsh wanda wanna wayne weber weiss welch welsh wendy whore wigan
wilde wiley willy wolfe woody wyatt yahoo yates yemen youre zelda zhang
korea billy bobby annie betty cuban seoul delhi pablo lagos leone hague kuala samoa gemma costa anglo
rican crore wasnt gimme yikes sorta sykes kinky booty satan
""".split()
)


# ----- words -------------------------------------------------------------------------------
def _words_path() -> Path:
    """data/words.txt next to this file; from workbench's bundled copy when this module was
    installed alone (a wheel holds only wordle.py)."""
    here = Path(__file__).resolve().parent / "data" / WORDS_FILE
    if here.is_file():
        return here
    from workbench.envs.loader import bundled_environments_dir

    return bundled_environments_dir() / "wordle" / "data" / WORDS_FILE


@lru_cache(maxsize=1)
def _ranked_words() -> tuple[tuple[int, str], ...]:
    """(rank, word) of the lowercase ASCII 4- and 5-letter words among the 100,000 most frequent
    English words, most frequent first (rank 1 is the most frequent word of all)."""
    lines = _words_path().read_text(encoding="utf-8").splitlines()
    return tuple(
        (int(rank), word) for rank, word in (line.split() for line in lines if not line.startswith("#"))
    )


def _words(top_n: int, length: int) -> list[str]:
    """`length`-letter lowercase ASCII words among the `top_n` most frequent English words."""
    return [w for rank, w in _ranked_words() if rank <= top_n and len(w) == length]


def _five_letter_words(top_n: int) -> list[str]:
    """5-letter lowercase ASCII words among the `top_n` most frequent English words."""
    return _words(top_n, WORD_LENGTH)


@lru_cache(maxsize=1)
def valid_guesses() -> frozenset[str]:
    """Every word accepted as a guess."""
    return frozenset(_five_letter_words(GUESS_VOCABULARY_SIZE))


@lru_cache(maxsize=8)
def answer_pool(num_common_words: int) -> tuple[str, ...]:
    """Possible secret words, most frequent first: common 5-letter words, minus plurals of
    shorter common words ("years") and the `NOT_ANSWERS` list."""
    if not 1 <= num_common_words <= GUESS_VOCABULARY_SIZE:
        raise ValueError(
            f"num_common_words must be between 1 and {GUESS_VOCABULARY_SIZE}, got {num_common_words}"
        )
    common = set(_words(num_common_words, WORD_LENGTH - 1))  # what a plural's singular would be
    return tuple(
        w
        for w in _five_letter_words(num_common_words)
        if w not in NOT_ANSWERS and not (w.endswith("s") and w[:-1] in common)
    )


def split_words(
    pool: tuple[str, ...], num_train: int, num_eval: int, seed: int
) -> tuple[list[str], list[str]]:
    """Disjoint (train, eval) secret words from a seeded shuffle of `pool`."""
    if num_eval >= len(pool):
        raise ValueError(
            f"num_eval_examples ({num_eval}) must be smaller than the answer pool ({len(pool)} words); "
            "raise num_common_words or lower num_eval_examples"
        )
    shuffled = list(pool)
    random.Random(seed).shuffle(shuffled)
    return shuffled[num_eval : num_eval + num_train], shuffled[:num_eval]


# ----- game rules --------------------------------------------------------------------------
def score_guess(guess: str, secret: str) -> str:
    """The feedback pattern, one character per letter: G green, Y yellow, - grey.

    Greens are marked first; a yellow is given only while the secret still has unmatched
    copies of that letter, so repeated letters are scored as in Wordle.
    """
    pattern = ["-"] * WORD_LENGTH
    unmatched: dict[str, int] = {}
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            pattern[i] = "G"
        else:
            unmatched[s] = unmatched.get(s, 0) + 1
    for i, g in enumerate(guess):
        if pattern[i] != "G" and unmatched.get(g, 0) > 0:
            pattern[i] = "Y"
            unmatched[g] -= 1
    return "".join(pattern)


_GUESS_TAG = re.compile(r"<guess>(.*?)</guess>", re.DOTALL | re.IGNORECASE)
_EMOJI = {"G": "🟩", "Y": "🟨", "-": "⬛"}
_WORDS = {"G": "right spot", "Y": "wrong spot", "-": "not in word"}


def parse_guess(text: str) -> str | None:
    """The word in the last `<guess>` tag, lowercased, if it is 5 letters; None otherwise."""
    tags = _GUESS_TAG.findall(text or "")
    if not tags:
        return None
    word = tags[-1].strip().strip("\"'`[]().,!").strip().lower()
    return word if re.fullmatch(rf"[a-z]{{{WORD_LENGTH}}}", word) else None


def is_well_formed(text: str) -> bool:
    """Exactly one `<guess>` tag, holding a 5-letter word."""
    return len(_GUESS_TAG.findall(text or "")) == 1 and parse_guess(text) is not None


def feedback_text(guess: str, pattern: str, guesses_left: int) -> str:
    letters = " · ".join(f"{c.upper()} {_WORDS[p]}" for c, p in zip(guess, pattern, strict=True))
    return (
        f"{guess.upper()}  {''.join(_EMOJI[p] for p in pattern)}  {' '.join(pattern)}\n{letters}\n"
        f"{_left(guesses_left)}"
    )


def _left(guesses_left: int) -> str:
    return f"{guesses_left} guess{'es' if guesses_left != 1 else ''} left."


@dataclass
class Turn:
    """One assistant turn: what was guessed and how it was judged."""

    text: str
    guess: str | None  # None when the reply had no well-formed guess
    valid: bool  # in the word list
    pattern: str | None  # feedback, for valid guesses


@dataclass
class Game:
    secret: str
    turns: list[Turn] = field(default_factory=list)

    @property
    def won_at(self) -> int | None:
        """1-based turn of the winning guess, or None."""
        return next((i + 1 for i, t in enumerate(self.turns) if t.guess == self.secret), None)

    @property
    def valid_turns(self) -> list[Turn]:
        return [t for t in self.turns if t.valid]


def judge_turn(text: str, secret: str) -> Turn:
    guess = parse_guess(text)
    if guess is None:
        return Turn(text, None, False, None)
    if guess != secret and guess not in valid_guesses():
        return Turn(text, guess, False, None)
    return Turn(text, guess, True, score_guess(guess, secret))


def replay(completion: Messages, secret: str) -> Game:
    """Judge every assistant turn of a transcript (stopping at a win, as the game does)."""
    game = Game(secret)
    for message in completion:
        if message.get("role") == "assistant":
            game.turns.append(judge_turn(message.get("content") or "", secret))
            if game.won_at:
                break
    return game


def reply_for(turn: Turn, guesses_left: int) -> str:
    """The environment's message after a turn that did not win."""
    if turn.guess is None:
        return (
            f"No guess found: write one 5-letter word inside <guess> tags, e.g. <guess>crane</guess>. "
            f"{_left(guesses_left)}"
        )
    if not turn.valid:
        return f"'{turn.guess}' is not in the word list; that used a turn. {_left(guesses_left)}"
    assert turn.pattern is not None
    return feedback_text(turn.guess, turn.pattern, guesses_left)


# ----- rewards (each replays the game from the transcript) ---------------------------------
def win_reward(completion: Messages, answer: str) -> float:
    """1.0 when a guess hit the secret word."""
    return 1.0 if replay(completion, answer).won_at else 0.0


def partial_credit_reward(completion: Messages, answer: str) -> float:
    """Best valid guess's letters: (greens + 0.5 * yellows) / 5; 1.0 for a win."""
    patterns = [t.pattern for t in replay(completion, answer).valid_turns if t.pattern]
    return max(((p.count("G") + 0.5 * p.count("Y")) / WORD_LENGTH for p in patterns), default=0.0)


def fewer_turns_reward(completion: Messages, answer: str, info: dict) -> float:
    """For a win: 1.0 on the first turn down to 1/max_turns on the last; 0.0 without a win."""
    won_at = replay(completion, answer).won_at
    max_turns = int(info.get("max_turns", MAX_GUESSES))
    return (max_turns - won_at + 1) / max_turns if won_at else 0.0


def format_reward(completion: Messages) -> float:
    """Share of turns with exactly one well-formed `<guess>` of 5 letters."""
    texts = [m.get("content") or "" for m in completion if m.get("role") == "assistant"]
    return sum(is_well_formed(t) for t in texts) / len(texts) if texts else 0.0


# ----- environment -------------------------------------------------------------------------
class WordleEnv(MultiTurnEnv):
    """Judges each guess as it arrives; `state["guesses"]` keeps the game so far."""

    def __init__(self, *, num_common_words: int = 20_000, **kwargs) -> None:  # kwargs: MultiTurnEnv's
        super().__init__(**kwargs)
        self.num_common_words = num_common_words

    def setup_state(self, state: State) -> None:
        state["guesses"] = []
        state["won"] = False

    async def is_completed(self, messages: Messages, state: State) -> bool:
        turn = judge_turn(messages[-1].get("content") or "", state["answer"])
        state["guesses"].append({"guess": turn.guess, "valid": turn.valid, "feedback": turn.pattern})
        state["won"] = turn.guess == state["answer"]
        return state["won"]

    async def env_response(self, messages: Messages, state: State) -> Messages:
        last = state["guesses"][-1]
        turn = Turn(messages[-1].get("content") or "", last["guess"], last["valid"], last["feedback"])
        return [{"role": "user", "content": reply_for(turn, self.max_turns - state["turn"])}]

    def reference_completion(self, example: Example) -> Messages:
        """A solver's game: each guess is the most common answer still consistent with the feedback."""
        candidates = list(answer_pool(self.num_common_words))
        messages: Messages = []
        for turn in range(1, self.max_turns + 1):
            guess = candidates[0] if candidates else example.answer
            messages.append({"role": "assistant", "content": f"<guess>{guess}</guess>"})
            if guess == example.answer or turn == self.max_turns:
                break
            pattern = score_guess(guess, example.answer)
            candidates = [w for w in candidates if w != guess and score_guess(guess, w) == pattern]
            messages.append({"role": "user", "content": feedback_text(guess, pattern, self.max_turns - turn)})
        return messages


def load_environment(
    num_train_examples: int = 1000,
    num_eval_examples: int = 200,
    num_common_words: int = 20_000,
    max_turns: int = MAX_GUESSES,
    system_prompt: str = SYSTEM_PROMPT,
    seed: int = 0,
) -> WordleEnv:
    """num_train_examples/num_eval_examples: secret words per split (disjoint; train gets what is
    left when the pool is small); num_common_words: answers are 5-letter words among this many most
    frequent English words (20,000 gives about 1,500 answers); max_turns: guesses per game;
    system_prompt: the rules (GEPA optimizes it); seed: which words land in which split."""
    if max_turns < 1:
        raise ValueError(f"max_turns must be at least 1, got {max_turns}")
    pool = answer_pool(num_common_words)  # fail at load time, not when the data is first read
    train_words, eval_words = split_words(pool, num_train_examples, num_eval_examples, seed)
    question = (
        f"Guess the secret {WORD_LENGTH}-letter word. You have {max_turns} guesses. "
        "Answer with your first guess inside <guess> tags."
    )

    def rows(words: list[str]) -> list[dict]:
        return [{"question": question, "answer": w, "info": {"max_turns": max_turns}} for w in words]

    parser = XMLParser(["guess"], answer_field="guess")
    rubric = Rubric(
        [win_reward, partial_credit_reward, fewer_turns_reward, format_reward],
        weights=[0.6, 0.2, 0.1, 0.1],
        parser=parser,
    )
    return WordleEnv(
        num_common_words=num_common_words,
        dataset=lambda: rows(train_words),
        eval_dataset=lambda: rows(eval_words),
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        max_turns=max_turns,
    )
