"""The core's layers, as docs/ARCHITECTURE.md states them: a module never imports a higher layer.

Every import counts, at run time and under ``if TYPE_CHECKING:``, at any depth (a lazy import in a
function is an import too). An import back up that must stay is named in ``ALLOWED_UP`` with its
reason; the test fails when one is added without a reason, and when a named one is gone (so the
list never outlives the code).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_architecture import PACKAGE, _graph, _module_name

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("helpers", ("errors", "safe_text", "templates", "files", "jsonl", "sockets")),
    ("maths", ("scoring.uncertainty", "scoring.quadrants", "tools.constraints")),
    ("types", ("types",)),
    ("scoring and tools", ("scoring", "tools")),
    ("wire forms", ("wire", "audit.records")),
    ("decision", ("decision", "calibration.risk")),
    ("audit", ("audit",)),
    ("backends", ("backends",)),
    ("guard", ("guard",)),
    ("calibration", ("calibration",)),
    ("serving", ("server", "review_web")),
    ("command line", ("cli",)),
    ("package root", ("",)),
)
"""Lowest first. A module belongs to the layer of its longest matching prefix (below ``logtoku_guard.``)."""

_PROFILE_TYPE = (
    "type-only: ModelProfile (the calibrated thresholds a decision reads) lives with calibrate() in "
    "calibration/profiles.py; only its type is named here, under TYPE_CHECKING"
)
_RESULT_TYPES = (
    "type-only: the payloads serialise a GuardResult, its Decision and Checks, read by attribute at run "
    "time, so the wire forms stay below the decision"
)
ALLOWED_UP: dict[tuple[str, str], str] = {
    **{
        (f"logtoku_guard.{m}", "logtoku_guard.calibration"): _PROFILE_TYPE
        for m in (
            "decision.conditions",
            "decision.decider",
            "decision.policy",
            "decision.rules",
            "guard.guard",
            "guard.telemetry",
            "wire.payloads",
        )
    },
    **{
        ("logtoku_guard.wire.payloads", f"logtoku_guard.decision.{m}"): _RESULT_TYPES for m in ("conditions", "policy", "results")
    },
    ("logtoku_guard.audit.records", "logtoku_guard.decision.results"): _RESULT_TYPES,
    ("logtoku_guard.guard.guard", "logtoku_guard.calibration.profiles"): (
        "Guard(profile='auto') loads the model's saved or shipped profile: a lazy import, made only for 'auto'"
    ),
}
"""(importer, imported) -> why this import runs back up a layer."""


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (a ``logtoku_guard.*`` name)."""
    rest = module.removeprefix("logtoku_guard").removeprefix(".")
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = (prefix == "" and rest == "") or rest == prefix or (prefix and rest.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    if best is None:
        msg = f"{module} is in no layer: add it to LAYERS (and to docs/ARCHITECTURE.md)"
        raise AssertionError(msg)
    return best


def upward_imports() -> dict[tuple[str, str], tuple[str, str]]:
    """Every import from a module to a module of a higher layer, with both layers' names."""
    graph = _graph("logtoku_guard", type_checking=True)
    found = {}
    for importer, imported in sorted((a, b) for a, targets in graph.items() for b in targets):
        if layer_of(imported) > layer_of(importer):
            found[(importer, imported)] = (LAYERS[layer_of(importer)][0], LAYERS[layer_of(imported)][0])
    return found


def test_every_core_module_has_a_layer() -> None:
    for path in PACKAGE.rglob("*.py"):
        layer_of(_module_name(path))


def test_no_module_imports_a_higher_layer() -> None:
    up = {pair: layers for pair, layers in upward_imports().items() if pair not in ALLOWED_UP}
    lines = [f"{a} ({la}) imports {b} ({lb})" for (a, b), (la, lb) in up.items()]
    assert not lines, "imports back up a layer (move the module, invert the dependency, or name it in ALLOWED_UP):\n" + "\n".join(
        lines
    )


def test_every_allowed_upward_import_still_exists_and_says_why() -> None:
    found = upward_imports()
    for pair, why in ALLOWED_UP.items():
        assert pair in found, f"{pair} no longer imports up a layer: remove it from ALLOWED_UP"
        assert len(why) > 20, f"{pair}: say why this import must run back up"


def test_the_layer_check_sees_a_lazy_import_back_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checker itself: a function-level import from the scoring layer into the guard layer is caught."""
    import test_architecture

    pkg = tmp_path / "logtoku_guard"
    (pkg / "scoring").mkdir(parents=True)
    (pkg / "guard").mkdir()
    for init in (pkg, pkg / "scoring", pkg / "guard"):
        (init / "__init__.py").write_text("")
    (pkg / "guard" / "driver.py").write_text("X = 1\n")
    (pkg / "scoring" / "stats.py").write_text("def f():\n    from logtoku_guard.guard.driver import X\n    return X\n")
    monkeypatch.setitem(test_architecture.PACKAGES, "logtoku_guard", tmp_path)
    assert ("logtoku_guard.scoring.stats", "logtoku_guard.guard.driver") in upward_imports()


def test_the_map_states_the_order_the_test_enforces() -> None:
    text = (PACKAGE.parent / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    positions = [text.find(f"**{name}**") for name, _ in LAYERS[:-1]]
    assert all(p >= 0 for p in positions), f"docs/ARCHITECTURE.md must name each layer in bold: {[n for n, _ in LAYERS]}"
    assert positions == sorted(positions), "docs/ARCHITECTURE.md must list the layers in the order LAYERS has them"
