//! The dashboard and the alerts in deploy/monitoring/, tested (issues 21
//! and 34): the rules, as `kubectl kustomize deploy/monitoring` renders
//! them, pass `promtool check rules` and their unit tests (`promtool test
//! rules`); every alert has a unit test, and a runbook_url that is its own
//! section of the book's runbook; each alert's tests fail when its
//! expression is broken (never firing, always firing, or without the guard
//! that keeps it quiet); and every metric the dashboard and the rules read
//! is one a live agent serves (or one Prometheus or kube-state-metrics
//! does), so a renamed metric fails here, not on a dashboard.
use std::{collections::BTreeSet, path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::scenario::edgevx_and_flannel;
use serde_json::Value;

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// The runbook the alerts link to, a chapter of the book (docs/src).
const RUNBOOK: &str = "operations/runbook.md";

fn runbook_md() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src").join(RUNBOOK)
}

/// The rendered PrometheusRule: `kubectl kustomize deploy/monitoring`, as
/// `kubectl apply -k` applies it.
fn prometheus_rule() -> Result<Value> {
    let objects = crate::kustomize::render("monitoring")?;
    objects.into_iter().find(|o| o["kind"] == "PrometheusRule").context("deploy/monitoring renders no PrometheusRule")
}

/// Every rule: (alert name, expression).
fn alerts(spec: &Value) -> Vec<(String, String)> {
    rules(spec)
        .map(|r| (r["alert"].as_str().unwrap_or("").to_string(), r["expr"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn rules(spec: &Value) -> impl Iterator<Item = &Value> {
    spec["groups"].as_array().into_iter().flatten().flat_map(|g| g["rules"].as_array().into_iter().flatten())
}

/// promtool: `EDGEVX_PROMTOOL` (set by `cargo xtask test`, from Debian's
/// prometheus package), else one on PATH.
fn promtool() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("EDGEVX_PROMTOOL") {
        return Ok(PathBuf::from(p));
    }
    let found = Command::new("sh").args(["-c", "command -v promtool"]).output()?;
    match found.status.success() {
        true => Ok(PathBuf::from(String::from_utf8_lossy(&found.stdout).trim())),
        false => bail!("no promtool: run the tests with `cargo xtask test` (it fetches one), or set EDGEVX_PROMTOOL"),
    }
}

/// A scratch directory holding the unit tests, where rule files are tried.
struct Promtool {
    bin: PathBuf,
    dir: PathBuf,
}

impl Promtool {
    fn new() -> Result<Self> {
        let dir = std::env::temp_dir().join(edgevx_tests::unique("promtool"));
        std::fs::create_dir_all(&dir)?;
        let p = Promtool { bin: promtool()?, dir };
        std::fs::copy(monitoring().join("prometheus.test.yaml"), p.dir.join("prometheus.test.yaml"))?;
        Ok(p)
    }

    /// Writes `spec` as the rule file the unit tests read, and runs
    /// promtool with `args`: its output, and whether it succeeded.
    fn run(&self, spec: &Value, args: [&str; 3]) -> Result<(bool, String)> {
        std::fs::write(self.dir.join("edgevx-rules.yaml"), serde_yaml_ng::to_string(spec)?)?;
        let out = Command::new(&self.bin).args(args).current_dir(&self.dir).output()?;
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        Ok((out.status.success(), text))
    }

    fn check(&self, spec: &Value) -> Result<(bool, String)> {
        self.run(spec, ["check", "rules", "edgevx-rules.yaml"])
    }

    fn test(&self, spec: &Value) -> Result<(bool, String)> {
        self.run(spec, ["test", "rules", "prometheus.test.yaml"])
    }
}

impl Drop for Promtool {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// mdBook's id for a heading (its `normalize_id`): lower case, spaces to
/// `-`, only alphanumerics, `-` and `_` kept.
fn heading_id(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_unit_test_and_a_runbook_url() -> Result<()> {
    let rule = prometheus_rule()?;
    let spec = &rule["spec"];
    let promtool = Promtool::new()?;
    for (ok, out) in [promtool.check(spec)?, promtool.test(spec)?] {
        ensure!(ok, "promtool failed on the rendered rules:\n{out}");
    }
    let tests = std::fs::read_to_string(monitoring().join("prometheus.test.yaml"))?;
    let runbook = std::fs::read_to_string(runbook_md())?;
    let ids: BTreeSet<String> =
        runbook.lines().filter_map(|l| l.strip_prefix("## ")).map(heading_id).collect::<BTreeSet<_>>();
    let base = rule["metadata"]["annotations"]["runbook-base"].as_str().context("no runbook-base annotation")?;
    ensure!(base.starts_with("https://") && base.ends_with('/'), "runbook-base {base:?}: not an https URL ending in /");
    let page = RUNBOOK.replace(".md", ".html");
    let all: Vec<&Value> = rules(spec).collect();
    ensure!(all.len() >= 10, "only {} alerts", all.len());
    for r in all {
        let name = r["alert"].as_str().context("a rule without an alert name")?;
        ensure!(tests.contains(&format!("alertname: {name}\n")), "alert {name} has no promtool unit test");
        let url = r["annotations"]["runbook_url"].as_str().with_context(|| format!("alert {name}: no runbook_url"))?;
        let anchor = url
            .strip_prefix(base)
            .and_then(|u| u.strip_prefix(&page))
            .and_then(|u| u.strip_prefix('#'))
            .with_context(|| format!("alert {name}: runbook_url {url} is not {base}{page}#<section>"))?;
        ensure!(anchor == heading_id(name), "alert {name}: runbook_url {url} links to another alert's section");
        ensure!(ids.contains(anchor), "alert {name}: docs/src/{RUNBOOK} has no section `## {name}`");
    }
    Ok(())
}

/// Broken versions of each alert's expression the unit tests must catch:
/// one that never fires, one that fires on anything, and, for the alerts
/// whose point is to stay quiet somewhere, the expression without that
/// guard.
fn mutants(name: &str, expr: &str) -> Vec<(String, String)> {
    let mut m = vec![
        ("never fires".to_string(), format!("({expr}) and on () vector(0) > 1")),
        ("always fires".to_string(), format!("({expr}) or vector(1)")),
    ];
    let guards: &[(&str, &str, &str)] = &[
        // an etcd view ages to 23 h while the watch is open: quiet
        ("EdgevxViewStale", "without the watch", "unless on"),
        // installed, no node labelled yet (migration step 2): quiet
        ("EdgevxAgentAbsent", "without the DaemonSet's desired count", "unless on"),
        // a rolling update's few minutes, and other DaemonSets: quiet
        ("EdgevxAgentUnavailable", "without the DaemonSet's name", ", daemonset=\"edgevx\""),
        ("EdgevxAgentDown", "without the job", "{job=\"edgevx\"}"),
    ];
    for (alert, what, cut) in guards {
        if *alert == name && expr.contains(cut) {
            let broken = match *cut {
                "unless on" => expr.split("unless on").next().unwrap_or(expr).trim().to_string(),
                _ => expr.replace(cut, ""),
            };
            m.push((what.to_string(), broken));
        }
    }
    m
}

#[test]
fn each_alerts_unit_tests_fail_when_its_expression_is_broken() -> Result<()> {
    let rule = prometheus_rule()?;
    let promtool = Promtool::new()?;
    let (ok, out) = promtool.test(&rule["spec"])?;
    ensure!(ok, "the unit tests fail on the rules as written:\n{out}");
    let mut guarded = BTreeSet::new();
    for (name, expr) in alerts(&rule["spec"]) {
        for (what, broken) in mutants(&name, &expr) {
            if what != "never fires" && what != "always fires" {
                guarded.insert(name.clone());
            }
            let mut spec = rule["spec"].clone();
            for g in spec["groups"].as_array_mut().into_iter().flatten() {
                for r in g["rules"].as_array_mut().into_iter().flatten() {
                    if r["alert"] == name.as_str() {
                        r["expr"] = Value::String(broken.clone());
                    }
                }
            }
            // a broken expression that is still valid PromQL: the unit tests must be what fails
            let (valid, out) = promtool.check(&spec)?;
            ensure!(valid, "{name} {what}: the mutant `{broken}` is not valid PromQL:\n{out}");
            let (passed, _) = promtool.test(&spec)?;
            ensure!(!passed, "{name} {what} (`{broken}`): its unit tests still pass");
        }
    }
    ensure!(
        guarded.len() == 4,
        "the guards of EdgevxViewStale, EdgevxAgentAbsent, EdgevxAgentUnavailable and EdgevxAgentDown were not all \
         found (only {guarded:?}): update mutants() with the rules"
    );
    Ok(())
}

/// The metric names a PromQL expression reads: every name that is not a
/// function or an aggregation (followed by `(`), a keyword, a label (in
/// `{}` or after by/on/...), a string, a duration or a number.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    const LABEL_LISTS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];
    const KEYWORDS: [&str; 5] = ["and", "or", "unless", "bool", "offset"];
    let chars: Vec<char> = expr.chars().collect();
    let mut i = 0;
    let skip_to =
        |from: usize, close: char| chars[from..].iter().position(|c| *c == close).map_or(chars.len(), |p| from + p + 1);
    while i < chars.len() {
        let c = chars[i];
        match c {
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '"' => i = skip_to(i + 1, '"'),
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let rest: String = chars[i..].iter().collect::<String>().trim_start().to_string();
                let next_word: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                // a function or an aggregation: `f(`, `max by (...) (`, `sum without (...) (`
                let called = rest.starts_with('(') || next_word == "by" || next_word == "without";
                if LABEL_LISTS.contains(&word.as_str()) {
                    if rest.starts_with('(') {
                        let open = i + chars[i..].iter().position(|c| *c == '(').unwrap_or(0);
                        i = skip_to(open, ')');
                    }
                } else if !KEYWORDS.contains(&word.as_str()) && !called {
                    into.insert(word);
                }
            }
            c if c.is_ascii_digit() => {
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
}

/// Metrics the rules read that no edgevx agent serves, and who does.
const NOT_THE_AGENTS: [(&str, &str); 3] = [
    ("up", "Prometheus, per target"),
    ("kube_daemonset_status_number_unavailable", "kube-state-metrics"),
    ("kube_daemonset_status_desired_number_scheduled", "kube-state-metrics"),
];

#[test]
fn promql_metric_names_are_told_from_functions_labels_and_durations() {
    let mut names = BTreeSet::new();
    metric_names(
        r#"max by (instance, source) (a_seconds{x="y z"}) > 3600 unless on (instance) max(max_over_time(b[1h])) > 0 or absent(up{job="e"}) and sum without (le) (rate(c_total[5m])) * 8"#,
        &mut names,
    );
    let want: BTreeSet<String> = ["a_seconds", "b", "up", "c_total"].map(String::from).into();
    assert_eq!(names, want);
}

#[test]
fn every_metric_the_dashboard_and_the_rules_read_is_served() -> Result<()> {
    let mut used = BTreeSet::new();
    for (_, expr) in alerts(&prometheus_rule()?["spec"]) {
        metric_names(&expr, &mut used);
    }
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(monitoring().join("dashboard.json"))?)?;
    let panels = dashboard["panels"].as_array().context("no panels")?;
    for p in panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            metric_names(t["expr"].as_str().unwrap_or(""), &mut used);
        }
    }
    for v in dashboard["templating"]["list"].as_array().into_iter().flatten() {
        // label_values(<metric>, <label>)
        let def = v["definition"].as_str().unwrap_or("");
        if let Some(metric) = def.strip_prefix("label_values(").and_then(|d| d.split(',').next()) {
            metric_names(metric, &mut used);
        }
    }
    let (agents, others): (BTreeSet<String>, BTreeSet<String>) =
        used.into_iter().partition(|m| !NOT_THE_AGENTS.iter().any(|(n, _)| n == m));
    ensure!(agents.len() >= 10, "only {} agent metrics found in the dashboard and rules: {agents:?}", agents.len());
    for m in &agents {
        ensure!(m.starts_with("edgevx_"), "{m} is read by the dashboard or the rules but is no edgevx metric");
    }
    ensure!(others.len() == NOT_THE_AGENTS.len(), "the rules no longer read all of {NOT_THE_AGENTS:?}: {others:?}");

    // a live agent with a peer, after traffic both ways
    let s = edgevx_and_flannel(&[])?;
    let h = s.cluster.host(1);
    let deadline = std::time::Instant::now() + edgevx_tests::patience(Duration::from_secs(15));
    loop {
        let reply = crate::metrics::get(&h.ns, "/metrics")?;
        let served: BTreeSet<String> = reply
            .body
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
            .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
            .collect();
        let missing: Vec<&String> = agents.iter().filter(|m| !served.contains(*m)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "the dashboard or the rules read metrics the agent does not serve: {missing:?}\nserved: {served:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}
