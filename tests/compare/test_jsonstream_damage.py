"""Issue 14: the streaming reader tells a damaged dump from a truncated one and keeps its window small."""
import json

import pytest

from dumpcompare.loaders import jsonstream
from dumpcompare.loaders.jsonstream import StreamState, iter_entries

CHUNK = 4096
N_ENTRIES = 400


def _dump_bytes() -> tuple[bytes, list[str], list[int]]:
    """A msprobe-like dump of N_ENTRIES entries; returns the bytes, keys and each entry's end offset."""
    keys = [f"Module.layers.{i}.mlp.Linear.forward.0" for i in range(N_ENTRIES)]
    head = '{\n "task": "statistics",\n "level": "L0",\n "data": {\n'
    parts, ends, size = [head], [], len(head)
    for i, k in enumerate(keys):
        entry = {"input_args": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 8],
                                 "Max": 1.5 + i, "Min": -2.25, "Mean": 0.125, "Norm": float("nan")}],
                 "output": [{"type": "torch.Tensor", "dtype": "torch.float32", "shape": [2, 8],
                             "Max": 3.0, "Min": -1.0, "Mean": 0.5, "Norm": 7.75}]}
        text = ("  " if i == 0 else ",\n  ") + json.dumps(k) + ": " + json.dumps(entry)
        parts.append(text)
        size += len(text)
        ends.append(size)
    parts.append("\n }\n}\n")
    return "".join(parts).encode(), keys, ends


@pytest.fixture
def small_window(monkeypatch):
    """Read in small chunks and record the largest window the reader ever holds."""
    monkeypatch.setattr(jsonstream, "_CHUNK", CHUNK)
    seen = {"max": 0}
    fill = jsonstream._Buffer.fill

    def recording_fill(self):
        more = fill(self)
        seen["max"] = max(seen["max"], len(self.text))
        return more
    monkeypatch.setattr(jsonstream._Buffer, "fill", recording_fill)
    return seen


def _read(tmp_path, blob):
    path = tmp_path / "dump.json"
    path.write_bytes(blob)
    state = StreamState()
    keys = [k for k, _ in iter_entries(path, state)]
    return keys, state.salvage


@pytest.mark.parametrize("where", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("junk", [b"#", b"\xff", b"}"])
def test_bad_byte_mid_file_is_damage_at_its_offset_with_a_small_window(tmp_path, small_window, where, junk):
    blob, keys, ends = _dump_bytes()
    # The bad byte replaces the opening quote of the "Max" key of one entry's input.
    entry = int(where * N_ENTRIES)
    pos = blob.index(b'"Max"', ends[entry - 1])
    damaged = blob[:pos] + junk + blob[pos + 1:]
    got, sal = _read(tmp_path, damaged)
    assert got == keys[:entry]
    assert sal is not None and sal.entries_recovered == entry and sal.last_complete_key == keys[entry - 1]
    assert "not truncated" in sal.reason and "truncated)" not in sal.reason
    assert sal.byte_offset == pos and f"byte {pos}" in sal.reason
    # The reader stops at the damage: its window never grows towards the whole file.
    assert small_window["max"] <= 4 * CHUNK < len(blob) // 4


@pytest.mark.parametrize("shift", range(-20, 21, 3))
def test_damage_next_to_a_chunk_boundary_is_still_damage(tmp_path, small_window, shift):
    blob, keys, ends = _dump_bytes()
    pos = blob.index(b'"Max"', 3 * CHUNK + shift)
    damaged = blob[:pos] + b"@" + blob[pos + 1:]
    _, sal = _read(tmp_path, damaged)
    assert "not truncated" in sal.reason and sal.byte_offset == pos


@pytest.mark.parametrize("cut_back", [1, 5, 9, 40, 300])
def test_cut_file_is_truncation(tmp_path, small_window, cut_back):
    blob, keys, ends = _dump_bytes()
    cut = ends[200] - cut_back
    got, sal = _read(tmp_path, blob[:cut])
    assert got == keys[:200]
    assert sal.reason == "file ends in the middle of a value (truncated)"
    assert sal.entries_recovered == 200 and sal.byte_offset <= cut


def test_whole_file_reads_without_salvage(tmp_path, small_window):
    blob, keys, _ = _dump_bytes()
    got, sal = _read(tmp_path, blob)
    assert got == keys and sal is None
    assert small_window["max"] <= 4 * CHUNK


def test_damage_after_non_ascii_names_is_reported_at_its_byte_offset(tmp_path, small_window):
    # Multi-byte characters in the keys before the damage: the window's byte count is not its length.
    blob, keys, ends = _dump_bytes()
    blob = blob.replace(b"Module.layers.", "Module.层.".encode())
    keys = [k.replace("layers.", "层.") for k in keys]
    pos = blob.index(b'"Max"', len(blob) * 3 // 4)
    damaged = blob[:pos] + b"#" + blob[pos + 1:]
    got, sal = _read(tmp_path, damaged)
    assert got == keys[:len(got)] and len(got) > N_ENTRIES // 2
    assert sal.byte_offset == pos and "not truncated" in sal.reason
