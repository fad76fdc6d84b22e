//! Counterexamples as text and as SVG sequence diagrams.

use crate::fault::PropertyId;
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

/// Where each of the model's properties first fails along `steps`: the
/// index of the step (1-based, as [`text`] numbers them) whose resulting
/// state violates it, for every property that fails at all. The last step
/// of a shortest counterexample is where its property breaks; an explorer
/// path may break one earlier.
pub fn breaks(model: &LockModel, steps: &[(State, Option<Action>)]) -> Vec<(usize, PropertyId)> {
    let mut out = Vec::new();
    for &p in &model.properties {
        if let Some(i) = steps
            .iter()
            .skip(1)
            .position(|(state, _)| !model.holds_in(p, state))
        {
            out.push((i + 1, p));
        }
    }
    out.sort();
    out
}

/// The counterexample as an SVG sequence diagram: one lifeline per client
/// and per node, one row per step, true time in the left margin. A bar on a
/// client's lifeline spans the steps during which it is inside its critical
/// section (the rule `mutual-exclusion` counts: it believes it holds and
/// its own clock has not passed its validity, or it is paused); the step
/// at which a property first fails is shaded red and names the property.
pub fn svg(model: &LockModel, steps: &[(State, Option<Action>)]) -> String {
    let clients = usize::from(model.cfg.clients);
    let nodes = usize::from(model.cfg.nodes);
    let lanes = clients + nodes;
    let lane_w = 220usize;
    let left = 70usize;
    let right = 190usize;
    let row_h = 34usize;
    let top = 50usize;
    let rows = steps.len().saturating_sub(1);
    let width = left + lanes * lane_w + right;
    let legend = 24usize;
    let height = top + rows * row_h + 30 + legend;
    let x = |lane: usize| left + lane * lane_w + lane_w / 2;
    let client_lane = |c: u8| usize::from(c);
    let node_lane = |n: u8| clients + usize::from(n);
    let breaks = breaks(model, steps);
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
    // The breaking steps, behind everything else.
    let mut named: Vec<(usize, String)> = Vec::new();
    for &(i, p) in &breaks {
        match named.last_mut() {
            Some((j, names)) if *j == i => {
                names.push_str(", ");
                names.push_str(p.as_str());
            }
            _ => named.push((i, p.as_str().to_owned())),
        }
    }
    for (i, names) in &named {
        let y = top + (i - 1) * row_h;
        let _ = writeln!(
            s,
            r##"<rect x="0" y="{}" width="{width}" height="{}" fill="#ffebee"/>"##,
            y - row_h / 2 + 2,
            row_h - 4
        );
        let _ = writeln!(
            s,
            r##"<text x="{}" y="{}" fill="#c62828" font-weight="bold">&#x2717; {} breaks</text>"##,
            left + lanes * lane_w + 6,
            y + 4,
            escape(names)
        );
    }
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
            height - 10 - legend
        );
    }
    // Critical sections: the state after step `i` lasts until step `i + 1`.
    for c in 0..clients {
        let mut run: Option<usize> = None;
        for i in 0..=rows {
            let inside = i < rows && {
                let (state, _) = &steps[i + 1];
                state.clients[c].inside(state.time)
            };
            match (inside, run) {
                (true, None) => run = Some(i),
                (false, Some(from)) => {
                    let _ = writeln!(
                        s,
                        r##"<rect x="{}" y="{}" width="12" height="{}" fill="#43a047" fill-opacity="0.45"/>"##,
                        x(client_lane(c as u8)) - 6,
                        top + from * row_h,
                        (i - from) * row_h
                    );
                    run = None;
                }
                _ => {}
            }
        }
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
                    | Action::StepBack(c)
                    | Action::Resume(c)
                    | Action::Timeout { client: c, .. } => client_lane(*c),
                    Action::JumpClock(n)
                    | Action::Restart(n)
                    | Action::Cut(n)
                    | Action::Heal(n) => node_lane(*n),
                    Action::Replicate | Action::Promote | Action::Split(_) | Action::Demote => {
                        node_lane(0)
                    }
                    Action::LoseRequest { node, .. }
                    | Action::LoseReply { node, .. }
                    | Action::Hold { node, .. }
                    | Action::CutLink { node, .. } => node_lane(*node),
                    _ => usize::MAX,
                };
                let colour = match action {
                    Action::Crash(_)
                    | Action::Pause(_)
                    | Action::StepBack(_)
                    | Action::JumpClock(_)
                    | Action::Restart(_)
                    | Action::Promote
                    | Action::Split(_)
                    | Action::Demote
                    | Action::Cut(_)
                    | Action::CutLink { .. }
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
    let _ = writeln!(
        s,
        r##"<rect x="{left}" y="{}" width="12" height="12" fill="#43a047" fill-opacity="0.45"/><text x="{}" y="{}" fill="#333">inside its critical section</text>"##,
        height - legend,
        left + 18,
        height - legend + 10
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fault::Fault;
    use crate::matrix;
    use lockwright_core::ProtocolId;

    /// `set-px-lua` under `restart`: c0 is granted, the node restarts
    /// empty, c1 is granted too. The picture has a bar for each client
    /// inside and marks the last step, and only that one.
    #[test]
    fn the_picture_shows_critical_sections_and_the_breaking_step() {
        let (p, f, prop) = (
            ProtocolId::SetPxLua,
            Fault::Restart,
            PropertyId::MutualExclusion,
        );
        let run = matrix::check(p, f, 1, true).expect("checks");
        let trace = run
            .cells
            .iter()
            .find(|c| c.property == prop)
            .and_then(|c| c.trace.clone())
            .expect("mutual exclusion is violated");
        let model = matrix::cell_model(p, f, prop).expect("model");
        let last = trace.len() - 1;
        assert!(breaks(&model, &trace).contains(&(last, prop)));
        assert!(breaks(&model, &trace[..last]).is_empty());
        let picture = svg(&model, &trace);
        assert_eq!(picture.matches("mutual-exclusion breaks").count(), 1);
        // One bar per client, and the legend's swatch.
        assert_eq!(picture.matches(r##"fill="#43a047""##).count(), 3);
        let before = svg(&model, &trace[..last]);
        assert!(!before.contains("breaks"));
        assert_eq!(before.matches(r##"fill="#43a047""##).count(), 2);
    }
}
