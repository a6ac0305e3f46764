"""Score an answer token by token, then stream another with each token's AU/EU as it arrives.

Run: .venv/bin/python examples/score_and_stream.py ["your question"]
"""

from __future__ import annotations

import sys

from logtoku_guard import DecodingOptions, QuadrantThresholds, TransformersBackend


def main(question: str) -> None:
    backend = TransformersBackend()  # the embedded SmolLM2-135M-Instruct
    generation = backend.generate(question, DecodingOptions(max_new_tokens=48))
    print(f"answer: {generation.text!r}")
    print(f"response reliability (higher = more reliable): {generation.score.reliability:.4f}")
    thresholds = QuadrantThresholds.from_quantile([t.au for t in generation.tokens], [t.eu for t in generation.tokens])
    for word in generation.words():
        print(f"  {word.text:<20} AU={word.au:.3f} EU={word.eu:.3f} quadrant={thresholds.classify(word.au, word.eu).value}")

    print("streaming an invented-entity question:")
    with backend.stream("Who founded the Zarnovian Institute of Quantum Botany?", DecodingOptions(max_new_tokens=32)) as stream:
        for token in stream:
            print(f"  {token.text!r:<16} EU={token.eu:.3f}")
    print(f"reliability: {stream.generation.score.reliability:.4f} ({stream.generation.finish_reason})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "What is the capital of France?")
