"""The DSPy names workbench/gepa points elsewhere for one call (dspy_support.quiet_dspy's tqdm,
dspy_optimizers.safe_proposals' GroundedProposer) still exist and are still what DSPy uses:
if a DSPy upgrade moves them, this fails loudly instead of bars or crashes coming back."""

from __future__ import annotations

import importlib
import inspect
import io

import pytest

dspy = pytest.importorskip("dspy")


def test_dspy_modules_still_draw_through_their_tqdm_global():
    import tqdm

    from workbench.gepa.dspy_support import TQDM_MODULES

    for name in TQDM_MODULES:
        module = importlib.import_module(name)
        assert module.tqdm is tqdm, name
        assert "tqdm.tqdm" in inspect.getsource(module), name


def test_quiet_dspy_silences_dspy_bars_only_and_puts_everything_back(capsys):
    import tqdm

    from workbench.gepa.dspy_support import TQDM_MODULES, quiet_dspy

    lines: list[str] = []
    modules = [importlib.import_module(name) for name in TQDM_MODULES]
    with quiet_dspy(lines.append):
        for module in modules:
            for _ in module.tqdm.tqdm(range(3), disable=False):
                pass
        other = io.StringIO()
        for _ in tqdm.tqdm(range(3), file=other, disable=False):  # not DSPy's: draws as always
            pass
        print("from dspy")
    assert other.getvalue() and lines == ["from dspy"]
    assert capsys.readouterr().err == ""
    assert all(module.tqdm is tqdm for module in modules)


def test_mipro_still_builds_the_proposer_its_module_imported():
    from dspy.propose import GroundedProposer
    from dspy.teleprompt import mipro_optimizer_v2

    from workbench.gepa.dspy_optimizers import safe_proposals

    assert mipro_optimizer_v2.GroundedProposer is GroundedProposer
    assert "GroundedProposer(" in inspect.getsource(mipro_optimizer_v2.MIPROv2)
    with safe_proposals(None):
        assert issubclass(mipro_optimizer_v2.GroundedProposer, GroundedProposer)
        assert mipro_optimizer_v2.GroundedProposer is not GroundedProposer
    assert mipro_optimizer_v2.GroundedProposer is GroundedProposer
