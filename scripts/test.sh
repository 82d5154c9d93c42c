#!/usr/bin/env bash
# One command from a fresh clone: set up, check lint, format and types (ruff, mypy), and run
# the test suite (CPU only).
#
#   bash scripts/test.sh [PYTEST ARGS]
#
# Cgroup tests need root; the browser test needs chromium (installed here
# when root); the cluster tests need scripts/slurm-local.sh and
# scripts/sshd-local.sh started (.ci/run starts them). Set
# MILARUN_REQUIRE_CGROUPS=1 / MILARUN_REQUIRE_BROWSER=1 / MILARUN_REQUIRE_CLUSTER=1
# to turn their skips into failures (CI does).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then
  bash scripts/install-browser.sh
fi
set +e
# Lint, format and types first (seconds); their failure fails the run, after the tests.
lint=0
.venv/bin/ruff check --quiet milarun tests benchmarks scripts || lint=1
.venv/bin/ruff format --check --quiet milarun tests benchmarks scripts || lint=1
.venv/bin/mypy || lint=1  # the files of [tool.mypy] in pyproject.toml
.venv/bin/python -m pytest -q -rs "$@" tests
status=$?
set -e
if [ $status = 5 ]; then
  echo "test.sh: pytest collected no tests (exit 5): the suite is missing" >&2
  exit 1
fi
if [ $status = 0 ] && [ $lint != 0 ]; then
  echo "test.sh: the tests passed, but ruff or mypy did not (see above)" >&2
  exit 1
fi
exit $status
