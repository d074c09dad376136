"""`python -m mirror_core bench`: harness.py runs prompts × decoders × settings through the public API,
peers.py runs transformers' generate and assisted generation, report.py summarises (JSON, CSV, table) and
html_report.py renders the self-contained HTML report (the engine package's only plotly user)."""
