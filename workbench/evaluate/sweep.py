"""`run_sweep`: evaluate the base model and chosen checkpoints of a training run on the same
examples and seed, the way users pick the checkpoint to ship (prime-rl's `eval --weights-dir
--steps --no-eval-base`).

    workbench eval run reverse-text -m outputs/runs/latest --checkpoints all -n 64 -r 2

Each point is an ordinary eval run (its rollouts in the env's eval folder, listed by the TUI),
recorded in the training run's `checkpoint_evals.jsonl` (`store.sweeps`); a point already
recorded with the same settings is not evaluated again. Checkpoints are loaded in-process, one
at a time, or, with `-b URL`, into that server (started with the base model, as prime-rl's docs
have it): a LoRA checkpoint through `/v1/load_lora_adapter` (evaluated under the name
`<run>-step_N`, the previous one unloaded), full weights through `/update_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.errors import UserError
from workbench.evaluate.config import EvalConfig
from workbench.evaluate.service import run_eval
from workbench.events import NullReporter, Reporter
from workbench.store.checkpoints import (
    CHECKPOINTS,
    checkpoint_step,
    list_checkpoints,
    read_step_info,
    resolve_latest_run,
)
from workbench.store.runs import now_iso
from workbench.store.sweeps import (
    BASE,
    SweepKey,
    SweepPoint,
    append_point,
    points_for,
    step_label,
    write_table,
)


@dataclass
class SweepTarget:
    step: int  # BASE for the base model
    model: str  # what is evaluated: the base model as the run named it, or a checkpoint folder


@dataclass
class SweepResult:
    run_dir: Path
    points: list[SweepPoint]  # in step order, base first
    skipped: list[int]  # steps that were already evaluated with these settings
    table: Path  # the CSV of this sweep's table


def training_run_folder(model: str) -> Path:
    """The training run `-m` names with --checkpoints: a run folder, or `<runs>/latest` (the
    newest run that has a checkpoint)."""
    path = resolve_latest_run(Path(model).expanduser())
    if path.name.startswith("step_") and path.parent.name == CHECKPOINTS:
        path = path.parent.parent  # a checkpoint folder: its run
    if not (path / CHECKPOINTS).is_dir():
        raise UserError(
            f"--checkpoints needs a training run folder for -m (outputs/runs/<run> or outputs/runs/latest); "
            f"'{model}' has no {CHECKPOINTS}/ folder"
        )
    return path


def sweep_targets(run_dir: Path, checkpoints: str, include_base: bool) -> list[SweepTarget]:
    """`checkpoints`: 'all' or steps such as '10,50,100'; each step must have a complete checkpoint."""
    found = {checkpoint_step(c): c for c in list_checkpoints(run_dir)}
    if not found:
        raise UserError(f"training run {run_dir} has no complete checkpoint yet")
    if checkpoints.strip().lower() == "all":
        steps = sorted(found)
    else:
        try:
            steps = sorted({int(part) for part in checkpoints.split(",") if part.strip()})
        except ValueError:
            raise UserError(
                f"--checkpoints takes 'all' or steps such as 10,50,100, got '{checkpoints}'"
            ) from None
        missing = [s for s in steps if s not in found]
        if missing or not steps:
            raise UserError(
                f"no checkpoint of step {', '.join(map(str, missing)) or '(none given)'} in {run_dir} "
                f"(checkpoints: {', '.join(map(str, sorted(found)))})"
            )
    targets = [SweepTarget(step, str(found[step])) for step in steps]
    if include_base:
        base = read_step_info(found[min(found)]).get("base_model")
        if not base:
            raise UserError(f"{found[min(found)]} does not name its base model; use --no-base")
        targets.insert(0, SweepTarget(BASE, str(base)))
    return targets


def sweep_key(config: EvalConfig) -> SweepKey:
    sampling = {"max_tokens": config.max_tokens, "temperature": config.temperature, **config.sampling_args}
    return SweepKey(
        env_id=config.env_id,
        env_args=config.env_args,
        num_examples=config.num_examples,
        rollouts_per_example=config.rollouts_per_example,
        seed=config.seed,
        sampling={k: v for k, v in sampling.items() if v is not None},
        server=config.api_base_url,
        dtype=config.dtype,
    )


class ServerLoader:
    """Puts each target's weights into the -b server and says which model name to evaluate."""

    def __init__(self, config: EvalConfig, run_dir: Path) -> None:
        from workbench.inference.resolve import api_key
        from workbench.inference.weight_sync import WeightSync

        assert config.api_base_url is not None
        self.base_url = config.api_base_url.rstrip("/")
        self.key = api_key(config.api_key_var)
        self.sync = WeightSync([self.base_url], api_key=self.key)
        self.run_name = run_dir.name
        self.loaded: str | None = None  # the adapter name loaded for the previous target
        self.base = self._base_model()

    def _base_model(self) -> str:
        """The server's base model: the first entry of /v1/models without a parent (vLLM's order)."""
        import json
        import urllib.request

        request = urllib.request.Request(
            f"{self.base_url}/models", headers={"Authorization": f"Bearer {self.key}"} if self.key else {}
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                models = json.loads(response.read())["data"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UserError(f"cannot list the models of {self.base_url} (GET /models): {exc}") from exc
        bases = [m["id"] for m in models if isinstance(m, dict) and not m.get("parent")]
        if not bases:
            raise UserError(f"{self.base_url} lists no base model under /models")
        return str(bases[0])

    def model_for(self, target: SweepTarget) -> str:
        import asyncio

        from workbench.errors import InferenceError

        if target.step == BASE:
            return self.base
        path = str(Path(target.model).resolve())
        try:
            if (Path(path) / "adapter_config.json").is_file():
                name = f"{self.run_name}-step_{target.step}"
                asyncio.run(self.sync.switch_lora(name, path, previous=self.loaded))
                self.loaded = name
                return name
            asyncio.run(self.sync.update_weights(path))
        except InferenceError as exc:
            raise UserError(
                f"{step_label(target.step)}: {self.base_url} did not take the checkpoint's weights: {exc}"
            ) from exc
        return self.base


def run_sweep(
    config: EvalConfig, checkpoints: str, *, include_base: bool = True, reporter: Reporter | None = None
) -> SweepResult:
    """Evaluate each target of the run named by `config.model` in turn (blocking). Ctrl-C
    (KeyboardInterrupt) keeps the points finished so far; a rerun skips them."""
    reporter = reporter or NullReporter()
    run_dir = training_run_folder(config.model)
    key = sweep_key(config)
    server: ServerLoader | None = None
    saved = points_for(run_dir, key)
    points: list[SweepPoint] = []
    skipped: list[int] = []
    for target in sweep_targets(run_dir, checkpoints, include_base):
        if target.step in saved and Path(saved[target.step].eval_run).is_dir():
            point = saved[target.step]
            skipped.append(target.step)
            reporter.message(
                f"{step_label(target.step)}: already evaluated with these settings "
                f"(reward {point.reward_mean:.3f}, {point.eval_run})"
            )
        else:
            if config.api_base_url and server is None:
                server = ServerLoader(config, run_dir)
            model = server.model_for(target) if server is not None else target.model
            result = run_eval(config.model_copy(update={"model": model}), reporter)
            if result.status != "finished" or result.summary.get("infrastructure_failures"):
                raise UserError(
                    f"{step_label(target.step)}: the evaluation did not finish ({result.status}); "
                    f"its rollouts are in {result.run_dir}"
                )
            point = SweepPoint(
                key=key,
                step=target.step,
                model=target.model,
                eval_run=str(result.run_dir),
                reward_mean=float(result.summary.get("reward_mean", 0.0)),
                reward_std=result.summary.get("reward_std"),
                finished_at=now_iso(),
            )
            append_point(run_dir, point)
        points.append(point)
    return SweepResult(run_dir, points, skipped, write_table(run_dir, points))
