//! A tour of the extended einsum notation: each stop builds a tiny expression, lets shape
//! inference work out every shape, and prints the spec, the shapes and the values.
//!
//! `cargo run --release --example einsum_tour`

use std::error::Error;

use rocannl::tensor::{Axes, Graph, Init, ParamSpec, Session, Tensor};

/// Prints a tensor's shape (`batch|input->output`) and values.
fn show(s: &mut Session, what: &str, t: &Tensor) -> Result<(), Box<dyn Error>> {
    let r = s.forward(&[t])?;
    s.run(&r)?;
    let values: Vec<String> = s.read(t)?.iter().map(|v| format!("{v}")).collect();
    println!("  {what:<28} shape {:<16} values [{}]", t.shape_string(), values.join(", "));
    Ok(())
}

fn stop(title: &str, spec: &str) {
    println!("\n{title}\n  spec: {spec}");
}

fn main() -> Result<(), Box<dyn Error>> {
    let g = Graph::new();
    // Data: x is 2|3->4 (batch 2, input 3, output 4), cells hold their offsets.
    let x = g.range_of_shape(Axes::new().batch(&[2]).input(&[3]).output(&[4]));
    let a = g.ndarray("a", Axes::new().output(&[2, 3]), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let b = g.ndarray("b", Axes::new().output(&[3, 2]), &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    let v3 = g.vector("v3", &[1.0, 10.0, 100.0]);

    let permuted = x.einsum("b|i->o => o|b->i", []);
    let reduced = x.einsum("b|i->o => b|i", []);
    let matmul = a.einsum("ij; jk => ik", &b);
    let multichar = a.einsum("rows, k; k, cols => rows, cols", &b);
    let batched = x.einsum("...|i->o => ...|o->i", []);
    let named = x.einsum("..v..|i->o => ..v..->oi", []);
    let scaled = a.einsum("ij; j => ij", &v3);
    let broadcast = g.vector("one", &[2.0]).einsum("i; i => i", &v3);
    let select = a.einsum("1j => j", []);
    let place = v3.einsum("i => 2i", []);
    let diagonal = g.range_of_shape(Axes::new().output(&[3, 3])).einsum("ii => i", []);
    let trace = g.range_of_shape(Axes::new().output(&[3, 3])).einsum("ii => 0", []);
    let series = g.vector("s", &[0.0, 1.0, 3.0, 6.0, 10.0]);
    let diff = series.einsum("o+k; k => o", &g.vector("d", &[-1.0, 1.0]));
    let strided = g.range(8).einsum("2*i => i", []);
    let row_max = a.amax("ij => i");
    let pooled = g
        .range_of_shape(Axes::new().output(&[4, 4]))
        .tropical("2*h+i, 2*w+j; i, j => h, w", &g.constant(0.0, Axes::new().output(&[2, 2])));
    let joined =
        a.concat("i, p; i, q => i, p^q", &[&g.range_of_shape(Axes::new().output(&[2, 1]))]);
    // A parameter whose size is inferred by subtraction: 2 + ? = 5.
    let rest = g.param("rest", ParamSpec::default().init(Init::Constant(9.0)));
    let five = g.vector("two", &[7.0, 8.0]).concat("p; q => p^q", &[&rest]);
    let total = &five + &g.vector("zeros5", &[0.0; 5]);

    let mut s = Session::new(&g)?;
    println!("Every shape below was inferred; the tensors were only given their data.");
    println!("  x = range_of_shape 2|3->4, a = 2x3 matrix, b = 3x2 matrix, v3 = [1, 10, 100]");

    stop("Permuting axes across rows (batch -> input -> output -> batch)", "b|i->o => o|b->i");
    show(&mut s, "x permuted", &permuted)?;
    stop("Labels absent from the result are summed", "b|i->o => b|i");
    show(&mut s, "x summed over o", &reduced)?;
    stop("Matrix multiplication", "ij; jk => ik");
    show(&mut s, "a b", &matmul)?;
    stop("Multi-character labels (commas switch the mode)", "rows, k; k, cols => rows, cols");
    show(&mut s, "a b again", &multichar)?;
    stop("`...` keeps the axes of a row it does not name", "...|i->o => ...|o->i");
    show(&mut s, "x, batch kept", &batched)?;
    stop("A named row variable can move axes between rows", "..v..|i->o => ..v..->oi");
    show(&mut s, "batch moved to input", &named)?;
    stop("A label shared by both arguments and kept is pointwise", "ij; j => ij");
    show(&mut s, "columns scaled", &scaled)?;
    stop("Einsum arguments broadcast: a size-1 axis is read at position 0", "i; i => i");
    show(&mut s, "[2] against v3", &broadcast)?;
    stop("A digit on an argument selects a position", "1j => j");
    show(&mut s, "row 1 of a", &select)?;
    stop("A digit in the result places the values there", "i => 2i");
    show(&mut s, "v3 placed at row 2", &place)?;
    stop("A repeated label takes a diagonal", "ii => i");
    show(&mut s, "diagonal", &diagonal)?;
    stop("... and summing it into one position is a trace", "ii => 0");
    show(&mut s, "trace", &trace)?;
    stop("Convolution axes: out+kernel is a valid convolution", "o+k; k => o");
    show(&mut s, "differences", &diff)?;
    println!(
        "  (the output size {} was solved from 5 = o + 2 - 1)",
        diff.captured("o").unwrap_or(0)
    );
    stop("A pure stride reads every second position", "2*i => i");
    show(&mut s, "even positions of range 8", &strided)?;
    stop("einmax1 reduces with max instead of sum", "ij => i");
    show(&mut s, "row maxima", &row_max)?;
    stop("tropical (max-plus) einsum: 2x2 max pooling", "2*h+i, 2*w+j; i, j => h, w");
    show(&mut s, "pooled 4x4", &pooled)?;
    stop("Concatenation: the sizes of the parts add up", "i, p; i, q => i, p^q");
    show(&mut s, "a joined with a column", &joined)?;
    stop("A missing part is inferred by subtraction", "p; q => p^q  (then + zeros(5))");
    show(&mut s, "[7, 8] ^ rest", &total)?;
    println!("  rest was inferred as {}", rest.shape_string());

    println!("\nErrors name the operation and the shapes:");
    let bad = Graph::new();
    let _ = bad.vector("p", &[1.0, 2.0, 3.0]).einsum("i; i => i", &bad.vector("q", &[1.0; 4]));
    if let Err(e) = bad.finish() {
        println!("  {e}");
    }
    let bad_spec = Graph::new();
    let _ = bad_spec.range(3).einsum("i->j->k => i", []);
    if let Err(e) = bad_spec.finish() {
        println!("  {e}");
    }
    Ok(())
}
