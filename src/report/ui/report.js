"use strict";
(function () {
  const loadStart = performance.now();
  const $ = (id) => document.getElementById(id);
  // Builds an element; children that are strings become text nodes, so trace text is never parsed as markup.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    if (attrs) for (const k of Object.keys(attrs)) {
      if (k === "class") e.className = attrs[k]; else if (k === "style") e.style.cssText = attrs[k];
      else e.setAttribute(k, attrs[k]);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  let D;
  try {
    D = JSON.parse($("rv-data").textContent);
  } catch (err) {
    document.body.appendChild(el("div", { id: "error" }, "The report's data could not be read: " + err));
    return;
  }
  const N = D.names;
  const stateIdx = (name) => N.state.indexOf(name);
  const S = { running: stateIdx("running"), wants: stateIdx("wants_gvl"), released: stateIdx("released"),
              gc: stateIdx("gc"), unknown: stateIdx("unknown"), notStarted: stateIdx("not_started"),
              exited: stateIdx("exited") };
  const PROV = { observed: N.prov.indexOf("observed"), derived: N.prov.indexOf("derived"),
                 inferred: N.prov.indexOf("inferred") };
  const EV = Object.fromEntries(N.event.map((n, i) => [n, i]));

  // ---- decoding: packed columns -> typed arrays ------------------------------------------------------------------
  function undelta(a) {
    const r = new Float64Array(a.length);
    let v = 0;
    for (let i = 0; i < a.length; i++) { v += a[i]; r[i] = v; }
    return r;
  }
  function ints(a) { return Int32Array.from(a); }
  // Optional values are stored as value + 1 (0 = none): back to value, -1 for none.
  function minusOne(a) { const r = new Int32Array(a.length); for (let i = 0; i < a.length; i++) r[i] = a[i] - 1; return r; }
  function spans(c) {
    const s = undelta(c.s), e = new Float64Array(s.length);
    for (let i = 0; i < s.length; i++) e[i] = s[i] + c.d[i];
    return { n: s.length, s, e };
  }
  function refs(a) { const u = undelta(a); const r = new Int32Array(u.length); for (let i = 0; i < u.length; i++) r[i] = u[i] - 1; return r; }

  const events = {
    n: D.events.t.length, t: undelta(D.events.t), e: Uint8Array.from(D.events.e), th: minusOne(D.events.th),
    nt: minusOne(D.events.nt), pt: minusOne(D.events.pt), pv: Uint8Array.from(D.events.pv), src: ints(D.events.src),
  };
  const extra = new Map(D.extra.map(([i, x]) => [i, x]));
  // Stacks: a dictionary of the stacks the events use (leaf first), their frames and the frames' paths.
  const FR = D.frames || { l: [], p: [], ln: [], k: [] };
  const PATHS = D.paths || [], REASONS = D.reasons || [];
  const STK = D.stacks || { n: [], f: [] };
  const stackOff = new Int32Array(STK.n.length + 1);
  for (let k = 0; k < STK.n.length; k++) stackOff[k + 1] = stackOff[k] + STK.n[k];
  const stackFrames = Int32Array.from(STK.f);
  events.sk = D.events.sk ? minusOne(D.events.sk) : null;
  events.rr = D.events.rr ? minusOne(D.events.rr) : null;
  events.rp = D.events.rp ? Uint8Array.from(D.events.rp) : null;
  const stackOfEvent = (ei) => (events.sk && ei >= 0 && ei < events.n ? events.sk[ei] : -1);
  // Endpoints (model/endpoint.h, derived by rvbpfd from each stack: the Rails action, job class or Sinatra route it is
  // in); ENDPOINTS[0] is "-" (none). endpointSel: the endpoint filter's choice, -1 for all.
  const ENDPOINTS = D.endpoints || ["-"], ENDPOINT_RULES = D.endpoint_rules || ["none"];
  const stackEndpoint = STK.e ? Int32Array.from(STK.e) : null;
  const endpointOfStack = (s) => (stackEndpoint && s >= 0 && s < stackEndpoint.length ? stackEndpoint[s] : 0);
  let endpointSel = -1;
  const endpointNote = () => (endpointSel >= 0 ? ` in endpoint ${ENDPOINTS[endpointSel]}` : "");
  // The release reason a gvl_released carries ({reason, prov}), or null.
  function releaseReasonOf(ei) {
    if (!events.rr || ei < 0 || ei >= events.n || events.rr[ei] < 0) return null;
    return { reason: REASONS[events.rr[ei]], prov: N.prov[events.rp[ei]] };
  }
  // "label (path:line)"; without the path or line when the frame has none.
  function frameText(f) {
    const path = PATHS[FR.p[f]] || "", line = FR.ln[f];
    return FR.l[f] + (path ? ` (${path}${line > 0 ? ":" + line : ""})` : line > 0 ? ` (line ${line})` : "");
  }
  const leafLabel = (s) => (stackOff[s + 1] > stackOff[s] ? FR.l[stackFrames[stackOff[s]]] : "(empty stack)");
  const threads = D.threads.map((t) => {
    const b = t.blocks, sp = spans(b);
    return Object.assign(sp, { id: t.id, label: t.label, main: t.main, tids: t.tids, nsTid: t.ns_tid, totals: t.totals,
      st: Uint8Array.from(b.st), rs: Uint8Array.from(b.rs), pv: Uint8Array.from(b.pv), ru: Uint8Array.from(b.ru),
      o: refs(b.o), c: refs(b.c), nt: minusOne(b.nt), rp: ints(b.rp), rw: minusOne(b.rw), markers: [] });
  });
  // Each block's endpoint, as rvbpfd's Perfetto export gives it: its opening event's stack's, else its closing
  // event's, else the thread's latest before it (a GVL wait: the endpoint the thread released the lock in).
  for (const t of threads) {
    t.ep = new Int32Array(t.n);
    let latest = 0;
    for (let i = 0; i < t.n; i++) {
      const so = stackOfEvent(t.o[i]), sc = stackOfEvent(t.c[i]);
      if (so >= 0) latest = endpointOfStack(so); else if (sc >= 0) latest = endpointOfStack(sc);
      t.ep[i] = latest;
    }
  }
  const threadById = new Map(threads.map((t) => [t.id, t]));
  const owner = Object.assign(spans(D.owner), { k: Uint8Array.from(D.owner.k), ow: minusOne(D.owner.ow),
    pv: Uint8Array.from(D.owner.pv), ru: Uint8Array.from(D.owner.ru), en: Uint8Array.from(D.owner.en),
    o: refs(D.owner.o), c: refs(D.owner.c) });
  const gc = Object.assign(spans(D.gc), { th: minusOne(D.gc.th), tp: Uint8Array.from(D.gc.tp), ok: Uint8Array.from(D.gc.ok),
    o: refs(D.gc.o), c: refs(D.gc.c) });
  const unknown = Object.assign(spans(D.unknown), { ru: Uint8Array.from(D.unknown.ru), ev: minusOne(D.unknown.ev), n: D.unknown.n });
  const natives = D.native.map((n) => Object.assign(spans(n.spans), { tid: n.tid, threads: n.threads,
    th: ints(n.spans.th), pv: Uint8Array.from(n.spans.pv) }));
  const markers = { n: D.markers.t.length, t: undelta(D.markers.t), e: Uint8Array.from(D.markers.e),
                    th: minusOne(D.markers.th), ev: undelta(D.markers.ev) };
  // Per-lane marker lists (indexes into `markers`), in time order.
  const globalMarkers = [];
  for (let i = 0; i < markers.n; i++) {
    const name = N.event[markers.e[i]];
    if ((name === "sleep_enter" || name === "mutex_lock_enter") && threadById.has(markers.th[i])) {
      threadById.get(markers.th[i]).markers.push(i);
    } else {
      globalMarkers.push(i);
    }
  }
  for (const t of threads) t.markerT = Float64Array.from(t.markers, (i) => markers.t[i]);
  const globalMarkerT = Float64Array.from(globalMarkers, (i) => markers.t[i]);

  const M = D.meta;
  const T0 = M.start_ns, T1 = Math.max(M.end_ns, M.start_ns + 1000);
  const threadLabel = (id) => { const t = threadById.get(id); return t ? t.label : "Thread #" + id; };

  // ---- formatting ------------------------------------------------------------------------------------------------
  function ms(t, digits) { return (t / 1e6).toFixed(digits === undefined ? 6 : digits); }
  function dur(ns) {
    if (ns >= 1e9) return (ns / 1e9).toFixed(3) + " s";
    if (ns >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
    if (ns >= 1e3) return (ns / 1e3).toFixed(3) + " µs";
    return Math.round(ns) + " ns";
  }

  // ---- colours ---------------------------------------------------------------------------------------------------
  const STATE_COLOR = { running: "#2e9d4f", wants_gvl: "#e8a33a", released: "#a7b6c8", gc: "#8e44ad",
                        not_started: null, exited: null, unknown: "#c9c9c9" };
  const REASON_COLOR = { sleeping: "#5b86c5", waiting_mutex: "#d35454", starting: "#cfd8e3", preempted: "#e07b2a",
                         io: "#7aa6a1", queue: "#b08fc7", condition_variable: "#c79fb8", join: "#9aa36b",
                         pass: "#c4b16a", process_wait: "#8f9bb3", timeslice: "#d99a5b", exit: "#b5b5b5",
                         idle: "#dde3ea", db_pool: "#c7797a" };
  function blockColor(t, i) {
    const st = N.state[t.st[i]];
    if ((st === "released" || st === "wants_gvl") && REASON_COLOR[N.reason[t.rs[i]]]) return REASON_COLOR[N.reason[t.rs[i]]];
    return STATE_COLOR[st];
  }
  // A colour per Ruby thread (owner lane, native view), spread around the hue circle by the golden angle.
  const threadColor = new Map();
  threads.forEach((t, k) => threadColor.set(t.id, `hsl(${Math.round((k * 137.508 + 200) % 360)}, 55%, 52%)`));
  const colorOfThread = (id) => threadColor.get(id) || "#888";

  // ---- lanes -----------------------------------------------------------------------------------------------------
  const AXIS_H = 26;
  const lanes = [];  // {id, kind, label, sub, y, h, ...}
  let y = AXIS_H;
  function addLane(lane) { lane.y = y; y += lane.h; lanes.push(lane); return lane; }
  addLane({ id: "gvl-owner", kind: "owner", label: "GVL owner", sub: "idle drawn", h: 24 });
  addLane({ id: "gc", kind: "gc", label: "GC", h: 14 });
  addLane({ id: "markers", kind: "markers", label: "lost / paused", h: 14 });
  addLane({ id: "section-threads", kind: "section", label: "Ruby threads", h: 18 });
  for (const t of threads) {
    addLane({ id: "thread-" + t.id, kind: "thread", label: t.label,
             sub: "id " + t.id + (t.nsTid !== undefined ? " · ns tid " + t.nsTid : ""), h: 24, thread: t });
  }
  addLane({ id: "section-native", kind: "section", label: "Native threads", sub: "Ruby threads run", h: 18 });
  for (const n of natives) {
    addLane({ id: "native-" + n.tid, kind: "native", label: "tid " + n.tid,
              sub: n.threads.map((id) => threadLabel(id).replace("Thread #", "T")).join(", "), h: 16, native: n });
  }
  const TOTAL_H = y + 6;
  const laneById = new Map(lanes.map((l) => [l.id, l]));

  // ---- static DOM: title, meta, legend, labels, summary ------------------------------------------------------------
  document.title = (M.title ? M.title + " · " : "") + "rvbpfd report";
  $("title").textContent = M.title || "rvbpfd report";
  $("meta").textContent = `Ruby ${M.ruby_version || "?"} · pid ${M.pid} · ${M.event_count} events · ` +
      `${threads.length} Ruby threads · ${natives.length} native threads · ${dur(T1 - T0)}` +
      (M.unattributed_events ? ` · ${M.unattributed_events} events not attributed to a thread` : "");
  const legend = $("legend");
  const sw = (color, cls, text) => el("span", null, el("span", { class: "swatch " + (cls || ""), style: "background-color:" + color }), text);
  legend.append(sw(STATE_COLOR.running, "", "running (holds the GVL)"), sw(STATE_COLOR.wants_gvl, "", "wants GVL"),
      sw(REASON_COLOR.preempted, "derived", "preempted (3.2)"), sw(STATE_COLOR.released, "", "released"),
      sw(REASON_COLOR.sleeping, "derived", "sleeping"), sw(REASON_COLOR.waiting_mutex, "derived", "waiting mutex"),
      sw(REASON_COLOR.idle, "derived", "idle (waiting for work)"),
      sw(STATE_COLOR.gc, "", "GC"), sw("#eef0f3", "", "GVL idle"), sw("#c9c9c9", "derived", "unknown (lost / paused)"),
      sw("#999", "derived", "derived: hatched, dashed"), sw("#999", "inferred", "inferred: faded"));
  const labels = $("labels");
  labels.style.height = TOTAL_H + "px";
  for (const l of lanes) {
    const d = el("div", { class: "lane-label" + (l.kind === "section" ? " section" : ""), "data-lane": l.id,
                          style: `top:${l.y}px;height:${l.h}px` }, l.label, l.sub ? el("small", null, l.sub) : null);
    labels.appendChild(d);
  }
  (function summary() {
    const head = el("tr", null, el("th", null, "Ruby thread"), el("th", null, "native tids"),
        ...["running", "wants_gvl", "released", "gc", "unknown"].map((s) => el("th", null, s)),
        el("th", null, "waits"), el("th", null, "longest wait"), el("th", null, "top release reason"));
    const rows = threads.map((t) => {
      const tot = t.totals, top = tot.reasons[0];
      return el("tr", null, el("td", null, t.label),
          el("td", null, t.tids.join(", ") + (t.nsTid !== undefined ? ` (ns ${t.nsTid})` : "")),
          ...["running", "wants_gvl", "released", "gc", "unknown"].map((s) => el("td", null, dur(tot.state_ns[stateIdx(s)]))),
          el("td", null, String(tot.waits)), el("td", null, dur(tot.wait_longest_ns)),
          el("td", null, top ? `${N.reason[top[0]]} (${dur(top[1])}, ${top[2]}x)` : "-"));
    });
    $("summary").append(el("table", null, el("thead", null, head), el("tbody", null, ...rows)));
    $("notes").textContent = (M.samples ? "" : "Flame graph: this trace has no CPU samples, so none is shown. ") +
        "Wheel or +/- zooms, drag or arrow keys pan, click a block for its card.";
  })();

  // ---- canvas and view -------------------------------------------------------------------------------------------
  const canvas = $("canvas"), overlay = $("overlay"), plot = $("plot"), tooltip = $("tooltip");
  const ctx = canvas.getContext("2d"), octx = overlay.getContext("2d");
  let W = 800, dpr = 1;
  const view = { t0: T0, t1: T1 };
  const MIN_SPAN = 1000;  // ns: the narrowest view, one microsecond across the plot
  let cursorT = null;     // ns, or null when the mouse is not over the plot
  const drawn = { owner: [] };  // rects of the owner lane in the last frame, for tests: [x0, x1, ownerId or -1]

  function resize() {
    dpr = window.devicePixelRatio || 1;
    W = Math.max(200, Math.floor(plot.clientWidth));
    for (const c of [canvas, overlay]) {
      c.width = Math.floor(W * dpr); c.height = Math.floor(TOTAL_H * dpr);
      c.style.width = W + "px"; c.style.height = TOTAL_H + "px";
    }
    plot.style.height = TOTAL_H + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0); octx.setTransform(dpr, 0, 0, dpr, 0, 0);
    requestDraw();
  }
  const X = (t) => (t - view.t0) / (view.t1 - view.t0) * W;
  const Tx = (x) => view.t0 + x / W * (view.t1 - view.t0);

  function setView(t0, t1) {
    let span = Math.max(MIN_SPAN, t1 - t0);
    const full = T1 - T0;
    if (span >= full) { t0 = T0; span = full; }
    t0 = Math.min(Math.max(t0, T0), T1 - span);
    view.t0 = t0; view.t1 = t0 + span;
    const r = $("range");
    r.dataset.startNs = String(Math.round(view.t0)); r.dataset.endNs = String(Math.round(view.t1));
    r.textContent = `${ms(view.t0, 3)} – ${ms(view.t1, 3)} ms (${dur(view.t1 - view.t0)} visible)`;
    requestDraw();
  }
  function zoomAt(factor, atT) {
    const t = atT === undefined ? (view.t0 + view.t1) / 2 : atT;
    setView(t - (t - view.t0) * factor, t + (view.t1 - t) * factor);
  }
  function pan(fraction) { const d = (view.t1 - view.t0) * fraction; setView(view.t0 + d, view.t1 + d); }

  // First index with arr[i] > v (arr sorted ascending).
  function upper(arr, v, n) { let lo = 0, hi = n; while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] <= v) lo = m + 1; else hi = m; } return lo; }
  function lower(arr, v, n) { let lo = 0, hi = n; while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < v) lo = m + 1; else hi = m; } return lo; }

  // Hatching for derived blocks and unknown windows: a small repeating pattern.
  function makeHatch(color, bg) {
    const c = document.createElement("canvas"); c.width = 6; c.height = 6;
    const g = c.getContext("2d");
    if (bg) { g.fillStyle = bg; g.fillRect(0, 0, 6, 6); }
    g.strokeStyle = color; g.lineWidth = 1.5;
    g.beginPath(); g.moveTo(-1, 7); g.lineTo(7, -1); g.moveTo(5, 7); g.lineTo(7, 5); g.moveTo(-1, 1); g.lineTo(1, -1); g.stroke();
    return ctx.createPattern(c, "repeat");
  }
  const HATCH_DERIVED = makeHatch("rgba(255,255,255,0.65)");
  const HATCH_UNKNOWN = makeHatch("rgba(200,40,40,0.35)");
  const HATCH_PAUSED = makeHatch("rgba(90,90,90,0.35)");

  // Visits the spans of `sp` that intersect the view, at most about one per pixel column: a span narrower than a
  // pixel is drawn one pixel wide and the spans starting inside that pixel are skipped by binary search. Drawn
  // rects never overlap (each starts at or after the previous one's right edge). fn(i, x0, x1) draws span i.
  function visitSpans(sp, fn) {
    const n = sp.n;
    if (n === 0) return;
    let i = upper(sp.e, view.t0, n);
    if (i > 0 && sp.e[i - 1] > view.t0) i--;
    let xMin = -1;
    while (i < n && sp.s[i] < view.t1) {
      let x0 = Math.max(X(sp.s[i]), xMin, 0), x1 = Math.min(X(sp.e[i]), W);
      if (x1 - x0 < 1) {
        x0 = Math.max(Math.floor(x0), xMin); x1 = x0 + 1;
        if (x1 > xMin && x0 < W) { fn(i, x0, x1); xMin = x1; }
        const j = upper(sp.s, Tx(x1), n) - 1;  // the span covering the next pixel column (may be long)
        i = Math.max(i + 1, j);
        continue;
      }
      if (x1 > x0) { fn(i, x0, x1); xMin = x1; }
      i++;
    }
  }

  let drawPending = false;
  function requestDraw() { if (!drawPending) { drawPending = true; requestAnimationFrame(draw); } }

  function drawAxis() {
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, W, AXIS_H);
    const span = view.t1 - view.t0;
    const raw = span / Math.max(1, W / 110);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const step = [1, 2, 5, 10].map((k) => k * p).find((s) => s >= raw);
    const digits = Math.max(0, Math.min(6, Math.ceil(-Math.log10(step / 1e6))));
    ctx.strokeStyle = "#e4e7ec"; ctx.fillStyle = "#59616d"; ctx.font = "11px ui-monospace, monospace"; ctx.textBaseline = "middle";
    ctx.beginPath();
    for (let t = Math.ceil(view.t0 / step) * step; t <= view.t1; t += step) {
      const x = Math.round(X(t)) + 0.5;
      ctx.moveTo(x, AXIS_H - 6); ctx.lineTo(x, TOTAL_H);
      ctx.fillText(ms(t, digits) + " ms", x + 3, AXIS_H / 2);
    }
    ctx.stroke();
  }

  function drawThreadLane(l) {
    const t = l.thread, top = l.y + 3, h = l.h - 6;
    visitSpans(t, (i, x0, x1) => {
      const color = blockColor(t, i);
      if (!color) { ctx.fillStyle = "#e9ecf0"; ctx.fillRect(x0, top + h / 2, x1 - x0, 1); return; }
      const prov = t.pv[i];
      // The endpoint filter dims the blocks of every other endpoint.
      ctx.globalAlpha = (prov === PROV.inferred ? 0.4 : 1) * (endpointSel >= 0 && t.ep[i] !== endpointSel ? 0.15 : 1);
      ctx.fillStyle = color; ctx.fillRect(x0, top, x1 - x0, h);
      if (t.st[i] === S.unknown) { ctx.fillStyle = HATCH_UNKNOWN; ctx.fillRect(x0, top, x1 - x0, h); }
      else if (prov === PROV.derived && x1 - x0 >= 3) {
        ctx.fillStyle = HATCH_DERIVED; ctx.fillRect(x0, top, x1 - x0, h);
        ctx.setLineDash([3, 2]); ctx.strokeStyle = "rgba(0,0,0,.55)"; ctx.strokeRect(x0 + 0.5, top + 0.5, x1 - x0 - 1, h - 1); ctx.setLineDash([]);
      } else if (prov === PROV.inferred && x1 - x0 >= 3) {
        ctx.setLineDash([1, 2]); ctx.strokeStyle = "rgba(0,0,0,.6)"; ctx.strokeRect(x0 + 0.5, top + 0.5, x1 - x0 - 1, h - 1); ctx.setLineDash([]);
      }
      ctx.globalAlpha = 1;
      if (x1 - x0 > 70) {
        ctx.fillStyle = "rgba(0,0,0,.75)"; ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
        const st = N.state[t.st[i]], rs = N.reason[t.rs[i]];
        const text = (st === "released" || st === "wants_gvl") && rs !== "unknown" ? st + ": " + rs : st;
        ctx.save(); ctx.beginPath(); ctx.rect(x0, top, x1 - x0, h); ctx.clip();
        ctx.fillText(text, x0 + 4, top + h / 2); ctx.restore();
      }
    });
    // Probe markers: small triangles on top of the lane (sleep blue, mutex red).
    const a = lower(t.markerT, view.t0, t.markerT.length), b = upper(t.markerT, view.t1, t.markerT.length);
    let lastX = -10;
    for (let k = a; k < b; k++) {
      const x = X(t.markerT[k]);
      if (x - lastX < 2) continue;
      lastX = x;
      const name = N.event[markers.e[t.markers[k]]];
      ctx.fillStyle = name === "sleep_enter" ? "#1f4f99" : "#a01919";
      ctx.beginPath(); ctx.moveTo(x - 3.5, l.y); ctx.lineTo(x + 3.5, l.y); ctx.lineTo(x, l.y + 6); ctx.fill();
    }
  }

  function drawOwnerLane(l) {
    const top = l.y + 3, h = l.h - 6;
    drawn.owner = [];
    visitSpans(owner, (i, x0, x1) => {
      const kind = N.owner_kind[owner.k[i]];
      drawn.owner.push([x0, x1, kind === "owned" ? owner.ow[i] : -1]);
      if (kind === "owned") ctx.fillStyle = colorOfThread(owner.ow[i]);
      else if (kind === "idle") ctx.fillStyle = "#eef0f3";
      else ctx.fillStyle = HATCH_UNKNOWN;
      ctx.fillRect(x0, top, x1 - x0, h);
      if (kind === "owned" && x1 - x0 > 50) {
        ctx.fillStyle = "#fff"; ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
        ctx.save(); ctx.beginPath(); ctx.rect(x0, top, x1 - x0, h); ctx.clip();
        ctx.fillText(threadLabel(owner.ow[i]), x0 + 4, top + h / 2); ctx.restore();
      } else if (kind === "idle" && x1 - x0 > 40) {
        ctx.fillStyle = "#8a93a0"; ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "middle";
        ctx.save(); ctx.beginPath(); ctx.rect(x0, top, x1 - x0, h); ctx.clip();
        ctx.fillText("idle", x0 + 4, top + h / 2); ctx.restore();
      }
    });
  }

  function drawGcLane(l) {
    visitSpans(gc, (i, x0, x1) => {
      ctx.fillStyle = STATE_COLOR.gc; ctx.globalAlpha = gc.ok[i] ? 1 : 0.5;
      ctx.fillRect(x0, l.y + 2, x1 - x0, l.h - 4); ctx.globalAlpha = 1;
    });
  }

  function drawNativeLane(l) {
    const n = l.native;
    visitSpans(n, (i, x0, x1) => {
      ctx.fillStyle = colorOfThread(n.th[i]); ctx.globalAlpha = n.pv[i] === PROV.observed ? 1 : 0.6;
      ctx.fillRect(x0, l.y + 2, x1 - x0, l.h - 4); ctx.globalAlpha = 1;
      if (x1 - x0 > 40) {
        ctx.fillStyle = "#fff"; ctx.font = "10px system-ui, sans-serif"; ctx.textBaseline = "middle";
        ctx.save(); ctx.beginPath(); ctx.rect(x0, l.y, x1 - x0, l.h); ctx.clip();
        ctx.fillText(threadLabel(n.th[i]), x0 + 3, l.y + l.h / 2); ctx.restore();
      }
    });
  }

  function drawMarkersLane(l) {
    const a = lower(globalMarkerT, view.t0, globalMarkerT.length), b = upper(globalMarkerT, view.t1, globalMarkerT.length);
    let lastX = -10;
    for (let k = a; k < b; k++) {
      const x = X(globalMarkerT[k]);
      if (x - lastX < 2) continue;
      lastX = x;
      const name = N.event[markers.e[globalMarkers[k]]];
      ctx.fillStyle = name === "events_dropped" ? "#c62828" : "#555";
      ctx.beginPath(); ctx.moveTo(x - 4, l.y + l.h - 1); ctx.lineTo(x + 4, l.y + l.h - 1); ctx.lineTo(x, l.y + 2); ctx.fill();
    }
  }

  // Unknown windows (lost events, paused tracing) are hatched across every lane: no state is claimed there.
  function drawUnknownOverlay() {
    const top = AXIS_H, bottom = TOTAL_H;
    visitSpans(unknown, (i, x0, x1) => {
      const paused = N.rule[unknown.ru[i]] === "tracing_paused";
      ctx.fillStyle = paused ? HATCH_PAUSED : HATCH_UNKNOWN;
      ctx.fillRect(x0, top, Math.max(1, x1 - x0), bottom - top);
      ctx.fillStyle = paused ? "#555" : "#c62828"; ctx.fillRect(x0, top, 1, bottom - top);
    });
  }

  function draw() {
    drawPending = false;
    ctx.clearRect(0, 0, W, TOTAL_H);
    drawAxis();
    for (const l of lanes) {
      if (l.kind === "section") {
        ctx.fillStyle = "#f0f2f5"; ctx.fillRect(0, l.y + 4, W, l.h - 6);
        continue;
      }
      if (l.kind === "thread") drawThreadLane(l);
      else if (l.kind === "owner") drawOwnerLane(l);
      else if (l.kind === "gc") drawGcLane(l);
      else if (l.kind === "native") drawNativeLane(l);
      else if (l.kind === "markers") drawMarkersLane(l);
    }
    drawUnknownOverlay();
    drawOverlay();
  }

  // ---- hit testing, hover, card ----------------------------------------------------------------------------------
  function laneAtY(py) { for (const l of lanes) if (py >= l.y && py < l.y + l.h) return l; return null; }
  // Index of the span of `sp` covering time t, widened by `slack` ns for spans too thin to hit; -1 if none.
  function spanAt(sp, t, slack) {
    const i = upper(sp.s, t, sp.n) - 1;
    if (i >= 0 && sp.e[i] >= t) return i;
    if (slack > 0) {
      if (i >= 0 && t - sp.e[i] <= slack) return i;
      if (i + 1 < sp.n && sp.s[i + 1] - t <= slack) return i + 1;
    }
    return -1;
  }
  function nearestMarker(list, arr, t, slack) {
    if (arr.length === 0) return -1;
    const k = lower(arr, t, arr.length);
    let best = -1, bd = slack;
    for (const j of [k - 1, k]) if (j >= 0 && j < arr.length && Math.abs(arr[j] - t) <= bd) { best = j; bd = Math.abs(arr[j] - t); }
    return best < 0 ? -1 : list[best];
  }
  // What is under (px, py): {lane, kind, index} or null.
  function hit(px, py) {
    const l = laneAtY(py);
    if (!l || l.kind === "section") return null;
    const t = Tx(px), slack = 2 * (view.t1 - view.t0) / W;
    if (l.kind === "thread") {
      if (py < l.y + 7) {
        const m = nearestMarker(l.thread.markers, l.thread.markerT, t, slack * 2);
        if (m >= 0) return { lane: l, kind: "marker", index: m };
      }
      const i = spanAt(l.thread, t, slack); return i < 0 ? null : { lane: l, kind: "block", index: i };
    }
    if (l.kind === "owner") { const i = spanAt(owner, t, slack); return i < 0 ? null : { lane: l, kind: "owner", index: i }; }
    if (l.kind === "gc") { const i = spanAt(gc, t, slack); return i < 0 ? null : { lane: l, kind: "gc", index: i }; }
    if (l.kind === "native") { const i = spanAt(l.native, t, slack); return i < 0 ? null : { lane: l, kind: "native", index: i }; }
    if (l.kind === "markers") {
      const m = nearestMarker(globalMarkers, globalMarkerT, t, slack * 3);
      if (m >= 0) return { lane: l, kind: "marker", index: m };
      const u = spanAt(unknown, t, 0); return u < 0 ? null : { lane: l, kind: "unknown", index: u };
    }
    return null;
  }
  function spanOf(h) {
    if (h.kind === "block") return h.lane.thread;
    if (h.kind === "owner") return owner;
    if (h.kind === "gc") return gc;
    if (h.kind === "native") return h.lane.native;
    if (h.kind === "unknown") return unknown;
    return null;
  }
  function hitTitle(h) {
    const i = h.index;
    if (h.kind === "block") {
      const t = h.lane.thread, st = N.state[t.st[i]], rs = N.reason[t.rs[i]];
      return `${t.label} · ${(st === "released" || st === "wants_gvl") && rs !== "unknown" ? st + ": " + rs : st}`;
    }
    if (h.kind === "owner") {
      const k = N.owner_kind[owner.k[i]];
      return "GVL owner · " + (k === "owned" ? threadLabel(owner.ow[i]) : k);
    }
    if (h.kind === "gc") return "GC" + (gc.th[i] >= 0 ? " on " + threadLabel(gc.th[i]) : "");
    if (h.kind === "native") return `native ${h.lane.native.tid} · ${threadLabel(h.lane.native.th[i])}`;
    if (h.kind === "unknown") return N.rule[unknown.ru[i]] === "tracing_paused" ? "tracing paused" : `events dropped (${unknown.n[i]})`;
    if (h.kind === "marker") return markerTitle(h.index);
    return "";
  }
  function markerTitle(m) {
    const name = N.event[markers.e[m]];
    const label = { sleep_enter: "Kernel#sleep probe", mutex_lock_enter: "Thread::Mutex#lock probe",
                    events_dropped: "events dropped", tracing_paused: "tracing paused", tracing_resumed: "tracing resumed" }[name] || name;
    const x = extra.get(markers.ev[m]);
    return label + (markers.th[m] >= 0 ? " · " + threadLabel(markers.th[m]) : "") + (x && x.count !== undefined ? ` (${x.count} lost)` : "");
  }

  function eventLine(ei) {
    if (ei < 0 || ei >= events.n) return null;
    const name = N.event[events.e[ei]], cruby = N.cruby[events.e[ei]];
    const nt = events.nt[ei] >= 0 ? D.tids[events.nt[ei]] : null;
    return { name, cruby, t: events.t[ei], nt, th: events.th[ei], prov: N.prov[events.pv[ei]], src: N.source[events.src[ei]] };
  }

  const RULE_TEXT = {
    before_first_event: "Inferred: no event reports a thread's state before its first event; this is the state that event implies.",
    sleep_probe: "Derived: the release carried no reason (no stack was taken) and fell after a Kernel#sleep entry " +
      "probe of this thread, before it ran again.",
    mutex_probe: "Derived: the release carried no reason (no stack was taken) and fell after a Thread::Mutex#lock " +
      "entry probe of this thread, before it ran again.",
    stack_reason: "Derived: the recorder matched the stack it took at this release against the release-reason rule (docs/design.md).",
    preempted_by_resume: "Derived: another thread's RESUMED arrived while this thread had not released (Ruby 3.2 timeslice).",
    owner_replaced: "Derived: another thread's RESUMED replaced this owner; on 3.3+ that means a SUSPENDED was lost.",
    implicit_resume: "Derived: activity of a thread whose last transition was SUSPENDED, with no RESUMED reported.",
    gc_on_owner: "Derived: a GC event that names no thread ran on the thread holding the GVL.",
    owner_from_acquire: "Derived: the GVL owner is the last gvl_acquired (RESUMED) not yet followed by a release.",
    exit_releases: "Derived: EXITED ends the thread's ownership (3.3+ reports no SUSPENDED at exit).",
    events_dropped: "Unknown: events were lost here, so no state is claimed.",
    tracing_paused: "Unknown: tracing was paused here, so no state is claimed.",
  };
  const PROV_TEXT = { observed: "reported by the VM at the moment it happened",
                      derived: "computed from observed events by a documented rule",
                      inferred: "a guess about something no event reports" };

  function eventCell(ei) {
    const e = eventLine(ei);
    if (!e) return el("span", { class: "empty" }, "none (the trace starts or ends here)");
    return el("span", null, el("span", { class: "mono" }, e.cruby || e.name), e.cruby ? ` (${e.name})` : "",
        ` at ${ms(e.t)} ms`, e.nt !== null ? `, native ${e.nt}` : "", e.th >= 0 ? `, ${threadLabel(e.th)}` : "");
  }

  function showCard(h) {
    const card = $("card");
    card.dataset.endpoint = "";
    const i = h.index, rows = [];
    const row = (k, ...v) => rows.push(el("tr", null, el("td", null, k), el("td", null, ...v)));
    let prov = "observed", rule = "", opened = -1, closed = -1, sp = spanOf(h);
    if (sp) { row("start", `${ms(sp.s[i])} ms`); row("end", `${ms(sp.e[i])} ms`); row("duration", dur(sp.e[i] - sp.s[i])); }
    if (h.kind === "block") {
      const t = h.lane.thread;
      prov = N.prov[t.pv[i]]; rule = N.rule[t.ru[i]]; opened = t.o[i]; closed = t.c[i];
      row("state", N.state[t.st[i]]);
      // The model's reason (from the sleep / mutex probes); an unknown one gives way to the recorded release reason.
      if ((t.st[i] === S.released || t.st[i] === S.wants) && (N.reason[t.rs[i]] !== "unknown" || !releaseReasonOf(t.o[i]))) {
        row("reason", N.reason[t.rs[i]]);
      }
      if (t.nt[i] >= 0) row("native thread", String(D.tids[t.nt[i]]));
      if (t.rp[i] > 0) row("repeats", `${t.rp[i]} repeated transition(s) absorbed into this block`);
      if (t.rw[i] >= 0) row("READY while running", eventCell(t.rw[i]));
      if (ENDPOINTS.length > 1) {
        card.dataset.endpoint = ENDPOINTS[t.ep[i]];
        row("endpoint", el("span", { class: "mono" }, ENDPOINTS[t.ep[i]]),
            el("div", null, t.ep[i] > 0 ? `derived from the stack (rule ${ENDPOINT_RULES[t.ep[i]]})` : "in no request or job"));
      }
    } else if (h.kind === "owner") {
      prov = N.prov[owner.pv[i]]; rule = N.rule[owner.ru[i]]; opened = owner.o[i]; closed = owner.c[i];
      row("owner", N.owner_kind[owner.k[i]] === "owned" ? threadLabel(owner.ow[i]) : N.owner_kind[owner.k[i]]);
      row("ended", N.owner_end[owner.en[i]]);
    } else if (h.kind === "gc") {
      opened = gc.o[i]; closed = gc.c[i];
      row("thread", gc.th[i] >= 0 ? `${threadLabel(gc.th[i])} (${N.prov[gc.tp[i]]})` : "unknown");
      row("complete", gc.ok[i] ? "yes (gc_exit seen)" : "no (cut by lost events, a pause or the end)");
    } else if (h.kind === "native") {
      const n = h.lane.native;
      prov = N.prov[n.pv[i]];
      row("native tid", String(n.tid)); row("Ruby thread", threadLabel(n.th[i]));
    } else if (h.kind === "unknown") {
      prov = "observed"; rule = N.rule[unknown.ru[i]]; opened = unknown.ev[i];
      if (N.rule[unknown.ru[i]] === "events_dropped") row("lost events", String(unknown.n[i]));
    } else if (h.kind === "marker") {
      opened = markers.ev[h.index];
      row("time", `${ms(markers.t[h.index])} ms`);
      const x = extra.get(opened);
      if (x) for (const k of Object.keys(x)) row(k, String(x[k]));
    }
    const ev = eventLine(opened >= 0 ? opened : closed);
    const cruby = ev ? (ev.cruby || ev.name) : "";
    card.dataset.crubyEvent = cruby;
    card.dataset.provenance = prov;
    card.dataset.rule = rule;
    card.dataset.lane = h.lane.id;
    card.dataset.kind = h.kind;
    card.dataset.index = String(i);
    // The event behind a block is the one that opened it; an inferred block has none, so its closing event is named.
    row(opened >= 0 || !ev ? "CRuby event" : "CRuby event (closing)",
        ev ? el("span", { class: "mono" }, cruby) : el("span", { class: "empty" }, "none: no event opened or closed this block"));
    row("provenance", el("span", { class: "badge " + prov }, prov), " ", PROV_TEXT[prov] || "");
    if (rule) row("rule", el("span", { class: "mono" }, rule), el("div", null, RULE_TEXT[rule] || ""));
    if (h.kind !== "marker") { row("opened by", eventCell(opened)); row("closed by", eventCell(closed)); }
    else row("event", eventCell(opened));
    // The release reason and the stacks of the events behind the block, when the trace recorded them.
    const behind = [[opened, "opening"], [closed, "closing"]].filter(([ei]) => ei >= 0);
    let reasonShown = null, stacksShown = 0;
    for (const [ei, which] of behind) {
      const r = releaseReasonOf(ei);
      if (!r) continue;
      row(which === "opening" ? "release reason" : "release reason (closing event)", el("span", { class: "mono" }, r.reason),
          " ", el("span", { class: "badge " + r.prov }, r.prov), " ", PROV_TEXT[r.prov] || "");
      if (!reasonShown) reasonShown = r;
    }
    for (const [ei, which] of behind) {
      if (stackOfEvent(ei) < 0) continue;
      row("stack at " + N.event[events.e[ei]], el("div", { class: "empty" }, `${which} event, leaf first`), stackList(ei, which));
      stacksShown++;
    }
    if (!stacksShown) {
      row("stack", el("span", { class: "empty" },
          M.stacks ? "not recorded for the events of this block" : "not recorded (the trace carries no stacks)"));
    }
    // GVL blame of the thread's waits in this block: who held the lock meanwhile and what it ran.
    let blamed = [];
    if (h.kind === "block") {
      const t = h.lane.thread;
      blamed = blame.waitsIn(t.id, t.s[i], t.e[i]).map(blame.ofWait);
      if (blamed.length) row("GVL blame", blameView(blamed));
      else if (t.st[i] === S.wants) {
        row("GVL blame", el("span", { class: "empty" }, "none: this wait's end is not known (events were lost, " +
            "tracing was paused, or the trace ended during it), so nothing is blamed for it"));
      }
    }
    setBlameData(card, blamed);
    card.dataset.stacks = String(stacksShown);
    card.dataset.releaseReason = reasonShown ? reasonShown.reason : "";
    card.dataset.releaseReasonProvenance = reasonShown ? reasonShown.prov : "";
    card.replaceChildren(el("h2", null, hitTitle(h)), el("table", null, el("tbody", null, ...rows)));
    card.hidden = false;
    selected = h;
    drawOverlay();
  }
  let selected = null;
  // The frames of event ei's stack, leaf first; very deep stacks show their first frames and a button for the rest.
  const STACK_SHOWN = 60;
  function stackList(ei, which) { return stackBox(stackOfEvent(ei), { "data-event": String(ei), "data-which": which }); }
  function stackBox(s, attrs) {
    const a = stackOff[s], b = stackOff[s + 1];
    const ol = el("ol", Object.assign({ class: "stack" }, attrs));
    const add = (from, to) => {
      for (let k = from; k < to; k++) {
        const f = stackFrames[k];
        ol.appendChild(el("li", { class: "k-" + N.frame_kind[FR.k[f]] }, frameText(f)));
      }
    };
    add(a, Math.min(b, a + STACK_SHOWN));
    const box = el("div", null, ol);
    if (a === b) box.appendChild(el("span", { class: "empty" }, "(the stack has no frames)"));
    if (b - a > STACK_SHOWN) {
      const more = el("button", { type: "button", class: "more" }, `show ${b - a - STACK_SHOWN} more frames`);
      more.addEventListener("click", () => { more.remove(); add(a + STACK_SHOWN, b); });
      box.appendChild(more);
    }
    return box;
  }

  const SOURCE_TEXT = {
    sampled: (p) => `sampled: ${p.samples} on-CPU sample${p.samples === 1 ? "" : "s"} of the holder inside the wait`,
    release_stack: () => "release stack: no sample inside; the stack of the gvl_released that ended its hold",
    last_sample: () => "last sample: no sample inside and no release yet; what it was last sampled running",
    no_stack: () => "what it ran is not known (no sample, no stack)",
    gvl_free: () => "nobody held the GVL: the hand-off, or the scheduler waking the waiter",
    holder_unknown: () => "no thread was seen acquiring the GVL: the holder is not guessed",
    contention: () => "contention: the holder's stack as a READY found it when a wait began, up to its next sample",
  };
  const HOLDER_TEXT = "derived: the thread of the last gvl_acquired (RESUMED) not yet followed by its release";
  // One or more blamed waits: per holder (heaviest first), the ns it made this thread wait, what it ran (each part
  // with how it is known; parts ending in the same frame are one line, with the heaviest of their stacks) and the
  // release that ended its hold. Holders under 1% of the wait are folded into one line.
  function blameView(waits) {
    const box = el("div", { class: "blame" });
    const SHOWN = 5;
    for (const w of waits.slice(0, SHOWN)) {
      const waited = w.e - w.s, holders = new Map();
      for (const seg of w.segs) {
        let hd = holders.get(seg.holder);
        if (!hd) { hd = { holder: seg.holder, ns: 0, parts: new Map(), releases: [] }; holders.set(seg.holder, hd); }
        for (const p of seg.parts) {
          hd.ns += p.ns;
          const frame = blameLeaf(p), key = frame + "\u0000" + p.source;
          let cur = hd.parts.get(key);
          if (!cur) { cur = { frame, source: p.source, gc: p.gc, ns: 0, samples: 0, stacks: new Map() }; hd.parts.set(key, cur); }
          cur.ns += p.ns; cur.samples += p.samples;
          if (p.stack >= 0) cur.stacks.set(p.stack, (cur.stacks.get(p.stack) || 0) + p.ns);
        }
        if (seg.releaseT !== null) hd.releases.push(seg);
      }
      const list = el("ul", { class: "blame-holders" });
      const minor = el("ul", { class: "blame-holders" });
      let minorNs = 0, minorN = 0;
      for (const hd of [...holders.values()].sort((a, b) => b.ns - a.ns)) {
        const parts = el("ul", { class: "blame-parts" });
        for (const p of [...hd.parts.values()].sort((a, b) => b.ns - a.ns)) {
          const li = el("li", { class: "blame-part", "data-source": p.source, "data-frame": p.frame, "data-ns": String(p.ns) },
              el("span", { class: "mono" }, p.frame), ` ${dur(p.ns)} · `, el("span", { class: "badge " + (p.source === "sampled" || p.source === "contention" ? "observed" : "derived") }, p.source),
              " ", SOURCE_TEXT[p.source] ? SOURCE_TEXT[p.source](p) : "", p.gc ? " (the holder was running a GC)" : "");
          if (p.stacks.size) {
            const [heaviest] = [...p.stacks].sort((a, b) => b[1] - a[1])[0];
            li.appendChild(el("details", null, el("summary", null, p.stacks.size > 1 ? `stack (the heaviest of ${p.stacks.size})` : "stack"),
                stackBox(heaviest, { "data-blame": "part" })));
          }
          parts.appendChild(li);
        }
        for (const seg of hd.releases) {
          const li = el("li", { class: "blame-release" }, `its hold ended by gvl_released at ${ms(seg.releaseT)} ms`,
              seg.releaseStack >= 0 ? el("span", null, " in ", el("span", { class: "mono" }, leafLabel(seg.releaseStack))) : " (no stack recorded)");
          if (seg.releaseStack >= 0) li.appendChild(el("details", null, el("summary", null, "release stack"), stackBox(seg.releaseStack, { "data-blame": "release" })));
          parts.appendChild(li);
        }
        const item = el("li", { class: "blame-holder", "data-holder": holderLabel(hd.holder), "data-ns": String(hd.ns) },
            el("strong", null, holderLabel(hd.holder)), ` ${dur(hd.ns)} (${(100 * hd.ns / Math.max(1, waited)).toFixed(1)}% of the wait)`,
            hd.holder >= 0 ? el("span", null, " ", el("span", { class: "badge derived" }, "holder derived"), " ", HOLDER_TEXT) : null, parts);
        if (list.childElementCount > 0 && hd.ns < waited / 100) { minor.appendChild(item); minorNs += hd.ns; minorN++; }
        else list.appendChild(item);
      }
      if (minorN) {
        list.appendChild(el("li", null, el("details", null,
            el("summary", null, `${minorN} more holder${minorN === 1 ? "" : "s"}, ${dur(minorNs)} together`), minor)));
      }
      box.appendChild(el("div", { class: "blame-wait", "data-start-ns": String(w.s), "data-end-ns": String(w.e) },
          el("div", null, `waited ${dur(waited)} (${ms(w.s, 3)} – ${ms(w.e, 3)} ms); the GVL was held by:`), list));
    }
    if (waits.length > SHOWN) box.appendChild(el("div", { class: "empty" }, `and ${waits.length - SHOWN} more waits`));
    return box;
  }
  // The card's blame hooks: the waits shown, the holder and the frame blamed for the most ns across them.
  function setBlameData(card, waits) {
    const byHolder = new Map(), byFrame = new Map();
    let total = 0;
    for (const w of waits) {
      for (const seg of w.segs) {
        for (const p of seg.parts) {
          total += p.ns;
          byHolder.set(seg.holder, (byHolder.get(seg.holder) || 0) + p.ns);
          const f = blameLeaf(p);
          byFrame.set(f, (byFrame.get(f) || 0) + p.ns);
        }
      }
    }
    const top = (m) => [...m].sort((a, b) => b[1] - a[1])[0];
    card.dataset.blameWaits = String(waits.length);
    card.dataset.blameNs = String(total);
    card.dataset.blameHolder = byHolder.size ? holderLabel(top(byHolder)[0]) : "";
    card.dataset.blameFrame = byFrame.size ? top(byFrame)[0] : "";
  }

  // ---- overlay: cursor line and selection ------------------------------------------------------------------------
  function drawOverlay() {
    octx.clearRect(0, 0, W, TOTAL_H);
    if (selected) {
      const sp = spanOf(selected);
      const l = selected.lane;
      if (sp) {
        const x0 = Math.max(-2, X(sp.s[selected.index])), x1 = Math.min(W + 2, X(sp.e[selected.index]));
        octx.strokeStyle = "#1d232b"; octx.lineWidth = 2;
        octx.strokeRect(x0, l.y + 1, Math.max(2, x1 - x0), l.h - 2);
      }
    }
    if (cursorT !== null && cursorT >= view.t0 && cursorT <= view.t1) {
      const x = Math.round(X(cursorT)) + 0.5;
      octx.strokeStyle = "rgba(47,111,208,.8)"; octx.lineWidth = 1;
      octx.beginPath(); octx.moveTo(x, 0); octx.lineTo(x, TOTAL_H); octx.stroke();
    }
  }

  // ---- event list that follows the cursor ------------------------------------------------------------------------
  const ROWS_BEFORE = 12, ROWS_AFTER = 28;
  let listAt = -1;
  function updateEventList(t) {
    if (events.n === 0) return;
    let k = upper(events.t, t, events.n) - 1;
    if (k < 0) k = 0;
    if (k === listAt) return;
    listAt = k;
    const from = Math.max(0, k - ROWS_BEFORE), to = Math.min(events.n, k + ROWS_AFTER);
    const rows = [];
    for (let i = from; i < to; i++) {
      const e = eventLine(i);
      const x = extra.get(i);
      const tr = el("tr", { "data-event": String(i), class: i === k ? "at" : "" },
          el("td", { class: "mono" }, ms(e.t)), el("td", null, e.th >= 0 ? threadLabel(e.th) : "-"),
          el("td", { class: "mono" }, e.nt !== null ? String(e.nt) : "-"),
          el("td", null, e.name + (x && x.count !== undefined ? ` (${x.count})` : "") + (x && x.reason ? ` (${x.reason})` : "") +
              (releaseReasonOf(i) ? ` (${releaseReasonOf(i).reason})` : "") +
              (e.name === "sample" && stackOfEvent(i) >= 0 ? " · " + leafLabel(stackOfEvent(i)) : "")),
          el("td", { class: "mono" }, e.cruby || "-"), el("td", null, e.prov));
      rows.push(tr);
    }
    $("event-rows").replaceChildren(...rows);
    const at = $("event-rows").querySelector("tr.at");
    if (at) { const box = $("events"); box.scrollTop = Math.max(0, at.offsetTop - box.clientHeight / 3); }
  }
  $("event-rows").addEventListener("click", (ev) => {
    const tr = ev.target.closest("tr[data-event]");
    if (!tr) return;
    setCursor(events.t[Number(tr.dataset.event)], true);
  });
  function setCursor(t, follow) {
    cursorT = t;
    $("cursor-time").textContent = t === null ? "" : `cursor ${ms(t)} ms`;
    if (t !== null) {
      updateEventList(t);
      if (follow && (t < view.t0 || t > view.t1)) { const span = view.t1 - view.t0; setView(t - span / 2, t + span / 2); }
    }
    drawOverlay();
  }

  // ---- input -----------------------------------------------------------------------------------------------------
  const localXY = (ev) => { const r = canvas.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; };
  let drag = null;
  canvas.addEventListener("mousedown", (ev) => {
    if (ev.button !== 0) return;
    const [px] = localXY(ev);
    drag = { x: px, t0: view.t0, t1: view.t1, moved: false };
  });
  window.addEventListener("mousemove", (ev) => {
    const [px, py] = localXY(ev);
    if (drag) {
      const dx = px - drag.x;
      if (Math.abs(dx) > 3) drag.moved = true;
      if (drag.moved) {
        const dt = dx / W * (drag.t1 - drag.t0);
        setView(drag.t0 - dt, drag.t1 - dt);
      }
    }
    if (px < 0 || px > W || py < 0 || py > TOTAL_H) { tooltip.hidden = true; return; }
    setCursor(Tx(px), false);
    const h = hit(px, py);
    if (!h) { tooltip.hidden = true; return; }
    const sp = spanOf(h);
    let text = hitTitle(h);
    if (sp) text += `\n${ms(sp.s[h.index])} – ${ms(sp.e[h.index])} ms\n${dur(sp.e[h.index] - sp.s[h.index])}`;
    else if (h.kind === "marker") text += `\n${ms(markers.t[h.index])} ms`;
    text += `\ncursor ${ms(Tx(px))} ms`;
    tooltip.textContent = text;
    tooltip.hidden = false;
    const tx = px + 14 + 260 > W ? px - 14 - tooltip.offsetWidth : px + 14;
    tooltip.style.left = tx + "px"; tooltip.style.top = (py + 14) + "px";
  });
  window.addEventListener("mouseup", (ev) => {
    if (!drag) return;
    const wasDrag = drag.moved;
    drag = null;
    if (wasDrag) return;
    const [px, py] = localXY(ev);
    const h = hit(px, py);
    if (h) showCard(h);
  });
  canvas.addEventListener("mouseleave", () => { tooltip.hidden = true; });
  canvas.addEventListener("wheel", (ev) => {
    ev.preventDefault();
    const [px] = localXY(ev);
    if (ev.shiftKey || Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) { pan((ev.deltaX || ev.deltaY) / W); return; }
    zoomAt(Math.pow(1.0015, ev.deltaY), Tx(px));
  }, { passive: false });
  $("zoom-in").addEventListener("click", () => zoomAt(0.5, cursorT !== null && cursorT >= view.t0 && cursorT <= view.t1 ? cursorT : undefined));
  $("zoom-out").addEventListener("click", () => zoomAt(2));
  $("zoom-fit").addEventListener("click", () => setView(T0, T1));
  $("pan-left").addEventListener("click", () => pan(-0.25));
  $("pan-right").addEventListener("click", () => pan(0.25));
  function step(dir) {
    if (events.n === 0) return;
    const t = cursorT === null ? view.t0 : cursorT;
    const k = dir > 0 ? upper(events.t, t, events.n) : lower(events.t, t, events.n) - 1;
    if (k >= 0 && k < events.n) setCursor(events.t[k], true);
  }
  $("step-prev").addEventListener("click", () => step(-1));
  $("step-next").addEventListener("click", () => step(1));
  // Replay: the cursor moves through trace time at the chosen speed; the view follows and the event list with it.
  let playing = null;
  function togglePlay() {
    if (playing) { cancelAnimationFrame(playing.raf); playing = null; $("play").textContent = "▶ replay"; return; }
    let t = cursorT === null || cursorT >= T1 ? view.t0 : cursorT;
    let last = performance.now();
    const tick = (now) => {
      t += (now - last) * 1e6 * Number($("speed").value);
      last = now;
      if (t >= T1) { setCursor(T1, true); togglePlay(); return; }
      setCursor(t, true);
      playing.raf = requestAnimationFrame(tick);
    };
    playing = { raf: requestAnimationFrame(tick) };
    $("play").textContent = "❚❚ pause";
  }
  $("play").addEventListener("click", togglePlay);
  document.addEventListener("keydown", (ev) => {
    if (ev.target && (ev.target.tagName === "SELECT" || ev.target.tagName === "INPUT")) return;
    const k = ev.key;
    if (k === "+" || k === "=") zoomAt(0.5);
    else if (k === "-" || k === "_") zoomAt(2);
    else if (k === "ArrowLeft") pan(-0.1);
    else if (k === "ArrowRight") pan(0.1);
    else if (k === "Home" || k === "0") setView(T0, T1);
    else if (k === ",") step(-1);
    else if (k === ".") step(1);
    else if (k === " ") togglePlay();
    else return;
    ev.preventDefault();
  });
  window.addEventListener("resize", resize);

  // ---- flame graphs ----------------------------------------------------------------------------------------------
  // An icicle: the selection's weight as the top row, callees below, each frame as wide as its share. Frames of one
  // function (label and path) under one parent are merged whatever their line (the lines seen are listed on hover).
  // Click a frame to zoom into it; click a row above it (its callers) or Reset to zoom out. Two use it: the CPU
  // samples (by Ruby thread) and the GVL blame (ns others waited, by the holder's stack, per holder).
  const fnOfFrame = new Int32Array(FR.l.length);
  (function () {
    const fnKey = new Map();
    for (let f = 0; f < FR.l.length; f++) {
      const key = FR.l[f] + "\u0000" + FR.p[f];
      if (!fnKey.has(key)) fnKey.set(key, fnKey.size);
      fnOfFrame[f] = fnKey.get(key);
    }
  })();
  // Frames that stand in for what no recorded stack says (negative function ids; -1 is the root): the labels the
  // pprof export uses for the same weights.
  const PSEUDO = { "-2": "(no stack recorded)", "-3": "[GC]", "-4": "[GVL not held]", "-5": "[holder unknown]",
                   "-6": "[no stack]", "-7": "(estimated: tracing paused)" };
  const P_NO_STACK = -2, P_GC = -3, P_GVL_FREE = -4, P_HOLDER_UNKNOWN = -5, P_BLAME_NO_STACK = -6, P_ESTIMATED = -7;
  // Each graph's section is a copy of #flame-template (report.html) made by flameSection, so both have one shape;
  // both copies exist from the start, hidden until makeFlame fills one, so a page without samples still has #flame.
  // A part's id is the graph's prefix + "-" + its data-part (the select's: prefix + "-" + selectName).
  // sec: {id, prefix, title, selectName, selectLabel, selectTitle, extra: an element shown under the head, or null}.
  function flameSection(sec) {
    const s = $("flame-template").content.firstElementChild.cloneNode(true);
    s.id = sec.id;
    const part = (name) => s.querySelector(`[data-part="${name}"]`);
    const ids = { section: sec.id, select: sec.prefix + "-" + sec.selectName };
    for (const name of ["canvas", "plot", "tip", "reset", "info", "path"]) {
      ids[name] = sec.prefix + "-" + name;
      part(name).id = ids[name];
    }
    Object.assign(part("select"), { id: ids.select, title: sec.selectTitle });
    part("title").textContent = sec.title;
    part("select-label").textContent = sec.selectLabel;
    if (sec.extra) part("extra").replaceWith(sec.extra); else part("extra").remove();
    $("flames").appendChild(s);
    return ids;
  }
  const FLAME_IDS = flameSection({ id: "flame", prefix: "flame", title: "Flame graph", selectName: "thread",
                                   selectLabel: "thread", selectTitle: "Samples of one Ruby thread, or of all" });
  const BLAME_IDS = flameSection({ id: "blame-flame", prefix: "blame", title: "GVL blame", selectName: "holder",
                                   selectLabel: "holder",
                                   selectTitle: "What one GVL holder ran while others waited, or all holders",
                                   extra: el("table", { id: "blame-top", title: "Top blockers: the holder and what it " +
                                                        "ran, by the time other threads waited for the GVL" }) });
  // cfg: ids (flameSection's); groups: Map(group -> [{s, stand, top, root, w}])
  // (s: stack index or -1, stand: the pseudo frame for s < 0, top: a pseudo leaf frame on top or 0, root: a pseudo
  // frame under the whole stack or 0, e.g. P_ESTIMATED for weights that were estimated); groupLabel(g);
  // allLabel; valueName ("samples" / "ns", the hooks' field); fmt(v) and lines(v) for the tip; info(total, selLabel).
  function makeFlame(cfg) {
    const $s = (k) => $(cfg.ids[k]);
    $s("section").hidden = false;
    const mk = (fn, frame, parent) => ({ fn, frame, parent, n: 0, self: 0, kids: new Map(), sorted: null, height: 1,
                                         line: frame >= 0 ? FR.ln[frame] : 0, lines: null });
    let sel = "all", root = null, zoom = null, rects = [], FW = 800;
    const selLabel = () => (sel === "all" ? cfg.allLabel : cfg.groupLabel(sel));
    const labelOf = (n) => (n.fn === -1 ? selLabel() : n.fn < -1 ? PSEUDO[n.fn] : FR.l[n.frame]);
    const child = (cur, fn, frame) => {
      let c = cur.kids.get(fn);
      if (!c) { c = mk(fn, frame, cur); cur.kids.set(fn, c); }
      else if (frame >= 0 && FR.ln[frame] !== c.line) {
        if (!c.lines) c.lines = [c.line];
        if (c.lines.length < 8 && !c.lines.includes(FR.ln[frame])) c.lines.push(FR.ln[frame]);
      }
      return c;
    };
    function build() {
      const r = mk(-1, -1, null);
      for (const [g, list] of cfg.groups) {
        if (sel !== "all" && g !== sel) continue;
        for (const { s, stand, top, root, w } of list) {
          if (endpointSel >= 0 && endpointOfStack(s) !== endpointSel) continue;  // the endpoint filter
          r.n += w;
          let cur = r;
          if (root) { cur = child(cur, root, -1); cur.n += w; }
          if (s < 0) { cur = child(cur, stand, -1); cur.n += w; }
          for (let k = s >= 0 ? stackOff[s + 1] - 1 : -1, to = s >= 0 ? stackOff[s] : 0; k >= to; k--) {  // root first
            const f = stackFrames[k];
            cur = child(cur, fnOfFrame[f], f);
            cur.n += w;
          }
          if (top) { cur = child(cur, top, -1); cur.n += w; }
          cur.self += w;
        }
      }
      // Children heaviest first; heights (rows below and including a node) size the canvas. Iterative: stacks are deep.
      const order = [r];
      for (let i = 0; i < order.length; i++) {
        const n = order[i];
        n.sorted = [...n.kids.values()].sort((a, b) => b.n - a.n || (labelOf(a) < labelOf(b) ? -1 : 1));
        for (const k of n.sorted) order.push(k);
      }
      for (let i = order.length - 1; i > 0; i--) { const n = order[i]; n.parent.height = Math.max(n.parent.height, n.height + 1); }
      return r;
    }
    function color(n) {
      if (n.fn === P_GC) return "hsl(280, 40%, 66%)";
      if (n.fn < 0) return "#c9ced6";
      const kind = N.frame_kind[FR.k[n.frame]], label = FR.l[n.frame];
      let h = 0;
      for (let i = 0; i < label.length; i++) h = (h * 31 + label.charCodeAt(i)) | 0;
      const r = ((h >>> 0) % 997) / 997;
      if (kind === "cfunc") return `hsl(${Math.round(185 + r * 35)}, 45%, ${Math.round(64 + r * 10)}%)`;
      if (kind === "gc") return "hsl(280, 40%, 66%)";
      if (kind === "unresolved") return "#bdbdbd";
      return `hsl(${Math.round(8 + r * 40)}, ${Math.round(72 + r * 15)}%, ${Math.round(58 + r * 8)}%)`;
    }
    const fcanvas = $s("canvas"), fplot = $s("plot"), ftip = $s("tip"), fctx = fcanvas.getContext("2d");
    const ROW = 18, MIN_W = 0.35;  // px: frames narrower than this are not drawn (nor their callees)
    const chainOf = (n) => { const c = []; for (let x = n; x; x = x.parent) c.unshift(x); return c; };
    const zoomKey = "zoom" + cfg.valueName[0].toUpperCase() + cfg.valueName.slice(1);
    function draw() {
      const dpr = window.devicePixelRatio || 1;
      FW = Math.max(200, Math.floor(fplot.clientWidth));
      const chain = chainOf(zoom), H = (chain.length - 1 + zoom.height) * ROW;
      fcanvas.width = Math.floor(FW * dpr); fcanvas.height = Math.floor(H * dpr);
      fcanvas.style.width = FW + "px"; fcanvas.style.height = H + "px";
      fctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      fctx.clearRect(0, 0, FW, H);
      fctx.font = "11px system-ui, sans-serif"; fctx.textBaseline = "middle";
      rects = [];
      const box = (n, x0, x1, row, caller) => {
        const y = row * ROW, w = x1 - x0;
        fctx.globalAlpha = caller ? 0.5 : 1;
        fctx.fillStyle = color(n);
        fctx.fillRect(x0, y, w > 2 ? w - 1 : Math.max(w, 0.5), ROW - 1);
        fctx.globalAlpha = 1;
        if (w > 30) {
          fctx.save(); fctx.beginPath(); fctx.rect(x0, y, w - 1, ROW); fctx.clip();
          fctx.fillStyle = "#1d232b";
          fctx.fillText(n.fn === -1 ? `${labelOf(n)} (${cfg.fmt(n.n)})` : labelOf(n), x0 + 3, y + ROW / 2);
          fctx.restore();
        }
        rects.push({ x0, x1, row, node: n, caller });
      };
      for (let d = 0; d < chain.length - 1; d++) box(chain[d], 0, FW, d, true);
      const scale = zoom.n > 0 ? FW / zoom.n : 0;
      // Explicit stack instead of recursion: Ruby stacks can be hundreds of frames deep.
      const todo = [[zoom, 0, chain.length - 1]];
      while (todo.length) {
        const [n, x0, row] = todo.pop();
        box(n, x0, x0 + n.n * scale, row, false);
        let x = x0;
        for (const k of n.sorted) {
          const w = k.n * scale;
          if (w < MIN_W) break;  // heaviest first: the rest are narrower still
          todo.push([k, x, row + 1]);
          x += w;
        }
      }
      const sec = $s("section");
      sec.dataset.thread = String(sel); sec.dataset.zoom = labelOf(zoom); sec.dataset.total = String(root.n);
      sec.dataset[zoomKey] = String(zoom.n);
      $s("path").textContent = chain.length > 1 ? "zoomed: " + chain.map(labelOf).join(" › ") : "";
      $s("info").textContent = cfg.info(root.n, selLabel()) + " · click a frame to zoom, hover for " + cfg.valueName;
    }
    const pct = (a, b) => { const p = b > 0 ? 100 * a / b : 0; return p.toFixed(p > 0 && p < 1 ? 2 : 1) + "%"; };
    function describe(n) {
      const lines = [labelOf(n)];
      if (n.frame >= 0) {
        const path = PATHS[FR.p[n.frame]] || "";
        const ls = (n.lines || [n.line]).filter((l) => l > 0);
        if (path || ls.length) lines.push(path + (ls.length ? ":" + ls.join(", ") : ""));
      }
      let share = `${cfg.fmt(n.n)} · ${pct(n.n, root.n)} of ${selLabel()}`;
      if (zoom !== root && n !== zoom && zoom.n > 0 && chainOf(n).includes(zoom)) share += ` · ${pct(n.n, zoom.n)} of the zoomed frame`;
      lines.push(share);
      if (n.fn !== -1) lines.push(`self ${cfg.fmt(n.self)} (${pct(n.self, root.n)})`);
      for (const l of cfg.lines(n.n)) lines.push(l);
      return lines.join("\n");
    }
    function hitAt(ev) {
      const r = fcanvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top, row = Math.floor(y / ROW);
      for (let i = rects.length - 1; i >= 0; i--) {
        const q = rects[i];
        if (q.row === row && x >= q.x0 && x < Math.max(q.x1, q.x0 + 1)) return q;
      }
      return null;
    }
    function zoomTo(n) { zoom = n; ftip.hidden = true; draw(); }
    function select(v) {
      sel = v === "all" ? "all" : Number(v);
      $s("select").value = String(sel);
      root = build(); zoom = root; draw();
    }
    function refilter() { root = build(); zoom = root; draw(); }
    fcanvas.addEventListener("mousemove", (ev) => {
      const q = hitAt(ev);
      if (!q) { ftip.hidden = true; return; }
      ftip.textContent = describe(q.node);
      ftip.dataset[cfg.valueName] = String(q.node.n);
      ftip.dataset.label = labelOf(q.node);
      ftip.hidden = false;
      const r = fcanvas.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
      ftip.style.left = (px + 14 + ftip.offsetWidth > FW ? Math.max(0, px - 14 - ftip.offsetWidth) : px + 14) + "px";
      ftip.style.top = (py + 14) + "px";
    });
    fcanvas.addEventListener("mouseleave", () => { ftip.hidden = true; });
    fcanvas.addEventListener("click", (ev) => { const q = hitAt(ev); if (q) zoomTo(q.node); });
    $s("reset").addEventListener("click", () => zoomTo(root));
    let total = 0;
    const opts = [];
    for (const g of [...cfg.groups.keys()].sort((a, b) => a - b)) {
      let c = 0;
      for (const e of cfg.groups.get(g)) c += e.w;
      total += c;
      opts.push(el("option", { value: String(g) }, `${cfg.groupLabel(g)} (${cfg.fmt(c)})`));
    }
    $s("select").replaceChildren(el("option", { value: "all" }, `${cfg.allLabel} (${cfg.fmt(total)})`), ...opts);
    $s("select").addEventListener("change", (ev) => select(ev.target.value));
    root = build(); zoom = root;
    // Self weight by function label over the whole selection (drawn or not), heaviest first.
    function selfByLabel() {
      const m = new Map();
      const todo = [root];
      while (todo.length) {
        const n = todo.pop();
        if (n.self > 0 && n.fn !== -1) m.set(labelOf(n), (m.get(labelOf(n)) || 0) + n.self);
        for (const k of n.kids.values()) todo.push(k);
      }
      return [...m].map(([label, v]) => ({ label, [cfg.valueName]: v })).sort((a, b) => b[cfg.valueName] - a[cfg.valueName]);
    }
    return {
      draw, select, zoomTo, selfByLabel, refilter,
      // Test hooks: the drawn frames, in canvas coordinates ({x0, x1, row, label, path, <valueName>, self, caller}).
      rects: () => rects.map((q) => ({ x0: q.x0, x1: q.x1, row: q.row, label: labelOf(q.node), caller: q.caller,
                                       path: q.node.frame >= 0 ? PATHS[FR.p[q.node.frame]] : "",
                                       [cfg.valueName]: q.node.n, self: q.node.self })),
      state: () => ({ thread: sel, zoom: labelOf(zoom), [zoomKey]: zoom.n, total: root.n, width: FW, rowHeight: ROW }),
      canvasRect: () => { const r = fcanvas.getBoundingClientRect(); return { x: r.left, y: r.top, width: r.width, height: r.height }; },
    };
  }

  // The CPU samples, per Ruby thread (-1: none named), by stack (-1: a sample without a stack).
  const flame = (function () {
    if (!M.samples) return null;
    const counts = new Map();
    for (let i = 0; i < events.n; i++) {
      if (events.e[i] !== EV.sample) continue;
      const th = events.th[i], s = stackOfEvent(i);
      let m = counts.get(th);
      if (!m) { m = new Map(); counts.set(th, m); }
      m.set(s, (m.get(s) || 0) + 1);
    }
    const groups = new Map();
    for (const [th, m] of counts) groups.set(th, [...m].map(([s, w]) => ({ s, stand: P_NO_STACK, top: 0, w })));
    return makeFlame({
      ids: FLAME_IDS,
      groups, groupLabel: (th) => (th >= 0 ? threadLabel(th) : "(no thread named)"), allLabel: "all threads",
      valueName: "samples",
      fmt: (v) => `${v} samples`,
      lines: (v) => (M.sample_hz ? [`≈ ${dur(v * 1e9 / M.sample_hz)} on CPU`] : []),
      info: (total, what) => `${total} CPU samples of ${what}` + endpointNote() +
          (M.sample_hz ? ` at ${M.sample_hz} Hz (≈ ${dur(total * 1e9 / M.sample_hz)} on CPU)` : ""),
    });
  })();

  // ---- GVL blame (model/attribution.h, computed by rvbpfd; the page only draws it) ---------------------------------
  const BL = D.blame || { total_ns: 0, estimated_ns: 0, waits: { th: [], s: [], d: [], ns: [] },
                          segs: { h: [], s: [], d: [], rs: [], rt: [], np: [] },
                          parts: { sk: [], src: [], gc: [], ns: [], n: [] },
                          flame: { h: [], sk: [], gc: [], src: [], inf: [], ns: [] } };
  const BLAME_SOURCES = N.blame_source || [];
  const blame = (function () {
    const w = Object.assign(spans(BL.waits), { th: minusOne(BL.waits.th), nseg: ints(BL.waits.ns) });
    const sg = Object.assign(spans(BL.segs), { h: minusOne(BL.segs.h), rs: minusOne(BL.segs.rs), rt: undelta(BL.segs.rt),
                                               np: ints(BL.segs.np) });
    const pt = { sk: minusOne(BL.parts.sk), src: Uint8Array.from(BL.parts.src), gc: Uint8Array.from(BL.parts.gc),
                 ns: Float64Array.from(BL.parts.ns), n: ints(BL.parts.n) };
    // First segment of each wait, first part of each segment.
    w.seg0 = new Int32Array(w.n + 1);
    for (let i = 0; i < w.n; i++) w.seg0[i + 1] = w.seg0[i] + w.nseg[i];
    sg.part0 = new Int32Array(sg.n + 1);
    for (let i = 0; i < sg.n; i++) sg.part0[i + 1] = sg.part0[i] + sg.np[i];
    // Each waiter's waits: [from, to) of the list (sorted by waiter, then start).
    const byThread = new Map();
    for (let i = 0; i < w.n; i++) {
      const r = byThread.get(w.th[i]);
      if (r) r[1] = i + 1; else byThread.set(w.th[i], [i, i + 1]);
    }
    // The blamed waits of `thread` overlapping [s, e). A thread's waits do not overlap: sorted by start and by end.
    function waitsIn(thread, s, e) {
      const r = byThread.get(thread);
      if (!r) return [];
      const out = [];
      for (let i = r[0] + upper(w.e.subarray(r[0], r[1]), s, r[1] - r[0]); i < r[1] && w.s[i] < e; i++) out.push(i);
      return out;
    }
    // One wait's blame: per segment, the holder, what it ran (parts) and the release that ended its hold.
    function ofWait(i) {
      const segs = [];
      for (let k = w.seg0[i]; k < w.seg0[i + 1]; k++) {
        const parts = [];
        for (let j = sg.part0[k]; j < sg.part0[k + 1]; j++) {
          parts.push({ stack: pt.sk[j], source: BLAME_SOURCES[pt.src[j]], gc: pt.gc[j] === 1, ns: pt.ns[j], samples: pt.n[j] });
        }
        segs.push({ holder: sg.h[k], s: sg.s[k], e: sg.e[k], releaseStack: sg.rs[k], releaseT: sg.rt[k] || null, parts });
      }
      return { waiter: w.th[i], s: w.s[i], e: w.e[i], segs };
    }
    // total: the counted waits' ns; estimated: the waits estimated while tracing was paused (in the flame graph only).
    return { w, total: BL.total_ns, estimated: BL.estimated_ns || 0, waitsIn, ofWait };
  })();
  // The frame a blamed part is shown by: the GC or stand-in pseudo frame, else the stack's leaf.
  function blameLeaf(p) {
    if (p.gc) return PSEUDO[P_GC];
    if (p.stack >= 0) return leafLabel(p.stack);
    return PSEUDO[p.source === "gvl_free" ? P_GVL_FREE : p.source === "holder_unknown" ? P_HOLDER_UNKNOWN : P_BLAME_NO_STACK];
  }
  const holderLabel = (h) => (h >= 0 ? threadLabel(h) : "nobody");

  // The blame flame graph: ns by the holder's stack, per holder (-1: nobody held it, or who did is not known).
  const blameFlame = (function () {
    const f = BL.flame;
    if (!f.ns.length) {
      $("blame-flame-note").hidden = false;
      return null;
    }
    const groups = new Map();
    for (let i = 0; i < f.ns.length; i++) {
      const h = f.h[i] - 1, s = f.sk[i] - 1, source = BLAME_SOURCES[f.src[i]];
      const stand = source === "gvl_free" ? P_GVL_FREE : source === "holder_unknown" ? P_HOLDER_UNKNOWN : P_BLAME_NO_STACK;
      if (!groups.has(h)) groups.set(h, []);
      groups.get(h).push({ s, stand, top: f.gc[i] ? P_GC : 0, root: f.inf[i] ? P_ESTIMATED : 0, w: f.ns[i] });
    }
    const estimatedNote = blame.estimated > 0
      ? ` (${dur(blame.estimated)} of it estimated from the samples' GVL readings while tracing was paused)` : "";
    const fl = makeFlame({
      ids: BLAME_IDS,
      groups, groupLabel: (h) => (h >= 0 ? threadLabel(h) : "nobody / not known"), allLabel: "all holders",
      valueName: "ns", fmt: (v) => dur(v) + " waited", lines: () => [],
      info: (total, what) => `${dur(total)} other threads waited for the GVL while ${what} held it` + endpointNote() +
        (what === "all holders" ? estimatedNote : ""),
    });
    // The top blockers, as `inspect` prints them (model/blockers.h groups them; the page only shows them): the
    // holders' innermost Ruby method across threads, with the C functions it was in beneath it.
    const list = (BL.blockers || []).map((b) => ({
      frame: b.m, ns: b.ns,
      holders: b.h.map(([h, ns]) => ({ holder: holderLabel(h - 1), ns })),
      calls: b.c.map(([label, ns]) => ({ label, ns })),
    }));
    const share = (ns) => (100 * ns / Math.max(1, blame.total + blame.estimated)).toFixed(1) + "%";
    const whoHeld = (x) => (x.holders.length === 1 ? x.holders[0].holder : `${x.holders.length} threads`);
    const rows = list.slice(0, 5).map((x) => el("tr", { "data-holder": x.holders.map((h) => h.holder).join(", "),
                                                        "data-threads": String(x.holders.length),
                                                        "data-frame": x.frame, "data-ns": String(x.ns),
                                                        title: x.holders.map((h) => `${h.holder}: ${dur(h.ns)}`).join("\n") },
        el("td", { class: "mono" }, el("div", null, x.frame),
           ...x.calls.slice(0, 2).map((c) => el("div", { class: "blame-call", "data-call": c.label, "data-ns": String(c.ns) },
                                                 `in ${c.label} · ${dur(c.ns)}`))),
        el("td", null, whoHeld(x)), el("td", null, dur(x.ns)), el("td", null, share(x.ns))));
    $("blame-top").replaceChildren(el("thead", null, el("tr", null, el("th", null, "holders' Ruby method"),
        el("th", null, "held by"), el("th", null, "others waited"), el("th", null, "share"))), el("tbody", null, ...rows));
    fl.top = () => list.map((x) => ({ holder: whoHeld(x), frame: x.frame, ns: x.ns, holders: x.holders, calls: x.calls }));
    return fl;
  })();
  window.addEventListener("resize", () => { if (flame) flame.draw(); if (blameFlame) blameFlame.draw(); });

  // The endpoint filter (toolbar): one endpoint's blocks stand out on the timeline (the others are dimmed), and the
  // flame graphs keep only the samples and the blame of its stacks. Shown when some stack names an endpoint.
  function setEndpoint(v) {
    endpointSel = v === "all" || v === undefined ? -1 : Number(v);
    $("endpoint").value = endpointSel < 0 ? "all" : String(endpointSel);
    document.body.dataset.endpoint = endpointSel < 0 ? "" : ENDPOINTS[endpointSel];
    if (flame) flame.refilter();
    if (blameFlame) blameFlame.refilter();
    requestDraw();
  }
  if (ENDPOINTS.length > 1) {
    const order = ENDPOINTS.map((_, i) => i).filter((i) => i > 0).sort((a, b) => (ENDPOINTS[a] < ENDPOINTS[b] ? -1 : 1));
    $("endpoint").replaceChildren(el("option", { value: "all" }, "all endpoints"),
        ...order.map((i) => el("option", { value: String(i), title: "derived: rule " + ENDPOINT_RULES[i] }, ENDPOINTS[i])),
        el("option", { value: "0", title: "stacks in no request or job" }, "- (none)"));
    $("endpoint").addEventListener("change", (ev) => setEndpoint(ev.target.value));
    $("endpoint-box").hidden = false;
  }

  // ---- hooks for tests -------------------------------------------------------------------------------------------
  window.rvReport = {
    data: { threads, owner, gc, unknown, natives, markers, events, names: N, meta: M, tids: D.tids, blameTotal: blame.total,
            blameEstimated: blame.estimated },
    view: () => ({ t0: view.t0, t1: view.t1 }),
    setView,
    // The lane's rect in client (viewport) coordinates, and the x of time t in the same coordinates.
    laneRect: (id) => {
      const l = laneById.get(id), r = canvas.getBoundingClientRect();
      return l ? { x: r.left, y: r.top + l.y, width: W, height: l.h } : null;
    },
    clientX: (t) => canvas.getBoundingClientRect().left + X(t),
    drawn: () => drawn,
    eventName: (i) => (i >= 0 ? N.event[events.e[i]] : null),
    crubyName: (i) => (i >= 0 ? N.cruby[events.e[i]] : null),
    drawNow: () => { drawPending = false; draw(); },
    flame, blameFlame,
    // The blamed waits of Ruby thread `thread` overlapping [s, e), each as its segments and parts (see blame).
    blameOf: (thread, s, e) => blame.waitsIn(thread, s, e).map(blame.ofWait),
    stackOf: (i) => { const s = stackOfEvent(i); return s < 0 ? null : Array.from(stackFrames.subarray(stackOff[s], stackOff[s + 1]), frameText); },
    releaseReason: releaseReasonOf,
    // The endpoint filter: the endpoints ([0] is "-"), choosing one by name (null: all), and a block's endpoint.
    endpoints: () => ENDPOINTS.slice(),
    setEndpoint: (name) => setEndpoint(name === null ? "all" : String(ENDPOINTS.indexOf(name))),
    blockEndpoint: (thread, i) => { const t = threadById.get(thread); return t && i >= 0 && i < t.n ? ENDPOINTS[t.ep[i]] : null; },
  };

  resize();
  setView(T0, T1);
  draw();
  if (flame) flame.draw();
  if (blameFlame) blameFlame.draw();
  updateEventList(T0);
  window.rvReportLoadMs = performance.now() - loadStart;
  document.body.dataset.ready = "1";
})();
