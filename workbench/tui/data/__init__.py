"""File readers for the TUI: run discovery, lazy rollout indexes, file tails, training metrics,
checkpoints, GEPA results and eval comparisons. No Textual imports here: plain data, testable
without an app."""
