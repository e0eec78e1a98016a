//! Random expression graphs for property tests.
//!
//! Proptest draws one `u64` seed per node; [`graph_of_seeds`] decodes each seed with a small
//! deterministic generator into a leaf or an operation over earlier nodes, so shrinking removes
//! nodes (arguments index earlier nodes modulo their count, so every graph stays valid). Sizes
//! are drawn from 1–4 with 2 and 3 most likely, so that broadcasting
//! happens but most graphs still have a solution; einsum specs use four labels, row variables,
//! and rarely fixed indices, convolution and concatenation axes.

use proptest::prelude::*;

use super::{Graph, Node};

/// SplitMix64: a tiny deterministic generator, so one seed describes one node.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `p` percent.
    pub fn percent(&mut self, p: usize) -> bool {
        self.below(100) < p
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}

const SIZES: [usize; 8] = [2, 3, 2, 3, 1, 4, 2, 3];
const LABELS: [&str; 4] = ["a", "b", "c", "d"];

fn sizes(r: &mut Rng, max: usize) -> Vec<usize> {
    let n = r.below(max + 1);
    (0..n).map(|_| *r.pick(&SIZES)).collect()
}

fn leaf(r: &mut Rng, infer_params: bool) -> Node {
    if r.percent(60) {
        let batch = if r.percent(25) { sizes(r, 1) } else { vec![] };
        Node::Data { batch, input: sizes(r, 2), output: sizes(r, 2) }
    } else {
        let row =
            |r: &mut Rng| if infer_params && r.percent(70) { None } else { Some(sizes(r, 2)) };
        let input = row(r);
        Node::Param { input, output: row(r) }
    }
}

/// An earlier node, most often one of the last three.
fn arg(r: &mut Rng, i: usize) -> usize {
    if r.percent(75) { i - 1 - r.below(i.min(3)) } else { r.below(i) }
}

fn axis(r: &mut Rng, labels: &mut Vec<String>) -> String {
    let l = r.pick(&LABELS).to_string();
    let k = r.pick(&LABELS).to_string();
    let token = match r.below(100) {
        0..=4 => return r.below(2).to_string(),
        5..=7 => format!("{l}+{k}"),
        8..=9 => format!("2*{l}+{k}"),
        10 => format!("2*{l}"),
        _ => {
            labels.push(l.clone());
            return l;
        }
    };
    labels.push(l);
    labels.push(k);
    token
}

/// A row of an operand pattern: up to two axes, maybe a row variable, always in front.
///
/// Axes before a row variable in an operand pattern (`1, ...`) are left out: a parameter whose
/// row closes to such a pattern as its least upper bound shares the pattern's row variable, and
/// its row is then lined up as a pattern (its first axis anchored at the start of the other
/// row) instead of from the right; the closed shapes can break a later operation. More
/// generally, a tensor's row that takes leading axes from a pattern (as its least upper bound,
/// or when expanded to show the pattern's axes) keeps them anchored at its start, while its
/// closed shape lines up with others from the right: an einsum `a, d, ... -> 2*c => ..., d ->`
/// of `p * p` (for a parameter `p` with inferred rows) closes `p` to `|2,1->2`, which breaks the
/// product. These are known limitations, not exercised here. The specific cases with leading
/// axes that work are in `property_regressions.rs`.
fn operand_row(r: &mut Rng, labels: &mut Vec<String>, vars: &mut Vec<&'static str>) -> String {
    let mut tokens: Vec<String> = (0..r.below(3)).map(|_| axis(r, labels)).collect();
    if r.percent(35) {
        let var = if r.percent(80) { "..." } else { "..v.." };
        vars.push(var);
        tokens.insert(0, var.to_string());
    }
    tokens.join(", ")
}

fn join_pattern(batch: Option<String>, input: Option<String>, output: String) -> String {
    let mut s = String::new();
    if let Some(b) = batch {
        s.push_str(&b);
        s.push_str(" | ");
    }
    if let Some(i) = input {
        s.push_str(&i);
        s.push_str(" -> ");
    }
    s.push_str(&output);
    s
}

/// An einsum spec over `n` operands whose result mostly reuses the operands' labels.
pub fn spec(r: &mut Rng, n: usize) -> String {
    let mut labels = Vec::new();
    let mut operands = Vec::new();
    let mut kinds_with_vars = [false; 3];
    for _ in 0..n {
        let mut row = |r: &mut Rng, k: usize| {
            let mut vars = Vec::new();
            let s = operand_row(r, &mut labels, &mut vars);
            kinds_with_vars[k] |= !vars.is_empty();
            s
        };
        let batch = if r.percent(25) { Some(row(r, 0)) } else { None };
        let input = if r.percent(30) { Some(row(r, 1)) } else { None };
        let output = row(r, 2);
        operands.push(join_pattern(batch, input, output));
    }
    labels.sort();
    labels.dedup();
    // The result: a random selection of the labels, spread over the rows, keeping row variables.
    let mut rows: [Vec<String>; 3] = Default::default();
    for (k, has) in kinds_with_vars.iter().enumerate() {
        if *has && r.percent(85) {
            rows[k].push("...".to_string());
        }
    }
    for l in &labels {
        if r.percent(65) {
            let k = if r.percent(70) { 2 } else { r.below(3) };
            rows[k].push(l.clone());
        }
    }
    if r.percent(5) {
        rows[2].push(r.below(2).to_string());
    }
    let [b, i, o] = rows.map(|v| v.join(", "));
    let result = join_pattern(
        if b.is_empty() { None } else { Some(b) },
        if i.is_empty() { None } else { Some(i) },
        o,
    );
    format!("{} => {result}", operands.join("; "))
}

/// A concatenation of `n` operands along one axis: each operand fills its own part (`p`, `q`,
/// `r`), the other axes are shared.
pub fn concat_spec(r: &mut Rng, n: usize) -> String {
    let parts = ["p", "q", "r"];
    let shared: Vec<&str> = LABELS[..r.below(3)].to_vec();
    let at = r.below(shared.len() + 1);
    let var = r.percent(40);
    let row = |middle: &str| {
        let mut axes: Vec<&str> = if var { vec!["..."] } else { vec![] };
        axes.extend(&shared[..at]);
        axes.push(middle);
        axes.extend(&shared[at..]);
        axes.join(", ")
    };
    let operands: Vec<String> = parts[..n].iter().map(|p| row(p)).collect();
    format!("{} => {}", operands.join("; "), row(&parts[..n].join("^")))
}

fn op(r: &mut Rng, i: usize) -> Node {
    match r.below(100) {
        0..=24 => {
            let n = if r.percent(80) {
                2
            } else if r.percent(70) {
                1
            } else {
                3
            };
            Node::Pointwise((0..n).map(|_| arg(r, i)).collect())
        }
        25..=39 => Node::Compose(arg(r, i), arg(r, i)),
        40..=44 => Node::ComposeAccumulate(arg(r, i), arg(r, i), arg(r, i)),
        45..=49 => {
            let n = if r.percent(80) { 2 } else { 3 };
            let args = (0..n).map(|_| arg(r, i)).collect();
            Node::Einsum(concat_spec(r, n), args)
        }
        50..=79 => {
            let n = if r.percent(45) {
                1
            } else if r.percent(90) {
                2
            } else {
                3
            };
            let args = (0..n).map(|_| arg(r, i)).collect();
            Node::Einsum(spec(r, n), args)
        }
        80..=89 => Node::Transpose(arg(r, i)),
        _ => Node::BatchSlice(arg(r, i), r.below(2)),
    }
}

/// Decodes one seed per node; parameters have inferred rows only if `infer_params`.
pub fn graph_of_seeds(seeds: &[u64], infer_params: bool) -> Graph {
    let mut nodes = Vec::with_capacity(seeds.len());
    for (i, &seed) in seeds.iter().enumerate() {
        let mut r = Rng::new(seed);
        let node = if i == 0 || r.percent(30) { leaf(&mut r, infer_params) } else { op(&mut r, i) };
        nodes.push(node);
    }
    Graph { nodes }
}

/// Graphs of one to `max` nodes.
pub fn graphs(max: usize) -> impl Strategy<Value = Graph> {
    prop::collection::vec(any::<u64>(), 1..=max).prop_map(|s| graph_of_seeds(&s, true))
}

/// Graphs of one to `max` nodes whose parameters have all their rows given.
pub fn graphs_without_inferred_params(max: usize) -> impl Strategy<Value = Graph> {
    prop::collection::vec(any::<u64>(), 1..=max).prop_map(|s| graph_of_seeds(&s, false))
}
