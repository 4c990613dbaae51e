"""Runs on disk: a cell's record (``record.py``: ``CellRecord``, the one typed value that
crosses from the bench to the report) and the run directory that holds them
(``store.py``: ``RunStore``; ``inputs.py`` fingerprints the files a scenario reads).

Below the bench, which writes runs, ``kvmap loadgen``, which writes runs of its own,
and the report and ``kvmap tune``, which read them: importing this package imports
nothing of theirs (``tests/test_package_direction.py``)."""
