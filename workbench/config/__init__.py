"""Typed configs (pydantic) and TOML loading with errors that name file, line and key."""
