//! Helpers of the doctor tests: the golden fixtures, loaded on any backend.
#![allow(dead_code)]

use deltaserve_model::config::ModelConfig;
use deltaserve_model::safetensors::SafetensorsSource;
use deltaserve_model::weights::Weights;
use deltaserve_model::Model;
use deltaserve_tensor::Backend;
use std::path::{Path, PathBuf};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures")
        .join(name)
}

pub fn load<B: Backend>(backend: B, dir: &Path) -> Model<B> {
    let config = ModelConfig::from_dir(dir).unwrap();
    let source = SafetensorsSource::open(dir).unwrap();
    let weights = Weights::load(&backend, &config, &source, true, &mut |_, _| {}).unwrap();
    Model::new(config, backend, weights)
}
