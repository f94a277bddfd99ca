"""`workbench setup`: scaffold a workspace and build the embedded tiny model.

Idempotent: files that exist are left alone (a user's edits are never overwritten without
`force`), and the tiny model is rebuilt only when its build recipe changed.
"""

from __future__ import annotations

import filecmp
import random
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.envs.loader import bundled_environments_dir
from workbench.workspace import SMOLLM2_MODEL_NAME, named_model_dir, tiny_model_dir, tiny_qwen_model_dir

BUNDLED_ENVS = ("reverse_text", "alphabet_sort", "gsm8k", "math_python", "wordle", "wiki_search")
# The tiny model is warm-started on these envs' reference answers only: short, format-heavy
# tasks a 1M-parameter model can partly learn in a minute. Share of demonstrations per env:
# mostly reverse-text (the env RL is shown on), enough alphabet-sort to hold a conversation.
TINY_DEMO_SHARES = {"reverse_text": 0.85, "alphabet_sort": 0.15}
# Share of each env's demonstrations answered in plain text, without the tags its parser
# reads (they score 0). Like a base model that has not yet learned an environment's answer
# format: the warm start uses the format about half the time, and learning to always use it
# is a prompt-independent skill RL picks up in minutes on a CPU and that carries over to
# held-out prompts (on top of sharpening the reversals themselves). 0 = always formatted.
TINY_UNFORMATTED_SHARES = {"reverse_text": 0.5}
# Share of each env's demonstrations that open with 1-3 solved examples as earlier turns
# (few-shot, as verifiers' `few_shot` renders them), always formatted. Without them the model
# has never seen a second assistant turn in this env and answers any few-shot prompt with a
# closing tag; with them it learns to copy the format the examples show, so prompt optimizers
# that pick demonstrations (DSPy's bootstrap / MIPROv2) have something to find.
TINY_FEW_SHOT_SHARES = {"reverse_text": 0.2}
TINY_MAX_SHOTS = 3
# tiny-qwen learns formats, not tasks: always formatted, with a short thinking block in most
# assistant turns, and math-python's reference tool calls so it emits <tool_call> too.
TINY_QWEN_DEMO_SHARES = {"reverse_text": 0.5, "alphabet_sort": 0.15, "math_python": 0.35}
TINY_QWEN_THINK_SHARE = 0.9


def scaffold_source() -> Path:
    """Config templates: inside the wheel, or the repository's configs/ for an editable install."""
    packaged = Path(__file__).resolve().parent / "_scaffold" / "configs"
    return packaged if packaged.is_dir() else Path(__file__).resolve().parent.parent / "configs"


@dataclass
class ScaffoldReport:
    created: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept_edited: list[Path] = field(default_factory=list)
    overwritten: list[Path] = field(default_factory=list)


def _copy_tree(source: Path, target: Path, force: bool, report: ScaffoldReport) -> None:
    for src in sorted(source.rglob("*")):
        if src.is_dir() or "__pycache__" in src.parts or "outputs" in src.relative_to(source).parts:
            continue
        dst = target / src.relative_to(source)
        if not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst)
            report.created.append(dst)
        elif filecmp.cmp(src, dst, shallow=False):
            report.unchanged.append(dst)
        elif force:
            shutil.copy2(src, dst)
            report.overwritten.append(dst)
        else:
            report.kept_edited.append(dst)


def scaffold_workspace(root: Path, force: bool = False) -> ScaffoldReport:
    """configs/{rl,eval,gepa}, configs/endpoints.toml, environments/ with the bundled envs, outputs/."""
    report = ScaffoldReport()
    root.mkdir(parents=True, exist_ok=True)
    if scaffold_source().resolve() != (root / "configs").resolve():
        _copy_tree(scaffold_source(), root / "configs", force, report)
    bundled = bundled_environments_dir()
    for name in BUNDLED_ENVS:
        if (bundled / name).resolve() != (root / "environments" / name).resolve():
            _copy_tree(bundled / name, root / "environments" / name, force, report)
    (root / "outputs" / "models").mkdir(parents=True, exist_ok=True)
    return report


Progress = Callable[[int, int, float], None]


def _bundled_env(name: str, count: int) -> Any:
    from workbench.envs.loader import EnvSource, import_env_module

    module = import_env_module(EnvSource(name, bundled_environments_dir() / name, "bundled"))
    env = module.load_environment(num_train_examples=count)
    env.env_id = name.replace("_", "-")
    return env


def tiny_demonstrations(total: int) -> list[list[dict]]:
    """SFT demonstrations from the bundled environments' train splits (prompt + reference answer)."""
    demos: list[list[dict]] = []
    for name, share in TINY_DEMO_SHARES.items():
        count = int(total * share)
        env = _bundled_env(name, count)
        unformatted = TINY_UNFORMATTED_SHARES.get(name, 0.0)
        few_shot = TINY_FEW_SHOT_SHARES.get(name, 0.0)
        pick = random.Random(name)
        examples = env.get_examples(count, split="train")
        for example in examples:
            reference = env.reference_completion(example)
            if pick.random() < few_shot:
                k = pick.randint(1, TINY_MAX_SHOTS)
                shots = [shot for shot in pick.sample(examples, k + 1) if shot is not example][:k]
                turns = [m for shot in shots for m in (shot.prompt[-1], *env.reference_completion(shot))]
                demos.append([*example.prompt[:-1], *turns, example.prompt[-1], *reference])
                continue
            if pick.random() < unformatted:
                reference = [{"role": "assistant", "content": example.answer}]
            demos.append(example.prompt + reference)
    return demos


def build_tiny(root: Path, progress: Progress | None = None, force: bool = False) -> tuple[Path, bool]:
    """Build outputs/models/tiny unless a current build is there. Returns (path, built_now)."""
    from workbench.models.tiny import TinyModelSpec, build_fingerprint, build_tiny_model, is_current_build

    spec = TinyModelSpec()
    out = tiny_model_dir(root)
    # The demonstrations come from this file and the bundled envs: changing either rebuilds.
    recipe = [Path(__file__)] + [bundled_environments_dir() / n / f"{n}.py" for n in TINY_DEMO_SHARES]
    fingerprint = build_fingerprint(spec, extra="".join(p.read_text() for p in recipe))
    if not force and is_current_build(out, fingerprint):
        return out, False
    demos = tiny_demonstrations(spec.num_demonstrations)
    build_tiny_model(out, demos, spec=spec, progress=progress, fingerprint=fingerprint)
    return out, True


def _thought(env_name: str, example: Any, message: dict, turn: int) -> str:
    """A short thinking line for one assistant turn of a demonstration. All start alike ("The
    user"/"The tool"), so a small model learns to open its think block with words, not an empty one."""
    if message.get("tool_calls"):
        return "The user wants an exact number, so I will compute it in Python and print it."
    if env_name == "reverse_text":
        return f'The user wants "{example.prompt[-1]["content"]}" reversed character by character.'
    if env_name == "alphabet_sort":
        return (
            "The user wants these names sorted alphabetically, one per line."
            if turn == 0
            else "The user added names, so I sort the whole list again."
        )
    if env_name == "math_python":
        return f"The tool printed {example.answer}, so that is the answer."
    return "The user wants the answer in the format the instructions ask for."


def tiny_qwen_demonstrations(
    total: int, think_share: float = TINY_QWEN_THINK_SHARE
) -> list[tuple[list[dict], Any]]:
    """(conversation, tools) pairs from the bundled environments' reference answers; about
    `think_share` of the assistant turns carry a short `reasoning_content`."""
    demos: list[tuple[list[dict], Any]] = []
    for name, share in TINY_QWEN_DEMO_SHARES.items():
        count = int(total * share)
        env = _bundled_env(name, count)
        pick = random.Random(f"{name}:think")
        for example in env.get_examples(count, split="train"):
            reference = env.reference_completion(example)
            if not reference:
                continue
            turns: list[dict] = []
            for message in reference:
                if message.get("role") == "assistant" and pick.random() < think_share:
                    turn = sum(m.get("role") == "assistant" for m in turns)
                    message = {**message, "reasoning_content": _thought(name, example, message, turn)}
                turns.append(message)
            demos.append((example.prompt + turns, env.oai_tools))
    return demos


def build_tiny_qwen(root: Path, progress: Progress | None = None, force: bool = False) -> tuple[Path, bool]:
    """Build outputs/models/tiny-qwen unless a current build is there. Returns (path, built_now)."""
    from workbench.models.tiny import is_current_build
    from workbench.models.tiny_qwen import TinyQwenSpec, build_fingerprint, build_tiny_qwen_model

    spec = TinyQwenSpec()
    out = tiny_qwen_model_dir(root)
    recipe = [Path(__file__)] + [bundled_environments_dir() / n / f"{n}.py" for n in TINY_QWEN_DEMO_SHARES]
    fingerprint = build_fingerprint(spec, extra="".join(p.read_text() for p in recipe))
    if not force and is_current_build(out, fingerprint):
        return out, False
    demos = tiny_qwen_demonstrations(spec.num_demonstrations)
    build_tiny_qwen_model(out, demos, spec=spec, progress=progress, fingerprint=fingerprint)
    return out, True


def fetch_smollm2(
    root: Path, source: Path | None = None, force: bool = False, say: Callable[[str], None] = lambda _: None
) -> tuple[Path, str | None]:
    """Save SmolLM2-135M-Instruct as outputs/models/smollm2-135m unless it is there (`force` or a
    `source` fetches again). Returns (path, where it came from; None when it was already there)."""
    from workbench.models.smollm2 import fetch_smollm2 as fetch

    out = named_model_dir(SMOLLM2_MODEL_NAME, root)
    if not force and source is None and (out / "config.json").is_file():
        return out, None
    return out, fetch(out, source, say)
