"""workbench/startup.py: the cyclic collector is off during a command's start-up and back on
(with the start-up's objects frozen) once its long-running part begins; library use never
sees either. Each case runs in a fresh interpreter: the test worker's own collector is never
touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest


def run_python(code: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hold_then_release_freezes_start_up_and_turns_the_collector_back_on():
    run_python("""
        import gc
        from workbench import startup

        startup.release()  # library use: no hold, nothing happens
        assert gc.isenabled() and gc.get_freeze_count() == 0
        startup.hold()
        assert not gc.isenabled()
        startup.release()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        startup._fallback.join()  # cancelled: returns at once, and changes nothing
        assert gc.isenabled()
    """)


def test_a_command_without_a_release_point_gets_the_collector_back_after_the_fallback():
    run_python("""
        import gc
        from workbench import startup

        startup.FALLBACK_S = 0.01
        startup.hold()
        startup._fallback.join()  # the fallback timer's release has run
        assert gc.isenabled() and gc.get_freeze_count() > 0
    """)


@pytest.mark.parametrize("entry", ["engine", "server"])
def test_the_long_running_parts_release(entry: str):
    """The engine's run and a bound server are where start-up ends (the trainer's step loop and
    the TUI's app call the same `release`)."""
    run_python(f"""
        import asyncio, gc
        from workbench import startup
        from workbench.engine import run_rollouts
        from workbench.envs import load_environment
        from workbench.inference.echo import EchoClient
        from workbench.inference.server import create_app, serve
        from workbench.types import SamplingParams

        startup.hold()
        if {entry!r} == "engine":
            env = load_environment("reverse-text")
            asyncio.run(run_rollouts(env, EchoClient(), env.get_examples(2), rollouts_per_example=1,
                                     sampling=SamplingParams(max_tokens=4)))
        else:
            async def main():
                stop = asyncio.Event()
                await serve(create_app(EchoClient(), served_model_name="echo"), port=0, stop=stop, on_ready=lambda url: stop.set())
            asyncio.run(main())
        assert gc.isenabled() and gc.get_freeze_count() > 0
    """)
