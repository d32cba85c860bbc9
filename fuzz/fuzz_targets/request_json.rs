//! libFuzzer entry of the `request_json` target; the body is deltaserve_fuzz_targets::request_json.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deltaserve_fuzz_targets::request_json::run(data));
