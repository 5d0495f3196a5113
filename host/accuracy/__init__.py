"""Accuracy of a GGUF model: perplexity on held-out text and multiple-choice benchmarks.

Every figure is computed from llama.cpp logits (llama-cpp-python, `logits_all`) and can be
cross-checked against llama.cpp's own evaluator, `llama-perplexity`, on the same model, data
and settings (`crosscheck`). Modules, one job each:

- `items`: benchmark records → `Item`s (context/continuation pairs with a gold index).
- `readers`: standard files (HF Arrow/Parquet/JSONL, llama.cpp task formats) → records/items.
- `subset`: deterministic seeded subsets.
- `stats`: Wilson intervals, composite accuracy, perplexity standard error.
- `scorer`: a loaded model that returns per-token log-probabilities.
- `perplexity`, `multiple_choice`: the two evaluations.
- `cache`: model sha256 and cached results.
- `crosscheck`: the same evaluations through `llama-perplexity`.
- `results`: the `epi-accuracy` results file (docs/formats.md §4).
- `evaluate`: runs everything for a list of models.
"""
