"""check_training_guide: the skeleton and the filled example pass; each rule fires on its own."""
import pytest
import yaml

from check_training_guide import GuideChecker, parse_frontmatter


def rules(text, previous=None):
    return [f.rule for f in GuideChecker("TRAINING_GUIDE.md", text).check(previous)]


@pytest.fixture
def skeleton(skill):
    return (skill.assets / "TRAINING_GUIDE.md").read_text()


@pytest.fixture
def filled(skill):
    return (skill.examples / "TRAINING_GUIDE.md").read_text()


def test_skeleton_passes_with_every_stage_unknown(skeleton):
    assert rules(skeleton) == []
    data, _, errors = parse_frontmatter(skeleton.splitlines())
    assert errors == []
    assert set(data["stages"].values()) == {"unknown"}


def test_filled_example_passes(filled):
    assert rules(filled) == []


@pytest.mark.parametrize("name", ["skeleton", "filled"])
def test_frontmatter_parser_agrees_with_pyyaml(name, request):
    text = request.getfixturevalue(name)
    ours, _, _ = parse_frontmatter(text.splitlines())
    assert ours == yaml.safe_load(text.split("---")[1])


def test_rule_lines(skeleton):
    padded = skeleton + "\n".join("" for _ in range(200))
    assert rules(padded) == ["TG-LINES"]


def test_rule_frontmatter_missing(skeleton):
    body = skeleton.split("---", 2)[2]
    assert rules(body) == ["TG-FM-MISSING"]


def test_rule_frontmatter_syntax(skeleton):
    text = skeleton.replace("last_reviewed_job: 0", "last_reviewed_job: 0\nnotes = free text")
    assert rules(text) == ["TG-FM-SYNTAX"]


def test_rule_frontmatter_extra_key(skeleton):
    text = skeleton.replace("last_reviewed_job: 0", "last_reviewed_job: 0\nhistory: job 1 failed")
    assert rules(text) == ["TG-FM-KEYS"]


def test_rule_frontmatter_job_not_integer(skeleton):
    assert rules(skeleton.replace("last_reviewed_job: 0", "last_reviewed_job: latest")) == ["TG-FM-JOB"]


def test_rule_frontmatter_status_vocabulary(skeleton):
    text = skeleton.replace("behaviour: unknown}", "behaviour: great}")
    found = GuideChecker("g.md", text).check()
    assert "TG-FM-STATUS" in [f.rule for f in found]
    assert "use one of unknown, uncertain, partial, working, failing" in found[0].message


def test_rule_stages_must_be_a_map(skeleton):
    text = skeleton.replace("stages: {data: unknown, learning: unknown, generalisation: unknown, "
                            "behaviour: unknown}", "stages: data")
    assert rules(text) == ["TG-FM-STAGES"]


def test_rule_stage_missing(skeleton):
    text = skeleton.replace("behaviour: unknown}", "behaviour: unknown, writer: unknown}")
    assert rules(text) == ["TG-STAGE-MISSING"]


def test_rule_stage_extra(skeleton):
    assert rules(skeleton + "\n## Decoder\nPurpose: x\n") == ["TG-STAGE-EXTRA"]


def test_rule_field_missing(skeleton):
    text = skeleton.replace("Main question: does the model see the rows we think it sees?\n", "")
    assert rules(text) == ["TG-FIELD-MISSING"]


def test_rule_field_empty(skeleton):
    text = skeleton.replace("Main question: does the model see the rows we think it sees?",
                            "Main question: <fill in>")
    assert rules(text) == ["TG-FIELD-EMPTY"]


def test_rule_sequence_must_be_numbered(skeleton):
    old = ("Expected sequence: 1. the first training row, printed in full, matches the source.\n"
           "  2. the loss mask covers only the target tokens. 3. an evaluation row has the same format.\n"
           "  4. class or length balance matches what the task needs.")
    assert old in skeleton
    text = skeleton.replace(old, "Expected sequence: rows look right, then the mask looks right.")
    assert rules(text) == ["TG-SEQUENCE"]


def test_rule_status_state_must_match_frontmatter(filled):
    assert rules(filled.replace("Status: partial, likely, 60%.", "Status: working, likely, 60%.")) \
        == ["TG-STATUS-STATE"]


@pytest.mark.parametrize("status, fragment", [
    ("partial, likely, 90%.", "'likely' means 56-70%"),
    ("partial, likely.", "word but no number"),
    ("partial, 60%.", "number but no word"),
])
def test_rule_status_credence(filled, status, fragment):
    found = GuideChecker("g.md", filled.replace("partial, likely, 60%.", status)).check()
    assert [f.rule for f in found] == ["TG-STATUS-CREDENCE"]
    assert fragment in found[0].message


def test_rule_unknown_stage_says_only_unknown(skeleton):
    text = skeleton.replace("Status: unknown; filled by printing", "Status: unknown, likely 60%; filled by printing")
    assert rules(text) == ["TG-UNKNOWN-CLAIM"]


def test_rule_unknown_stage_says_what_fills_it(skeleton):
    text = skeleton.replace("Status: unknown; filled by printing the first training and evaluation row with the mask.",
                            "Status: unknown.")
    assert rules(text) == ["TG-UNKNOWN-FILL"]


def test_rule_unknown_stage_status_word(skeleton):
    text = skeleton.replace("Status: unknown; filled by printing", "Status: partial; filled by printing")
    assert rules(text) == ["TG-STATUS-STATE"]


def test_rule_earliest_link_names_a_step(skeleton):
    text = skeleton.replace("Earliest unsupported link: step 1. Nobody has looked at a row.",
                            "Earliest unsupported link: step 9. Nobody has looked at a row.")
    assert rules(text) == ["TG-EARLIEST"]


@pytest.mark.parametrize("section, count, rule_ok", [
    ("## Established observations", 5, True), ("## Established observations", 6, False),
    ("## Live explanations", 6, False), ("## Next tests", 3, True), ("## Next tests", 4, False),
])
def test_rule_caps(skeleton, section, count, rule_ok):
    head, tail = skeleton.split(section, 1)
    rest = tail.split("\n## ", 1)
    items = "\n".join(f"- item {i} (job {i}, 0.{i})" for i in range(count))
    text = head + section + "\n" + items + "\n" + ("\n## " + rest[1] if len(rest) > 1 else "")
    assert rules(text) == ([] if rule_ok else ["TG-CAP"])


def test_rule_cap_inside_a_stage(filled):
    extra = "Next tests: 1. a 2. b 3. c 4. d\n"
    text = filled.replace("Main question: does the gap survive exact-match scoring?",
                          "Main question: does the gap survive exact-match scoring?\n" + extra)
    assert rules(text) == ["TG-CAP"]


@pytest.mark.parametrize("lead", ["## Possible failure causes", "Possible causes:", "Failure modes: lr, data, init"])
def test_rule_no_failure_cause_list(filled, lead):
    text = filled.replace("## Live explanations", lead + "\n- lr too high\n- bad data\n\n## Live explanations")
    assert rules(text) == ["TG-FAILURE-LIST"]


def test_rule_growth_and_job_order(tmp_path, filled):
    previous = tmp_path / "old.md"
    previous.write_text(filled)
    assert rules(filled, str(previous)) == []
    assert rules(filled + "\n", str(previous)) == ["TG-GREW"]
    assert rules(filled.replace("last_reviewed_job: 37", "last_reviewed_job: 30"), str(previous)) \
        == ["TG-JOB-BACKWARDS"]


@pytest.mark.parametrize("lead", ["Things that could go wrong:", "Suspects:", "Risks:", "## Culprits",
                                  "Hypotheses for failure:", "What might break:", "**Pitfalls**:",
                                  "Why it might not work:"])
def test_rule_failure_list_found_by_cue_words(filled, lead):
    text = filled.replace("## Live explanations", lead + "\n1. lr too high\n2. bad data\n\n## Live explanations")
    assert rules(text) == ["TG-FAILURE-LIST"]


@pytest.mark.parametrize("lead", ["Risks: the only one left is the eval parser.",
                                  "The causes of the spike are not known yet:\n\nwe log the batch next.",
                                  "What could go wrong is measured by step 4."])
def test_rule_failure_cue_without_a_list_is_prose(filled, lead):
    text = filled.replace("## Live explanations", lead + "\n\n## Live explanations")
    assert "TG-FAILURE-LIST" not in rules(text)


def test_frontmatter_is_real_yaml(skeleton):
    # Quoted names with '#' and comments, which the old hand-written subset could not read.
    text = skeleton.replace("last_reviewed_job: 0", "last_reviewed_job: 0  # none reviewed yet")
    data, _, errors = parse_frontmatter(text.splitlines())
    assert errors == [] and data["last_reviewed_job"] == 0
    quoted = ["---", "last_reviewed_job: 3", "stages:", '  "data #1": working', "---"]
    data, _, errors = parse_frontmatter(quoted)
    assert errors == [] and data["stages"] == {"data #1": "working"}


def test_frontmatter_duplicate_key_and_bad_yaml_name_the_line():
    _, _, errors = parse_frontmatter(["---", "last_reviewed_job: 1", "last_reviewed_job: 2", "stages: {}", "---"])
    assert errors == [(3, "frontmatter is not valid YAML: duplicate key 'last_reviewed_job'")]
    _, _, errors = parse_frontmatter(["---", "stages: {data: [unknown", "---"])
    assert errors and errors[0][1].startswith("frontmatter is not valid YAML")
    data, _, errors = parse_frontmatter(["---", "- a list", "---"])
    assert data is None and "must be a mapping" in errors[0][1]

