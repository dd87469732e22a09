// kforge notebook views: one plain ES module for every view; the Python side picks one with `_view`.
// Everything a view shows is in its traits, pushed by the kernel as the run produces it, so clicks
// never wait on a kernel that may be busy running a cell. Selection moves between views through
// front-end links; the progress buttons post to the run's own control channel (127.0.0.1).
// Requests over custom messages ({type: "request", id, method, params}) remain for an idle kernel.

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

function request(model, method, params = {}, timeoutMs = 30000, busy = null) {
  const id = `kf-${Date.now().toString(36)}-${nextId++}`;
  return new Promise((resolve, reject) => {
    pending.set(id, { resolve, reject });
    model.send({ type: "request", id, method, params });
    setTimeout(() => {
      if (pending.delete(id)) reject(new Error(busy || `no answer to ${method} within ${timeoutMs / 1000} s: the kernel is busy running a cell`));
    }, timeoutMs);
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
  dur: (sec) => {
    if (sec === null || sec === undefined || !isFinite(sec)) return "–";
    sec = Math.max(0, Math.round(sec));
    const m = Math.floor(sec / 60), ss = sec % 60;
    return m >= 60 ? `${Math.floor(m / 60)} h ${m % 60} min` : m ? `${m} min ${String(ss).padStart(2, "0")} s` : `${ss} s`;
  },
};

const STATUS_COLORS = {
  faster: "#1a7f37", no_gain: "#6e7781", slower: "#bf8700", wrong_result: "#cf222e",
  compile_error: "#8250df", launch_error: "#bc4c00", crashed: "#a40e26", timed_out: "#953800",
  pending: "#8c959f", winner: "#1a7f37", eager: "#6e7781", searching: "#0969da", "not searched": "#8c959f",
  running: "#0969da", paused: "#bf8700", pausing: "#bf8700", stopping: "#bc4c00", stopped: "#bc4c00",
  finished: "#1a7f37", failed: "#cf222e",
};

function pill(status) {
  return h("span", { class: "kf-pill", "data-status": status, style: `--kf-c: ${STATUS_COLORS[status] || "#6e7781"}` },
    status.replace("_", " "));
}

// ------------------------------------------------------------------ card table

const COLUMNS = [
  { key: "label", label: "card", cls: "kf-card-col" },
  { key: "calls", label: "calls", num: true, optional: true },
  { key: "share", label: "share", num: true },
  { key: "eager_us", label: "eager", num: true, optional: true },
  { key: "speedup", label: "best", num: true },
  { key: "status", label: "status" },
  { key: "candidates", label: "tried", num: true },
  { key: "dollars", label: "cost", num: true },
];

// Narrow outputs (a 1024 px window) drop the optional columns instead of shrinking everything.
function watchWidth(root, narrowBelow) {
  const apply = (w) => root.classList.toggle("kf-narrow", w > 0 && w < narrowBelow);
  if (typeof ResizeObserver !== "undefined") new ResizeObserver((es) => apply(es[0].contentRect.width)).observe(root);
  requestAnimationFrame(() => apply(root.clientWidth));
}

function select(options, value, onchange, title) {
  const el = h("select", { class: "kf-select", title, onchange: (ev) => onchange(ev.target.value) },
    options.map(([v, text]) => h("option", { value: v, selected: v === value }, text)));
  return el;
}

function renderCardTable(model, root) {
  const head = h("thead");
  const body = h("tbody");
  const summary = h("span", { class: "kf-muted kf-ellipsis" });
  const follow = h("span", { class: "kf-follow" });
  const filters = h("div", { class: "kf-filters" });
  const wrap = h("div", { class: "kf-scroll kf-table-wrap", tabindex: "0", title: "↑ ↓ to move, Home / End" },
    h("table", { class: "kf-table" }, head, body));
  root.append(h("div", { class: "kf-header" }, h("span", { class: "kf-title" }, "Operator cards"), summary, follow),
    filters, wrap);
  watchWidth(root, 900);
  const selects = h("span", { class: "kf-selects" });
  const input = h("input", { class: "kf-input", type: "search", placeholder: "filter: op, shape, key…",
    value: model.get("filter_text"), oninput: (ev) => { model.set("filter_text", ev.target.value); model.save_changes(); } });
  filters.append(selects, input);
  const setFilter = (name, v) => { model.set(name, v); model.save_changes(); };
  let visible = [];

  const choose = (key, byUser) => {
    if (byUser && model.get("following")) model.set("following", false);
    model.set("selected_key", key);
    model.save_changes();
  };
  const drawFilters = () => {
    const rows = model.get("rows");
    const uniq = (f) => [...new Set(rows.map(f).filter(Boolean))].sort();
    selects.replaceChildren(
      select([["", "any status"], ...uniq((r) => r.status).map((v) => [v, v])], model.get("filter_status"),
        (v) => setFilter("filter_status", v), "status"),
      select([["", "any op"], ...uniq((r) => r.op).map((v) => [v, v])], model.get("filter_op"),
        (v) => setFilter("filter_op", v), "operator"),
      select([["", "any vendor"], ["-", "no vendor"], ...uniq((r) => r.vendor).map((v) => [v, v])], model.get("filter_vendor"),
        (v) => setFilter("filter_vendor", v), "vendor library"));
  };
  const draw = () => {
    const sortBy = model.get("sort_by");
    const desc = model.get("sort_desc");
    const status = model.get("filter_status");
    const op = model.get("filter_op"), vendor = model.get("filter_vendor");
    const text = model.get("filter_text").trim().toLowerCase();
    const all = model.get("rows");
    const rows = all.filter((r) => (!status || r.status === status) && (!op || r.op === op)
      && (!vendor || (vendor === "-" ? !r.vendor : r.vendor === vendor))
      && (!text || `${r.signature} ${r.key} ${r.label}`.toLowerCase().includes(text)));
    rows.sort((a, b) => {
      const va = a[sortBy] ?? -Infinity;
      const vb = b[sortBy] ?? -Infinity;
      const c = typeof va === "string" ? va.localeCompare(vb) : va - vb;
      return desc ? -c : c;
    });
    visible = rows;
    head.replaceChildren(h("tr", {}, COLUMNS.map((col) => h("th", {
      class: `${col.num ? "kf-num" : ""} ${col.optional ? "kf-optional" : ""} ${col.cls || ""} ${col.key === sortBy ? "kf-sorted" : ""}`,
      title: `sort by ${col.label}`, "data-col": col.key,
      onclick: () => {
        if (model.get("sort_by") === col.key) model.set("sort_desc", !model.get("sort_desc"));
        else { model.set("sort_by", col.key); model.set("sort_desc", col.num === true); }
        model.save_changes();
      },
    }, col.label, col.key === sortBy ? (desc ? " ▾" : " ▴") : ""))));
    const selected = model.get("selected_key");
    body.replaceChildren(...rows.map((r) => h("tr", {
      class: r.key === selected ? "kf-selected" : "",
      "data-key": r.key, "data-op": r.op, "data-vendor": r.vendor || "-",
      onclick: () => choose(r.key, true),
    },
      h("td", { class: "kf-card-col", title: `${r.signature}\nkey ${r.key}` }, r.label),
      h("td", { class: "kf-num kf-optional" }, r.calls),
      h("td", { class: "kf-num" }, h("span", { class: "kf-share-track" },
        h("span", { class: "kf-share-bar", style: `width: ${Math.min(100, r.share * 100)}%` })), fmt.pct(r.share)),
      h("td", { class: "kf-num kf-optional" }, fmt.us(r.eager_us)),
      h("td", { class: `kf-num ${r.speedup > 1 ? "kf-good" : ""}` }, fmt.x(r.speedup)),
      h("td", {}, pill(r.status)),
      h("td", { class: "kf-num" }, r.candidates || "–"),
      h("td", { class: "kf-num" }, fmt.usd(r.dollars)),
    )));
    if (!rows.length) body.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "kf-empty" }, "No card matches the filter.")));
    const winners = all.filter((r) => r.status === "winner").length;
    const searched = all.filter((r) => r.status !== "not searched").length;
    summary.textContent = `${all.length} cards · ${searched} searched · ${winners} with a winner` +
      (rows.length < all.length ? ` · ${rows.length} shown` : "");
    const searching = model.get("searching");
    follow.replaceChildren();
    if (model.get("following")) follow.append(h("span", { class: "kf-badge", "data-follow": "on" }, "following the search"));
    else if (searching) {
      follow.append(h("span", { class: "kf-badge", "data-follow": "off" }, "pinned"),
        h("button", { class: "kf-btn kf-small", "data-action": "follow", title: "show the card being searched",
          onclick: () => { model.set("following", true); choose(searching, false); } }, "Follow search"));
    }
  };
  // the card being searched changes: follow it unless the user pinned a row
  model.on("change:searching", () => {
    const key = model.get("searching");
    if (model.get("following") && key && key !== model.get("selected_key")) choose(key, false);
    draw();
  });
  wrap.addEventListener("keydown", (ev) => {
    if (!visible.length) return;
    const at = visible.findIndex((r) => r.key === model.get("selected_key"));
    const to = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: visible.length - 1,
      PageDown: at + 10, PageUp: at - 10 }[ev.key];
    if (to === undefined) return;
    ev.preventDefault();
    const row = visible[Math.max(0, Math.min(visible.length - 1, to))];
    choose(row.key, true);
    requestAnimationFrame(() => body.querySelector(`tr[data-key="${row.key}"]`)?.scrollIntoView({ block: "nearest" }));
  });
  for (const name of ["rows", "selected_key", "sort_by", "sort_desc", "following", "filter_status", "filter_op",
    "filter_vendor", "filter_text"]) {
    model.on(`change:${name}`, draw);
  }
  for (const name of ["rows", "filter_status", "filter_op", "filter_vendor"]) model.on(`change:${name}`, drawFilters);
  drawFilters();
  draw();
}

// ------------------------------------------------------------------ search tree

// Tidy layout: leaves take consecutive columns, a parent sits over its children. Columns are
// DX apart and labels sit under their node, narrower than DX, so sibling labels never overlap.
function layoutTree(nodes) {
  const byParent = new Map();
  const known = new Set(nodes.map((n) => n.id));
  for (const n of nodes) {
    if (n.parent !== null && !known.has(n.parent)) n.parent = null;
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
  place("root", 0);
  return { pos, width: Math.max(leaf, 1), depth: depthMax };
}

const TREE_DX = 58, TREE_DY = 62, MIN_SCALE = 0.85;

function renderSearchTree(model, root) {
  const title = h("span", { class: "kf-title" }, "Search tree");
  const label = h("span", { class: "kf-muted kf-ellipsis" });
  const live = h("span", { class: "kf-live" }, "● live");
  const follow = h("span", { class: "kf-follow" });
  const fitBtn = h("button", { class: "kf-btn kf-small", title: "fit the whole tree" }, "Fit");
  const svg = s("svg", { class: "kf-tree-svg" });
  const gEdges = s("g");
  const gNodes = s("g");
  svg.append(gEdges, gNodes);
  const legend = h("div", { class: "kf-legend" }, ["faster", "no_gain", "slower", "wrong_result", "compile_error", "pending"]
    .map((st) => h("span", {}, h("i", { style: `background: ${STATUS_COLORS[st]}` }), st.replace("_", " "))),
    h("span", {}, h("i", { class: "kf-best-swatch" }), "best path (faster than eager)"));
  const empty = h("div", { class: "kf-empty" }, "No candidates for this card yet.");
  const box = h("div", { class: "kf-tree-box" }, svg, empty);
  root.append(h("div", { class: "kf-header" }, title, label, live, follow, fitBtn), box, legend);

  let view = null;      // current viewBox [x, y, w, h]; null: automatic
  let extent = [0, 0, 100, 100];
  let fitAll = false;   // the user asked to see everything, even small
  let lastCard = model.get("card_key");
  const setView = (v) => { svg.setAttribute("viewBox", v.join(" ")); };
  const fit = () => { view = null; fitAll = true; draw(); };
  fitBtn.addEventListener("click", fit);

  const nodesOf = () => (model.get("trees")[model.get("card_key")] || []).map((n) => ({ ...n }));
  const newest = () => { const ns = nodesOf(); return ns.length ? ns[ns.length - 1].id : null; };

  // automatic view: the whole tree if it fits at MIN_SCALE or more, else a window around the selection
  const autoView = (pos, selected) => {
    const bw = box.clientWidth || 600, bh = box.clientHeight || 380;
    const [ex, ey, ew, eh] = extent;
    if (fitAll || (ew <= bw / MIN_SCALE && eh <= bh / MIN_SCALE)) return extent;
    const w = Math.min(ew, bw / MIN_SCALE), hh = Math.min(eh, bh / MIN_SCALE);
    const p = pos.get(selected);
    const cx = p ? p.x * TREE_DX + TREE_DX : ex + ew / 2, cy = p ? p.y * TREE_DY + 28 : 0;
    return [Math.max(ex, Math.min(ex + ew - w, cx - w / 2)), Math.max(ey, Math.min(ey + eh - hh, cy - hh / 2)), w, hh];
  };

  const draw = () => {
    if (model.get("card_key") !== lastCard) { lastCard = model.get("card_key"); view = null; fitAll = false; }
    const nodes = nodesOf();
    const best = new Set(model.get("best_paths")[model.get("card_key")] || []);
    const selected = model.get("selected_id");
    const text = model.get("labels")[model.get("card_key")] || model.get("card_key");
    label.textContent = text;
    label.title = text;
    live.style.display = model.get("live") ? "" : "none";
    follow.replaceChildren();
    if (model.get("live")) {
      follow.append(model.get("following") ? h("span", { class: "kf-badge", "data-follow": "on" }, "following newest")
        : h("button", { class: "kf-btn kf-small", "data-action": "follow", title: "select each new candidate as it comes",
          onclick: () => { model.set("following", true); model.set("selected_id", newest()); model.save_changes(); } },
        "Follow newest"));
    }
    empty.style.display = nodes.length ? "none" : "";
    const { pos, width, depth } = layoutTree(nodes);
    const px = (id) => { const p = pos.get(id); return [p.x * TREE_DX + TREE_DX, p.y * TREE_DY + 28]; };
    // at least the box itself: a small tree is drawn at full size, not shrunk into a fixed minimum
    const bw = box.clientWidth || 420, bh = box.clientHeight || 340;
    const w = Math.max((width + 1) * TREE_DX, bw), hgt = Math.max((depth + 1) * TREE_DY + 30, bh);
    extent = [((width + 1) * TREE_DX - w) / 2, 0, w, hgt];
    setView(view || autoView(pos, selected));
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
      const r = n.speedup > 0 ? 6 + 6 * Math.min(Math.max(n.speedup, 0.25), 3) / 3 : 6;
      const color = STATUS_COLORS[n.status] || "#6e7781";
      const g = s("g", {
        class: `kf-node${n.id === selected ? " kf-node-selected" : ""}${best.has(n.id) ? " kf-node-best" : ""}`,
        transform: `translate(${x},${y})`, "data-id": n.id, "data-status": n.status,
      });
      const shade = n.speedup > 0 ? 0.35 + 0.65 * Math.min(n.speedup, 2) / 2 : 0.9;
      g.append(s("circle", { r: r + 4, class: "kf-halo" }));
      g.append(s("circle", {
        r, fill: color, "fill-opacity": n.status === "pending" ? 0.25 : shade, stroke: color,
        "stroke-dasharray": n.status === "pending" ? "3 2" : "none",
      }));
      const t = s("text", { y: r + 11, "text-anchor": "middle", class: "kf-node-label" });
      t.textContent = n.speedup > 0 ? `${n.speedup.toFixed(2)}×` : `#${n.id}`;
      g.append(t);
      const tip = s("title");
      tip.textContent = `#${n.id} ${n.status}${n.speedup > 0 ? ` ${n.speedup.toFixed(2)}×` : ""}\n${n.strategy}\n${n.intent}`;
      g.append(tip);
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        model.set("following", false);
        model.set("selected_id", n.id);
        model.save_changes();
      });
      gNodes.append(g);
    }
  };

  // zoom around the pointer, pan by dragging
  const current = () => view || svg.getAttribute("viewBox").split(" ").map(Number);
  svg.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const [x, y, w, hgt] = current();
    const rect = svg.getBoundingClientRect();
    const scale = Math.max(w / rect.width, hgt / rect.height);
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
  // new candidates of the card shown: select the newest while following
  model.on("change:trees", () => {
    if (model.get("following")) {
      const id = newest();
      if (id !== null && id !== model.get("selected_id")) { model.set("selected_id", id); model.save_changes(); }
    }
    draw();
  });
  // another card: its best candidate (or newest), unless the selection already belongs to it
  model.on("change:card_key", () => {
    const nodes = nodesOf();
    if (!nodes.some((n) => n.id === model.get("selected_id"))) {
      const path = model.get("best_paths")[model.get("card_key")] || [];
      model.set("selected_id", path.length ? path[path.length - 1] : newest());
      model.save_changes();
    }
    draw();
  });
  for (const name of ["best_paths", "selected_id", "labels", "live", "following"]) model.on(`change:${name}`, draw);
  if (typeof ResizeObserver !== "undefined") new ResizeObserver(() => { if (view === null) draw(); }).observe(box);
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
  let shownKey = undefined;   // what is on screen (id and its detail), to redraw only on a change
  let latest = 0;

  const show = (c) => {
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
    const tab = model.get("tab") in { source: 1, diff: 1, log: 1 } ? model.get("tab") : "source";
    const pane = { source: () => codeLines(c.source), diff: () => diffLines(c.diff),
      log: () => (c.compile_log ? h("pre", { class: "kf-log" }, c.compile_log) : h("div", { class: "kf-empty" },
        c.evaluation ? "The compiler printed nothing." : "Not compiled yet.")) };
    content.replaceChildren(
      c.intent ? h("div", { class: "kf-intent" }, h("span", { class: "kf-label" }, "Intent"), c.intent) : "",
      evaluationBlock(c.evaluation),
      h("div", { class: "kf-tabs" }, tabs.map(([k, name]) => h("button", {
        class: `kf-tab${k === tab ? " kf-tab-on" : ""}`, "data-tab": k,
        onclick: () => { model.set("tab", k); model.save_changes(); show(c); },
      }, name, k === "diff" && c.diff ? ` (+${c.diff.filter((d) => d[0] === "+").length} −${c.diff.filter((d) => d[0] === "-").length})` : ""))),
      h("div", { class: "kf-scroll kf-pane" }, pane[tab]()),
    );
  };
  const failed = (err) => content.replaceChildren(h("div", { class: "kf-error", style: "display: flex" }, String(err.message || err)));

  // everything comes pushed in `details`; a candidate missing there is asked for (idle kernel only)
  const draw = () => {
    const id = model.get("candidate_id");
    if (id === null || id === undefined) {
      if (shownKey !== null) { shownKey = null; show(null); }
      return;
    }
    const c = model.get("details")[String(id)];
    if (c) {
      const key = `${id}:${JSON.stringify(c.evaluation)}:${c.compile_log.length}`;
      if (key !== shownKey) { shownKey = key; show(c); }
      return;
    }
    if (model.get("kernel_busy")) {   // asking would wait for the cell: it comes with the run's next report
      shownKey = `waiting ${id}`;
      title.textContent = `Candidate #${id}`;
      meta.textContent = "";
      content.replaceChildren(h("div", { class: "kf-empty", "data-waiting": id },
        `Candidate #${id} is not in this view yet; it shows as soon as the run reports it (the kernel is running a cell, so it cannot be asked for now).`));
      return;
    }
    const mine = ++latest;
    shownKey = `asking ${id}`;
    content.replaceChildren(h("div", { class: "kf-empty" }, "Loading…"));
    request(model, "candidate", { id }, 10000, `candidate #${id} is not in this view yet and the kernel did not answer within 10 s; it shows once the run reports it`)
      .then((got) => { if (mine === latest && model.get("candidate_id") === id) { shownKey = `${id}:asked`; show(got); } },
        (err) => { if (mine === latest) failed(err); });
  };
  model.on("change:candidate_id", () => { latest++; draw(); });
  model.on("change:details", draw);
  model.on("change:kernel_busy", () => { if (String(shownKey).startsWith("waiting")) { shownKey = undefined; draw(); } });
  draw();
}

// ------------------------------------------------------------------ run progress

// Pause / resume / stop: straight to the run's control channel (no kernel involved); where the
// browser cannot reach it (a remote kernel), through the kernel, which answers only when idle. What
// cannot work is said at once: a run that has ended, a kernel known to be running a cell.
const OVER = ["stopped", "finished", "failed"];

async function control(model, action) {
  const st = model.get("state");   // the run's, not what a click expects
  if (OVER.includes(st) || model.get("ended_at")) {
    throw new Error(`${action}: the run has already ${OVER.includes(st) ? st : "ended"}; there is nothing left to ${action}`);
  }
  const url = model.get("control_url");
  let why = "this view has no direct line to the run";
  if (url) {
    let res = null;
    try {
      res = await fetch(`${url}/${action}`, { method: "POST", body: action, cache: "no-store" });
    } catch (err) {
      res = null;  // not reachable from this browser: try the kernel
    }
    if (res) {
      const text = await res.text();
      if (!res.ok) throw new Error(`${action}: ${text}`);
      return text;
    }
    why = "the run's control channel is not reachable from this browser (is the kernel on another machine?)";
  }
  const todo = "interrupt the running cell (Kernel > Interrupt; the search goes on in its thread) and click again, " +
    `or call run.${action}() in a cell`;
  if (model.get("kernel_busy")) {
    throw new Error(`${action}: ${why}, and the kernel is running a cell, which holds the click until it ends: ${todo}`);
  }
  const reply = await request(model, "control", { action }, 4000,
    `${action}: ${why}, and the kernel did not answer within 4 s (busy, restarting or gone): ${todo}`);
  return reply.state;
}

function renderRunProgress(model, root) {
  const state = h("span");
  const counts = h("span", { class: "kf-muted kf-ellipsis" });
  const timing = h("span", { class: "kf-muted kf-timing" });
  const bar = h("div", { class: "kf-bar-fill" });
  const current = h("div", { class: "kf-muted kf-ellipsis" });
  const best = h("div", { class: "kf-best" });
  const notes = h("div", { class: "kf-notes" });
  const log = h("pre", { class: "kf-log kf-run-log" });
  const optimistic = { pause: "pausing", resume: "running", stop: "stopping" };
  // NB: what a click expects is shown at once but kept out of the model: a local model.set would
  // go to the kernel with the next save_changes (dismissing an error) and overwrite the run's state.
  let expected = null;
  const stateNow = () => expected || model.get("state");
  const button = (action, label) => h("button", {
    class: "kf-btn", "data-action": action,
    onclick: () => {
      expected = optimistic[action];   // the run's next state replaces it
      draw();
      control(model, action).then((st) => { if (st && ["paused", "stopped", "finished", "failed"].includes(st)) expected = st; draw(); },
        (err) => { expected = null; model.set("error", String(err.message || err)); draw(); });
    },
  }, label);
  const buttons = { pause: button("pause", "Pause"), resume: button("resume", "Resume"), stop: button("stop", "Stop") };
  root.append(h("div", { class: "kf-header" }, h("span", { class: "kf-title" }, "Optimization run"), state, counts,
    timing, Object.values(buttons)),
    h("div", { class: "kf-bar" }, bar), current, best, notes, log);
  let ticker = null;
  const drawTiming = () => {
    const started = model.get("started_at");
    if (!started) { timing.textContent = ""; return; }
    const ended = model.get("ended_at");
    const elapsed = (ended || Date.now() / 1000) - started;
    const done = model.get("done"), total = model.get("total");
    const rate = elapsed > 0 ? done / elapsed : 0;
    const parts = [`${fmt.dur(elapsed)} elapsed`];
    if (done > 0) parts.push(rate >= 1 ? `${rate.toFixed(1)} / s` : `${(60 * rate).toFixed(1)} / min`);
    if (!ended && rate > 0 && total > done) parts.push(`about ${fmt.dur((total - done) / rate)} left`);
    timing.textContent = parts.join(" · ");
  };
  const draw = () => {
    const st = stateNow();
    const done = model.get("done");
    const total = Math.max(1, model.get("total"));
    state.replaceChildren(pill(st === "running" ? "searching" : st));
    counts.textContent = `${done} evaluated of ${model.get("total")} · ${model.get("cards_done")} / ${model.get("cards_total")} cards` +
      (model.get("dollars") ? ` · ${fmt.usd(model.get("dollars"))}` : "");
    const over = ["stopped", "finished", "failed"].includes(st);
    // a finished run fills the bar; a stopped or failed one shows how far it got, in its own colour
    bar.style.width = `${st === "finished" ? 100 : Math.min(100, (100 * done) / total)}%`;
    bar.className = `kf-bar-fill kf-bar-${st}`;
    bar.parentElement.dataset.state = st;
    current.textContent = over ? "" : model.get("current") ? `searching ${model.get("current")}` : "";
    const entries = Object.entries(model.get("best"));
    best.replaceChildren(...entries.map(([key, v]) => h("span", { class: "kf-chip", title: key }, `${key} ${fmt.x(v)}`)));
    notes.replaceChildren(...model.get("notes").map((n) => h("div", { class: "kf-note" }, n)));
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 4;
    log.textContent = model.get("log").join("\n");
    if (atBottom) log.scrollTop = log.scrollHeight;   // the newest line stays in sight
    buttons.pause.disabled = over || st === "paused" || st === "pausing" || st === "stopping";
    buttons.resume.disabled = over || !(st === "paused" || st === "pausing");
    buttons.stop.disabled = over || st === "stopping";
    drawTiming();
    if (!over && model.get("started_at") && ticker === null) ticker = setInterval(drawTiming, 1000);
    if ((over || !root.isConnected) && ticker !== null && model.get("ended_at")) { clearInterval(ticker); ticker = null; }
  };
  model.on("change:state", () => { expected = null; });
  for (const name of ["state", "done", "total", "cards_done", "cards_total", "current", "best", "dollars", "log", "notes",
    "started_at", "ended_at", "control_url"]) {
    model.on(`change:${name}`, draw);
  }
  draw();
  return () => { if (ticker !== null) clearInterval(ticker); };
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
  let cleanup = null;
  try {
    cleanup = (VIEWS[kind] || ((m, r) => r.append(`unknown kforge view ${kind}`)))(model, root);
  } catch (err) {
    model.set("error", `front end: ${err.message || err}`);
    model.save_changes();
  }
  return () => { stop(); if (typeof cleanup === "function") cleanup(); };
}

export default { render };
