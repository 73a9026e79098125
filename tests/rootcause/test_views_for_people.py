"""What a person reads (issue 26): report.html and the console lead with the answer, name no JSON
field, and the --help and report template stay true. Five committed real pairs: statistics, tensor,
Megatron, tensor parallel, and a statistics pair with --model."""
import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
REAL = REPO / "tests" / "data" / "real"
TEMPLATE = REPO / "rl-consistency-analysis" / "references" / "report_template.md"
PAIRS = {
    "statistics": ("llama_tp1_fp32_stale_rollout", ()),
    "tensor": ("llama_tp1_tensor_stale_rollout", ()),
    "megatron": ("megatron_tp1_qkv_plain_order", ()),
    "tp": ("llama_tp2_fp32_wrong_shard", ()),
    "model": ("llama_tp1_fp32_stale_rollout", ("--model", str(REAL / "_models" / "llama"))),
}


@pytest.fixture(scope="module")
def runs(analyze_pair):
    return {k: analyze_pair(REAL / case / "train", REAL / case / "rollout", *extra)
            for k, (case, extra) in PAIRS.items()}


def _case(kind: str) -> dict:
    return json.loads((REAL / PAIRS[kind][0] / "case.json").read_text(encoding="utf-8"))


def _expected(kind: str) -> dict:
    """The answer the injected fault implies; a side the dumps alone cannot tell is undetermined,
    and with the checkpoint it is the side the fault was injected into."""
    case = _case(kind)
    side = case["fault"]["side"] if PAIRS[kind][1] else case["expected"]["side"] or "undetermined"
    return {**case["expected"], "side": side}


def _page(res) -> str:
    return (res.out / "report.html").read_text(encoding="utf-8")


def _words(page: str) -> str:
    """The text a person reads: element content (tooltips included), markup and style removed."""
    page = re.sub(r"<style>.*?</style>", " ", page, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", page))


@pytest.mark.parametrize("kind", list(PAIRS))
def test_report_html_gives_the_answer_before_the_first_chart(runs, kind):
    res, exp = runs[kind], _expected(kind)
    head = " ".join(_words(_page(res).split("<svg")[0]).split())
    rc = res.doc["root_causes"][0]
    # the injected fault's module and, where the dumps can tell, its side
    assert exp["verdict"] == res.doc["verdict"] == "root_cause_found"
    assert "Verdict: root cause found" in head
    module = exp["rollout_modules"][0]
    assert module in head
    assert rc["side"] == exp["side"]
    assert f"side {rc['side']}" in head
    assert rc["confidence_text"] in head
    first = res.doc["answer"]["next_checks"][0]
    assert f"Next check: {first['check']}" in head
    # every next check is in the page, with its command
    for c in rc["next_checks"]:
        assert c["check"] in head
    if rc["side"] == "undetermined":
        # the exact rerun with --model that would decide it
        cmd = res.doc["answer"]["decide_side"]["command"]
        assert cmd[-2:] == ["--model", "CHECKPOINT_DIR"] and "--train" in cmd
        assert " ".join(cmd[2:]) in head
    else:
        assert res.doc["answer"]["decide_side"] is None


def test_with_the_checkpoint_the_side_is_the_faulty_one_and_no_rerun_is_offered(runs):
    res = runs["model"]
    assert res.doc["root_causes"][0]["side"] == _expected("model")["side"]
    assert all(c["command"] is None or "--model" not in c["command"] for c in res.doc["answer"]["next_checks"])


def test_error_is_defined_where_it_is_first_shown(runs):
    for res in runs.values():
        words = " ".join(_words(_page(res)).split())
        first = re.search(r"\berror\b", words)
        assert words[first.start():].startswith("error in this page: "), words[first.start() - 80:first.start() + 80]


def test_a_megatron_finding_marks_the_module_it_names(runs):
    # The plain-order qkv fault: the finding names linear_qkv; its numbers and its chart mark come
    # from that pair, not from core_attention where the split parts first differ.
    res = runs["megatron"]
    rc = res.doc["root_causes"][0]
    assert rc["train_module"] == _expected("megatron")["train_modules"][0]
    assert rc["numbers"]["output"]["point"] == "L0.q+L0.k+L0.v"
    marks = re.findall(r'<g class="mark root-cause">.*?<text[^>]*>([^<]*)</text>', _page(res), flags=re.S)
    assert marks == ["root cause 1: L0.q+L0.k+L0.v"]
    # the agreeing fused weight does not refute a row order that its statistics cannot show
    assert not any("weight" in r["hypothesis"] for r in rc["refuted"])


def test_no_bare_score_beside_uncalibrated(runs):
    for res in runs.values():
        for f in res.doc["root_causes"] + res.doc["other_candidates"]:
            if f["confidence_word"] == "uncalibrated":
                assert f["confidence_text"].startswith(f"rule score {f['confidence']}, not calibrated")
        assert not re.search(r"\d uncalibrated", _words(_page(res)) + res.stdout)


@pytest.mark.parametrize("kind", list(PAIRS))
def test_legend_names_only_what_the_chart_draws(runs, kind):
    page = _page(runs[kind])
    legend = re.search(r"<h2>2\. Divergence.*?<p class=\"legend\">(.*?)</p>", page, flags=re.S).group(1)
    chart = re.search(r'<svg [^>]*class="chart execution".*?</svg>', page, flags=re.S).group(0)
    dots = set(re.findall(r'<circle class="pt (\w+)"', chart))
    squares = set(re.findall(r'<rect class="pt (\w+)"', chart))
    assert set(re.findall(r"&#9679; (\w+)", legend)) == dots
    assert set(re.findall(r"&#9632; (\w+), no error value", legend)) == squares
    bands = [float(h) for h in re.findall(r'class="band drift-zone"[^>]*height="([\d.]+)"', chart)]
    assert ("drift zone" in legend) == any(h > 0 for h in bands)
    assert ("structural pair" in legend) == ("structural-clean" in chart)


def test_x_labels_fit_inside_the_chart(runs):
    # A label is rotated 60 degrees and ends at its point: it reaches half its length to the left.
    for res in runs.values():
        chart = re.search(r'<svg [^>]*class="chart execution".*?</svg>', _page(res), flags=re.S).group(0)
        for x, label in re.findall(r'class="module-label"[^>]*translate\(([\d.]+),[\d.]+\)[^>]*>([^<]*)<', chart):
            assert float(x) - 5.0 * len(html.unescape(label)) / 2 >= 0, label


def _field_names():
    from rootcause import answer
    return answer.FIELD_NAMES


def test_the_published_field_names_cover_output5(runs):
    names = set(_field_names())
    for res in runs.values():
        doc = res.doc
        keys = set(doc) | {k for f in doc["root_causes"] + doc["other_candidates"] for k in f}
        assert {k for k in keys if "_" in k} <= names


@pytest.mark.parametrize("kind", list(PAIRS))
def test_no_console_line_or_report_text_names_a_json_field(runs, kind):
    res = runs[kind]
    for view in (res.stdout, _words(_page(res))):
        found = [n for n in _field_names() if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", view)]
        assert not found, found


def test_the_console_gives_the_answer_then_the_files(runs):
    lines = runs["model"].stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines[:5]] == ["verdict", "root cause", "side", "confidence", "next check"]
    assert lines[1].endswith("model.layers.1.mlp.down_proj (rollout), layer 1")
    assert lines[-2:] == [f"report: {runs['model'].out / 'report.html'}",
                          f"evidence (JSON): {runs['model'].out / 'output_5_root_cause_report.json'}"]
    assert "report_template" not in runs["model"].stdout       # the agent's note lives in SKILL.md


@pytest.mark.parametrize("script", ["dump-module-mapping-value-compare/scripts/run_compare.py",
                                    "rl-consistency-analysis/scripts/run_root_cause_analysis.py"])
def test_both_helps_document_the_step_range(script):
    out = subprocess.run([sys.executable, str(REPO / script), "--help"], capture_output=True, text=True).stdout
    flat = " ".join(out.split())
    assert "a range such as 0-8" in flat and "a JSON list such as [1, 2, 3]" in flat


_PLACEHOLDER = re.compile(r"`\{([^}`]+)\}`")


def _value(doc, path: str):
    """The value at a template path of the form a.b.c (None when a step is missing)."""
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return None
        doc = doc[part]
    return doc


def test_the_template_renders_without_none_when_logits_were_not_compared(runs):
    doc = runs["statistics"].doc
    # the committed pair's logits are the trainer's every token against vLLM's last one
    assert doc["logits"]["status"] == "incomparable"
    text = TEMPLATE.read_text(encoding="utf-8")
    section = text.split("## 2.")[1].split("## 3.")[0]
    fitting = next(p for p in section.split("\n\n") if p.startswith("**Not compared**"))
    # what the agent writes: the sentence after the condition that chose the paragraph
    filled = _PLACEHOLDER.sub(lambda m: str(_value(doc, m.group(1))), fitting.split("): ", 1)[1])
    assert "None" not in filled and "null" not in filled.split("(null logits")[0]
    assert doc["logits"]["reason"] in filled
    for path in ("answer.verdict", "answer.input_notes", "comparability.tokens.verified"):
        assert f"`{{{path}}}`" in text and _value(doc, path) is not None
    model = runs["model"].doc
    for path in ("reference_forward.ran", "reference_forward.verdict.side"):
        assert f"`{{{path}}}`" in text and _value(model, path) is not None
    assert "`{root_causes[].side_evidence}`" in text and model["root_causes"][0]["side_evidence"]
