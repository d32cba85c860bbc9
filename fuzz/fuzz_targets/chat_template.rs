//! libFuzzer entry of the `chat_template` target; the body is deltaserve_fuzz_targets::chat_template.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: {
        // `ChatTemplate::render` catches panics of the template engine and returns an error
        // (chat_template.rs), so panics must unwind to it: put back the default hook in place of
        // libfuzzer-sys's aborting one. A panic that escapes `run` still aborts (libfuzzer-sys catches
        // it around every input).
        drop(std::panic::take_hook());
    },
    |data: &[u8]| deltaserve_fuzz_targets::chat_template::run(data)
);
