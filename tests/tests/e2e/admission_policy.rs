//! deploy/admission/own-node-only.yaml: its CEL, evaluated with cel-rust
//! on the requests the API server would build. Needs no root and no cluster.
//! cel-rust implements the CEL spec's core (has(), `in` on maps, list
//! equality, string concatenation), which is all this policy uses; what it
//! cannot check is the Kubernetes-specific part: that the API server puts
//! the node in that extra (1.30+, documented in the manifest).
use std::path::PathBuf;

use anyhow::{Context, Result, anyhow};
use cel::{Context as CelContext, Program, Value as CelValue};
use serde::Deserialize;
use serde_json::{Value, json};

const EDGEVX: &str = "system:serviceaccount:kube-edgevx:edgevx";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

fn policy() -> Result<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/admission/own-node-only.yaml");
    let text = std::fs::read_to_string(&path)?;
    let docs: Vec<Value> = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).context("own-node-only.yaml"))
        .collect::<Result<_>>()?;
    docs.into_iter().find(|d| d["kind"] == "ValidatingAdmissionPolicy").context("no ValidatingAdmissionPolicy")
}

fn eval(expr: &str, request: &Value) -> Result<CelValue> {
    let program = Program::compile(expr).map_err(|e| anyhow!("{expr}: {e}"))?;
    let mut ctx = CelContext::default();
    ctx.add_variable("request", request).map_err(|e| anyhow!("{e}"))?;
    program.execute(&ctx).map_err(|e| anyhow!("{expr}: {e}"))
}

/// Whether the policy lets `request` through: not matched, or every validation true.
fn admitted(policy: &Value, request: &Value) -> Result<bool> {
    for c in policy["spec"]["matchConditions"].as_array().into_iter().flatten() {
        if eval(c["expression"].as_str().unwrap_or_default(), request)? != CelValue::Bool(true) {
            return Ok(true);
        }
    }
    for v in policy["spec"]["validations"].as_array().context("no validations")? {
        if eval(v["expression"].as_str().unwrap_or_default(), request)? != CelValue::Bool(true) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// A status patch of Node `node` by `user`, with the userInfo extras `extra`.
fn patch(user: &str, node: &str, extra: Option<Value>) -> Value {
    let mut info = json!({"username": user, "groups": ["system:serviceaccounts", "system:authenticated"]});
    if let Some(extra) = extra {
        info["extra"] = extra;
    }
    json!({"operation": "UPDATE", "name": node, "subResource": "status", "userInfo": info})
}

#[test]
fn admission_policy_lets_edgevx_write_only_its_own_node() -> Result<()> {
    let p = policy()?;
    let rules = &p["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(rules["resources"], json!(["nodes", "nodes/status"]));
    assert!(rules["operations"].as_array().is_some_and(|o| o.contains(&json!("UPDATE"))), "PATCH is an UPDATE");

    let bound = |node: &str| Some(json!({NODE_NAME: [node], "authentication.kubernetes.io/pod-name": ["edgevx-x1"]}));
    // (request, admitted?, why)
    let cases = [
        (patch(EDGEVX, "edge-1", bound("edge-1")), true, "its own node"),
        (patch(EDGEVX, "edge-2", bound("edge-1")), false, "another node"),
        (patch(EDGEVX, "edge-1", None), false, "a token that names no node (legacy Secret token)"),
        (
            patch(EDGEVX, "edge-1", Some(json!({"authentication.kubernetes.io/pod-name": ["x"]}))),
            false,
            "no node extra",
        ),
        (patch(EDGEVX, "edge-1", Some(json!({NODE_NAME: ["edge-1", "edge-2"]}))), false, "two nodes"),
        (patch(EDGEVX, "edge-1", Some(json!({NODE_NAME: []}))), false, "an empty node list"),
        (patch("system:serviceaccount:kube-edgevx:other", "edge-2", bound("edge-1")), true, "not edgevx: not matched"),
        (patch("system:node:edge-2", "edge-2", None), true, "the kubelet: not matched"),
    ];
    for (request, want, why) in &cases {
        assert_eq!(admitted(&p, request)?, *want, "{why}: {request}");
    }
    // the message must compile too: the API server rejects a policy whose messageExpression does not
    for v in p["spec"]["validations"].as_array().into_iter().flatten() {
        let msg = eval(v["messageExpression"].as_str().context("no messageExpression")?, &cases[1].0)?;
        let CelValue::String(msg) = msg else { panic!("message is not a string: {msg:?}") };
        assert!(msg.contains("edge-2") && msg.contains(NODE_NAME), "{msg}");
    }
    let binding = serde_yaml_ng::Deserializer::from_str(&std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/admission/own-node-only.yaml"),
    )?)
    .map(Value::deserialize)
    .collect::<Result<Vec<Value>, _>>()?
    .into_iter()
    .find(|d| d["kind"] == "ValidatingAdmissionPolicyBinding")
    .context("no binding")?;
    assert_eq!(binding["spec"]["policyName"], p["metadata"]["name"]);
    assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]));
    Ok(())
}
