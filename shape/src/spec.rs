//! The extended einsum notation.
//!
//! ```text
//! spec     := operand (';' operand){0,2} '=>' shape        (the result is on the right)
//! shape    := [row '|'] [row '->'] row                     batch | input -> output
//! row      := axis* [rowvar axis*]
//! rowvar   := '...'                                        this row kind's row variable
//!           | '..' name '..'                               a named row variable, shared by all rows
//! axis     := label | index | conv | concat | '_'
//! index    := digits                                       select (operand) / place (result)
//! conv     := [stride '*'] label ['+' [dilation '*'] label]   stride*out + dilation*kernel
//! concat   := label '^' label ('^' label)*                 sizes add up
//! ```
//!
//! **Modes.** A spec containing `,`, `*`, `+` or `^` is read in *multi-character* mode: axes are
//! separated by commas or whitespace and labels are identifiers (`rows, k; k, cols => rows,
//! cols`). Otherwise every letter is an axis, a run of digits is one fixed index and whitespace
//! only separates digit runs (`bij; bjk => bik`, `i j 0`).
//!
//! `_` is an anonymous axis (each `_` is a different one). A name may not be used both as an
//! axis label and as a row variable. Errors are [`SpecError`]s pointing at the character.

mod concat;

use std::fmt;

pub use concat::ConcatAxis;

/// The largest fixed index, stride or dilation a spec may use: indices become `i64` positions
/// and `index + 1` must still be a size.
pub const MAX_INDEX: usize = i64::MAX as usize - 1;

/// A spec that does not parse, with the position (in characters) of the problem.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct SpecError {
    /// The whole spec.
    pub spec: String,
    /// The 0-based character position of the problem.
    pub pos: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid einsum spec \"{}\" at character {}: {}\n  {}\n  {}^",
            self.spec,
            self.pos,
            self.message,
            self.spec,
            " ".repeat(self.pos)
        )
    }
}

/// One axis of a pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AxisSpec {
    /// A label: axes with the same label in one spec have the same size and are iterated together.
    Label(String),
    /// A fixed position: selects on an operand, places on the result.
    Fixed(usize),
    /// `stride*output + dilation*kernel`; `kernel: None` is pure strided iteration.
    Conv {
        /// The stride.
        stride: usize,
        /// The output label.
        output: String,
        /// The dilation (1 unless given).
        dilation: usize,
        /// The kernel label.
        kernel: Option<String>,
    },
    /// A concatenation of labelled parts.
    Concat(Vec<String>),
    /// An axis without a name.
    Anonymous,
}

/// A row variable of a pattern.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RowVarSpec {
    /// `...`: the row variable of this row kind, shared by the spec's rows of the same kind.
    Ellipsis,
    /// `..name..`: shared by every row of the spec that names it.
    Named(String),
}

/// The pattern of one row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct RowSpec {
    /// Axes before the row variable (empty without one).
    pub beg: Vec<AxisSpec>,
    /// The row variable, if the row can have more axes.
    pub var: Option<RowVarSpec>,
    /// Axes after the row variable (all axes without one).
    pub end: Vec<AxisSpec>,
}

impl RowSpec {
    /// All axes, leading then trailing.
    pub fn axes(&self) -> impl Iterator<Item = &AxisSpec> {
        self.beg.iter().chain(&self.end)
    }
}

/// The pattern of one shape: `batch|input->output`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct ShapePattern {
    /// Batch axes.
    pub batch: RowSpec,
    /// Input axes.
    pub input: RowSpec,
    /// Output axes.
    pub output: RowSpec,
}

impl ShapePattern {
    /// The rows in `batch, input, output` order.
    pub fn rows(&self) -> [&RowSpec; 3] {
        [&self.batch, &self.input, &self.output]
    }
}

/// A parsed einsum spec.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EinsumSpec {
    /// The text as given.
    pub text: String,
    /// One pattern per operand (1 to 3; more for concatenation).
    pub operands: Vec<ShapePattern>,
    /// The result's pattern.
    pub result: ShapePattern,
    /// Whether the spec was read in multi-character mode.
    pub multichar: bool,
    /// Whether convolution axes use dimension-preserving padding (Rust API only).
    pub padded: bool,
}

impl EinsumSpec {
    /// Parses a spec.
    ///
    /// ```
    /// use rocannl_shape::spec::{AxisSpec, EinsumSpec, RowVarSpec};
    /// let s = EinsumSpec::parse("...|i->h; ...|h->o => ...|i->o").unwrap();
    /// assert_eq!(s.operands.len(), 2);
    /// assert_eq!(s.result.batch.var, Some(RowVarSpec::Ellipsis));
    /// assert_eq!(s.result.output.end, vec![AxisSpec::Label("o".into())]);
    /// let conv = EinsumSpec::parse("2*o+k; k => o").unwrap();
    /// assert!(conv.multichar);
    /// let err = EinsumSpec::parse("ij").unwrap_err();
    /// assert!(err.message.contains("=>"));
    /// ```
    pub fn parse(text: &str) -> Result<EinsumSpec, SpecError> {
        Parser::new(text).spec()
    }

    /// Parses a spec whose convolution axes are padded (dimension preserving).
    pub fn parse_padded(text: &str) -> Result<EinsumSpec, SpecError> {
        let mut s = Self::parse(text)?;
        s.padded = true;
        Ok(s)
    }

    /// Every axis label of the spec (including convolution and concatenation parts), in order of
    /// first appearance.
    pub fn labels(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let mut add = |l: &String| {
            if !out.contains(l) {
                out.push(l.clone());
            }
        };
        for p in self.operands.iter().chain(std::iter::once(&self.result)) {
            for row in p.rows() {
                for a in row.axes() {
                    match a {
                        AxisSpec::Label(l) => add(l),
                        AxisSpec::Conv { output, kernel, .. } => {
                            add(output);
                            if let Some(k) = kernel {
                                add(k);
                            }
                        }
                        AxisSpec::Concat(parts) => parts.iter().for_each(&mut add),
                        AxisSpec::Fixed(_) | AxisSpec::Anonymous => {}
                    }
                }
            }
        }
        out
    }
}

struct Parser<'a> {
    text: &'a str,
    chars: Vec<char>,
    multichar: bool,
}

impl<'a> Parser<'a> {
    fn new(text: &'a str) -> Self {
        let multichar = text.contains([',', '*', '+', '^']);
        Parser { text, chars: text.chars().collect(), multichar }
    }

    fn err<T>(&self, pos: usize, message: impl Into<String>) -> Result<T, SpecError> {
        Err(SpecError { spec: self.text.to_string(), pos, message: message.into() })
    }

    /// Positions of a two-character token outside of nothing (specs have no nesting).
    fn find_all(&self, from: usize, to: usize, tok: &str) -> Vec<usize> {
        let t: Vec<char> = tok.chars().collect();
        (from..to.saturating_sub(t.len() - 1))
            .filter(|&i| self.chars[i..i + t.len()] == t[..])
            .collect()
    }

    fn spec(&self) -> Result<EinsumSpec, SpecError> {
        let n = self.chars.len();
        let arrows = self.find_all(0, n, "=>");
        let Some(&arrow) = arrows.first() else {
            return self.err(n, "expected '=>' between the operands and the result");
        };
        if let Some(&second) = arrows.get(1) {
            return self.err(second, "only one '=>' is allowed");
        }
        let mut operands = Vec::new();
        let mut start = 0;
        for (i, c) in self.chars[..arrow].iter().enumerate() {
            if *c == ';' {
                operands.push(self.shape(start, i)?);
                start = i + 1;
            }
        }
        operands.push(self.shape(start, arrow)?);
        if let Some(p) = self.chars[arrow + 2..].iter().position(|c| *c == ';') {
            return self.err(arrow + 2 + p, "';' separates operands, which come before '=>'");
        }
        let result = self.shape(arrow + 2, n)?;
        let spec = EinsumSpec {
            text: self.text.to_string(),
            operands,
            result,
            multichar: self.multichar,
            padded: false,
        };
        self.check_names(&spec)?;
        Ok(spec)
    }

    fn shape(&self, from: usize, to: usize) -> Result<ShapePattern, SpecError> {
        let bars: Vec<usize> = (from..to).filter(|&i| self.chars[i] == '|').collect();
        let arrows = self.find_all(from, to, "->");
        if bars.len() > 1 {
            return self.err(bars[1], "a shape has at most one '|' (batch|input->output)");
        }
        if arrows.len() > 1 {
            return self.err(arrows[1], "a shape has at most one '->' (batch|input->output)");
        }
        if let (Some(&b), Some(&a)) = (bars.first(), arrows.first())
            && a < b
        {
            return self.err(b, "the batch row ('|') comes before the input row ('->')");
        }
        let mut pos = from;
        let mut pattern = ShapePattern::default();
        if let Some(&b) = bars.first() {
            pattern.batch = self.row(pos, b)?;
            pos = b + 1;
        }
        if let Some(&a) = arrows.first() {
            pattern.input = self.row(pos, a)?;
            pos = a + 2;
        }
        pattern.output = self.row(pos, to)?;
        Ok(pattern)
    }

    fn row(&self, from: usize, to: usize) -> Result<RowSpec, SpecError> {
        let items =
            if self.multichar { self.items_multi(from, to)? } else { self.items_single(from, to)? };
        let mut row = RowSpec::default();
        let mut seen_var = None;
        for (item, pos) in items {
            match item {
                Item::Var(v) => {
                    if seen_var.is_some() {
                        return self.err(pos, "a row has at most one row variable");
                    }
                    seen_var = Some(pos);
                    row.var = Some(v);
                    row.beg = std::mem::take(&mut row.end);
                }
                Item::Axis(a) => row.end.push(a),
            }
        }
        Ok(row)
    }

    fn row_var_at(&self, i: usize, to: usize) -> Result<(RowVarSpec, usize), SpecError> {
        let rest: String = self.chars[i..to].iter().collect();
        if rest.starts_with("...") {
            return Ok((RowVarSpec::Ellipsis, i + 3));
        }
        if !rest.starts_with("..") {
            return self.err(i, "expected '...' or '..name..'");
        }
        let mut j = i + 2;
        while j < to && (self.chars[j].is_ascii_alphanumeric() || self.chars[j] == '_') {
            j += 1;
        }
        if j == i + 2 {
            return self.err(j, "expected a row variable name after '..'");
        }
        if j + 2 > to || self.chars[j] != '.' || self.chars[j + 1] != '.' {
            return self.err(j, "a named row variable ends with '..'");
        }
        let name: String = self.chars[i + 2..j].iter().collect();
        Ok((RowVarSpec::Named(name), j + 2))
    }

    fn items_single(&self, from: usize, to: usize) -> Result<Vec<(Item, usize)>, SpecError> {
        let mut items = Vec::new();
        let mut i = from;
        while i < to {
            let c = self.chars[i];
            if c.is_whitespace() {
                i += 1;
            } else if c == '.' {
                let (v, next) = self.row_var_at(i, to)?;
                items.push((Item::Var(v), i));
                i = next;
            } else if c.is_ascii_alphabetic() {
                items.push((Item::Axis(AxisSpec::Label(c.to_string())), i));
                i += 1;
            } else if c.is_ascii_digit() {
                let start = i;
                while i < to && self.chars[i].is_ascii_digit() {
                    i += 1;
                }
                let digits: String = self.chars[start..i].iter().collect();
                let n = self.number(&digits, start)?;
                items.push((Item::Axis(AxisSpec::Fixed(n)), start));
            } else if c == '_' {
                items.push((Item::Axis(AxisSpec::Anonymous), i));
                i += 1;
            } else {
                return self.err(i, format!("unexpected character '{c}'"));
            }
        }
        Ok(items)
    }

    fn items_multi(&self, from: usize, to: usize) -> Result<Vec<(Item, usize)>, SpecError> {
        let mut items = Vec::new();
        let mut i = from;
        let mut expect_item = false; // after a comma, an axis must follow
        while i < to {
            let c = self.chars[i];
            if c.is_whitespace() {
                i += 1;
                continue;
            }
            if c == ',' {
                if expect_item || items.is_empty() {
                    return self.err(i, "empty axis before ','");
                }
                expect_item = true;
                i += 1;
                continue;
            }
            let start = i;
            while i < to && !self.chars[i].is_whitespace() && self.chars[i] != ',' {
                i += 1;
            }
            let tok: String = self.chars[start..i].iter().collect();
            items.push((self.token(&tok, start)?, start));
            expect_item = false;
        }
        if expect_item {
            return self.err(to, "an axis must follow ','");
        }
        Ok(items)
    }

    /// A run of digits: a fixed index, stride or dilation of at most [`MAX_INDEX`].
    fn number(&self, digits: &str, pos: usize) -> Result<usize, SpecError> {
        match digits.parse::<usize>() {
            Ok(n) if n <= MAX_INDEX => Ok(n),
            _ => self.err(pos, format!("{digits} is too large (at most {MAX_INDEX})")),
        }
    }

    fn ident(&self, s: &str, pos: usize) -> Result<String, SpecError> {
        let ok = s.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if ok { Ok(s.to_string()) } else { self.err(pos, format!("'{s}' is not a label")) }
    }

    fn scaled(&self, s: &str, pos: usize) -> Result<(usize, String), SpecError> {
        match s.split_once('*') {
            Some((digits, name)) => {
                if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                    return self.err(pos, format!("'{digits}' is not a number"));
                }
                let k = self.number(digits, pos)?;
                if k == 0 {
                    return self.err(pos, "a stride or dilation must be at least 1");
                }
                Ok((k, self.ident(name, pos + digits.chars().count() + 1)?))
            }
            None => Ok((1, self.ident(s, pos)?)),
        }
    }

    fn token(&self, tok: &str, pos: usize) -> Result<Item, SpecError> {
        if tok.starts_with('.') {
            let (v, next) = self.row_var_at(pos, pos + tok.chars().count())?;
            if next != pos + tok.chars().count() {
                return self.err(next, "unexpected characters after a row variable");
            }
            return Ok(Item::Var(v));
        }
        if tok == "_" {
            return Ok(Item::Axis(AxisSpec::Anonymous));
        }
        if tok.chars().all(|c| c.is_ascii_digit()) {
            let n = self.number(tok, pos)?;
            return Ok(Item::Axis(AxisSpec::Fixed(n)));
        }
        if tok.contains('^') {
            let mut parts = Vec::new();
            let mut p = pos;
            for part in tok.split('^') {
                if part.is_empty() {
                    return self.err(p, "'^' must join two labels");
                }
                parts.push(self.ident(part, p)?);
                p += part.chars().count() + 1;
            }
            return Ok(Item::Axis(AxisSpec::Concat(parts)));
        }
        if tok.contains('+') || tok.contains('*') {
            let (out_part, kernel_part) = match tok.split_once('+') {
                Some((o, k)) => (o, Some(k)),
                None => (tok, None),
            };
            let (stride, output) = self.scaled(out_part, pos)?;
            return match kernel_part {
                Some(k) => {
                    let kpos = pos + out_part.chars().count() + 1;
                    if k.is_empty() {
                        return self.err(kpos, "expected a kernel label after '+'");
                    }
                    let (dilation, kernel) = self.scaled(k, kpos)?;
                    Ok(Item::Axis(AxisSpec::Conv {
                        stride,
                        output,
                        dilation,
                        kernel: Some(kernel),
                    }))
                }
                // A pure stride axis (any stride, 1 included).
                None => {
                    Ok(Item::Axis(AxisSpec::Conv { stride, output, dilation: 0, kernel: None }))
                }
            };
        }
        Ok(Item::Axis(AxisSpec::Label(self.ident(tok, pos)?)))
    }

    /// A name may not be both an axis label and a row variable.
    fn check_names(&self, spec: &EinsumSpec) -> Result<(), SpecError> {
        let labels = spec.labels();
        for p in spec.operands.iter().chain(std::iter::once(&spec.result)) {
            for row in p.rows() {
                if let Some(RowVarSpec::Named(n)) = &row.var
                    && labels.contains(n)
                {
                    let pos = self
                        .text
                        .find(&format!("..{n}.."))
                        .map_or(0, |b| self.text[..b].chars().count());
                    return self.err(
                        pos,
                        format!("'{n}' is used both as an axis label and as a row variable"),
                    );
                }
            }
        }
        Ok(())
    }
}

enum Item {
    Axis(AxisSpec),
    Var(RowVarSpec),
}

impl fmt::Display for AxisSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisSpec::Label(l) => write!(f, "{l}"),
            AxisSpec::Fixed(i) => write!(f, "{i}"),
            AxisSpec::Anonymous => write!(f, "_"),
            AxisSpec::Concat(parts) => write!(f, "{}", parts.join("^")),
            AxisSpec::Conv { stride, output, dilation, kernel } => {
                // A pure stride axis always shows its stride (`1*i` is not the label `i`).
                if *stride != 1 || kernel.is_none() {
                    write!(f, "{stride}*")?;
                }
                write!(f, "{output}")?;
                if let Some(k) = kernel {
                    write!(f, "+")?;
                    if *dilation != 1 {
                        write!(f, "{dilation}*")?;
                    }
                    write!(f, "{k}")?;
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for RowSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = self.beg.iter().map(|a| a.to_string()).collect();
        match &self.var {
            Some(RowVarSpec::Ellipsis) => parts.push("...".into()),
            Some(RowVarSpec::Named(n)) => parts.push(format!("..{n}..")),
            None => {}
        }
        parts.extend(self.end.iter().map(|a| a.to_string()));
        write!(f, "{}", parts.join(","))
    }
}

impl fmt::Display for ShapePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}|{}->{}", self.batch, self.input, self.output)
    }
}

impl fmt::Display for EinsumSpec {
    /// The canonical multi-character rendering (stable; used in snapshots).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ops: Vec<String> = self.operands.iter().map(|o| o.to_string()).collect();
        write!(f, "{} => {}", ops.join("; "), self.result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::expect;

    fn show(s: &str) -> String {
        match EinsumSpec::parse(s) {
            Ok(spec) => spec.to_string(),
            Err(e) => format!("error at {}: {}", e.pos, e.message),
        }
    }

    #[test]
    fn single_char_mode() {
        expect!["|->i,j; |->j,k => |->i,k"].assert_eq(&show("ij;jk=>ik"));
        expect!["b|i->o => o|b->i"].assert_eq(&show("b|i->o => o|b->i"));
        expect!["...,b|...,i->...,o => ...,i|...,o->...,b"]
            .assert_eq(&show("...b|...i->...o => ...i|...o->...b"));
        expect!["|->i,j,0 => |->i,j"].assert_eq(&show("i j 0 => i j"));
        expect!["|->i,5 => |->i"].assert_eq(&show("i5 => i"));
        expect!["..v..|i->o => |..v..->o,i"].assert_eq(&show("..v..|i->o => ..v..->oi"));
        expect!["...|j,...->i => ...|->i,j"].assert_eq(&show("...|j...->i => ...|ij"));
        expect!["|i,j->k => k|j->i"].assert_eq(&show(" i j -> k  =>  k | j -> i "));
    }

    #[test]
    fn multi_char_mode() {
        expect!["|->rows,k; |->k,cols => |->rows,cols"]
            .assert_eq(&show("rows, k; k, cols => rows, cols"));
        expect!["...|->2*oh+wh,2*ow+ww,..c..; |->wh,ww => ...|->oh,ow,..c.."]
            .assert_eq(&show("... | 2*oh+wh, 2*ow+ww, ..c..; wh, ww => ... | oh, ow, ..c.."));
        expect!["|->2*i => |->i"].assert_eq(&show("2*i => i"));
        // Any stride, 1 included: `1*i` reads every position, and does not broadcast.
        expect!["|->1*i => |->i"].assert_eq(&show("1*i => i"));
        expect!["|->a,j,k; |->b,j,k => |->a^b,j,k"]
            .assert_eq(&show("a, j, k; b, j, k => a^b, j, k"));
        expect!["|->o+2*k; |->k => |->o"].assert_eq(&show("o+2*k; k => o"));
    }

    #[test]
    fn concatenation_parts_are_filled_in_argument_order() {
        let fills = |s: &str| match EinsumSpec::parse(s).unwrap().concat_fills() {
            Ok(axes) => axes.iter().map(|a| format!("{:?}", a.fills)).collect::<Vec<_>>().join(" "),
            Err(e) => format!("error at {}: {}", e.pos, e.message),
        };
        expect!["[0, 1]"].assert_eq(&fills("a; b => a^b"));
        expect!["[1, 0]"].assert_eq(&fills("a; b => b^a"));
        expect!["[0, 1]"].assert_eq(&fills("a; a => a^a"));
        expect!["[0, 1, 2]"].assert_eq(&fills("a; b; a => a^b^a"));
        expect!["[0, 1] [0, 1]"].assert_eq(&fills("a, c; b, d => a^b, c^d"));
        expect!["error at 10: part 'b' of 'a^b' is filled by no argument: each part is filled by an argument whose pattern names its label, and no argument names 'b'"]
            .assert_eq(&fills("a; c => a^b"));
        expect!["error at 10: part 2 of 'a^a' is filled by no argument: each part is filled by an argument whose pattern names its label, and only one argument names 'a'"]
            .assert_eq(&fills("a; b => a^a"));
        expect!["error at 0: 'a^b' is a concatenated axis in an argument: only the result of a concatenation has one, whose parts the arguments fill"]
            .assert_eq(&fills("a^b; b => a^b"));
        expect!["error at 5: a concatenation of 2 arguments joins them along an axis 'a^b' of the result"]
            .assert_eq(&fills("a; b => a, b"));
        let no_concat = |s: &str| match EinsumSpec::parse(s).unwrap().check_no_concat() {
            Ok(()) => "ok".to_string(),
            Err(e) => format!("error at {}: {}", e.pos, e.message),
        };
        expect!["error at 0: 'a^b' is a concatenated axis: only `concat` fills the parts of one"]
            .assert_eq(&no_concat("a^b => a"));
        expect!["ok"].assert_eq(&no_concat("a, b => a"));
    }

    #[test]
    fn errors_point_at_the_problem() {
        expect!["error at 2: expected '=>' between the operands and the result"]
            .assert_eq(&show("ij"));
        expect!["error at 4: a shape has at most one '->' (batch|input->output)"]
            .assert_eq(&show("i->j->k => i"));
        expect!["error at 10: '^' must join two labels"].assert_eq(&show("a; b => a^"));
        expect!["error at 0: 'd' is used both as an axis label and as a row variable"]
            .assert_eq(&show("..d.., d; d, e => ..d.., e"));
        expect!["error at 2: unexpected character '#'"].assert_eq(&show("ij#=>i"));
        expect!["error at 3: a row has at most one row variable"].assert_eq(&show("......=>i"));
        expect!["error at 2: empty axis before ','"].assert_eq(&show("a,,b => a"));
        expect!["error at 7: only one '=>' is allowed"].assert_eq(&show("i => i => i"));
    }
}
