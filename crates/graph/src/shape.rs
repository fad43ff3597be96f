//! [`GraphShape`]: a compiled graph's nodes and edges, for drawing it — as an SVG picture
//! (the playground's inspector) laid out in layers from `START`.

use crate::node::{END, START};
use std::collections::{HashMap, VecDeque};
use std::fmt::Write as _;

/// How one node leads to another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EdgeKind {
    /// Always.
    Direct,
    /// When the source's router chooses it.
    Branch,
    /// When a paused run is resumed after a person's decision.
    Approval,
}

/// One edge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeEdge {
    /// From this node.
    pub from: String,
    /// To this one.
    pub to: String,
    /// How.
    pub kind: EdgeKind,
}

/// The nodes (`START` first, `END` last) and edges of a graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphShape {
    /// Node names, `START` and `END` included.
    pub nodes: Vec<String>,
    /// Every edge, approval links included.
    pub edges: Vec<ShapeEdge>,
}

const NODE_W: f32 = 132.0;
const NODE_H: f32 = 36.0;
const GAP_X: f32 = 48.0;
const LAYER_H: f32 = 92.0;
const MARGIN: f32 = 24.0;
/// Room on the right for edges that go back up (loops).
const LOOP_ROOM: f32 = 90.0;

impl GraphShape {
    /// Each node's layer: its distance from `START` over forward edges; `END` below all.
    fn layers(&self) -> HashMap<&str, usize> {
        let mut layer: HashMap<&str, usize> = HashMap::from([(START, 0)]);
        let mut queue = VecDeque::from([START]);
        while let Some(n) = queue.pop_front() {
            let here = layer[n];
            for e in self.edges.iter().filter(|e| e.from == n && e.to != END) {
                if !layer.contains_key(e.to.as_str()) {
                    layer.insert(e.to.as_str(), here + 1);
                    queue.push_back(e.to.as_str());
                }
            }
        }
        let deepest = layer.values().copied().max().unwrap_or(0);
        for n in self.nodes.iter().filter(|n| *n != END) {
            layer.entry(n.as_str()).or_insert(deepest + 1);
        }
        layer.insert(END, layer.values().copied().max().unwrap_or(0) + 1);
        layer
    }

    /// The graph as a standalone SVG document: a box per node (`<g class="node"
    /// data-node="NAME">`, so a page can mark the ones that ran), arrows for edges — dashed
    /// where a router chooses, thick and labelled where a person's approval resumes the run,
    /// curved on the right where an edge goes back up.
    pub fn to_svg(&self) -> String {
        let layer = self.layers();
        let depth = layer.values().copied().max().unwrap_or(0);
        let mut rows: Vec<Vec<&str>> = vec![Vec::new(); depth + 1];
        for n in &self.nodes {
            rows[layer[n.as_str()]].push(n.as_str());
        }
        let widest = rows.iter().map(Vec::len).max().unwrap_or(1).max(1) as f32;
        let width = MARGIN * 2.0 + widest * NODE_W + (widest - 1.0) * GAP_X + LOOP_ROOM;
        let height = MARGIN * 2.0 + depth as f32 * LAYER_H + NODE_H;
        let inner = width - LOOP_ROOM;
        let mut at: HashMap<&str, (f32, f32)> = HashMap::new();
        for (i, row) in rows.iter().enumerate() {
            let span = row.len() as f32 * NODE_W + (row.len().saturating_sub(1)) as f32 * GAP_X;
            let left = (inner - span) / 2.0;
            for (j, n) in row.iter().enumerate() {
                let x = left + j as f32 * (NODE_W + GAP_X) + NODE_W / 2.0;
                at.insert(n, (x, MARGIN + i as f32 * LAYER_H + NODE_H / 2.0));
            }
        }
        let mut svg = String::new();
        let _ = write!(
            svg,
            r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:.0} {height:.0}" width="{width:.0}" height="{height:.0}" role="img" aria-label="The agent's graph" class="graph">"##
        );
        svg.push_str(
            r##"<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="currentColor"/></marker></defs>"##,
        );
        for (k, e) in self.edges.iter().enumerate() {
            let (Some(&(x1, y1)), Some(&(x2, y2))) = (at.get(e.from.as_str()), at.get(e.to.as_str())) else { continue };
            let class = match e.kind {
                EdgeKind::Direct => "edge",
                EdgeKind::Branch => "edge branch",
                EdgeKind::Approval => "edge approval",
            };
            let dash = if e.kind == EdgeKind::Branch { r#" stroke-dasharray="5 4""# } else { "" };
            let stroke = if e.kind == EdgeKind::Approval { 2.4 } else { 1.3 };
            let path = if layer[e.to.as_str()] > layer[e.from.as_str()] {
                format!("M{x1:.1},{:.1} L{x2:.1},{:.1}", y1 + NODE_H / 2.0, y2 - NODE_H / 2.0 - 1.0)
            } else {
                // Back up (or across): out of the source's right side, round the right margin.
                let bend = inner - MARGIN + 24.0 + (k % 3) as f32 * 14.0;
                let (sx, tx) = (x1 + NODE_W / 2.0, x2 + NODE_W / 2.0 + 1.0);
                format!("M{sx:.1},{y1:.1} C{bend:.1},{y1:.1} {bend:.1},{y2:.1} {tx:.1},{y2:.1}")
            };
            let _ = write!(
                svg,
                r##"<path class="{class}" data-from="{}" data-to="{}" d="{path}" fill="none" stroke="currentColor" stroke-width="{stroke}"{dash} marker-end="url(#arrow)"/>"##,
                escape(&e.from),
                escape(&e.to)
            );
            if e.kind == EdgeKind::Approval {
                let (mx, my) = ((x1 + x2) / 2.0 + 6.0, (y1 + y2) / 2.0);
                let _ = write!(svg, r#"<text x="{mx:.1}" y="{my:.1}" font-size="11">approval</text>"#);
            }
        }
        for n in &self.nodes {
            let (x, y) = at[n.as_str()];
            let terminal = n == START || n == END;
            let label = match n.as_str() {
                START => "START",
                END => "END",
                other => other,
            };
            let radius = if terminal { NODE_H / 2.0 } else { 6.0 };
            let _ = write!(
                svg,
                r##"<g class="node" data-node="{}"><rect x="{:.1}" y="{:.1}" width="{NODE_W}" height="{NODE_H}" rx="{radius}" fill="none" stroke="currentColor" stroke-width="1.3"/><text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="13" fill="currentColor">{}</text></g>"##,
                escape(n),
                x - NODE_W / 2.0,
                y - NODE_H / 2.0,
                y + 4.5,
                escape(label)
            );
        }
        svg.push_str("</svg>");
        svg
    }
}

/// `text` safe inside XML text and double-quoted attributes.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn edge(from: &str, to: &str, kind: EdgeKind) -> ShapeEdge {
        ShapeEdge { from: from.into(), to: to.into(), kind }
    }

    /// The ReAct agent's shape: model, tools and the approval path, with loops back up.
    fn react() -> GraphShape {
        GraphShape {
            nodes: [START, "agent", "approved", "execute", "tools", END].map(str::to_owned).to_vec(),
            edges: vec![
                edge(START, "agent", EdgeKind::Direct),
                edge("agent", "tools", EdgeKind::Branch),
                edge("agent", END, EdgeKind::Branch),
                edge("tools", "agent", EdgeKind::Direct),
                edge("approved", "execute", EdgeKind::Direct),
                edge("execute", "agent", EdgeKind::Direct),
                edge("tools", "approved", EdgeKind::Approval),
            ],
        }
    }

    #[test]
    fn every_node_and_edge_is_drawn_in_layers_from_start() {
        let shape = react();
        let layers = shape.layers();
        assert_eq!((layers[START], layers["agent"], layers["tools"], layers["approved"]), (0, 1, 2, 3));
        assert_eq!((layers["execute"], layers[END]), (4, 5), "END below everything");
        let svg = shape.to_svg();
        assert!(svg.starts_with("<svg ") && svg.ends_with("</svg>"));
        for n in ["agent", "tools", "approved", "execute", START, END] {
            assert_eq!(svg.matches(&format!("data-node=\"{n}\"")).count(), 1, "{n}");
        }
        assert_eq!(svg.matches("<path class=\"edge").count(), 7);
        assert_eq!(svg.matches("class=\"edge branch\"").count(), 2);
        assert_eq!(svg.matches("class=\"edge approval\"").count(), 1);
        assert!(svg.contains(">approval</text>") && svg.contains(">START</text>") && svg.contains(">END</text>"));
        // tools → agent goes back up: a curve, not a line.
        let back = svg.split("data-from=\"tools\" data-to=\"agent\" d=\"").nth(1).unwrap_or_default();
        assert!(back.starts_with('M') && back.contains(" C"), "{back}");
        assert_eq!(svg.matches('<').count(), svg.matches('>').count(), "balanced markup");
    }

    #[test]
    fn names_are_escaped() {
        let shape = GraphShape {
            nodes: [START, "a<b&\"c\"", END].map(str::to_owned).to_vec(),
            edges: vec![edge(START, "a<b&\"c\"", EdgeKind::Direct), edge("a<b&\"c\"", END, EdgeKind::Direct)],
        };
        let svg = shape.to_svg();
        assert!(svg.contains("data-node=\"a&lt;b&amp;&quot;c&quot;\"") && !svg.contains("a<b"), "{svg}");
    }
}
