// The form, the jobs and the gallery: what the page does with api.js, mask.js and history.js.
"use strict";

const server = { multiple: 16, defaultW: 1024, defaultH: 1024, controlnet: false };
const painter = new MaskPainter($("mask-canvas"));
let initFile = null;   // the start image (a File or Blob)
let lastSeed = null;

$("api-key").value = sessionStorage.getItem("zimage-key") || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem("zimage-key", $("api-key").value);
  loadServerInfo();
});

const mode = () => document.querySelector("input[name=mode]:checked").value;

function showMode() {
  const m = mode();
  $("image-panel").hidden = m === "txt2img";
  $("mask-tools").hidden = m !== "inpaint";
  $("mask-canvas").hidden = m !== "inpaint";
  $("control-panel").hidden = m !== "inpaint" || !server.controlnet;
  if (m === "inpaint" && Number($("strength").value) === 0.6) setStrength(1);
  if (m === "img2img" && Number($("strength").value) === 1) setStrength(0.6);
}
function setStrength(v) { $("strength").value = v; $("strength-value").textContent = v; }
for (const r of document.querySelectorAll("input[name=mode]")) r.addEventListener("change", showMode);
$("strength").addEventListener("input", () => { $("strength-value").textContent = $("strength").value; });

// ---- server capabilities -------------------------------------------------------------------
async function loadServerInfo() {
  try {
    const res = await fetch("/v1/models", { headers: headers(false) });
    if (!res.ok) { $("server-status").textContent = await errorText(res); return; }
    const m = (await res.json()).data[0];
    const z = m.zimage;
    if (!z) { $("server-status").textContent = m.id + ": loading…"; setTimeout(loadServerInfo, 1000); return; }
    $("server-status").textContent = m.id + " on " + z.device;
    server.multiple = z.size_multiple; server.defaultW = z.default_width; server.defaultH = z.default_height;
    server.controlnet = !!z.controlnet;
    for (const id of ["width", "height"]) { $(id).step = z.size_multiple; $(id).min = z.size_multiple; $(id).max = z.max_side; }
    $("width").value = z.default_width; $("height").value = z.default_height;
    $("steps").value = z.default_steps; $("steps").max = z.max_steps; $("n").max = z.max_batch;
    $("size-preset").value = z.default_width === z.default_height ? "1:1" : "custom";
    if (z.loras) loadLoras();
    showMode();
  } catch (e) { $("server-status").textContent = "server unreachable"; }
}

async function loadLoras() {
  const res = await fetch("/v1/loras", { headers: headers(false) });
  if (!res.ok) return;
  const list = (await res.json()).data;
  $("lora-panel").hidden = list.length === 0;
  $("loras").replaceChildren(...list.map((l) => {
    const row = document.createElement("label");
    row.className = "lora"; row.dataset.name = l.name;
    const on = document.createElement("input"); on.type = "checkbox";
    const name = document.createElement("span"); name.textContent = l.name;
    const scale = document.createElement("input");
    scale.type = "number"; scale.step = "0.05"; scale.min = "-16"; scale.max = "16"; scale.value = "1";
    row.append(on, name, scale);
    return row;
  }));
}

function chosenLoras() {
  return [...document.querySelectorAll("#loras .lora")]
    .filter((row) => row.querySelector("input[type=checkbox]").checked)
    .map((row) => ({ name: row.dataset.name, scale: Number(row.querySelector("input[type=number]").value) }));
}

// ---- sizes ---------------------------------------------------------------------------------
// An aspect ratio at about the default size's pixel count, sides rounded to the size multiple.
$("size-preset").addEventListener("change", () => {
  const v = $("size-preset").value;
  if (v === "custom") return;
  const [a, b] = v.split(":").map(Number);
  const area = server.defaultW * server.defaultH, m = server.multiple;
  const w = Math.sqrt(area * a / b);
  $("width").value = Math.max(m, Math.round(w / m) * m);
  $("height").value = Math.max(m, Math.round(w * b / a / m) * m);
});
for (const id of ["width", "height"])
  $(id).addEventListener("input", () => { $("size-preset").value = "custom"; });

// ---- seeds ---------------------------------------------------------------------------------
$("random-seed").addEventListener("change", () => { $("seed").disabled = $("random-seed").checked; });
function useSeed(seed) {
  $("random-seed").checked = false; $("seed").disabled = false; $("seed").value = seed;
}
$("last-seed").addEventListener("click", () => { if (lastSeed !== null) useSeed(lastSeed); });

// ---- the start image and the mask ----------------------------------------------------------
function setInitImage(blob) {
  initFile = blob;
  const img = $("init-preview");
  img.onload = () => {
    painter.reset(img.naturalWidth, img.naturalHeight);
    const m = server.multiple;
    $("width").value = Math.max(m, Math.floor(img.naturalWidth / m) * m);
    $("height").value = Math.max(m, Math.floor(img.naturalHeight / m) * m);
    $("size-preset").value = "custom";
    $("painter").hidden = false;
    $("painter").dataset.ready = "1";
  };
  $("painter").dataset.ready = "";
  img.src = URL.createObjectURL(blob);
}
$("init-file").addEventListener("change", () => { if ($("init-file").files[0]) setInitImage($("init-file").files[0]); });
$("drop").addEventListener("dragover", (e) => { e.preventDefault(); $("drop").classList.add("over"); });
$("drop").addEventListener("dragleave", () => $("drop").classList.remove("over"));
$("drop").addEventListener("drop", (e) => {
  e.preventDefault(); $("drop").classList.remove("over");
  const f = e.dataTransfer.files[0];
  if (f) setInitImage(f);
});
for (const t of document.querySelectorAll("input[name=tool]"))
  t.addEventListener("change", () => { painter.tool = t.value; });
$("brush-size").addEventListener("input", () => { painter.size = Number($("brush-size").value) || 1; });
$("mask-undo").addEventListener("click", () => painter.undo());
$("mask-clear").addEventListener("click", () => painter.clear());

// ---- requests ------------------------------------------------------------------------------
function settings() {
  const p = {
    mode: mode(), prompt: $("prompt").value, negative_prompt: $("negative").value,
    width: Number($("width").value), height: Number($("height").value),
    num_inference_steps: Number($("steps").value), guidance_scale: Number($("guidance").value),
    n: Number($("n").value), seed: $("random-seed").checked ? null : Number($("seed").value),
    loras: chosenLoras(), preview: $("previews").checked,
  };
  if (p.mode !== "txt2img") p.strength = Number($("strength").value);
  return p;
}

// POST /v1/jobs: JSON for text-to-image, the edits form when there is a start image.
async function requestBody(p) {
  const common = {
    prompt: p.prompt, size: p.width + "x" + p.height, num_inference_steps: p.num_inference_steps,
    guidance_scale: p.guidance_scale, n: p.n, response_format: "url", preview: p.preview,
  };
  if (p.negative_prompt) common.negative_prompt = p.negative_prompt;
  if (p.seed !== null) common.seed = p.seed;
  if (p.loras.length) common.loras = p.loras;
  if (p.mode === "txt2img") return { body: JSON.stringify(common), json: true };
  if (!initFile) throw new Error("image: choose or drop a start image first");
  const form = new FormData();
  for (const [k, v] of Object.entries(common)) form.append(k, typeof v === "object" ? JSON.stringify(v) : String(v));
  form.append("image", initFile, "image.png");
  if (p.mode === "inpaint") {
    if (painter.empty()) throw new Error("mask: paint the region to repaint first");
    form.append("mask", await painter.toBlob(), "mask.png");
    const control = $("control-file").files[0];
    if (server.controlnet && control) {
      form.append("control_image", control, control.name);
      form.append("control_scale", $("control-scale").value);
    }
  }
  if (!(p.mode === "inpaint" && server.controlnet && $("control-file").files[0]))
    form.append("strength", String(p.strength));
  return { body: form, json: false };
}

$("form").addEventListener("submit", async (e) => {
  e.preventDefault();
  showError("");
  const p = settings();
  let req;
  try { req = await requestBody(p); } catch (err) { showError(err.message); return; }
  let res;
  try {
    res = await fetch("/v1/jobs", { method: "POST", headers: headers(req.json), body: req.body });
  } catch (err) { showError("server unreachable: " + err); return; }
  if (res.status !== 202) { showError(await errorText(res)); return; }
  const job = await res.json();
  p.seed = job.seed;
  const card = jobCard(job.id, p.prompt);
  follow(job.id, p, card).catch((err) => { card.status.textContent = "stream lost: " + err.message; });
});

document.addEventListener("keydown", (e) => {
  if ((e.ctrlKey || e.metaKey) && e.key === "Enter") { e.preventDefault(); $("form").requestSubmit(); }
});

// ---- jobs ----------------------------------------------------------------------------------
function jobCard(id, prompt) {
  const div = document.createElement("div");
  div.className = "job"; div.dataset.id = id; div.dataset.previews = "0";
  const title = document.createElement("div");
  title.className = "title"; title.textContent = prompt; title.title = prompt;
  const cancel = document.createElement("button");
  cancel.className = "cancel"; cancel.type = "button"; cancel.textContent = "Cancel";
  cancel.addEventListener("click", async () => {
    cancel.disabled = true;
    const res = await fetch("/v1/jobs/" + id, { method: "DELETE", headers: headers(false) });
    if (!res.ok) { showError(await errorText(res)); cancel.disabled = false; }
  });
  const bar = document.createElement("progress");
  bar.max = 1; bar.value = 0;
  const status = document.createElement("div");
  status.className = "status"; status.textContent = "queued";
  const preview = document.createElement("img");
  preview.className = "preview"; preview.alt = "live preview";
  div.append(title, cancel, bar, status, preview);
  $("jobs").prepend(div);
  return { div, bar, status, cancel, preview };
}

function setProgress(card, step, total) {
  card.bar.max = total; card.bar.value = step;
  const pct = total > 0 ? Math.round(100 * step / total) : 0;
  card.status.textContent = "step " + step + " / " + total + " (" + pct + " %)";
  card.div.dataset.percent = pct;
}

async function follow(id, params, card) {
  await readEvents("/v1/jobs/" + id + "/events", async (name, ev) => {
    if (name === "queued") card.status.textContent = "queued (position " + (ev.queue_position + 1) + ")";
    else if (name === "started") setProgress(card, 0, ev.total);
    else if (name === "progress") setProgress(card, ev.step, ev.total);
    else if (name === "preview") {
      card.preview.src = "data:" + ev.content_type + ";base64," + ev.image;
      if (!card.div.dataset.firstPreviewAt) card.div.dataset.firstPreviewAt = performance.now();
      card.div.dataset.previews = String(Number(card.div.dataset.previews) + 1);
      card.div.dataset.previewStep = ev.step;
    } else if (name === "done") {
      card.bar.value = card.bar.max; card.div.dataset.percent = 100;
      card.status.textContent = "done (100 %) in " + ev.timings.total_s.toFixed(2) + " s";
      card.div.classList.add("done"); card.cancel.remove();
      await saveImages(id, params, ev.images);
      card.div.dataset.state = "done";
    } else if (name === "failed" || name === "cancelled") {
      card.status.textContent = name + ": " + ev.error.message;
      card.div.classList.add(name); card.div.dataset.state = name; card.cancel.remove();
    }
  });
}

// ---- history (gallery) ---------------------------------------------------------------------
async function saveImages(id, params, images) {
  for (const [k, im] of images.entries()) {
    const res = await fetch(im.url, { headers: headers(false) });
    if (!res.ok) { showError(await errorText(res)); continue; }
    const rec = { key: id + "-" + k, blob: await res.blob(), created: Date.now(),
                  params: Object.assign({}, params, { seed: im.seed }) };
    lastSeed = im.seed;
    try { await historyPut(rec); } catch (err) { showError("history not saved: " + err); }
    const fig = galleryCard(rec);
    fig.dataset.addedAt = performance.now();
    $("gallery").prepend(fig);
  }
}

function describe(p) {
  return (p.mode && p.mode !== "txt2img" ? "[" + p.mode + ", strength " + p.strength + "] " : "") +
    p.prompt + " — " + p.width + "×" + p.height + ", " + p.num_inference_steps + " steps, guidance " +
    p.guidance_scale + ", seed " + p.seed +
    (p.loras && p.loras.length ? ", LoRAs " + p.loras.map((l) => l.name + ":" + l.scale).join(" ") : "");
}

function galleryCard(rec) {
  const p = rec.params, url = URL.createObjectURL(rec.blob);
  const fig = document.createElement("figure");
  fig.dataset.key = rec.key;
  const img = document.createElement("img");
  img.src = url; img.alt = p.prompt; img.dataset.job = rec.key.split("-")[0];
  const cap = document.createElement("figcaption");
  const text = document.createElement("div");
  text.textContent = describe(p);
  const actions = document.createElement("div");
  actions.className = "actions";
  const dl = document.createElement("a");  // the server's PNG: its text chunks carry the settings
  dl.href = url; dl.download = "zimage-" + rec.key + ".png"; dl.textContent = "Download";
  const button = (cls, label, fn) => {
    const b = document.createElement("button");
    b.type = "button"; b.className = cls; b.textContent = label; b.addEventListener("click", fn);
    return b;
  };
  actions.append(dl,
    button("reuse", "Reuse settings", () => reuse(p)),
    button("to-img2img", "Use as start image", () => {
      document.querySelector("input[name=mode][value=img2img]").checked = true;
      showMode(); setInitImage(rec.blob); window.scrollTo(0, 0);
    }),
    button("delete", "Delete", async () => { await historyDelete(rec.key); fig.remove(); }));
  cap.append(text, actions);
  fig.append(img, cap);
  return fig;
}

function reuse(p) {
  $("prompt").value = p.prompt || "";
  $("negative").value = p.negative_prompt || "";
  $("width").value = p.width; $("height").value = p.height; $("size-preset").value = "custom";
  $("steps").value = p.num_inference_steps; $("guidance").value = p.guidance_scale;
  $("n").value = p.n;
  useSeed(p.seed);
  if (p.strength !== undefined) setStrength(p.strength);
  for (const row of document.querySelectorAll("#loras .lora")) {
    const l = (p.loras || []).find((x) => x.name === row.dataset.name);
    row.querySelector("input[type=checkbox]").checked = !!l;
    if (l) row.querySelector("input[type=number]").value = l.scale;
  }
  window.scrollTo(0, 0);
}

async function loadHistory() {
  try {
    const all = await historyAll();
    all.sort((a, b) => b.created - a.created);
    $("gallery").replaceChildren(...all.map(galleryCard));
    if (all.length) lastSeed = all[0].params.seed;
    $("gallery").dataset.loaded = String(all.length);
  } catch (err) { showError("history unavailable: " + err); }
}
$("clear-history").addEventListener("click", async () => { await historyClear(); $("gallery").replaceChildren(); });

// ---- the server's queue (every client's jobs; no prompts) ----------------------------------
async function pollQueue() {
  try {
    const res = await fetch("/v1/queue", { headers: headers(false) });
    if (res.ok) {
      const q = await res.json();
      const lines = q.running.map((j) => "running " + j.ref + ": step " + j.step + " / " + j.total)
        .concat(q.queued.map((j) => "queued " + j.ref + " at position " + (j.position + 1)));
      $("queue").textContent = lines.length ? lines.join("\n") : "idle";
    } else {
      $("queue").textContent = "not available (" + res.status + ")";
    }
  } catch (e) { $("queue").textContent = "server unreachable"; }
  setTimeout(pollQueue, 2000);
}

loadServerInfo();
loadHistory();
pollQueue();
