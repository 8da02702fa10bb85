// A chat message: folding streamed chunks into it (content, reasoning, tool calls, the error event)
// and the element that shows it. No I/O: the chat page and the tests use these alone.

import { el } from "./common.js";
import { renderMarkdown } from "./markdown.js";

// One message's element: its text as Markdown, reasoning folded, tool calls, an error.
export function messageNode(message) {
  const node = el("div", { class: `message ${message.role}`, "data-role": message.role },
    el("div", { class: "role" }, message.role));
  if (message.reasoning) {
    node.append(el("details", { class: "reasoning" }, el("summary", {}, "Reasoning"), el("div", {}, message.reasoning)));
  }
  const body = el("div", { class: "content" });
  body.append(message.role === "assistant" ? renderMarkdown(message.content || "") : message.content);
  node.append(body);
  for (const call of message.tool_calls ?? []) {
    node.append(el("div", { class: "tool-call" }, `${call.function.name}(${call.function.arguments})`));
  }
  if (message.error) node.append(el("div", { class: "error", role: "alert" }, message.error));
  if (message.stopped) node.append(el("div", { class: "role stopped" }, "stopped"));
  return node;
}

// Folds one streamed chunk into the answer being written.
export function absorb(answer, chunk) {
  if (chunk.error) {
    answer.error = chunk.error.message ?? JSON.stringify(chunk.error);
    return;
  }
  for (const choice of chunk.choices ?? []) {
    const delta = choice.delta ?? {};
    answer.content += delta.content ?? "";
    answer.reasoning += delta.reasoning_content ?? "";
    for (const call of delta.tool_calls ?? []) {
      const slot = (answer.tool_calls[call.index ?? 0] ??= { function: { name: "", arguments: "" } });
      slot.function.name += call.function?.name ?? "";
      slot.function.arguments += call.function?.arguments ?? "";
    }
  }
}

