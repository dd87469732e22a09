// kforge notebook views: one plain ES module for every view; the Python side picks one with `_view`.
// Large texts come on request over custom messages ({type: "request", id, method, params});
// a view asks when it renders, so nothing sent before it existed is needed.

const SVG = "http://www.w3.org/2000/svg";
const pending = new Map();
let nextId = 0;

function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

function s(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function request(model, method, params = {}) {
  const id = `kf-${Date.now().toString(36)}-${nextId++}`;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    model.send({ type: "request", id, method, params });
    setTimeout(() => {
      if (pending.delete(id)) reject(new Error(`no answer to ${method} within 30 s (is the kernel busy?)`));
    }, 30000);
  });
}

function listen(model) {
  const onMsg = (msg) => {
    if (!msg || msg.type !== "response" || !pending.has(msg.id)) return;
    const { resolve, reject } = pending.get(msg.id);
    pending.delete(msg.id);
    if (msg.ok) resolve(msg.data);
    else reject(new Error(msg.error || "request failed"));
  };
  model.on("msg:custom", onMsg);
  return () => model.off("msg:custom", onMsg);
}

function errorBanner(model) {
  const text = h("span", { class: "kf-error-text" });
  const banner = h("div", { class: "kf-error", role: "alert" }, h("strong", {}, "Error "), text,
    h("button", { class: "kf-link", title: "dismiss", onclick: () => { model.set("error", ""); model.save_changes(); } }, "×"));
  const update = () => {
    text.textContent = model.get("error") || "";
    banner.style.display = model.get("error") ? "" : "none";
  };
  model.on("change:error", update);
  update();
  return banner;
}

const fmt = {
  us: (v) => (v === null || v === undefined ? "–" : v >= 1000 ? `${(v / 1000).toFixed(2)} ms` : `${v.toFixed(1)} µs`),
  pct: (v) => `${(v * 100).toFixed(1)}%`,
  x: (v) => (v === null || v === undefined || v === 0 ? "–" : `${v.toFixed(2)}×`),
  usd: (v) => (v ? `$${v.toFixed(v < 1 ? 3 : 2)}` : "–"),
};

const STATUS_COLORS = {
  faster: "#1a7f37", no_gain: "#6e7781", slower: "#bf8700", wrong_result: "#cf222e",
  compile_error: "#8250df", launch_error: "#bc4c00", crashed: "#a40e26", timed_out: "#953800",
  pending: "#afb8c1", winner: "#1a7f37", eager: "#6e7781", searching: "#0969da", "not searched": "#8c959f",
};

function pill(status) {
  return h("span", { class: "kf-pill", style: `--kf-c: ${STATUS_COLORS[status] || "#6e7781"}` }, status.replace("_", " "));
}

// ------------------------------------------------------------------ card table

const COLUMNS = [
  { key: "op", label: "op" },
  { key: "signature", label: "signature" },
  { key: "calls", label: "calls", num: true },
  { key: "share", label: "share", num: true },
  { key: "eager_us", label: "eager", num: true },
  { key: "speedup", label: "best", num: true },
  { key: "status", label: "status" },
  { key: "candidates", label: "tried", num: true },
  { key: "dollars", label: "cost", num: true },
];

function renderCardTable(model, root) {
  const head = h("thead");
  const body = h("tbody");
  const summary = h("span", { class: "kf-muted" });
  root.append(h("div", { class: "kf-header" }, h("span", { class: "kf-title" }, "Operator cards"), summary),
    h("div", { class: "kf-scroll kf-table-wrap" }, h("table", { class: "kf-table" }, head, body)));

  const draw = () => {
    const sortBy = model.get("sort_by");
    const desc = model.get("sort_desc");
    const rows = [...model.get("rows")];
    rows.sort((a, b) => {
      const va = a[sortBy] ?? -Infinity;
      const vb = b[sortBy] ?? -Infinity;
      const c = typeof va === "string" ? va.localeCompare(vb) : va - vb;
      return desc ? -c : c;
    });
    head.replaceChildren(h("tr", {}, COLUMNS.map((col) => h("th", {
      class: `${col.num ? "kf-num" : ""} ${col.key === sortBy ? "kf-sorted" : ""}`,
      title: `sort by ${col.label}`,
      onclick: () => {
        if (model.get("sort_by") === col.key) model.set("sort_desc", !model.get("sort_desc"));
        else { model.set("sort_by", col.key); model.set("sort_desc", col.num === true); }
        model.save_changes();
      },
    }, col.label, col.key === sortBy ? (desc ? " ▾" : " ▴") : ""))));
    const selected = model.get("selected_key");
    body.replaceChildren(...rows.map((r) => h("tr", {
      class: r.key === selected ? "kf-selected" : "",
      "data-key": r.key,
      onclick: () => { model.set("selected_key", r.key); model.save_changes(); },
    },
      h("td", { class: "kf-op", title: r.op }, r.op),
      h("td", { class: "kf-sig", title: r.signature }, r.signature),
      h("td", { class: "kf-num" }, r.calls),
      h("td", { class: "kf-num" }, h("span", { class: "kf-share-track" },
        h("span", { class: "kf-share-bar", style: `width: ${Math.min(100, r.share * 100)}%` })), fmt.pct(r.share)),
      h("td", { class: "kf-num" }, fmt.us(r.eager_us)),
      h("td", { class: `kf-num ${r.speedup > 1 ? "kf-good" : ""}` }, fmt.x(r.speedup)),
      h("td", {}, pill(r.status)),
      h("td", { class: "kf-num" }, r.candidates || "–"),
      h("td", { class: "kf-num" }, fmt.usd(r.dollars)),
    )));
    const winners = rows.filter((r) => r.status === "winner").length;
    const searched = rows.filter((r) => r.status !== "not searched").length;
    summary.textContent = `${rows.length} cards · ${searched} searched · ${winners} with a winner`;
  };
  for (const name of ["rows", "selected_key", "sort_by", "sort_desc"]) model.on(`change:${name}`, draw);
  draw();
}

// ------------------------------------------------------------------ search tree

function layoutTree(nodes) {
  const byParent = new Map();
  for (const n of nodes) {
    const p = n.parent ?? "root";
    if (!byParent.has(p)) byParent.set(p, []);
    byParent.get(p).push(n);
  }
  const pos = new Map();
  let leaf = 0;
  let depthMax = 0;
  const place = (id, depth) => {
    depthMax = Math.max(depthMax, depth);
    const kids = byParent.get(id) || [];
    if (!kids.length) { pos.set(id, { x: leaf++, y: depth }); return; }
    for (const k of kids) place(k.id, depth + 1);
    const xs = kids.map((k) => pos.get(k.id).x);
    pos.set(id, { x: (Math.min(...xs) + Math.max(...xs)) / 2, y: depth });
  };
  const known = new Set(nodes.map((n) => n.id));
  for (const n of nodes) if (n.parent !== null && !known.has(n.parent)) n.parent = null;
  place("root", 0);
  return { pos, width: Math.max(leaf, 1), depth: depthMax };
}

function renderSearchTree(model, root) {
  const DX = 34, DY = 64;
  const title = h("span", { class: "kf-title" }, "Search tree");
  const label = h("span", { class: "kf-muted kf-ellipsis" });
  const live = h("span", { class: "kf-live" }, "● live");
  const fitBtn = h("button", { class: "kf-btn kf-small", title: "fit the whole tree" }, "Fit");
  const svg = s("svg", { class: "kf-tree-svg" });
  const gEdges = s("g");
  const gNodes = s("g");
  svg.append(gEdges, gNodes);
  const legend = h("div", { class: "kf-legend" }, ["faster", "no_gain", "slower", "wrong_result", "compile_error", "pending"]
    .map((st) => h("span", {}, h("i", { style: `background: ${STATUS_COLORS[st]}` }), st.replace("_", " "))),
    h("span", {}, h("i", { class: "kf-best-swatch" }), "best path"));
  const empty = h("div", { class: "kf-empty" }, "No candidates for this card yet.");
  root.append(h("div", { class: "kf-header" }, title, label, live, fitBtn),
    h("div", { class: "kf-tree-box" }, svg, empty), legend);

  let view = null;      // current viewBox [x, y, w, h]; null: fit automatically
  let extent = [0, 0, 100, 100];
  const setView = (v) => { svg.setAttribute("viewBox", v.join(" ")); };
  const fit = () => { view = null; setView(extent); };
  fitBtn.addEventListener("click", fit);

  const draw = () => {
    const nodes = model.get("nodes").map((n) => ({ ...n }));
    const best = new Set(model.get("best_path"));
    const selected = model.get("selected_id");
    label.textContent = model.get("card_label");
    label.title = model.get("card_label");
    live.style.display = model.get("live") ? "" : "none";
    empty.style.display = nodes.length ? "none" : "";
    const { pos, width, depth } = layoutTree(nodes);
    const px = (id) => { const p = pos.get(id); return [p.x * DX + DX, p.y * DY + 28]; };
    // never magnify a small tree beyond 1:1 when fitting; centre it horizontally
    const w = Math.max((width + 1) * DX, 420), hgt = Math.max((depth + 1) * DY + 20, 340);
    extent = [((width + 1) * DX - w) / 2, 0, w, hgt];
    if (view === null) setView(extent);
    gEdges.replaceChildren();
    gNodes.replaceChildren();
    const [rx, ry] = px("root");
    for (const n of nodes) {
      const [x1, y1] = n.parent === null ? [rx, ry] : px(n.parent);
      const [x2, y2] = px(n.id);
      const onBest = best.has(n.id) && (n.parent === null || best.has(n.parent));
      gEdges.append(s("path", {
        d: `M${x1},${y1} C${x1},${(y1 + y2) / 2} ${x2},${(y1 + y2) / 2} ${x2},${y2}`,
        class: onBest ? "kf-edge kf-edge-best" : "kf-edge",
      }));
    }
    const rootG = s("g", { class: "kf-node kf-root", transform: `translate(${rx},${ry})` });
    rootG.append(s("rect", { x: -22, y: -10, width: 44, height: 20, rx: 10 }));
    const rt = s("text", { "text-anchor": "middle", dy: "0.35em" });
    rt.textContent = "eager";
    rootG.append(rt);
    gNodes.append(rootG);
    for (const n of nodes) {
      const [x, y] = px(n.id);
      const r = n.speedup > 0 ? 6 + 7 * Math.min(Math.max(n.speedup, 0.25), 3) / 3 : 6;
      const color = STATUS_COLORS[n.status] || "#6e7781";
      const g = s("g", {
        class: `kf-node${n.id === selected ? " kf-node-selected" : ""}${best.has(n.id) ? " kf-node-best" : ""}`,
        transform: `translate(${x},${y})`, "data-id": n.id,
      });
      const shade = n.speedup > 0 ? 0.35 + 0.65 * Math.min(n.speedup, 2) / 2 : 0.9;
      g.append(s("circle", { r: r + 4, class: "kf-halo" }));
      g.append(s("circle", {
        r, fill: color, "fill-opacity": n.status === "pending" ? 0.25 : shade, stroke: color,
        "stroke-dasharray": n.status === "pending" ? "3 2" : "none",
      }));
      const t = s("text", { x: r + 4, dy: "0.35em", class: "kf-node-label" });
      t.textContent = n.speedup > 0 ? `${n.speedup.toFixed(2)}×` : `#${n.id}`;
      g.append(t);
      const tip = s("title");
      tip.textContent = `#${n.id} ${n.status}${n.speedup > 0 ? ` ${n.speedup.toFixed(2)}×` : ""}\n${n.strategy}\n${n.intent}`;
      g.append(tip);
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        model.set("selected_id", n.id);
        model.save_changes();
      });
      gNodes.append(g);
    }
  };

  // zoom around the pointer, pan by dragging
  const current = () => view || extent;
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const [x, y, w, hgt] = current();
    const rect = svg.getBoundingClientRect();
    const scale = Math.min(w / rect.width, hgt / rect.height);
    const ox = x + (ev.clientX - rect.left) * scale - Math.max(0, (rect.width * scale - w) / 2);
    const oy = y + (ev.clientY - rect.top) * scale - Math.max(0, (rect.height * scale - hgt) / 2);
    const k = Math.exp(ev.deltaY * 0.0015);
    view = [ox - (ox - x) * k, oy - (oy - y) * k, w * k, hgt * k];
    setView(view);
  }, { passive: false });
  let drag = null;
  svg.addEventListener("pointerdown", (ev) => {
    if (ev.target.closest(".kf-node")) return;
    drag = { x: ev.clientX, y: ev.clientY, v: current() };
    svg.setPointerCapture(ev.pointerId);
    svg.classList.add("kf-dragging");
  });
  svg.addEventListener("pointermove", (ev) => {
    if (!drag) return;
    const rect = svg.getBoundingClientRect();
    const [x, y, w, hgt] = drag.v;
    const scale = Math.max(w / rect.width, hgt / rect.height);
    view = [x - (ev.clientX - drag.x) * scale, y - (ev.clientY - drag.y) * scale, w, hgt];
    setView(view);
  });
  const endDrag = () => { drag = null; svg.classList.remove("kf-dragging"); };
  svg.addEventListener("pointerup", endDrag);
  svg.addEventListener("pointercancel", endDrag);
  model.on("change:card_key", fit);
  for (const name of ["nodes", "best_path", "selected_id", "card_label", "live"]) model.on(`change:${name}`, draw);
  draw();
}

// ------------------------------------------------------------------ source view

const C_KEYWORDS = new Set(("if else for while do return break continue switch case default goto sizeof typedef struct " +
  "union enum static inline const volatile extern register restrict auto template typename namespace using " +
  "__global__ __device__ __host__ __shared__ __restrict__ __forceinline__ __launch_bounds__ constexpr").split(" "));
const C_TYPES = new Set(("void char short int long float double signed unsigned bool size_t int8_t int16_t int32_t " +
  "int64_t uint8_t uint16_t uint32_t uint64_t half __half __nv_bfloat16 float2 float4 dim3 cudaStream_t").split(" "));
const TOKEN = /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')|(^[ \t]*#[^\n]*)|(\b(?:0x[0-9a-fA-F]+|\d+\.?\d*(?:[eE][+-]?\d+)?|\.\d+(?:[eE][+-]?\d+)?)[fFuUlL]*\b)|([A-Za-z_]\w*)/gm;

// Tokens of C / CUDA source as [class, text] pairs (class "" for plain text).
function highlight(src) {
  const out = [];
  let last = 0;
  for (const m of src.matchAll(TOKEN)) {
    if (m.index > last) out.push(["", src.slice(last, m.index)]);
    let cls = "";
    if (m[1]) cls = "kf-tok-com";
    else if (m[2]) cls = "kf-tok-str";
    else if (m[3]) cls = "kf-tok-pre";
    else if (m[4]) cls = "kf-tok-num";
    else if (C_KEYWORDS.has(m[5])) cls = "kf-tok-kw";
    else if (C_TYPES.has(m[5]) || /_t$/.test(m[5])) cls = "kf-tok-type";
    else if (/^[A-Z][A-Z0-9_]+$/.test(m[5])) cls = "kf-tok-const";
    out.push([cls, m[0]]);
    last = m.index + m[0].length;
  }
  if (last < src.length) out.push(["", src.slice(last)]);
  return out;
}

function codeLines(src) {
  const lines = [[]];
  for (const [cls, text] of highlight(src)) {
    text.split("\n").forEach((part, i) => {
      if (i > 0) lines.push([]);
      if (part) lines[lines.length - 1].push(cls ? h("span", { class: cls }, part) : part);
    });
  }
  return h("table", { class: "kf-code" }, h("tbody", {}, lines.map((parts, i) =>
    h("tr", {}, h("td", { class: "kf-ln" }, i + 1), h("td", { class: "kf-src" }, parts.length ? parts : " ")))));
}

function diffLines(diff) {
  if (!diff) return h("div", { class: "kf-empty" }, "A first candidate: no parent to compare with.");
  if (!diff.length) return h("div", { class: "kf-empty" }, "Identical to its parent.");
  return h("table", { class: "kf-code kf-diff" }, h("tbody", {}, diff.map(([kind, text]) => {
    const cls = { "+": "kf-add", "-": "kf-del", "@": "kf-hunk" }[kind] || "";
    return h("tr", { class: cls }, h("td", { class: "kf-ln" }, kind === "@" ? "" : kind),
      h("td", { class: "kf-src" }, text || " "));
  })));
}

function evaluationBlock(ev) {
  if (!ev) return h("div", { class: "kf-muted" }, "Not evaluated yet.");
  const rows = [];
  const add = (k, v) => { if (v !== null && v !== undefined && v !== "") rows.push(h("tr", {}, h("th", {}, k), h("td", {}, v))); };
  add("speedup", ev.speedup ? fmt.x(ev.speedup) : null);
  add("candidate", ev.candidate_us !== null ? `${fmt.us(ev.candidate_us)}${ev.candidate_spread !== null ? ` ± ${(ev.candidate_spread * 100).toFixed(1)}%` : ""}` : null);
  add("eager", ev.eager_us !== null ? `${fmt.us(ev.eager_us)}${ev.eager_spread !== null ? ` ± ${(ev.eager_spread * 100).toFixed(1)}%` : ""}` : null);
  add("roofline", ev.roofline_fraction !== null ? fmt.pct(ev.roofline_fraction) : null);
  add("max abs error", ev.max_abs_error !== null ? ev.max_abs_error.toExponential(2) : null);
  add("max rel error", ev.max_rel_error !== null ? ev.max_rel_error.toExponential(2) : null);
  add("checks", ev.checks.length ? ev.checks.join(" · ") : null);
  add("compile / total", `${ev.compile_s.toFixed(2)} s / ${ev.wall_s.toFixed(2)} s`);
  return h("div", {}, h("div", { class: "kf-verdict" }, pill(ev.status), h("span", {}, ev.message)),
    h("table", { class: "kf-kv" }, h("tbody", {}, rows)));
}

function renderSourceView(model, root) {
  const title = h("span", { class: "kf-title" }, "Candidate");
  const meta = h("span", { class: "kf-muted kf-ellipsis" });
  const content = h("div", { class: "kf-source-body" });
  root.append(h("div", { class: "kf-header" }, title, meta), content);
  let tab = "source";
  let shown = null;
  let latest = 0;

  const show = (c) => {
    shown = c;
    if (!c) {
      title.textContent = "Candidate";
      meta.textContent = "";
      content.replaceChildren(h("div", { class: "kf-empty" }, "Select a node of the search tree."));
      return;
    }
    title.textContent = `Candidate #${c.id}`;
    meta.textContent = [c.proposer, c.strategy, c.parent_id !== null ? `parent #${c.parent_id}` : "first candidate",
      c.dollars ? fmt.usd(c.dollars) : null].filter(Boolean).join(" · ");
    const tabs = [["source", "Source"], ["diff", "Diff"], ["log", "Compile log"]];
    const pane = { source: () => codeLines(c.source), diff: () => diffLines(c.diff),
      log: () => (c.compile_log ? h("pre", { class: "kf-log" }, c.compile_log) : h("div", { class: "kf-empty" }, "The compiler printed nothing.")) };
    content.replaceChildren(
      c.intent ? h("div", { class: "kf-intent" }, h("span", { class: "kf-label" }, "Intent"), c.intent) : "",
      evaluationBlock(c.evaluation),
      h("div", { class: "kf-tabs" }, tabs.map(([k, name]) => h("button", {
        class: `kf-tab${k === tab ? " kf-tab-on" : ""}`, "data-tab": k,
        onclick: () => { tab = k; show(shown); },
      }, name, k === "diff" && c.diff ? ` (+${c.diff.filter((d) => d[0] === "+").length} −${c.diff.filter((d) => d[0] === "-").length})` : ""))),
      h("div", { class: "kf-scroll kf-pane" }, pane[tab]()),
    );
  };
  const loading = () => content.replaceChildren(h("div", { class: "kf-empty" }, "Loading…"));
  const failed = (err) => content.replaceChildren(h("div", { class: "kf-error", style: "display: block" }, String(err.message || err)));

  const load = () => {
    const id = model.get("candidate_id");
    const mine = ++latest;
    if (id === null || id === undefined) { show(null); return; }
    loading();
    request(model, "candidate", { id }).then((c) => { if (mine === latest) show(c); },
      (err) => { if (mine === latest) failed(err); });
  };
  model.on("change:candidate_id", load);
  const first = ++latest;
  loading();
  request(model, "snapshot").then((snap) => { if (first === latest) show(snap.candidate); },
    (err) => { if (first === latest) failed(err); });
}

// ------------------------------------------------------------------ run progress

function renderRunProgress(model, root) {
  const state = h("span");
  const counts = h("span", { class: "kf-muted" });
  const bar = h("div", { class: "kf-bar-fill" });
  const current = h("div", { class: "kf-muted kf-ellipsis" });
  const best = h("div", { class: "kf-best" });
  const log = h("pre", { class: "kf-log kf-run-log" });
  const button = (action, label) => h("button", {
    class: "kf-btn", "data-action": action,
    onclick: () => request(model, "control", { action }).catch((err) => { model.set("error", String(err.message || err)); }),
  }, label);
  const buttons = { pause: button("pause", "Pause"), resume: button("resume", "Resume"), stop: button("stop", "Stop") };
  root.append(h("div", { class: "kf-header" }, h("span", { class: "kf-title" }, "Optimization run"), state, counts,
    h("span", { class: "kf-spacer" }), Object.values(buttons)),
    h("div", { class: "kf-bar" }, bar), current, best, log);
  const draw = () => {
    const st = model.get("state");
    const done = model.get("done");
    const total = Math.max(1, model.get("total"));
    state.replaceChildren(pill(st === "running" ? "searching" : st));
    counts.textContent = `${done} / ${model.get("total")} candidates · ${model.get("cards_done")} / ${model.get("cards_total")} cards` +
      (model.get("dollars") ? ` · ${fmt.usd(model.get("dollars"))}` : "");
    const finished = ["stopped", "finished", "failed"].includes(st);
    bar.style.width = `${finished ? 100 : Math.min(100, (100 * done) / total)}%`;
    bar.className = `kf-bar-fill${finished ? " kf-bar-done" : ""}${st === "paused" || st === "pausing" ? " kf-bar-paused" : ""}`;
    current.textContent = finished ? "" : model.get("current") ? `searching ${model.get("current")}` : "";
    const entries = Object.entries(model.get("best"));
    best.replaceChildren(...entries.map(([key, v]) => h("span", { class: "kf-chip" }, `${key.slice(0, 8)} ${fmt.x(v)}`)));
    log.textContent = model.get("log").join("\n");
    buttons.pause.disabled = finished || st === "paused" || st === "pausing" || st === "stopping";
    buttons.resume.disabled = finished || !(st === "paused" || st === "pausing");
    buttons.stop.disabled = finished || st === "stopping";
  };
  for (const name of ["state", "done", "total", "cards_done", "cards_total", "current", "best", "dollars", "log"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
}

// ------------------------------------------------------------------ entry point

const VIEWS = {
  card_table: renderCardTable,
  search_tree: renderSearchTree,
  source_view: renderSourceView,
  run_progress: renderRunProgress,
};

function render({ model, el }) {
  const stop = listen(model);
  const kind = model.get("_view");
  const root = h("div", { class: `kf-view kf-${kind.replace("_", "-")}` });
  el.append(root);
  root.append(errorBanner(model));
  try {
    (VIEWS[kind] || ((m, r) => r.append(`unknown kforge view ${kind}`)))(model, root);
  } catch (err) {
    model.set("error", `front end: ${err.message || err}`);
    model.save_changes();
  }
  return stop;
}

export default { render };
