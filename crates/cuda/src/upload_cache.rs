//! Per-step metadata tables on the device, uploaded once per step and kept at fixed addresses.
//!
//! Every layer of a step asks for the same tables (sequence table, attention rows and block tables,
//! RoPE positions), built from the same `BatchLayout`: the cache keeps the last host copy of each
//! named table beside its device copy and hands the device copy back while the contents are
//! unchanged. New contents are copied into the same allocation while they fit, so the tables stay
//! where a recorded step (CUDA graph) reads them; `generation` counts the times a table had to move
//! to a larger allocation, which makes such recordings stale. Everything runs on the backend's one
//! stream, so an in-place copy lands after the kernels queued before it.
//!
//! While a step is being recorded nothing may be uploaded (a recorded host copy would read freed
//! host memory on replay): a table that `prepare_step` did not put in place marks the recording as
//! missed, and the recording is discarded.

use crate::backend::{device_failure, CudaBackend};
use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, MutexGuard};

/// The names of the step tables, shared by the ops that read them and by `prepare_step`, which
/// puts them in place before a recorded step replays.
pub(crate) mod table {
    pub const TOKEN_IDS: &str = "embedding ids";
    pub const POSITIONS: &str = "rope positions";
    /// The sequence table and snapshot slots (`layout::seq_table`), read by the conv and the
    /// delta rule alike.
    pub const SEQUENCES: &str = "sequences";
    pub const SNAPSHOT_SLOTS: &str = "snapshot slots";
    pub const CONV_ROW_SEQUENCES: &str = "conv row sequences";
    pub const ATTENTION_OFFSETS: &str = "attention offsets";
    pub const ATTENTION_ROWS: &str = "attention rows";
    pub const ATTENTION_BLOCKS: &str = "attention block tables";
    /// The attention rows left to the paged kernels when long sequences take the flash kernel
    /// (theirs zeroed), and the flash kernel's tiles.
    pub const ATTENTION_PAGED_ROWS: &str = "attention paged rows";
    pub const FLASH_TILES: &str = "flash attention tiles";
    pub const GATHER_ROWS: &str = "gather_rows rows";
    /// An MTP step's input hidden states (`Backend::step_hidden`).
    pub const STEP_HIDDEN: &str = "step hidden states";
    /// The chunked delta rule's chunk and piece tables (gdn_chunked.rs).
    pub const GDN_CHUNKS: &str = "gdn chunks";
    pub const GDN_PIECES: &str = "gdn pieces";
}

/// Smallest allocation of a table, in elements (tables grow by doubling).
const MIN_CAPACITY: usize = 64;

#[derive(Default)]
pub(crate) struct UploadCache {
    tables: HashMap<&'static str, Box<dyn Any + Send + Sync>>,
    /// Times a table moved to a new allocation.
    pub generation: u64,
    /// A step is being recorded: no uploads.
    pub capturing: bool,
    /// The recording needed a table that was not in place.
    pub capture_missed: bool,
}

struct Table<T> {
    host: Vec<T>,
    device: Arc<CudaSlice<T>>,
    capacity: usize,
}

impl CudaBackend {
    /// The cache, also after a panic elsewhere left its lock poisoned (its state is always whole).
    pub(crate) fn upload_cache(&self) -> MutexGuard<'_, UploadCache> {
        self.upload_cache
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The device copy of `data` under `name`: the same allocation as before when the contents
    /// are unchanged or fit in it.
    pub(crate) fn upload_cached<T>(&self, name: &'static str, data: &[T]) -> Arc<CudaSlice<T>>
    where
        T: DeviceRepr + ValidAsZeroBits + Default + Clone + PartialEq + Send + Sync + 'static,
    {
        let mut guard = self.upload_cache();
        let cache = &mut *guard;
        let capturing = cache.capturing;
        let entry = cache
            .tables
            .get_mut(name)
            .and_then(|entry| entry.downcast_mut::<Table<T>>());
        match entry {
            Some(table) if table.host.as_slice() == data => return table.device.clone(),
            Some(table) if capturing => {
                cache.capture_missed = true;
                return table.device.clone();
            }
            Some(table) if data.len() <= table.capacity => {
                if let Some(device) = Arc::get_mut(&mut table.device) {
                    if !data.is_empty() {
                        let mut view = device.slice_mut(0..data.len());
                        if let Err(e) = self.stream.memcpy_htod(data, &mut view) {
                            device_failure(name, e);
                        }
                    }
                    table.host.clear();
                    table.host.extend_from_slice(data);
                    return table.device.clone();
                }
            }
            _ => {}
        }
        let capacity = data.len().next_power_of_two().max(MIN_CAPACITY);
        let mut device = self.alloc_zeros::<T>(name, capacity);
        if capturing {
            // The recording is discarded; the cache keeps nothing it did not fill.
            cache.capture_missed = true;
            return Arc::new(device);
        }
        if !data.is_empty() {
            let mut view = device.slice_mut(0..data.len());
            if let Err(e) = self.stream.memcpy_htod(data, &mut view) {
                device_failure(name, e);
            }
        }
        let device = Arc::new(device);
        cache.generation += 1;
        cache.tables.insert(
            name,
            Box::new(Table {
                host: data.to_vec(),
                device: device.clone(),
                capacity,
            }),
        );
        device
    }
}
