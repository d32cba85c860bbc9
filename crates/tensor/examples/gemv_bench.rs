//! Micro benchmark of the `cpu` backend's matrix kernels against the machine's memory bandwidth:
//! (a) streaming read bandwidth, (b) batch-1 GEMV over a Qwen3.5-0.8B-shaped bf16 weight set (and
//! (b') the same issued from inside the backend's pool, as a model step does),
//! (c) prefill GEMM GFLOP/s at T = 512 in both precisions, (d) GEMV vs GEMM time for small T,
//! (e) the cores' f32 multiply-add ceiling (AVX2 + FMA), which no exact-f32 GEMM can pass.
//! Prints, never asserts.
//!
//! `cargo run --release -p deltaserve-tensor --example gemv_bench -- [threads] [--quick]`

use deltaserve_tensor::cpu::{CpuBackend, CpuMat, CpuOptions, MatmulPrecision};
use deltaserve_tensor::Backend;
use rayon::prelude::*;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let threads: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2);
    let quick = args.iter().any(|a| a == "--quick");
    let be = CpuBackend::new(threads);
    println!(
        "cpu backend: {} threads, kernels {}",
        be.threads(),
        be.isa()
    );

    // Other processes share this machine: (a) and (b) alternate for several rounds and each keeps
    // its best, so both see the same quiet moments.
    let rounds = if quick { 3 } else { 5 };
    let stream = StreamBuffer::new(threads, if quick { 1 << 28 } else { 1 << 30 });
    let weights = WeightSet::new(&be, quick);
    let (mut bandwidth, mut gemv, mut gemv_in_step) = (0.0f64, 0.0f64, 0.0f64);
    for _ in 0..rounds {
        bandwidth = bandwidth.max(stream.gbps());
        gemv = gemv.max(weights.gemv_gbps(&be));
        gemv_in_step = gemv_in_step.max(be.run_step(|| weights.gemv_gbps(&be)));
    }
    println!(
        "(a) streaming read bandwidth ({threads} threads, {} MiB): {bandwidth:.2} GB/s",
        stream.bytes >> 20
    );
    println!(
        "(b) GEMV bf16, batch 1, {} matrices, {:.2} GB: {gemv:.2} GB/s = {:.0} % of read bandwidth ({:.1} ms per pass)",
        weights.mats.len(),
        weights.bytes as f64 / 1e9,
        100.0 * gemv / bandwidth,
        weights.bytes as f64 / gemv / 1e6
    );
    println!(
        "(b') the same products issued from inside the pool, as a model step issues them (Backend::run_step): {gemv_in_step:.2} GB/s = {:.0} % ({:.1} ms per pass)",
        100.0 * gemv_in_step / bandwidth,
        weights.bytes as f64 / gemv_in_step / 1e6
    );
    drop(stream);
    drop(weights);

    let be_bf16 = CpuBackend::with_options(CpuOptions {
        threads,
        matmul_precision: MatmulPrecision::Bf16,
        ..CpuOptions::default()
    })
    .expect("benchmark backend");
    println!("(c) prefill GEMM, bf16 weights, T = 512, GFLOP/s: exact f32 | bf16 activations (vdpbf16ps where present)");
    for (n, k) in [(1024, 1024), (3584, 1024), (1024, 3584), (6144, 1024)] {
        let w = random_bf16(&be, n, k, 7);
        let w_pairs = random_bf16(&be_bf16, n, k, 7);
        let x = random_f32(512 * k, 8);
        let mut out = vec![0.0; 512 * n];
        let flop = 2.0 * 512.0 * n as f64 * k as f64;
        let exact = time(3, || be.matmul_gemm(&x, &w, &mut out, 512));
        let rounded = time(3, || be_bf16.matmul_gemm(&x, &w_pairs, &mut out, 512));
        println!(
            "    [{n:>5} x {k:>5}]: {:7.1} | {:7.1}",
            flop / exact / 1e9,
            flop / rounded / 1e9
        );
    }

    // Twelve matrices (88 MB, more than the L3) used in turn, so the weights come from memory as
    // they do in a real forward pass.
    println!("(d) small T on [3584 x 1024] bf16 (weights from memory): ms per matrix, GEMV kernels vs blocked GEMM");
    let set: Vec<CpuMat> = (0..12)
        .map(|i| random_bf16(&be, 3584, 1024, 20 + i))
        .collect();
    for t in [1, 2, 4, 8, 9, 12, 16, 32, 64] {
        let x = random_f32(t * 1024, 10);
        let mut out = vec![0.0; t * 3584];
        let a = time(3, || {
            set.iter().for_each(|w| be.matmul_gemv(&x, w, &mut out, t))
        }) / set.len() as f64;
        let b = time(3, || {
            set.iter().for_each(|w| be.matmul_gemm(&x, w, &mut out, t))
        }) / set.len() as f64;
        println!(
            "    T = {t:>2}: gemv {:6.3} ms, gemm {:6.3} ms",
            a * 1e3,
            b * 1e3
        );
    }
    match fma_ceiling_gflops(threads) {
        Some(gflops) => println!(
            "(e) f32 multiply-add ceiling (AVX2 + FMA, {threads} threads, 12 chains a thread): {gflops:.1} GFLOP/s"
        ),
        None => println!("(e) f32 multiply-add ceiling: not measured (no AVX2 + FMA here)"),
    }
}

/// (e): every thread of a pool of `threads` runs twelve independent 8-wide multiply-add chains (more
/// than any x86 core needs to cover the instruction's latency); GFLOP/s over all threads, or `None`
/// without AVX2 and FMA.
fn fma_ceiling_gflops(threads: usize) -> Option<f64> {
    #[cfg(target_arch = "x86_64")]
    {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            return None;
        }
        const ITERS: usize = 50_000_000;
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .ok()?;
        let secs = time(3, || {
            pool.broadcast(|ctx| {
                // SAFETY: AVX2 and FMA were detected above.
                std::hint::black_box(unsafe { fma_chains(ITERS, ctx.index() as f32) });
            });
        });
        Some((threads * ITERS * 12 * 8 * 2) as f64 / secs / 1e9)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = threads;
        None
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn fma_chains(iters: usize, seed: f32) -> f32 {
    use std::arch::x86_64::*;
    let mul = _mm256_set1_ps(0.999_999);
    let add = _mm256_set1_ps(1e-7);
    let mut acc = [_mm256_set1_ps(seed); 12];
    for _ in 0..iters {
        for a in acc.iter_mut() {
            *a = _mm256_fmadd_ps(*a, mul, add);
        }
    }
    let mut sum = _mm256_setzero_ps();
    for a in acc {
        sum = _mm256_add_ps(sum, a);
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), sum);
    lanes.iter().sum()
}

/// Best-of-`reps` seconds of `f` after one warm-up call.
fn time(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// A buffer of u64 words summed by `threads` threads: the machine's streaming read bandwidth.
struct StreamBuffer {
    pool: rayon::ThreadPool,
    words: Vec<u64>,
    bytes: usize,
}

impl StreamBuffer {
    fn new(threads: usize, bytes: usize) -> Self {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("benchmark thread pool");
        Self {
            pool,
            words: (0..bytes / 8).map(|i| i as u64).collect(),
            bytes,
        }
    }

    /// GB/s of the best of 3 passes.
    fn gbps(&self) -> f64 {
        let chunk = self
            .words
            .len()
            .div_ceil(self.pool.current_num_threads() * 8);
        let mut sink = 0u64;
        let secs = time(3, || {
            sink ^= self.pool.install(|| {
                self.words
                    .par_chunks(chunk)
                    .map(|c| c.iter().fold(0u64, |a, &b| a.wrapping_add(b)))
                    .reduce(|| 0, u64::wrapping_add)
            });
        });
        std::hint::black_box(sink);
        self.bytes as f64 / secs / 1e9
    }
}

/// 24 layers of Qwen3.5-0.8B-shaped bf16 matrices plus the tied lm_head (`--quick`: 4 layers and a
/// 32768-row head), with batch-1 inputs.
struct WeightSet {
    mats: Vec<CpuMat>,
    inputs: Vec<Vec<f32>>,
    bytes: usize,
}

impl WeightSet {
    fn new(be: &CpuBackend, quick: bool) -> Self {
        let layers = if quick { 4 } else { 24 };
        let mut mats: Vec<CpuMat> = Vec::new();
        for l in 0..layers {
            for (i, (n, k)) in [
                (1024, 1024),
                (6144, 1024),
                (3584, 1024),
                (3584, 1024),
                (1024, 3584),
            ]
            .into_iter()
            .enumerate()
            {
                mats.push(random_bf16(be, n, k, (l * 8 + i) as u64));
            }
        }
        mats.push(random_bf16(
            be,
            if quick { 32768 } else { 248_320 },
            1024,
            99,
        ));
        let bytes = mats.iter().map(CpuMat::bytes).sum();
        let inputs = mats
            .iter()
            .map(|m| random_f32(m.cols(), m.rows() as u64))
            .collect();
        Self {
            mats,
            inputs,
            bytes,
        }
    }

    /// GB/s of the best of 3 passes over every matrix.
    fn gemv_gbps(&self, be: &CpuBackend) -> f64 {
        let mut outs: Vec<Vec<f32>> = self.mats.iter().map(|m| vec![0.0; m.rows()]).collect();
        let secs = time(3, || {
            for ((m, x), o) in self.mats.iter().zip(&self.inputs).zip(outs.iter_mut()) {
                be.matmul_gemv(x, m, o, 1);
            }
        });
        self.bytes as f64 / secs / 1e9
    }
}

fn random_f32(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn random_bf16(be: &CpuBackend, rows: usize, cols: usize, seed: u64) -> CpuMat {
    let bits: Vec<u16> = random_f32(rows * cols, seed)
        .into_iter()
        .map(|v| (v.to_bits() >> 16) as u16)
        .collect();
    be.mat_from_bf16_bits(rows, cols, &bits)
}
