#!/usr/bin/env bash
# Run the whole test suite (unit tests on a tiny random model, then the real-model tests
# marked slow), with the services the tests need started on loopback and stopped after.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
if [ -f scripts/redis.sh ]; then
  bash scripts/redis.sh start 6390 && export KVMAP_REDIS_URL=redis://127.0.0.1:6390/0
  trap 'bash scripts/redis.sh stop 6390 >/dev/null 2>&1' EXIT
fi
bash scripts/chromium.sh    # the report's browser test (tests/report) needs it
# two pytest-xdist workers of one torch thread each (tests/conftest.py) keep both cores
# busy: a serial run leaves one idle about half the time (Python, servers starting, waits).
# KVMAP_TEST_WORKERS=0 runs serially; --durations lists the slowest: they differ by class
.venv/bin/python -m pytest tests -n "${KVMAP_TEST_WORKERS:-2}" --dist worksteal --durations=25 "$@"
