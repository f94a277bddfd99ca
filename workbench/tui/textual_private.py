"""The one place the TUI touches a private attribute of Textual, and why.

Textual takes a widget's key bindings from its class's `BINDINGS`; it has no public way to give
one instance's binding another description (asked in Textualize/textual#1410). Every table's
Enter says what it opens there ("Open group", "Open run", "Close" in the keys list), and the
footer, `?` and the command palette read that description, so the instance's own bindings map
(`DOMNode._bindings`, built per instance from the class's) gets a relabelled copy of the binding.
tests/test_textual_private.py fails loudly when Textual renames or reshapes it.
"""

from __future__ import annotations

from dataclasses import replace

from textual.dom import DOMNode


def relabel_binding(node: DOMNode, key: str, description: str) -> None:
    """Give `node`'s bindings of `key` the description `description` (this instance only)."""
    bindings = node._bindings.key_to_bindings
    bindings[key] = [replace(binding, description=description) for binding in bindings.get(key, [])]
