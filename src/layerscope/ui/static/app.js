// layerscope's page, part 4 of 4: the views (the runs, one run), their state, and polling.
"use strict";

(function () {
  const { REPORT, api, newRound, runPath, domReady, el, select, label, replace, layerName, showError, figures,
          panels, watchSkipped } = window.layerscope;
  const POLL_MS = 2000;
  const PLOT_CONFIG = { responsive: true, displaylogo: false };
  // ``stepChosen``: the user picked ``step`` (a cell, an alert); until then it follows the
  // latest step of a run being written.
  const state = { run: null, compare: null, rank: 0, kind: null, tensor: null, phase: "train",
                  stat: "absmax", seriesStat: null, module: null, step: null, stepChosen: false };
  let summary = null;        // the run's summary, as last fetched
  let pollTimer = null;
  let generation = 0;        // bumped by each navigation: stale answers are dropped

  // ------------------------------------------------------------------ routing

  function readHash() {
    const hash = location.hash.replace(/^#\/?/, "");
    const [path, query] = hash.split("?");
    const params = new URLSearchParams(query || "");
    if (path.startsWith("run/")) {
      const run = decoded(path.slice(4));
      if (run === null) return { run: null, malformed: true };
      const rank = Number(params.get("rank") || 0);
      return { run, compare: params.get("compare"),
               rank: Number.isInteger(rank) && rank >= 0 ? rank : 0 };
    }
    return { run: null };
  }

  // A hash typed or pasted by hand may hold a broken escape ("%E0%A4%A"): the runs instead.
  function decoded(text) {
    try {
      return decodeURIComponent(text);
    } catch (error) {
      return null;
    }
  }

  function writeHash() {
    const params = new URLSearchParams();
    if (state.compare) params.set("compare", state.compare);
    if (state.rank) params.set("rank", state.rank);
    const query = params.toString();
    const hash = "#/run/" + encodeURIComponent(state.run) + (query ? "?" + query : "");
    if (location.hash !== hash) history.replaceState(null, "", hash);
  }

  function route() {
    generation += 1;
    clearTimeout(pollTimer);
    newRound();
    watchSkipped(null);
    const target = readHash();
    if (target.malformed) history.replaceState(null, "", "#/");
    if (REPORT && !target.run) target.run = REPORT.run;
    if (target.run) {
      Object.assign(state, { run: target.run, compare: target.compare || (REPORT && REPORT.compare) || null,
                             rank: target.rank || 0, kind: null, module: null, step: null, stepChosen: false });
      showRun();
    } else {
      showRuns();
    }
  }

  // ------------------------------------------------------------------ the runs

  async function showRuns() {
    const mine = generation;
    await domReady;
    replace("where", "runs");
    replace("main", el("section", { class: "panel" }, el("h2", {}, "Runs"), el("div", { id: "runs" })));
    const refresh = async () => {
      if (mine !== generation) return;
      try {
        newRound();
        const listing = await api("runs");
        if (mine !== generation) return;
        replace("runs", panels.runs(listing.runs));
        document.body.dataset.runs = String(listing.runs.length);
      } catch (error) {
        showError("runs", error);
      }
      if (!REPORT && mine === generation) pollTimer = setTimeout(refresh, POLL_MS);
    };
    refresh();
  }

  // ------------------------------------------------------------------ one run

  async function showRun() {
    const mine = generation;
    prefetch();
    await domReady;
    replace("where", state.run);
    replace("main", panels.runView());
    watchSkipped(showSkipped);
    try {
      summary = await api(runPath(state.run));
    } catch (error) {
      showError("main", error);
      return;
    }
    if (mine !== generation) return;
    chooseDefaults();
    writeHash();
    renderHead();
    renderOverhead();
    // The heat map first: the answers are on their way already, and the first drawn shows first.
    await Promise.all([renderHeatmaps(), renderScalars(), renderAlerts(), renderAttention()]);
    renderModules();
    if (mine !== generation) return;
    fillCompare(REPORT ? (REPORT.compare ? [REPORT.compare] : []) : null);
    if (!REPORT && summary.status === "running") pollTimer = setTimeout(() => poll(mine), POLL_MS);
  }

  // A notice above the charts: which files the answers were read without, and why.
  function showSkipped(files) {
    const node = replace("skipped", panels.skipped(files));
    if (node) node.hidden = files.size === 0;
  }

  // The answers an opening run needs with the defaults, asked before Plotly is parsed; those
  // that chooseDefaults() then asks for with the same arguments are already on their way.
  // A failure (an unknown run) is shown where an answer is awaited, not here.
  function prefetch() {
    const rank = { rank: state.rank };
    const asked = [api(runPath(state.run)), api(runPath(state.run, "scalars"), rank),
      api(runPath(state.run, "alerts"), rank), api(runPath(state.run, "modules")),
      api(runPath(state.run, "heatmap"), { kind: "activation", tensor: "out", phase: "train", rank: state.rank,
                                          stat: "absmax" })];
    for (const answer of asked) answer.catch(() => null);
  }

  function chooseDefaults() {
    const kinds = Object.keys(summary.kinds);
    if (!state.kind || !kinds.includes(state.kind)) state.kind = kinds.includes("activation") ? "activation" : kinds[0] || "activation";
    const tensors = summary.kinds[state.kind] || [];
    if (!tensors.includes(state.tensor)) state.tensor = tensors[0] || summary.default_tensor[state.kind];
    if (!summary.stats.includes(state.stat)) state.stat = summary.stats.includes("absmax") ? "absmax" : summary.stats[0];
    if (!summary.phases.includes(state.phase)) state.phase = summary.phases[0];
    if (!summary.ranks.includes(state.rank)) state.rank = summary.ranks[0];
    if (!state.seriesStat || !summary.stats.includes(state.seriesStat)) state.seriesStat = state.stat;
  }

  async function poll(mine) {
    if (mine !== generation) return;
    try {
      newRound();
      const fresh = await api(runPath(state.run));
      if (mine !== generation) return;
      const grew = fresh.steps !== summary.steps || fresh.updated !== summary.updated || fresh.status !== summary.status;
      const newKinds = JSON.stringify(fresh.kinds) !== JSON.stringify(summary.kinds);
      summary = fresh;
      if (grew) {
        if (newKinds) chooseDefaults();
        renderHead();
        renderOverhead();
        await Promise.all([renderScalars(), renderAlerts(), renderHeatmaps(), renderAttention(),
                           state.module !== null ? renderLayer() : null]);
        if (mine === generation) document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
      }
      replace("live", summary.status === "running" ? "● live" : "");
    } catch (error) {
      replace("live", "● " + error.message);
    }
    if (mine === generation && summary.status === "running") pollTimer = setTimeout(() => poll(mine), POLL_MS);
    else replace("live", "");
  }

  function chartParams(extra) {
    return Object.assign({ kind: state.kind, tensor: state.tensor, phase: state.phase, rank: state.rank }, extra);
  }

  function renderHead() {
    const pieces = panels.runFacts(summary);
    if (summary.ranks.length > 1) {
      pieces.push(label("rank", select("rank-select", summary.ranks, state.rank, (value) => {
        state.rank = Number(value); writeHash(); refreshAll();
      })));
    }
    replace("run-facts", pieces);
  }

  async function fillCompare(others) {
    let ids = others;
    if (ids === null) {
      try {
        ids = (await api("runs")).runs.filter((run) => run.status !== "unreadable").map((run) => run.id)
          .filter((id) => id !== state.run);
      } catch (error) {
        ids = [];
      }
    }
    if (!ids.length || !document.getElementById("compare-slot")) return;
    replace("compare-slot", label("compare with", select("compare-select", ["", ...ids], state.compare || "", async (value) => {
      state.compare = value || null;
      writeHash();
      refreshAll();
    }, (id) => id || "—")));
  }

  function refreshAll() {
    newRound();
    renderScalars();
    renderAlerts();
    renderHeatmaps();
    renderAttention();
    if (state.module !== null) renderLayer();
  }

  function renderOverhead() {
    replace("overhead", panels.overhead(summary.overhead));
  }

  // ------------------------------------------------------------------ scalars

  async function renderScalars() {
    const mine = generation;
    try {
      const [own, alerts, other] = await Promise.all([
        api(runPath(state.run, "scalars"), { rank: state.rank }),
        api(runPath(state.run, "alerts"), { rank: state.rank }),
        state.compare ? api(runPath(state.compare, "scalars"), { rank: state.rank }).catch(() => null) : null]);
      if (mine !== generation) return;
      const figure = figures.scalars(own, alerts.alerts, other, state.compare, state.run);
      if (figure === null) {
        replace("scalars", el("p", { class: "note" }, "no scalars: scope.step(loss=...) records them"));
        return;
      }
      await Plotly.react("scalars", figure.data, figure.layout, PLOT_CONFIG);
    } catch (error) {
      showError("scalars", error);
    }
  }

  // ------------------------------------------------------------------ heat map

  // A control's handler: the new choice, then the charts it changes, asked anew.
  function changes(update, layerToo) {
    return (value) => {
      update(value);
      newRound();
      renderHeatmaps();
      renderAttention();
      if (layerToo && state.module !== null) renderLayer();
    };
  }

  function renderHeatmapControls() {
    replace("heatmap-controls",
      label("kind", select("kind-select", Object.keys(summary.kinds), state.kind, changes((value) => {
        state.kind = value;
        state.tensor = (summary.kinds[value] || [])[0];
      }, true))),
      label("tensor", select("tensor-select", summary.kinds[state.kind] || [state.tensor], state.tensor,
        changes((value) => { state.tensor = value; }, true))),
      label("statistic", select("stat-select", summary.stats, state.stat, changes((value) => { state.stat = value; }, false))),
      label("phase", select("phase-select", summary.phases, state.phase, changes((value) => { state.phase = value; }, true))));
  }

  // The run's heat map, and the compared run's beside it on the same colour scale.
  async function renderHeatmaps() {
    renderHeatmapControls();
    const mine = generation;
    const params = chartParams({ stat: state.stat });
    const compareNode = document.getElementById("heatmap-compare");
    compareNode.style.display = state.compare ? "" : "none";
    if (!state.compare) { Plotly.purge(compareNode); replace("heatmap-compare"); replace("heatmap-unmatched"); }
    const [own, other] = await Promise.all([heatmapAnswer("heatmap", state.run, params),
      state.compare ? heatmapAnswer("heatmap-compare", state.compare, params) : null]);
    if (mine !== generation) return;
    const range = own && other ? figures.sharedRange([own, other]) : null;
    const shape = own && other ? figures.sharedShape([own, other]) : null;
    await Promise.all([drawHeatmap("heatmap", state.run, own, range, shape),
      drawHeatmap("heatmap-compare", state.compare, other, range, shape)]);
    if (mine !== generation || !own) return;
    // The heat map drawn before a compared one was shown keeps its old width until resized.
    for (const id of ["heatmap", "heatmap-compare"]) {
      const node = document.getElementById(id);
      if (node.classList.contains("js-plotly-plot") && node.offsetParent) Plotly.Plots.resize(node);
    }
    replace("heatmap-note", own.downsampled
      ? `${own.steps.length} columns of ${own.width} steps each (${own.aggregate} over each column's recorded steps); click a cell for the layer`
      : `${own.steps.length} recorded steps; click a cell for the layer`);
    if (other) replace("heatmap-unmatched", panels.unmatched(own, other, summary.name || state.run, state.compare));
    followLatestStep(own);
  }

  // The first layer at the latest step when a run opens; the latest step as a run being
  // written grows, until the user picks a step.
  function followLatestStep(data) {
    const latest = data.steps[data.steps.length - 1];
    if (state.module === null && data.layers.length) selectLayer(data.layers[0], latest, false, false);
    else if (state.module !== null && !state.stepChosen && latest !== undefined && latest !== state.step) {
      selectLayer(state.module, latest, false, false);
    }
  }

  async function heatmapAnswer(id, run, params) {
    try {
      return await api(runPath(run, "heatmap"), params);
    } catch (error) {
      showError(id, error);
      return null;
    }
  }

  async function drawHeatmap(id, run, data, range, shape) {
    if (!data) return;
    const node = document.getElementById(id);
    if (!data.layers.length) {
      Plotly.purge(node);
      replace(id, el("p", { class: "note" }, "no rows of this kind, tensor and phase"));
      return;
    }
    if (!node.classList.contains("js-plotly-plot")) node.replaceChildren();
    const title = run === state.run ? summary.name || run : run;
    const figure = figures.heatmap(data, title, state.step, run + state.kind + state.tensor + state.stat, range, shape);
    await Plotly.react(node, figure.data, figure.layout, PLOT_CONFIG);
    node.dataset.layers = String(data.layers.length);
    node.dataset.columns = String(data.steps.length);
    if (!node.dataset.bound) {
      node.dataset.bound = "1";
      node.on("plotly_click", (event) => {
        // The layers of the drawing clicked: a live run or another kind may have redrawn it.
        const point = event.points[0];
        const row = node.layerscopeNames.indexOf(point.y);
        selectLayer(node.layerscopeLayers[row >= 0 ? row : point.pointNumber[0]], point.x, true, true);
      });
    }
    node.layerscopeLayers = data.layers;
    node.layerscopeNames = figure.names;
  }

  // ------------------------------------------------------------------ attention

  // The attention heads of the phase and rank shown; no panel for a run that recorded none.
  async function renderAttention() {
    const mine = generation;
    const panel = document.getElementById("attention-panel");
    let data;
    try {
      data = await api(runPath(state.run, "attention"), { phase: state.phase, rank: state.rank });
    } catch (error) {
      panel.hidden = false;
      showError("attention", error);
      return;
    }
    if (mine !== generation) return;
    panel.hidden = !data.phases.length;
    const node = document.getElementById("attention");
    if (!data.modules.length) {
      Plotly.purge(node);
      replace("attention", el("p", { class: "note" }, "no attention rows in phase " + state.phase + ", rank " + state.rank));
      replace("attention-note");
      return;
    }
    if (!node.classList.contains("js-plotly-plot")) node.replaceChildren();
    const figure = figures.attention(data, state.run + state.phase + state.rank);
    await Plotly.react(node, figure.data, figure.layout, PLOT_CONFIG);
    node.dataset.modules = String(data.modules.length);
    node.dataset.columns = String(data.steps.length);
    replace("attention-note", (data.downsampled
      ? `${data.steps.length} columns of ${data.width} steps each (the lowest of each column's recorded steps)`
      : `${data.steps.length} recorded steps`) +
      "; entropy fraction: each query's attention entropy over log(keys it may attend to), averaged over queries");
  }

  // ------------------------------------------------------------------ one layer

  // Show ``module`` at ``step``; ``chosen``: the user picked that step, which then stays.
  function selectLayer(module, step, scroll, chosen) {
    newRound();
    state.module = module;
    state.step = step === undefined ? state.step : step;
    if (chosen) state.stepChosen = true;
    document.body.dataset.module = module;
    document.body.dataset.step = String(state.step);
    for (const id of ["heatmap", "heatmap-compare"]) {
      const node = document.getElementById(id);
      if (node && node.classList.contains("js-plotly-plot")) Plotly.relayout(node, { shapes: figures.markStep(state.step) });
    }
    renderLayer();
    if (scroll) document.getElementById("layer-panel").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  async function renderLayer() {
    const mine = generation;
    const module = state.module;
    replace("layer-name", layerName(module) + " · " + state.kind + " " + state.tensor);
    replace("layer-type");
    moduleType(state.run, module).then((type) => {
      if (mine === generation && module === state.module && type) replace("layer-type", type);
    });
    replace("layer-step", state.step === null ? "" : "step " + state.step);
    replace("series-controls", label("statistic", select("series-stat", summary.stats, state.seriesStat, (value) => {
      state.seriesStat = value;
      renderLayer();
    })));
    const params = chartParams({ module: module });
    if (!summary.histograms) replace("colordim", el("p", { class: "note" }, "no histograms: the run recorded none"));
    await Promise.all([renderSeries(params, mine), summary.histograms ? renderColorDim(params, mine) : null]);
  }

  async function renderSeries(params, mine) {
    try {
      const matched = await sameLayerCompared(params.module);
      const [own, other, alerts] = await Promise.all([
        api(runPath(state.run, "series"), params),
        matched ? api(runPath(state.compare, "series"), params).catch(() => null) : null,
        api(runPath(state.run, "alerts"), { rank: state.rank })]);
      if (mine !== generation || params.module !== state.module) return;
      const stat = state.seriesStat;
      const figure = figures.series(own, other, stat, alerts.alerts.filter((a) => a.module === params.module), {
        name: summary.name || state.run, otherName: state.compare, step: state.step,
        logScale: summary.log_scale_stats.includes(stat), revision: params.module + stat });
      await Plotly.react("series", figure.data, figure.layout, PLOT_CONFIG);
      document.getElementById("series").dataset.points = String(own.steps.length);
    } catch (error) {
      showError("series", error);
    }
  }

  // The module type of ``module`` in ``run``, or undefined.
  async function moduleType(run, module) {
    try {
      const found = (await api(runPath(run, "modules"))).modules.find((m) => m.name === module);
      return found ? found.type : undefined;
    } catch (error) {
      return undefined;
    }
  }

  // Whether the compared run has this layer: the same name and the same module type (a ReLU
  // named "1" is not a BatchNorm2d named "1").
  async function sameLayerCompared(module) {
    if (!state.compare) return false;
    const [own, other] = await Promise.all([moduleType(state.run, module), moduleType(state.compare, module)]);
    return own !== undefined && own === other;
  }

  async function renderColorDim(params, mine) {
    let data;
    try {
      data = await api(runPath(state.run, "colordim"), params);
    } catch (error) {
      showError("colordim", error);
      return;
    }
    if (mine !== generation || params.module !== state.module) return;
    const figure = figures.colorDim(data, state.step, params.module);
    const node = document.getElementById("colordim");
    await Plotly.react(node, figure.data, figure.layout, PLOT_CONFIG);
    if (!node.dataset.bound) {
      node.dataset.bound = "1";
      node.on("plotly_click", (event) => selectLayer(state.module, event.points[0].x, false, true));
    }
    renderDistribution(params, data, mine);
  }

  async function renderDistribution(params, colorDim, mine) {
    const step = state.step !== null ? state.step : colorDim.steps[colorDim.steps.length - 1];
    let shown = null;
    try {
      const exact = await api(runPath(state.run, "distribution"), Object.assign({ step: step }, params));
      if (exact.step !== null) shown = Object.assign({}, exact, { step: String(exact.step) });
    } catch (error) {
      if (!error.missing) { showError("distribution", error); return; }
    }
    // Not in the report, or not a recorded step: the column of steps that holds it.
    if (shown === null) shown = figures.columnDistribution(colorDim, step);
    if (mine !== generation || params.module !== state.module || shown === null) return;
    const figure = figures.distribution(shown);
    await Plotly.react("distribution", figure.data, figure.layout, PLOT_CONFIG);
    Object.assign(document.getElementById("distribution").dataset, { step: shown.step, module: params.module });
  }

  // ------------------------------------------------------------------ alerts, modules

  async function renderAlerts() {
    const mine = generation;
    try {
      const data = await api(runPath(state.run, "alerts"), { rank: state.rank });
      if (mine === generation) replace("alerts", panels.alerts(data.alerts, jumpToAlert));
    } catch (error) {
      showError("alerts", error);
    }
  }

  function jumpToAlert(alert) {
    const kindChanged = alert.kind && summary.kinds[alert.kind] && alert.kind !== state.kind;
    if (kindChanged) {
      state.kind = alert.kind;
      const tensors = summary.kinds[alert.kind];
      state.tensor = tensors.includes(alert.tensor) ? alert.tensor : tensors[0];
    }
    if (alert.phase && summary.phases.includes(alert.phase)) state.phase = alert.phase;
    selectLayer(alert.module, alert.step, true, true);
    if (kindChanged) renderHeatmaps();
  }

  function renderModules() {
    api(runPath(state.run, "modules"))
      .then((data) => replace("modules", panels.modules(data.modules, (name) => selectLayer(name, state.step, true))))
      .catch((error) => showError("modules", error));
  }

  window.addEventListener("hashchange", route);
  window.layerscope.state = state;
  route();
})();
