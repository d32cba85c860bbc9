//! `--kv-cache-dtype` resolved for the backend that runs the model, as SGLang resolves it: `auto`
//! is the dtype the model runs in. On cuda with bf16 GEMMs (the default) the weights run in bf16
//! whatever the checkpoint stores, so the KV cache is bf16; `--cuda-matmul-precision f32` exists to
//! check the model exactly against transformers, so there `auto` keeps K/V exact (fp32). The host
//! backends (cpu, reference) store and read f32 KV pools only: `auto` is fp32 there and an explicit
//! `bf16` is refused naming the flag.

use crate::model_flags::BackendKind;
use crate::serve_flags::flag_values::KvCacheDtype;
use anyhow::{bail, Result};
use deltaserve_cuda::GemmPrecision;
use deltaserve_tensor::KvDtype;

/// The KV dtype in use and why, for the start-up lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KvCacheChoice {
    pub dtype: KvDtype,
    pub why: String,
}

impl std::fmt::Display for KvCacheChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.dtype.name(), self.why)
    }
}

/// The KV dtype for `flag` on `backend` (already resolved from `auto`; anything but cuda is a host
/// backend) whose GEMMs run at `cuda_precision` on cuda.
pub fn resolve_kv_cache_dtype(
    flag: KvCacheDtype,
    backend: BackendKind,
    cuda_precision: GemmPrecision,
) -> Result<KvCacheChoice> {
    let choice = |dtype: KvDtype, why: &str| KvCacheChoice {
        dtype,
        why: why.to_string(),
    };
    let given = format!("--kv-cache-dtype {}", flag.as_str());
    if backend != BackendKind::Cuda {
        let host = match backend {
            BackendKind::Reference => "reference",
            _ => "cpu",
        };
        return match flag {
            KvCacheDtype::Auto => Ok(choice(
                KvDtype::F32,
                &format!("{given}: the {host} backend stores K/V in f32"),
            )),
            KvCacheDtype::Float32 => Ok(choice(KvDtype::F32, &given)),
            KvCacheDtype::BFloat16 => bail!(
                "{given}: the {host} backend stores and reads its KV cache in f32 only; \
                 use --kv-cache-dtype auto or fp32 there, or --backend cuda for a bf16 KV cache"
            ),
        };
    }
    Ok(match (flag, cuda_precision) {
        (KvCacheDtype::Auto, GemmPrecision::Bf16) => choice(
            KvDtype::Bf16,
            &format!("{given}: the model runs in bf16 (--cuda-matmul-precision bf16), so does its KV cache, as in SGLang"),
        ),
        (KvCacheDtype::Auto, GemmPrecision::F32) => choice(
            KvDtype::F32,
            &format!("{given}: --cuda-matmul-precision f32 keeps the model exact, K/V included"),
        ),
        (KvCacheDtype::BFloat16, _) => choice(KvDtype::Bf16, &given),
        (KvCacheDtype::Float32, _) => choice(KvDtype::F32, &given),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BF16: GemmPrecision = GemmPrecision::Bf16;
    const F32: GemmPrecision = GemmPrecision::F32;

    fn dtype(flag: KvCacheDtype, backend: BackendKind, precision: GemmPrecision) -> KvDtype {
        resolve_kv_cache_dtype(flag, backend, precision)
            .unwrap()
            .dtype
    }

    #[test]
    fn auto_follows_the_dtype_the_model_runs_in() {
        assert_eq!(
            dtype(KvCacheDtype::Auto, BackendKind::Cuda, BF16),
            KvDtype::Bf16
        );
        assert_eq!(
            dtype(KvCacheDtype::Auto, BackendKind::Cuda, F32),
            KvDtype::F32
        );
        for host in [BackendKind::Cpu, BackendKind::Reference] {
            for precision in [BF16, F32] {
                assert_eq!(dtype(KvCacheDtype::Auto, host, precision), KvDtype::F32);
            }
        }
        let why = resolve_kv_cache_dtype(KvCacheDtype::Auto, BackendKind::Cuda, BF16)
            .unwrap()
            .to_string();
        assert!(why.starts_with("bf16 (") && why.contains("auto"), "{why}");
    }

    #[test]
    fn explicit_values_are_honoured_on_cuda() {
        for precision in [BF16, F32] {
            assert_eq!(
                dtype(KvCacheDtype::BFloat16, BackendKind::Cuda, precision),
                KvDtype::Bf16
            );
            assert_eq!(
                dtype(KvCacheDtype::Float32, BackendKind::Cuda, precision),
                KvDtype::F32
            );
        }
        assert_eq!(
            dtype(KvCacheDtype::Float32, BackendKind::Cpu, BF16),
            KvDtype::F32
        );
    }

    #[test]
    fn bf16_on_a_host_backend_is_refused_naming_the_flag() {
        for (host, name) in [
            (BackendKind::Cpu, "cpu"),
            (BackendKind::Reference, "reference"),
        ] {
            let e = resolve_kv_cache_dtype(KvCacheDtype::BFloat16, host, BF16)
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("--kv-cache-dtype bf16") && e.contains(name) && e.contains("f32"),
                "{e}"
            );
        }
    }
}
