// A small, safe Markdown renderer: it builds DOM nodes and sets only text, never HTML, so whatever
// a model writes shows as text. Fenced code, headings, lists, quotes, paragraphs; inline code,
// bold, italics, and http(s) links.

import { el } from "./common.js";

const INLINE = /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\n]+\*|_[^_\n]+_)|(\[[^\]\n]+\]\(https?:\/\/[^)\s]+\))/;

export function inline(text) {
  const parts = [];
  let rest = text;
  let found;
  while ((found = INLINE.exec(rest)) !== null) {
    if (found.index > 0) parts.push(rest.slice(0, found.index));
    const [token] = found;
    if (found[1]) parts.push(el("code", {}, token.slice(1, -1)));
    else if (found[2]) parts.push(el("strong", {}, ...inline(token.slice(2, -2))));
    else if (found[3]) parts.push(el("em", {}, ...inline(token.slice(1, -1))));
    else {
      const close = token.indexOf("](");
      parts.push(el("a", { href: token.slice(close + 2, -1), rel: "noopener noreferrer", target: "_blank" },
        token.slice(1, close)));
    }
    rest = rest.slice(found.index + token.length);
  }
  if (rest) parts.push(rest);
  return parts;
}

function listItem(line) {
  const m = /^\s*(?:([-*+])|(\d+)[.)])\s+(.*)$/.exec(line);
  return m ? { ordered: !m[1], text: m[3] } : null;
}

export function renderMarkdown(source) {
  const out = document.createDocumentFragment();
  const lines = source.replace(/\r\n/g, "\n").split("\n");
  let paragraph = [];
  const flush = () => {
    if (paragraph.length) out.append(el("p", {}, ...inline(paragraph.join(" "))));
    paragraph = [];
  };
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i];
    const fence = /^\s*```(\S*)/.exec(line);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```/.test(lines[i]); i++) code.push(lines[i]);
      out.append(el("pre", {}, el("code", fence[1] ? { "data-lang": fence[1] } : {}, code.join("\n"))));
      continue;
    }
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (heading) {
      flush();
      out.append(el(`h${heading[1].length + 2 > 6 ? 6 : heading[1].length + 2}`, {}, ...inline(heading[2])));
      continue;
    }
    const item = listItem(line);
    if (item) {
      flush();
      const list = el(item.ordered ? "ol" : "ul");
      for (; i < lines.length && listItem(lines[i])?.ordered === item.ordered; i++) {
        list.append(el("li", {}, ...inline(listItem(lines[i]).text)));
      }
      i--;
      out.append(list);
      continue;
    }
    if (/^\s*>/.test(line)) {
      flush();
      out.append(el("blockquote", {}, ...inline(line.replace(/^\s*>\s?/, ""))));
      continue;
    }
    if (!line.trim()) flush();
    else paragraph.push(line.trim());
  }
  flush();
  return out;
}
