//! Shape inference at model scale: building a graph, finishing inference and deriving every
//! projection, for a ResNet-50-sized convolutional network (convolutions as einsums with
//! convolution axes, pointwise ops, a dense head) and a 12-layer transformer.
//!
//! `cargo bench --bench shape_inference`; it prints each graph's number of tensors and of
//! operations (tensors computed from others, as opposed to data and parameters), the
//! denominators of the per-tensor and per-operation figures in `docs/benchmarks.md`.

use criterion::{Criterion, criterion_group, criterion_main};
use rocannl_tensor::nn::attention::{AttentionConfig, TransformerBlock, TransformerBlockConfig};
use rocannl_tensor::nn::conv::{Conv2d, Conv2dConfig, Padding, max_pool2d};
use rocannl_tensor::nn::{Linear, LinearConfig, OUTPUT_AXES};
use rocannl_tensor::{Axes, Graph, Tensor, TensorId};

/// A convolution (einsum with convolution axes) + bias, then relu.
fn conv(g: &Graph, name: &str, x: &Tensor, k: usize, out: usize, stride: usize) -> Tensor {
    let padding = if k == 1 && stride == 1 { Padding::Valid } else { Padding::Same };
    let cfg = Conv2dConfig::new((k, k), out).with_stride(stride).with_padding(padding);
    Conv2d::new(g, name, cfg).apply(x).relu()
}

/// ResNet-50: a 7×7/2 stem, max pooling, 16 bottleneck blocks (1×1, 3×3, 1×1 convolutions with
/// a residual, projected where the shape changes), average pooling and a dense classifier.
pub fn resnet50(g: &Graph) -> Tensor {
    let x = g.data("images", Axes::new().batch(&[8]).output(&[224, 224, 3]));
    let mut h = conv(g, "stem", &x, 7, 64, 2);
    h = max_pool2d(&h, 2, 2);
    let stages = [(3, 64, 256, 1), (4, 128, 512, 2), (6, 256, 1024, 2), (3, 512, 2048, 2)];
    for (si, (blocks, mid, out, stride)) in stages.into_iter().enumerate() {
        for b in 0..blocks {
            let s = if b == 0 { stride } else { 1 };
            let name = format!("s{si}b{b}");
            let a = conv(g, &format!("{name}.c1"), &h, 1, mid, 1);
            let a = conv(g, &format!("{name}.c2"), &a, 3, mid, s);
            let a = Conv2d::new(g, &format!("{name}.c3"), Conv2dConfig::new((1, 1), out)).apply(&a);
            let shortcut = if b == 0 {
                let proj =
                    Conv2dConfig::new((1, 1), out).with_stride(s).with_padding(Padding::Same);
                Conv2d::new(g, &format!("{name}.proj"), proj).apply(&h)
            } else {
                h.clone()
            };
            h = (&a + &shortcut).relu();
        }
    }
    let pooled = h.mean("... | h, w, c => ... | c");
    Linear::new(g, "fc", LinearConfig::new(1000)).apply(&pooled).softmax(OUTPUT_AXES)
}

/// A 12-layer pre-norm transformer over sequences of 32 positions of width 64.
pub fn transformer(g: &Graph) -> Tensor {
    let mut x = g.data("tokens", Axes::new().batch(&[4, 32]).output(&[64]));
    for l in 0..12 {
        let cfg = TransformerBlockConfig::new(AttentionConfig::new(4, 16), 256);
        x = TransformerBlock::new(g, &format!("layer{l}"), cfg).apply(&x);
    }
    x
}

/// Builds the graph, finishes inference and derives the projections of every operation.
fn infer(build: fn(&Graph) -> Tensor) -> usize {
    let g = Graph::new();
    let _out = build(&g);
    g.finish().expect("the model's shapes are consistent");
    let mut n = 0;
    for i in 0..g.len() {
        let t = g.tensor(TensorId(i as u32));
        n += rocannl::tensor::advanced::projections(&t).expect("projections").len();
    }
    n
}

fn bench(c: &mut Criterion) {
    for (name, build) in
        [("resnet50", resnet50 as fn(&Graph) -> Tensor), ("transformer12", transformer)]
    {
        let g = Graph::new();
        let _ = build(&g);
        let ops = (0..g.len()).filter(|&i| !g.tensor(TensorId(i as u32)).args().is_empty()).count();
        println!("{name}: {} tensors, {ops} operations", g.len());
        c.bench_function(&format!("shape_inference/{name}"), |b| b.iter(|| infer(build)));
    }
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = bench
}
criterion_main!(benches);
