"""Shared helpers: the credence scale, credence parsing, tables, cells, file reading, log parsing."""
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

import mldebug_common as mc


def test_scale_matches_the_spec():
    assert mc.CREDENCE_RANGES == {
        "almost certain": (86, 99), "highly likely": (71, 85), "likely": (56, 70),
        "even": (46, 55), "unlikely": (31, 45), "highly unlikely": (16, 30), "remote": (1, 15)}


@given(st.integers(min_value=1, max_value=99))
def test_every_percent_has_exactly_one_word(n):
    words = [w for w, lo, hi in mc.CREDENCE_SCALE if lo <= n <= hi]
    assert len(words) == 1
    assert mc.word_for_number(n) == words[0]
    assert mc.number_fits_word(words[0], n)


@pytest.mark.parametrize("n", [0, 100, 150])
def test_numbers_off_the_scale_have_no_word(n):
    assert mc.word_for_number(n) is None


@pytest.mark.parametrize("text, word, number", [
    ("Status: partial, likely, 60%.", "likely", 60),
    ("highly likely (80 %)", "highly likely", 80),
    ("I put it at 20%, highly unlikely", "highly unlikely", 20),
    ("unlikely: 40%", "unlikely", 40),
    ("Highly   Likely, 75%", "highly likely", 75),
])
def test_find_credences_both_orders(text, word, number):
    found = mc.find_credences(text)
    assert [(c.word, c.number) for c in found] == [(word, number)]


def test_unlikely_is_not_read_as_likely():
    assert [c.word for c in mc.find_credences("unlikely, 35%")] == ["unlikely"]


@pytest.mark.parametrize("cell, fragment", [
    ("likely, 60%", None),
    ("likely, 90%", "'likely' means 56-70%"),
    ("likely", "word but no number"),
    ("60%", "number but no word"),
    ("probably", "no credence found"),
    ("almost certain, 100%", "off the credence scale"),
])
def test_check_credence_cell(cell, fragment):
    msg = mc.check_credence_cell(cell)
    if fragment is None:
        assert msg is None
    else:
        assert fragment in msg


def test_parse_tables_escaped_pipes_code_spans_and_fences():
    text = "\n".join([
        "| a | b |", "|---|:--:|", "| `x | y` | c \\| d |", "| 1 |", "",
        "```", "| not | a table |", "|---|---|", "```",
    ])
    tables = mc.parse_tables(text)
    assert len(tables) == 1
    assert tables[0].rows == [["`x | y`", "c | d"], ["1"]]
    assert tables[0].row_lines == [3, 4]


@pytest.mark.parametrize("cell, problem", [
    ("", "empty cell"), ("-", "placeholder"), ("TBD", "placeholder"), ("<fill in>", "placeholder"),
    ("unknown", "must say what would fill it"), ("unknown: needs the eval log", None),
    ("2.31 (step 0)", None), ("`<eos>` token", None),
])
def test_cell_problem(cell, problem):
    msg = mc.cell_problem(cell)
    assert (msg is None) if problem is None else (problem in msg)


def test_read_text_errors_name_the_file(tmp_path):
    with pytest.raises(mc.InputError, match="no such file"):
        mc.read_text(tmp_path / "missing.md")
    with pytest.raises(mc.InputError, match="is a directory"):
        mc.read_text(tmp_path)
    (tmp_path / "bin").write_bytes(b"\x00\x01")
    with pytest.raises(mc.InputError, match="binary"):
        mc.read_text(tmp_path / "bin")
    (tmp_path / "latin").write_bytes(b"caf\xe9")
    with pytest.raises(mc.InputError, match="not UTF-8"):
        mc.read_text(tmp_path / "latin")
