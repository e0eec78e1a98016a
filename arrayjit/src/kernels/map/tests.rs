use super::*;

/// The descriptor of a call, as `crate::low_level::Map::descriptor` lays it out.
fn words(
    cells: &[(i64, i64, &[i64])],
    points: &[(i64, &[i64])],
    reduce: Option<BinOp>,
    accumulate: bool,
    code: &[MapCode],
) -> Vec<i64> {
    let inputs = cells.first().map_or_else(|| points[0].1.len(), |c| c.2.len());
    let r = reduce.map_or(-1, |r| BinOp::ALL.iter().position(|o| *o == r).unwrap() as i64);
    let mut w = vec![
        cells.len() as i64,
        points.len() as i64,
        inputs as i64,
        r,
        i64::from(accumulate),
        code.len() as i64,
    ];
    for (n, out, steps) in cells {
        w.extend([*n, NO_COUNT, 1, *out]);
        w.extend(*steps);
    }
    for (n, steps) in points {
        w.extend([*n, NO_COUNT, 1]);
        w.extend(*steps);
    }
    for c in code {
        w.extend(c.words());
    }
    assert_eq!(w.len(), desc_len(&w[..MAP_HEADER]));
    w
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 250.0 - 2.0
        })
        .collect()
}

#[test]
fn instructions_round_trip_through_their_words() {
    let code = [
        MapCode::Input(3),
        MapCode::Const(-0.1),
        MapCode::Un(UnOp::Tanh),
        MapCode::Bin(BinOp::Pow),
        MapCode::Tern(TernOp::Where),
    ];
    for c in code {
        let [t, a] = c.words();
        assert_eq!(MapCode::from_words(t, a), Some(c));
    }
    assert_eq!(MapCode::from_words(0, MAX_INPUTS as i64), None);
    assert_eq!(MapCode::from_words(7, 0), None);
    // A program that needs an operand it was not given does not decode.
    let bad =
        words(&[(4, 1, &[1])], &[], None, false, &[MapCode::Input(0), MapCode::Bin(BinOp::Add)]);
    assert_eq!(MapDesc::decode(&bad), None);
}

/// `out[i, j] := where(a[i, j] > b[j], exp(a[i, j] − b[j]), fma(a, 0.5, b))` over a 3 × 200
/// box (the row broadcast by a step of 0; a chunk and a remainder along `j`), against the
/// op table cell by cell.
#[test]
fn a_pointwise_map_computes_each_cell_as_the_op_table_does() {
    let (m, n) = (3usize, 200usize);
    let a = data(m * n, 1);
    let b = data(n, 2);
    let code = [
        MapCode::Input(0),
        MapCode::Input(1),
        MapCode::Bin(BinOp::Gt),
        MapCode::Input(0),
        MapCode::Input(1),
        MapCode::Bin(BinOp::Sub),
        MapCode::Un(UnOp::Exp),
        MapCode::Input(0),
        MapCode::Const(0.5),
        MapCode::Input(1),
        MapCode::Tern(TernOp::Fma),
        MapCode::Tern(TernOp::Where),
    ];
    let w = words(
        &[(m as i64, n as i64, &[n as i64, 0]), (n as i64, 1, &[1, 1])],
        &[],
        None,
        false,
        &code,
    );
    let d = MapDesc::decode(&w).unwrap();
    let mut out = vec![0f32; m * n];
    let ptrs = [out.as_mut_ptr(), a.as_ptr() as *mut f32, b.as_ptr() as *mut f32];
    // SAFETY: the descriptor addresses `m × n` cells of `out` and `a`, `n` of `b`.
    unsafe { map(&ptrs, &d) };
    for i in 0..m {
        for j in 0..n {
            let (x, y) = (a[i * n + j], b[j]);
            let want = TernOp::Where.apply_f32(
                BinOp::Gt.apply_f32(x, y),
                UnOp::Exp.apply_f32(x - y),
                TernOp::Fma.apply_f32(x, 0.5, y),
            );
            assert_eq!(out[i * n + j].to_bits(), want.to_bits(), "cell {i}, {j}");
        }
    }
}

/// Sums of rows (no long cell axis: points in runs, folded in order) and of columns
/// (cells together), onto old values, give the sequential sums' bits.
#[test]
fn reductions_fold_each_cells_points_in_order() {
    let (m, n) = (5usize, 300usize);
    let a = data(m * n, 3);
    let old = data(n.max(m), 4);
    let sum = |xs: &mut dyn Iterator<Item = f32>, t: f32| xs.fold(t, |t, x| t + x);
    // Rows: out[i] += Σ_j a[i, j].
    let w = words(
        &[(m as i64, 1, &[n as i64])],
        &[(n as i64, &[1])],
        Some(BinOp::Add),
        true,
        &[MapCode::Input(0)],
    );
    let mut out = old[..m].to_vec();
    // SAFETY: `m` cells of `out`, `m × n` of `a`.
    unsafe { map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap()) };
    for i in 0..m {
        let want = sum(&mut a[i * n..(i + 1) * n].iter().copied(), old[i]);
        assert_eq!(out[i].to_bits(), want.to_bits(), "row {i}");
    }
    // Columns: out[j] := max_i a[i, j].
    let w = words(
        &[(n as i64, 1, &[1])],
        &[(m as i64, &[n as i64])],
        Some(BinOp::Max),
        false,
        &[MapCode::Input(0)],
    );
    let mut out = vec![0f32; n];
    // SAFETY: `n` cells of `out`, `m × n` of `a`.
    unsafe { map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap()) };
    for j in 0..n {
        let want = (0..m).fold(f32::NEG_INFINITY, |t, i| BinOp::Max.apply_f32(t, a[i * n + j]));
        assert_eq!(out[j].to_bits(), want.to_bits(), "column {j}");
    }
}

/// Rows read 16 points at a time into a transposed block (cells' points contiguous):
/// 83 rows (blocks of 64, 16 and single cells) of 53 points (three runs of 16 and 5 more),
/// every operator, each row's fold in order.
#[test]
fn row_reductions_read_by_runs_fold_in_order() {
    let (m, n) = (83usize, 53usize);
    let a = data(m * n, 5);
    for op in [BinOp::Add, BinOp::Mul, BinOp::Max, BinOp::Min] {
        let w = words(
            &[(m as i64, 1, &[n as i64])],
            &[(n as i64, &[1])],
            Some(op),
            false,
            &[MapCode::Input(0)],
        );
        let mut out = vec![0f32; m];
        // SAFETY: `m` cells of `out`, `m × n` of `a`.
        unsafe { map(&[out.as_mut_ptr(), a.as_ptr() as *mut f32], &MapDesc::decode(&w).unwrap()) };
        for i in 0..m {
            let t0 = op.neutral().unwrap() as f32;
            let want = a[i * n..(i + 1) * n].iter().fold(t0, |t, x| op.apply_f32(t, *x));
            assert_eq!(out[i].to_bits(), want.to_bits(), "{} row {i}", op.name());
        }
    }
}

#[test]
fn encoding_then_decoding_gives_the_descriptor_back() {
    let w = words(
        &[(3, 40, &[40, 0]), (40, 1, &[1, 1])],
        &[(7, &[120, 0])],
        Some(BinOp::Max),
        true,
        &[MapCode::Input(0), MapCode::Input(1), MapCode::Un(UnOp::Exp), MapCode::Bin(BinOp::Mul)],
    );
    let d = MapDesc::decode(&w).unwrap();
    assert_eq!(d.encode(), w);
    assert_eq!(MapDesc::decode(&d.encode()), Some(d));
}

#[test]
fn a_dynamic_count_clips_an_axis_and_never_goes_below_zero() {
    let mut w = words(&[(10, 1, &[1])], &[], None, false, &[MapCode::Input(0)]);
    w[MAP_HEADER + 1] = 4; // 4 of the 10 cells
    assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 4);
    w[MAP_HEADER + 1] = -6;
    assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 0, "a block past a dynamic size");
    w[MAP_HEADER + 1] = 0;
    assert_eq!(MapDesc::decode(&w).unwrap().cells[0].n, 0);
}
