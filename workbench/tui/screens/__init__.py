"""Screens of the TUI, one per job. Each screen is the controller for its widgets: it loads data
in workers, hands it down to widgets as attributes, and reacts to the messages they post.

Screens never import one another nor the app: the app registers each under a name
(`WorkbenchApp.SCREEN_FACTORIES`) and a screen opens another by name through
`WorkbenchScreen.open` (tests/test_tui_architecture.py checks this)."""
