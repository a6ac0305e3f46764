"""A stream whose generation failed prints nothing at interpreter exit (issue 44 item 5).

The test command used to end with tracebacks after its green summary: a served request whose
grammar failed (``GrammarError``) or could not compile (``ConfigurationError``) left its token
streams registered with ``weakref.finalize``, so at exit the finalizer closed them again and raised
the stored error again. A stream that was closed or ended now detaches its finalizer.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from logtoku_guard.backends.base import TokenStream

SCRIPT = textwrap.dedent(
    """
    from logtoku_guard.backends.base import TokenStream

    def tokens():
        raise RuntimeError("the constraint failed while decoding")
        yield

    def result():
        raise RuntimeError("the constraint failed while decoding (result)")

    inner = TokenStream(tokens(), result, cancel=lambda: None)
    outer = TokenStream(iter(inner), lambda: inner.generation, cancel=inner.close)  # a wrapper, as the server's
    kept = []
    try:
        with outer:
            for _ in outer:
                pass
    except RuntimeError as exc:
        kept.append(exc)  # the error (its traceback holds both streams) lives until exit, as in a test run
    print("handled:", kept[0])
    """
)


def test_a_failed_wrapped_stream_prints_nothing_at_exit() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("handled: the constraint failed"), done.stdout
    assert done.stderr == "", done.stderr


def test_closing_or_ending_a_stream_detaches_its_finalizer() -> None:
    stopped: list[str] = []
    ended = TokenStream(iter(()), lambda: None, cancel=lambda: stopped.append("ended"))  # type: ignore[arg-type,return-value]
    list(ended)
    closed = TokenStream(iter(()), lambda: None, cancel=lambda: stopped.append("closed"))  # type: ignore[arg-type,return-value]
    closed.close()
    assert stopped == ["closed"]  # close() cancels once, explicitly
    for stream in (ended, closed):
        assert stream._finalizer is not None and not stream._finalizer.alive
    failed = TokenStream(iter(()), lambda: (_ for _ in ()).throw(RuntimeError("x")), cancel=lambda: None)  # type: ignore[arg-type,return-value]
    with pytest.raises(RuntimeError):
        failed.close()
    assert failed._finalizer is not None and not failed._finalizer.alive
