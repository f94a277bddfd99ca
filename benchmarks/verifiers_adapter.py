"""A verifiers environment through the adapter vs. the same environment ported by its import.

    python benchmarks/verifiers_adapter.py [--env reverse_text] [--rollouts 1024] [--concurrency 64]

Both run the vendored fixture (tests/fixtures/verifiers_envs/ENV) through Workbench's engine
(`run_rollouts`, scoring included) against `EchoClient`, a real instant model, so what is
measured is everything but the model:
- adapter: the env unchanged; verifiers' own rollout and rubric code, its model calls going over
  HTTP to the loopback server in front of the client (envs/verifiers_env.py);
- native: the env with `import verifiers as vf` changed to `import workbench.envs as vf`
  (tests/ported_envs.py does the rewrite), run by Workbench's own environment classes.
Prints rollouts/s of each and the ratio. Needs the verifiers extra.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def measure(
    workspace: Path, env_id: str, rollouts: int, concurrency: int, examples_n: int
) -> tuple[float, int, str]:
    from workbench.engine import run_rollouts
    from workbench.envs.loader import load_environment
    from workbench.inference.echo import EchoClient
    from workbench.types import SamplingParams

    os.environ["WORKBENCH_WORKSPACE"] = str(workspace)
    env = load_environment(env_id)
    examples = env.get_examples(examples_n, split="train")
    per_example = rollouts // len(examples)
    client = EchoClient("echo")
    sampling = SamplingParams(max_tokens=256)
    # warm-up: imports, the loopback server, the dataset
    await run_rollouts(
        env, client, examples[:2], rollouts_per_example=4, sampling=sampling, max_concurrent=concurrency
    )
    started = time.perf_counter()
    stats = await run_rollouts(
        env, client, examples, rollouts_per_example=per_example, sampling=sampling, max_concurrent=concurrency
    )
    elapsed = time.perf_counter() - started
    return stats.rollouts / elapsed, stats.errors, type(env).__name__


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="reverse_text", help="a folder of tests/fixtures/verifiers_envs")
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--examples", type=int, default=8, help="rollouts are spread over this many examples")
    args = parser.parse_args()

    from tests.ported_envs import FIXTURES, port_fixture

    env_id = args.env.replace("_", "-")
    with tempfile.TemporaryDirectory() as tmp:
        unchanged, ported = Path(tmp) / "unchanged", Path(tmp) / "ported"
        shutil.copytree(FIXTURES / args.env, unchanged / "environments" / args.env)
        port_fixture(args.env, ported)
        results = {}
        for label, workspace in (("adapter", unchanged), ("native", ported)):
            rate, errors, kind = asyncio.run(
                measure(workspace, env_id, args.rollouts, args.concurrency, args.examples)
            )
            results[label] = rate
            print(
                f"{label:8s} {kind:16s} {rate:8,.0f} rollouts/s  ({args.rollouts} rollouts, {errors} errors, "
                f"concurrency {args.concurrency})"
            )
    print(f"native / adapter: {results['native'] / results['adapter']:.1f}x")


if __name__ == "__main__":
    main()
