// adni-pu visual QC report: group view, per-scan view, ratings. Hand-written, no framework;
// every text from the data goes into the page through textContent (never as markup).
(function () {
  "use strict";
  const D = JSON.parse(document.getElementById("qc-data").textContent);
  const scans = D.scans, metrics = D.metrics, RATINGS = D.rating_values;
  const byId = new Map(scans.map((s, i) => [s.id, i]));
  const storeKey = "adni-pu-qc:" + D.key;
  const PAGE = 50;
  const $ = (id) => document.getElementById(id);
  let ratings = {};          // scan id -> {rating, note, rater, date}
  let order = [];            // scan indices in the table's sort and filter
  let sortKey = "score", sortDir = -1, page = 0, sel = 0, current = -1;

  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined && text !== null) e.textContent = String(text);
    if (cls) e.className = cls;
    return e;
  }
  function fmt(v) {
    if (v === null || v === undefined) return "n/a";
    const a = Math.abs(v);
    return a !== 0 && (a >= 1e4 || a < 1e-3) ? v.toExponential(2) : String(+v.toPrecision(3));
  }
  function now() { return new Date().toISOString().replace(/\.\d+Z$/, "Z"); }
  function say(text, ok) { const m = $("message"); m.textContent = text; m.className = ok ? "ok" : ""; }

  // ---- ratings: kept in local storage as they are made, saved as a TSV download ----
  function store() {
    try { localStorage.setItem(storeKey, JSON.stringify(ratings)); } catch (e) { /* private mode */ }
  }
  function restore() {
    for (const r of D.ratings) ratings[r.id] = {rating: r.rating, note: r.note, rater: r.rater, date: r.date};
    let kept = {};
    try { kept = JSON.parse(localStorage.getItem(storeKey) || "{}") || {}; } catch (e) { kept = {}; }
    for (const [id, r] of Object.entries(kept)) {  // the newer of the file's and the browser's
      if (byId.has(id) && (!ratings[id] || (r.date || "") > (ratings[id].date || ""))) ratings[id] = r;
    }
    try { $("rater").value = localStorage.getItem("adni-pu-qc-rater") || ""; } catch (e) { /* none */ }
  }
  function rate(id, rating, note) {
    const old = ratings[id];
    if (!rating && note === undefined) { delete ratings[id]; store(); return; }
    ratings[id] = {rating: rating || (old ? old.rating : "unsure"),
                   note: note !== undefined ? note : (old ? old.note : ""),
                   rater: $("rater").value.trim(), date: now()};
    store();
  }
  function clean(text) { return String(text || "").replace(/[\t\r\n]+/g, " ").trim(); }
  function tsv() {
    const lines = [D.ratings_columns.join("\t")];
    for (const s of scans) {
      const r = ratings[s.id];
      if (r) lines.push([s.id, r.rating, r.note, r.rater, r.date].map(clean).join("\t"));
    }
    return lines.join("\n") + "\n";
  }
  function save() {
    const blob = new Blob([tsv()], {type: "text/tab-separated-values"});
    const a = el("a");
    a.href = URL.createObjectURL(blob);
    a.download = "qc_ratings.tsv";
    document.body.appendChild(a);
    a.click();
    setTimeout(() => { URL.revokeObjectURL(a.href); a.remove(); }, 1000);
    const n = Object.keys(ratings).length;
    say("saved " + n + " rating(s) as qc_ratings.tsv (the browser's download folder)" +
        ($("rater").value.trim() ? "" : "; no rater name given"), true);
  }
  function parse(text, name) {  // the rules of adni_pu.preprocessing.qc_ratings.read_ratings
    const lines = text.replace(/^\ufeff/, "").split(/\r?\n/);
    const head = (lines[0] || "").split("\t").map((h) => h.trim().toLowerCase());
    if (head.join("\t") !== D.ratings_columns.join("\t"))
      throw new Error(name + " line 1: expected the header " + D.ratings_columns.join(" <tab> "));
    const out = {}, where = {};
    for (let i = 1; i < lines.length; i++) {
      if (!lines[i].trim()) continue;
      const f = lines[i].split("\t").map((x) => x.trim()), n = i + 1;
      if (f.length !== D.ratings_columns.length)
        throw new Error(name + " line " + n + ": expected " + D.ratings_columns.length + " tab-separated fields, found " + f.length);
      const rating = f[1].toLowerCase();
      if (!RATINGS.includes(rating))
        throw new Error(name + " line " + n + ": rating '" + f[1] + "' is not one of " + RATINGS.join(", "));
      if (!byId.has(f[0])) throw new Error(name + " line " + n + ": scan '" + f[0] + "' is not in this report");
      if (out[f[0]]) throw new Error(name + " line " + n + ": scan '" + f[0] + "' is rated twice (first on line " + where[f[0]] + ")");
      out[f[0]] = {rating: rating, note: f[2], rater: f[3], date: f[4]};
      where[f[0]] = n;
    }
    return out;
  }
  function load(file) {
    const reader = new FileReader();
    reader.onload = () => {
      try {
        ratings = parse(String(reader.result), file.name);
        store();
        say("loaded " + Object.keys(ratings).length + " rating(s) from " + file.name, true);
        refresh();
      } catch (e) { say(e.message + "; nothing loaded"); }
    };
    reader.readAsText(file);
  }

  // ---- group view: strip plots ----
  function quantile(sorted, q) {
    const p = (sorted.length - 1) * q, i = Math.floor(p);
    return sorted[i] + (sorted[Math.min(i + 1, sorted.length - 1)] - sorted[i]) * (p - i);
  }
  function strips() {
    const box = $("strips");
    const width = Math.max(300, Math.min(900, (box.clientWidth || 900) - 240)), height = 44;
    metrics.forEach((m, k) => {
      const vals = [];
      scans.forEach((s, i) => { if (s.m[k] !== null) vals.push([s.m[k], i]); });
      const row = el("div", null, "strip");
      row.appendChild(el("div", m.name, "name"));
      const c = el("canvas");
      c.width = width; c.height = height;
      row.appendChild(c);
      box.appendChild(row);
      if (!vals.length) return;
      const sorted = vals.map((v) => v[0]).sort((a, b) => a - b);
      let lo = Math.min(sorted[0], m.lo ?? Infinity), hi = Math.max(sorted[sorted.length - 1], m.hi ?? -Infinity);
      if (hi === lo) { lo -= 1; hi += 1; }
      const pad = (hi - lo) * 0.04;
      lo -= pad; hi += pad;
      const x = (v) => ((v - lo) / (hi - lo)) * (width - 2) + 1;
      const g = c.getContext("2d");
      const q1 = quantile(sorted, 0.25), q2 = quantile(sorted, 0.5), q3 = quantile(sorted, 0.75);
      g.fillStyle = "#e8eef8"; g.fillRect(x(q1), 4, Math.max(1, x(q3) - x(q1)), height - 8);
      g.fillStyle = "#36c"; g.fillRect(x(q2) - 1, 2, 2, height - 4);
      const pts = [];
      for (const [v, i] of vals) {
        const y = 6 + ((i * 2654435761) % 1000) / 1000 * (height - 12);  // fixed jitter
        const st = scans[i].status;
        g.fillStyle = st === "failed-qc" || st === "failed" ? "#c00" : "rgba(30,30,30,0.55)";
        g.fillRect(x(v) - 1.5, y - 1.5, 3, 3);
        pts.push([x(v), y, i]);
      }
      g.strokeStyle = "#c00"; g.setLineDash([4, 3]);
      for (const lim of [m.lo, m.hi]) {
        if (lim === null || lim === undefined) continue;
        g.beginPath(); g.moveTo(x(lim), 0); g.lineTo(x(lim), height); g.stroke();
      }
      const nearest = (ev) => {
        const r = c.getBoundingClientRect(), px = ev.clientX - r.left, py = ev.clientY - r.top;
        let best = null, bd = 49;
        for (const p of pts) { const d = (p[0] - px) ** 2 + (p[1] - py) ** 2; if (d < bd) { bd = d; best = p[2]; } }
        return best;
      };
      c.title = m.name + (m.lo !== null ? "; lower limit " + m.lo : "") + (m.hi !== null ? "; upper limit " + m.hi : "");
      c.addEventListener("mousemove", (ev) => {
        const i = nearest(ev);
        c.title = i === null ? m.name : scans[i].id + ": " + fmt(scans[i].m[k]);
      });
      c.addEventListener("click", (ev) => { const i = nearest(ev); if (i !== null) open(scans[i].id); });
    });
  }

  // ---- group view: the table ----
  const columns = [
    {key: "rank", label: "#"}, {key: "id", label: "scan"}, {key: "status", label: "status"},
    {key: "rating", label: "rating"}, {key: "score", label: "outlier z"},
  ].concat(metrics.map((m, k) => ({key: "m" + k, label: m.name, k: k})));
  function value(i, key) {
    const s = scans[i];
    if (key === "rank") return i;
    if (key === "id") return s.id;
    if (key === "status") return s.status;
    if (key === "rating") return ratings[s.id] ? ratings[s.id].rating : "";
    if (key === "score") return s.score === null ? Infinity : s.score;
    return s.m[+key.slice(1)];
  }
  function sortOrder() {
    const text = $("filter").value.trim().toLowerCase(), st = $("status-filter").value, rt = $("rating-filter").value;
    order = [];
    scans.forEach((s, i) => {
      if (text && !(s.id.toLowerCase().includes(text) || s.reason.toLowerCase().includes(text))) return;
      if (st && s.status !== st) return;
      const r = ratings[s.id] ? ratings[s.id].rating : "unrated";
      if (rt && r !== rt) return;
      order.push(i);
    });
    order.sort((a, b) => {
      const va = value(a, sortKey), vb = value(b, sortKey);
      if (va === null || va === undefined) return vb === null || vb === undefined ? a - b : 1;
      if (vb === null || vb === undefined) return -1;
      if (va < vb) return -sortDir;
      if (va > vb) return sortDir;
      return a - b;
    });
  }
  function head() {
    const tr = $("head");
    tr.textContent = "";
    for (const c of columns) {
      const th = el("th", c.label + (c.key === sortKey ? (sortDir > 0 ? " \u25b2" : " \u25bc") : ""));
      th.dataset.key = c.key;
      th.addEventListener("click", () => {
        if (sortKey === c.key) sortDir = -sortDir;
        else { sortKey = c.key; sortDir = c.key === "score" ? -1 : 1; }
        page = 0; sel = 0; refresh();
      });
      tr.appendChild(th);
    }
  }
  function rows() {
    const body = $("rows");
    body.textContent = "";
    const pages = Math.max(1, Math.ceil(order.length / PAGE));
    page = Math.min(page, pages - 1);
    $("page-info").textContent = "page " + (page + 1) + " of " + pages + " (" + order.length + " scans)";
    const frag = document.createDocumentFragment();
    order.slice(page * PAGE, page * PAGE + PAGE).forEach((i, n) => {
      const s = scans[i], r = ratings[s.id];
      const tr = el("tr", null, n === sel ? "sel" : "");
      tr.dataset.id = s.id;
      tr.appendChild(el("td", i + 1));
      tr.appendChild(el("td", s.id, "id"));
      tr.appendChild(el("td", s.status, "text"));
      tr.appendChild(el("td", r ? r.rating : "", r ? "rating-" + r.rating : ""));
      const sc = el("td", s.score === null ? "refused" : fmt(s.score));
      if (s.score === null || s.score > D.z_threshold) sc.className = "out";
      sc.title = s.why || s.reason;
      tr.appendChild(sc);
      metrics.forEach((m, k) => {
        const v = s.m[k], z = s.z[k], td = el("td", fmt(v));
        if (z !== null) { td.appendChild(document.createTextNode(" ")); td.appendChild(el("small", "z " + z.toFixed(1))); }
        if (v !== null && ((m.lo !== null && v < m.lo) || (m.hi !== null && v > m.hi))) td.className = "bad";
        else if (z !== null && Math.abs(z) > D.z_threshold) td.className = "out";
        tr.appendChild(td);
      });
      tr.addEventListener("click", () => open(s.id));
      frag.appendChild(tr);
    });
    body.appendChild(frag);
  }
  function counts() {
    const c = {pass: 0, fail: 0, unsure: 0};
    for (const r of Object.values(ratings)) c[r.rating] = (c[r.rating] || 0) + 1;
    const refused = scans.filter((s) => s.status !== "done" && s.status !== "skipped").length;
    $("counts").textContent = scans.length + " scans, " + refused + " refused by the automatic QC; rated " +
      Object.keys(ratings).length + " (pass " + c.pass + ", fail " + c.fail + ", unsure " + c.unsure + ")";
  }
  function refresh() {
    sortOrder(); head(); rows(); counts();
    if (current >= 0) showScan(current);
  }

  // ---- the per-scan view ----
  function open(id) { location.hash = "#scan=" + encodeURIComponent(id); }
  function showGroup() {
    current = -1;
    $("scan").hidden = true; $("group").hidden = false;
    $("figure").textContent = "";
    delete $("figure").dataset.id;
    rows(); counts();
  }
  function figure(s) {
    const img = el("img");
    img.alt = "QC picture of " + s.id;
    img.decoding = "async";
    img.src = s.fig;
    return img;
  }
  function showScan(i) {
    const s = scans[i], r = ratings[s.id];
    current = i;
    $("group").hidden = true; $("scan").hidden = false;
    const at = order.indexOf(i);
    $("position").textContent = at >= 0 ? "scan " + (at + 1) + " of " + order.length + " in the table's order" : "not in the table's filter";
    $("scan-id").textContent = s.id;
    const st = $("scan-status");
    st.textContent = s.status; st.className = "status " + s.status;
    $("scan-reason").textContent = s.reason || s.why || "";
    for (const b of document.querySelectorAll("#rate button"))
      b.classList.toggle("on", !!r && b.dataset.rating === r.rating);
    if (document.activeElement !== $("note")) $("note").value = r ? r.note : "";
    const fig = $("figure");
    if (fig.dataset.id !== s.id) {
      window.scrollTo(0, 0);
      fig.textContent = "";
      fig.dataset.id = s.id;
      fig.appendChild(s.fig ? figure(s) : el("p", "no QC picture for this scan (its preprocessing stopped before it)"));
      for (const d of [1, -1]) {  // the neighbours' pictures load while this one is looked at
        const n = order[at + d];
        if (at >= 0 && n !== undefined && scans[n].fig) new Image().src = scans[n].fig;
      }
    }
    const body = $("metric-rows");
    body.textContent = "";
    metrics.forEach((m, k) => {
      const tr = el("tr");
      tr.appendChild(el("td", m.name, "id"));
      const v = el("td", fmt(s.m[k]));
      if (s.m[k] !== null && ((m.lo !== null && s.m[k] < m.lo) || (m.hi !== null && s.m[k] > m.hi))) v.className = "bad";
      tr.appendChild(v);
      tr.appendChild(el("td", s.z[k] === null ? "" : s.z[k].toFixed(2)));
      tr.appendChild(el("td", [m.lo !== null ? "\u2265 " + m.lo : "", m.hi !== null ? "\u2264 " + m.hi : ""].filter(Boolean).join(", ")));
      body.appendChild(tr);
    });
    D.extra.forEach((name, k) => {
      const tr = el("tr");
      tr.appendChild(el("td", name, "id"));
      tr.appendChild(el("td", fmt(s.x[k])));
      tr.appendChild(el("td", "")); tr.appendChild(el("td", ""));
      body.appendChild(tr);
    });
  }
  function step(d) {
    const at = order.indexOf(current);
    const n = order[(at < 0 ? 0 : at + d)];
    if (n !== undefined) open(scans[n].id);
    else say(d > 0 ? "last scan of the table" : "first scan of the table");
  }
  function rateCurrent(rating) {
    if (current < 0) return;
    const id = scans[current].id;
    if (rating === "") { delete ratings[id]; store(); } else rate(id, rating, $("note").value.trim());
    if (rating && $("advance").checked && order.indexOf(current) < order.length - 1) step(1);
    else showScan(current);
    counts();
  }
  function route() {
    const m = location.hash.match(/^#scan=(.*)$/);
    const id = m ? decodeURIComponent(m[1]) : null;
    if (id !== null && byId.has(id)) showScan(byId.get(id));
    else showGroup();
  }

  // ---- keys ----
  document.addEventListener("keydown", (ev) => {
    const typing = ev.target instanceof HTMLInputElement || ev.target instanceof HTMLTextAreaElement ||
      ev.target instanceof HTMLSelectElement;
    if (ev.target === $("note")) {
      if (ev.key === "Enter" || ev.key === "Escape") {
        if (current >= 0 && ev.key === "Enter") rate(scans[current].id, ratings[scans[current].id] ? undefined : "unsure", $("note").value.trim());
        $("note").blur(); ev.preventDefault(); counts();
      }
      return;
    }
    if (typing || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const k = ev.key;
    if (k === "?") { $("help").hidden = !$("help").hidden; return; }
    if (k === "s") { save(); return; }
    if (current >= 0) {
      if (k === "j" || k === "ArrowRight" || k === " ") step(1);
      else if (k === "k" || k === "ArrowLeft") step(-1);
      else if (k === "p") rateCurrent("pass");
      else if (k === "f") rateCurrent("fail");
      else if (k === "u") rateCurrent("unsure");
      else if (k === "x") rateCurrent("");
      else if (k === "n") { $("note").focus(); }
      else if (k === "Escape" || k === "g") location.hash = "#";
      else return;
      ev.preventDefault();
      return;
    }
    const onPage = Math.min(PAGE, order.length - page * PAGE);
    if (k === "j" || k === "ArrowDown") sel = Math.min(sel + 1, onPage - 1);
    else if (k === "k" || k === "ArrowUp") sel = Math.max(sel - 1, 0);
    else if (k === "ArrowRight") { page++; sel = 0; }
    else if (k === "ArrowLeft") { page = Math.max(0, page - 1); sel = 0; }
    else if (k === "Enter") { const i = order[page * PAGE + sel]; if (i !== undefined) open(scans[i].id); return; }
    else return;
    ev.preventDefault();
    rows();
  });

  // ---- wiring ----
  restore();
  for (const st of [...new Set(scans.map((s) => s.status))].sort()) {
    const o = el("option", st); o.value = st; $("status-filter").appendChild(o);
  }
  $("filter").addEventListener("input", () => { page = 0; sel = 0; sortOrder(); rows(); });
  $("status-filter").addEventListener("change", () => { page = 0; sel = 0; sortOrder(); rows(); });
  $("rating-filter").addEventListener("change", () => { page = 0; sel = 0; sortOrder(); rows(); });
  $("prev-page").addEventListener("click", () => { page = Math.max(0, page - 1); sel = 0; rows(); });
  $("next-page").addEventListener("click", () => { page++; sel = 0; rows(); });
  $("save").addEventListener("click", save);
  $("load").addEventListener("change", (ev) => { if (ev.target.files[0]) load(ev.target.files[0]); ev.target.value = ""; });
  $("help-button").addEventListener("click", () => { $("help").hidden = !$("help").hidden; });
  $("rater").addEventListener("change", () => { try { localStorage.setItem("adni-pu-qc-rater", $("rater").value.trim()); } catch (e) { /* none */ } });
  $("back").addEventListener("click", () => { location.hash = "#"; });
  $("prev-scan").addEventListener("click", () => step(-1));
  $("next-scan").addEventListener("click", () => step(1));
  for (const b of document.querySelectorAll("#rate button")) b.addEventListener("click", () => rateCurrent(b.dataset.rating));
  window.addEventListener("hashchange", route);
  sortOrder(); head(); rows(); counts();
  route();
  window.requestAnimationFrame(() => { strips(); performance.mark("qc-ready"); document.body.dataset.ready = "1"; });
})();
