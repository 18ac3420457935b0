"""/metrics under vLLM's names, read with prometheus_client's own parser, and counting
what the requests did."""

from __future__ import annotations

import time

import requests
from conftest import tokenize
from prometheus_client.parser import text_string_to_metric_families

# Family names as prometheus_client's parser reports them (counters lose "_total").
EXPECTED_TYPES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prefix_cache_queries": "counter",
    "vllm:prefix_cache_hits": "counter",
    "vllm:num_preemptions": "counter",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
    "vllm:request_queue_time_seconds": "histogram",
    "vllm:request_prefill_time_seconds": "histogram",
    "vllm:request_decode_time_seconds": "histogram",
    "vllm:request_prompt_tokens": "histogram",
    "vllm:request_generation_tokens": "histogram",
    "vllm:request_params_max_tokens": "histogram",
    "vllm:request_params_n": "histogram",
    "tessera:preemptions": "counter",
    "tessera:swap_fallbacks": "counter",
    "tessera:kv_swaps": "counter",
    "tessera:kv_swap_bytes": "counter",
    "tessera:kv_block_copies": "counter",
    "tessera:prefix_cache_evictions": "counter",
    "tessera:kv_leased_blocks": "gauge",
    "tessera:kv_leases": "counter",
    "tessera:kv_exported_blocks": "counter",
    "tessera:kv_import_reserved_blocks": "gauge",
    "tessera:kv_imports": "counter",
    "tessera:kv_imported_blocks": "counter",
}


def scrape(server, headers=None) -> dict:
    r = requests.get(server.url("/metrics"), headers=headers, timeout=10)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain"), r.headers["Content-Type"]
    return {f.name: f for f in text_string_to_metric_families(r.text)}


def sample_value(families: dict, family: str, sample: str, **labels) -> float:
    matches = [s.value for s in families[family].samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, f"{sample}{labels}: {len(matches)} samples"
    return matches[0]


def gauge(server, name: str) -> float:
    return sample_value(scrape(server), name, name)


def wait_idle(server, timeout_s: float = 15.0, headers=None) -> dict:
    """Polls until nothing runs, waits or holds KV; returns the last scrape."""
    deadline = time.monotonic() + timeout_s
    while True:
        families = scrape(server, headers)
        running = sample_value(families, "vllm:num_requests_running", "vllm:num_requests_running")
        waiting = sample_value(families, "vllm:num_requests_waiting", "vllm:num_requests_waiting")
        kv = sample_value(families, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc")
        if (running, waiting, kv) == (0, 0, 0) or time.monotonic() > deadline:
            return families
        time.sleep(0.1)


def test_every_vllm_family_is_exposed_with_its_type_and_labels(server, model_id):
    families = scrape(server)
    for name, kind in EXPECTED_TYPES.items():
        assert name in families, f"missing {name}"
        assert families[name].type == kind, f"{name}: {families[name].type} != {kind}"
        for s in families[name].samples:
            assert s.labels.get("model_name") == model_id, s
    reasons = {s.labels["finished_reason"] for s in families["vllm:request_success"].samples}
    assert {"stop", "length", "abort"} <= reasons


def test_counters_follow_a_known_request(server, model_id, openai_client):
    wait_idle(server)
    before = scrape(server)
    resp = openai_client.completions.create(model=model_id, prompt="Count: one, two, three,", max_tokens=5,
                                            temperature=0, extra_body={"ignore_eos": True})
    assert resp.choices[0].finish_reason == "length"
    after = wait_idle(server)

    def delta(family, sample, **labels):
        return sample_value(after, family, sample, **labels) - sample_value(before, family, sample, **labels)

    assert delta("vllm:request_success", "vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:request_success", "vllm:request_success_total", finished_reason="stop") == 0
    assert delta("vllm:prompt_tokens", "vllm:prompt_tokens_total") == resp.usage.prompt_tokens
    assert delta("vllm:generation_tokens", "vllm:generation_tokens_total") == resp.usage.completion_tokens
    assert delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count") == 1
    # Five tokens: four gaps between them.
    assert delta("vllm:inter_token_latency_seconds", "vllm:inter_token_latency_seconds_count") == 4
    assert delta("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_count") == 1
    assert delta("vllm:request_params_max_tokens", "vllm:request_params_max_tokens_bucket", le="5.0") == 1
    assert delta("vllm:request_prompt_tokens", "vllm:request_prompt_tokens_sum") == resp.usage.prompt_tokens
    ttft = delta("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum")
    e2e = delta("vllm:e2e_request_latency_seconds", "vllm:e2e_request_latency_seconds_sum")
    assert 0 < ttft <= e2e < 60


def test_token_counters_move_while_a_request_streams(server, model_id, openai_client):
    """vLLM counts prompt tokens when prefill completes and generation tokens every step, so a
    dashboard's rate() is right during a long request; the per-request histograms wait for its end."""
    wait_idle(server)
    prompt = "Write a long story about a lighthouse keeper."
    n_prompt = tokenize(server, model_id, prompt=prompt)["count"]
    before = scrape(server)

    def delta(families, family, sample):
        return sample_value(families, family, sample) - sample_value(before, family, sample)

    stream = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=400, temperature=0,
                                              stream=True, extra_body={"ignore_eos": True})
    chunks = iter(stream)
    for _ in range(2):
        next(chunks)
    during = scrape(server)
    assert sample_value(during, "vllm:num_requests_running", "vllm:num_requests_running") == 1
    assert delta(during, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == n_prompt
    generated = delta(during, "vllm:generation_tokens", "vllm:generation_tokens_total")
    assert generated >= 2
    count = "vllm:e2e_request_latency_seconds_count"
    assert delta(during, "vllm:e2e_request_latency_seconds", count) == 0  # histograms: at the end
    assert delta(during, "vllm:request_prompt_tokens", "vllm:request_prompt_tokens_count") == 0

    time.sleep(0.3)
    later = scrape(server)
    assert sample_value(later, "vllm:num_requests_running", "vllm:num_requests_running") == 1
    assert delta(later, "vllm:generation_tokens", "vllm:generation_tokens_total") > generated
    assert delta(later, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == n_prompt

    stream.close()  # the client goes: the request is aborted
    after = wait_idle(server)
    assert delta(after, "vllm:prompt_tokens", "vllm:prompt_tokens_total") == n_prompt  # not counted again
    assert delta(after, "vllm:e2e_request_latency_seconds", count) == 1


def test_idle_server_shows_no_work(server):
    families = wait_idle(server)
    assert sample_value(families, "vllm:num_requests_running", "vllm:num_requests_running") == 0
    assert sample_value(families, "vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_perc") == 0
