//! The bundled demo model (models/demo, a trained 12M-parameter Qwen3.5-architecture model with an
//! MTP head) is the default model: `--model-path demo`. A binary built from a clone reads it from the
//! clone; an installed binary carries the files inside itself and unpacks them once into the user's
//! cache directory.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The `--model-path` value that names the bundled demo model.
pub const DEMO_MODEL_NAME: &str = "demo";

#[cfg(feature = "bundled-demo")]
macro_rules! bundled {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_bytes!(concat!("../models/demo/", $name)) as &[u8])),*]
    };
}

#[cfg(feature = "bundled-demo")]
const FILES: &[(&str, &[u8])] = bundled!(
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "deltaserve_canary.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
);

/// Built without the `bundled-demo` feature: the demo model must be found on disk.
#[cfg(not(feature = "bundled-demo"))]
const FILES: &[(&str, &[u8])] = &[];

/// FNV-1a over every bundled file, naming the unpacked copy so a new binary never reads an old one.
fn content_hash() -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (name, bytes) in FILES {
        for &b in name.as_bytes().iter().chain(bytes.iter()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir).join("deltaserve"));
    }
    let home = std::env::var_os("HOME").context(
        "neither XDG_CACHE_HOME nor HOME is set: cannot unpack the demo model; pass --model-path",
    )?;
    Ok(PathBuf::from(home).join(".cache/deltaserve"))
}

/// The demo model's directory: the clone's models/demo when this binary was built from a clone that
/// still holds it unchanged, else the unpacked copy (made on first use).
pub fn demo_model_dir() -> Result<PathBuf> {
    let clone = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/demo");
    let clone_matches = FILES.iter().all(|(name, bytes)| {
        std::fs::metadata(clone.join(name)).is_ok_and(|m| m.len() == bytes.len() as u64)
    });
    if clone_matches && !FILES.is_empty() {
        return Ok(clone);
    }
    if FILES.is_empty() {
        // No bundled copy: the clone's, or one in the working directory.
        let here = Path::new("models/demo");
        return [clone, here.to_path_buf()]
            .into_iter()
            .find(|d| d.join("config.json").is_file())
            .context("this binary was built without the bundled demo model (feature `bundled-demo`) and models/demo is not here; pass --model-path");
    }
    let dir = cache_root()?.join(format!("demo-{:016x}", content_hash()));
    let done = dir.join(".unpacked");
    if done.is_file() {
        return Ok(dir);
    }
    let partial = dir.with_extension(format!("partial-{}", std::process::id()));
    std::fs::create_dir_all(&partial).with_context(|| format!("creating {}", partial.display()))?;
    for (name, bytes) in FILES {
        std::fs::write(partial.join(name), bytes)
            .with_context(|| format!("unpacking the demo model into {}", partial.display()))?;
    }
    std::fs::write(partial.join(".unpacked"), b"")
        .with_context(|| format!("writing {}", partial.display()))?;
    // Another process may have unpacked it meanwhile; either copy is complete and identical.
    if std::fs::rename(&partial, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&partial);
    }
    Ok(dir)
}

/// Resolves a `--model-path` (or `--tokenizer-path`, named by `flag`) value: `demo` (when no such
/// directory exists here) is the bundled model; anything else must be a directory, said before any
/// file in it is looked for (so `/nope` is "no such directory", not "no config.json in /nope").
pub fn resolve_model_path(flag: &str, path: &Path) -> Result<PathBuf> {
    if path == Path::new(DEMO_MODEL_NAME) && !path.exists() {
        return demo_model_dir();
    }
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Ok(path.to_path_buf()),
        Ok(_) => anyhow::bail!("{flag} {}: not a directory", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            anyhow::bail!("{flag} {}: no such directory", path.display())
        }
        Err(e) => anyhow::bail!("{flag} {}: {e}", path.display()),
    }
}
