"""Bad command lines get a clear error naming what is wrong, before any model is loaded."""

from __future__ import annotations

import subprocess

import pytest

from conftest import model_path, tessera_binary


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tessera_binary()), *args], capture_output=True, text=True, timeout=60)


def test_turbo_calibration_off_the_cpu_is_refused_up_front(tmp_path):
    # The key equalization needs the queries, which only the CPU backend shows: refused before
    # the model loads (a CUDA-less build or machine would otherwise fail on the device first).
    out = run_cli("calibrate-kv", "-m", str(model_path()), "-f", __file__, "--format", "turbo3.5",
                  "--device", "cuda", "-o", str(tmp_path / "scales.json"))
    assert out.returncode != 0
    assert "only the CPU backend shows; use --device cpu" in out.stderr
    assert not (tmp_path / "scales.json").exists()


@pytest.mark.parametrize("value", ["1,8x", "", "1,,2", "0"])
def test_bench_integer_lists_are_parsed_whole(value):
    out = run_cli("bench", "verify", "-m", "dummy:llama3-tiny", "--batches", value, "--ks", "0", "-r", "1",
                  "-d", "8")
    assert out.returncode != 0
    assert "--batches" in out.stderr


def test_router_policy_takes_only_its_values():
    workers = ("--prefill", "http://127.0.0.1:1", "--decode", "http://127.0.0.1:2")
    out = run_cli("serve", "--role", "router", *workers, "--router-policy", "least-busy")
    assert out.returncode != 0
    assert "--router-policy" in out.stderr and "least-busy" in out.stderr, out.stderr
    assert "load" in out.stderr and "round-robin" in out.stderr, out.stderr  # the values it takes
    # A worker has no router policy.
    out = run_cli("serve", "--model", str(model_path()), "--role", "decode", "--router-policy", "load")
    assert out.returncode != 0
    assert "--router-policy is for --role router, not --role decode" in out.stderr, out.stderr


def test_kv_transfer_secret_file_is_for_the_worker_roles_and_must_hold_a_secret(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123\n")
    out = run_cli("serve", "--model", str(model_path()), "--kv-transfer-secret-file", str(secret))
    assert out.returncode != 0
    assert "--kv-transfer-secret-file is for --role prefill and --role decode, not --role colocated" in out.stderr, \
        out.stderr
    short = tmp_path / "short"
    short.write_text("too-short\n")
    out = run_cli("serve", "--model", str(model_path()), "--role", "decode", "--port", "0",
                  "--kv-transfer-secret-file", str(short))
    assert out.returncode != 0
    assert f"--kv-transfer-secret-file: '{short}' holds 9 bytes" in out.stderr, out.stderr
