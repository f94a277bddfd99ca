"""Screens of the TUI, one per job. Each screen is the controller for its widgets: it loads data
in workers, hands it down to widgets as attributes, and reacts to the messages they post."""
