"""The official `openai` client against the real server: chat (plain and streamed),
completions with echo + logprobs, n = 3, stop strings, seeds, usage = tokenizer counts,
/v1/models."""

from __future__ import annotations

import requests

from conftest import tokenize

MAX_TOKENS = 16
QUESTION = [{"role": "user", "content": "What are the three primary colors?"}]


def test_models_lists_the_served_model(server, model_id):
    r = requests.get(server.url("/v1/models"), timeout=10)
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list"
    assert len(body["data"]) >= 1
    model = body["data"][0]
    assert model["object"] == "model"
    assert isinstance(model["id"], str) and model["id"]
    assert isinstance(model.get("created"), int)
    assert isinstance(model.get("owned_by"), str)


def test_health_and_ready(server):
    assert requests.get(server.url("/health"), timeout=10).status_code == 200
    assert requests.get(server.url("/ready"), timeout=10).status_code == 200


def test_plain_chat(openai_client, model_id, server):
    resp = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                 temperature=0)
    assert resp.object == "chat.completion"
    assert resp.id
    assert resp.model == model_id
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.index == 0
    assert choice.message.role == "assistant"
    assert isinstance(choice.message.content, str) and choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    # Usage equals the tokenizer's count of the rendered prompt.
    counted = tokenize(server, model_id, messages=QUESTION, add_generation_prompt=True)["count"]
    assert resp.usage.prompt_tokens == counted
    assert 1 <= resp.usage.completion_tokens <= MAX_TOKENS
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    if choice.finish_reason == "length":
        assert resp.usage.completion_tokens == MAX_TOKENS


def test_streamed_chat_matches_plain_chat(openai_client, model_id):
    plain = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                  temperature=0)
    stream = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                   temperature=0, stream=True,
                                                   stream_options={"include_usage": True})
    text, finish, usage, ids, roles = "", None, None, set(), []
    for chunk in stream:
        assert chunk.object == "chat.completion.chunk"
        ids.add(chunk.id)
        if chunk.usage is not None:
            usage = chunk.usage
            assert chunk.choices == []  # the usage chunk comes last, alone
            continue
        assert len(chunk.choices) == 1
        delta = chunk.choices[0].delta
        if delta.role:
            roles.append(delta.role)
        text += delta.content or ""
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert len(ids) == 1, "every chunk of one completion shares its id"
    assert roles[:1] == ["assistant"]
    assert text == plain.choices[0].message.content  # greedy: the same answer either way
    assert finish == plain.choices[0].finish_reason
    assert usage is not None, "stream_options.include_usage must add a usage chunk"
    assert usage.prompt_tokens == plain.usage.prompt_tokens
    assert usage.completion_tokens == plain.usage.completion_tokens


def test_chat_logprobs_count_the_completion_tokens(openai_client, model_id):
    resp = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, temperature=0,
                                                 logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    assert "".join(t.token for t in content) == resp.choices[0].message.content
    for t in content:
        assert t.logprob <= 0
        assert 1 <= len(t.top_logprobs) <= 3
        # Greedy: the chosen token is the most likely one.
        assert t.logprob >= max(alt.logprob for alt in t.top_logprobs) - 1e-4


def test_completion_echo_with_logprobs(openai_client, model_id, server):
    prompt = "The capital of France is"
    resp = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                            logprobs=2)
    assert resp.object == "text_completion"
    choice = resp.choices[0]
    assert choice.text.startswith(prompt)
    lp = choice.logprobs
    n_prompt = tokenize(server, model_id, prompt=prompt)["count"]
    assert resp.usage.prompt_tokens == n_prompt
    assert len(lp.tokens) == n_prompt + resp.usage.completion_tokens
    assert len(lp.token_logprobs) == len(lp.tokens) == len(lp.text_offset) == len(lp.top_logprobs)
    assert "".join(lp.tokens) == choice.text
    # The first prompt token has no logprob (nothing before it); every other one does.
    assert lp.token_logprobs[0] is None
    assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == sorted(lp.text_offset)
    assert lp.text_offset[0] == 0


def test_completion_accepts_token_ids_and_lists(openai_client, model_id, server):
    prompt = "Once upon a time"
    ids = tokenize(server, model_id, prompt=prompt)["tokens"]
    by_text = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=6, temperature=0)
    by_ids = openai_client.completions.create(model=model_id, prompt=ids, max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids)
    both = openai_client.completions.create(model=model_id, prompt=[prompt, "Hello"], max_tokens=3, temperature=0)
    assert sorted(c.index for c in both.choices) == [0, 1]


def test_n_3_gives_three_choices(openai_client, model_id):
    resp = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8, n=3,
                                                 temperature=1.0, seed=7, logprobs=True)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert resp.usage.completion_tokens == sum(len(c.logprobs.content) for c in resp.choices)
    # Three independent samples at temperature 1 are very unlikely to be all equal.
    assert len({c.message.content for c in resp.choices}) >= 2


def test_n_3_streamed(openai_client, model_id):
    stream = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=6, n=3,
                                                   temperature=1.0, seed=11, stream=True)
    finished = set()
    for chunk in stream:
        for c in chunk.choices:
            assert c.index in (0, 1, 2)
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1, 2}


def _spanning_stop_string(openai_client, model_id, prompt):
    """A greedy completion, and a stop string that spans two of its tokens (from its logprobs)."""
    resp = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            logprobs=0)
    tokens = resp.choices[0].logprobs.tokens
    text = resp.choices[0].text
    boundary = 0  # offset in text where token k + 1 starts
    for k in range(len(tokens) - 1):
        boundary += len(tokens[k])
        left, right = tokens[k], tokens[k + 1]
        if len(left) < 2 or not right:
            continue
        # The last two characters of token k and the first of token k + 1; usable when its
        # first occurrence is at this boundary, so the stop really straddles two tokens.
        stop = left[-2:] + right[:1]
        if boundary >= 4 and text.find(stop) == boundary - 2:
            return text, stop, boundary - 2
    raise AssertionError(f"no stop string straddling two tokens found in {tokens!r}")


def test_stop_string_spanning_tokens_is_not_leaked(openai_client, model_id):
    prompt = "List the days of the week: Monday, Tuesday,"
    text, stop, cut = _spanning_stop_string(openai_client, model_id, prompt)
    resp = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            stop=[stop])
    assert resp.choices[0].text == text[:cut]
    assert resp.choices[0].finish_reason == "stop"
    # Streamed: the same text, nothing of the stop string in any delta.
    stream = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                              stop=[stop], stream=True)
    streamed, finish = "", None
    for chunk in stream:
        for c in chunk.choices:
            streamed += c.text
            finish = c.finish_reason or finish
    assert streamed == text[:cut]
    assert stop not in streamed
    assert finish == "stop"


def test_chat_stop_string(openai_client, model_id):
    plain = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                  temperature=0).choices[0].message.content
    words = plain.split()
    assert len(words) >= 3, plain
    stop = words[2]
    cut = plain.find(stop)
    resp = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                 temperature=0, stop=stop)
    assert resp.choices[0].message.content == plain[:cut]
    assert resp.choices[0].finish_reason == "stop"


def test_seed_reproduces_sampled_output(openai_client, model_id):
    def sample(seed):
        return openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=MAX_TOKENS,
                                                     temperature=1.0, top_p=0.95, seed=seed).choices[0].message.content

    first = sample(1234)
    assert sample(1234) == first
    others = {sample(s) for s in (1, 2, 3)}
    assert others != {first}, "different seeds should not all give the same sample"


def test_completion_usage_equals_tokenizer_counts(openai_client, model_id, server):
    prompt = "Write a haiku about the sea."
    resp = openai_client.completions.create(model=model_id, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0,
                                            logprobs=0)
    assert resp.usage.prompt_tokens == tokenize(server, model_id, prompt=prompt)["count"]
    assert resp.usage.completion_tokens == len(resp.choices[0].logprobs.tokens)
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_detokenize_inverts_tokenize(server, model_id):
    text = "Hello, world! 123"
    ids = tokenize(server, model_id, prompt=text)["tokens"]
    r = requests.post(server.url("/detokenize"), json={"model": model_id, "tokens": ids}, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["prompt"].endswith(text)  # a BOS token, if the model adds one, may lead


def test_max_completion_tokens_is_honoured(openai_client, model_id):
    resp = openai_client.chat.completions.create(model=model_id, messages=QUESTION, max_completion_tokens=3,
                                                 temperature=0, extra_body={"ignore_eos": True})
    assert resp.usage.completion_tokens == 3
    assert resp.choices[0].finish_reason == "length"
