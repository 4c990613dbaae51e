"""Which scenarios may run code: the scenario file's trust model (``docs/threat_model.md``).

A scenario is code, like a Makefile. ``kvmap bench FILE`` runs what FILE says with the
user's privileges and environment: its endpoints' ``launch`` commands, its
``task: x.py:fn`` modules (imported while the scenario is checked, to bind their
parameters). So a scenario runs code only when the user named it: a file given on the
command line (``load_scenario(path)``) or a tune built from the user's own options.
Anything else that is parsed as a scenario -- a built-in one, a mapping from a program,
a stored ``scenario.yaml`` (a record; no command reads one back to run it) -- may not
launch or import: :func:`refuse_code` names each such entry, before anything is imported.

The checks the parser keeps are then about mistakes and records, not defence against the
file: no ``api_key`` in a file (the file is copied into the run directory), endpoints on
loopback unless ``$KVMAP_ENDPOINT_HOSTS`` lists the host (so a copied scenario does not
load a remote server by accident), ``api_key_env`` any variable name (a scenario that
could run ``launch: env`` gains nothing from a list of forbidden names).
"""
from __future__ import annotations

CODE_REFUSED = ("runs code; only a scenario file named on the command line may (a "
                "scenario is code, like a Makefile: docs/threat_model.md)")


def refuse_code(data: dict, problems) -> None:
    """Raise ``problems`` (a ``scenario_parse.Problems``) naming every entry of ``data``
    that would run code -- ``launch`` commands, ``module:function`` tasks -- if any."""
    def items(key):
        raw = data.get(key)
        return enumerate(raw) if isinstance(raw, list) else ()
    for i, item in items("endpoints"):
        if isinstance(item, dict) and item.get("launch") is not None:
            problems.add(f"endpoints[{i}].launch", f"a launch command {CODE_REFUSED}")
    for i, item in items("tasks"):
        task = item.get("task", item.get("name")) if isinstance(item, dict) else item
        if isinstance(task, str) and ":" in task:
            problems.add(f"tasks[{i}].task", f"a module:function task {CODE_REFUSED}")
    problems.raise_if_any()
