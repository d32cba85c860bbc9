//! Tensor parallelism on GPUs over NCCL (skipped, with the reason printed, without a driver, a GPU
//! or NCCL). With one GPU the group has one rank: the NCCL plumbing and the split-model code path
//! run whole. With two or more GPUs (`DELTASERVE_TP_GPUS` caps how many), the collectives are
//! checked against their definition and every fixture's logits split over the GPUs against the
//! whole model on GPU 0 (`TP_TOLERANCE`, as the CPU test derives it, with f32 GEMMs).

#[path = "../../model/tests/support/fixtures.rs"]
mod fixtures;

use deltaserve_cuda::{CudaBackend, CudaOptions, GemmPrecision, NcclCommunicator};
use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::{load_tensor_parallel, ForwardInput, Model};
use deltaserve_tensor::{Backend, BatchLayout, Communicator};
use fixtures::{blocks_of, fixture_dirs, full_cache, ids, max_abs_diff};
use serde_json::Value;

/// As crates/model/tests/tensor_parallel.rs (measured at most 2.4e-4 between summation orders).
const TP_TOLERANCE: f32 = 1e-3;

/// One f32-GEMM backend per GPU in use, or `None` after printing why the test is skipped.
fn backends(test: &str) -> Option<Vec<CudaBackend>> {
    let count = match deltaserve_cuda::gpu_count() {
        Ok(0) => {
            eprintln!("{test}: skipped: no GPU");
            return None;
        }
        Ok(n) => n,
        Err(e) => {
            eprintln!("{test}: skipped: {e}");
            return None;
        }
    };
    let cap = std::env::var("DELTASERVE_TP_GPUS")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2);
    let n = count.min(cap).max(1);
    let mut out = Vec::new();
    for ordinal in 0..n {
        let options = CudaOptions {
            gemm_precision: GemmPrecision::F32,
            ..CudaOptions::default()
        };
        match CudaBackend::with_options(ordinal, options) {
            Ok(b) => out.push(b),
            Err(e) => {
                eprintln!("{test}: skipped: GPU {ordinal}: {e}");
                return None;
            }
        }
    }
    Some(out)
}

fn nccl(backends: &[CudaBackend], test: &str) -> Option<Vec<Box<dyn Communicator<CudaBackend>>>> {
    match NcclCommunicator::group(backends) {
        Ok(comms) => Some(
            comms
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Communicator<CudaBackend>>)
                .collect(),
        ),
        Err(e) => {
            eprintln!("{test}: skipped: {e}");
            None
        }
    }
}

#[test]
fn nccl_all_reduce_and_all_gather() {
    let test = "nccl_all_reduce_and_all_gather";
    let Some(backends) = backends(test) else {
        return;
    };
    let Some(comms) = nccl(&backends, test) else {
        return;
    };
    let n = backends.len();
    let results: Vec<(Vec<f32>, Vec<f32>)> = std::thread::scope(|s| {
        let handles: Vec<_> = backends
            .iter()
            .zip(&comms)
            .map(|(be, comm)| {
                s.spawn(move || {
                    let r = comm.rank() as f32;
                    let mut buf = be.upload(&[r, 1.0, 2.0 * r]);
                    comm.all_reduce_sum(be, &mut buf);
                    // [2 rows, 2 cols] per rank.
                    let part = be.upload(&[r, r + 0.5, -r, -r - 0.5]);
                    let gathered = comm.all_gather_cols(be, &part, 2, 2);
                    (be.to_host(&buf), be.to_host(&gathered))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ranks: f32 = (0..n).map(|r| r as f32).sum();
    let mut expected_gather = Vec::new();
    for row in 0..2 {
        for r in 0..n {
            let r = r as f32;
            if row == 0 {
                expected_gather.extend([r, r + 0.5]);
            } else {
                expected_gather.extend([-r, -r - 0.5]);
            }
        }
    }
    for (sum, gathered) in results {
        assert_eq!(sum, vec![ranks, n as f32, 2.0 * ranks]);
        assert_eq!(gathered, expected_gather);
    }
}

fn prefill_logits<B: Backend>(m: &Model<B>, prompt: &[u32]) -> Vec<f32> {
    let mut cache = full_cache(m, 1, prompt.len());
    let batch = BatchLayout::packed(
        16,
        [(
            prompt.len(),
            0,
            blocks_of(0, prompt.len().div_ceil(16), 1),
            0,
        )],
    );
    let rows: Vec<u32> = (0..prompt.len() as u32).collect();
    let out = m.forward(
        &ForwardInput {
            tokens: prompt,
            batch: &batch,
            logit_rows: &rows,
            hidden_rows: &[],
        },
        &mut cache,
    );
    m.backend.to_host(&out.logits)
}

#[test]
fn fixtures_split_over_the_gpus_match_the_whole_model() {
    let test = "fixtures_split_over_the_gpus_match_the_whole_model";
    let Some(probe) = backends(test) else {
        return;
    };
    let n = probe.len();
    drop(probe);
    for dir in fixture_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let config = ModelConfig::from_dir(&dir).unwrap();
        let source = SafetensorsSource::open(&dir).unwrap();
        let expected: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap())
                .unwrap();
        let prompt = ids(&expected, "prefill_ids");
        let Some(mut whole_backends) = backends(test) else {
            return;
        };
        whole_backends.truncate(1);
        let whole = load_tensor_parallel(
            whole_backends,
            vec![Box::new(
                deltaserve_tensor::InProcessGroup::new(1).remove(0),
            )],
            &config,
            &source,
            true,
            &mut |_, _| {},
        )
        .unwrap();
        let want = prefill_logits(&whole, &prompt);
        drop(whole);
        let Some(split_backends) = backends(test) else {
            return;
        };
        let Some(comms) = nccl(&split_backends, test) else {
            return;
        };
        let split = load_tensor_parallel(
            split_backends,
            comms,
            &config,
            &source,
            true,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(split.tp_size(), n);
        let got = prefill_logits(&split, &prompt);
        let diff = max_abs_diff(&want, &got);
        println!("{name}: tp {n} (nccl) vs tp 1: prefill max |diff| = {diff:.2e}");
        assert!(diff <= TP_TOLERANCE, "{name}: tp {n} differs by {diff}");
    }
}
