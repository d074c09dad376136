// The live plots, drawn by the browser from the feed that ui/plots.py writes. Runs as the gr.HTML's js_on_load:
// `element` is the component, `props.value` the feed (append-only text, one record per line; sent whole or as what
// it gained, ui/delta.js), `props.config` names and colours.
//
// Only the new lines are parsed on each update, and only the new marks are painted: each plot is a <canvas>
// whose axes grow by 1.5x when a mark falls outside them (then, and only then, it is repainted whole: O(log n)
// repaints per run). Drawing is paced by its own cost (at most every max(250 ms, 4 x the last draw)) and each
// plot is drawn in its own task. An SVG plotting library redraws every mark on every update: with Plotly.js
// that was 50-400 ms per update at 900 tokens on a 2-core machine (BENCHMARKS.md's history, "The page's cost").
const cfg = JSON.parse(props.config);
const host = (name) => element.querySelector(".mirror-plot-" + name);
const STAGES = Object.fromEntries(cfg.stages.map(([stage, name, color]) => [stage, {name, color}]));
const FONT = "12px sans-serif", INK = "#374151", GRID = "#e5e7eb";

function niceStep(raw) {
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(raw, 1e-9))));
  return [1, 2, 5, 10].map((m) => m * p).find((v) => v >= raw);
}
const fmt = (v) => String(Math.round(v * 100) / 100);

const PARTS = {};  // plot name → its elements and size, made once and reused by each new comparison's plot
const kept = (name) => {  // the name's parts, where they are still in their host (not emptied or replaced)
  const p = PARTS[name];
  return p && p.el === host(name) && p.canvas.parentNode === p.el ? p : null;
};
function parts(name) {
  // A plot host's title, canvas, legend, tooltip and cursor. Made again only where the host was emptied or
  // replaced: a new comparison reuses them (a new canvas and a read of the host's width, which lays the page out,
  // made every repeat's first update a long task). Listeners go to the plot that holds the canvas now.
  let p = kept(name);
  if (p) return p;
  const el = host(name);
  const div = (cls) => { const d = document.createElement("div"); d.className = cls; return d; };
  el.innerHTML = "";
  p = {el, head: div("mirror-plot-title"), canvas: document.createElement("canvas"), key: div("mirror-plot-legend"),
       tip: div("mirror-plot-tip"), cursor: null, plot: null, width: 0, shape: ""};
  el.append(p.head, p.canvas, p.key, p.tip);
  for (const type of ["mousemove", "mouseleave", "click", "dblclick"]) {
    p.canvas.addEventListener(type, (e) => { if (p.plot) p.plot.on(type, e); });
  }
  PARTS[name] = p;
  return p;
}

class Plot {
  // One canvas with a title, an HTML legend and a tooltip; panels are rectangles of it with their own axes.
  constructor(name, title, height, legend) {
    const p = parts(name);
    p.plot = this;
    this.parts = p; this.el = p.el; this.head = p.head; this.canvas = p.canvas; this.tip = p.tip;
    this.title = title; this.height = height;
    p.head.textContent = title;
    const key = legend.map(([label, color, mark]) =>
      `<span><i class="${mark || "box"}" style="--c:${color}"></i>${label}</span>`).join("");
    if (p.key.innerHTML !== key) p.key.innerHTML = key;
    p.tip.style.display = "none";
    if (p.cursor) p.cursor.style.display = "none";
    this.cursorEl = p.cursor; this.cursorT = null;
    delete this.el.dataset.cursor; delete this.el.dataset.zoom;  // as on a new host: no cursor, not zoomed
    this.size();
  }
  on(type, e) {  // the canvas's events (parts): the tooltip here, clicks in the plots that take them
    if (type === "mousemove") {
      const r = this.canvas.getBoundingClientRect();
      const text = this.describe(e.clientX - r.left, e.clientY - r.top);
      this.tip.style.display = text ? "block" : "none";
      if (text) {
        this.tip.textContent = text;
        this.tip.style.left = (e.clientX - r.left + 14) + "px"; this.tip.style.top = (e.clientY - r.top + 14) + "px";
      }
    } else if (type === "mouseleave") this.tip.style.display = "none";
    else if (type === "click") this.click(e);
    else if (type === "dblclick") this.dblclick(e);
  }
  click() {}
  dblclick() {}
  cursor(t) {  // the replay's time cursor (ms since the runs' starts; null hides it): a line over this.panel
    if (!this.cursorEl) { this.cursorEl = this.parts.cursor = document.createElement("div");
                          this.cursorEl.className = "mirror-plot-cursor"; this.el.append(this.cursorEl); }
    this.cursorT = t;
    const p = this.panel, show = t !== null && t >= p.xmin && t <= p.xmax;
    this.cursorEl.style.display = show ? "block" : "none";
    this.el.dataset.cursor = t === null ? "" : fmt(t);  // read by tests
    if (!show) return;
    this.cursorEl.style.left = (this.canvas.offsetLeft + p.px(t)) + "px";
    this.cursorEl.style.top = (this.canvas.offsetTop + p.box.y) + "px";
    this.cursorEl.style.height = p.box.h + "px";
  }
  size() {
    // The host's width is read once (again after a resize, which clears it, or while the host is hidden); the
    // canvas is sized only when its shape changes, else cleared.
    const p = this.parts, ratio = window.devicePixelRatio || 1;
    if (!p.width) {
      const w = this.el.clientWidth;  // 0 while hidden (another tab): not kept, read again by the next plot
      this.width = Math.max(w, 320);
      if (w > 0) p.width = this.width;
    } else this.width = p.width;
    const shape = `${this.width}x${this.height}@${ratio}`;
    if (shape !== p.shape) {
      this.canvas.width = this.width * ratio; this.canvas.height = this.height * ratio;
      this.canvas.style.width = this.width + "px"; this.canvas.style.height = this.height + "px";
      p.shape = shape;
    }
    this.ctx = this.canvas.getContext("2d");
    this.ctx.setTransform(1, 0, 0, 1, 0, 0);
    this.ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
  }
  describe() { return ""; }
}

class Panel {
  // A rectangle of a plot with linear axes [0, xmax] x [0, ymax] (or fixed ones).
  constructor(ctx, box, xTitle, yTitle, xmax, ymax) {
    Object.assign(this, {ctx, box, xTitle, yTitle, xmax, ymax, xmin: 0});
  }
  px(x) { return this.box.x + ((x - this.xmin) / (this.xmax - this.xmin)) * this.box.w; }
  py(y) { return this.box.y + this.box.h - (y / this.ymax) * this.box.h; }
  fits(x, y) { return x <= this.xmax && y <= this.ymax; }
  axes(title, integerX, yTicks = true) {  // yTicks false: the caller writes row names there (the lane timeline)
    const c = this.ctx, b = this.box;
    c.clearRect(b.x - 56, b.y - 22, b.w + 64, b.h + 58);
    c.font = FONT; c.fillStyle = INK;
    if (title) { c.textAlign = "center"; c.textBaseline = "bottom"; c.fillText(title, b.x + b.w / 2, b.y - 6); }
    const xs = Math.max(niceStep((this.xmax - this.xmin) / 8), integerX ? 1 : 0), ys = niceStep(this.ymax / 5);
    c.textAlign = "center"; c.textBaseline = "top";
    for (let x = Math.ceil(this.xmin / xs - 1e-9) * xs; x <= this.xmax + 1e-9; x += xs) {
      c.fillStyle = GRID; c.fillRect(this.px(x), b.y, 1, b.h);
      c.fillStyle = INK; c.fillText(fmt(x), this.px(x), b.y + b.h + 4);
    }
    c.textAlign = "right"; c.textBaseline = "middle";
    for (let y = 0; yTicks && y <= this.ymax + 1e-9; y += ys) {
      c.fillStyle = GRID; c.fillRect(b.x, this.py(y), b.w, 1);
      c.fillStyle = INK; c.fillText(fmt(y), b.x - 6, this.py(y));
    }
    c.textAlign = "center"; c.textBaseline = "top";
    c.fillText(this.xTitle, b.x + b.w / 2, b.y + b.h + 20);
    c.save(); c.translate(b.x - 44, b.y + b.h / 2); c.rotate(-Math.PI / 2);
    c.textBaseline = "middle"; c.fillText(this.yTitle, 0, 0); c.restore();
  }
  at(px, py) {  // data coordinates of a canvas point, or null outside the panel
    const b = this.box;
    if (px < b.x || px > b.x + b.w || py < b.y || py > b.y + b.h) return null;
    return [this.xmin + ((px - b.x) / b.w) * (this.xmax - this.xmin), ((b.y + b.h - py) / b.h) * this.ymax];
  }
}

const MARGIN = {l: 70, r: 20, t: 30, b: 44};

class Race extends Plot {
  // Committed tokens against ms since each run's start: a step line per decoder.
  constructor(decoders) {
    super("race", "Race: tokens vs wall time (each decoder ran alone)", 340,
          decoders.map((d) => [cfg.titles[d], cfg.colors[d], "line"]));
    this.decoders = decoders;
    this.points = Object.fromEntries(decoders.map((d) => [d, [[0, 0]]]));
    this.painted = Object.fromEntries(decoders.map((d) => [d, 1]));
    this.panel = new Panel(this.ctx, {x: MARGIN.l, y: MARGIN.t, w: this.width - MARGIN.l - MARGIN.r,
                                      h: this.height - MARGIN.t - MARGIN.b}, "ms since run start", "tokens committed", 10, 10);
    this.repaint();
  }
  add(d, t) { const p = this.points[d]; if (p) p.push([t, p.length]); }
  draw() {
    let x = 0, y = 0;
    for (const d of this.decoders) for (const [t, n] of this.points[d].slice(this.painted[d])) { x = Math.max(x, t); y = Math.max(y, n); }
    if (!this.panel.fits(x, y)) {
      this.panel.xmax = Math.max(this.panel.xmax, x * 1.5); this.panel.ymax = Math.max(this.panel.ymax, y * 1.5);
      this.repaint();
    } else this.paint();
  }
  repaint() {
    this.panel.axes("");
    for (const d of this.decoders) this.painted[d] = 1;
    this.paint();
    if (this.cursorEl) this.cursor(this.cursorT);
  }
  paint() {
    const c = this.ctx, p = this.panel;
    c.lineWidth = 2.5;
    for (const d of this.decoders) {
      const pts = this.points[d];
      if (this.painted[d] >= pts.length) continue;
      c.strokeStyle = cfg.colors[d]; c.beginPath();
      let [t0, n0] = pts[this.painted[d] - 1];
      c.moveTo(p.px(t0), p.py(n0));
      for (const [t, n] of pts.slice(this.painted[d])) { c.lineTo(p.px(t), p.py(n0)); c.lineTo(p.px(t), p.py(n)); n0 = n; }
      c.stroke();
      this.painted[d] = pts.length;
    }
    this.el.dataset.points = this.decoders.map((d) => this.points[d].length).join(",");  // read by tests
  }
  fit() {  // the run ended: axes to the data (no room left for growth), repainted once
    const pts = this.decoders.flatMap((d) => this.points[d]);
    this.panel.xmax = Math.max(...pts.map(([t]) => t), 1) * 1.04;
    this.panel.ymax = Math.max(...pts.map(([, n]) => n), 1) * 1.06;
    this.repaint();
  }
  name(d, text) { const span = this.el.querySelectorAll(".mirror-plot-legend span")[this.decoders.indexOf(d)];
                  if (span) span.lastChild.textContent = text; }
  describe(x, y) {
    const at = this.panel.at(x, y);
    if (!at) return "";
    return this.decoders.map((d) => {
      const pts = this.points[d];
      let n = 0;
      for (const [t, k] of pts) { if (t > at[0]) break; n = k; }
      return `${cfg.short[d]}: ${n} tokens by ${fmt(at[0])} ms`;
    }).join(" · ");
  }
}

class Steps extends Plot {
  // Per speculative decoder, per verification step: stacked bars (accepted from a reused branch / accepted
  // fresh / correction or bonus) and a hit or miss marker above.
  constructor(spec) {
    const n = Math.max(spec.length, 1), ph = 150;
    super("steps", "Tokens per step (verification pass)", MARGIN.t + n * (ph + MARGIN.b + 24),
          [...cfg.series.map(([label, color]) => [label, color]), ...cfg.hits.map(([label, , color], i) =>
            [label, color, i === 0 ? "dot" : "cross"])]);
    this.spec = spec;
    this.rows = Object.fromEntries(spec.map((d) => [d, []]));
    this.painted = Object.fromEntries(spec.map((d) => [d, 0]));
    this.panels = Object.fromEntries(spec.map((d, i) => [d, new Panel(this.ctx, {
      x: MARGIN.l, y: MARGIN.t + 18 + i * (ph + MARGIN.b + 24), w: this.width - MARGIN.l - MARGIN.r, h: ph},
      "step", "tokens", 10, 5)]));
    if (!spec.length) {
      this.ctx.font = FONT; this.ctx.fillStyle = INK; this.ctx.textAlign = "center"; this.ctx.textBaseline = "middle";
      this.ctx.fillText("Run SD or Mirror-SD to see tokens per step", this.width / 2, this.height / 2);
    }
    this.repaint();
  }
  click(e) {  // a bar: that step in the inspector, the lane timeline zoomed to it
    const r = this.canvas.getBoundingClientRect(), hit = this.at(e.clientX - r.left, e.clientY - r.top);
    if (hit) openStep(hit[0], hit[1][0], false);
  }
  gamma(d, g) { const p = this.panels[d]; if (p) { p.ymax = g + 1.8; this.repaint(); } }
  add(d, step, reused, fresh, extra, hit) { const r = this.rows[d]; if (r) r.push([step, reused, fresh, extra, hit]); }
  draw() {
    let grow = false;
    for (const d of this.spec) {
      const p = this.panels[d];
      const last = this.rows[d][this.rows[d].length - 1];
      if (last && last[0] + 1 > p.xmax) { p.xmax = (last[0] + 1) * 1.5; grow = true; }
    }
    if (grow) this.repaint(); else this.paint();
  }
  repaint() {
    for (const d of this.spec) { this.panels[d].axes(cfg.titles[d], true); this.painted[d] = 0; }
    this.paint();
  }
  paint() {
    const c = this.ctx;
    for (const d of this.spec) {
      const p = this.panels[d], w = Math.max(p.px(0.8) - p.px(0), 1);
      for (const [step, ...stack] of this.rows[d].slice(this.painted[d])) {
        let y = 0;
        stack.slice(0, 3).forEach((v, j) => {
          if (!v) return;
          c.fillStyle = cfg.series[j][1];
          c.fillRect(p.px(step) - w / 2, p.py(y + v), w, p.py(y) - p.py(y + v));
          y += v;
        });
        const hit = stack[3];
        if (hit !== "-") {
          const [, , color] = cfg.hits[hit === "1" ? 0 : 1], x = p.px(step), yy = p.py(y + 0.45);
          c.strokeStyle = color; c.fillStyle = color; c.lineWidth = 1.5;
          if (hit === "1") { c.beginPath(); c.arc(x, yy, 3, 0, 2 * Math.PI); c.fill(); }
          else { c.beginPath(); c.moveTo(x - 3, yy - 3); c.lineTo(x + 3, yy + 3); c.moveTo(x + 3, yy - 3); c.lineTo(x - 3, yy + 3); c.stroke(); }
        }
      }
      this.painted[d] = this.rows[d].length;
    }
  }
  fit() {
    for (const d of this.spec) { const r = this.rows[d]; if (r.length) this.panels[d].xmax = r[r.length - 1][0] + 1; }
    this.repaint();
  }
  at(x, y) {  // [decoder, its step row] under a canvas point, or null
    for (const d of this.spec) {
      const at = this.panels[d].at(x, y);
      if (!at) continue;
      const row = this.rows[d].find(([step]) => Math.abs(step - at[0]) <= 0.5);
      return row ? [d, row] : null;
    }
    return null;
  }
  describe(x, y) {
    const found = this.at(x, y);
    if (!found) return "";
    const [d, [step, reused, fresh, extra, hit]] = found;
    return `${cfg.short[d]} step ${step}: ${reused + fresh} accepted (${reused ? "reused branch" : "fresh window"}) + ` +
           `${extra} correction/bonus` + (hit === "-" ? "" : hit === "1" ? "; hit: the next window is a reused branch"
                                                                         : "; miss: the next window is rolled out afresh") +
           " · click: open it in the inspector";
  }
}

class Acceptance extends Plot {
  // Histogram of A_t and per-position acceptance α_i = #(A_t ≥ i) / #(D_t ≥ i), each point with its n = #(D_t ≥ i)
  // (a position past γ is offered only by a longer context window: a few windows), and the τ(γ) the curve implies,
  // 1 + α_1 + … + α_γ: what a step of the run's γ commits at these acceptances, beside the measured τ (longer
  // context windows raise it above τ(γ)). From the step records (a few numbers per decoder: repainted whole).
  constructor(decoders) {
    super("accept", "Acceptance", 320, decoders.filter((d) => d !== "ar").map((d) => [cfg.titles[d], cfg.colors[d]]));
    this.decoders = decoders.filter((d) => d !== "ar");
    this.steps = Object.fromEntries(this.decoders.map((d) => [d, []]));
    this.gammas = {};  // decoder → its run's γ (the feed's B record)
    const w = (this.width - MARGIN.l - MARGIN.r - 80) / 2, h = this.height - MARGIN.t - MARGIN.b - 10;
    this.hist = new Panel(this.ctx, {x: MARGIN.l, y: MARGIN.t + 10, w, h}, "A_t (accepted per step)", "steps", 1, 1);
    this.alpha = new Panel(this.ctx, {x: MARGIN.l + w + 80, y: MARGIN.t + 10, w, h}, "draft position i", "α_i", 1, 1);
    this.draw();
  }
  add(d, drafted, accepted, committed) { const s = this.steps[d]; if (s) s.push([drafted, accepted, committed]); }
  gamma(d, g) { if (d in this.steps) this.gammas[d] = g; }
  stats(d) {
    const steps = this.steps[d];
    const gamma = Math.max(1, ...steps.map(([D]) => D));
    const hist = new Array(gamma + 1).fill(0), reached = new Array(gamma + 1).fill(0), offered = new Array(gamma + 1).fill(0);
    for (const [D, A] of steps) {
      hist[Math.min(A, gamma)] += 1;
      for (let i = 1; i <= D; i++) { offered[i] += 1; if (A >= i) reached[i] += 1; }
    }
    const alpha = offered.map((o, i) => (i && o ? reached[i] / o : null));
    const g = Math.min(this.gammas[d] || gamma, gamma);  // τ(γ) over the run's γ positions
    const tau = steps.length ? 1 + alpha.slice(1, g + 1).reduce((sum, v) => sum + (v || 0), 0) : null;
    const measured = steps.length ? steps.reduce((sum, s) => sum + s[2], 0) / steps.length : null;  // τ = Σ n_t / #steps
    return {gamma, hist, alpha, reached, offered, g, tau, measured};
  }
  draw() {
    const c = this.ctx, stats = this.decoders.map((d) => this.stats(d));
    const gamma = Math.max(1, ...stats.map((s) => s.gamma));
    this.hist.xmax = gamma + 1; this.hist.ymax = Math.max(1, ...stats.flatMap((s) => s.hist)) * 1.15;
    this.alpha.xmax = gamma + 1; this.alpha.ymax = 1.25;  // room above 1 for the counts and τ(γ)
    this.hist.axes("histogram of A_t", true);
    this.alpha.axes("per-position α_i = #(A_t ≥ i) / #(D_t ≥ i), n = #(D_t ≥ i)", true);
    const bw = (this.hist.px(0.8) - this.hist.px(0)) / Math.max(stats.length, 1);
    c.font = FONT; c.textBaseline = "bottom";
    stats.forEach((s, k) => {
      const color = cfg.colors[this.decoders[k]];
      c.fillStyle = color;
      s.hist.forEach((v, a) => { const x = this.hist.px(a + 0.1) + k * bw; c.fillRect(x, this.hist.py(v), bw, this.hist.py(0) - this.hist.py(v)); });
      c.strokeStyle = color; c.lineWidth = 2; c.beginPath();
      s.alpha.forEach((v, i) => { if (v === null) return; const x = this.alpha.px(i), y = this.alpha.py(v);
                                  if (i === 1) c.moveTo(x, y); else c.lineTo(x, y); c.fillRect(x - 3, y - 3, 6, 6); });
      c.stroke();
      c.textAlign = "left";  // each point's n, one line per decoder above it
      s.alpha.forEach((v, i) => { if (v !== null) c.fillText(`n=${s.offered[i]}`, this.alpha.px(i) + 5, this.alpha.py(v) - 4 - 13 * k); });
      if (s.tau !== null) {
        c.textAlign = "right";
        c.fillText(`${cfg.short[this.decoders[k]]}: τ(γ=${s.g}) = 1 + Σ α_i = ${s.tau.toFixed(2)} · measured τ ` +
                   s.measured.toFixed(2), this.alpha.box.x + this.alpha.box.w - 4, this.alpha.py(1.25) + 14 * (k + 1));
      }
    });
    this.last = stats;
    this.el.dataset.alpha = JSON.stringify(Object.fromEntries(this.decoders.map((d, k) => [d, {  // read by tests
      n: stats[k].offered.slice(1), accepted: stats[k].reached.slice(1), tau: stats[k].tau, gamma: stats[k].g}])));
  }
  describe(x, y) {
    const h = this.hist.at(x, y), a = this.alpha.at(x, y);
    if (h) { const k = Math.floor(h[0]); return this.decoders.map((d, i) => `${cfg.short[d]}: ${this.last[i].hist[k] ?? 0} steps with A_t = ${k}`).join(" · "); }
    if (a) {
      const k = Math.round(a[0]);
      return this.decoders.map((d, i) => { const s = this.last[i], v = s.alpha[k];
        return `${cfg.short[d]}: α_${k} = ` + (v == null ? "—" : `${v.toFixed(3)} (${s.reached[k]} of n = ${s.offered[k]} windows)`); }).join(" · ");
    }
    return "";
  }
}

class Timeline extends Plot {
  // Gantt of busy spans: a row per (decoder, lane), x = ms since that run's start.
  constructor(rows) {
    const ROW = 24;
    super("gantt", "Lane timeline: busy spans per stage (overlap = draft hidden under the target)",
          MARGIN.t + ROW * rows.length + MARGIN.b, cfg.stages.map(([, name, color]) => [name, color]));
    this.rows = rows; this.ROW = ROW; this.spans = []; this.painted = 0; this.zoomed = null;
    this.panel = new Panel(this.ctx, {x: 130, y: MARGIN.t, w: this.width - 130 - MARGIN.r, h: ROW * rows.length},
                           "ms since run start", "", 10, rows.length);
    this.repaint();
  }
  dblclick() { if (this.zoomed !== null) this.zoom(null); }
  zoom(rowIdx, step) {  // the time range of one step's spans on these rows (null: the whole run)
    const spans = rowIdx ? this.spans.filter(([row, , , , s]) => s === step && rowIdx.includes(row)) : [];
    if (!spans.length) {
      this.zoomed = null; this.panel.xmin = 0; this.head.textContent = this.title; this.el.dataset.zoom = "";
      this.fit();
      return;
    }
    const t0 = Math.min(...spans.map((s) => s[2])), t1 = Math.max(...spans.map((s) => s[3])), pad = (t1 - t0) * 0.15 + 0.05;
    this.zoomed = step; this.panel.xmin = Math.max(0, t0 - pad); this.panel.xmax = t1 + pad;
    this.head.textContent = `${this.title} · zoomed to step ${step} (double-click: the whole run)`;
    this.el.dataset.zoom = `${step} ${fmt(this.panel.xmin)} ${fmt(this.panel.xmax)}`;  // read by tests
    this.repaint();
  }
  add(row, stage, t0, t1, step) { this.spans.push([row, stage, t0, t1, step]); }
  rename(row, name) { if (this.rows[row] !== name) { this.rows[row] = name; this.repaint(); } }
  draw() {
    let end = 0;
    for (const s of this.spans.slice(this.painted)) end = Math.max(end, s[3]);
    if (end > this.panel.xmax && this.zoomed === null) { this.panel.xmax = end * 1.5; this.repaint(); } else this.paint();
  }
  repaint() {
    const c = this.ctx, p = this.panel;
    p.axes("", false, false);  // no y ticks: the row names stand there
    c.clearRect(p.box.x, p.box.y, p.box.w, p.box.h);
    c.clearRect(0, p.box.y - 2, p.box.x - 1, p.box.h + 4);
    c.font = FONT; c.fillStyle = INK; c.textAlign = "right"; c.textBaseline = "middle";
    this.rows.forEach((name, i) => c.fillText(name, p.box.x - 8, p.box.y + this.ROW * (i + 0.5)));
    this.painted = 0;
    this.paint();
    if (this.cursorEl) this.cursor(this.cursorT);
  }
  paint() {
    const c = this.ctx, p = this.panel;
    c.save(); c.beginPath(); c.rect(p.box.x, p.box.y, p.box.w, p.box.h); c.clip();  // a zoomed range: spans cut at its edges
    for (const [row, stage, t0, t1] of this.spans.slice(this.painted)) {
      if (t1 < p.xmin || t0 > p.xmax) continue;
      c.fillStyle = (STAGES[stage] || {color: "#a3a3a3"}).color;
      c.fillRect(p.px(t0), p.box.y + this.ROW * row + 4, Math.max(p.px(t1) - p.px(t0), 0.6), this.ROW - 8);
    }
    c.restore();
    this.painted = this.spans.length;
    this.el.dataset.painted = this.painted;  // read by tests
  }
  fit() {
    if (this.zoomed !== null) return;  // a zoom stays until a double-click
    this.panel.xmax = Math.max(...this.spans.map((s) => s[3]), 1) * 1.02;
    this.repaint();
  }
  describe(x, y) {
    const at = this.panel.at(x, y);
    if (!at) return "";
    const row = Math.floor((y - this.panel.box.y) / this.ROW);
    const s = this.spans.find(([r, , t0, t1]) => r === row && t0 <= at[0] && at[0] <= t1);
    if (!s) return "";
    const [, stage, t0, t1, step] = s;
    return `${this.rows[row]} · ${(STAGES[stage] || {name: stage}).name} · step ${step} · start ${t0.toFixed(2)} ms · ` +
           `${(t1 - t0).toFixed(2)} ms`;
  }
}

let feed = "";       // the feed so far (whole values and deltas put together)
let end = 0;         // its length as the server sent it (a delta that starts elsewhere missed an update)
let inSync = true;   // false after such a gap: the next whole value redraws from the start
let seen = 0;        // characters of the feed already parsed
let head = null;     // the feed's first line (R ...): a different one means a new comparison
let S = null;        // the repeat being drawn: its plots and what changed since the last draw
let timer = null, drawing = false, lastCost = 0;

function empty() {
  // No comparison to draw (the page opened, or a new one starts): plots drawn before keep their parts, blanked, for
  // the next comparison to reuse (and the page keeps its height); before any, a line says what will come.
  let reused = false;
  for (const name of ["race", "steps", "gantt", "accept"]) {
    const p = kept(name);
    if (!p) { host(name).innerHTML = ""; continue; }
    reused = true;
    p.plot = null;
    p.head.textContent = ""; p.key.innerHTML = ""; p.tip.style.display = "none";
    if (p.cursor) p.cursor.style.display = "none";
    p.canvas.getContext("2d").clearRect(0, 0, p.canvas.width, p.canvas.height);  // (scaled by the ratio: all of it)
    for (const key of Object.keys(p.el.dataset)) delete p.el.dataset[key];
  }
  if (!reused) host("race").innerHTML = '<p class="mirror-plot-empty">Press Run: the plots fill in as the engine ' +
                                      "reports tokens, steps and spans.</p>";
}

function begin(decoders) {
  const spec = decoders.filter((d) => d !== "ar");
  const rows = [];
  for (const d of decoders) {
    rows.push([d, "target"]);
    if (d !== "ar") rows.push([d, "draft"]);
  }
  S = {decoders, rows, dirty: new Set(), race: new Race(decoders), steps: new Steps(spec),
       gantt: new Timeline(rows.map(([d, lane]) => cfg.short[d] + " · " + lane)), accept: new Acceptance(decoders)};
}

function record(f) {
  const d = f[1];
  if (f[0] === "T") { S.race.add(d, +f[2]); S.dirty.add("race"); }
  else if (f[0] === "S") {
    const [step, drafted, accepted, committed, fromBranch, hit] = [+f[2], +f[3], +f[4], +f[5], f[6] === "1", f[7]];
    const a = Math.min(accepted, committed);
    S.steps.add(d, step, fromBranch ? a : 0, fromBranch ? 0 : a, committed - a, hit);
    S.accept.add(d, drafted, accepted, committed);
    S.dirty.add("steps"); S.dirty.add("accept");
  } else if (f[0] === "P") {
    const row = S.rows.findIndex(([rd, lane]) => rd === d && lane === f[2]);
    if (row >= 0) { S.gantt.add(row, f[3], +f[4], +f[5], +f[6]); S.dirty.add("gantt"); }
  } else if (f[0] === "B") {
    S.steps.gamma(d, +f[2]);
    S.accept.gamma(d, +f[2]);
    // each lane's devices, named in its row unless it is the CPU (a spread target: cuda:0+cuda:1)
    S.rows.forEach(([rd, lane], i) => {
      const device = lane === "target" ? f[3] : f[4];
      if (rd === d && device && device !== "cpu") S.gantt.rename(i, cfg.short[d] + " · " + lane + " · " + device);
    });
  }
  else if (f[0] === "E") { S.race.name(d, f.slice(2).join(" ")); S.dirty.add("fit"); }
  else if (f[0] === "C") { const t = f[1] === "-" ? null : +f[1]; S.race.cursor(t); S.gantt.cursor(t); }
}

function openStep(decoder, step, scroll) {
  // A token or a tokens-per-step bar was clicked: that step in the step inspector (its Run radio and Step slider,
  // as if the visitor had set them), and the lane timeline zoomed to that step's spans of that decoder.
  if (decoder !== "sd" && decoder !== "mirror") return;
  const radio = document.querySelector(`#mirror-inspect-run input[value="${decoder}"]`);
  if (radio && !radio.checked) radio.click();
  const box = document.querySelector("#mirror-inspect-step input[type=number]");
  if (box) {
    box.value = String(step);
    box.dispatchEvent(new Event("input", {bubbles: true}));
    box.dispatchEvent(new Event("change", {bubbles: true}));
    box.blur();
  }
  if (S) S.gantt.zoom(S.rows.map(([d], i) => (d === decoder ? i : -1)).filter((i) => i >= 0), step);
  const inspector = document.querySelector("#mirror-inspector");
  if (scroll && inspector) inspector.scrollIntoView({block: "nearest", behavior: "smooth"});
}

if (!window.__mirrorStepClicks) {  // a committed token of SD or Mirror-SD: open the step that committed it
  window.__mirrorStepClicks = true;
  document.addEventListener("click", (e) => {
    const tok = e.target.closest && e.target.closest(".mirror-tok[data-step]");
    const column = tok && tok.closest("[id^=mirror-tokens-]");
    if (column && +tok.dataset.step > 0) window.__mirrorOpenStep(column.id.slice("mirror-tokens-".length), +tok.dataset.step);
  });
}
window.__mirrorOpenStep = (decoder, step) => openStep(decoder, step, true);

const nextTask = () => new Promise((resolve) => setTimeout(resolve, 0));

async function draw() {
  // One plot per task: the browser handles input (e.g. a click on Stop) between them.
  drawing = true;
  let cost = 0;
  while (S && S.dirty.size) {
    const name = S.dirty.values().next().value;
    S.dirty.delete(name);
    const t = performance.now();
    if (name === "fit") {  // the runs have ended: axes fitted to the data (no room left for growth), repainted once
      for (const plot of ["race", "steps", "gantt"]) { S.dirty.delete(plot); S[plot].fit(); }
    } else S[name].draw();
    const took = performance.now() - t;
    cost += took;
    if (window.__mirror) (window.__mirror.draws = window.__mirror.draws || []).push([name, took]);
    await nextTask();
  }
  lastCost = cost;
  drawing = false;
}

function schedule(now) {
  if (timer !== null || drawing) return;
  timer = setTimeout(() => { timer = null; draw().then(() => { if (S && S.dirty.size) schedule(false); }); },
                     now ? 0 : Math.max(250, 4 * lastCost));
}

function take(d) {
  // Puts a value (ui/delta.js) into `feed`: the whole feed, or what it gained since the last update. False: nothing new.
  if (d.whole) {
    if (inSync && d.chunk === feed) return false;
    if (!inSync || !d.chunk.startsWith(feed)) head = null;  // not a continuation of what was drawn: start over
    feed = d.chunk; inSync = true;
  } else {
    if (!d.chunk) return false;
    if (d.start !== end) inSync = false;  // an update that did not arrive: draw on; the event's last value is whole
    feed += d.chunk;
  }
  end = d.start + d.chunk.length;
  return true;
}

function parse() {
  // The feed's lines not parsed yet into the plots (all of them after a new comparison or a new width).
  const first = feed.slice(0, feed.indexOf("\n") + 1);
  if (!first || first !== head || feed.length < seen) {  // a new comparison (or none): start over
    head = first; seen = 0; S = null;
    if (!first) { empty(); return; }
  }
  const last = feed.lastIndexOf("\n") + 1;
  if (last <= seen) return;
  const lines = feed.slice(seen, last).split("\n");
  seen = last;
  let ended = false;
  for (const line of lines) {
    if (!line) continue;
    const f = line.split(" ");
    if (f[0] === "R") begin(f.slice(2));
    else if (S) { record(f); ended = ended || f[0] === "E"; }
  }
  schedule(ended);
}

function update() {
  if (take(delta(props.value))) parse();
}

watch("value", update);
window.addEventListener("resize", () => {  // a new width: rebuild the plots from the feed
  for (const p of Object.values(PARTS)) p.width = 0;
  if (S) { head = null; parse(); }
});
take(delta(props.value));
parse();
