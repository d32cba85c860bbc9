//! Per-step metadata uploads, made once: every layer of a step asks for the same tables (sequence
//! table, attention rows and block tables, RoPE positions), built from the same `BatchLayout`. The
//! cache keeps the last host copy of each named table with its device copy and hands the device
//! copy back while the contents are unchanged, so a step uploads each table once instead of once
//! per layer. Everything runs on the backend's one stream, so a table replaced here is freed only
//! after the kernels queued before it.

use crate::backend::CudaBackend;
use cudarc::driver::{CudaSlice, DeviceRepr};
use std::any::Any;
use std::collections::HashMap;
use std::sync::Arc;

/// The last upload under each name: `(host copy, device copy)` of some element type.
#[derive(Default)]
pub(crate) struct UploadCache {
    tables: HashMap<&'static str, Box<dyn Any + Send + Sync>>,
}

type Entry<T> = (Vec<T>, Arc<CudaSlice<T>>);

impl CudaBackend {
    /// The device copy of `data`, uploaded only when it differs from the last table under `name`.
    pub(crate) fn upload_cached<T>(&self, name: &'static str, data: &[T]) -> Arc<CudaSlice<T>>
    where
        T: DeviceRepr + Default + Clone + PartialEq + Send + Sync + 'static,
    {
        let mut cache = self
            .upload_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((host, device)) = cache
            .tables
            .get(name)
            .and_then(|entry| entry.downcast_ref::<Entry<T>>())
        {
            if host.as_slice() == data {
                return device.clone();
            }
        }
        let device = Arc::new(self.upload(name, data));
        cache
            .tables
            .insert(name, Box::new((data.to_vec(), device.clone())));
        device
    }
}
