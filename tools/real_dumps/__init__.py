"""Small real msprobe dumps of train engines and re-created rollout engines (see README.md)."""
