//! The dashboard and the alerts in deploy/monitoring/, tested (issue 21):
//! the rules pass `promtool check rules` and their unit tests
//! (`promtool test rules`); every alert has a unit test and a runbook
//! entry; and every metric the dashboard and the rules read is one a live
//! agent serves, so a renamed metric fails here, not on a dashboard.
use std::{collections::BTreeSet, path::PathBuf, process::Command, time::Duration};

use anyhow::{Context, Result, bail, ensure};
use edgevx_tests::scenario::edgevx_and_flannel;
use serde_json::Value;

fn monitoring() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/monitoring")
}

/// The runbook the alerts link to, a chapter of the book.
fn runbook_md() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/src/operations/runbook.md")
}

/// The PrometheusRule's `spec`: a plain Prometheus rule file (`groups:`).
fn rule_file() -> Result<serde_yaml_ng::Value> {
    let path = monitoring().join("prometheusrule.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let rule: serde_yaml_ng::Value = serde_yaml_ng::from_str(&text)?;
    ensure!(rule["kind"].as_str() == Some("PrometheusRule"), "{} is not a PrometheusRule", path.display());
    Ok(rule["spec"].clone())
}

/// Every rule: (alert name, expression).
fn alerts(spec: &serde_yaml_ng::Value) -> Vec<(String, String)> {
    let groups = spec["groups"].as_sequence().cloned().unwrap_or_default();
    groups
        .iter()
        .flat_map(|g| g["rules"].as_sequence().cloned().unwrap_or_default())
        .map(|r| (r["alert"].as_str().unwrap_or("").to_string(), r["expr"].as_str().unwrap_or("").to_string()))
        .collect()
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

/// The `edgevx_*` metric names an expression reads.
fn metric_names(expr: &str, into: &mut BTreeSet<String>) {
    let mut rest = expr;
    while let Some(at) = rest.find("edgevx_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        into.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_every_alert_has_a_unit_test_and_a_runbook() -> Result<()> {
    let spec = rule_file()?;
    let dir = std::env::temp_dir().join(edgevx_tests::unique("promtool"));
    std::fs::create_dir_all(&dir)?;
    let run = || -> Result<()> {
        std::fs::write(dir.join("edgevx-rules.yaml"), serde_yaml_ng::to_string(&spec)?)?;
        let tests = std::fs::read_to_string(monitoring().join("prometheus.test.yaml"))?;
        std::fs::write(dir.join("prometheus.test.yaml"), &tests)?;
        let promtool = promtool()?;
        for args in [["check", "rules", "edgevx-rules.yaml"], ["test", "rules", "prometheus.test.yaml"]] {
            let out = Command::new(&promtool).args(args).current_dir(&dir).output()?;
            ensure!(
                out.status.success(),
                "promtool {} failed:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let runbook = std::fs::read_to_string(runbook_md())?;
        let all = alerts(&spec);
        ensure!(all.len() >= 8, "only {} alerts", all.len());
        for (name, _) in &all {
            ensure!(tests.contains(&format!("alertname: {name}\n")), "alert {name} has no promtool unit test");
            ensure!(runbook.contains(&format!("\n## {name}\n")), "alert {name} has no runbook entry");
        }
        Ok(())
    };
    let r = run();
    let _ = std::fs::remove_dir_all(&dir);
    r
}

#[test]
fn every_metric_the_dashboard_and_the_rules_read_is_served() -> Result<()> {
    let mut used = BTreeSet::new();
    for (_, expr) in alerts(&rule_file()?) {
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
        metric_names(v["definition"].as_str().unwrap_or(""), &mut used);
    }
    ensure!(used.len() >= 10, "only {} metrics found in the dashboard and rules: {used:?}", used.len());

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
        let missing: Vec<&String> = used.iter().filter(|m| !served.contains(*m)).collect();
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
