"""docs/gpu.md names the commit each GPU run's figures belong to and the later commits that changed
GPU code (recorded in benchmarks/gpu/results/since.json, checked against git history where the clone
has it); README says what checked the GPU numerics."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tessera.tools import gpu_doc

ROOT = Path(__file__).resolve().parent.parent


def _gpu_run(results: Path, name: str, commit: dict) -> None:
    d = results / name
    d.mkdir(parents=True)
    (d / "commit.json").write_text(json.dumps(commit))
    (d / "check.log").write_text("gemm 4096 f16: 700 TFLOP/s\n")


def test_gpu_doc_names_each_runs_commit_and_the_later_gpu_commits(tmp_path):
    _gpu_run(tmp_path, "h200-a", {"commit": "b" * 40, "recorded": True, "dirty": False})
    _gpu_run(tmp_path, "h200-b", {"commit": "c" * 40, "recorded": False})
    doc = gpu_doc.gpu_md(tmp_path)
    assert f"these figures belong to `{'b' * 12}` (recorded by the run)" in doc
    assert f"belong to `{'c' * 12}` (inferred, not recorded" in doc
    assert doc.count("Later commits that changed GPU code: not recorded") == 2
    (tmp_path / gpu_doc.SINCE).write_text(json.dumps(
        {"as_of": "d" * 40, "paths": [], "runs": {"h200-a": [["e" * 40, "NVIDIA: a change. More text"]],
                                                  "h200-b": []}}))
    doc = gpu_doc.gpu_md(tmp_path)
    assert f"GPU code changed after this run in 1 commits up to `{'d' * 12}`" in doc
    assert f"- `{'e' * 12}` NVIDIA: a change\n" in doc
    assert f"No commit changed GPU code between this run and `{'d' * 12}`." in doc


def _history(commit: str) -> bool:
    p = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return p.returncode == 0


def test_recorded_later_gpu_commits_match_git_history():
    """since.json's lists are git log over GPU_CODE from each run's commit to its as_of commit (checked
    where the clone has that history; a shallow one skips)."""
    since = json.loads((gpu_doc.RESULTS / gpu_doc.SINCE).read_text())
    if not _history(since["as_of"]):
        pytest.skip("this clone lacks the recorded commits' history")
    for run in gpu_doc.runs():
        commit = gpu_doc.run_commit(run)["commit"]
        if not _history(commit):
            pytest.skip("this clone lacks the runs' commits")
        assert since["runs"][run.name] == gpu_doc.commits_since(commit, since["as_of"])
    assert since["paths"] == list(gpu_doc.GPU_CODE)


def test_commits_since_has_teeth(monkeypatch):
    """A path list that misses GPU code (planted: no paths that exist) finds fewer commits."""
    run = gpu_doc.runs()[0]
    commit = gpu_doc.run_commit(run)["commit"]
    if not _history(commit):
        pytest.skip("this clone lacks the runs' commits")
    full = gpu_doc.commits_since(commit)
    assert full, "GPU code has changed since the first H200 run"
    monkeypatch.setattr(gpu_doc, "GPU_CODE", ("no/such/path",))
    assert gpu_doc.commits_since(commit) == []


def test_readme_says_what_checked_the_gpu_numerics():
    text = (ROOT / "README.md").read_text()
    assert "proven by" not in text
    commits = {gpu_doc.run_commit(r)["commit"][:7] for r in gpu_doc.runs()}
    named = set(re.findall(r"H200 at commit `([0-9a-f]{7,40})`", text))
    assert named and all(c[:7] in commits for c in named), (named, commits)
    assert "emulator written from the vendor documentation" in text


def test_since_applies_to_the_gpu_doc_only(capsys):
    from tessera.tools import cli
    assert cli.main(["docs", "errors", "--since"]) == 1
    assert "--since applies to `tessera docs gpu` only" in capsys.readouterr().err
