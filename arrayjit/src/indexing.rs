//! Indexing: how an assignment walks its product space and which cell of each tensor it touches.
//!
//! Shape inference (crate `rocannl-shape`) ends in [`Projections`]: for one assignment
//! `lhs (accum)= op(rhs1, rhs2, ...)` it lists the product space to iterate over (one
//! [`Symbol`] per iterated axis class) and, for every axis of every tensor involved, an
//! [`AxisIndex`] saying how that axis is addressed from the iterators. Lowering turns a
//! projection into a loop nest; nothing else in the compiler needs to know about shapes.
//!
//! Symbols are plain `u32` newtypes handed out by a [`SymbolGen`] owned by whoever builds the
//! graph, so no two symbols of one compilation collide. A symbol that is one of a projection's
//! `product_iterators` is a loop variable of that assignment; any other symbol appearing in an
//! index is a *runtime symbol* whose value is bound when a routine is run (e.g. the position of a
//! batch slice inside a training loop).

use std::fmt;

/// An index variable: a loop iterator of one assignment or a runtime-bound symbol.
///
/// ```
/// use rocannl_arrayjit::indexing::{Symbol, SymbolGen};
/// let mut symbols = SymbolGen::default();
/// let i: Symbol = symbols.fresh();
/// let j = symbols.fresh();
/// assert_ne!(i, j);
/// assert_eq!(i.to_string(), "i0");
/// ```
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Symbol(pub u32);

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "i{}", self.0)
    }
}

/// Hands out fresh [`Symbol`]s; one generator per graph keeps them unique without global state.
#[derive(Clone, Debug, Default)]
pub struct SymbolGen {
    next: u32,
}

impl SymbolGen {
    /// A generator whose first symbol is `i{start}`.
    pub fn starting_at(start: u32) -> Self {
        SymbolGen { next: start }
    }

    /// A symbol never returned before by this generator.
    pub fn fresh(&mut self) -> Symbol {
        let s = Symbol(self.next);
        self.next += 1;
        s
    }
}

/// How one axis of a tensor is addressed inside an assignment.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum AxisIndex {
    /// Always the same position: a selected or placed fixed index, or position 0 of an axis of
    /// size 1 that is broadcast.
    Fixed(i64),
    /// The value of one symbol (usually a product-space iterator).
    Iterator(Symbol),
    /// `offset + Σ coeff·symbol`: strided iteration, convolutions (`stride*o + dilation*k`,
    /// minus the left padding of a padded convolution) and offsets of concatenated parts.
    /// An affine index can leave `0..dim` only for padded convolutions; lowering guards such
    /// accesses and skips the iteration (the contribution is the neutral element).
    Affine {
        /// The terms, each `(coefficient, symbol)`; no symbol occurs twice and no coefficient is 0.
        terms: Vec<(i64, Symbol)>,
        /// The constant part.
        offset: i64,
    },
}

impl AxisIndex {
    /// Builds `offset + Σ terms`, merging repeated symbols, dropping zero coefficients and
    /// returning the simplest equivalent form.
    ///
    /// ```
    /// use rocannl_arrayjit::indexing::{AxisIndex, Symbol};
    /// let (o, k) = (Symbol(0), Symbol(1));
    /// assert_eq!(AxisIndex::affine(vec![(1, o)], 0), AxisIndex::Iterator(o));
    /// assert_eq!(AxisIndex::affine(vec![(2, o), (0, k)], 3).to_string(), "2*i0 + 3");
    /// assert_eq!(AxisIndex::affine(vec![], 4), AxisIndex::Fixed(4));
    /// ```
    pub fn affine(terms: Vec<(i64, Symbol)>, offset: i64) -> AxisIndex {
        let mut merged: Vec<(i64, Symbol)> = Vec::with_capacity(terms.len());
        for (c, s) in terms {
            match merged.iter_mut().find(|(_, s2)| *s2 == s) {
                Some((c2, _)) => *c2 += c,
                None => merged.push((c, s)),
            }
        }
        merged.retain(|(c, _)| *c != 0);
        match merged.as_slice() {
            [] => AxisIndex::Fixed(offset),
            [(1, s)] if offset == 0 => AxisIndex::Iterator(*s),
            _ => AxisIndex::Affine { terms: merged, offset },
        }
    }

    /// The symbols this index reads.
    pub fn symbols(&self) -> Vec<Symbol> {
        match self {
            AxisIndex::Fixed(_) => vec![],
            AxisIndex::Iterator(s) => vec![*s],
            AxisIndex::Affine { terms, .. } => terms.iter().map(|(_, s)| *s).collect(),
        }
    }

    /// The index as `(terms, offset)`, whatever its form.
    pub fn as_affine(&self) -> (Vec<(i64, Symbol)>, i64) {
        match self {
            AxisIndex::Fixed(i) => (vec![], *i),
            AxisIndex::Iterator(s) => (vec![(1, *s)], 0),
            AxisIndex::Affine { terms, offset } => (terms.clone(), *offset),
        }
    }

    /// Substitutes symbols by other indices (e.g. renaming iterators to loop variables).
    pub fn subst(&self, f: &mut impl FnMut(Symbol) -> AxisIndex) -> AxisIndex {
        let (terms, offset) = self.as_affine();
        let mut out_terms = Vec::new();
        let mut out_offset = offset;
        for (c, s) in terms {
            let (t2, o2) = f(s).as_affine();
            out_offset += c * o2;
            out_terms.extend(t2.into_iter().map(|(c2, s2)| (c * c2, s2)));
        }
        AxisIndex::affine(out_terms, out_offset)
    }
}

impl fmt::Display for AxisIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AxisIndex::Fixed(i) => write!(f, "{i}"),
            AxisIndex::Iterator(s) => write!(f, "{s}"),
            AxisIndex::Affine { terms, offset } => {
                for (n, (c, s)) in terms.iter().enumerate() {
                    let sep = if n == 0 { "" } else { " + " };
                    if *c == 1 {
                        write!(f, "{sep}{s}")?;
                    } else {
                        write!(f, "{sep}{c}*{s}")?;
                    }
                }
                match offset {
                    0 => Ok(()),
                    o if *o > 0 => write!(f, " + {o}"),
                    o => write!(f, " - {}", -o),
                }
            }
        }
    }
}

/// The indexing of one assignment `lhs (accum)= op(rhs...)`, as derived by projection inference.
///
/// Dimensions are listed in memory order: batch axes, then output axes, then input axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Projections {
    /// The size of each iterated axis class.
    pub product_space: Vec<usize>,
    /// One symbol per entry of `product_space`: the loop variables of this assignment.
    pub product_iterators: Vec<Symbol>,
    /// The dimensions of the assigned tensor.
    pub lhs_dims: Vec<usize>,
    /// The dimensions of each argument tensor.
    pub rhs_dims: Vec<Vec<usize>>,
    /// How each axis of the assigned tensor is indexed.
    pub project_lhs: Vec<AxisIndex>,
    /// How each axis of each argument is indexed.
    pub project_rhs: Vec<Vec<AxisIndex>>,
    /// Where the projection came from (the operation and its spec), for dumps and errors.
    pub debug_info: String,
    /// Product iterators with a size known only when the routine runs, each with the runtime
    /// symbol holding that size: `(iterator, size)`. The iterator's entry in `product_space` is
    /// the size's maximum; its loop visits `0..size` only (a dynamic batch).
    pub dynamic: Vec<(Symbol, Symbol)>,
}

impl Projections {
    /// The identity projection over `dims` for `n_rhs` arguments of the same shape, the
    /// projection of a pointwise operation without broadcasting.
    ///
    /// ```
    /// use rocannl_arrayjit::indexing::{Projections, SymbolGen};
    /// let p = Projections::identity(&[2, 3], 1, &mut SymbolGen::default());
    /// assert_eq!(p.to_string(), "[i0:2, i1:3] lhs[i0, i1] <- rhs0[i0, i1]");
    /// ```
    pub fn identity(dims: &[usize], n_rhs: usize, symbols: &mut SymbolGen) -> Projections {
        let iters: Vec<Symbol> = dims.iter().map(|_| symbols.fresh()).collect();
        let idx: Vec<AxisIndex> = iters.iter().map(|s| AxisIndex::Iterator(*s)).collect();
        Projections {
            product_space: dims.to_vec(),
            product_iterators: iters,
            lhs_dims: dims.to_vec(),
            rhs_dims: vec![dims.to_vec(); n_rhs],
            project_lhs: idx.clone(),
            project_rhs: vec![idx; n_rhs],
            debug_info: "identity".to_string(),
            dynamic: vec![],
        }
    }

    /// Whether every cell of the assigned tensor is written by some point of the product space.
    /// When it is not, the assigned tensor must be initialized first (to the neutral element of
    /// the accumulation, or zero for a plain assignment).
    pub fn is_surjective(&self) -> bool {
        // Every lhs axis of size > 1 must be indexed by a distinct product iterator of the same
        // size (an affine lhs index is treated conservatively as not surjective).
        let mut seen = Vec::new();
        for (idx, &d) in self.project_lhs.iter().zip(&self.lhs_dims) {
            match idx {
                AxisIndex::Fixed(_) if d <= 1 => {}
                AxisIndex::Iterator(s) => {
                    let Some(pos) = self.product_iterators.iter().position(|p| p == s) else {
                        return false;
                    };
                    if self.product_space[pos] != d || seen.contains(s) {
                        return false;
                    }
                    seen.push(*s);
                }
                _ => return false,
            }
        }
        true
    }

    /// Whether no cell of the assigned tensor is written twice, i.e. every product iterator
    /// of size > 1 appears in the lhs index. Then the assignment can overwrite instead of
    /// accumulating.
    pub fn is_injective(&self) -> bool {
        self.product_iterators
            .iter()
            .zip(&self.product_space)
            .all(|(s, &d)| d <= 1 || self.project_lhs.iter().any(|idx| idx.symbols().contains(s)))
    }
}

fn write_indices(f: &mut fmt::Formatter<'_>, idcs: &[AxisIndex]) -> fmt::Result {
    write!(f, "[")?;
    for (n, idx) in idcs.iter().enumerate() {
        if n > 0 {
            write!(f, ", ")?;
        }
        write!(f, "{idx}")?;
    }
    write!(f, "]")
}

impl fmt::Display for Projections {
    /// A stable one-line rendering used in IR dumps and snapshots.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (n, (s, d)) in self.product_iterators.iter().zip(&self.product_space).enumerate() {
            if n > 0 {
                write!(f, ", ")?;
            }
            match self.dynamic.iter().find(|(it, _)| it == s) {
                Some((_, size)) => write!(f, "{s}:{size}<={d}")?,
                None => write!(f, "{s}:{d}")?,
            }
        }
        write!(f, "] lhs")?;
        write_indices(f, &self.project_lhs)?;
        if !self.project_rhs.is_empty() {
            write!(f, " <-")?;
        }
        for (n, rhs) in self.project_rhs.iter().enumerate() {
            if n > 0 {
                write!(f, ",")?;
            }
            write!(f, " rhs{n}")?;
            write_indices(f, rhs)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul_projection() -> Projections {
        // c[i, j] += a[i, k] * b[k, j]
        let (i, j, k) = (Symbol(0), Symbol(1), Symbol(2));
        Projections {
            product_space: vec![2, 4, 3],
            product_iterators: vec![i, j, k],
            lhs_dims: vec![2, 4],
            rhs_dims: vec![vec![2, 3], vec![3, 4]],
            project_lhs: vec![AxisIndex::Iterator(i), AxisIndex::Iterator(j)],
            project_rhs: vec![
                vec![AxisIndex::Iterator(i), AxisIndex::Iterator(k)],
                vec![AxisIndex::Iterator(k), AxisIndex::Iterator(j)],
            ],
            debug_info: "matmul".into(),
            dynamic: vec![],
        }
    }

    #[test]
    fn matmul_is_surjective_but_not_injective() {
        let p = matmul_projection();
        assert!(p.is_surjective());
        assert!(!p.is_injective());
        expect_test::expect!["[i0:2, i1:4, i2:3] lhs[i0, i1] <- rhs0[i0, i2], rhs1[i2, i1]"]
            .assert_eq(&p.to_string());
    }

    #[test]
    fn diagonal_placement_is_not_surjective() {
        // 'i => ii': lhs[i, i] = rhs[i]
        let i = Symbol(0);
        let p = Projections {
            product_space: vec![3],
            product_iterators: vec![i],
            lhs_dims: vec![3, 3],
            rhs_dims: vec![vec![3]],
            project_lhs: vec![AxisIndex::Iterator(i), AxisIndex::Iterator(i)],
            project_rhs: vec![vec![AxisIndex::Iterator(i)]],
            debug_info: "diag".into(),
            dynamic: vec![],
        };
        assert!(!p.is_surjective());
        assert!(p.is_injective());
    }

    #[test]
    fn affine_simplifies_and_prints() {
        let (o, k) = (Symbol(3), Symbol(4));
        let a = AxisIndex::affine(vec![(2, o), (1, k), (1, k)], -1);
        assert_eq!(a.to_string(), "2*i3 + 2*i4 - 1");
        let renamed = a.subst(&mut |s| AxisIndex::Iterator(Symbol(s.0 + 10)));
        assert_eq!(renamed.to_string(), "2*i13 + 2*i14 - 1");
        let fixed = a.subst(&mut |_| AxisIndex::Fixed(1));
        assert_eq!(fixed, AxisIndex::Fixed(3));
    }
}
