//! libFuzzer entry of the `reasoning_tool_stream` target; the body is deltaserve_fuzz_targets::reasoning_tool_stream.
#![no_main]

libfuzzer_sys::fuzz_target!(
    |data: &[u8]| deltaserve_fuzz_targets::reasoning_tool_stream::run(data)
);
