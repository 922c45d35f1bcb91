// gpuwatchd status page: fills itself from /api/v1/status and /api/v1/alerts (docs/status-page.md).
// No inline code, no eval, no innerHTML with daemon data: every text goes through textContent. A name from the daemon
// inside a sentence sits in its own isolating element (<strong>, <bdi>, ...: app.css), so a bidi override in a
// process or user name cannot reorder the words after it ("full in 19 min").
"use strict";

(function () {
  const POLL_MS = 3000;          // refresh interval while the tab is visible
  const BACKOFF_MAX_MS = 30000;  // slowest retry while the daemon does not answer
  const GIB = 1024 ** 3;
  const MIB = 1024 ** 2;
  const charts = new Map();      // uuid -> uPlot instance
  let delay = POLL_MS;
  let timer = null;
  let lastOk = null;

  // -- small DOM helpers ------------------------------------------------------------------------------------------
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "data") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = dv;
      else el.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  const $ = (id) => document.getElementById(id);
  function replace(id, ...nodes) { $(id).replaceChildren(...nodes.flat().filter(Boolean)); }

  // -- formatting -------------------------------------------------------------------------------------------------
  const num = (v) => typeof v === "number" && Number.isFinite(v);
  function bytes(v) {
    if (!num(v)) return "–";
    if (Math.abs(v) >= GIB) return (v / GIB).toFixed(1) + " GiB";
    if (Math.abs(v) >= MIB) return (v / MIB).toFixed(0) + " MiB";
    return (v / 1024).toFixed(0) + " KiB";
  }
  function duration(s) {
    if (!num(s)) return "–";
    s = Math.max(0, Math.round(s));
    if (s < 90) return s + " s";
    if (s < 5400) return Math.round(s / 60) + " min";
    if (s < 172800) return (s / 3600).toFixed(1) + " h";
    return (s / 86400).toFixed(1) + " d";
  }
  function ago(ts, now) { return num(ts) ? duration(now - ts) + " ago" : "–"; }
  function clock(ts) { return num(ts) ? new Date(ts * 1000).toLocaleTimeString() : "–"; }
  function stamp(ts) { return num(ts) ? new Date(ts * 1000).toLocaleString() : "–"; }
  function pct(v) { return num(v) ? Math.round(v * 100) + "%" : "–"; }
  function rate(bps) {
    if (!num(bps)) return "–";
    const perMin = bps * 60;
    return (perMin >= 0 ? "+" : "−") + bytes(Math.abs(perMin)) + "/min";
  }
  function mhz(hz) { return num(hz) ? Math.round(hz / 1e6) + " MHz" : "–"; }
  function gbit(bps) { return num(bps) ? (bps / 1e9).toFixed(0) + " Gb/s" : "?"; }

  // -- fetching ---------------------------------------------------------------------------------------------------
  async function getJSON(path) {
    const r = await fetch(path, { cache: "no-store", credentials: "same-origin" });
    if (!r.ok) throw new Error(path + ": HTTP " + r.status);
    return r.json();
  }

  async function refresh() {
    timer = null;
    try {
      const [status, alerts] = await Promise.all([getJSON("/api/v1/status"), getJSON("/api/v1/alerts")]);
      render(status, Array.isArray(alerts) ? alerts : []);
      lastOk = Date.now();
      delay = POLL_MS;
      setConn("", "live, every " + POLL_MS / 1000 + " s");
    } catch (e) {
      delay = Math.min(BACKOFF_MAX_MS, delay * 2);
      const since = lastOk ? " (last answer " + duration((Date.now() - lastOk) / 1000) + " ago)" : "";
      setConn("down", "daemon not answering" + since + "; retrying in " + Math.round(delay / 1000) + " s: " +
        e.message);
    }
    schedule();
  }
  function schedule() {
    if (timer === null && !document.hidden) timer = setTimeout(refresh, delay);
  }
  function setConn(cls, text) { const c = $("conn"); c.className = "conn " + cls; c.textContent = text; }
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden && timer === null) refresh();
  });

  // -- rendering --------------------------------------------------------------------------------------------------
  function render(st, alerts) {
    const now = Date.now() / 1000;
    const d = st.daemon || {};
    const nv = st.nvml || {};
    $("host").textContent = d.host ? "on " + d.host : "";
    document.title = (alertsFiring(alerts) ? "(" + alertsFiring(alerts) + ") " : "") + "gpuwatchd " + (d.host || "");
    const parts = ["version " + (d.version || "?")];
    if (nv.ok === true) parts.push("NVML up, driver " + (nv.driver_version || "?"));
    else if (nv.ok === false) parts.push("NVML down: " + (nv.error || "unknown"));
    else parts.push("waiting for the first NVML poll");
    if (nv.stale) parts.push("data stale");
    parts.push("last poll " + ago(nv.last_poll_timestamp, now));
    if (st.scenario) parts.push("sim scenario " + st.scenario.name + " at " + duration(st.scenario.time));
    $("daemon").textContent = parts.join(" · ");
    renderAlerts(alerts);
    renderGpus(st, alerts, now);
    renderDocks(st.docks || []);
    renderXids(st, now);
    renderProbes(st, now);
    renderReceivers(st.receivers || [], now);
  }

  function alertsFiring(alerts) {
    return alerts.filter((a) => a.state === "firing" && (a.status || {}).state !== "suppressed").length;
  }

  function alertState(a) {
    const s = a.status || {};
    if (a.state === "firing" && (s.silencedBy || []).length) return ["silenced", "silenced"];
    if (a.state === "firing" && (s.inhibitedBy || []).length) return ["inhibited", "inhibited"];
    return [a.state || "?", a.state || ""];
  }

  function renderAlerts(alerts) {
    const order = { firing: 0, pending: 1, resolved: 2 };
    const rows = alerts.slice().sort((a, b) => (order[a.state] ?? 3) - (order[b.state] ?? 3));
    if (!rows.length) { replace("alerts", h("p", { class: "ok" }, "No alerts.")); return; }
    replace("alerts", h("ul", { class: "alerts" }, rows.map((a) => {
      const l = a.labels || {};
      const [label, cls] = alertState(a);
      const sev = l.severity || "";
      return h("li", { class: "alert " + cls + " sev-" + sev, data: { alertname: l.alertname || "" } },
        h("span", { class: "badge " + cls }, label),
        h("strong", {}, l.alertname || "?"), " ",
        h("span", { class: "muted" }, [sev, l.gpu !== undefined ? "GPU " + l.gpu : "", l.dock || ""]
          .filter(Boolean).join(" · ")),
        h("p", {}, (a.annotations || {}).summary || ""),
        label === "firing" && (a.annotations || {}).action ?
          h("p", { class: "action" }, "What to do: " + a.annotations.action) : null);
    })));
  }

  // The daemon's verdict (gpu/health.py: state, reason, action_text); before its first one, what presence says.
  // What to do is the daemon's advice (health.action_text: the text chat got for the same fault), never the
  // page's own words.
  function health(g) {
    const hl = g.health;
    const action = hl && hl.action && hl.action !== "none" ? (hl.action_text || hl.action) : null;
    if (hl && hl.state && hl.state !== "unknown") return { state: hl.state, reason: hl.reason, action };
    if (g.state === "lost") {
      return { state: "unhealthy", reason: "lost: the GPU stopped answering (fell off the bus or its dock was pulled)",
        action };
    }
    if (g.state === "removed") return { state: "unhealthy", reason: "removed: the GPU is gone from the bus", action };
    return hl && hl.state ? { state: hl.state, reason: hl.reason, action } : null;
  }

  // A card per GPU, kept from one refresh to the next (its chart with it): only the card's own parts are redrawn.
  // The "No GPUs." line is the only other child the list ever has, told apart by its class, never by a selector
  // that a card's own content could match (a card's UUID line is a p.muted too: matching it rebuilt every card at
  // every refresh, and the charts went with them, 3 s after load).
  function renderGpus(st, alerts, now) {
    const gpus = st.gpus || [];
    const container = $("gpus");
    const seen = new Set(gpus.map((g) => g.uuid));
    for (const card of container.querySelectorAll(":scope > article.gpu")) {
      if (!seen.has(card.dataset.uuid)) dropCard(card);
    }
    const placeholder = container.querySelector(":scope > p.no-gpus");
    if (!gpus.length) {
      const text = st.nvml && st.nvml.ok === false ? "No GPU data: NVML is down." : "No GPUs.";
      if (placeholder) placeholder.textContent = text;
      else container.append(h("p", { class: "muted no-gpus" }, text));
      return;
    }
    if (placeholder) placeholder.remove();
    let prev = null;
    for (const g of gpus) {
      let card = container.querySelector(':scope > article.gpu[data-uuid="' + CSS.escape(g.uuid) + '"]');
      if (!card) {
        card = h("article", { class: "gpu", data: { uuid: g.uuid } },
          h("div", { class: "gpu-body" }), h("div", { class: "chart", "aria-label": "memory over time" }),
          h("div", { class: "gpu-procs" }));
      }
      // In the daemon's order (a replugged GPU comes back at another index); a card in its place is not touched.
      const next = prev ? prev.nextElementSibling : container.firstElementChild;
      if (next !== card) container.insertBefore(card, next);
      prev = card;
      card.className = "gpu state-" + g.state;
      card.querySelector(".gpu-body").replaceChildren(...gpuBody(g, st, alerts, now));
      card.querySelector(".gpu-procs").replaceChildren(...processes(g, now));
      drawChart(card.querySelector(".chart"), g);
    }
  }

  function dropCard(card) {
    const c = charts.get(card.dataset.uuid);
    if (c) { c.destroy(); charts.delete(card.dataset.uuid); }
    card.remove();
  }

  // Indexes move when a GPU goes (the next one takes index 0): a gone GPU is "was GPU 0", and the name goes along.
  function gpuLabel(g) {
    return (g.state === "present" ? "GPU " : "was GPU ") + g.index + " · " + (g.name || "?");
  }
  function labels(st) { return new Map((st.gpus || []).map((g) => [g.uuid, gpuLabel(g)])); }

  function kv(label, value, cls) {
    return h("div", { class: "kv " + (cls || "") }, h("dt", {}, label), h("dd", {}, value));
  }

  // Firing alerts about this GPU (or MIG device) that its health does not count (those about a job on it, such as
  // GpuMemoryLeak, and info ones), named beside it so that "healthy" is never read as "nothing is wrong here".
  function otherFiring(g, alerts) {
    const counted = new Set(((g.health || {}).evidence) || []);
    const names = alerts.filter((a) => a.state === "firing" && (a.labels || {}).uuid === g.uuid &&
      !counted.has((a.labels || {}).alertname)).map((a) => a.labels.alertname || "?");
    return [...new Set(names)].sort();
  }

  function gpuBody(g, st, alerts, now) {
    const r = g.readings || {};
    const out = [];
    out.push(h("h3", {}, gpuLabel(g),
      h("span", { class: "badge state-" + g.state }, g.state)));
    out.push(h("p", { class: "muted small" }, g.uuid + " · " + (g.pci_bus_id || "")));
    const hl = health(g);
    if (hl) {
      const others = otherFiring(g, alerts);
      out.push(h("div", { class: "health health-" + hl.state },
        h("strong", {}, "Health of the GPU: " + hl.state), hl.reason ? " — " + hl.reason : "",
        hl.action ? h("p", { class: "action" }, "What to do: ", hl.action) : null,
        others.length ? h("p", { class: "health-others" }, "Also firing here, not counted in the GPU's health " +
          "(about a job on it, or informational): ", h("strong", {}, others.join(", ")), " — see Alerts.") : null));
    }
    if (g.state !== "present") {
      out.push(h("p", { class: "gone" }, "Not answering since " + stamp(g.since) + " (" + ago(g.since, now) +
        "); last seen " + stamp(g.last_seen) + "."));
    }
    const dl = h("dl", { class: "readings" });
    if (g.state !== "present") {  // no readings from a GPU that does not answer: its dock and last probe only
      if (g.dock) dl.append(dockKv(g.dock));
      if (g.probe) dl.append(kv("Probe", g.probe.verdict + " (" + ago(g.probe.timestamp, now) + ")"));
      out.push(dl);
      return out;
    }
    const used = r.memory_used_bytes, total = r.memory_total_bytes;
    if (num(used) && num(total)) {
      dl.append(kv("Memory", h("span", {}, bytes(used) + " / " + bytes(total),
        h("meter", { min: 0, max: total, value: used, high: total * 0.9 }))));
    }
    dl.append(kv("Utilization", pct(r.utilization_gpu_ratio)));
    dl.append(kv("Temperature", num(r.temperature_celsius) ? r.temperature_celsius.toFixed(0) + " °C" +
      (num(r.temperature_slowdown_celsius) ? " (slowdown " + r.temperature_slowdown_celsius + " °C)" : "") : "–"));
    dl.append(kv("Power", num(r.power_watts) ? r.power_watts.toFixed(0) + " W" +
      (num(r.power_limit_watts) ? " / " + r.power_limit_watts.toFixed(0) + " W" : "") : "–"));
    const c = r.clocks_hz || {}, mc = r.max_clocks_hz || {};
    if (num(c.graphics)) {
      dl.append(kv("Clocks", "SM " + mhz(c.sm) + " / " + mhz(mc.sm) + ", mem " + mhz(c.memory) + " / " +
        mhz(mc.memory)));
    }
    if (num(r.pstate)) dl.append(kv("P-state", "P" + r.pstate));
    const link = g.link;
    const gen = link ? link.current_generation : r.pcie_link_generation;
    const maxGen = link ? link.max_generation : r.pcie_link_max_generation;
    const width = link ? link.current_width : r.pcie_link_width;
    const maxWidth = link ? link.max_width : r.pcie_link_max_width;
    if (num(gen) || num(width)) {
      const degraded = (num(gen) && num(maxGen) && gen < maxGen) || (num(width) && num(maxWidth) && width < maxWidth);
      dl.append(kv("PCIe link", "Gen" + (gen ?? "?") + " x" + (width ?? "?") + " (max Gen" + (maxGen ?? "?") +
        " x" + (maxWidth ?? "?") + ")" + (degraded && r.pstate !== 8 ? " — below max" : ""), degraded ? "warn" : ""));
    }
    if (g.dock) dl.append(dockKv(g.dock));
    const reasons = r.clocks_event_reasons_active || [];
    const throttle = reasons.filter((x) => x !== "gpu_idle" && x !== "applications_clocks_setting");
    dl.append(kv("Throttle", reasons.length ? reasons.join(", ") : "none", throttle.length ? "warn" : ""));
    const p = g.probe;
    dl.append(kv("Probe", p ? p.verdict + (p.detail ? " — " + p.detail : "") + " (" + ago(p.timestamp, now) + ")" :
      "not run yet", p && /FAILED|degraded/.test(p.verdict) ? "bad" : ""));
    out.push(dl);
    return out;
  }

  function dockKv(dk) {
    return kv("Dock", (dk.vendor ? dk.vendor + " " : "") + (dk.name || dk.unique_id) + " (Thunderbolt " +
      (dk.generation ?? "?") + ", " + gbit(dk.rx_speed_bps) + " × " + (dk.rx_lanes ?? "?") + " lanes" +
      (dk.authorized === false ? ", NOT authorized" : "") + ")", dk.authorized === false ? "bad" : "");
  }

  // A probe measure in its unit: FLOP/s (gemm), bytes/s (memory, pcie), seconds (launch latency).
  function measure(name, v) {
    if (!num(v)) return "–";
    if (name.includes("flops")) return (v / 1e12).toFixed(2) + " TFLOP/s";
    if (name.includes("latency")) return (v * 1e6).toFixed(1) + " µs";
    return (v / 1e9).toFixed(1) + " GB/s";
  }

  // Who holds a process (sources/attribution; the same words as `gpuwatchd status`): "pod ns/name/container",
  // "container 3f2a9c1b7d4e (web, nginx:1.27)", "job 4242", or "" for a host process.
  function ownerText(o) {
    if (!o || typeof o !== "object") return "";
    const parts = [];
    if (o.pod) parts.push("pod " + o.namespace + "/" + o.pod + (o.container ? "/" + o.container : ""));
    else if (o.container_id) {
      const extra = [o.name, o.image].filter((x) => x).join(", ");
      parts.push("container " + o.container_id + (extra ? " (" + extra + ")" : ""));
    }
    if (o.hpc_job) parts.push("job " + o.hpc_job);
    return parts.join(" ");
  }

  function processes(g, now) {
    const procs = g.processes || [];
    if (!procs.length) return g.state === "present" ? [h("p", { class: "muted" }, "No processes.")] : [];
    const total = g.processes_total ?? procs.length;
    const rows = procs.map((p) => {
      const t = p.memory_trend || {};
      const leak = t.leak;
      return h("tr", { class: leak ? "leak " + leak.state : "", data: { pid: String(p.pid) } },
        h("td", {}, String(p.pid)), h("td", {}, p.name || "?"), h("td", {}, p.user || "?"),
        h("td", { class: "owner" }, ownerText(p.owner) || "host"),
        h("td", { class: "num" }, bytes(p.used_memory_bytes)),
        h("td", { class: "num" }, rate(t.rate_bytes_per_second)),
        h("td", { class: "eta" }, leak ? "leak " + leak.state + ": full in " + duration(leak.eta_seconds) : ""));
    });
    const table = h("table", { class: "procs" },
      h("thead", {}, h("tr", {}, h("th", {}, "PID"), h("th", {}, "Process"), h("th", {}, "User"), h("th", {}, "Owner"),
        h("th", { class: "num" }, "GPU memory"), h("th", { class: "num" }, "Trend"), h("th", {}, "Leak"))),
      h("tbody", {}, rows));
    // A suspected leak is the one fact that must not hide in a scrolled table on a phone: said above it too.
    const notes = procs.filter((p) => (p.memory_trend || {}).leak).map((p) => {
      const leak = p.memory_trend.leak;
      return h("p", { class: "leak-note " + leak.state, data: { pid: String(p.pid) } },
        h("strong", {}, (p.name || "?") + "[" + p.pid + "]"),
        ownerText(p.owner) ? [" in ", h("bdi", {}, ownerText(p.owner))] : null, " (", h("bdi", {}, p.user || "?"), ") ",
        leak.state === "firing" ? "is leaking " : "may be leaking ", rate(leak.rate_bytes_per_second),
        ": GPU memory full in ", h("strong", {}, duration(leak.eta_seconds)));
    });
    const out = [...notes, h("div", { class: "scroll" }, table)];
    if (total > procs.length) {
      out.push(h("p", { class: "muted more" }, (total - procs.length) + " more processes (" + total +
        " in all; the largest " + procs.length + " are listed)"));
    }
    return out;
  }

  function drawChart(el, g) {
    const hist = g.memory_history || [];
    const total = (g.readings || {}).memory_total_bytes;
    if (typeof uPlot === "undefined" || hist.length < 2) {
      el.hidden = true;
      return;
    }
    el.hidden = false;
    const xs = hist.map((p) => p[0]);
    const used = hist.map((p) => p[1] / GIB);
    const proj = hist.map(() => null);
    // A suspected leak: a dashed line from now towards full, at the rate the leak rule projects (drawn for at most
    // twice the history shown, so a far-off time to full does not squash the history into a sliver).
    const etas = (g.processes || []).map((p) => ((p.memory_trend || {}).leak || {}).eta_seconds).filter(num);
    if (etas.length && num(total)) {
      const eta = Math.max(1, Math.min(...etas));
      const last = hist[hist.length - 1];
      const shown = Math.min(eta, 2 * (last[0] - hist[0][0]) || eta);
      proj[proj.length - 1] = last[1] / GIB;
      xs.push(last[0] + shown);
      used.push(null);
      proj.push((last[1] + (total - last[1]) * (shown / eta)) / GIB);
    }
    const data = [xs, used, proj];
    let u = charts.get(g.uuid);
    const width = Math.max(200, Math.min(el.parentElement.clientWidth - 16, 900));
    // A chart is drawn into its own card's box or not kept: one that is not in this box (the card was made anew)
    // would take the data and show nothing.
    if (u && (u.width !== width || u.root.parentNode !== el)) { u.destroy(); u = null; charts.delete(g.uuid); }
    if (!u) {
      u = new uPlot({
        width, height: 140, legend: { show: false }, cursor: { show: false },
        scales: { y: { range: [0, num(total) ? total / GIB : null] } },
        axes: [{ stroke: "#888" }, { stroke: "#888", size: 64, values: (_, ticks) => ticks.map((v) => v.toFixed(0) + " GiB") }],
        series: [{}, { label: "memory used", stroke: "#3b82f6", fill: "rgba(59,130,246,0.15)", width: 2 },
          { label: "leak projection", stroke: "#dc2626", dash: [6, 4], width: 2, spanGaps: true, points: { show: false } }],
      }, data, el);
      charts.set(g.uuid, u);
    } else {
      u.setData(data);
    }
    // What the chart in this box holds, read back from uPlot itself, for a person's devtools and the browser tests:
    // the newest memory point (daemon time, s), how many there are, and whether the leak projection is drawn.
    const [tx, ty, tp] = u.data;
    let newest = null, points = 0;
    for (let i = 0; i < ty.length; i++) if (ty[i] !== null) { newest = tx[i]; points++; }
    el.dataset.newest = String(newest);
    el.dataset.points = String(points);
    el.dataset.projection = tp.filter((v) => v !== null).length >= 2 ? "yes" : "no";
  }

  function renderDocks(docks) {
    $("docks-section").hidden = !docks.length;
    replace("docks", docks.map((d) => h("div", { class: "dock " + (d.authorized === false ? "bad" : ""),
      data: { uniqueId: d.unique_id } },
    h("strong", {}, (d.vendor ? d.vendor + " " : "") + (d.name || "?")), " ",
    h("span", { class: "muted" }, d.unique_id + " · route " + d.route + " · security " + (d.security || "?")),
    h("p", {}, d.authorized === false ? "Attached but NOT authorized: the GPU behind it cannot appear." :
      "Authorized; link " + gbit(d.rx_speed_bps) + " × " + (d.rx_lanes ?? "?") + " lanes" +
      (d.gpus && d.gpus.length ? "; GPUs: " + d.gpus.join(", ") : "; no GPU behind it")),
    d.action ? h("p", { class: "action" }, "What to do: " + d.action) : null)));
  }

  function renderXids(st, now) {
    const xids = (st.recent_xids || []).slice().reverse();
    const idx = labels(st);
    if (!xids.length) { replace("xids", h("p", { class: "ok" }, "No Xid errors since the daemon started.")); return; }
    replace("xids", h("ol", { class: "timeline" }, xids.map((x) => h("li", { data: { xid: String(x.xid) } },
      h("time", { datetime: new Date(x.timestamp * 1000).toISOString() }, clock(x.timestamp)), " ",
      h("strong", {}, "Xid " + x.xid), " on ", x.uuid ? (idx.get(x.uuid) ?? x.uuid) : (x.pci_bus_id || "?"),
      h("span", { class: "muted" }, " (" + ago(x.timestamp, now) + ", " + (x.source || "") + ")"),
      x.meaning ? h("p", {}, x.meaning) : null,
      x.action ? h("p", { class: "action" }, "What to do: " + x.action) : null))));
  }

  function renderProbes(st, now) {
    const pr = st.probes || {};
    const results = st.probe_results || {};
    const idx = labels(st);
    const out = [];
    if (pr.available === false) out.push(h("p", { class: "muted" }, "Probes unavailable: " + pr.unavailable_reason));
    for (const [uuid, recs] of Object.entries(results)) {
      const rows = [];
      for (const r of recs) {
        const measures = Object.keys(r.measures || {});
        const cells = measures.length ? measures : [null];
        for (const m of cells) {
          const ratio = m ? (r.ratios || {})[m] : undefined;
          rows.push(h("tr", { class: r.result },
            h("td", {}, r.probe), h("td", {}, r.result), h("td", {}, m || "–"),
            h("td", { class: "num" }, m ? measure(m, r.measures[m]) : "–"),
            h("td", { class: "num" + (num(ratio) && ratio < 0.9 ? " bad" : "") },
              num(ratio) ? Math.round(ratio * 100) + "% of baseline" : "building baseline"),
            h("td", {}, r.problem || (r.degraded || {})[m] || ""),
            h("td", { class: "muted" }, ago(r.timestamp, now))));
        }
      }
      out.push(h("h3", {}, idx.get(uuid) ?? uuid));
      out.push(h("div", { class: "scroll" }, h("table", { class: "probes" },
        h("thead", {}, h("tr", {}, ["Probe", "Result", "Measure", "Value", "vs baseline", "Detail", "When"].map((x) =>
          h("th", {}, x)))), h("tbody", {}, rows))));
    }
    if (!out.length) {
      const verdicts = Object.entries(pr.gpus || {});
      out.push(h("p", { class: "muted" }, verdicts.length ? "No probe has run yet: " + verdicts.map(([u, v]) =>
        (idx.get(u) ?? u) + " " + v.verdict).join("; ") : "No probe has run yet."));
    }
    replace("probes", out);
  }

  function renderReceivers(receivers, now) {
    if (!receivers.length) {
      replace("receivers", h("p", { class: "warn" },
        "No receiver configured: alerts are shown here and in /api/v1/alerts only (docs/notifications.md)."));
      return;
    }
    replace("receivers", receivers.map((r) => h("div", { class: "receiver", data: { receiver: r.name } },
      h("strong", {}, r.name), h("span", { class: "muted" }, " (" + r.type + ")" + (r.queued ? ", " + r.queued +
        " queued" : "")),
      r.last_error ? h("p", { class: "bad" }, "Last error: " + r.last_error) : null,
      (r.members || []).length > 1 ? h("ul", { class: "deliveries members" }, r.members.map((m) => h("li",
        { class: "member " + m.health, data: { member: m.name } },
        h("span", { class: "badge " + ({ up: "delivered", failing: "failed" }[m.health] || "pending") }, m.health),
        " urls[" + m.index + "] (" + m.name + ")" + (m.queued ? " · " + m.queued + " queued" : "") +
        (m.last_delivered ? " · last delivered " + clock(m.last_delivered) : ""),
        m.last_error ? h("span", { class: "bad" }, " · " + m.last_error) : null))) : null,
      r.recent.length ? h("ul", { class: "deliveries" }, r.recent.map((d) => h("li", { class: d.status },
        h("span", { class: "badge " + d.status }, d.status), " " + clock(d.time) + " · " +
        (d.firing ? d.firing + " firing " : "") + (d.resolved ? d.resolved + " resolved " : "") +
        "· " + d.attempts + " attempt" + (d.attempts === 1 ? "" : "s"),
        d.error ? h("span", { class: "bad" }, " · " + d.error) : null))) :
        h("p", { class: "muted" }, "Nothing sent yet."))));
  }

  refresh();
})();
