//! libFuzzer entry of the `detokenizer` target; the body is deltaserve_fuzz_targets::detokenizer.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| deltaserve_fuzz_targets::detokenizer::run(data));
