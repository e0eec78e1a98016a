//! Loop variables, locals and affine indices: the arithmetic that bounds analysis,
//! substitution and tiling rely on, kept apart from the statements that use it.

use std::fmt;

use crate::indexing::Symbol;

/// A loop variable, printed `v{n}`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Var(pub u32);

impl fmt::Display for Var {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A scalar local variable, printed `t{n}`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LocalId(pub u32);

impl fmt::Display for LocalId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

/// What an index term multiplies: a loop variable or a runtime symbol.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum IdxVar {
    /// A loop variable.
    Loop(Var),
    /// A symbol bound when the routine runs.
    Sym(Symbol),
}

impl fmt::Display for IdxVar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IdxVar::Loop(v) => write!(f, "{v}"),
            IdxVar::Sym(s) => write!(f, "{s}"),
        }
    }
}

/// An affine index `offset + Σ coeff·var`. Terms have distinct variables and non-zero
/// coefficients (kept so by [`Index::new`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Index {
    /// The terms.
    pub terms: Vec<(i64, IdxVar)>,
    /// The constant part.
    pub offset: i64,
}

impl Index {
    /// Builds a normalized index (repeated variables merged, zero terms dropped).
    ///
    /// ```
    /// use rocannl_arrayjit::low_level::{IdxVar, Index, Var};
    /// let v = IdxVar::Loop(Var(0));
    /// let i = Index::new(vec![(2, v), (1, v), (0, IdxVar::Loop(Var(1)))], -1);
    /// assert_eq!(i.to_string(), "3*v0 - 1");
    /// ```
    pub fn new(terms: Vec<(i64, IdxVar)>, offset: i64) -> Index {
        let mut merged: Vec<(i64, IdxVar)> = Vec::with_capacity(terms.len());
        for (c, v) in terms {
            match merged.iter_mut().find(|(_, v2)| *v2 == v) {
                Some((c2, _)) => *c2 += c,
                None => merged.push((c, v)),
            }
        }
        merged.retain(|(c, _)| *c != 0);
        Index { terms: merged, offset }
    }

    /// A constant index.
    pub fn fixed(i: i64) -> Index {
        Index { terms: vec![], offset: i }
    }

    /// The index `v`.
    pub fn var(v: Var) -> Index {
        Index { terms: vec![(1, IdxVar::Loop(v))], offset: 0 }
    }

    /// The single loop variable if this index is exactly `v`.
    pub fn as_var(&self) -> Option<Var> {
        match self.terms.as_slice() {
            [(1, IdxVar::Loop(v))] if self.offset == 0 => Some(*v),
            _ => None,
        }
    }

    /// Whether the index mentions `v`.
    pub fn uses(&self, v: Var) -> bool {
        self.terms.iter().any(|(_, x)| *x == IdxVar::Loop(v))
    }

    /// The coefficient of `v` (0 when absent).
    pub fn coeff(&self, v: Var) -> i64 {
        self.terms.iter().find(|(_, x)| *x == IdxVar::Loop(v)).map_or(0, |(c, _)| *c)
    }

    /// Replaces loop variables by indices.
    pub fn subst(&self, f: &impl Fn(Var) -> Option<Index>) -> Index {
        let mut terms = Vec::new();
        let mut offset = self.offset;
        for &(c, x) in &self.terms {
            match x {
                IdxVar::Loop(v) => match f(v) {
                    Some(idx) => {
                        offset += c * idx.offset;
                        terms.extend(idx.terms.iter().map(|&(c2, x2)| (c * c2, x2)));
                    }
                    None => terms.push((c, x)),
                },
                IdxVar::Sym(_) => terms.push((c, x)),
            }
        }
        Index::new(terms, offset)
    }

    /// The range `[min, max]` taken over loop variables in `0..extent` (`extent(v)`), or `None`
    /// when the index involves runtime symbols or an unknown variable.
    pub fn range(&self, extent: &impl Fn(Var) -> Option<usize>) -> Option<(i64, i64)> {
        let (mut lo, mut hi) = (self.offset, self.offset);
        for &(c, x) in &self.terms {
            let IdxVar::Loop(v) = x else { return None };
            let top = extent(v)? as i64 - 1;
            if top < 0 {
                return None;
            }
            if c > 0 {
                hi += c * top;
            } else {
                lo += c * top;
            }
        }
        Some((lo, hi))
    }
}

impl fmt::Display for Index {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.terms.is_empty() {
            return write!(f, "{}", self.offset);
        }
        for (n, (c, x)) in self.terms.iter().enumerate() {
            match (n, *c) {
                (0, 1) => write!(f, "{x}")?,
                (0, -1) => write!(f, "-{x}")?,
                (0, c) => write!(f, "{c}*{x}")?,
                (_, 1) => write!(f, " + {x}")?,
                (_, -1) => write!(f, " - {x}")?,
                (_, c) if c < 0 => write!(f, " - {}*{x}", -c)?,
                (_, c) => write!(f, " + {c}*{x}")?,
            }
        }
        match self.offset {
            0 => Ok(()),
            o if o > 0 => write!(f, " + {o}"),
            o => write!(f, " - {}", -o),
        }
    }
}
