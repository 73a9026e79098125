"""Error types shared by the pipeline stages."""


class InputError(Exception):
    """Bad usage or unreadable input: the CLI prints the one-line message and exits 2."""


def read_user_yaml(path: str, what: str) -> dict:
    """Read a user's YAML mapping with the safe loader, or raise InputError naming the file."""
    from pathlib import Path

    import yaml
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"{path}: cannot read {what} ({' '.join(str(exc).split())})") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: {what} must be a YAML mapping")
    return doc
