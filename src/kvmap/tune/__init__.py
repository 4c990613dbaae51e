"""``kvmap tune``: search a KV configuration space with successive bench cells.

space (what may be tried) -> setup (the scenario it becomes) -> search (which cell next,
bisection and early rejection) -> evaluate (the report's rules) -> executor (the bench's
runner, within a cell budget) -> path (``tune.json``) -> run / command. It imports bench
and report; only the CLI imports it.
"""
