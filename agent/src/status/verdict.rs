//! What `edgevx status` concludes: one state for the node, its exit code,
//! and the same facts as node-level metrics for a node exporter's textfile
//! collector, so a node where programs run with no agent (an uninstall that
//! skipped `edgevx cleanup`) shows up in monitoring although no agent is
//! there to be scraped.
use std::{fmt::Write as _, fs, path::Path};

use anyhow::Result;

use super::document::{Agent, Node, NodeState, Status};
use crate::dataplane::bpffs::PinDir;

/// The node's state, from the kernel's answers: who holds the lock, what
/// is attached, what is pinned.
fn state_of(agent: &Agent, node: &Node) -> NodeState {
    let running = agent.agent_running;
    let attached = node.dataplane_attached;
    let pinned = !node.pinned.is_empty();
    match (running, attached) {
        (true, true) => NodeState::Forwarding,
        (false, true) => NodeState::Unmanaged,
        (false, false) if pinned => NodeState::Unmanaged,
        _ => NodeState::NotForwarding,
    }
}

/// The links and programs pinned under `--bpffs`, every layout version's
/// (`v7/links/edgevx_decap`): each keeps a program in the kernel.
pub fn pinned(pins: &PinDir) -> Vec<String> {
    let Some(bpffs) = pins.root.parent() else { return Vec::new() };
    let mut out = Vec::new();
    let Ok(versions) = fs::read_dir(bpffs) else { return out };
    for v in versions.flatten() {
        let Some(name) = v.file_name().to_str().map(str::to_string) else { continue };
        if !name.strip_prefix('v').is_some_and(|n| n.parse::<u32>().is_ok()) {
            continue;
        }
        for kind in ["links", "progs"] {
            for e in fs::read_dir(Path::new(&v.path()).join(kind)).into_iter().flatten().flatten() {
                out.push(format!("{name}/{kind}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    out.sort();
    out
}

/// The document: `agent` and `node` with the node's state and a one-line
/// verdict for people.
pub(super) fn judged(agent: Agent, node: Node) -> Status {
    let state = state_of(&agent, &node);
    let verdict = match state {
        NodeState::Forwarding => "forwarding".to_string(),
        NodeState::Unmanaged => "NO AGENT: the pinned programs still forward and judge with the peers they last had, \
                                and nothing keeps them current; start the agent (it adopts them) or remove them with \
                                `edgevx cleanup` (deploy/uninstall on a cluster)"
            .to_string(),
        NodeState::NotForwarding => match &agent.agent_phase {
            Some(phase) if agent.agent_running => format!("NOT forwarding: the agent is {phase}"),
            _ => "NOT forwarding: no agent runs and the programs are not attached".to_string(),
        },
    };
    Status { agent, state, verdict, node }
}

/// Exits with the state's code; the document already said why.
pub fn exit(doc: &Status) -> Result<()> {
    match doc.state.exit_code() {
        0 => Ok(()),
        code => Err(crate::SilentExit(code).into()),
    }
}

/// The node's state in the Prometheus text format, for a node exporter's
/// textfile collector (`edgevx status --prometheus > .../edgevx.prom`).
pub fn prometheus(doc: &Status) -> Result<String> {
    let gauge = |out: &mut String, name: &str, help: &str| -> std::fmt::Result {
        writeln!(out, "# HELP {name} {help}")?;
        writeln!(out, "# TYPE {name} gauge")
    };
    let mut out = String::new();
    gauge(
        &mut out,
        "edgevx_node_state",
        "The node's state as edgevx status reads it from the kernel (1: this state).",
    )?;
    for s in NodeState::ALL {
        writeln!(out, "edgevx_node_state{{state=\"{}\"}} {}", s.name(), u8::from(s == doc.state))?;
    }
    gauge(&mut out, "edgevx_node_agent_running", "Whether an edgevx agent holds this node's lock.")?;
    writeln!(out, "edgevx_node_agent_running {}", u8::from(doc.agent.agent_running))?;
    gauge(&mut out, "edgevx_node_dataplane_attached", "Whether the programs are attached, as the kernel says.")?;
    writeln!(out, "edgevx_node_dataplane_attached {}", u8::from(doc.node.dataplane_attached))?;
    gauge(&mut out, "edgevx_node_pinned_objects", "Links and programs pinned under the bpffs.")?;
    writeln!(out, "edgevx_node_pinned_objects {}", doc.node.pinned.len())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node with nothing brought up but what `attached` and `pinned` say.
    fn node(attached: bool, pinned: &[&str]) -> Node {
        let pinned = pinned.iter().map(ToString::to_string).collect();
        Node { node: None, dataplane_attached: attached, pinned, brought_up: None, peers: Vec::new() }
    }

    /// The agent section, running or not.
    fn agent(running: bool) -> Agent {
        let holder = crate::run::netns_lock::Holder { pid: None, record: None };
        crate::status::agent::section(running.then_some(&holder), 0)
    }

    #[test]
    fn the_state_is_the_kernels_answer_with_the_agents() {
        let state = |running: bool, attached: bool, pinned: &[&str]| state_of(&agent(running), &node(attached, pinned));
        assert_eq!(state(true, true, &["v7/links/edgevx_decap"]), NodeState::Forwarding);
        assert_eq!(state(true, false, &[]), NodeState::NotForwarding);
        assert_eq!(state(false, false, &[]), NodeState::NotForwarding);
        // clsact filters run with nothing pinned
        assert_eq!(state(false, true, &[]), NodeState::Unmanaged);
        // a pinned link the kernel detached still holds a program
        assert_eq!(state(false, false, &["v7/progs/edgevx_decap"]), NodeState::Unmanaged);
        let codes: Vec<u8> = NodeState::ALL.iter().map(|s| s.exit_code()).collect();
        assert_eq!(codes, [0, 1, 3], "2 stays the usage error's");
    }

    #[test]
    fn the_textfile_says_one_state_and_the_kernels_facts() {
        let doc = judged(agent(false), node(true, &["a", "b"]));
        assert_eq!(doc.state, NodeState::Unmanaged);
        let text = prometheus(&doc).unwrap();
        for line in [
            "edgevx_node_state{state=\"unmanaged\"} 1",
            "edgevx_node_state{state=\"forwarding\"} 0",
            "edgevx_node_agent_running 0",
            "edgevx_node_dataplane_attached 1",
            "edgevx_node_pinned_objects 2",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        // every sample's family has its TYPE line before it
        for sample in text.lines().filter(|l| !l.starts_with('#')) {
            let family = sample.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {family} gauge")), "{family}");
        }
    }
}
