"""Examples: job specs and a custom-task plug-in (importable from the repo root)."""
