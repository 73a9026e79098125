"""report.html and the parts of output_5 it shows: charts parsed as SVG (points, marks, labels),
the log-prob view, the template filled from output_5 alone, suppressed vs other candidates.
"""
import json
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from synth import Config, faults as F, init_weights, run_side, write_dump
from synth.decode import split_prefill_decode

NS = {"s": "http://www.w3.org/2000/svg"}
REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "hf_train_vs_vllm_rollout"
TEMPLATE = REPO / "rl-consistency-analysis" / "references" / "report_template.md"
CFG = Config(layers=4, hidden=32, intermediate=64, heads=4, kv_heads=2, head_dim=8, vocab=64, seq_len=16)
PREFILL = 10


def load_report(out_dir: Path) -> dict:
    return json.loads((Path(out_dir) / "output_5_root_cause_report.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def demo(analyze_pair):
    res = analyze_pair(DEMO / "train", DEMO / "rollout")
    return res.out, res.stdout


@pytest.fixture(scope="module")
def tensor_case(tmp_path_factory, analyze_pair):
    """Tensor dumps, rollout as prefill + decode calls, one weight of layer 2's down_proj corrupted."""
    base = tmp_path_factory.mktemp("tensor")
    w = init_weights(CFG)
    write_dump(base / "train", run_side(CFG, "hf", (F.KernelNoise("train"),), grad=True, weights=w), task="tensor")
    full = run_side(CFG, "vllm", (F.CorruptWeight("rollout", "down", 2, 0.05), F.KernelNoise("rollout", seed=1)),
                    weights=w)
    write_dump(base / "rollout", split_prefill_decode(full, CFG.seq_len, PREFILL), task="tensor")
    return analyze_pair(base / "train", base / "rollout").out


def svgs(out: Path) -> dict:
    page = (out / "report.html").read_text(encoding="utf-8")
    charts = {}
    for chunk in re.findall(r"<svg .*?</svg>", page, flags=re.S):
        el = ET.fromstring(chunk)
        charts[el.get("class").split()[-1]] = el
    return charts


def titles(el) -> list[str]:
    return [t.text for t in el.iter("{%s}title" % NS["s"])]


def test_demo_report_marks_the_root_cause_on_the_execution_chart(demo):
    out, stdout = demo
    assert f"report: {out / 'report.html'}" in stdout
    chart = svgs(out)["execution"]
    doc = load_report(out)
    points = chart.findall(".//s:circle[@class]", NS)
    points = [c for c in points if c.get("class").startswith("pt ")]
    results = json.loads((out / "output_3_value_compare.json").read_text())["results"]
    # one point per distinct compared output point
    assert len(points) == len({t.split(":")[0] for t in titles(chart) if t and ": " in t})
    bad = [c for c in points if "mismatch" in c.get("class")]
    first_bad = min(bad, key=lambda c: float(c.get("cx")))
    assert "L2.gate+L2.up" in first_bad.find("s:title", NS).text
    # the root cause and the first divergence are marked at that point
    marks = {m.get("class"): m for m in chart.findall(".//s:g[@class]", NS) if m.get("class").startswith("mark")}
    rc = marks["mark root-cause"]
    assert rc.find("s:text", NS).text == "root cause 1: L2.gate+L2.up"
    assert float(rc.find("s:circle", NS).get("cx")) == float(first_bad.get("cx"))
    assert "first divergence" in marks["mark first-divergence"].find("s:text", NS).text
    assert doc["root_causes"][0]["evidence"]["pair"] == doc["first_divergence"]["pair"]
    # module names on the axis, in execution order
    labels = [t.text for t in chart.findall(".//s:text[@class='module-label']", NS)]
    assert labels[0].startswith("embed_tokens")
    assert any(lab.startswith("layers.2.mlp.gate_proj") for lab in labels)
    # clean fused pairs are drawn as such (hollow), and errors sit below the tolerance line there
    assert chart.findall(".//s:circle[@class='pt match structural-clean']", NS)
    assert len(bad) == sum(1 for r in results if r["pair"] is None and r["status"] == "mismatch"
                           and r["point"] in {t.split(":")[0] for t in titles(chart) if t})


def test_demo_report_shows_the_logits_statistics_first_and_layers(demo):
    out, _ = demo
    page = (out / "report.html").read_text(encoding="utf-8")
    assert page.index("<h2>Answer") < page.index("Log-probabilities") \
        < page.index("Divergence along execution order") < page.index("Token x layer") < page.index("<h2>4. Verdict")
    charts = svgs(out)
    bars = charts["logits-statistics"].findall(".//s:rect", NS)
    assert bars and all("past" in b.get("class") for b in bars)     # the demo's logits are beyond tolerance
    layers = charts["layers"]
    tips = titles(layers)
    l2_mlp = next(t for t in tips if t.startswith("layer 2 mlp"))
    l1_mlp = next(t for t in tips if t.startswith("layer 1 mlp"))
    worst = lambda t: float(re.search(r"worst error ([^,]+),", t).group(1))   # noqa: E731
    assert worst(l2_mlp) > 0.01 > 1e-4 > worst(l1_mlp)
    assert "heatmap" not in charts                                  # statistics mode: no per-token map


def test_tensor_report_logprob_view_and_heatmap(tensor_case):
    out = tensor_case
    doc = load_report(out)
    lp = doc["logits"]
    assert lp["kind"] == "per_token_logprob"
    assert lp["positions"] == CFG.seq_len - 1 and lp["prompt_tokens"] == PREFILL
    assert lp["positions_past_clean_level"] > 0 and lp["max_abs_diff"] > lp["clean_level_max"]
    assert lp["response_mean_abs_diff"] is not None and lp["prompt_mean_abs_diff"] is not None
    charts = svgs(out)
    chart = charts["logprob"]
    diff = chart.find(".//s:polyline[@class='diff']", NS)
    assert len(diff.get("points").split()) == lp["positions"]
    marks = [g.find("s:text", NS).text for g in chart.findall(".//s:g[@class='mark position']", NS)]
    assert f"response starts ({PREFILL})" in marks
    # one noise verdict: the chart marks no "past the clean level" (the analytic bound is a note); the
    # band's verdict on the dumped tokens stands beside it
    assert not any("clean level" in m for m in marks)
    noise = doc["logprobs"]["noise"]
    assert noise["source"] == "dumped_logits" and noise["verdict"] == "likely_bug"
    assert "Within precision noise?" in (out / "report.html").read_text(encoding="utf-8")
    heat = charts["heatmap"]
    rows = [t.text for t in heat.findall("s:text", NS) if t.text.endswith(("resid_out", "logits"))]
    assert rows[:4] == ["L0.resid_out", "L1.resid_out", "L2.resid_out", "L3.resid_out"]
    tips = titles(heat)
    ratio = lambda t: float(re.search(r"\(([^ ]+) x tolerance\)", t).group(1))   # noqa: E731
    assert max(ratio(t) for t in tips if t.startswith("L1.resid_out")) < 1
    assert min(ratio(t) for t in tips if t.startswith("L2.resid_out")) > 1
    rc = doc["root_causes"][0]
    assert rc["rollout_module"] == "model.layers.2.mlp.down_proj"
    mark = next(g for g in charts["execution"].findall(".//s:g[@class='mark root-cause']", NS))
    assert mark.find("s:text", NS).text.startswith("root cause 1: L2.")


def test_output5_numbers_refuted_and_glossary(demo):
    doc = load_report(demo[0])
    rc = doc["root_causes"][0]
    n = rc["numbers"]
    assert n["input"]["point"] == "L2.mlp_norm_out" and n["input"]["status"] == "match"
    assert n["input"]["error"] <= n["input"]["tolerance"]
    assert n["parameter"]["point"] == "L2.gate.weight+L2.up.weight"
    assert n["parameter"]["error"] > n["parameter"]["tolerance"] and n["output"]["status"] == "mismatch"
    refuted = {r["hypothesis"] for r in rc["refuted"]}
    assert "the divergence is carried in from an earlier module" in refuted
    assert "rounding noise of the dtype" in refuted
    assert "a weight or checkpoint difference in this module" not in refuted
    assert doc["glossary"]["points"]["L2.gate+L2.up"].startswith("layer 2: MLP gate projection output joined with")
    assert {"margin", "amplification", "tolerance"} <= set(doc["glossary"]["fields"])
    for side, fam in (("train", "hf"), ("rollout", "vllm")):
        s = doc["sides"][side]
        assert s["family"] == fam and s["steps"] == ["0"] and s["ranks"] == ["0"] and s["dtype"] == "float32"
        assert s["files"] == [str(DEMO / side / "step0" / "rank0" / "dump.json")]
    assert doc["logits"]["kind"] == "logits_statistics" and doc["logits"]["status"] == "mismatch"


def test_suppressed_is_split_and_never_also_a_candidate(demo):
    doc = load_report(demo[0])
    sup = doc["suppressed"]
    groups = ("structural_clean", "structural_different", "structural_not_compared")
    assert sup["counts"] == {g: len(sup[g]) for g in groups}
    # the demo's fused pairs before layer 2 agree; the ones after it carry the upstream divergence
    assert sup["counts"]["structural_clean"] > sup["counts"]["structural_different"] > 0
    assert all(s["status"] == "propagated" for s in sup["structural_different"] if "status" in s)
    key = lambda f: (str(f["train_module"]), str(f["rollout_module"]))   # noqa: E731
    reported = {key(f) for f in doc["root_causes"] + doc["other_candidates"]}
    assert not reported & {key(s) for g in groups for s in sup[g]}


_PLACEHOLDER = re.compile(r"`\{([^}`]+)\}`")


def _resolve(doc, path: str) -> list:
    """Values at a template path (``a.b``, ``list[].x``, ``list[0].x``); KeyError when a field is absent."""
    vals = [doc]
    for part in path.split("."):
        name, _, index = part.partition("[")
        nxt = []
        for v in vals:
            if name:
                if not isinstance(v, dict) or name not in v:
                    raise KeyError(path)
                v = v[name]
            if index == "]":
                if not isinstance(v, list) or not v:
                    raise KeyError(f"{path}: no items to check")
                nxt += v
            elif index:
                nxt.append(v[int(index.rstrip("]"))])
            else:
                nxt.append(v)
        vals = nxt
    return vals


# Fields only a run with the checkpoint (--model) writes.
WITH_MODEL = ("reference_forward.", "root_causes[].side_evidence")
REAL = REPO / "tests" / "data" / "real"


def test_template_is_filled_from_output5_alone(demo, tensor_case, analyze_pair):
    stats_doc, tensor_doc = load_report(demo[0]), load_report(tensor_case)
    case = REAL / "llama_tp1_fp32_stale_rollout"
    model_doc = analyze_pair(case / "train", case / "rollout", "--model", str(REAL / "_models" / "llama")).doc
    template = TEMPLATE.read_text(encoding="utf-8")
    paths = _PLACEHOLDER.findall(template)
    assert len(paths) > 60
    for path in paths:
        if path.startswith(("logits.", "logprobs.")):
            # per-token fields exist in tensor mode, the statistics ones (and the reason for no
            # per-token log-probs) in statistics mode
            found = [d for d in (stats_doc, tensor_doc) if _try(d, path)]
            assert found, f"{path} is in neither kind of logits view"
        elif path.startswith(WITH_MODEL):
            _resolve(model_doc, path)
        else:
            _resolve(stats_doc, path)
    filled = _PLACEHOLDER.sub(lambda m: ", ".join(json.dumps(v) for v in _try(stats_doc, m.group(1)) or ["-"]),
                              template)
    assert "`{" not in filled
    assert "model.layers.2.mlp.gate_up_proj" in filled and "parameter_or_checkpoint_issue" in filled


def _try(doc, path):
    try:
        return _resolve(doc, path)
    except KeyError:
        return None


def test_html_escapes_dump_text_and_needs_no_script():
    from rootcause import sibling
    mod = sibling.load_html(REPO / "rl-consistency-analysis")
    evil = "<img src=x onerror=alert(1)>"
    compare = {"mode": "statistics", "logprob": None, "results": [
        {"cid": "C0", "point": "L0.q", "status": "mismatch", "error": 0.5, "tolerance": 1e-4,
         "strict_tolerance": 1e-4, "pair": None}]}
    analysis = {"first_divergence": {"pair": "P0"}, "modules": [
        {"pid": "P0", "kind": "one_to_one", "train_modules": [evil], "rollout_modules": ["x"], "status": "origin",
         "module_priority_rank": 1, "rank_reason": evil, "points": {"in": [], "param": [],
                                                                    "out": [{"point": "L0.q", "cid": "C0"}]}}]}
    page = "".join(mod.pieces(compare, analysis, {"train": {"path": evil}}))
    assert evil not in page and "&lt;img src=x" in page
    assert "<script" not in page and "http://" not in page.replace('xmlns="http://www.w3.org/2000/svg"', "")


@pytest.mark.skipif(shutil.which("chromium") is None, reason="chromium is not installed")
def test_report_renders_in_a_browser(demo, tmp_path):
    png = tmp_path / "r.png"
    subprocess.run(["chromium", "--headless", "--no-sandbox", f"--screenshot={png}", "--window-size=1400,2000",
                    (demo[0] / "report.html").as_uri()], capture_output=True, timeout=120, check=False)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20000


def test_html_of_empty_outputs_says_so():
    from rootcause import sibling
    mod = sibling.load_html(REPO / "rl-consistency-analysis")
    page = "".join(mod.pieces({"mode": "statistics", "results": []}, {"modules": []}, {}))
    assert "No logits were compared" in page and "No module output was compared" in page
    # _group reads the published form of a point name (output_4 vocabulary.points, points.form).
    from dumpcompare.points import form
    assert mod._group(form("M.a+M.b")) is None and mod._group(form("L2.gate+L2.up")) == (2, "mlp")
