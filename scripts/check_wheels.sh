#!/usr/bin/env bash
# Build the wheels of the five distributions in this checkout (logtoku-guard; in integrations/,
# langchain-logtoku, llama-index-llms-logtoku, llama-index-embeddings-logtoku-minilm; the evaluation
# harness in evaluation/, logtoku-guard-eval), install them
# into a fresh venv and import each from there. Offline: the build uses the build backend already
# installed (hatchling, in the dev extra) and the install is --no-index --no-deps.
#   bash scripts/check_wheels.sh            # with .venv/bin/python (or $PYTHON)
# The fresh venv sees the dependencies (torch, transformers, langchain, llama-index-core) through a
# plain path to the project venv's site-packages: the .pth files there (this checkout's editable
# installs) are not processed, so every first-party module must come from the wheels, and the
# script checks that it does. Also checked: the core wheel carries no integration and no harness, and
# each other distribution requires a logtoku-guard range that holds the core's version.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
[[ -x "$PY" ]] || { echo "error: no Python at $PY; run scripts/install.sh --dev first or set PYTHON" >&2; exit 2; }
"$PY" -c 'import hatchling' 2>/dev/null || { echo "error: hatchling is not installed in $PY (the dev extra has it)" >&2; exit 2; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$PY" -m pip --disable-pip-version-check wheel -q --no-deps --no-index --no-build-isolation -w "$work/dist" \
    . integrations/langchain integrations/llamaindex integrations/llamaindex-embeddings ./evaluation
"$PY" -m venv --without-pip "$work/venv"
site="$("$work/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
"$PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))' > "$site/_project_dependencies.pth"
"$PY" -m pip --disable-pip-version-check --python "$work/venv/bin/python" install -q --no-index --no-deps "$work"/dist/*.whl

cd "$work"
env -u PYTHONPATH "$work/venv/bin/python" - "$site" "$work/dist" <<'PY'
import importlib
import importlib.metadata as md
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

site, dist = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
imports = {
    "logtoku-guard": ["logtoku_guard", "logtoku_guard.cli"],
    "langchain-logtoku": ["langchain_logtoku"],
    "llama-index-llms-logtoku": ["llama_index.llms.logtoku"],
    "llama-index-embeddings-logtoku-minilm": ["llama_index.embeddings.logtoku_minilm"],
    "logtoku-guard-eval": ["logtoku_eval", "logtoku_eval.cli"],
}
core_version = md.version("logtoku-guard")
for name, modules in imports.items():
    for module in modules:
        path = Path(importlib.import_module(module).__file__).resolve()
        if site not in path.parents:
            sys.exit(f"{module} was imported from {path}, not from the {name} wheel in {site}")
    if name != "logtoku-guard":
        core = [r for r in map(Requirement, md.requires(name) or []) if r.name == "logtoku-guard"]
        if not core or not core[0].specifier.contains(core_version):
            sys.exit(f"{name} must require a logtoku-guard range holding the core's {core_version}, got {core}")
    print(f"{name} {md.version(name)}: {', '.join(modules)} import from the wheel")
(core_wheel,) = dist.glob("logtoku_guard-*.whl")
stray = [n for n in zipfile.ZipFile(core_wheel).namelist() if n.startswith(("langchain_logtoku/", "llama_index/", "logtoku_eval/"))]
if stray:
    sys.exit(f"the core wheel {core_wheel.name} still carries integration or harness modules: {stray[:5]}")
print(f"{core_wheel.name}: no integration modules, no harness")
eval_commands = {e.name for e in md.entry_points(group="logtoku_guard.cli")}
if "eval" not in eval_commands:
    sys.exit(f"logtoku-guard-eval registers no `eval` command group (found {sorted(eval_commands)})")
print("logtoku-guard-eval: the `eval` command group is registered")
PY
