// The chat page: conversations kept in localStorage, answers streamed from /v1/chat/completions
// (Server-Sent Events over fetch) and rendered as Markdown; Stop aborts the fetch, and the server
// cancels a request whose client went away.

import { apiKey, el, errorText, headers, readEvents, setApiKey } from "./common.js";
import { absorb, messageNode } from "./messages.js";

const STORE = "llamactor.conversations";
const SETTINGS = "llamactor.chatSettings";
const $ = (id) => document.getElementById(id);

let conversations = JSON.parse(localStorage.getItem(STORE) || "[]");
let current = conversations[0] ?? newConversation();
let controller = null;

function newConversation() {
  const conversation = { id: crypto.randomUUID(), title: "New chat", messages: [] };
  conversations.unshift(conversation);
  return conversation;
}

function save() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  localStorage.setItem(SETTINGS, JSON.stringify({
    model: $("model").value, system: $("system").value,
    temperature: $("temperature").value, maxTokens: $("max-tokens").value,
  }));
}

function renderList() {
  $("conversations").replaceChildren(...conversations.map((c) => {
    const button = el("button", { type: "button" }, c.title);
    if (c === current) button.setAttribute("aria-current", "true");
    button.addEventListener("click", () => { current = c; renderAll(); });
    return el("li", {}, button);
  }));
}

function renderAll() {
  renderList();
  $("messages").replaceChildren(...current.messages.map(messageNode));
}

async function loadModels(saved) {
  $("settings-error").textContent = "";
  const response = await fetch("/v1/models", { headers: headers() });
  if (!response.ok) {
    $("settings-error").textContent = await errorText(response);
    return;
  }
  const { data } = await response.json();
  $("model").replaceChildren(...data.map((m) => el("option", { value: m.id }, m.id)));
  if (saved.model && data.some((m) => m.id === saved.model)) $("model").value = saved.model;
}

function requestBody() {
  const system = $("system").value.trim();
  const history = current.messages.filter((m) => !m.error || m.content)
    .map((m) => ({ role: m.role, content: m.content || "" }));
  const body = { model: $("model").value, stream: true, messages: system ? [{ role: "system", content: system }, ...history] : history };
  const temperature = parseFloat($("temperature").value);
  const maxTokens = parseInt($("max-tokens").value, 10);
  if (!Number.isNaN(temperature)) body.temperature = temperature;
  if (!Number.isNaN(maxTokens)) body.max_tokens = maxTokens;
  return body;
}

async function ask(text) {
  current.messages.push({ role: "user", content: text });
  if (current.title === "New chat") current.title = text.slice(0, 40);
  const body = requestBody();
  const answer = { role: "assistant", content: "", reasoning: "", tool_calls: [] };
  current.messages.push(answer);
  renderAll();
  let frame = 0;  // one redraw per animation frame, however many chunks arrive in it
  controller = new AbortController();
  setBusy(true);
  try {
    const response = await fetch("/v1/chat/completions", {
      method: "POST", headers: headers({ "Content-Type": "application/json" }),
      body: JSON.stringify(body), signal: controller.signal,
    });
    if (!response.ok) answer.error = await errorText(response);
    else {
      await readEvents(response, (data) => {
        if (data === "[DONE]") return;
        absorb(answer, JSON.parse(data));
        frame ||= requestAnimationFrame(() => { frame = 0; renderAll(); });
      });
    }
  } catch (error) {
    if (error.name === "AbortError") answer.stopped = true;
    else answer.error = String(error.message || error);
  } finally {
    cancelAnimationFrame(frame);
    controller = null;
    setBusy(false);
    save();
    renderAll();
    $("messages").lastElementChild?.setAttribute("data-done", "true");
  }
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.busy = busy ? "true" : "false";
}

function main() {
  const saved = JSON.parse(localStorage.getItem(SETTINGS) || "{}");
  if (saved.system) $("system").value = saved.system;
  if (saved.temperature) $("temperature").value = saved.temperature;
  if (saved.maxTokens) $("max-tokens").value = saved.maxTokens;
  $("api-key").value = apiKey();
  $("api-key").addEventListener("change", () => { setApiKey($("api-key").value.trim()); loadModels(saved); });
  for (const id of ["model", "system", "temperature", "max-tokens"]) $(id).addEventListener("change", save);
  $("new-chat").addEventListener("click", () => { current = newConversation(); save(); renderAll(); });
  $("stop").addEventListener("click", () => controller?.abort());
  $("composer").addEventListener("submit", (event) => {
    event.preventDefault();
    const text = $("prompt").value.trim();
    if (!text || controller) return;
    $("prompt").value = "";
    ask(text);
  });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); $("composer").requestSubmit(); }
  });
  renderAll();
  loadModels(saved);
}

main();
