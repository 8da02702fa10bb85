// What both pages share: the API key kept in this browser, headers, the server's error words,
// and a reader of Server-Sent Events over fetch (EventSource cannot send an Authorization header).

const KEY = "llamactor.apiKey";

export function apiKey() {
  return localStorage.getItem(KEY) || "";
}

export function setApiKey(value) {
  if (value) localStorage.setItem(KEY, value);
  else localStorage.removeItem(KEY);
}

export function headers(extra = {}) {
  const key = apiKey();
  return key ? { ...extra, Authorization: `Bearer ${key}` } : { ...extra };
}

// The message a server error body carries, in any of the dialects' shapes, else the status line.
export async function errorText(response) {
  const text = await response.text();
  try {
    const body = JSON.parse(text);
    const error = body.error ?? body.detail ?? body;
    if (typeof error === "string") return error;
    if (error && typeof error.message === "string") return error.message;
  } catch (_) { /* not JSON: the text itself */ }
  return text || `${response.status} ${response.statusText}`;
}

// Calls onData(string) for every `data:` event of a text/event-stream response body, until it ends.
export async function readEvents(response, onData) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart());
      if (data.length) onData(data.join("\n"));
    }
  }
}

// A DOM element with text content (never HTML) and attributes.
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, value);
  for (const child of children) node.append(child);
  return node;
}
