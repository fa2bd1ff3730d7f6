// The HTTP side of the page: the API key, error texts, and a job's Server-Sent Events.
"use strict";
const $ = (id) => document.getElementById(id);

function apiKey() { return $("api-key").value; }

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  if (apiKey()) h["Authorization"] = "Bearer " + apiKey();
  return h;
}

// The server's error body is {"error": {"message", "type", "param"}}.
async function errorText(res) {
  try {
    const body = await res.json();
    if (body && body.error) return body.error.message + (body.error.param ? " [" + body.error.param + "]" : "");
  } catch (e) { /* not JSON */ }
  return "HTTP " + res.status;
}

function showError(text) { $("error").textContent = text || ""; }

// Reads a job's Server-Sent Events with fetch (EventSource cannot send an API key) and calls
// onEvent(name, data) for each; resolves when the stream ends.
async function readEvents(url, onEvent) {
  const res = await fetch(url, { headers: headers(false) });
  if (!res.ok) throw new Error(await errorText(res));
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let end;
    while ((end = buf.indexOf("\n\n")) >= 0) {
      const block = buf.slice(0, end); buf = buf.slice(end + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) await onEvent(name, JSON.parse(data));
    }
  }
}
