"""The bench command on tiny models and two prompts: finishes in seconds, checks outputs, writes JSON."""
from __future__ import annotations

import json

from mirror_core.cli import main


def test_bench_writes_a_report_with_equality_checks(pairs, tmp_path, capsys):
    target, draft = pairs["llama"]
    prompts = tmp_path / "question.jsonl"
    prompts.write_text('{"question_id": "q1", "category": "toy", "prompt_ids": [1, 2, 3]}\n'
                       '{"question_id": "q2", "category": "toy", "prompt_ids": [9, 8]}\n')
    out = tmp_path / "report.json"
    rc = main(["bench", "--target", target, "--draft", draft, "--prompts", str(prompts), "--max-new-tokens", "16",
               "--repeats", "2", "--lane", "inline", "--out", str(out)])
    assert rc == 0
    table = capsys.readouterr().out
    assert "mirror" in table and "speedup_vs_a" in table
    report = json.loads(out.read_text())
    assert {r["decoder"] for r in report["rows"]} == {"ar", "sd", "mirror"} and len(report["rows"]) == 6
    assert report["summary"]["mirror"]["all_equal_to_ar"] is True
    assert report["summary"]["sd"]["all_equal_to_ar"] is True
    assert report["summary"]["ar"]["speedup_vs_ar"] == 1.0


def test_bench_rejects_unknown_decoders(pairs, tmp_path, capsys):
    target, draft = pairs["llama"]
    prompts = tmp_path / "q.jsonl"
    prompts.write_text('{"question_id": "q1", "prompt_ids": [1]}\n')
    assert main(["bench", "--target", target, "--draft", draft, "--prompts", str(prompts),
                 "--decoders", "ar,eagle", "--lane", "inline"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown decoder")
