"""Workbench: build LLM environments, then evaluate, RL-train and prompt-optimize models on them."""

__version__ = "0.1.0"
