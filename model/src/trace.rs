//! Counterexamples as text and as SVG sequence diagrams.

use crate::model::{Action, LockModel, State};
use std::fmt::Write as _;

/// A counterexample step by step: the action, then the state it led to
/// (true time, each clock, each client's belief, the keys on each node).
pub fn text(model: &LockModel, steps: &[(State, Option<Action>)]) -> String {
    let mut out = String::new();
    if let Some((first, _)) = steps.first() {
        let _ = writeln!(out, "   start: {}", model.describe(first));
    }
    for (i, pair) in steps.windows(2).enumerate() {
        let (before, action) = &pair[0];
        let (after, _) = &pair[1];
        if let Some(action) = action {
            let _ = writeln!(
                out,
                "{:>3}. {}",
                i + 1,
                model.describe_action(before, action)
            );
            let _ = writeln!(out, "     {}", model.describe(after));
        }
    }
    out
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The counterexample as an SVG sequence diagram: one lifeline per client
/// and per node, one row per step, true time in the left margin.
pub fn svg(model: &LockModel, steps: &[(State, Option<Action>)]) -> String {
    let clients = usize::from(model.cfg.clients);
    let nodes = usize::from(model.cfg.nodes);
    let lanes = clients + nodes;
    let lane_w = 220usize;
    let left = 70usize;
    let row_h = 34usize;
    let top = 50usize;
    let rows = steps.len().saturating_sub(1);
    let width = left + lanes * lane_w;
    let height = top + rows * row_h + 30;
    let x = |lane: usize| left + lane * lane_w + lane_w / 2;
    let client_lane = |c: u8| usize::from(c);
    let node_lane = |n: u8| clients + usize::from(n);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(
        s,
        r#"<defs><marker id="a" markerWidth="8" markerHeight="8" refX="7" refY="3" orient="auto"><path d="M0,0 L7,3 L0,6 z"/></marker></defs>"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for lane in 0..lanes {
        let name = if lane < clients {
            format!("client c{lane}")
        } else {
            format!("node n{}", lane - clients)
        };
        let _ = writeln!(
            s,
            r#"<text x="{}" y="20" text-anchor="middle" font-weight="bold">{}</text>"#,
            x(lane),
            name
        );
        let _ = writeln!(
            s,
            r##"<line x1="{0}" y1="28" x2="{0}" y2="{1}" stroke="#999" stroke-dasharray="4 3"/>"##,
            x(lane),
            height - 10
        );
    }
    for (i, pair) in steps.windows(2).enumerate() {
        let (before, action) = &pair[0];
        let Some(action) = action else { continue };
        let y = top + i * row_h;
        let label = escape(&model.describe_action(before, action));
        let _ = writeln!(
            s,
            r##"<text x="4" y="{}" fill="#666">t={}</text>"##,
            y + 4,
            before.time
        );
        let arrow = match action {
            Action::Deliver { client, node } => {
                Some((client_lane(*client), node_lane(*node), "#1f5fa8"))
            }
            Action::RoundTrip { client, node } => {
                Some((client_lane(*client), node_lane(*node), "#1f5fa8"))
            }
            Action::DeliverOrphan { client, node } => {
                Some((client_lane(*client), node_lane(*node), "#c62828"))
            }
            Action::Receive { client, node } => {
                Some((node_lane(*node), client_lane(*client), "#2e7d32"))
            }
            _ => None,
        };
        match arrow {
            Some((from, to, colour)) => {
                let _ = writeln!(
                    s,
                    r#"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="{colour}" marker-end="url(#a)"/>"#,
                    x(from),
                    x(to)
                );
                let _ = writeln!(
                    s,
                    r#"<text x="{}" y="{}" text-anchor="middle" fill="{colour}">{label}</text>"#,
                    (x(from) + x(to)) / 2,
                    y - 4
                );
            }
            None => {
                let lane = match action {
                    Action::Timer(c)
                    | Action::Check(c)
                    | Action::Write(c)
                    | Action::Crash(c)
                    | Action::Pause(c)
                    | Action::Resume(c)
                    | Action::Timeout { client: c, .. } => client_lane(*c),
                    Action::JumpClock(n)
                    | Action::Restart(n)
                    | Action::Cut(n)
                    | Action::Heal(n) => node_lane(*n),
                    Action::Replicate | Action::Promote => node_lane(0),
                    Action::LoseRequest { node, .. }
                    | Action::LoseReply { node, .. }
                    | Action::Hold { node, .. } => node_lane(*node),
                    _ => usize::MAX,
                };
                let colour = match action {
                    Action::Crash(_)
                    | Action::Pause(_)
                    | Action::JumpClock(_)
                    | Action::Restart(_)
                    | Action::Promote
                    | Action::Cut(_)
                    | Action::LoseRequest { .. }
                    | Action::Hold { .. }
                    | Action::LoseReply { .. } => "#c62828",
                    _ => "#333",
                };
                let cx = if lane == usize::MAX {
                    width / 2
                } else {
                    x(lane)
                };
                let _ = writeln!(
                    s,
                    r#"<text x="{cx}" y="{}" text-anchor="middle" fill="{colour}">{label}</text>"#,
                    y + 4
                );
            }
        }
    }
    s.push_str("</svg>\n");
    s
}
