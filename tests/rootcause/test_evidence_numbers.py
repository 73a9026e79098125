"""The root-cause skill reads the compare skill's non-finite numbers back (evidence._read): the
strings "NaN"/"Infinity"/"-Infinity" become floats in the documented numeric fields at any depth,
and only there."""
import json
import math

from rootcause import evidence


def test_non_finite_strings_become_floats_in_numeric_fields_only(tmp_path):
    doc = {"schema_version": "2.2", "error": "Infinity",
           "results": [{"cid": "C0", "error": "NaN", "tolerance": 0.1, "reason": "NaN",
                        "points": {"out": [{"point": "L0.q", "margin": "-Infinity", "status": "Infinity"}]}},
                       {"cid": "C1", "error": 0.5, "strict_tolerance": "loose", "notes": ["NaN"]}],
           "modules": [{"amplification": "Infinity", "input_error": None, "output_error": {"error": "NaN"}}]}
    path = tmp_path / "output_3_value_compare.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    got = evidence._read(path)
    assert got["error"] == math.inf
    r0, r1 = got["results"]
    assert math.isnan(r0["error"]) and r0["tolerance"] == 0.1 and r0["reason"] == "NaN"
    assert list(r0) == ["cid", "error", "tolerance", "reason", "points"]
    pt = r0["points"]["out"][0]
    assert pt["margin"] == -math.inf and pt["status"] == "Infinity"
    assert r1 == {"cid": "C1", "error": 0.5, "strict_tolerance": "loose", "notes": ["NaN"]}
    m = got["modules"][0]
    assert m["amplification"] == math.inf and m["input_error"] is None and math.isnan(m["output_error"]["error"])
