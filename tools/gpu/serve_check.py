"""Checks one chat completion and one streamed completion against a running tessera server.

usage: serve_check.py BASE_URL OUTDIR   (standard library only: runs on the GPU machine)
Usage counts are checked against the server's own /tokenize (the same tokenization the
generation endpoints use), and completion_tokens against max_tokens and finish_reason.
"""
import json
import sys
import urllib.request

base, outdir = sys.argv[1], sys.argv[2]
problems = []


def post(path, body):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return r.read().decode()


def check(cond, what):
    if not cond:
        problems.append(what)


with urllib.request.urlopen(base + "/v1/models", timeout=10) as r:
    model = json.loads(r.read())["data"][0]["id"]

# Chat completion, greedy.
messages = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
raw = post("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 40, "temperature": 0})
open(f"{outdir}/serve-chat.json", "w").write(raw)
chat = json.loads(raw)
choice = chat["choices"][0]
content = choice["message"]["content"]
usage = chat["usage"]
n_prompt_chat = json.loads(post("/tokenize", {"model": model, "messages": messages}))["count"]
check(chat["object"] == "chat.completion", "chat: object")
check(choice["message"]["role"] == "assistant", "chat: role")
check(isinstance(content, str) and content.strip() != "", "chat: empty content")
check(choice["finish_reason"] in ("stop", "length"), f"chat: finish_reason {choice['finish_reason']}")
check(usage["prompt_tokens"] == n_prompt_chat, f"chat: prompt_tokens {usage['prompt_tokens']} != /tokenize {n_prompt_chat}")
check(1 <= usage["completion_tokens"] <= 40, f"chat: completion_tokens {usage['completion_tokens']}")
check(choice["finish_reason"] != "length" or usage["completion_tokens"] == 40, "chat: length finish below max_tokens")
check(usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"], "chat: total_tokens")
print(f"serve-check chat: {content!r} finish={choice['finish_reason']} usage={usage}")

# Streamed completion, greedy, with the usage chunk.
prompt = "The three primary colors are"
raw = post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0, "stream": True,
                               "stream_options": {"include_usage": True}})
open(f"{outdir}/serve-stream.txt", "w").write(raw)
events = [line[len("data: "):] for line in raw.splitlines() if line.startswith("data: ")]
check(len(events) >= 3 and events[-1] == "[DONE]", "stream: does not end with [DONE]")
chunks = [json.loads(e) for e in events if e != "[DONE]"]
text = "".join(c["choices"][0].get("text", "") for c in chunks if c.get("choices"))
finishes = [c["choices"][0].get("finish_reason") for c in chunks if c.get("choices")]
finish = next((f for f in finishes if f), None)
usage_chunks = [c for c in chunks if c.get("usage")]
n_prompt = json.loads(post("/tokenize", {"model": model, "prompt": prompt}))["count"]
check(text.strip() != "", "stream: no text")
check(finish in ("stop", "length"), f"stream: finish_reason {finish}")
check(len(usage_chunks) == 1, f"stream: {len(usage_chunks)} usage chunks")
if usage_chunks:
    u = usage_chunks[0]["usage"]
    check(u["prompt_tokens"] == n_prompt, f"stream: prompt_tokens {u['prompt_tokens']} != /tokenize {n_prompt}")
    check(1 <= u["completion_tokens"] <= 24, f"stream: completion_tokens {u['completion_tokens']}")
    check(finish != "length" or u["completion_tokens"] == 24, "stream: length finish below max_tokens")
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "stream: total_tokens")
    print(f"serve-check stream: {len(chunks)} chunks, {text!r} finish={finish} usage={u}")

# The same prompt not streamed must give the same greedy text.
plain = json.loads(post("/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 24, "temperature": 0}))
check(plain["choices"][0]["text"] == text, "stream and non-stream greedy texts differ")

for p in problems:
    print("serve-check PROBLEM:", p)
sys.exit(1 if problems else 0)
