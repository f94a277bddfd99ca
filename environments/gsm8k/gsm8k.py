"""gsm8k: grade-school math word problems (single turn).

The model reasons step by step and writes its final answer in `\\boxed{}`; the answer is parsed
from the last `\\boxed{}` (or, failing that, the last number in the reply) and compared
numerically with the reference, so "1,000", "1000.0", "$1000" and "1000." all count as 1000.
Data: GSM8K's training split, shipped with Workbench in `data/` here (MIT, see data/ORIGIN.md), so
it runs offline with no arguments; or your own GSM8K-format JSONL file (`data_path`). Either is
split into seeded, disjoint train and eval sets. `from_hub=True` downloads `openai/gsm8k` instead
(train and test splits; needs `pip install datasets` and a connection).
"""

from __future__ import annotations

from workbench.envs import Rubric, SingleTurnEnv
from workbench.envs.gsm8k_data import gsm8k_datasets, solution_to_completion
from workbench.envs.math_answers import BoxedAnswerParser, correct_answer
from workbench.types import Example, Messages

SYSTEM_PROMPT = (
    "Solve the math word problem. Think step by step, then give the final answer as a number in \\boxed{}."
)


class Gsm8kEnv(SingleTurnEnv):
    def reference_completion(self, example: Example) -> Messages | None:
        solution = example.info.get("solution")
        if not solution:
            return None
        return [{"role": "assistant", "content": solution_to_completion(solution, example.answer)}]


def load_environment(
    data_path: str | None = None,
    eval_data_path: str | None = None,
    num_train_examples: int = -1,
    num_eval_examples: int = 200,
    system_prompt: str = SYSTEM_PROMPT,
    seed: int = 0,
    from_hub: bool = False,
) -> Gsm8kEnv:
    """data_path: GSM8K JSONL, gzipped or not (question / answer ending in `#### n`); without it, the
    shipped GSM8K train split (7,473 rows). eval_data_path: a separate eval JSONL; without it
    `num_eval_examples` rows of the train data are held out (seeded by `seed`, disjoint from train;
    0 = none). num_train_examples/num_eval_examples: split sizes (-1 = all). system_prompt: the
    instruction (GEPA optimizes it). from_hub: openai/gsm8k from the Hugging Face hub instead (train
    and test splits; needs `datasets` and a connection)."""
    dataset, eval_dataset = gsm8k_datasets(
        data_path, eval_data_path, num_train_examples, num_eval_examples, seed, from_hub=from_hub
    )
    parser = BoxedAnswerParser()
    rubric = Rubric([correct_answer, parser.get_format_reward_func()], weights=[1.0, 0.0], parser=parser)
    return Gsm8kEnv(
        dataset=dataset,
        eval_dataset=eval_dataset,
        system_prompt=system_prompt,
        parser=parser,
        rubric=rubric,
        sampling_args={"max_tokens": 512},
    )
