#!/usr/bin/env python3
"""Writes the small seed corpora of tests/fuzz/corpus/ (run once; the outputs are committed)."""
import json
import struct
from pathlib import Path

HERE = Path(__file__).resolve().parent
C = HERE / "corpus"


def gguf(kv, tensors, version=3):
    """A GGUF image: kv is [(key, type, payload bytes)], tensors [(name, dims, ggml type, data)]."""
    def s(x):
        b = x.encode()
        return struct.pack("<Q", len(b)) + b
    out = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
    for key, t, payload in kv:
        out += s(key) + struct.pack("<I", t) + payload
    offset = 0
    for name, dims, gtype, data in tensors:
        out += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        out += struct.pack("<IQ", gtype, offset)
        offset += (len(data) + 31) // 32 * 32
    out += b"\0" * (-len(out) % 32)
    for _, _, _, data in tensors:
        out += data + b"\0" * (-len(data) % 32)
    return out


def gstr(x):
    b = x.encode()
    return struct.pack("<Q", len(b)) + b


def write(target, name, data):
    (C / target / name).write_bytes(data if isinstance(data, bytes) else data.encode())


write("gguf_reader", "minimal.gguf", gguf([("general.architecture", 8, gstr("llama"))], []))
write("gguf_reader", "tensors.gguf", gguf(
    [("general.architecture", 8, gstr("llama")), ("general.alignment", 4, struct.pack("<I", 32)),
     ("llama.context_length", 4, struct.pack("<I", 128)), ("x.f", 6, struct.pack("<f", 1.5))],
    [("a", [4], 0, struct.pack("<4f", 1, 2, 3, 4)), ("b", [2, 2], 1, b"\0" * 8)]))
write("gguf_reader", "tokenizer.gguf", gguf(
    [("tokenizer.ggml.model", 8, gstr("gpt2")),
     ("tokenizer.ggml.tokens", 9, struct.pack("<IQ", 8, 3) + gstr("a") + gstr("b") + gstr("ab")),
     ("tokenizer.ggml.scores", 9, struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0, 0, 1)),
     ("tokenizer.ggml.token_type", 9, struct.pack("<IQ", 5, 3) + struct.pack("<3i", 1, 1, 1)),
     ("tokenizer.ggml.merges", 9, struct.pack("<IQ", 8, 1) + gstr("a b")),
     ("tokenizer.ggml.bos_token_id", 4, struct.pack("<I", 0)),
     ("flag", 7, b"\x01"), ("big", 10, struct.pack("<Q", 1 << 40)), ("neg", 11, struct.pack("<q", -5)),
     ("d", 12, struct.pack("<d", 2.5))], [], version=2))


def safetensors(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


write("safetensors_header", "one.safetensors",
      safetensors({"w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 16))
write("safetensors_header", "meta.safetensors", safetensors(
    {"__metadata__": {"format": "pt"}, "a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 6]},
     "b": {"dtype": "BF16", "shape": [], "data_offsets": [6, 8]},
     "c": {"dtype": "I8", "shape": [0], "data_offsets": [8, 8]}}, b"\1" * 8))

write("http_request", "get.http", "GET /health?x=1 HTTP/1.1\r\nHost: a\r\n\r\n")
write("http_request", "post.http",
      "POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\nContent-Type: application/json\r\n\r\n"
      '{"prompt":1}\n')
write("http_request", "chunked.http",
      "POST /stream HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
      "5\r\nhello\r\n3;ext=1\r\nabc\r\n0\r\nTrailer: x\r\n\r\n")
write("http_request", "pipelined.http",
      "GET /a HTTP/1.1\r\nHost: a\r\n\r\nHEAD /b HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
      "GET /c HTTP/1.0\r\n\r\n")
write("http_request", "deny.http", "POST /deny HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nbody")

write("request_params", "completion.json", json.dumps(
    {"model": "fuzz-model", "prompt": "Hello", "max_tokens": 8, "n": 2, "temperature": 0.7, "top_p": 0.9,
     "stop": ["\n", "END"], "seed": 3, "logprobs": 2, "echo": True, "logit_bias": {"42": -100}}))
write("request_params", "tokens.json", json.dumps({"prompt": [[1, 2, 3], [4, 5]], "max_tokens": 4}))
write("request_params", "chat.json", json.dumps(
    {"model": "fuzz-model", "stream": True, "stream_options": {"include_usage": True},
     "messages": [{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
     "max_completion_tokens": 16, "top_logprobs": 3, "logprobs": True, "frequency_penalty": 0.5}))

for name in ["smollm2-instruct.jinja", "qwen2.5-instruct.jinja", "llama3.2-instruct.jinja", "gemma3-it.jinja"]:
    write("jinja_template", name, (HERE.parents[0] / "fixtures" / "templates" / name).read_text())
write("jinja_template", "features.jinja",
      "{% macro m(x, y=2) %}{{ x ~ y }}{% endmacro %}{% set ns = namespace(c=0) %}"
      "{% for msg in messages if msg.role != 'tool' %}{% set ns.c = ns.c + 1 %}{{ m(loop.index) }}"
      "{{ msg.content | string | upper | replace('A', 'b') | trim }}{% if loop.last %}!{% endif %}{% endfor %}"
      "{{ tools | tojson }}{{ range(3) | list | join(',') }}{{ {'a': 1}.items() | list }}{{ ns.c }}"
      "{{ 'x'[::-1] }}{{ 7 // 2 }}{{ 2 ** 3 }}{% raw %}{{ raw }}{% endraw %}{{ raise_exception('no') if n > 5 }}")

write("tokenizer_roundtrip", "plain.txt", "\x00Hello world, this is a test.")
write("tokenizer_roundtrip", "unicode.txt", "\x01  café 中文 🤖 \t\n  naïve   ")
write("tokenizer_roundtrip", "special.txt", "\x06<|im_start|>user\nhi<|im_end|><bos><start_of_turn>")
write("tokenizer_roundtrip", "code.txt", "\x00def f(x):\n    return x**2  # 12345 678\r\n")
write("tokenizer_roundtrip", "ids.bin", b"\x08" + bytes(range(64)))
