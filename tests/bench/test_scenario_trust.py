"""The scenario file's trust model (``docs/threat_model.md``, ``bench/scenario_trust.py``):
a scenario is code, like a Makefile -- ``launch:`` commands and ``task: x.py:fn``
modules run only from a scenario file the user named on the command line. Any other
scenario (a mapping from a program, a built-in one) is refused for them before anything
is imported; the same file named on the command line is accepted and imported."""
from __future__ import annotations

import textwrap

import pytest
import yaml

from kvmap.bench.scenario import BUILTIN_SCENARIOS, ScenarioError, load_scenario
from kvmap.bench.scenario_parse import parse_scenario

TASKS_PY = '''
import pathlib
pathlib.Path(__file__).with_name("imported.marker").write_text("imported")

def score(llm):
    return {"x": 1}
'''


def scenario_file(tmp_path):
    (tmp_path / "tasks.py").write_text(TASKS_PY)
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent("""
        name: trust
        models: [dummy:tiny]
        engine: {kv_memory: 1MiB, block_size: 4, max_num_batched_tokens: 64}
        tasks:
          - {name: mine, task: "tasks.py:score"}
        endpoints:
          - {name: served, model: tiny, launch: "{python} -m kvmap.cli serve --port {port}"}
        """))
    return path


def test_a_scenario_not_named_by_the_user_may_not_launch_or_import(tmp_path):
    path = scenario_file(tmp_path)
    data = yaml.safe_load(path.read_text())
    with pytest.raises(ScenarioError) as err:
        parse_scenario(data, "from-a-program", tmp_path)
    message = str(err.value)
    assert "endpoints[0].launch" in message and "tasks[0].task" in message
    assert "named on the command line" in message
    assert not (tmp_path / "imported.marker").exists()        # nothing was imported


def test_the_file_named_on_the_command_line_may(tmp_path):
    s = load_scenario(scenario_file(tmp_path))
    assert [t.task.endswith("tasks.py:score") for t in s.tasks] == [True]
    assert s.endpoints[0].launch.startswith("{python}")
    assert (tmp_path / "imported.marker").read_text() == "imported"


@pytest.mark.parametrize("name", BUILTIN_SCENARIOS)
def test_built_in_scenarios_run_no_code_of_their_own(name):
    """They are parsed as scenarios the user did not write (``code`` off), so one that
    held a launch or a module task would fail here."""
    s = load_scenario(f"builtin:{name}")
    assert all(e.launch is None for e in s.endpoints)
    assert all(t.is_accuracy_task for t in s.tasks)


def test_api_key_env_takes_any_variable_and_keys_stay_out_of_the_file(tmp_path,
                                                                       monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "k" * 20)
    base = {"name": "k", "models": ["dummy:tiny"],
            "engine": {"kv_memory": "1MiB", "block_size": 4, "max_num_batched_tokens": 64},
            "workloads": [{"name": "tp", "kind": "synthetic", "num_requests": 1,
                           "prompt_len": 8, "output_len": 2}]}
    ok = parse_scenario({**base, "endpoints": [{"name": "e", "model": "m",
                                                "url": "http://127.0.0.1:9/v1",
                                                "api_key_env": "AWS_SECRET_ACCESS_KEY"}]})
    assert ok.endpoints[0].api_key_env == "AWS_SECRET_ACCESS_KEY"     # code's choice
    for bad, where in (({"api_key": "k" * 20}, "api_key"),
                       ({"url": "http://u:pw-secret@127.0.0.1:9/v1"}, "url")):
        entry = {"name": "e", "model": "m", "url": "http://127.0.0.1:9/v1", **bad}
        with pytest.raises(ScenarioError, match=f"endpoints\\[0\\] \\(e\\)\\.{where}") as err:
            parse_scenario({**base, "endpoints": [entry]})
        assert "pw-secret" not in str(err.value)
