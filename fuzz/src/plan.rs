//! Random inference problems: what to declare and which steps to add, in which order.
//!
//! The generator is biased towards problems that get somewhere: small sizes (mostly 1–5, so
//! broadcasting and coincidences happen), arguments drawn mostly from recent shapes (so graphs
//! are deep rather than wide), and einsum specs over a pool of five labels (so operands share
//! labels). Rare choices keep the corners reachable: size 0 and huge sizes, labeled axes,
//! result shapes with given rows, steps out of topological order, a second step for a shape,
//! and einsum specs whose operand count does not match the arguments.

use arbitrary::{Arbitrary, Result, Unstructured};

/// How one row of a shape is declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RowPlan {
    /// Exactly these sizes.
    Given(Vec<usize>),
    /// Exactly these sizes, some labeled.
    Labeled(Vec<(usize, Option<String>)>),
    /// A fresh row variable.
    Inferred,
}

/// How a shape is declared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapePlan {
    /// The batch row.
    pub batch: RowPlan,
    /// The input row.
    pub input: RowPlan,
    /// The output row.
    pub output: RowPlan,
}

/// Extra shape information of a leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DataPlan {
    /// Only the rows.
    Rows,
    /// The leaf holds this many values.
    Values(usize),
    /// The leaf's axes in memory order.
    Exact(Vec<usize>),
}

/// One step: the shape it produces and its logic, with shapes named by their index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StepPlan {
    /// A leaf.
    Terminal {
        /// The leaf's shape.
        shape: u32,
        /// Whether it is a parameter.
        param: bool,
        /// Extra shape information.
        data: DataPlan,
        /// Whether the input row equals the output row.
        square: bool,
    },
    /// Pointwise over the arguments.
    Pointwise { shape: u32, args: Vec<u32> },
    /// `a * b`.
    Compose { shape: u32, a: u32, b: u32 },
    /// `a * b + c`.
    ComposeAccumulate { shape: u32, a: u32, b: u32, c: u32 },
    /// An einsum spec (as text) over the arguments.
    Einsum { shape: u32, spec: String, padded: bool, args: Vec<u32> },
    /// Swap input and output.
    Transpose { shape: u32, a: u32 },
    /// Remove the leftmost batch axis at a fixed position, or at a runtime position (`None`).
    BatchSlice { shape: u32, a: u32, index: Option<usize> },
    /// Same number of elements.
    Reshape { shape: u32, a: u32 },
}

/// A whole problem: the shapes, then the steps in the order they are added.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Declared in this order, before any step.
    pub shapes: Vec<ShapePlan>,
    /// Added in this order.
    pub steps: Vec<StepPlan>,
    /// Strict mode: guesses about parameters are errors.
    pub strict: bool,
}

const LABELS: [&str; 5] = ["a", "b", "c", "d", "e"];

fn size(u: &mut Unstructured) -> Result<usize> {
    Ok(match u.int_in_range(0u8..=63)? {
        0..=15 => 1,
        16..=27 => 2,
        28..=37 => 3,
        38..=45 => 4,
        46..=51 => 5,
        52..=55 => 6,
        56..=57 => 7,
        58 => 8,
        59 => 9,
        60 => 0,
        61 => 16,
        62 => 1 << 20,
        _ => usize::MAX / 3,
    })
}

fn sizes(u: &mut Unstructured, max_len: usize) -> Result<Vec<usize>> {
    let n = u.int_in_range(0..=max_len)?;
    (0..n).map(|_| size(u)).collect()
}

fn given_row(u: &mut Unstructured) -> Result<RowPlan> {
    if u.ratio(1u8, 12)? {
        let n = u.int_in_range(0..=3)?;
        let mut dims = Vec::with_capacity(n);
        for _ in 0..n {
            let label = match u.int_in_range(0u8..=3)? {
                0 => Some("rgb".to_string()),
                1 => Some("x".to_string()),
                _ => None,
            };
            dims.push((size(u)?, label));
        }
        return Ok(RowPlan::Labeled(dims));
    }
    Ok(RowPlan::Given(sizes(u, 3)?))
}

fn any_row(u: &mut Unstructured) -> Result<RowPlan> {
    if u.ratio(1u8, 3)? { Ok(RowPlan::Inferred) } else { given_row(u) }
}

fn leaf_shape(u: &mut Unstructured) -> Result<(ShapePlan, bool)> {
    Ok(match u.int_in_range(0u8..=9)? {
        // Data: every row given.
        0..=4 => {
            (ShapePlan { batch: given_row(u)?, input: given_row(u)?, output: given_row(u)? }, false)
        }
        // A parameter: no batch axes unless given, input and output mostly inferred.
        5..=8 => {
            let batch = if u.ratio(1u8, 6)? { given_row(u)? } else { RowPlan::Given(vec![]) };
            let mut infer = || -> Result<RowPlan> {
                if u.ratio(3u8, 5)? { Ok(RowPlan::Inferred) } else { given_row(u) }
            };
            let (input, output) = (infer()?, infer()?);
            (ShapePlan { batch, input, output }, true)
        }
        _ => (ShapePlan { batch: any_row(u)?, input: any_row(u)?, output: any_row(u)? }, {
            u.arbitrary()?
        }),
    })
}

fn data(u: &mut Unstructured, shape: &ShapePlan) -> Result<DataPlan> {
    let given = |r: &RowPlan| match r {
        RowPlan::Given(d) => Some(d.clone()),
        RowPlan::Labeled(d) => Some(d.iter().map(|(s, _)| *s).collect()),
        RowPlan::Inferred => None,
    };
    Ok(match u.int_in_range(0u8..=11)? {
        0 | 1 => {
            // Consistent with the given rows when all are given, otherwise a small count.
            let all: Option<Vec<usize>> = [&shape.batch, &shape.output, &shape.input]
                .into_iter()
                .map(given)
                .collect::<Option<Vec<_>>>()
                .map(|v| v.concat());
            match all {
                Some(d) if u.ratio(3u8, 4)? => DataPlan::Values(
                    d.iter().try_fold(1usize, |a, b| a.checked_mul(*b)).unwrap_or(0),
                ),
                _ => DataPlan::Values(u.int_in_range(0..=48)?),
            }
        }
        2 => DataPlan::Exact(sizes(u, 4)?),
        _ => DataPlan::Rows,
    })
}

/// Picks an existing shape, most often one of the last few.
fn pick(u: &mut Unstructured, n: usize) -> Result<u32> {
    let back = if u.ratio(3u8, 4)? { u.int_in_range(0..=2usize)? } else { u.choose_index(n)? };
    Ok((n - 1 - back.min(n - 1)) as u32)
}

fn label(u: &mut Unstructured) -> Result<&'static str> {
    Ok(LABELS[u.choose_index(LABELS.len())?])
}

fn axis(u: &mut Unstructured, multichar: bool) -> Result<String> {
    Ok(match u.int_in_range(0u8..=19)? {
        13 | 14 => match u.int_in_range(0u8..=15)? {
            15 => ["9223372036854775806", "4294967296"][u.choose_index(2)?].to_string(),
            i => (i % 4).to_string(),
        },
        15 => "_".to_string(),
        16 | 17 if multichar => {
            let (o, k) = (label(u)?, label(u)?);
            match u.int_in_range(0u8..=20)? {
                0..=3 => format!("{o}+{k}"),
                4..=7 => format!("2*{o}+{k}"),
                8..=10 => format!("{o}+2*{k}"),
                11..=13 => format!("3*{o}+2*{k}"),
                14..=19 => format!("{}*{o}", u.int_in_range(2..=3u8)?),
                _ => format!("4611686018427387904*{o}+{k}"),
            }
        }
        18 | 19 if multichar => {
            let n = u.int_in_range(2..=3)?;
            (0..n).map(|_| label(u)).collect::<Result<Vec<_>>>()?.join("^")
        }
        _ => label(u)?.to_string(),
    })
}

fn row_spec(u: &mut Unstructured, multichar: bool) -> Result<String> {
    let n = u.int_in_range(0..=3)?;
    let mut tokens: Vec<String> = (0..n).map(|_| axis(u, multichar)).collect::<Result<_>>()?;
    if u.ratio(2u8, 5)? {
        let var = match u.int_in_range(0u8..=4)? {
            0 => "..v..",
            1 => "..w..",
            _ => "...",
        };
        let at = u.int_in_range(0..=tokens.len())?;
        tokens.insert(at, var.to_string());
    }
    Ok(tokens.join(if multichar { ", " } else { " " }))
}

fn pattern(u: &mut Unstructured, multichar: bool) -> Result<String> {
    let batch = if u.ratio(1u8, 3)? { Some(row_spec(u, multichar)?) } else { None };
    let input = if u.ratio(1u8, 3)? { Some(row_spec(u, multichar)?) } else { None };
    let output = row_spec(u, multichar)?;
    let mut s = String::new();
    if let Some(b) = batch {
        s.push_str(&b);
        s.push('|');
    }
    if let Some(i) = input {
        s.push_str(&i);
        s.push_str("->");
    }
    s.push_str(&output);
    Ok(s)
}

/// An einsum spec with `n` operands.
fn spec(u: &mut Unstructured, n: usize) -> Result<(String, bool)> {
    let multichar: bool = u.arbitrary()?;
    let operands: Vec<String> = (0..n).map(|_| pattern(u, multichar)).collect::<Result<_>>()?;
    let result = pattern(u, multichar)?;
    let padded = multichar && u.ratio(1u8, 4)?;
    Ok((format!("{} => {result}", operands.join("; ")), padded))
}

fn step(u: &mut Unstructured, shape: u32, n: usize) -> Result<StepPlan> {
    let arg = |u: &mut Unstructured| pick(u, n);
    Ok(match u.int_in_range(0u8..=15)? {
        0..=3 => {
            let k = u.int_in_range(1..=3)?;
            StepPlan::Pointwise { shape, args: (0..k).map(|_| arg(u)).collect::<Result<_>>()? }
        }
        4 | 5 => StepPlan::Compose { shape, a: arg(u)?, b: arg(u)? },
        6 => StepPlan::ComposeAccumulate { shape, a: arg(u)?, b: arg(u)?, c: arg(u)? },
        7..=11 => {
            let k = u.int_in_range(1..=3)?;
            let (spec, padded) = spec(u, k)?;
            let k = if u.ratio(1u8, 20)? { u.int_in_range(0..=4)? } else { k };
            let args = (0..k).map(|_| arg(u)).collect::<Result<_>>()?;
            StepPlan::Einsum { shape, spec, padded, args }
        }
        12 => StepPlan::Transpose { shape, a: arg(u)? },
        13 => {
            let index = if u.ratio(1u8, 4)? { None } else { Some(u.int_in_range(0..=4)?) };
            StepPlan::BatchSlice { shape, a: arg(u)?, index }
        }
        14 => StepPlan::Reshape { shape, a: arg(u)? },
        _ => {
            let shape_plan = ShapePlan {
                batch: RowPlan::Inferred,
                input: RowPlan::Inferred,
                output: RowPlan::Inferred,
            };
            StepPlan::Terminal { shape, param: true, data: data(u, &shape_plan)?, square: false }
        }
    })
}

impl<'a> Arbitrary<'a> for Plan {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let mut shapes = Vec::new();
        let mut steps = Vec::new();
        for _ in 0..u.int_in_range(1..=4)? {
            let (sh, param) = leaf_shape(u)?;
            let data = data(u, &sh)?;
            let square = u.ratio(1u8, 16)?;
            steps.push(StepPlan::Terminal { shape: shapes.len() as u32, param, data, square });
            shapes.push(sh);
        }
        for _ in 0..u.int_in_range(0..=8)? {
            if u.is_empty() {
                break;
            }
            let result = if u.ratio(1u8, 10)? {
                ShapePlan { batch: any_row(u)?, input: any_row(u)?, output: any_row(u)? }
            } else {
                ShapePlan {
                    batch: RowPlan::Inferred,
                    input: RowPlan::Inferred,
                    output: RowPlan::Inferred,
                }
            };
            let n = shapes.len();
            shapes.push(result);
            steps.push(step(u, n as u32, n)?);
        }
        if u.ratio(1u8, 32)? && !steps.is_empty() {
            // A second step for an existing shape.
            let n = shapes.len();
            let shape = u.choose_index(n)? as u32;
            steps.push(step(u, shape, n)?);
        }
        if u.ratio(1u8, 6)? {
            // Out of topological order: a few adjacent swaps.
            for _ in 0..u.int_in_range(1..=3)? {
                if steps.len() > 1 {
                    let i = u.choose_index(steps.len() - 1)?;
                    steps.swap(i, i + 1);
                }
            }
        }
        let strict = u.ratio(1u8, 8)?;
        Ok(Plan { shapes, steps, strict })
    }
}
