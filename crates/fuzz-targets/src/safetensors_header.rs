//! Fuzz target: arbitrary bytes as a safetensors file through the checkpoint loader's header checks
//! (`deltaserve_model::safetensors::check_file_bytes`): huge sizes, overlapping or reversed offsets,
//! unknown dtypes and broken JSON must be errors, never panics or huge allocations.

use std::path::Path;

use deltaserve_model::safetensors::check_file_bytes;
use serde_json::Value;

pub fn run(data: &[u8]) {
    let Ok(tensors) = check_file_bytes(data, Path::new("fuzz.safetensors")) else {
        return;
    };
    // An accepted file, re-read independently: the length prefix fits, the header is a JSON object
    // with one entry per tensor besides `__metadata__`, and every tensor's bytes lie in the data section.
    let prefix: [u8; 8] = data
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_else(|| panic!("a {}-byte file was accepted", data.len()));
    let header_len = usize::try_from(u64::from_le_bytes(prefix))
        .ok()
        .filter(|&n| n <= data.len() - 8)
        .unwrap_or_else(|| panic!("accepted header length {prefix:?} runs past the file"));
    let data_len = data.len() - 8 - header_len;
    let header: Value = serde_json::from_slice(&data[8..8 + header_len])
        .unwrap_or_else(|e| panic!("an accepted header is not JSON: {e}"));
    let entries = header
        .as_object()
        .unwrap_or_else(|| panic!("an accepted header is not an object"));
    let mut count = 0;
    for (name, entry) in entries {
        if name == "__metadata__" {
            continue;
        }
        count += 1;
        let end = entry
            .pointer("/data_offsets/1")
            .and_then(Value::as_u64)
            .unwrap_or_else(|| panic!("accepted tensor `{name}` has no end offset"));
        assert!(
            end <= data_len as u64,
            "accepted tensor `{name}` ends at {end}, past the {data_len}-byte data section"
        );
    }
    assert_eq!(
        count, tensors,
        "tensor count differs from the header's entries"
    );
}
