//! libFuzzer entry of the `safetensors_header` target; the body is deltaserve_fuzz_targets::safetensors_header.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deltaserve_fuzz_targets::safetensors_header::run(data));
