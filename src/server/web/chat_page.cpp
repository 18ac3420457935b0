// The chat page as one raw string: no build step, no files to find at run time. It streams
// from /v1/chat/completions with fetch + ReadableStream, lists models from /v1/models and
// shows per-answer figures (TTFT, tok/s, tokens). Contract: docs/design/web-ui.md.
// Element ids (prompt, send, stop, model, ...) and data-stat attributes are what the browser
// tests drive; keep them stable.
#include "server/web/chat_page.h"

namespace tessera::web {
namespace {

constexpr std::string_view kChatPage = R"HTML(<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>tessera chat</title>
<link rel="icon" href="data:,">
<style>
  :root {
    --bg: #f6f7f9; --panel: #ffffff; --text: #1c1f24; --muted: #5b6370; --border: #d5d9e0;
    --accent: #2457c5; --accent-text: #ffffff; --user: #e7eefc; --assistant: #ffffff;
    --error-bg: #fdecec; --error-text: #8a1c1c; --focus: #f0a000;
  }
  @media (prefers-color-scheme: dark) {
    :root {
      --bg: #16181c; --panel: #1f2329; --text: #e6e8eb; --muted: #a3abb8; --border: #3a404a;
      --accent: #6d9cff; --accent-text: #0b0d10; --user: #23324f; --assistant: #1f2329;
      --error-bg: #4a1f1f; --error-text: #ffd0d0;
    }
  }
  * { box-sizing: border-box; }
  body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
         background: var(--bg); color: var(--text); }
  .skip { position: absolute; left: -999px; }
  .skip:focus { left: 8px; top: 8px; background: var(--panel); padding: 4px 8px; z-index: 2; }
  header { display: flex; align-items: baseline; gap: 12px; padding: 10px 18px;
           border-bottom: 1px solid var(--border); background: var(--panel); }
  header h1 { font-size: 18px; margin: 0; }
  header #conn { color: var(--muted); font-size: 13px; }
  .layout { display: grid; grid-template-columns: 290px 1fr; height: calc(100vh - 49px); }
  aside { border-right: 1px solid var(--border); padding: 14px 16px; overflow-y: auto; background: var(--panel); }
  aside h2 { font-size: 14px; text-transform: uppercase; letter-spacing: .04em; color: var(--muted); margin: 6px 0 10px; }
  .field { margin-bottom: 12px; }
  .field label { display: block; font-weight: 600; font-size: 13px; margin-bottom: 3px; }
  .field .hint { color: var(--muted); font-size: 12px; }
  input, select, textarea, button { font: inherit; color: inherit; }
  input[type=text], input[type=password], input[type=number], select, textarea {
    width: 100%; padding: 6px 8px; border: 1px solid var(--border); border-radius: 6px; background: var(--bg); }
  textarea { resize: vertical; }
  .row { display: flex; gap: 8px; align-items: center; }
  .row input[type=range] { flex: 1; }
  .row input[type=number] { width: 84px; }
  button { border: 1px solid var(--border); border-radius: 6px; padding: 7px 14px; background: var(--panel); cursor: pointer; }
  button.primary { background: var(--accent); color: var(--accent-text); border-color: var(--accent); font-weight: 600; }
  button:disabled { opacity: .5; cursor: not-allowed; }
  :focus-visible { outline: 3px solid var(--focus); outline-offset: 2px; }
  main { display: flex; flex-direction: column; min-height: 0; }
  #log { flex: 1; overflow-y: auto; padding: 18px; display: flex; flex-direction: column; gap: 12px; }
  .msg { max-width: 860px; width: 100%; border: 1px solid var(--border); border-radius: 10px; padding: 10px 14px; }
  .msg.user { background: var(--user); align-self: flex-end; }
  .msg.assistant { background: var(--assistant); }
  .msg .role { font-size: 12px; font-weight: 700; color: var(--muted); text-transform: uppercase; margin-bottom: 4px; }
  .msg .content { white-space: pre-wrap; overflow-wrap: anywhere; }
  .msg .content:empty::after { content: "…"; color: var(--muted); }
  .stats { display: flex; flex-wrap: wrap; gap: 14px; margin-top: 8px; font-size: 12px; color: var(--muted);
           font-variant-numeric: tabular-nums; }
  .stats b { color: var(--text); font-weight: 600; }
  .error { background: var(--error-bg); color: var(--error-text); border-radius: 6px; padding: 8px 10px; margin-top: 8px; }
  .empty { color: var(--muted); text-align: center; margin-top: 18vh; }
  form#composer { border-top: 1px solid var(--border); padding: 12px 18px; background: var(--panel);
                  display: flex; gap: 10px; align-items: flex-end; }
  form#composer textarea { flex: 1; min-height: 46px; max-height: 200px; }
  .sr-only { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0); white-space: nowrap; }
  @media (max-width: 760px) {
    .layout { grid-template-columns: 1fr; height: auto; }
    aside { border-right: none; border-bottom: 1px solid var(--border); }
    #log { min-height: 50vh; }
  }
</style>
</head>
<body>
<a class="skip" href="#prompt">Skip to message box</a>
<header>
  <h1>tessera</h1>
  <span id="conn" role="status" aria-live="polite">connecting…</span>
</header>
<div class="layout">
  <aside aria-labelledby="settings-title">
    <h2 id="settings-title">Settings</h2>
    <div class="field">
      <label for="model">Model</label>
      <select id="model" aria-describedby="model-hint"></select>
      <div class="hint" id="model-hint">From <code>/v1/models</code>.</div>
    </div>
    <div class="field">
      <label for="system">System prompt</label>
      <textarea id="system" rows="3" placeholder="Optional"></textarea>
    </div>
    <div class="field">
      <label for="temperature">Temperature</label>
      <div class="row">
        <input type="range" id="temperature-range" min="0" max="2" step="0.05" value="0.7" aria-hidden="true" tabindex="-1">
        <input type="number" id="temperature" min="0" max="2" step="0.05" value="0.7">
      </div>
    </div>
    <div class="field">
      <label for="top_p">Top p</label>
      <div class="row">
        <input type="range" id="top_p-range" min="0.01" max="1" step="0.01" value="1" aria-hidden="true" tabindex="-1">
        <input type="number" id="top_p" min="0.01" max="1" step="0.01" value="1">
      </div>
    </div>
    <div class="field">
      <label for="max_tokens">Max tokens</label>
      <input type="number" id="max_tokens" min="1" step="1" value="256">
    </div>
    <div class="field">
      <label for="seed">Seed</label>
      <input type="number" id="seed" step="1" placeholder="random" aria-describedby="seed-hint">
      <div class="hint" id="seed-hint">Same seed, same settings: same answer.</div>
    </div>
    <div class="field">
      <label for="api_key">API key</label>
      <input type="password" id="api_key" autocomplete="off" placeholder="none" aria-describedby="key-hint">
      <div class="hint" id="key-hint">Kept in this browser's localStorage only.</div>
    </div>
    <button type="button" id="clear">Clear conversation</button>
  </aside>
  <main id="main">
    <div id="log" role="log" aria-live="polite" aria-label="Conversation">
      <p class="empty" id="empty">Ask something to start.</p>
    </div>
    <form id="composer">
      <label for="prompt" class="sr-only">Message</label>
      <textarea id="prompt" rows="2" placeholder="Message (Enter to send, Shift+Enter for a new line)" required></textarea>
      <button type="submit" id="send" class="primary">Send</button>
      <button type="button" id="stop" disabled>Stop</button>
    </form>
  </main>
</div>
<script>
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const store = window.localStorage;
  const history = [];        // [{role, content}] of finished turns
  let controller = null;     // AbortController of the answer in flight

  // Settings persist across reloads; the API key only in localStorage, never in the URL.
  const persisted = ["system", "temperature", "top_p", "max_tokens", "seed", "api_key"];
  for (const id of persisted) {
    const saved = store.getItem("tessera." + id);
    if (saved !== null) $(id).value = saved;
    $(id).addEventListener("change", () => store.setItem("tessera." + id, $(id).value));
  }
  for (const id of ["temperature", "top_p"]) {
    const range = $(id + "-range");
    range.value = $(id).value;
    range.addEventListener("input", () => { $(id).value = range.value; store.setItem("tessera." + id, range.value); });
    $(id).addEventListener("input", () => { range.value = $(id).value; });
  }

  function headers() {
    const h = { "Content-Type": "application/json" };
    const key = $("api_key").value.trim();
    if (key) h["Authorization"] = "Bearer " + key;
    return h;
  }

  // An OpenAI error body {"error": {"message", "type", "param", "code"}} as one line.
  function describeError(status, body) {
    const e = body && typeof body === "object" && body.error ? body.error : null;
    if (!e) return (status ? "HTTP " + status + ": " : "") + (typeof body === "string" && body ? body : "request failed");
    let text = (status ? status + " " : "") + (e.type || "error");
    if (e.param) text += " (" + e.param + ")";
    return text + ": " + (e.message || "");
  }

  async function readError(response) {
    const text = await response.text();
    try { return describeError(response.status, JSON.parse(text)); }
    catch (_) { return describeError(response.status, text); }
  }

  async function loadModels() {
    const select = $("model");
    const previous = select.value || store.getItem("tessera.model");
    try {
      const r = await fetch("/v1/models", { headers: headers() });
      if (!r.ok) { $("conn").textContent = "models: " + await readError(r); return; }
      const body = await r.json();
      select.textContent = "";
      for (const m of body.data || []) {
        const option = document.createElement("option");
        option.value = option.textContent = m.id;
        select.appendChild(option);
      }
      if (previous && [...select.options].some((o) => o.value === previous)) select.value = previous;
      $("conn").textContent = select.options.length ? "ready" : "no models";
    } catch (err) {
      $("conn").textContent = "server unreachable: " + err.message;
    }
  }
  $("model").addEventListener("change", () => store.setItem("tessera.model", $("model").value));
  $("api_key").addEventListener("change", loadModels);

  function addMessage(role, text) {
    const empty = $("empty");
    if (empty) empty.remove();
    const box = document.createElement("div");
    box.className = "msg " + role;
    const label = document.createElement("div");
    label.className = "role";
    label.textContent = role === "user" ? "You" : "Assistant";
    const content = document.createElement("div");
    content.className = "content";
    content.textContent = text;
    box.append(label, content);
    $("log").appendChild(box);
    box.scrollIntoView({ block: "end" });
    return box;
  }

  function addStats(box) {
    const stats = document.createElement("div");
    stats.className = "stats";
    stats.setAttribute("aria-label", "Answer figures");
    for (const [key, name] of [["ttft", "TTFT"], ["tps", "tok/s"], ["tokens", "tokens"], ["finish", "finish"]]) {
      const item = document.createElement("span");
      item.append(name + " ");
      const value = document.createElement("b");
      value.dataset.stat = key;
      value.textContent = "–";
      item.appendChild(value);
      stats.appendChild(item);
    }
    box.appendChild(stats);
    return (key, text) => { stats.querySelector('[data-stat="' + key + '"]').textContent = text; };
  }

  function showError(box, text) {
    const div = document.createElement("div");
    div.className = "error";
    div.setAttribute("role", "alert");
    div.textContent = text;
    box.appendChild(div);
  }

  function numberOrNull(id) {
    const v = $(id).value.trim();
    return v === "" ? null : Number(v);
  }

  function buildRequest(messages) {
    const body = { model: $("model").value || undefined, messages, stream: true,
                   stream_options: { include_usage: true } };
    for (const [id, integer] of [["temperature", false], ["top_p", false], ["max_tokens", true], ["seed", true]]) {
      const v = numberOrNull(id);
      if (v !== null) body[id] = integer ? Math.trunc(v) : v;
    }
    return body;
  }

  // Splits an SSE byte stream into the data payloads of its events.
  async function* sseData(reader) {
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data:"))
                          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  }

  function setBusy(busy) {
    $("send").disabled = busy;
    $("stop").disabled = !busy;
  }

  async function send(text) {
    const messages = [];
    const system = $("system").value.trim();
    if (system) messages.push({ role: "system", content: system });
    messages.push(...history, { role: "user", content: text });
    addMessage("user", text);
    const box = addMessage("assistant", "");
    const content = box.querySelector(".content");
    const setStat = addStats(box);

    controller = new AbortController();
    setBusy(true);
    const started = performance.now();
    let firstAt = null, lastAt = null, chunks = 0, usageTokens = null, finish = null, answer = "";
    const figures = () => {
      const tokens = usageTokens !== null ? usageTokens : chunks;
      setStat("tokens", String(tokens));
      if (firstAt === null) return;
      // Decode speed after the first token; with one token, over the whole answer.
      const rate = tokens > 1 && lastAt > firstAt ? (tokens - 1) / ((lastAt - firstAt) / 1000)
                                                  : tokens / ((lastAt - started) / 1000);
      setStat("tps", isFinite(rate) ? rate.toFixed(1) : "–");
    };
    try {
      const response = await fetch("/v1/chat/completions", { method: "POST", headers: headers(),
        body: JSON.stringify(buildRequest(messages)), signal: controller.signal });
      if (!response.ok) { showError(box, await readError(response)); return; }
      for await (const data of sseData(response.body.getReader())) {
        if (data === "[DONE]") break;
        const chunk = JSON.parse(data);
        if (chunk.error) { showError(box, describeError(null, chunk)); break; }
        if (chunk.usage) usageTokens = chunk.usage.completion_tokens;
        const choice = (chunk.choices || [])[0];
        if (choice) {
          const delta = (choice.delta && choice.delta.content) || "";
          if (delta) {
            const now = performance.now();
            if (firstAt === null) {
              firstAt = now;
              setStat("ttft", ((firstAt - started) / 1000).toFixed(3) + " s");
            }
            lastAt = now;
            ++chunks;
            answer += delta;
            content.textContent = answer;
            box.scrollIntoView({ block: "end" });
          }
          if (choice.finish_reason) finish = choice.finish_reason;
        }
        figures();
      }
      if (finish) setStat("finish", finish);
      history.push({ role: "user", content: text }, { role: "assistant", content: answer });
    } catch (err) {
      if (err.name === "AbortError") {
        setStat("finish", "stopped");
        if (answer) history.push({ role: "user", content: text }, { role: "assistant", content: answer });
      } else {
        showError(box, "connection: " + err.message);
      }
    } finally {
      figures();
      controller = null;
      setBusy(false);
      $("prompt").focus();
    }
  }

  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    send(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $("composer").requestSubmit();
    }
  });
  $("stop").addEventListener("click", () => { if (controller) controller.abort(); });
  $("clear").addEventListener("click", () => {
    if (controller) controller.abort();
    history.length = 0;
    $("log").innerHTML = '<p class="empty" id="empty">Ask something to start.</p>';
  });

  loadModels();
})();
</script>
</body>
</html>
)HTML";

}  // namespace

std::string_view chat_page_html() { return kChatPage; }

}  // namespace tessera::web
