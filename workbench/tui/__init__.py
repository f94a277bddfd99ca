"""The Textual TUI (`workbench tui`): launch runs as child processes, watch them, inspect their
rollouts, reward variance, checkpoints and GEPA results.

It only reads the files runs write (DESIGN §9) and starts `workbench ...` child processes; it
never imports torch or runs model work itself, so a crashed run never takes the UI down.
"""
