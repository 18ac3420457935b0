"""Bad command lines get a clear error naming what is wrong, before any model is loaded."""

from __future__ import annotations

import json
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


def _centering_file(path, layers=30, row=192, rot=64):
    # A calibration file of SmolLM2-135M's shape holding every key centering: static, position-
    # aware ("k_rope") and the first key's center ("k_first").
    rows = lambda v: [[v] * row for _ in range(layers)]
    path.write_text(json.dumps({
        "version": 2, "k_scales": [], "v_scales": [], "k_mean": rows(0.0), "k_equal": rows(1.0),
        "k_first": rows(0.5),
        "k_rope": {"rot_dim": rot, "neox": False, "inv_freq": [[1.0] * (rot // 2)] * layers, "mean": rows(0.0),
                   "equal": rows(1.0)}}))
    return path


def test_centering_by_position_off_the_cpu_falls_back_to_the_static_pair(tmp_path):
    # Only the CPU backend reads "k_rope" / "k_first" from the command line: another device is
    # told, up front, that the file's static centering is used instead (then fails here on its
    # device, if it has none).
    scales = _centering_file(tmp_path / "scales.json")
    args = ("generate", "-m", str(model_path()), "-p", "Hello", "-n", "1", "--kv-cache-dtype", "turbo3.5",
            "--kv-scales", str(scales))
    out = run_cli(*args, "--device", "cuda")
    assert "--device cuda does not read position-aware key centering" in out.stderr, out.stderr
    assert "static k_mean / k_equal" in out.stderr, out.stderr
    out = run_cli(*args, "--device", "cpu", "-t", "2")
    assert out.returncode == 0, out.stderr
    assert "does not read" not in out.stderr, out.stderr
