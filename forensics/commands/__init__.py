"""CLI commands, one module per noun; each registers itself on ``forensics.cli.app``."""
