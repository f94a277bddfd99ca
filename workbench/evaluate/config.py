"""`EvalConfig`: everything `workbench eval run` needs. The CLI flags and an eval TOML map onto it.

A TOML eval config uses the field names below, e.g.

    # workbench eval run configs/eval/reverse-text.toml
    env_id = "reverse-text"
    model = "tiny"
    num_examples = 20
    rollouts_per_example = 8
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from workbench.config.bounds import Bounded
from workbench.config.secrets import key_variable_name
from workbench.types import ModelDtype


class EvalConfig(Bounded):
    model_config = ConfigDict(extra="forbid")

    env_id: str = Field(description="Environment id: 'reverse-text', 'owner/name', or a module name.")
    env_args: dict[str, Any] = Field(
        default_factory=dict, description="Arguments for the env's load_environment (-a)."
    )
    model: str = Field(
        "tiny",
        description="'tiny', a local model folder or checkpoint, a Hugging Face id, an endpoint id, or the served model name with -b (-m).",
    )
    num_examples: int = Field(5, description="Examples from the eval split; -1 for all (-n).")
    example_offset: int = Field(
        0,
        ge=0,
        description="Skip this many examples at the start of the eval split (held-out checks: `gepa verify` starts past the examples GEPA validated on).",
    )
    rollouts_per_example: int = Field(
        3, ge=1, le=65536, description="Rollouts per example; groups give reward variance (-r)."
    )
    max_concurrent: int = Field(32, ge=1, description="Rollouts in flight at once (-c).")
    max_tokens: int | None = Field(None, ge=1, description="Max tokens per model turn (-t).")
    temperature: float | None = Field(None, ge=0, description="Sampling temperature (-T).")
    sampling_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra sampling settings as JSON (-S), e.g. top_p, top_k, stop."
    )
    api_base_url: str | None = Field(None, description="Base URL of an OpenAI-compatible server (-b).")
    api_key_var: str | None = Field(
        None, description="Name of the environment variable holding the API key (-k)."
    )
    endpoints_path: str | None = Field(
        None, description="Endpoint registry (-e); default configs/endpoints.toml."
    )
    dtype: ModelDtype = Field(
        "auto",
        description="Weights' dtype for a model run in this process (--dtype): 'auto' is float32 on CPU and the checkpoint's dtype on GPU; bfloat16 is faster on a CPU with native bf16 (AMX, AVX512-BF16). A server (-b, an endpoint id) picks its own.",
    )
    request_timeout: float | None = Field(
        None,
        gt=0,
        description="Seconds a model server may stay silent before a request is retried (--timeout); default: the endpoint's, else 60.",
    )
    request_tries: int | None = Field(
        None,
        ge=1,
        description="Tries per model request before a rollout counts as a server failure (--tries); default: the endpoint's, else 5.",
    )
    state_columns: list[str] = Field(
        default_factory=list, description="Rollout state keys saved with each rollout (-C)."
    )
    seed: int | None = Field(
        0, description="Sampling seed; each rollout gets a distinct seed derived from it."
    )
    verbose: bool = Field(False, description="Print every rollout (-v).")
    save_results: bool = Field(True, description="Results are always saved; accepted for compatibility (-s).")

    _key_names = field_validator("api_key_var")(classmethod(lambda cls, value: key_variable_name(value)))

    @field_validator("num_examples")
    @classmethod
    def _positive_or_all(cls, value: int) -> int:
        if value == 0 or value < -1:
            raise ValueError("must be a positive number, or -1 for all examples")
        return value
