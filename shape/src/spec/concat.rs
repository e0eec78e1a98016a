//! Concatenations in the einsum notation: which part of a concatenated result axis (`a^b`)
//! each argument fills, and the check that other operations have no concatenated axis. Kept
//! apart from the grammar because it is a rule about a parsed spec, not about parsing.

use super::{AxisSpec, EinsumSpec, ShapePattern, SpecError};

/// One concatenated axis of a concatenation's result, and which of its parts each argument
/// fills ([`EinsumSpec::concat_fills`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConcatAxis {
    /// The labels of the parts, in order (a label may name several parts: `a^a`).
    pub parts: Vec<String>,
    /// For each argument, the index of the part it fills.
    pub fills: Vec<usize>,
}

impl EinsumSpec {
    /// For a concatenation: which part of each concatenated axis of the result each argument
    /// fills, the axes in the order they are written. The `k`-th argument whose pattern names a
    /// label fills the `k`-th part of that name (`a; a => a^a`: the first argument the first
    /// part, the second the second). Every part must be filled by one argument and every
    /// argument must fill one part of each concatenated axis; a concatenated axis in an
    /// argument's pattern cannot be filled (its parts cannot be told apart), and several
    /// arguments need a concatenated axis to be joined along.
    ///
    /// ```
    /// use rocannl_shape::spec::EinsumSpec;
    /// let s = EinsumSpec::parse("a; b; a => a^b^a").unwrap();
    /// assert_eq!(s.concat_fills().unwrap()[0].fills, vec![0, 1, 2]);
    /// let unfilled = EinsumSpec::parse("a; c => a^b").unwrap().concat_fills().unwrap_err();
    /// assert!(unfilled.message.contains("'b'"));
    /// ```
    pub fn concat_fills(&self) -> Result<Vec<ConcatAxis>, SpecError> {
        let arrow = self.text.find("=>").map_or(0, |b| self.text[..b].chars().count());
        if let Some(axis) = self.operands.iter().find_map(concat_axis) {
            return Err(self.error(
                self.position_of(&axis.to_string(), 0),
                format!(
                    "'{axis}' is a concatenated axis in an argument: only the result of a \
                     concatenation has one, whose parts the arguments fill"
                ),
            ));
        }
        let pattern_labels: Vec<Vec<&str>> = self.operands.iter().map(labels_of).collect();
        let mut out = Vec::new();
        for row in self.result.rows() {
            for axis in row.axes() {
                let AxisSpec::Concat(parts) = axis else { continue };
                let at = self.position_of(&axis.to_string(), arrow);
                let filling =
                    Filling { spec: self, axis, parts, at, pattern_labels: &pattern_labels };
                out.push(ConcatAxis { parts: parts.clone(), fills: filling.fills()? });
            }
        }
        if out.is_empty() && self.operands.len() > 1 {
            return Err(self.error(
                arrow,
                format!(
                    "a concatenation of {} arguments joins them along an axis 'a^b' of the result",
                    self.operands.len()
                ),
            ));
        }
        Ok(out)
    }

    /// For an operation other than a concatenation: a concatenated axis anywhere is an error,
    /// since only a concatenation writes (and reads) its parts separately.
    pub fn check_no_concat(&self) -> Result<(), SpecError> {
        let patterns = self.operands.iter().chain(std::iter::once(&self.result));
        match patterns.into_iter().find_map(concat_axis) {
            Some(axis) => Err(SpecError {
                spec: self.text.clone(),
                pos: self.position_of(&axis.to_string(), 0),
                message: format!(
                    "'{axis}' is a concatenated axis: only `concat` fills the parts of one"
                ),
            }),
            None => Ok(()),
        }
    }

    /// An error at character `pos` of the spec.
    fn error(&self, pos: usize, message: String) -> SpecError {
        SpecError { spec: self.text.clone(), pos, message }
    }

    /// The character position of `token` in the text, searching from character `from`.
    fn position_of(&self, token: &str, from: usize) -> usize {
        let start: usize = self.text.chars().take(from).map(char::len_utf8).sum();
        self.text[start..]
            .find(token)
            .map_or(from, |b| from + self.text[start..start + b].chars().count())
    }
}

/// The first concatenated axis of a pattern.
fn concat_axis(p: &ShapePattern) -> Option<&AxisSpec> {
    p.rows().into_iter().flat_map(|r| r.axes()).find(|a| matches!(a, AxisSpec::Concat(_)))
}

/// The labels a pattern names (of plain, convolution and concatenated axes).
fn labels_of(p: &ShapePattern) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for a in p.rows().into_iter().flat_map(|r| r.axes()) {
        match a {
            AxisSpec::Label(l) => out.push(l),
            AxisSpec::Conv { output, kernel, .. } => {
                out.push(output);
                out.extend(kernel.as_deref());
            }
            AxisSpec::Concat(parts) => out.extend(parts.iter().map(String::as_str)),
            AxisSpec::Fixed(_) | AxisSpec::Anonymous => {}
        }
    }
    out
}

/// One concatenated axis of the result being matched with the arguments that fill its parts.
struct Filling<'a> {
    spec: &'a EinsumSpec,
    /// The axis, its parts' labels and its character position.
    axis: &'a AxisSpec,
    parts: &'a [String],
    at: usize,
    /// The labels each argument's pattern names.
    pattern_labels: &'a [Vec<&'a str>],
}

impl Filling<'_> {
    /// For each argument, the part it fills: the `k`-th argument naming a label fills the
    /// `k`-th part of that name; every argument fills exactly one part.
    fn fills(&self) -> Result<Vec<usize>, SpecError> {
        let (axis, at) = (self.axis, self.at);
        let mut fills: Vec<Option<usize>> = vec![None; self.spec.operands.len()];
        let mut done: Vec<&str> = Vec::new();
        for label in self.parts {
            if done.contains(&label.as_str()) {
                continue;
            }
            done.push(label);
            self.fill_label(label, &mut fills)?;
        }
        fills
            .into_iter()
            .enumerate()
            .map(|(i, f)| {
                f.ok_or_else(|| {
                    self.spec.error(at, format!("argument {} fills no part of '{axis}'", i + 1))
                })
            })
            .collect()
    }

    /// Assigns the parts named `label` to the arguments naming it, in order; as many of each.
    fn fill_label(&self, label: &str, fills: &mut [Option<usize>]) -> Result<(), SpecError> {
        let (axis, parts, at) = (self.axis, self.parts, self.at);
        let named: Vec<usize> = (0..parts.len()).filter(|&i| parts[i] == label).collect();
        let by: Vec<usize> = (0..self.spec.operands.len())
            .filter(|&i| self.pattern_labels[i].contains(&label))
            .collect();
        // The position of part `i` in the text.
        let part_at =
            |i: usize| at + parts[..i].iter().map(|p| p.chars().count() + 1).sum::<usize>();
        if by.len() < named.len() {
            let which = if named.len() > 1 {
                format!("part {} of '{axis}'", named[by.len()] + 1)
            } else {
                format!("part '{label}' of '{axis}'")
            };
            return Err(self.spec.error(
                part_at(named[by.len()]),
                format!(
                    "{which} is filled by no argument: each part is filled by an \
                     argument whose pattern names its label, and {}",
                    match by.len() {
                        0 => format!("no argument names '{label}'"),
                        1 => format!("only one argument names '{label}'"),
                        n => format!("only {n} arguments name '{label}'"),
                    }
                ),
            ));
        }
        if by.len() > named.len() {
            return Err(self.spec.error(
                part_at(named[0]),
                format!(
                    "'{label}' is named by {} arguments but by only {} part(s) of \
                     '{axis}': each argument fills one part",
                    by.len(),
                    named.len()
                ),
            ));
        }
        for (arg, part) in by.into_iter().zip(named) {
            if let Some(other) = fills[arg] {
                return Err(self.spec.error(
                    at,
                    format!(
                        "argument {} names two parts of '{axis}' ('{}' and '{label}'); \
                         an argument fills one part",
                        arg + 1,
                        parts[other]
                    ),
                ));
            }
            fills[arg] = Some(part);
        }
        Ok(())
    }
}
