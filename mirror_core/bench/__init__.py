"""`python -m mirror_core bench`, through the engine's public API. Imports go one way:

harness.py       prompts × decoders × settings → one BenchRow each (peers.py: transformers' generate and
                 assisted generation)
rows.py          BenchRow (the JSON/CSV row), derive (speedups, bounds, equality to ar), entries, baseline
summary.py       rows → SummaryEntry per decoder → BenchReport (the "mirror-sd-bench/6" JSON)
report.py        BenchReport → console table, JSON, CSV, and HTML via html_report.py (the engine package's only
                 plotly user)
"""
