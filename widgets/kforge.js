// kforge notebook views: one plain ES module for every view; the Python side picks one with `_view`.
// Everything a view shows is in its traits, pushed by the kernel as the run produces it, so clicks
// never wait on a kernel that may be busy running a cell. The views of a dashboard share one selection
// model (a widget reference), moved here; the progress buttons post to the run's own control channel (127.0.0.1).
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
  pending: "#8c959f", winner: "#1a7f37", noisy: "#bf8700", eager: "#6e7781", searching: "#0969da", "not searched": "#8c959f",
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
  { key: "in_model_us", label: "in model", num: true, optional: true },
  { key: "judge_eager_us", label: "eager (judge)", num: true, optional: true },
  { key: "winner_speedup", label: "speedup", num: true },
  { key: "best_candidate", label: "best cand. (unconfirmed)", num: true, optional: true },
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

function renderCardTable(model, root, sel) {
  const head = h("thead");
  const body = h("tbody");
  const summary = h("span", { class: "kf-muted kf-ellipsis" });
  const follow = h("span", { class: "kf-follow" });
  const filters = h("div", { class: "kf-filters" });
  const wrap = h("div", { class: "kf-scroll kf-table-wrap", tabindex: "0", title: "↑ ↓ to move, Home / End" },
    h("table", { class: "kf-table" }, head, body));
  root.append(h("div", { class: "kf-header" }, h("span", { class: "kf-title" }, "Operator cards"), summary, follow),
    filters, wrap);
  watchWidth(root, 1000);
  const selects = h("span", { class: "kf-selects" });
  const input = h("input", { class: "kf-input", type: "search", placeholder: "filter: op, shape, key…",
    value: model.get("filter_text"), oninput: (ev) => { model.set("filter_text", ev.target.value); model.save_changes(); } });
  filters.append(selects, input);
  const setFilter = (name, v) => { model.set(name, v); model.save_changes(); };
  let visible = [];

  // NB: the selection is the dashboard's one model: its changes go to the kernel whole and in order
  const choose = (key, byUser) => {
    if (byUser && sel.get("follow_search")) sel.set("follow_search", false);
    sel.set("card_key", key);
    sel.save();
  };
  // the row followed, scrolled into the table's own box (never the page: the notebook must not jump as a run goes);
  // NB: a view drawn before it is in the page has no box yet: try again until it has
  let revealed = null;
  const reveal = (key, tries = 50) => {
    const row = body.querySelector(`tr[data-key="${CSS.escape(key)}"]`);
    if (!row || key !== sel.get("card_key")) return;
    if (!wrap.clientHeight) { if (tries > 0) setTimeout(() => reveal(key, tries - 1), 100); return; }
    const r = row.getBoundingClientRect(), w = wrap.getBoundingClientRect(), top = w.top + head.offsetHeight;
    if (r.top < top || r.bottom > w.bottom) wrap.scrollTop += r.top - top - (w.bottom - top - r.height) / 2;
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
    const selected = sel.get("card_key");
    body.replaceChildren(...rows.map((r) => h("tr", {
      class: r.key === selected ? "kf-selected" : "",
      "data-key": r.key, "data-op": r.op, "data-vendor": r.vendor || "-",
      onclick: () => choose(r.key, true),
    },
      h("td", { class: "kf-card-col", title: `${r.signature}\nkey ${r.key}` }, r.label),
      h("td", { class: "kf-num kf-optional" }, r.calls),
      h("td", { class: "kf-num" }, h("span", { class: "kf-share-track" },
        h("span", { class: "kf-share-bar", style: `width: ${Math.min(100, r.share * 100)}%` })), fmt.pct(r.share)),
      h("td", { class: "kf-num kf-optional" }, fmt.us(r.in_model_us || null)),
      h("td", { class: "kf-num kf-optional" }, fmt.us(r.judge_eager_us)),
      h("td", { class: `kf-num ${r.winner_speedup > 1 ? "kf-good" : ""}`,
        title: r.winner_speedup && r.speedup_low ? `${r.speedup_low.toFixed(2)}–${r.speedup_high.toFixed(2)}×` : "" },
        fmt.x(r.winner_speedup)),
      h("td", { class: "kf-num kf-optional kf-muted" }, fmt.x(r.best_candidate)),
      h("td", {}, pill(r.status)),
      h("td", { class: "kf-num" }, r.candidates || "–"),
      h("td", { class: "kf-num" }, fmt.usd(r.dollars)),
    )));
    if (!rows.length) body.append(h("tr", {}, h("td", { colspan: COLUMNS.length, class: "kf-empty" }, "No card matches the filter.")));
    const winners = all.filter((r) => r.status === "winner").length;
    const searched = all.filter((r) => r.status !== "not searched").length;
    summary.textContent = `${all.length} cards · ${searched} searched · ${winners} with a winner` +
      (rows.length < all.length ? ` · ${rows.length} shown` : "");
    if (sel.get("follow_search") && selected !== revealed) {
      revealed = selected;
      requestAnimationFrame(() => reveal(selected));
    }
    const searching = model.get("searching");
    follow.replaceChildren();
    if (sel.get("follow_search")) follow.append(h("span", { class: "kf-badge", "data-follow": "on" }, "following the search"));
    else if (searching) {
      follow.append(h("span", { class: "kf-badge", "data-follow": "off" }, "pinned"),
        h("button", { class: "kf-btn kf-small", "data-action": "follow", title: "show the card being searched",
          onclick: () => { sel.set("follow_search", true); choose(searching, false); } }, "Follow search"));
    }
  };
  // the card followed (being searched, else started last) changes: show it unless the user pinned a row
  model.on("change:followed", () => {
    const key = model.get("followed");
    if (sel.get("follow_search") && key && key !== sel.get("card_key")) choose(key, false);
  });
  model.on("change:searching", draw);
  wrap.addEventListener("keydown", (ev) => {
    if (!visible.length) return;
    const at = visible.findIndex((r) => r.key === sel.get("card_key"));
    const to = { ArrowDown: at + 1, ArrowUp: at - 1, Home: 0, End: visible.length - 1,
      PageDown: at + 10, PageUp: at - 10 }[ev.key];
    if (to === undefined) return;
    ev.preventDefault();
    const row = visible[Math.max(0, Math.min(visible.length - 1, to))];
    choose(row.key, true);
    requestAnimationFrame(() => body.querySelector(`tr[data-key="${row.key}"]`)?.scrollIntoView({ block: "nearest" }));
  });
  for (const name of ["rows", "sort_by", "sort_desc", "filter_status", "filter_op", "filter_vendor", "filter_text"]) {
    model.on(`change:${name}`, draw);
  }
  sel.on("change:follow_search", () => { revealed = null; });
  sel.on("change:card_key change:follow_search", draw);
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

function renderSearchTree(model, root, sel) {
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
    h("span", {}, h("i", { class: "kf-best-swatch" }), "path to the card's winner (else its fastest candidate timed faster than eager; none if none was)"),
    h("span", { class: "kf-muted" }, "×: each candidate's own timings over the judge's eager"));
  const empty = h("div", { class: "kf-empty" }, "No candidates for this card yet.");
  const box = h("div", { class: "kf-tree-box" }, svg, empty);
  root.append(h("div", { class: "kf-header" }, title, label, live, follow, fitBtn), box, legend);

  let view = null;      // current viewBox [x, y, w, h]; null: automatic
  let extent = [0, 0, 100, 100];
  let fitAll = false;   // the user asked to see everything, even small
  let lastCard = sel.get("card_key");
  const setView = (v) => { svg.setAttribute("viewBox", v.join(" ")); };
  const fit = () => { view = null; fitAll = true; draw(); };
  fitBtn.addEventListener("click", fit);

  const nodesOf = () => (model.get("trees")[sel.get("card_key")] || []).map((n) => ({ ...n }));
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
    if (sel.get("card_key") !== lastCard) { lastCard = sel.get("card_key"); view = null; fitAll = false; }
    const nodes = nodesOf();
    const best = new Set(model.get("best_paths")[sel.get("card_key")] || []);
    const selected = sel.get("candidate_id");
    const text = model.get("labels")[sel.get("card_key")] || sel.get("card_key");
    label.textContent = text;
    label.title = text;
    live.style.display = model.get("live") ? "" : "none";
    follow.replaceChildren();
    if (model.get("live")) {
      follow.append(sel.get("follow_newest") ? h("span", { class: "kf-badge", "data-follow": "on" }, "following newest")
        : h("button", { class: "kf-btn kf-small", "data-action": "follow", title: "select each new candidate as it comes",
          onclick: () => { sel.set({ follow_newest: true, candidate_id: newest() }); sel.save(); } },
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
      const r = n.score > 0 ? 6 + 6 * Math.min(Math.max(n.score, 0.25), 3) / 3 : 6;
      const color = STATUS_COLORS[n.status] || "#6e7781";
      const g = s("g", {
        class: `kf-node${n.id === selected ? " kf-node-selected" : ""}${best.has(n.id) ? " kf-node-best" : ""}`,
        transform: `translate(${x},${y})`, "data-id": n.id, "data-status": n.status,
      });
      const shade = n.score > 0 ? 0.35 + 0.65 * Math.min(n.score, 2) / 2 : 0.9;
      g.append(s("circle", { r: r + 4, class: "kf-halo" }));
      g.append(s("circle", {
        r, fill: color, "fill-opacity": n.status === "pending" ? 0.25 : shade, stroke: color,
        "stroke-dasharray": n.status === "pending" ? "3 2" : "none",
      }));
      const t = s("text", { y: r + 11, "text-anchor": "middle", class: "kf-node-label" });
      t.textContent = n.score > 0 ? `${n.score.toFixed(2)}×` : `#${n.id}`;
      g.append(t);
      const tip = s("title");
      tip.textContent = `#${n.id} ${n.status}${n.score > 0 ? ` ${n.score.toFixed(2)}× (candidate timing${n.winner ? "; the card's winner" : ""})` : ""}\n${n.strategy}\n${n.intent}`;
      g.append(tip);
      g.addEventListener("click", (ev) => {
        ev.stopPropagation();
        sel.set({ follow_newest: false, candidate_id: n.id });
        sel.save();
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
    if (sel.get("follow_newest")) {
      const id = newest();
      if (id !== null && id !== sel.get("candidate_id")) { sel.set("candidate_id", id); sel.save(); }
    }
    draw();
  });
  // another card: its best candidate (or newest), unless the selection already belongs to it
  // NB: in the same change as the card (this runs inside the table's set): the kernel never sees a
  // card with another card's candidate, and never has to correct one
  sel.on("change:card_key", () => {
    const nodes = nodesOf();
    if (!nodes.some((n) => n.id === sel.get("candidate_id"))) {
      const path = model.get("best_paths")[sel.get("card_key")] || [];
      sel.set("candidate_id", path.length ? path[path.length - 1] : newest());
      sel.save();
    }
    draw();
  });
  for (const name of ["best_paths", "labels", "live"]) model.on(`change:${name}`, draw);
  sel.on("change:candidate_id change:follow_newest", draw);
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
  // NB: of the memory bandwidth measured on the device: above 100% the sets were read from a cache, not memory
  add("roofline", ev.roofline_fraction !== null ? fmt.pct(ev.roofline_fraction)
    + (ev.roofline_fraction > 1 ? " of the measured memory bandwidth: its data came from a cache" : "") : null);
  add("max abs error", ev.max_abs_error !== null ? ev.max_abs_error.toExponential(2) : null);
  add("max rel error", ev.max_rel_error !== null ? ev.max_rel_error.toExponential(2) : null);
  add("checks", ev.checks.length ? ev.checks.join(" · ") : null);
  add("compile / total", `${ev.compile_s.toFixed(2)} s / ${ev.wall_s.toFixed(2)} s`);
  return h("div", {}, h("div", { class: "kf-verdict" }, pill(ev.status), h("span", {}, ev.message)),
    h("table", { class: "kf-kv" }, h("tbody", {}, rows)));
}

function renderSourceView(model, root, sel) {
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
    const id = sel.get("candidate_id");
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
      .then((got) => { if (mine === latest && sel.get("candidate_id") === id) { shownKey = `${id}:asked`; show(got); } },
        (err) => { if (mine === latest) failed(err); });
  };
  sel.on("change:candidate_id", () => { latest++; draw(); });
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
    const done = model.get("done"), etaAt = model.get("eta_at");
    const rate = elapsed > 0 ? done / elapsed : 0;
    const parts = [`${fmt.dur(elapsed)} elapsed`];
    if (done > 0) parts.push(rate >= 1 ? `${rate.toFixed(1)} / s` : `${(60 * rate).toFixed(1)} / min`);
    // the ETA is the kernel's (kforge.search.Progress): none until enough of the run is done for a rate to mean something
    if (!ended) parts.push(etaAt ? `about ${fmt.dur(Math.max(0, etaAt - Date.now() / 1000))} left` : "ETA —");
    timing.textContent = parts.join(" · ");
  };
  const draw = () => {
    const st = stateNow();
    const done = model.get("done");
    const total = Math.max(1, model.get("total"));
    state.replaceChildren(pill(st === "running" ? "searching" : st));
    const failures = model.get("failures");
    counts.textContent = `${model.get("evaluated")} evaluated` + (failures ? `, ${failures} proposer failure${failures === 1 ? "" : "s"}` : "") +
      ` · ${done} of ${model.get("total")} budget units · ${model.get("cards_done")} / ${model.get("cards_total")} cards` +
      (model.get("dollars") ? ` · ${fmt.usd(model.get("dollars"))}` : "");
    const over = ["stopped", "finished", "failed"].includes(st);
    // a finished run fills the bar; a stopped or failed one shows how far it got, in its own colour
    bar.style.width = `${st === "finished" ? 100 : Math.min(100, (100 * done) / total)}%`;
    bar.className = `kf-bar-fill kf-bar-${st}`;
    bar.parentElement.dataset.state = st;
    current.textContent = over ? "" : model.get("current") ? `searching ${model.get("current")}` : "";
    const entries = Object.entries(model.get("best"));
    const trying = Object.entries(model.get("best_candidates") || {});
    best.replaceChildren(...entries.map(([key, v]) => h("span", { class: "kf-chip", title: `${key}: the card's speedup (winner)` }, `${key} ${fmt.x(v)}`)),
      ...trying.map(([key, v]) => h("span", { class: "kf-chip kf-muted", title: `${key}: best candidate so far, one timing, unconfirmed` },
        `${key} ${fmt.x(v)} (candidate)`)));
    notes.replaceChildren(...model.get("notes").map((n) => h("div", { class: "kf-note" }, n)));
    const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 4;
    log.textContent = model.get("log").join("\n");
    if (atBottom) log.scrollTop = log.scrollHeight;   // the newest line stays in sight
    buttons.pause.disabled = over || st === "paused" || st === "pausing" || st === "stopping";
    buttons.resume.disabled = over || !(st === "paused" || st === "pausing");
    buttons.stop.disabled = over || st === "stopping";
    if (root.classList.contains("kf-gone")) Object.values(buttons).forEach((b) => { b.disabled = true; });
    drawTiming();
    if (!over && model.get("started_at") && ticker === null) ticker = setInterval(drawTiming, 1000);
    if ((over || !root.isConnected) && ticker !== null && model.get("ended_at")) { clearInterval(ticker); ticker = null; }
  };
  model.on("change:state", () => { expected = null; });
  root.addEventListener("kf-gone", draw);
  for (const name of ["state", "done", "total", "evaluated", "failures", "eta_at", "cards_done", "cards_total", "current", "best", "best_candidates", "dollars", "log", "notes",
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

// The dashboard's one selection model (a widget reference): every view reads and writes it. Its
// changes go to the kernel whole, in the order made; a saved view (no kernel) keeps them here.
async function selectionOf(model, ctx) {
  const ref = model.get("selection");
  if (!ref) return null;
  const raw = typeof ref === "string" ? await model.widget_manager.get_model(ref.replace(/^IPY_MODEL_/, "")) : ref;
  return {
    raw,
    get: (name) => raw.get(name),
    set: (...args) => raw.set(...args),
    save: () => raw.save_changes(),   // NB: a no-op where the kernel is gone
    on: (names, fn) => raw.on(names, fn, ctx),
  };
}

// A view whose kernel is gone (restarted, shut down, or the notebook reopened with a new one) keeps
// the state it had: it says so, and its buttons rest.
function kernelBanner(model, root, sel, cleanups) {
  const banner = h("div", { class: "kf-gone", role: "status" });
  banner.style.display = "none";
  const wm = model.widget_manager;
  const mine = model.get("kernel_id");
  let gone = false;
  const mark = (why) => {
    if (gone) return;
    gone = true;
    banner.textContent = `${why}: this view shows the state it had when it was saved or its kernel stopped; ` +
      "run the cell again for a live view.";
    banner.style.display = "";
    root.classList.add("kf-gone");
    root.dispatchEvent(new Event("kf-gone"));
  };
  const check = () => {
    if (sel && sel.raw.comm_live === false) return mark("Its kernel is gone");
    if (!wm || !("kernel" in wm) || !mine) return;   // a front end that cannot tell
    const k = wm.kernel;
    if (!k) return mark("No kernel");
    if (k.id !== mine) return mark("Its kernel is gone (the notebook runs another one now)");
    if (["restarting", "autorestarting", "dead"].includes(k.status)) return mark("Its kernel restarted");
  };
  if (sel) sel.on("comm_live_update", check);
  const k = wm && "kernel" in wm ? wm.kernel : null;
  if (k && k.statusChanged) {
    k.statusChanged.connect(check);
    cleanups.push(() => k.statusChanged.disconnect(check));
  }
  check();
  return banner;
}

// JupyterLab saves no widget state by default: a trusted notebook reopened with a fresh kernel showed
// "model not found" for every view. A notebook showing kforge views keeps, in its metadata, the state
// of the widgets its outputs show (what Settings > Save Widget State Automatically does, for those
// only); JupyterLab restores them from there on any reopen. NB: JupyterLab's document context, which
// its widget manager exposes; other front ends keep the static snapshots.
const VIEW_MIME = "application/vnd.jupyter.widget-view+json";
const STATE_MIME = "application/vnd.jupyter.widget-state+json";
const keepers = new WeakMap();

function shownModels(notebook) {
  const ids = [];
  const cells = notebook.cells;
  for (let i = 0; cells && i < cells.length; i++) {
    const outputs = cells.get(i).outputs;
    for (let k = 0; outputs && k < outputs.length; k++) {
      const view = (outputs.get(k).data || {})[VIEW_MIME];
      if (view && view.model_id) ids.push(view.model_id);
    }
  }
  return ids;
}

function stateKeeper(model) {
  const wm = model.widget_manager;
  const context = wm && wm.context;
  if (!context || !context.saveState || !context.model || typeof wm.get_state !== "function") return () => {};
  if (keepers.has(wm)) return keepers.get(wm);
  let latest = null, timer = null;
  // NB: saving is synchronous and the state is not: keep it current, a moment after each change
  const refresh = () => {
    clearTimeout(timer);
    timer = setTimeout(() => wm.get_state({ drop_defaults: true }).then((st) => { latest = st; }, () => {}), 250);
  };
  context.saveState.connect((_, phase) => {
    if (phase !== "started" || !latest) return;
    const keep = {};
    const visit = (id) => {
      if (keep[id] || !latest.state[id]) return;
      keep[id] = latest.state[id];
      for (const m of JSON.stringify(keep[id].state).matchAll(/IPY_MODEL_([\w-]+)/g)) visit(m[1]);
    };
    shownModels(context.model).forEach(visit);
    if (!Object.keys(keep).length) return;
    const value = { [STATE_MIME]: { ...latest, state: keep } };
    if (context.model.setMetadata) context.model.setMetadata("widgets", value);
    else context.model.metadata.set("widgets", value);
  });
  context.model.contentChanged.connect(refresh);
  setInterval(refresh, 3000);   // widgets that are not kforge's (charts) change too
  keepers.set(wm, refresh);
  refresh();
  return refresh;
}

async function render({ model, el }) {
  const stop = listen(model);
  const kind = model.get("_view");
  const root = h("div", { class: `kf-view kf-${kind.replace("_", "-")}` });
  el.append(root);
  root.append(errorBanner(model));
  const ctx = {};
  const cleanups = [];
  let sel = null;
  try {
    sel = await selectionOf(model, ctx);
    root.append(kernelBanner(model, root, sel, cleanups));
    const keep = stateKeeper(model);
    model.on("change", keep);
    if (sel) sel.on("change", keep);
    cleanups.push((VIEWS[kind] || ((m, r) => r.append(`unknown kforge view ${kind}`)))(model, root, sel));
  } catch (err) {
    model.set("error", `front end: ${err.message || err}`);
    model.save_changes();
  }
  return () => {
    stop();
    if (sel) sel.raw.off(null, null, ctx);
    for (const fn of cleanups) if (typeof fn === "function") fn();
  };
}

export default { render };
