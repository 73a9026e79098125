"""check_evidence_criteria: the template fails, the example passes, each rule fires on its own."""
import pytest

from check_evidence_criteria import check_block, sentences


def rules(text):
    return [f.rule for f in check_block("AGENTS.md", text)]


@pytest.fixture
def example(skill):
    return (skill.examples / "AGENTS.md").read_text()


def test_filled_example_passes(example):
    assert rules(example) == []


def test_template_fails_on_every_placeholder(skill):
    found = check_block("t.md", (skill.assets / "AGENTS_evidence_block.md").read_text())
    assert [f.rule for f in found] == ["EC-PLACEHOLDER"] * 6
    assert [f.message.split("'")[1] for f in found] == [
        "GOAL", "OPTIMISING", "PERVERSE SATISFACTIONS", "EVIDENCE A", "EVIDENCE B", "ELSE"]


def test_block_inside_a_larger_agents_file(example):
    text = "# Project rules\n\nRun tests first.\n\n" + example + "\n\n## Style\n\nShort lines.\n"
    assert rules(text) == []


def test_rule_missing_block():
    assert rules("# AGENTS\n\nBe careful.\n") == ["EC-MISSING"]


def test_rule_missing_key(example):
    start = example.index("ELSE:")
    assert rules(example[:start]) == ["EC-KEY-MISSING"]


def test_rule_key_order(example):
    goal_start = example.index("GOAL:")
    opt_start = example.index("OPTIMISING:")
    goal = example[goal_start:opt_start]
    text = example[:goal_start] + example[opt_start:] + "\n" + goal
    assert rules(text) == ["EC-KEY-ORDER"]


def test_rule_empty_value(example):
    start = example.index("ELSE:")
    assert rules(example[:start] + "ELSE:\n") == ["EC-EMPTY"]


def test_optimizing_spelling_accepted(example):
    assert rules(example.replace("OPTIMISING:", "OPTIMIZING:")) == []


def test_rule_optimising_one_sentence(example):
    old = "The loss rewards putting high probability on the reference answer tokens after the prompt."
    assert rules(example.replace(old, old + " It ignores the prompt.")) == ["EC-OPTIMISING-SENTENCE"]


def test_rule_optimising_no_symbols(example):
    old = "The loss rewards putting high probability on the reference answer tokens after the prompt."
    assert rules(example.replace(old, "The loss minimises -log p(y|x) = NLL.")) == ["EC-OPTIMISING-SYMBOLS"]


def test_sentences_ignore_abbreviations():
    assert len(sentences("The loss rewards short answers, e.g. one word, i.e. the answer alone.")) == 1


def test_rule_perverse_count(example):
    third = ("  - Long outputs that contain the answer somewhere; exposed by the exact-match metric "
             "next to substring match.\n")
    assert third in example
    second = ("  - Copying a number from the question; exposed by the copy-rate metric on questions "
              "whose answer is not in the prompt.\n")
    assert rules(example.replace(third, "").replace(second, "")) == ["EC-PERVERSE-COUNT"]
    assert rules(example.replace(third, third + third)) == ["EC-PERVERSE-COUNT"]


def test_rule_perverse_not_a_list(example):
    start = example.index("PERVERSE SATISFACTIONS:")
    end = example.index("EVIDENCE A")
    text = example[:start] + "PERVERSE SATISFACTIONS: copying the input, learning the prior.\n" + example[end:]
    assert rules(text) == ["EC-PERVERSE-COUNT"]


def test_rule_perverse_names_what_exposes_it(example):
    text = example.replace("; exposed by the majority-answer baseline arm.", ".")
    found = check_block("AGENTS.md", text)
    assert [f.rule for f in found] == ["EC-PERVERSE-EXPOSE"]
    assert "perverse satisfaction 1" in found[0].message


def test_rule_evidence_a_arms(example):
    text = example.replace("reversed treatment (adapter weights\n  negated), and ", "")
    found = check_block("AGENTS.md", text)
    assert [f.rule for f in found] == ["EC-ARMS"]
    assert found[0].message.endswith("missing: reversed")


def test_rule_evidence_b_baseline(example):
    old = "beats the base model with the same template on exact-match accuracy"
    assert rules(example.replace(old, "beats chance on exact-match accuracy")) == ["EC-BASELINE"]


def test_rule_evidence_b_metric(example):
    start = example.index("EVIDENCE B")
    end = example.index("ELSE:")
    text = example[:start] + "EVIDENCE B, quantitative: better than the base model.\n" + example[end:]
    assert rules(text) == ["EC-METRIC"]


@pytest.mark.parametrize("exposure, names", [
    ("; exposed by a metric.", ""),
    ("; exposed by the shuffled-prompt arm.", "shuffled-prompt"),
    ("; caught by `answer_entropy`.", "answer_entropy"),
])
def test_rule_exposure_must_name_a_metric_or_arm_the_document_defines(example, exposure, names):
    text = example.replace("; exposed by the majority-answer baseline arm.", exposure)
    found = check_block("AGENTS.md", text)
    assert [f.rule for f in found] == ["EC-PERVERSE-EXPOSE"]
    assert ("found nowhere else" in found[0].message) == bool(names) and names in found[0].message


def test_rule_exposure_by_an_arm_named_in_evidence_a(example):
    text = example.replace("; exposed by the majority-answer baseline arm.", "; exposed by the placebo arm.")
    assert rules(text) == []
