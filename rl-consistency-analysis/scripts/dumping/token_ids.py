"""Token ids as users hold them, and the ``tokens.json`` file the dumpers exchange.

Public API:
    parse_prompt_ids(text) -> list[list[int]]   a JSON list of ids, a list of such lists, or a file
                                                holding either (or a tokens.json)
    write_tokens(path, prompt_ids, response_ids)    ``{"prompt_ids": [...], "response_ids": [...]}``
    read_tokens(path) -> (prompt_ids, response_ids)
"""
from __future__ import annotations

import json
from pathlib import Path

from .cli import InputError


def _ids(value, where):
    if not isinstance(value, list) or not value or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        raise InputError(f"{where}: expected a non-empty list of non-negative integer token ids")
    return list(value)


def parse_prompt_ids(text):
    """Prompts from ``--prompt-ids``: inline JSON or a file path; one prompt or a list of prompts.

    A tokens.json (``{"prompt_ids": ...}``) is accepted too, so a dump can be reproduced from it."""
    where = "--prompt-ids"
    stripped = text.strip()
    if not stripped.startswith(("[", "{")):
        path = Path(text)
        if not path.is_file():
            raise InputError(f"--prompt-ids {text!r}: neither JSON nor an existing file")
        where, stripped = str(path), path.read_text(encoding="utf-8")
    try:
        doc = json.loads(stripped)
    except json.JSONDecodeError as exc:
        raise InputError(f"{where}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if isinstance(doc, dict):
        if "prompt_ids" not in doc:
            raise InputError(f"{where}: a JSON object needs a 'prompt_ids' list")
        doc = doc["prompt_ids"]
    if isinstance(doc, list) and doc and all(isinstance(p, list) for p in doc):
        return [_ids(p, f"{where}, prompt {i}") for i, p in enumerate(doc)]
    return [_ids(doc, where)]


def write_tokens(path, prompt_ids, response_ids):
    """Write ``tokens.json``: the ids the engine ran, split into prompt and response."""
    Path(path).write_text(json.dumps({"prompt_ids": list(prompt_ids), "response_ids": list(response_ids)})
                          + "\n", encoding="utf-8")


def read_tokens(path):
    """``(prompt_ids, response_ids)`` from a tokens.json, or an InputError naming the problem."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(f"{p}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(doc, dict) or not {"prompt_ids", "response_ids"} <= doc.keys():
        raise InputError(f"{p}: expected an object with 'prompt_ids' and 'response_ids'")
    return _ids(doc["prompt_ids"], f"{p}: prompt_ids"), _ids(doc["response_ids"], f"{p}: response_ids")
