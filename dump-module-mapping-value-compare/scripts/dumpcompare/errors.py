"""Error types shared by the pipeline stages."""


class InputError(Exception):
    """Bad usage or unreadable input: the CLI prints the one-line message and exits 2."""

