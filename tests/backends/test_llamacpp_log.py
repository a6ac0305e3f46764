"""llama.cpp's log at its real levels: a load prints nothing unless it fails (issue 44 item 6).

llama-cpp-python 0.3.36 maps ggml's log levels with an older numbering, so llama.cpp's warnings
(Gemma 3's "control-looking token ... this is probably a bug in the model") passed its ERROR filter
and were printed, while its errors were filtered out. :func:`route_llama_cpp_log` installs a
callback with ggml's numbering (``ggml.h``: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5).
"""

from __future__ import annotations

import logging

import pytest

from logtoku_guard.backends import quiet

WARNING = b"load: control-looking token:    107 '<end_of_turn>' was not control-type; this is probably a bug in the model.\n"


@pytest.fixture
def at_error() -> object:
    logger = logging.getLogger(quiet.LLAMA_CPP_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield logger
    logger.setLevel(level)


def test_a_warning_is_filtered_and_an_error_is_logged_at_error(at_error: object, caplog: pytest.LogCaptureFixture) -> None:
    log = quiet._LlamaCppLog()
    with caplog.at_level(logging.ERROR, logger=quiet.LLAMA_CPP_LOGGER):
        log(3, WARNING, None)  # GGML_LOG_LEVEL_WARN
        log(2, b"print_info: arch = gemma3\n", None)  # INFO
        log(5, b"continued\n", None)  # continues the INFO line: filtered too
        assert caplog.records == []
        log(4, b"llama_model_load: error loading model: tensor data is not within the file bounds\n", None)
        log(5, b"and its continuation\n", None)  # continues the ERROR line
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "llama_model_load: error loading model: tensor data is not within the file bounds"),
        (logging.ERROR, "and its continuation"),
    ]


def test_verbose_lets_every_level_through(caplog: pytest.LogCaptureFixture) -> None:
    log = quiet._LlamaCppLog()
    logger = logging.getLogger(quiet.LLAMA_CPP_LOGGER)
    level = logger.level
    try:
        logger.setLevel(logging.DEBUG)
        with caplog.at_level(logging.DEBUG, logger=quiet.LLAMA_CPP_LOGGER):
            log(3, WARNING, None)
        assert [r.levelno for r in caplog.records] == [logging.WARNING]
        assert "probably a bug in the model" in caplog.records[0].getMessage()
    finally:
        logger.setLevel(level)


def test_loading_the_embedded_gguf_prints_nothing(capfd: pytest.CaptureFixture[str]) -> None:
    """Through llama.cpp itself: our callback is installed and a load writes nothing to fd 2."""
    pytest.importorskip("llama_cpp")
    from logtoku_guard.backends.embedded import embedded_gguf_path
    from logtoku_guard.backends.llamacpp_model import LlamaModel, import_llama_cpp

    import_llama_cpp(False)
    capfd.readouterr()
    model = LlamaModel(embedded_gguf_path(), n_ctx=256, n_seq=1, n_threads=1)
    model.close()
    err = capfd.readouterr().err
    assert err == "", err
    assert quiet._LLAMA_CPP_LOG.c_callback is not None
