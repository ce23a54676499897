"""pipeline.yaml checked offline (tau/pipeline.py, ``tau pipeline validate``): a valid file
and its graph, then every kind of mistake, each reported with its file, line and column, all
at once; the JSON Schema agrees with the checker (issue 35)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema  # type: ignore[import-untyped]  # no stubs; installed with the dev tools
import pytest
import yaml

from tau.cli import main
from tau.pipeline import (
    MAX_STAGES,
    Gate,
    check_pipeline,
    json_schema,
    load_pipeline,
)

LIFECYCLE = """\
schema_version: 1
name: tiny-gpt-lifecycle
stages:
  prepare:  {config: data-prep/tau.yaml}
  train:    {config: train/tau.yaml, needs: [prepare]}
  finetune: {config: finetune/tau.yaml, needs: [train]}
  evaluate: {config: evaluate/tau.yaml, needs: [finetune]}
  report:   {config: report/tau.yaml, needs: [train]}
  serve:
    config: serve/tau.yaml
    needs: [evaluate]
    when: "evaluate.metrics.accuracy >= 0.8"
"""

JOB = "schema_version: 1\nname: {name}\nrun: {{entrypoint: main.py}}\n"
ENDPOINT = (
    "schema_version: 1\nname: {name}\nrun: {{workload_kind: rayservice}}\n"
    'serve: {{import_path: "app:deployment"}}\n'
)


REPORTS = "from tau import sdk\n\nsdk.log_metrics(1, accuracy=0.9, loss=0.1, rows=20, x=1)\n"


def project(root: Path, pipeline: str, **stages: str) -> Path:
    """A folder with ``pipeline.yaml`` and a tau.yaml per stage folder (``serve`` an
    endpoint unless given)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "pipeline.yaml").write_text(pipeline)
    defaults = {
        folder: (ENDPOINT if folder == "serve" else JOB).format(name=folder)
        for folder in ("data-prep", "train", "finetune", "evaluate", "report", "serve")
    }
    for folder, text in {**defaults, **stages}.items():
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "tau.yaml").write_text(text)
        # What each stage's program reports, for the gates' metrics.
        (root / folder / "main.py").write_text(REPORTS)
    return root / "pipeline.yaml"


def lines(path: Path, shown: str = "pipeline.yaml") -> list[str]:
    return [problem.format() for problem in check_pipeline(path, shown=shown).problems]


def test_the_lifecycle_is_valid_and_its_graph_is_read(tmp_path: Path) -> None:
    check = check_pipeline(project(tmp_path, LIFECYCLE))
    assert check.ok, check.problems
    pipeline = check.pipeline
    assert pipeline is not None
    assert pipeline.name == "tiny-gpt-lifecycle"
    # Nothing starts before what it needs; stages that could start together keep file order.
    assert pipeline.order() == ["prepare", "train", "finetune", "report", "evaluate", "serve"]
    assert pipeline.upstream("serve") == {"evaluate", "finetune", "train", "prepare"}
    assert pipeline.upstream("report") == {"train", "prepare"}
    assert pipeline.stage("serve").when == Gate("evaluate", "accuracy", ">=", 0.8)
    assert set(check.specs) == {"prepare", "train", "finetune", "evaluate", "report", "serve"}
    assert check.specs["serve"].run.workload_kind == "rayservice"
    assert pipeline.to_dict()["stages"]["serve"] == {
        "config": "serve/tau.yaml",
        "needs": ["evaluate"],
        "when": "evaluate.metrics.accuracy >= 0.8",
    }


@pytest.mark.parametrize(
    ("text", "reported", "passes"),
    [
        ("evaluate.metrics.accuracy >= 0.8", 0.8, True),
        ("evaluate.metrics.accuracy >= 0.8", 0.79, False),
        ("  eval-2.metrics.val/loss<1e-1 ", 0.05, True),
        ("evaluate.metrics.loss != 0", float("nan"), False),
        ("evaluate.metrics.f1 == .5", 0.5, True),
    ],
)
def test_a_gate_reads_one_metric_against_a_number(text: str, reported: float, passes: bool) -> None:
    gate = Gate.parse(text)
    assert gate is not None
    assert gate.passes(reported) is passes


@pytest.mark.parametrize(
    "text",
    [
        "evaluate.metric.accuracy >= 0.8",  # metric, not metrics
        "evaluate.metrics.accuracy => 0.8",
        "evaluate.metrics.accuracy >= high",
        "evaluate.metrics.accuracy >= 0.8 and train.metrics.loss < 1",
        "Evaluate.metrics.accuracy >= 0.8",
        "evaluate.metrics.accuracy >= inf",
        "__import__('os').system('x') >= 1",
    ],
)
def test_anything_else_is_not_a_gate(text: str) -> None:
    assert Gate.parse(text) is None


def test_every_mistake_in_the_file_is_reported_at_once_with_its_place(tmp_path: Path) -> None:
    bad = """\
schema_version: 1
name: Tiny_GPT
stages:
  prepare: {config: data-prep/tau.yaml, colour: red}
  train: {config: train/tau.yaml, needs: [prepare, tokenize]}
  evaluate: {config: ../evaluate/tau.yaml, needs: [train]}
  serve:
    config: serve/tau.yaml
    needs: [evaluate]
    when: "evaluate.metric.accuracy >= 0.8"
  report: {config: nowhere/tau.yaml, needs: [report]}
"""
    assert lines(project(tmp_path, bad)) == [
        "pipeline.yaml:2:7: name: the name `Tiny_GPT` must be lower-case letters, digits and "
        "'-', start with a letter and end with a letter or digit",
        "pipeline.yaml:4:41: stages.prepare.colour: unknown key `colour` (expected one of: "
        "`config`, `needs`, `when`)",
        "pipeline.yaml:5:52: stages.train.needs[1]: needs `tokenize`, which is not a stage of "
        "this pipeline (the stages are: `prepare`, `train`, `evaluate`, `serve`, `report`)",
        "pipeline.yaml:6:22: stages.evaluate.config: the path `../evaluate/tau.yaml` uses "
        "`..`; it must stay inside its directory (write it relative to the folder of "
        "pipeline.yaml, e.g. `train/tau.yaml`)",
        "pipeline.yaml:10:11: stages.serve.when: `evaluate.metric.accuracy >= 0.8` is not a "
        "gate TauGrid reads (write STAGE.metrics.METRIC, then one of >= > <= < == !=, then a "
        'number, e.g. "evaluate.metrics.accuracy >= 0.8")',
        "pipeline.yaml:11:3: stages.report.config: there is no file `nowhere/tau.yaml` (the "
        "path is relative to the folder of pipeline.yaml)",
        "pipeline.yaml:11:46: stages.report.needs[0]: the stage `report` needs itself",
    ]


def test_a_circle_of_needs_is_named_stage_by_stage(tmp_path: Path) -> None:
    circle = """\
schema_version: 1
name: circle
stages:
  prepare: {config: data-prep/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare, evaluate]}
  finetune: {config: finetune/tau.yaml, needs: [train]}
  evaluate: {config: evaluate/tau.yaml, needs: [finetune]}
"""
    assert lines(project(tmp_path, circle)) == [
        "pipeline.yaml:5:42: stages.train.needs: the stages' needs go round in a circle (each "
        "needs the next): train → evaluate → finetune → train (a stage can only need stages "
        "that come before it)"
    ]


def test_a_gate_reads_only_a_stage_that_has_ended_before_its_own_starts(tmp_path: Path) -> None:
    gates = """\
schema_version: 1
name: gates
stages:
  prepare: {config: data-prep/tau.yaml}
  train: {config: train/tau.yaml, needs: [prepare]}
  evaluate: {config: evaluate/tau.yaml, needs: [prepare], when: "train.metrics.loss < 2"}
  report: {config: report/tau.yaml, needs: [train], when: "prepare.metrics.rows > 10"}
  finetune: {config: finetune/tau.yaml, needs: [train], when: "tune.metrics.loss < 1"}
"""
    assert lines(project(tmp_path, gates)) == [
        "pipeline.yaml:6:65: stages.evaluate.when: the gate reads the metrics of `train`, but "
        "`evaluate` does not need it (itself or through another stage): it could start before "
        "`train` has ended (add train to the needs of evaluate)",
        "pipeline.yaml:8:63: stages.finetune.when: the gate reads the metrics of `tune`, which "
        "is not a stage of this pipeline (the stages are: `prepare`, `train`, `evaluate`, "
        "`report`, `finetune`)",
    ]


def test_nothing_waits_for_an_endpoint_and_no_gate_reads_one(tmp_path: Path) -> None:
    after = """\
schema_version: 1
name: after-serving
stages:
  train: {config: train/tau.yaml}
  serve: {config: serve/tau.yaml, needs: [train]}
  report: {config: report/tau.yaml, needs: [serve], when: "serve.metrics.p95 < 100"}
"""
    assert lines(project(tmp_path, after)) == [
        "pipeline.yaml:6:3: stages.report.needs[0]: needs `serve`, an endpoint, which runs "
        "until it is stopped: `report` would never start (an endpoint is a pipeline's last "
        "stage; let other stages need the stage before it)",
        "pipeline.yaml:6:3: stages.report.when: the gate reads the metrics of `serve`, an "
        "endpoint, which has no final metrics (gate on an evaluation stage's metrics instead)",
    ]


def test_each_stage_s_tau_yaml_problems_name_that_file(tmp_path: Path) -> None:
    broken = "schema_version: 1\nname: train\nrun: {entrypoint: main.py}\ncompute: {gpus: lots}\n"
    path = project(tmp_path / "lifecycle", LIFECYCLE, train=broken)
    problems = check_pipeline(path, shown="lifecycle/pipeline.yaml").problems
    assert [(p.file, p.problem.line, p.problem.path) for p in problems] == [
        ("lifecycle/train/tau.yaml", 4, "compute.gpus")
    ]
    # A pipeline.yaml with problems of its own still has its stages' files checked.
    (tmp_path / "lifecycle" / "pipeline.yaml").write_text(
        LIFECYCLE.replace("name: tiny", "nme: tiny")
    )
    files = [p.file for p in check_pipeline(path, shown="lifecycle/pipeline.yaml").problems]
    assert files == [
        "lifecycle/pipeline.yaml",
        "lifecycle/pipeline.yaml",
        "lifecycle/train/tau.yaml",
    ]


def test_a_stage_s_file_stays_inside_the_pipeline_s_folder(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "tau.yaml").write_text(JOB.format(name="outside"))
    path = project(
        tmp_path / "p", "schema_version: 1\nname: p\nstages:\n  a: {config: a/tau.yaml}\n"
    )
    os.symlink(outside, tmp_path / "p" / "a")
    assert lines(path) == [
        "pipeline.yaml:4:3: stages.a.config: `a/tau.yaml` leads outside the folder of "
        "pipeline.yaml (through a link) (keep each stage's project inside the pipeline's folder)"
    ]
    for config, said in [
        ("/etc/tau.yaml", "the path `/etc/tau.yaml` is absolute; it must be relative"),
        ("train", "`train` is a folder, not a tau.yaml"),
    ]:
        (tmp_path / "p" / "pipeline.yaml").write_text(
            f"schema_version: 1\nname: p\nstages:\n  a: {{config: {config}}}\n"
        )
        assert said in lines(path)[0]


def test_the_limits_and_the_shape_of_the_file(tmp_path: Path) -> None:
    many = "".join(f"  s{index}: {{config: train/tau.yaml}}\n" for index in range(MAX_STAGES + 1))
    assert load_pipeline(f"schema_version: 1\nname: many\nstages:\n{many}")[1][0].message == (
        f"has {MAX_STAGES + 1} stages; at most {MAX_STAGES} are allowed"
    )
    assert load_pipeline("schema_version: 1\nname: none\nstages: {}\n")[1][0].message == (
        "a pipeline needs at least one stage"
    )
    long_name = "s" * 33
    problem = load_pipeline(
        f"schema_version: 1\nname: long\nstages:\n  {long_name}: {{config: a/tau.yaml}}\n"
    )[1][0]
    assert (problem.path, problem.message) == (
        f"stages.{long_name}",
        "is 33 characters long; at most 32 are allowed",
    )
    assert load_pipeline("- a list\n")[1][0].message.startswith("expected a mapping")
    assert load_pipeline("schema_version: 2\nname: x\nstages: {a: {config: a.yaml}}\n")[1][
        0
    ].message.startswith("schema version 2 is not supported")
    assert load_pipeline("name: [unclosed\n")[1][0].line == 2  # YAML's own error, placed


def test_the_json_schema_agrees_with_the_checker(tmp_path: Path) -> None:
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert not list(validator.iter_errors(yaml.safe_load(LIFECYCLE)))
    for text in [
        LIFECYCLE.replace("name: tiny-gpt", "name: Tiny_gpt"),
        LIFECYCLE.replace("{config: data-prep/tau.yaml}", "{config: /abs/tau.yaml}"),
        LIFECYCLE.replace("evaluate.metrics.accuracy", "evaluate.metric.accuracy"),
        LIFECYCLE.replace("needs: [prepare]}", "needs: [prepare], colour: red}"),
        LIFECYCLE.replace("  prepare:", "  Prepare:"),
    ]:
        assert list(validator.iter_errors(yaml.safe_load(text))), text
        assert load_pipeline(text)[1], text


def test_tau_pipeline_validate_says_ok_or_every_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    project(tmp_path, LIFECYCLE)
    monkeypatch.chdir(tmp_path)
    assert main(["pipeline", "validate"]) == 0
    assert capsys.readouterr().out.strip() == (
        "pipeline.yaml: ok (6 stages: prepare → train → finetune → report → evaluate → serve)"
    )
    (tmp_path / "pipeline.yaml").write_text(LIFECYCLE.replace("[prepare]}", "[prep]}"))
    assert main(["pipeline", "validate", "-c", "pipeline.yaml"]) == 2
    said = capsys.readouterr()
    assert said.err.startswith("pipeline.yaml:5:46: stages.train.needs[0]: needs `prep`")
    assert main(["pipeline", "validate", "--json"]) == 2
    records = json.loads(capsys.readouterr().out)
    assert [(r["file"], r["line"], r["path"], r["severity"]) for r in records] == [
        ("pipeline.yaml", 5, "stages.train.needs[0]", "error")
    ]
    assert main(["pipeline", "validate", "-c", "missing.yaml"]) == 2
    assert "cannot read the file" in capsys.readouterr().err
    assert main(["pipeline", "schema"]) == 0
    assert json.loads(capsys.readouterr().out)["title"].startswith("pipeline.yaml")


def test_a_gate_on_a_metric_its_stage_s_code_never_names_is_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = project(tmp_path, LIFECYCLE.replace("metrics.accuracy", "metrics.acuracy"))
    check = check_pipeline(path, shown="pipeline.yaml")
    assert check.ok  # a warning: the code may name it in a way no search sees
    assert [problem.format() for problem in check.problems] == [
        "pipeline.yaml:9:3: warning: stages.serve.when: no Python file of `evaluate`'s project "
        "names the metric `acuracy`: if evaluate does not report it, the gate cannot decide "
        "and the pipeline fails there (check the name against what evaluate reports "
        "(tau.sdk.log_metrics))"
    ]
    # Named in a file of the project (quoted, or as a keyword): no warning.
    (tmp_path / "evaluate" / "sub").mkdir()
    (tmp_path / "evaluate" / "sub" / "metrics.py").write_text('NAMES = ["acuracy"]\n')
    assert check_pipeline(path).problems == ()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "evaluate" / "sub" / "metrics.py").unlink()
    assert main(["pipeline", "validate"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith("pipeline.yaml: ok (6 stages")
    assert "warning: stages.serve.when" in said.out


# --- Hand-over: `{from: STAGE}` ---------------------------------------------------------------

MAKES_DATA = JOB + "outputs:\n  dataset: {{name: corpus, path: out}}\n"
MAKES_MODEL = JOB + "outputs:\n  model: {{name: tiny-gpt, path: model}}\n"


def reads(name: str, kind: str, stage: str) -> str:
    return JOB.format(name=name) + f"inputs:\n  {kind}s:\n    - {{from: {stage}}}\n"


def test_a_stage_reads_what_a_stage_it_needs_made(tmp_path: Path) -> None:
    path = project(
        tmp_path,
        LIFECYCLE,
        **{
            "data-prep": MAKES_DATA.format(name="data-prep"),
            "train": reads("train", "dataset", "prepare"),
            "finetune": MAKES_MODEL.format(name="finetune"),
            "evaluate": reads("evaluate", "model", "finetune"),
        },
    )
    check = check_pipeline(path)
    assert check.ok, [problem.format() for problem in check.problems]
    (dataset,) = check.specs["train"].inputs.datasets
    assert (dataset.from_stage, dataset.path) == ("prepare", "prepare")


def test_a_from_must_name_a_stage_it_needs_that_makes_such_a_version(tmp_path: Path) -> None:
    path = project(
        tmp_path,
        LIFECYCLE,
        **{
            "data-prep": MAKES_DATA.format(name="data-prep"),
            # report needs train (and so prepare), but prepare makes no model:
            "report": reads("report", "model", "prepare"),
            # train needs prepare only, not finetune:
            "train": reads("train", "dataset", "finetune"),
            # no such stage:
            "evaluate": reads("evaluate", "dataset", "prep"),
        },
    )
    found = lines(path)
    assert (
        "train/tau.yaml:6:8: inputs.datasets[0].from: names `finetune`, which `train` does not "
        "need: it may not have ended when this stage starts (add finetune to the `needs` of "
        "train in pipeline.yaml)"
    ) in found, found
    assert any(
        line.startswith(
            "report/tau.yaml:6:8: inputs.models[0].from: names `prepare`, which makes no model"
        )
        for line in found
    ), found
    assert any(
        line.startswith(
            "evaluate/tau.yaml:6:8: inputs.datasets[0].from: names `prep`, which "
            "is not a stage of this pipeline"
        )
        for line in found
    ), found
    assert not check_pipeline(path).ok


def test_an_endpoint_serves_the_model_a_stage_it_needs_made(tmp_path: Path) -> None:
    serves = ENDPOINT.format(name="serve").replace(
        'serve: {import_path: "app:deployment"}',
        'serve: {import_path: "app:deployment", model: {from: finetune}}',
    )
    assert serves != ENDPOINT.format(name="serve")
    good = project(
        tmp_path / "good",
        LIFECYCLE,
        finetune=MAKES_MODEL.format(name="finetune"),
        serve=serves,
    )
    check = check_pipeline(good)
    assert check.ok, [problem.format() for problem in check.problems]
    assert check.specs["serve"].serve.model.from_stage == "finetune"  # type: ignore[union-attr]
    # finetune declares no outputs.model here: nothing to serve.
    found = lines(project(tmp_path / "bad", LIFECYCLE, serve=serves))
    assert any(
        line.startswith("serve/tau.yaml:4:")
        and "serve.model.from: names `finetune`, which makes no model" in line
        for line in found
    ), found
