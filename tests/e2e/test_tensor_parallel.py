"""`tessera generate` with tensor and pipeline parallelism on the CPU (ranks as threads, docs/design/parallel.md):
SmolLM2-135M's 9 heads and 3 KV heads split over 3 ranks (2 ranks are refused by name); its 30 layers
in 2 pipeline stages give the text of one rank; both together (3 ranks in each of 2 stages) run too."""

from __future__ import annotations

import subprocess

from conftest import model_path, tessera_binary


def generate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tessera_binary()), "generate", "-m", str(model_path()), "-p", "The capital of France is",
                           "-n", "6", "--temperature", "0", "--max-model-len", "64", "--kv-cache-memory", "16M", "--ignore-eos",
                           *args], capture_output=True, text=True, timeout=120)


def test_generate_runs_on_three_ranks():
    out = generate("-tp", "3")
    assert out.returncode == 0, out.stderr
    assert "3 tensor-parallel ranks (in-process group)" in out.stderr
    assert out.stdout.strip(), "no text generated"
    assert "then 5 tokens" in out.stderr  # six tokens: the first, then five


def test_a_size_the_heads_do_not_split_over_is_refused():
    out = generate("--tensor-parallel-size", "2")
    assert out.returncode == 1
    assert "--tensor-parallel-size 2 with" in out.stderr
    assert "9 attention heads do not split over 2 ranks" in out.stderr


def test_pipeline_stages_give_the_single_ranks_text():
    one = generate("--engine")
    two = generate("-pp", "2")
    assert one.returncode == 0, one.stderr
    assert two.returncode == 0, two.stderr
    assert "2 pipeline stages (layers 0-14 | 15-29; in-process group)" in two.stderr
    assert two.stdout == one.stdout


def test_tensor_and_pipeline_together_run_six_ranks():
    out = generate("-tp", "3", "--pipeline-parallel-size", "2")
    assert out.returncode == 0, out.stderr
    assert "2 pipeline stages (layers 0-14 | 15-29; in-process group) of 3 tensor-parallel ranks" in out.stderr
    assert out.stdout.strip(), "no text generated"
    assert "then 5 tokens" in out.stderr
