/* LightSpec dashboard: draws statistics records (format: docs/user-guide.md, "Dashboard and
   reports") with Chart.js and its matrix chart type.
     LightSpecDashboard.report(root, {events: [...]})   draws a fixed set of records (lightspec report)
     LightSpecDashboard.live(root, {url, intervalMs})   polls url?since=CURSOR and redraws (/dashboard)
   Every page's dashboards are in LightSpecDashboard.instances (charts, records, renders).
   Over 400 lines on purpose: one script, no modules, so that the report can inline it as is
   and both pages run the same code; each chart is one Dashboard method. */
(function (global) {
  "use strict";
  var Chart = global.Chart;
  var PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#bab0ac"];
  var STAGE_ORDER = ["budget", "draft", "verify_forward", "verify", "commit"];
  var MAX_COLUMNS = 300;  // heat-map columns and line points; longer runs are drawn in groups of steps
  var LIVE_KEEP = 5000;   // records a live page keeps (the oldest go first)
  var THROUGHPUT_STEPS = 4;  // tokens/s over groups of at least this many steps (one step's rate is noise)
  var IDLE_S = 0.05, IDLE_STEPS = 10;  // a pause longer than both (s; steps' time) breaks the tokens/s line

  Chart.defaults.animation = false;
  Chart.defaults.maintainAspectRatio = false;
  Chart.defaults.font.size = 11;
  Chart.defaults.plugins.legend.labels.boxWidth = 12;

  function Palette() { this.map = {}; this.n = 0; }
  Palette.prototype.get = function (name) {
    if (!Object.prototype.hasOwnProperty.call(this.map, name)) this.map[name] = PALETTE[this.n++ % PALETTE.length];
    return this.map[name];
  };

  function rgba(hex, a) {
    var v = parseInt(hex.slice(1), 16);
    return "rgba(" + (v >> 16) + "," + ((v >> 8) & 255) + "," + (v & 255) + "," + a.toFixed(3) + ")";
  }
  function sum(xs) { var s = 0; for (var i = 0; i < xs.length; i++) s += xs[i] || 0; return s; }
  function rows(r) {
    return Math.min(r.drafted.length, r.accepted.length, r.emitted.length);
  }
  function quantile(sorted, q) {
    if (!sorted.length) return null;
    var i = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
    return sorted[i];
  }
  function fmtMs(ms) {
    if (ms === null) return "-";
    if (ms >= 100) return ms.toFixed(0) + " ms";
    if (ms >= 1) return ms.toFixed(2) + " ms";
    return (ms * 1000).toFixed(ms >= 0.01 ? 0 : 1) + " µs";
  }
  function integerTick(v) { return Number.isInteger(v) ? v : null; }
  function decadeTick(v) {  // a log axis in ms: labels at powers of ten only
    var e = Math.round(Math.log10(v));
    if (Math.abs(Math.log10(v) - e) > 1e-9) return null;
    return e >= 3 ? Math.pow(10, e - 3) + " s" : e >= 0 ? Math.pow(10, e) + " ms"
      : e >= -3 ? Math.pow(10, e + 3) + " µs" : Math.pow(10, e + 3).toPrecision(1) + " µs";
  }
  function fmtNum(x, d) { return x === null || x === undefined || !isFinite(x) ? "-" : x.toFixed(d); }
  function mostCommon(counts) {
    var best = null, n = -1;
    for (var k in counts) if (counts[k] > n) { best = k; n = counts[k]; }
    return best;
  }

  // steps (records of one run, oldest first, each with its step number _n) in groups of
  // ``size`` consecutive step numbers, so that a run of any length gives <= MAX_COLUMNS
  function groups(steps, least) {
    var size = Math.max(least || 1, Math.ceil(steps.length / MAX_COLUMNS)), out = [], cur = null;
    for (var i = 0; i < steps.length; i++) {
      var key = Math.floor((steps[i]._n - 1) / size);
      if (!cur || cur.key !== key) { cur = {key: key, steps: [], from: key * size + 1, to: (key + 1) * size}; out.push(cur); }
      cur.steps.push(steps[i]);
    }
    return {size: size, list: out};
  }

  function makeCharts(root) {
    function canvas(id) { return root.querySelector("#" + id); }
    var tooltipPlugins = {legend: {position: "bottom"}};
    var charts = {};
    charts.heatmap = new Chart(canvas("ls-heatmap"), {
      type: "matrix", data: {datasets: []},
      options: {
        plugins: {legend: {position: "right", labels: {generateLabels: function (chart) {
          return chart.data.datasets.map(function (ds, i) {
            return {text: ds.label, fillStyle: ds.color, strokeStyle: ds.color, lineWidth: 0, datasetIndex: i,
                    hidden: !chart.isDatasetVisible(i)};
          });
        }}}, tooltip: {callbacks: {
          title: function (items) {
            var c = items[0].raw;
            return c.from === c.to ? "step " + c.from : "steps " + c.from + "–" + c.to;
          },
          label: function (item) {
            var c = item.raw;
            return c.src + ": position " + c.y + ", accepted in " + c.a + " of " + c.d + " drafts";
          }}}},
        scales: {
          x: {type: "linear", offset: false, title: {display: true, text: "step"}, ticks: {callback: integerTick}},
          y: {type: "linear", offset: false, reverse: true, min: 0.5, title: {display: true, text: "draft position"},
              grid: {display: false},
              afterBuildTicks: function (axis) {  // one tick per draft position (min is 0.5)
                axis.ticks = [];
                for (var p = 1; p <= axis.max; p++) axis.ticks.push({value: p});
              }}}
      }
    });
    charts.budget = new Chart(canvas("ls-budget"), {
      type: "line", data: {datasets: []},
      options: {
        parsing: false, interaction: {mode: "nearest", intersect: false},
        plugins: Object.assign({tooltip: {callbacks: {footer: function (items) {
          var p = items[0].raw; return p && p.reason ? "budget: " + p.reason : "";
        }}}}, tooltipPlugins),
        scales: {
          x: {type: "linear", title: {display: true, text: "step"}, ticks: {precision: 0}},
          y: {type: "linear", min: 0, title: {display: true, text: "k (draft tokens)"}, ticks: {precision: 0}},
          y1: {type: "linear", position: "right", title: {display: true, text: "estimates"}, grid: {drawOnChartArea: false}}}
      }
    });
    charts.position = new Chart(canvas("ls-position"), {
      type: "bar", data: {labels: [], datasets: []},
      options: {
        plugins: Object.assign({tooltip: {callbacks: {label: function (item) {
          var c = item.dataset.counts[item.dataIndex];
          return item.dataset.label + ": " + fmtNum(item.raw, 1) + "% (" + c[0] + " of " + c[1] + ")";
        }}}}, tooltipPlugins),
        scales: {x: {title: {display: true, text: "draft position"}},
                 y: {min: 0, max: 100, title: {display: true, text: "accepted (%)"}}}
      }
    });
    charts.latency = new Chart(canvas("ls-latency"), {
      type: "line", data: {datasets: []},
      options: {
        parsing: false, interaction: {mode: "nearest", intersect: false},
        plugins: tooltipPlugins,
        scales: {x: {type: "logarithmic", title: {display: true, text: "latency"},
                     ticks: {callback: decadeTick, maxRotation: 0, autoSkip: false}},
                 y: {min: 0, title: {display: true, text: "steps (%)"}}}
      }
    });
    charts.throughput = new Chart(canvas("ls-throughput"), {
      type: "line", data: {datasets: []},
      options: {
        parsing: false, interaction: {mode: "nearest", intersect: false},
        plugins: tooltipPlugins,
        scales: {x: {type: "linear", title: {display: true, text: "time (s)"}},
                 y: {min: 0, title: {display: true, text: "tokens/s"}}}
      }
    });
    return charts;
  }

  function Dashboard(root, mode) {
    this.root = root;
    this.mode = mode;
    this.records = [];
    this.counters = {};   // per run label: the step numbers given so far
    this.label = null;
    this.labels = [];
    this.totals = null;
    this.renders = 0;
    this.sources = new Palette();
    this.stages = new Palette();
    this.estimates = new Palette();
    this.charts = makeCharts(root);
    var self = this;
    this.select = root.querySelector("#ls-label");
    this.select.addEventListener("change", function () { self.label = self.select.value; self.render(); });
  }

  Dashboard.prototype.clear = function () {
    this.records = [];
    this.counters = {};
  };

  Dashboard.prototype.add = function (records) {
    for (var i = 0; i < records.length; i++) {
      var r = records[i], label = r.label === undefined ? "" : r.label;
      if (this.labels.indexOf(label) < 0) this.labels.push(label);
      if (r.kind === "step") r._n = this.counters[label] = (this.counters[label] || 0) + 1;
      this.records.push(r);
    }
    if (this.mode === "live" && this.records.length > LIVE_KEEP) this.records.splice(0, this.records.length - LIVE_KEEP);
    if (this.label === null && this.labels.length) this.label = this.labels[0];
    this.updateLabels();
  };

  Dashboard.prototype.updateLabels = function () {
    var named = this.labels.filter(function (l) { return l !== ""; });
    this.root.querySelector(".ls-label-pick").hidden = named.length < 1;
    if (this.select.options.length === this.labels.length) return;
    this.select.innerHTML = "";
    for (var i = 0; i < this.labels.length; i++) {
      var o = document.createElement("option");
      o.value = o.textContent = this.labels[i];
      this.select.appendChild(o);
    }
    this.select.value = this.label;
  };

  Dashboard.prototype.render = function () {
    var label = this.label, steps = [], requests = [];
    for (var i = 0; i < this.records.length; i++) {
      var r = this.records[i];
      if ((r.label === undefined ? "" : r.label) !== label) continue;
      (r.kind === "step" ? steps : requests).push(r);
    }
    var g = groups(steps);
    this.summary(steps, requests);
    this.heatmap(g);
    this.budget(g);
    this.position(steps);
    this.latency(steps);
    this.throughput(groups(steps, THROUGHPUT_STEPS), requests);
    for (var k in this.charts) this.charts[k].update("none");
    this.renders++;
  };

  Dashboard.prototype.summary = function (steps, requests) {
    var tokens = 0, time = 0, drafted = 0, accepted = 0, rowSteps = 0, bubble = 0, failures = 0;
    steps.forEach(function (s) {
      var n = rows(s);
      tokens += sum(s.emitted); drafted += sum(s.drafted); accepted += sum(s.accepted); rowSteps += n;
      time += s.step_time_s || 0; bubble += (s.bubble_ratio || 0) * (s.step_time_s || 0);
      if (s.failure) failures++;
    });
    var tiles = [
      ["steps", steps.length], ["tokens", tokens],
      ["tokens/s (decode)", time ? fmtNum(tokens / time, 1) : "-"],
      ["acceptance", drafted ? fmtNum(100 * accepted / drafted, 1) + "%" : "-"],
      ["mean accepted length", rowSteps ? fmtNum(tokens / rowSteps, 2) : "-"],
      ["drafted / accepted", drafted + " / " + accepted],
      ["bubble", time ? fmtNum(100 * bubble / time, 1) + "%" : "-"],
      ["requests finished", requests.length], ["failed steps", failures]];
    if (this.totals) tiles.push(["since start", this.totals.steps + " steps, " + this.totals.tokens + " tokens"]);
    this.root.querySelector("#ls-summary").innerHTML = tiles.map(function (t) {
      return '<div class="ls-tile"><b>' + t[1] + "</b><span>" + t[0] + "</span></div>";
    }).join("");
  };

  Dashboard.prototype.heatmap = function (g) {
    var bySource = {}, maxPos = 1, self = this;
    g.list.forEach(function (grp) {
      var d = [], a = [], src = [];
      grp.steps.forEach(function (s) {
        for (var b = 0, n = rows(s); b < n; b++) {
          var name = (s.sources && s.sources[b]) || "unknown";
          for (var p = 0; p < s.drafted[b]; p++) {
            d[p] = (d[p] || 0) + 1;
            a[p] = (a[p] || 0) + (p < s.accepted[b] ? 1 : 0);
            src[p] = src[p] || {};
            src[p][name] = (src[p][name] || 0) + 1;
          }
        }
      });
      for (var p = 0; p < d.length; p++) {
        if (!d[p]) continue;
        var name = mostCommon(src[p]);
        (bySource[name] = bySource[name] || []).push(
          {x: (grp.from + grp.to) / 2, y: p + 1, d: d[p], a: a[p], src: name, from: grp.from, to: grp.to});
        maxPos = Math.max(maxPos, p + 1);
      }
    });
    var first = g.list.length ? g.list[0].from : 1, last = g.list.length ? g.list[g.list.length - 1].to : 1;
    var span = last - first + 1, size = g.size;
    var chart = this.charts.heatmap;
    chart.options.scales.x.min = first - 0.5;
    chart.options.scales.x.max = last + 0.5;
    chart.options.scales.y.max = maxPos + 0.5;
    chart.data.datasets = Object.keys(bySource).map(function (name) {
      var color = self.sources.get(name);
      return {
        label: name, data: bySource[name], borderWidth: 0, color: color,
        backgroundColor: function (ctx) { var c = ctx.raw; return rgba(color, c ? 0.12 + 0.88 * c.a / c.d : 1); },
        width: function (ctx) {
          var area = ctx.chart.chartArea; return area ? Math.max(1, size * area.width / span - 1) : 0;
        },
        height: function (ctx) {
          var area = ctx.chart.chartArea; return area ? Math.max(1, area.height / maxPos - 1) : 0;
        }
      };
    });
  };

  Dashboard.prototype.budget = function (g) {
    var mean = [], most = [], est = {}, seen = {}, positive = true, xs = [];
    g.list.forEach(function (grp) {
      var ks = 0, kn = 0, km = 0, reasons = {}, sums = {}, counts = {};
      grp.steps.forEach(function (s) {
        (s.budget_k || []).forEach(function (k) { ks += k; kn++; km = Math.max(km, k); });
        if (s.budget_reason) reasons[s.budget_reason] = (reasons[s.budget_reason] || 0) + 1;
        for (var e in s.budget_estimates || {}) {
          var v = s.budget_estimates[e];
          if (v === null) continue;
          sums[e] = (sums[e] || 0) + v; counts[e] = (counts[e] || 0) + 1;
        }
      });
      var x = grp.steps[grp.steps.length - 1]._n, reason = mostCommon(reasons), values = {};
      if (kn) { mean.push({x: x, y: ks / kn, reason: reason}); most.push({x: x, y: km, reason: reason}); }
      for (var e in sums) {
        values[e] = sums[e] / counts[e];
        if (!(values[e] > 0)) positive = false;
        seen[e] = true;
      }
      xs.push({x: x, reason: reason, values: values});
    });
    // an estimate the policy did not give at some steps leaves a gap there, not a straight line across
    for (var e in seen) {
      est[e] = xs.map(function (p) {
        return {x: p.x, y: p.values[e] === undefined ? null : p.values[e], reason: p.reason};
      });
    }
    var self = this, chart = this.charts.budget, names = Object.keys(est).sort();
    chart.data.datasets = [
      {label: "k, mean over rows", data: mean, stepped: true, borderColor: "#1f2328", backgroundColor: "#1f2328",
       borderWidth: 2, pointRadius: 0, yAxisID: "y"},
      {label: "k, most", data: most, stepped: true, borderColor: "#8c959f", backgroundColor: "#8c959f",
       borderDash: [4, 3], borderWidth: 1, pointRadius: 0, yAxisID: "y"}
    ].concat(names.map(function (e) {
      var color = self.estimates.get(e);
      return {label: e, data: est[e], borderColor: color, backgroundColor: color, borderWidth: 1.5, pointRadius: 0,
              yAxisID: "y1"};
    }));
    // the estimates differ by orders of magnitude (seconds next to ratios): log scale when it can be
    chart.options.scales.y1.type = names.length && positive ? "logarithmic" : "linear";
    chart.options.scales.y1.display = names.length > 0;
  };

  Dashboard.prototype.position = function (steps) {
    var all = [[], []], per = {}, maxPos = 0;
    steps.forEach(function (s) {
      for (var b = 0, n = rows(s); b < n; b++) {
        var name = (s.sources && s.sources[b]) || "unknown", c = per[name] = per[name] || [[], []];
        for (var p = 0; p < s.drafted[b]; p++) {
          var ok = p < s.accepted[b] ? 1 : 0;
          all[0][p] = (all[0][p] || 0) + ok; all[1][p] = (all[1][p] || 0) + 1;
          c[0][p] = (c[0][p] || 0) + ok; c[1][p] = (c[1][p] || 0) + 1;
          maxPos = Math.max(maxPos, p + 1);
        }
      }
    });
    var self = this, chart = this.charts.position;
    function dataset(label, c, color) {
      var data = [], counts = [];
      for (var p = 0; p < maxPos; p++) {
        var a = c[0][p] || 0, d = c[1][p] || 0;
        data.push(d ? 100 * a / d : null); counts.push([a, d]);
      }
      return {label: label, data: data, counts: counts, backgroundColor: color};
    }
    chart.data.labels = Array.from({length: maxPos}, function (_, i) { return String(i + 1); });
    var names = Object.keys(per).filter(function (n) { return per[n][1].length; });
    chart.data.datasets = [dataset("all rows", all, "#1f2328")].concat(
      names.length > 1 ? names.map(function (n) { return dataset(n, per[n], self.sources.get(n)); }) : []);
  };

  Dashboard.prototype.latency = function (steps) {
    var series = {}, lo = Infinity, hi = 0;
    function put(name, s) {
      if (s === null || s === undefined) return;
      var ms = s * 1000;
      (series[name] = series[name] || []).push(ms);
      if (ms > 0) { lo = Math.min(lo, ms); hi = Math.max(hi, ms); }
    }
    steps.forEach(function (s) {
      for (var k in s.stage_s || {}) put(k, s.stage_s[k]);
      put("whole step", s.step_time_s);
    });
    var names = Object.keys(series).sort(function (a, b) {
      var ia = STAGE_ORDER.indexOf(a), ib = STAGE_ORDER.indexOf(b);
      return (ia < 0 ? 99 : ia) - (ib < 0 ? 99 : ib) || (a < b ? -1 : 1);
    });
    var self = this, chart = this.charts.latency;
    if (!(hi > 0)) { chart.data.datasets = []; return; }
    var perDecade = 8, e0 = Math.floor(Math.log10(lo)), nb = Math.max(1, Math.ceil((Math.log10(hi) - e0) * perDecade) + 1);
    chart.data.datasets = names.map(function (name) {
      var xs = series[name], counts = new Array(nb).fill(0);
      xs.forEach(function (ms) {
        var i = ms > 0 ? Math.floor((Math.log10(ms) - e0) * perDecade) : 0;
        counts[Math.min(nb - 1, Math.max(0, i))]++;
      });
      var sorted = xs.slice().sort(function (a, b) { return a - b; });
      var color = name === "whole step" ? "#1f2328" : self.stages.get(name);
      return {
        label: name + " (p50 " + fmtMs(quantile(sorted, 0.5)) + ", p99 " + fmtMs(quantile(sorted, 0.99)) + ")",
        data: counts.map(function (c, i) { return {x: Math.pow(10, e0 + (i + 0.5) / perDecade), y: 100 * c / xs.length}; }),
        borderColor: color, backgroundColor: color, borderWidth: name === "whole step" ? 2 : 1.5, pointRadius: 0,
        tension: 0.25
      };
    });
  };

  Dashboard.prototype.throughput = function (g, requests) {
    var line = [], last = null;
    g.list.forEach(function (grp) {
      var tokens = 0, time = 0, end = grp.steps[grp.steps.length - 1].t;
      grp.steps.forEach(function (s) { tokens += sum(s.emitted); time += s.step_time_s || 0; });
      // live: no step ran for a while before these (idle, or prefilling new requests): break the line
      var idle = IDLE_STEPS * time / grp.steps.length;
      if (last !== null && end - last - time > Math.max(IDLE_S, idle)) line.push({x: (last + end - time) / 2, y: null});
      if (time > 0) line.push({x: end, y: tokens / time});
      last = end;
    });
    var per = requests.filter(function (r) { return r.tokens_per_s !== null && r.tokens_per_s !== undefined; })
      .map(function (r) { return {x: r.t, y: r.tokens_per_s}; });
    this.charts.throughput.data.datasets = [
      {label: "tokens / step time" + (g.size > 1 ? " (groups of " + g.size + " steps)" : ""), data: line,
       borderColor: "#4e79a7", backgroundColor: "#4e79a7", borderWidth: 1.5, pointRadius: 0},
      {label: "finished requests (each its own tokens/s)", data: per, type: "scatter", showLine: false, borderColor: "#e15759",
       backgroundColor: "#e15759", pointRadius: 3}
    ];
  };

  function status(root, text, bad) {
    var el = root.querySelector("#ls-status");
    el.textContent = text;
    el.className = "ls-status" + (bad ? " ls-error" : "");
  }

  var api = {instances: []};

  api.report = function (root, data) {
    var d = new Dashboard(root, "report");
    api.instances.push(d);
    d.add(data.events || []);
    d.render();
    status(root, "report: " + d.records.length + " events");
    return d;
  };

  api.live = function (root, opts) {
    var d = new Dashboard(root, "live"), cursor = 0, interval = opts.intervalMs || 1000;
    api.instances.push(d);
    d.polls = 0;
    d.render();
    function poll() {
      fetch(opts.url + "?since=" + cursor, {cache: "no-store"})
        .then(function (r) { if (!r.ok) throw new Error("HTTP " + r.status); return r.json(); })
        .then(function (snap) {
          d.polls++;
          if (snap.reset) d.clear();
          d.totals = snap.totals;
          if (snap.events.length || snap.reset || d.renders < 2) {
            d.add(snap.events);
            d.render();
          }
          cursor = snap.cursor;
          status(root, "live · " + d.records.length + " events shown" + (snap.dropped ? " (" + snap.dropped + " missed)" : "")
                 + " · updated " + new Date().toLocaleTimeString());
        })
        .catch(function (err) { status(root, "no data (" + err.message + "); retrying", true); })
        .then(function () { setTimeout(poll, interval); });
    }
    poll();
    return d;
  };

  global.LightSpecDashboard = api;
})(window);
