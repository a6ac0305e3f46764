#!/usr/bin/env bash
# The fast backend tests against the LOWEST transformers that pyproject.toml allows, in a venv of
# its own (./.venv-lowest, or $VENV), so that the bottom of the declared range is proven, not assumed.
#   bash scripts/ci_lowest_transformers.sh
# The lower bound is read from pyproject.toml's `transformers>=X` requirement and pinned as
# transformers==X; the CPU torch build is the one scripts/install.sh pins. The venv is kept between
# runs (pip then only checks it). Exit status: pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-lowest}"
PY="${PYTHON:-python3}"

lowest="$("$PY" - <<'EOF'
import re, sys, tomllib

with open("pyproject.toml", "rb") as f:
    deps = tomllib.load(f)["project"]["dependencies"]
spec = next((d for d in deps if re.match(r"transformers\b", d)), None)
found = re.search(r">=\s*([0-9][0-9A-Za-z.]*)", spec or "")
if not found:
    sys.exit(f"pyproject.toml declares no 'transformers>=X' lower bound (found {spec!r})")
print(found.group(1))
EOF
)"
echo "lowest transformers allowed by pyproject.toml: $lowest (venv: $VENV)"

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }
# The CPU build that scripts/install.sh pins: an open range could pull a multi-GB CUDA build.
pip install -q "torch==2.13.0"
# pytest-asyncio: pyproject.toml configures it (asyncio_default_fixture_loop_scope).
pip install -q -e ".[embedded]" "transformers==${lowest}" "pytest>=8" "pytest-asyncio>=0.24"
"$VENV/bin/python" -c 'import torch, transformers; print(f"testing with transformers {transformers.__version__}, torch {torch.__version__}")'

exec "$VENV/bin/python" -m pytest -q -m "not slow" -p no:cacheprovider \
    tests/backends/test_transformers_backend.py tests/backends/test_prefix_cache.py tests/backends/test_batching.py tests/backends/test_continuous_batching.py
