"""CLI commands, one module per noun; each registers itself on ``forensics.app.app``."""
