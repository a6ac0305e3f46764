"""Every shell command in README.md and docs/*.md works as written, after the README's set-up.

Each fenced ``bash``/``sh``/``console`` block is split into simple commands (``&&``, ``|``, ``;``;
continuation lines joined, comments dropped), and each is checked by what it runs:

- ``logtoku-guard ...`` (or ``.venv/bin/logtoku-guard``) is parsed by the real CLI (click, through
  typer): the subcommand exists, every option and argument is accepted, the values convert;
  nothing runs. The ``review`` and ``audit`` commands, which need no model, then run for real, in
  the page's order, on an audit store holding one answer queued for review (as the page's ``ask``
  would leave it): each must exit 0. Every ``ask`` and ``score`` on a local backend runs for real on
  the embedded model (``slow``); ``calibrate``, ``serve``, ``review serve`` and ``eval`` are parsed only
  (minutes of CPU, a server that does not return, the evaluation datasets).
- ``mkdocs build`` / ``mkdocs serve``: mkdocs.yml exists and mkdocs is installed (CI builds the site).
- ``python FILE`` / ``bash FILE``: the file exists; ``bash scripts/install.sh`` takes only the
  options the script accepts; ``python -m M``: the module is importable.
- ``curl``: the path is a route of the server, a ``-d`` body is valid JSON that the server's own
  request model accepts, and a chat request states ``temperature`` and ``max_tokens`` (the server's
  defaults are OpenAI's sampled ones, not ``ask``'s greedy 64 tokens).
- ``export NAME=...`` defines ``$NAME`` for the rest of the page; a ``$NAME`` used before is an error.
- Any other program must be on the short list below, so a new kind of command is checked on purpose.

Every repository path a command names (``examples/...``, ``scripts/...``) must exist, and every
``yaml`` block that is a policy, and every policy file in examples/, loads as one. The pages'
Python blocks run in tests/docs/test_docs_python_blocks.py.
"""

from __future__ import annotations

import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from cli_support import make_record, wide_consoles  # noqa: F401 (an autouse fixture)
from typer.main import get_command
from typer.testing import CliRunner

from logtoku_guard.cli import app

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_DIRS = ("examples", "scripts", "benchmarks", "docs", "integrations", "logtoku_guard", "tests", "evaluation", "results")
EXTERNAL = {"vllm", "apt-get", "pip", "source"}  # not ours to parse; `source` is checked below
SHELL_LANGS = {"bash", "sh", "shell", "console"}
# Commands that need no model and nothing listening: run for real (group, subcommand).
RUNNABLE = {("review", s) for s in ("list", "show", "claim", "release", "approve", "reject", "add-reviewer")} | {
    ("audit", s) for s in ("tail", "export", "purge", "stats")
}


@dataclass
class Command:
    page: Path
    line: int
    words: list[str]
    env: dict[str, str] = field(default_factory=dict)

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {shlex.join(self.words)}"


def _unwrap(words: list[str]) -> list[str]:
    """The command a ``nice -n 10 ...``, ``timeout 60 ...`` or ``env A=b ...`` prefix runs."""
    while words and words[0] in ("nice", "timeout", "env"):
        head, words = words[0], words[1:]
        if head == "nice" and words[:1] == ["-n"]:
            words = words[2:]
        elif words and (head == "timeout" or (head == "nice" and re.fullmatch(r"-n?\d+", words[0]))):
            words = words[1:]
        elif head == "env":
            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                words = words[1:]
    return words


def _blocks(page: Path) -> list[tuple[str, int, str]]:
    """The fenced code blocks of ``page``: (language, line of the first code line, text)."""
    blocks = []
    lines = page.read_text(encoding="utf-8").split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if m:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            blocks.append((m.group(1), i + 2, "\n".join(lines[i + 1 : j])))
            i = j
        i += 1
    return blocks


def _lines(lang: str, first: int, text: str) -> list[tuple[int, str]]:
    """The block's command lines, continuation lines joined; a console block's ``$ `` lines only."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, raw in enumerate(text.split("\n"), start=first):
        line = raw
        if lang == "console":
            if pending is None and not line.startswith("$ "):
                continue
            line = line[2:] if pending is None else line
        if pending is not None:
            pending = (pending[0], pending[1] + " " + line.strip())
        elif line.strip() and not line.lstrip().startswith("#"):
            pending = (n, line.strip())
        else:
            continue
        if pending[1].endswith("\\"):
            pending = (pending[0], pending[1][:-1].rstrip())
        else:
            out.append(pending)
            pending = None
    assert pending is None, f"a continued line runs off the end of its block at line {first}"
    return out


def commands() -> list[Command]:
    found = []
    for page in PAGES:
        for lang, first, text in _blocks(page):
            if lang not in SHELL_LANGS:
                continue
            for n, line in _lines(lang, first, text):
                lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
                lexer.whitespace_split = True
                lexer.commenters = "#"
                words: list[str] = []
                for word in [*lexer, ";"]:
                    if word in {"|", "||", "&&", ";", "&"}:
                        if words:
                            env = {}
                            while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
                                name, _, value = words.pop(0).partition("=")
                                env[name] = value
                            if words:
                                found.append(Command(page, n, words, env))
                        words = []
                    else:
                        words.append(word)
    return found


ALL = commands()


def test_the_pages_have_commands_to_check() -> None:
    pages = {c.page for c in ALL}
    assert ROOT / "README.md" in pages and len(pages) >= 5
    assert sum(c.words[0].endswith("logtoku-guard") for c in ALL) >= 20


# -- logtoku-guard: parsed by the real CLI ------------------------------------------------------------
def _parse(args: list[str]) -> list[str]:
    """Parse ``logtoku-guard ARGS`` as the CLI would, without running it; the command path.

    Raises typer's click exceptions (:class:`typer.TyperException`: an unknown command or option, a
    value that does not convert, a missing argument). typer vendors its click, so groups are told
    by their ``resolve_command``."""
    cmd: Any = get_command(app)
    parent: Any = None
    name = "logtoku-guard"
    path: list[str] = []
    rest = list(args)
    while True:
        try:
            ctx = cmd.make_context(name, rest, parent=parent)
        except typer.Exit as exc:  # --help
            assert exc.exit_code == 0
            return path
        if not hasattr(cmd, "resolve_command"):
            return path
        rest = [*(getattr(ctx, "protected_args", None) or getattr(ctx, "_protected_args", None) or []), *ctx.args]
        assert rest, f"{' '.join(['logtoku-guard', *path])} needs a subcommand"
        sub_name, sub, rest = cmd.resolve_command(ctx, rest)
        assert sub is not None and sub_name is not None
        cmd, parent, name = sub, ctx, sub_name
        path.append(sub_name)


def _ours(c: Command) -> bool:
    return _unwrap(c.words)[:1] in (["logtoku-guard"], [".venv/bin/logtoku-guard"])


@pytest.mark.parametrize("cmd", [c for c in ALL if _ours(c)], ids=lambda c: c.where()[:120])
def test_each_logtoku_guard_command_parses(cmd: Command) -> None:
    try:
        _parse(_expand(cmd)[1:])
    except typer.TyperException as exc:
        pytest.fail(f"{cmd.where()}\n  the CLI refuses it: {exc}")


# -- variables -----------------------------------------------------------------------------------------
def _defined(cmd: Command) -> set[str]:
    """The variables ``cmd``'s page exported before it (and the usual environment)."""
    names = {"HOME", "PATH", "USER"}
    for c in ALL:
        if c.page == cmd.page and c.line < cmd.line and c.words[0] == "export":
            names |= {w.partition("=")[0] for w in c.words[1:]}
    return names | set(cmd.env)


def _expand(cmd: Command) -> list[str]:
    """``cmd``'s words (wrappers such as ``nice -n 10`` removed) with ``$NAME`` replaced by a sample
    value; a name the page has not set before fails."""
    defined = _defined(cmd)
    words = []
    for w in _unwrap(cmd.words):
        for name in re.findall(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)", w):
            assert name in defined, f"{cmd.where()}\n  uses ${name}, which the page does not set before"
        words.append(re.sub(r"\$\(.*\)|\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", "sample-key", w))
    return words


@pytest.mark.parametrize("cmd", ALL, ids=lambda c: c.where()[:120])
def test_every_command_names_what_exists(cmd: Command) -> None:
    words = _expand(cmd)
    program = words[0]
    for w in words:
        for part in (w, w.partition("=")[2]):
            if re.match(rf"^({'|'.join(REPO_DIRS)})/", part):
                assert (ROOT / part).exists(), f"{cmd.where()}\n  names {part}, which the checkout does not have"
    if _ours(cmd) or program == "export" or program == "curl":
        return  # parsed above / below
    if program in ("python", ".venv/bin/python"):
        if words[1:3] and words[1] == "-m":
            assert find_spec(words[2]) is not None, f"{cmd.where()}\n  no module {words[2]}"
        elif words[1] != "-c":
            assert (ROOT / words[1]).is_file(), f"{cmd.where()}\n  no file {words[1]}"
    elif program == "bash":
        script = ROOT / words[1]
        assert script.is_file(), f"{cmd.where()}\n  no script {words[1]}"
        if words[1] == "scripts/install.sh":
            accepted = set(re.findall(r"^\s+(--[a-z]+)\)", script.read_text(encoding="utf-8"), re.M))
            assert set(words[2:]) <= accepted, f"{cmd.where()}\n  install.sh accepts {sorted(accepted)}"
    elif program == "mkdocs":
        assert words[1:2] in (["build"], ["serve"]) and (ROOT / "mkdocs.yml").is_file(), cmd.where()
        assert find_spec("mkdocs") is not None, f"{cmd.where()}\n  mkdocs is not installed (the dev extra)"
    elif program == "source":
        assert words[1] == ".venv/bin/activate", cmd.where()
        assert (Path(sys.prefix) / "bin" / "activate").is_file(), "the venv has no bin/activate"
    else:
        assert program in EXTERNAL, f"{cmd.where()}\n  runs {program!r}: teach this test how to check it"


# -- curl: the server's own routes and request models ------------------------------------------------
def _curl_parts(words: list[str]) -> tuple[str, dict[str, str], str | None]:
    url, headers, data = "", {}, None
    i = 1
    while i < len(words):
        w = words[i]
        if w in ("-H", "--header"):
            key, _, value = words[i + 1].partition(":")
            headers[key.strip().lower()] = value.strip()
            i += 2
        elif w in ("-d", "--data"):
            data = words[i + 1]
            i += 2
        elif w.startswith("-"):
            i += 1
        else:
            url = w
            i += 1
    return url, headers, data


@pytest.mark.parametrize("cmd", [c for c in ALL if c.words[0] == "curl"], ids=lambda c: c.where()[:120])
def test_each_curl_request_is_one_the_server_takes(cmd: Command) -> None:
    from logtoku_guard.wire import openai_protocol as proto

    url, headers, data = _curl_parts(_expand(cmd))
    path = re.sub(r"^(https?://)?[^/]+", "", url).split("?")[0]
    assert re.fullmatch(r"/v1/(chat/completions|completions|models|logtoku/reviews/\d+)|/metrics|/health", path), cmd.where()
    if "sample-key" in str(headers.get("authorization")):
        assert headers["authorization"].startswith("Bearer "), cmd.where()
    if data is None:
        return
    assert headers.get("content-type") == "application/json", f"{cmd.where()}\n  the server needs Content-Type: application/json"
    body = json.loads(data)
    model = proto.ChatCompletionRequest if path.endswith("chat/completions") else proto.CompletionRequest
    model.model_validate(body)
    assert "temperature" in body and "max_tokens" in body, (
        f"{cmd.where()}\n  send temperature and max_tokens: the server's defaults are OpenAI's (sampled, 256 tokens)"
    )


# -- the review and audit commands, run for real ---------------------------------------------------------
def _seed(path: Path) -> None:
    from logtoku_guard.audit import AuditStore

    with AuditStore(path) as store:
        store.record_for_review(make_record(prompt="Who founded the Velmora Institute of Marine Acoustics?", answer="Dr. X."))


@pytest.mark.parametrize("page", sorted({c.page for c in ALL if _ours(c)}), ids=lambda p: p.name)
def test_the_review_and_audit_commands_run_in_the_pages_order(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runnable = [c for c in ALL if c.page == page and _ours(c) and tuple(_parse(_expand(c)[1:])[:2]) in RUNNABLE]
    if not runnable:
        pytest.skip(f"{page.name} has no review or audit command")
    cache = tmp_path / "cache"
    cache.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    _seed(cache / "audit.db")  # where `ask` records by default
    _seed(work / "audit.db")  # `--store audit.db`
    monkeypatch.chdir(work)
    env = {"LOGTOKU_GUARD_CACHE": str(cache), "COLUMNS": "80"}
    monkeypatch.setenv("LOGTOKU_GUARD_CACHE", str(cache))
    for cmd in runnable:
        res = CliRunner().invoke(app, _expand(cmd)[1:], env={**env, **cmd.env})
        assert res.exit_code == 0, f"{cmd.where()}\n  exit {res.exit_code}: {res.output}"


# -- policies: every shipped example and every policy block loads ----------------------------------------
EXAMPLE_POLICIES = sorted((ROOT / "examples").glob("*.yaml"))


def test_the_shipped_policies_cover_review_retrieval_strict_and_lenient() -> None:
    from logtoku_guard.decision.policy import Policy

    actions = {p.name: Policy.from_file(p).actions() for p in EXAMPLE_POLICIES}
    assert {"review.yaml", "retrieve_then_abstain.yaml", "strict.yaml", "lenient.yaml"} <= set(actions)
    assert "human_review" in actions["review.yaml"]
    assert {"retrieve", "abstain"} <= actions["retrieve_then_abstain.yaml"]
    assert "warn" in actions["lenient.yaml"] and not {"abstain", "human_review", "raise"} & actions["lenient.yaml"]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for p in EXAMPLE_POLICIES:
        assert f"examples/{p.name}" in readme, f"the README does not show {p.name}"


def _stats(guard_score: float) -> Any:
    """An answer's statistics: ordinary values, the given ``guard_score``."""
    import dataclasses

    from logtoku_guard.scoring.stats import ResponseStats
    from logtoku_guard.types import ResponseScore

    score = ResponseScore(
        reliability=-0.03, reliability_mean=-0.02, probability_reliability=-0.5, entropy_reliability=-1.0, top_n=25, n_tokens=12
    )
    values = {f.name: 0.05 for f in dataclasses.fields(ResponseStats) if f.name != "score" and f.init}
    values.update(max_eu=0.05, n_tokens=12.0, guard_score=guard_score)
    return ResponseStats(score=score, **values)


@pytest.mark.parametrize(
    ("name", "flagged"),
    [
        ("review.yaml", "human_review"),
        ("retrieve_then_abstain.yaml", "retrieve"),
        ("strict.yaml", "abstain"),
        ("lenient.yaml", "warn"),
    ],
)
def test_each_shipped_policy_decides_on_the_shipped_profile(name: str, flagged: str) -> None:
    """On the embedded model's shipped profile (as ``ask --policy`` and ``serve --policy`` load it), a
    doubted answer (guard_score 0.01) gets the policy's action and a sure one (0.99) passes."""
    from logtoku_guard.backends.embedded import EMBEDDED_MODEL
    from logtoku_guard.calibration import load_profile_for
    from logtoku_guard.decision.policy import Policy

    policy = Policy.from_file(ROOT / "examples" / name)
    profile = load_profile_for(EMBEDDED_MODEL)
    low = policy.decide(_stats(0.01), profile)
    assert low.action == flagged and low.rule == "low-guard-score", low
    high = policy.decide(_stats(0.99), profile)
    assert high.action == "pass" and high.rule is None, high


@pytest.mark.parametrize(
    ("page", "first", "text"),
    [(p, n, t) for p in PAGES for lang, n, t in _blocks(p) if lang == "yaml" and re.search(r"^(rules|tool_calls):", t, re.M)],
    ids=lambda v: str(v)[:40] if not isinstance(v, Path) else v.name,
)
def test_each_policy_block_loads(page: Path, first: int, text: str) -> None:
    from logtoku_guard.decision.policy import Policy

    try:
        Policy.from_dict({"name": "page", **yaml.safe_load(text)})
    except Exception as exc:
        pytest.fail(f"{page.relative_to(ROOT)}:{first}: the policy does not load: {exc}")


def test_no_page_shows_a_bare_option_synopsis() -> None:
    """Shell blocks hold commands to paste, not syntax: ``[--opt]`` and ``a|b`` alternatives go in prose."""
    for c in ALL:
        if c.words[0] in EXTERNAL:
            continue
        bad = [w for w in c.words if re.fullmatch(r"\[.*\]|[A-Z]{2,}|\w+(\|\w+)+", w)]
        assert not bad, f"{c.where()}\n  {bad}: write a real value"


# -- the README's examples on the real embedded model (slow) ------------------------------------------------
def _readme_command(*needles: str) -> Command:
    found = [c for c in ALL if c.page == ROOT / "README.md" and _ours(c) and all(n in c.words for n in needles)]
    assert len(found) == 1, [c.where() for c in found]
    return found[0]


@pytest.mark.slow
def test_the_readme_context_file_example_fixes_the_answer_by_retrieval(
    embedded_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ask --json --context-file examples/passages.txt "Who founded the Zarnovian ..."`` as written: the
    model's own guess is flagged and retrieved on; the answer made from the passage names the founder
    the passage gives and nothing from another passage, and passes."""
    cmd = _readme_command("--context-file")
    monkeypatch.chdir(ROOT)
    env = {"LOGTOKU_GUARD_CACHE": str(embedded_cache), "LOGTOKU_GUARD_REDACT": "keep"}
    args = [*_expand(cmd)[1:], "--store", str(tmp_path / "audit.db")]
    res = CliRunner().invoke(app, args, env=env)
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    route = [a["action"] for a in out["route"]]
    assert route[0] == "retrieve" and out["route"][1]["passages"] >= 1, out["route"]
    assert out["action"] == "pass" and "Marwick" in out["answer"], out
    assert "Velmora" not in out["answer"] and "Paris" not in out["answer"], out["answer"]


@pytest.mark.slow
def test_the_shipped_review_policy_drives_the_served_review_example(embedded_backend: Any, tmp_path: Path) -> None:
    """docs/SERVING.md's served review, end to end on the embedded model with examples/review.yaml:
    the curl body as written is withheld with a review id (no trace of the draft), ``review approve``
    as written decides it, and the verdict's long poll returns the released answer."""
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    from logtoku_guard.audit import AuditStore
    from logtoku_guard.calibration import load_profile_for
    from logtoku_guard.decision.policy import Policy
    from logtoku_guard.server import BackgroundServer, build_app

    page = ROOT / "docs" / "SERVING.md"
    ours = [c for c in ALL if c.page == page]
    serve = next(c for c in ours if _ours(c) and "examples/review.yaml" in c.words)
    post = next(c for c in ours if c.words[0] == "curl" and c.line > serve.line and "-d" in c.words)
    approve = next(c for c in ours if _ours(c) and c.words[1:3] == ["review", "approve"] and c.line > post.line)
    poll = next(c for c in ours if c.words[0] == "curl" and "reviews/1" in " ".join(c.words) and c.line > approve.line)
    policy = Policy.from_file(ROOT / serve.words[serve.words.index("--policy") + 1])
    db = tmp_path / "audit.db"
    profile = load_profile_for(embedded_backend.model_name)
    with (
        AuditStore(db) as store,
        BackgroundServer(build_app(embedded_backend, policy=policy, profile=profile, store=store)) as srv,
    ):
        _, _, data = _curl_parts(_expand(post))
        assert data is not None
        r = httpx.post(srv.base_url + "/chat/completions", json=json.loads(data), timeout=300)
        choice = r.json()["choices"][0]
        guard = choice["logtoku_guard"]
        assert guard["action"] == "human_review" and guard["review_id"] == 1, guard
        notice = choice["message"].get("refusal") or choice["message"]["content"]  # the refusal channel, or content
        assert "review 1" in notice and choice["finish_reason"] in ("stop", "content_filter"), choice
        draft = store.review_item(1).record.answer
        assert draft and draft.encode() not in r.content
        args = [*_expand(approve)[1:]]
        args[args.index("--store") + 1] = str(db)
        res = CliRunner().invoke(app, args)
        assert res.exit_code == 0, res.output
        url, _, _ = _curl_parts(_expand(poll))
        verdict = httpx.get(srv.base_url + "/logtoku/reviews/1", params={"wait": 30}, timeout=60).json()
    assert "reviews/1?wait=30" in url
    edited = approve.words[approve.words.index("--answer") + 1]
    assert verdict["status"] == "approved" and verdict["answer"] == edited and verdict["edited"] is True, verdict


# -- every `ask` and `score` command of the pages, run for real (slow) ---------------------------------------
def _runs_on_the_model(c: Command) -> bool:
    """An ``ask`` or ``score`` on a local backend (``--backend openai`` needs a server listening)."""
    if not _ours(c):
        return False
    try:
        words = _expand(c)
        path = _parse(words[1:])[:1]
    except (AssertionError, typer.TyperException):  # test_each_logtoku_guard_command_parses names the page and the fault
        return False
    backend = words[words.index("--backend") + 1] if "--backend" in words else "transformers"
    if "--context-file" in words:  # run, its answer checked: test_the_readme_context_file_example_fixes_the_answer_by_retrieval
        return False
    return path in (["ask"], ["score"]) and backend in ("transformers", "llamacpp")


_ON_THE_MODEL = list({tuple(_expand(c)[1:]): c for c in reversed(ALL) if _runs_on_the_model(c)}.values())


@pytest.mark.slow
@pytest.mark.parametrize("cmd", _ON_THE_MODEL, ids=lambda c: c.where()[:120])
def test_each_ask_and_score_command_runs_on_the_embedded_model(
    cmd: Command, embedded_cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As written (the same command on two pages runs once), in the checkout; ``ask`` records into a
    store of its own instead of the cache's. It answers and exits 0; ``--json`` prints one object."""
    args = _expand(cmd)[1:]
    if "llamacpp" in args:
        pytest.importorskip("llama_cpp")
    else:
        pytest.importorskip("gguf")
    if args[0] == "ask":
        args += ["--store", str(tmp_path / "audit.db")]
    monkeypatch.chdir(ROOT)
    res = CliRunner().invoke(app, args, env={"LOGTOKU_GUARD_CACHE": str(embedded_cache), "COLUMNS": "100"})
    assert res.exit_code == 0, f"{cmd.where()}\n  exit {res.exit_code}: {res.output}"
    if "--json" in args:
        out = json.loads(res.stdout)
        assert out["answer"] or out["action"] in ("abstain", "human_review"), out
    else:
        assert res.stdout.strip(), f"{cmd.where()}\n  printed nothing"
