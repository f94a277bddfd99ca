"""`GepaConfig`: everything `workbench gepa run` needs. The CLI flags and a GEPA TOML map onto it.

A TOML config uses the field names below (the keys of prime's gepa.toml, plus workbench's own),
e.g.

    # workbench gepa run configs/gepa/reverse-text.toml
    env_id = "reverse-text"
    model = "tiny"
    reflection_model = "my-big-model"
    reflection_base_url = "http://127.0.0.1:8001/v1"
    max_calls = 500
    num_train = 100
    num_val = 50
    minibatch_size = 3
    perfect_score = 1.0
    state_columns = ["parsed_answer"]
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator

from workbench.config.bounds import Bounded
from workbench.config.optimizers import OptimizerName
from workbench.config.secrets import key_variable_name

# How much a reflection may write: a whole new system prompt, not one answer line.
DEFAULT_REFLECTION_MAX_TOKENS = 2048


class GepaConfig(Bounded):
    """One GEPA prompt-optimization run: the env whose system prompt is optimized, the policy model
    that is scored with each candidate prompt, and the reflection model that proposes new ones."""

    model_config = ConfigDict(extra="forbid")

    env_id: str = Field(
        description="Environment id: 'reverse-text', 'owner/name', or a module name. Its load_environment() must take `system_prompt`."
    )
    env_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Arguments for the env's load_environment (-a). A `system_prompt` here is the seed prompt; otherwise the env's default is.",
    )
    model: str = Field(
        "tiny",
        description="Policy model whose prompt is optimized: 'tiny', a local model folder or checkpoint, a Hugging Face id, an endpoint id, or the served model name with -b (-m).",
    )
    reflection_model: str | None = Field(
        None,
        description="Model that reads the rollouts and proposes new prompts; defaults to `model` (-M). Same forms as `model`.",
    )
    max_calls: int = Field(
        500,
        ge=1,
        description="Budget: metric calls (one rollout of one example = one call), seed evaluation included; never exceeded (-B).",
    )
    num_train: int = Field(
        100,
        description="Training examples (from the env's train split) that reflection minibatches are drawn from; -1 for all (-n).",
    )
    num_val: int = Field(
        50,
        description="Validation examples (from the env's eval split) that every accepted candidate is scored on; -1 for all (-N).",
    )
    minibatch_size: int = Field(
        3, ge=1, description="Training examples per reflection step (--minibatch-size)."
    )
    perfect_score: float | None = Field(
        1.0,
        description="A score no prompt can beat: minibatches where every example reaches it are skipped (no reflection needed). None disables the skip (--perfect-score).",
    )
    state_columns: list[str] = Field(
        default_factory=list,
        description="Rollout state keys shown to the reflection model with each example (-C).",
    )
    candidate_selection: Literal["pareto", "current_best", "epsilon_greedy", "top_k_pareto"] = Field(
        "pareto",
        description="Which candidate the next reflection improves: sampled from the Pareto frontier (GEPA's default), or the current best.",
    )
    max_concurrent: int = Field(32, ge=1, description="Rollouts in flight at once (-c).")
    max_tokens: int | None = Field(None, ge=1, description="Max tokens per policy model turn (-t).")
    temperature: float | None = Field(None, ge=0, description="Policy sampling temperature (-T).")
    sampling_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra policy sampling settings as JSON (-S), e.g. top_p, top_k, stop.",
    )
    api_base_url: str | None = Field(
        None, description="Base URL of the policy's OpenAI-compatible server (-b)."
    )
    api_key_var: str | None = Field(
        None, description="Name of the environment variable holding the policy server's API key (-k)."
    )
    endpoints_path: str | None = Field(
        None, description="Endpoint registry (-e); default configs/endpoints.toml. Used for both models."
    )
    request_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a model server may stay silent before a request is retried (--timeout); default: the endpoint's, else 60. Both models.",
    )
    request_tries: int | None = Field(
        None,
        ge=1,
        description="Tries per model request before it counts as a server failure (--tries); default: the endpoint's, else 5. Both models.",
    )
    reflection_base_url: str | None = Field(
        None,
        description="Base URL of the reflection model's server. Default: the endpoint registry entry named by reflection_model if there is one, else the policy's server (-b).",
    )
    reflection_api_key_var: str | None = Field(
        None,
        description="Name of the environment variable holding the reflection server's API key; defaults to -k when the reflection model runs on the policy's server.",
    )
    reflection_sampling_args: dict[str, Any] = Field(
        default_factory=dict,
        description=f"Reflection sampling settings as JSON, e.g. temperature; max_tokens defaults to {DEFAULT_REFLECTION_MAX_TOKENS}.",
    )
    optimizer: OptimizerName = Field(
        "gepa",
        description="Which optimizer searches: 'gepa' (reflection + Pareto frontier), or DSPy's 'miprov2' (instructions from -M plus few-shot demos, Bayesian search) or 'bootstrap' (few-shot demos from the model's own good rollouts, random search); the DSPy ones need the dspy extra.",
    )
    max_demos: int = Field(
        4, ge=1, description="DSPy optimizers: few-shot demonstrations per candidate, at most."
    )
    demo_threshold: float | None = Field(
        None,
        description="DSPy optimizers: the reward a rollout needs to become a demonstration; default: any reward above 0.",
    )
    num_candidates: int | None = Field(
        None,
        ge=0,
        description="DSPy optimizers: candidates to search (bootstrap: shuffled demo sets, default up to 6; miprov2: instructions and demo sets, default 3), within -B.",
    )
    num_trials: int | None = Field(
        None,
        ge=1,
        description="miprov2: Bayesian-search trials, each scored on the validation set; default: as many as -B allows, at most num_candidates².",
    )
    seed: int = Field(
        0, description="Seed of GEPA's sampling (minibatches, candidate choice) and of the policy's sampling."
    )
    output_dir: str | None = Field(
        None,
        description="Run folder to write (-o); default environments/<env>/outputs/gepa/<env>--<model>/<run_id>/.",
    )

    _key_names = field_validator("api_key_var", "reflection_api_key_var")(
        classmethod(lambda cls, value: key_variable_name(value))
    )

    @field_validator("num_train", "num_val")
    @classmethod
    def _positive_or_all(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive number, or -1 for all examples")
        return value

    @property
    def reflection_model_name(self) -> str:
        return self.reflection_model or self.model
