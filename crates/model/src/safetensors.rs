//! `SafetensorsSource`: a checkpoint directory of memory-mapped `.safetensors` files (single, sharded
//! through `model.safetensors.index.json`, or several without an index). Headers are parsed and
//! checked here, defensively; tensors are zero-copy views into the maps. No model knowledge here.
//! Block-FP8 weights (a weight with a `<name>_scale_inv` companion, block size from config.json's
//! `quantization_config`) are dequantized exactly to f32 as they are read; see block_fp8.rs.

use crate::block_fp8;
use crate::config::quantization_from_dir;
use crate::error::LoadError;
use crate::quantization::Fp8Quantization;
use crate::source::{checkpoint_names, TensorSource};
use deltaserve_tensor::{BlockFp8Matrix, ByteOwner, DType, HostTensor};
use memmap2::Mmap;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// A block-FP8 weight `W` comes with its scales as `W_scale_inv` (`x.weight` -> `x.weight_scale_inv`,
/// packed experts `x.experts.gate_up_proj` -> `x.experts.gate_up_proj_scale_inv`).
const FP8_SCALE_SUFFIX: &str = "_scale_inv";
/// The safetensors dtype of float8_e4m3fn.
const FP8_E4M3: &str = "F8_E4M3";

/// Same limit as the reference safetensors implementation: real headers are a few MB at most.
const MAX_HEADER_BYTES: u64 = 100_000_000;
/// An index file is a name -> file map; anything this large is not one.
const MAX_INDEX_BYTES: u64 = 64 << 20;

const INDEX_FILE: &str = "model.safetensors.index.json";
const SINGLE_FILE: &str = "model.safetensors";

/// A memory map that tensors can borrow their bytes from.
struct MappedFile(Mmap);

impl ByteOwner for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.0
    }
}

/// The header's `dtype`: one we can decode, or another (possibly unknown) one that is only an
/// error if such a tensor is requested (checkpoints can hold e.g. integer buffers we never read).
#[derive(Clone, Debug, PartialEq)]
enum StoredDtype {
    Supported(DType),
    Other(String),
}

/// Bits per element of the dtypes the safetensors format defines, or None for unknown names.
fn dtype_bits(name: &str) -> Option<u64> {
    Some(match name {
        "BOOL" | "U8" | "I8" | "F8_E5M2" | "F8_E4M3" | "F8_E8M0" => 8,
        "I16" | "U16" | "F16" | "BF16" => 16,
        "I32" | "U32" | "F32" => 32,
        "I64" | "U64" | "F64" | "C64" => 64,
        "F4" => 4,
        "F6_E2M3" | "F6_E3M2" => 6,
        _ => return None,
    })
}

#[derive(Clone, Debug)]
struct TensorEntry {
    dtype: StoredDtype,
    shape: Vec<usize>,
    /// Absolute byte range in the file.
    start: usize,
    end: usize,
}

/// One memory-mapped safetensors file with its parsed header.
struct SafetensorsFile {
    path: PathBuf,
    owner: Arc<dyn ByteOwner>,
    tensors: HashMap<String, TensorEntry>,
}

impl SafetensorsFile {
    /// Opens `real` (the resolved file); `path` is the name used in messages.
    fn open(path: &Path, real: &Path) -> Result<Self, LoadError> {
        let file = File::open(real).map_err(|e| LoadError::io(path, e))?;
        let len = file.metadata().map_err(|e| LoadError::io(path, e))?.len();
        if len < 8 {
            return Err(LoadError::format(
                path,
                format!("file is {len} bytes long, too short for the 8-byte header length"),
            ));
        }
        // SAFETY: the map is read-only and we never create mutable references into it. The one
        // hazard is another process truncating or rewriting the file while it is mapped, which
        // memory-mapped checkpoint loading accepts everywhere (a truncation raises SIGBUS).
        let map = unsafe { Mmap::map(&file) }.map_err(|e| LoadError::io(path, e))?;
        let tensors = parse_header(&map, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            owner: Arc::new(MappedFile(map)),
            tensors,
        })
    }

    /// The tensor stored as `key`, checked against `shape`.
    fn tensor(&self, key: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        let Some(entry) = self.tensors.get(key) else {
            return Err(LoadError::format(
                &self.path,
                format!("no tensor `{key}` in this file"),
            ));
        };
        let dtype = match &entry.dtype {
            StoredDtype::Supported(d) => *d,
            StoredDtype::Other(name) if name.starts_with("F8_") => {
                return Err(LoadError::format(
                    &self.path,
                    format!("tensor `{key}` is stored as {name} without block scales (`{key}{FP8_SCALE_SUFFIX}`): only block-scaled {FP8_E4M3} weights are supported"),
                ))
            }
            StoredDtype::Other(name) => {
                return Err(LoadError::UnsupportedDtype {
                    tensor: key.to_string(),
                    file: self.path.clone(),
                    dtype: name.clone(),
                })
            }
        };
        if entry.shape != shape {
            return Err(LoadError::ShapeMismatch {
                tensor: key.to_string(),
                file: self.path.clone(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        HostTensor::from_owner(
            key,
            dtype,
            entry.shape.clone(),
            self.owner.clone(),
            entry.start,
            entry.end,
        )
        .map_err(|e| LoadError::DataOutOfRange {
            tensor: key.to_string(),
            file: self.path.clone(),
            message: e.to_string(),
        })
    }
}

impl SafetensorsFile {
    /// The FP8 weight stored as `key` (checked against `shape`, whose last two dims are the
    /// `[out, in]` matrix and any leading ones stack matrices, e.g. packed experts), dequantized
    /// to f32 with `scales` from `scale_file`.
    fn fp8_tensor(
        &self,
        key: &str,
        shape: &[usize],
        scale_key: &str,
        scale_file: &SafetensorsFile,
        scheme: &Fp8Quantization,
    ) -> Result<HostTensor, LoadError> {
        let entry = &self.tensors[key];
        let stored = match &entry.dtype {
            StoredDtype::Supported(d) => d.to_string().to_uppercase(),
            StoredDtype::Other(name) => name.clone(),
        };
        if stored != FP8_E4M3 {
            return Err(LoadError::format(
                &self.path,
                format!("tensor `{key}` has block scales `{scale_key}` but is stored as {stored}; block-FP8 weights must be {FP8_E4M3} (float8_e4m3fn; e5m2 is not supported)"),
            ));
        }
        if entry.shape != shape {
            return Err(LoadError::ShapeMismatch {
                tensor: key.to_string(),
                file: self.path.clone(),
                expected: shape.to_vec(),
                found: entry.shape.clone(),
            });
        }
        let [.., rows, cols] = *shape else {
            return Err(LoadError::format(
                &self.path,
                format!("tensor `{key}` of shape {shape:?} has block scales, but only matrices (or stacks of them) are block-FP8"),
            ));
        };
        let stacked = &shape[..shape.len() - 2];
        let grid = block_fp8::scale_grid(rows, cols, scheme.block);
        let scale_shape: Vec<usize> = stacked.iter().copied().chain(grid).collect();
        let scales = scale_file.tensor(scale_key, &scale_shape)?.to_f32_vec();
        let codes = &self.owner.bytes()[entry.start..entry.end];
        let matrices = stacked.iter().product();
        let values = block_fp8::dequantize(codes, &scales, matrices, [rows, cols], scheme.block);
        let stored = BlockFp8Matrix {
            codes: codes.to_vec(),
            scales,
            block: scheme.block,
        };
        Ok(HostTensor::from_f32(key, shape.to_vec(), &values).with_block_fp8(stored))
    }
}

/// Validates a whole safetensors file held in `bytes` with the checks the loader runs on every file
/// it opens (see `parse_header`) and returns its number of tensors; `path` only names the file in
/// errors. For checking files without a checkpoint directory (the fuzz targets do).
pub fn check_file_bytes(bytes: &[u8], path: &Path) -> Result<usize, LoadError> {
    parse_header(bytes, path).map(|tensors| tensors.len())
}

/// Parses and validates the header of a whole safetensors file held in `bytes`: the 8-byte
/// little-endian header length, the JSON header, and every tensor's dtype, shape and byte range
/// (inside the data section, matching the shape, not overlapping another tensor).
fn parse_header(bytes: &[u8], path: &Path) -> Result<HashMap<String, TensorEntry>, LoadError> {
    let Some(len_bytes) = bytes.first_chunk::<8>() else {
        return Err(LoadError::format(
            path,
            format!(
                "file is {} bytes long, too short for the 8-byte header length",
                bytes.len()
            ),
        ));
    };
    let header_len = u64::from_le_bytes(*len_bytes);
    let after_len = (bytes.len() - 8) as u64;
    if header_len > MAX_HEADER_BYTES {
        return Err(LoadError::format(
            path,
            format!("header length {header_len} is larger than the {MAX_HEADER_BYTES}-byte limit (not a safetensors file?)"),
        ));
    }
    if header_len > after_len {
        return Err(LoadError::format(
            path,
            format!("header length {header_len} runs past the end of the file ({after_len} bytes follow it; truncated file?)"),
        ));
    }
    // Both fit in usize: header_len <= bytes.len() - 8.
    let data_start = 8 + header_len as usize;
    let header: Value = serde_json::from_slice(&bytes[8..data_start])
        .map_err(|e| LoadError::format(path, format!("header is not valid JSON: {e}")))?;
    let Value::Object(entries) = header else {
        return Err(LoadError::format(path, "header is not a JSON object"));
    };
    let data_len = bytes.len() - data_start;

    let mut tensors = HashMap::with_capacity(entries.len());
    for (name, value) in &entries {
        if name == "__metadata__" {
            continue;
        }
        let entry = parse_entry(name, value, data_start, data_len, path)?;
        tensors.insert(name.clone(), entry);
    }
    check_no_overlap(&tensors, data_start, path)?;
    Ok(tensors)
}

fn parse_entry(
    name: &str,
    value: &Value,
    data_start: usize,
    data_len: usize,
    path: &Path,
) -> Result<TensorEntry, LoadError> {
    let bad = |message: String| LoadError::format(path, format!("tensor `{name}`: {message}"));
    let Value::Object(fields) = value else {
        return Err(bad("header entry is not an object".into()));
    };
    let dtype_name = fields
        .get("dtype")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("`dtype` is missing or not a string".into()))?;
    let shape = fields
        .get("shape")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`shape` is missing or not a list".into()))?
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()))
        .collect::<Option<Vec<usize>>>()
        .ok_or_else(|| bad("`shape` holds something other than non-negative integers".into()))?;
    let offsets = fields
        .get("data_offsets")
        .and_then(Value::as_array)
        .filter(|o| o.len() == 2)
        .ok_or_else(|| bad("`data_offsets` is missing or not a pair".into()))?;
    let (Some(begin), Some(end)) = (offsets[0].as_u64(), offsets[1].as_u64()) else {
        return Err(bad(
            "`data_offsets` holds something other than non-negative integers".into(),
        ));
    };
    if begin > end {
        return Err(bad(format!("data_offsets [{begin}, {end}] are reversed")));
    }
    if end > data_len as u64 {
        return Err(LoadError::DataOutOfRange {
            tensor: name.to_string(),
            file: path.to_path_buf(),
            message: format!(
                "data_offsets [{begin}, {end}] run past the {data_len}-byte data section (truncated file?)"
            ),
        });
    }
    // Both fit in usize: end <= data_len.
    let (begin, end) = (begin as usize, end as usize);

    let dtype = match DType::parse(dtype_name) {
        // `DType::parse` also accepts config spellings ("bfloat16"); headers use upper case only.
        Some(d)
            if dtype_name
                .chars()
                .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()) =>
        {
            StoredDtype::Supported(d)
        }
        _ => StoredDtype::Other(dtype_name.to_string()),
    };
    if let Some(bits) = dtype_bits(dtype_name) {
        let numel = shape
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| bad(format!("shape {shape:?} has too many elements")))?;
        let needed_bits = numel
            .checked_mul(bits)
            .ok_or_else(|| bad(format!("shape {shape:?} has too many elements")))?;
        let span = (end - begin) as u64;
        if needed_bits % 8 != 0 || needed_bits / 8 != span {
            return Err(bad(format!(
                "shape {shape:?} of {dtype_name} needs {needed_bits} bits but data_offsets [{begin}, {end}] span {span} bytes"
            )));
        }
    }
    Ok(TensorEntry {
        dtype,
        shape,
        start: data_start + begin,
        end: data_start + end,
    })
}

/// Tensors must not share bytes (an empty tensor shares none).
fn check_no_overlap(
    tensors: &HashMap<String, TensorEntry>,
    data_start: usize,
    path: &Path,
) -> Result<(), LoadError> {
    let mut ranges: Vec<(usize, usize, &str)> = tensors
        .iter()
        .filter(|(_, e)| e.end > e.start)
        .map(|(n, e)| (e.start, e.end, n.as_str()))
        .collect();
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.0 < a.1 {
            return Err(LoadError::format(
                path,
                format!(
                    "tensors `{}` (data_offsets [{}, {}]) and `{}` (data_offsets [{}, {}]) overlap",
                    a.2,
                    a.0 - data_start,
                    a.1 - data_start,
                    b.2,
                    b.0 - data_start,
                    b.1 - data_start
                ),
            ));
        }
    }
    Ok(())
}

/// A checkpoint directory of safetensors files.
pub struct SafetensorsSource {
    dir: PathBuf,
    files: Vec<SafetensorsFile>,
    /// Stored tensor name -> index into `files`.
    location: HashMap<String, usize>,
    /// The block-FP8 scheme of config.json, read when the checkpoint holds FP8 scales.
    fp8: Option<Fp8Quantization>,
}

impl SafetensorsSource {
    /// Opens `dir/model.safetensors.index.json` (sharded), else `dir/model.safetensors`, else every
    /// `*.safetensors` file in `dir`. All headers are read and validated now; data stays mapped.
    /// When any tensor is a block-FP8 scale (`*_scale_inv`), `dir/config.json` must describe the
    /// scheme in `quantization_config`.
    pub fn open(dir: &Path) -> Result<Self, LoadError> {
        let mut source = Self::open_files(dir)?;
        let mut scales: Vec<&String> = source
            .location
            .keys()
            .filter(|k| k.ends_with(FP8_SCALE_SUFFIX))
            .collect();
        scales.sort();
        if let Some(first) = scales.first() {
            let scheme = quantization_from_dir(dir)?.ok_or_else(|| {
                LoadError::format(
                    dir.join("config.json"),
                    format!("the checkpoint holds block-FP8 scales (`{first}`, {} in all) but config.json has no `quantization_config`", scales.len()),
                )
            })?;
            source.fp8 = Some(scheme);
        }
        Ok(source)
    }

    fn open_files(dir: &Path) -> Result<Self, LoadError> {
        let meta = std::fs::metadata(dir).map_err(|e| LoadError::io(dir, e))?;
        if !meta.is_dir() {
            return Err(LoadError::format(
                dir,
                "expected a checkpoint directory (with config.json and *.safetensors)",
            ));
        }
        let roots = AllowedRoots::of(dir)?;
        let index_path = dir.join(INDEX_FILE);
        if index_path.exists() {
            return Self::open_indexed(dir, &index_path, &roots);
        }
        let single = dir.join(SINGLE_FILE);
        let names: Vec<String> = if single.exists() {
            vec![SINGLE_FILE.to_string()]
        } else {
            let mut names = Vec::new();
            for entry in std::fs::read_dir(dir).map_err(|e| LoadError::io(dir, e))? {
                let entry = entry.map_err(|e| LoadError::io(dir, e))?;
                if let Some(name) = entry.file_name().to_str() {
                    if name.ends_with(".safetensors") {
                        names.push(name.to_string());
                    }
                }
            }
            names.sort();
            names
        };
        if names.is_empty() {
            return Err(LoadError::format(
                dir,
                format!(
                    "no {INDEX_FILE}, {SINGLE_FILE} or other *.safetensors file in this directory"
                ),
            ));
        }
        let mut files = Vec::with_capacity(names.len());
        let mut location = HashMap::new();
        for name in &names {
            let (path, real) = roots.resolve(dir, name, dir)?;
            let file = SafetensorsFile::open(&path, &real)?;
            let idx = files.len();
            for tensor in file.tensors.keys() {
                if let Some(&other) = location.get(tensor) {
                    let other: &SafetensorsFile = &files[other];
                    return Err(LoadError::format(
                        &path,
                        format!(
                            "tensor `{tensor}` is also in {} (several files without an index must not repeat tensors)",
                            other.path.display()
                        ),
                    ));
                }
                location.insert(tensor.clone(), idx);
            }
            files.push(file);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            location,
            fp8: None,
        })
    }

    fn open_indexed(
        dir: &Path,
        index_path: &Path,
        roots: &AllowedRoots,
    ) -> Result<Self, LoadError> {
        let len = std::fs::metadata(index_path)
            .map_err(|e| LoadError::io(index_path, e))?
            .len();
        if len > MAX_INDEX_BYTES {
            return Err(LoadError::format(
                index_path,
                format!("index is {len} bytes, more than the {MAX_INDEX_BYTES}-byte limit"),
            ));
        }
        let text = std::fs::read_to_string(index_path).map_err(|e| LoadError::io(index_path, e))?;
        let index: Value = serde_json::from_str(&text)
            .map_err(|e| LoadError::format(index_path, format!("not valid JSON: {e}")))?;
        let weight_map = index
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| {
                LoadError::format(index_path, "`weight_map` is missing or not an object")
            })?;

        // Shard file name -> tensors the index puts there (BTreeMap: open shards in name order).
        let mut shards: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (tensor, file) in weight_map {
            let file = file.as_str().ok_or_else(|| {
                LoadError::format(
                    index_path,
                    format!("weight_map[`{tensor}`] is not a file name string"),
                )
            })?;
            shards.entry(file).or_default().push(tensor);
        }
        if shards.is_empty() {
            return Err(LoadError::format(index_path, "`weight_map` is empty"));
        }

        let mut files = Vec::with_capacity(shards.len());
        let mut location = HashMap::with_capacity(weight_map.len());
        for (name, tensors) in shards {
            let (path, real) = roots.resolve(dir, name, index_path)?;
            let file = SafetensorsFile::open(&path, &real)?;
            for tensor in tensors {
                if !file.tensors.contains_key(tensor) {
                    return Err(LoadError::format(
                        index_path,
                        format!("weight_map puts `{tensor}` in {name}, but that file has no such tensor"),
                    ));
                }
                location.insert(tensor.to_string(), files.len());
            }
            files.push(file);
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            files,
            location,
            fp8: None,
        })
    }

    /// The stored name and file of the first checkpoint name `canonical` maps to.
    fn locate(&self, canonical: &str) -> Option<(String, &SafetensorsFile)> {
        checkpoint_names(canonical)
            .into_iter()
            .find_map(|key| self.location.get(&key).map(|&i| (key, &self.files[i])))
    }

    /// Number of tensors in the checkpoint (all of them, vision tower included).
    pub fn len(&self) -> usize {
        self.location.len()
    }

    pub fn is_empty(&self) -> bool {
        self.location.is_empty()
    }
}

impl TensorSource for SafetensorsSource {
    /// The returned tensor is named as stored in the checkpoint (e.g. with `model.language_model.`).
    /// A block-FP8 weight comes back dequantized, as an f32 tensor.
    fn get(&self, name: &str, shape: &[usize]) -> Result<HostTensor, LoadError> {
        match self.locate(name) {
            Some((key, file)) => {
                let scale_key = format!("{key}{FP8_SCALE_SUFFIX}");
                match (self.location.get(&scale_key), &self.fp8) {
                    (Some(&i), Some(scheme)) => {
                        file.fp8_tensor(&key, shape, &scale_key, &self.files[i], scheme)
                    }
                    _ => file.tensor(&key, shape),
                }
            }
            None => Err(LoadError::MissingTensor {
                name: name.to_string(),
                looked_in: self.describe(),
                tried: checkpoint_names(name),
            }),
        }
    }

    fn contains(&self, name: &str) -> bool {
        self.locate(name).is_some()
    }

    fn describe(&self) -> String {
        format!("safetensors checkpoint {}", self.dir.display())
    }
}

/// Where checkpoint files may live: inside the directory, plus the sibling `blobs/` store when the
/// directory is a Hugging Face cache snapshot (`<repo>/snapshots/<rev>/x -> ../../blobs/<hash>`).
struct AllowedRoots(Vec<PathBuf>);

impl AllowedRoots {
    fn of(dir: &Path) -> Result<Self, LoadError> {
        let canonical = dir.canonicalize().map_err(|e| LoadError::io(dir, e))?;
        let mut roots = vec![canonical.clone()];
        if let Some(snapshots) = canonical.parent() {
            if snapshots.file_name().is_some_and(|n| n == "snapshots") {
                if let Some(repo) = snapshots.parent() {
                    roots.push(repo.join("blobs"));
                }
            }
        }
        Ok(Self(roots))
    }

    /// `dir/name`, provided `name` is a plain relative path and the file it resolves to (following
    /// symlinks) lies under an allowed root. Returns `(dir/name, resolved path)`; the resolved one
    /// is what gets opened, so the file checked is the file read. `origin` is the file that named
    /// it, for messages.
    fn resolve(
        &self,
        dir: &Path,
        name: &str,
        origin: &Path,
    ) -> Result<(PathBuf, PathBuf), LoadError> {
        let plain = !name.is_empty()
            && Path::new(name)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !plain {
            return Err(LoadError::format(
                origin,
                format!("shard file name `{name}` must be a plain relative path inside the checkpoint directory (no absolute paths, `.` or `..`)"),
            ));
        }
        let path = dir.join(name);
        let resolved = path.canonicalize().map_err(|e| LoadError::io(&path, e))?;
        if !self.0.iter().any(|root| resolved.starts_with(root)) {
            return Err(LoadError::format(
                origin,
                format!(
                    "shard `{name}` resolves to {}, outside the checkpoint directory",
                    resolved.display()
                ),
            ));
        }
        if !resolved.is_file() {
            return Err(LoadError::format(
                origin,
                format!("shard `{name}` is not a regular file"),
            ));
        }
        Ok((path, resolved))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }
    fn bf16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    }
    fn f16_bytes(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|&x| half::f16::from_f32(x).to_bits().to_le_bytes())
            .collect()
    }

    /// A well-formed safetensors file: tensors laid out back to back, header padded to 8 bytes.
    fn st_bytes(tensors: &[(&str, &str, &[usize], Vec<u8>)]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        let mut text = Value::Object(header).to_string().into_bytes();
        while !text.len().is_multiple_of(8) {
            text.push(b' ');
        }
        raw_file_with_len(text.len() as u64, &text, &data)
    }

    /// A file with the given header text (its true length) and data section.
    fn raw_file(header: &str, data: &[u8]) -> Vec<u8> {
        raw_file_with_len(header.len() as u64, header.as_bytes(), data)
    }

    fn raw_file_with_len(header_len: u64, header: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = header_len.to_le_bytes().to_vec();
        out.extend_from_slice(header);
        out.extend_from_slice(data);
        out
    }

    fn dir_with(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        dir
    }

    fn open_err(files: &[(&str, Vec<u8>)]) -> LoadError {
        let dir = dir_with(files);
        match SafetensorsSource::open(dir.path()) {
            Ok(_) => panic!("opened a bad checkpoint"),
            Err(e) => e,
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// Written by the Python `safetensors` 0.8.0 library (`safetensors.torch.save`) from
    /// embed [[1.5, -2.0], [0.15625, 0.003]] bf16, norm [0.5, -1.25, 65504] f16,
    /// lm_head [[1e-8, -7.25]] f32, and an I64 tensor `model.visual.pos` = [1, 2].
    const PYTHON_WRITTEN: &str = "68010000000000007b225f5f6d657461646174615f5f223a7b22666f726d6174223a227074227d2c226d6f64656c2e76697375616c2e706f73223a7b226474797065223a22493634222c227368617065223a5b325d2c22646174615f6f666673657473223a5b302c31365d7d2c226c6d5f686561642e776569676874223a7b226474797065223a22463332222c227368617065223a5b312c325d2c22646174615f6f666673657473223a5b31362c32345d7d2c226d6f64656c2e6c616e67756167655f6d6f64656c2e656d6265645f746f6b656e732e776569676874223a7b226474797065223a2242463136222c227368617065223a5b322c325d2c22646174615f6f666673657473223a5b32342c33325d7d2c226d6f64656c2e6c616e67756167655f6d6f64656c2e6e6f726d2e776569676874223a7b226474797065223a22463136222c227368617065223a5b335d2c22646174615f6f666673657473223a5b33322c33385d7d7d2020202020200100000000000000020000000000000077cc2b320000e8c0c03f00c0203e453b003800bdff7b";

    #[test]
    fn reads_file_written_by_python_safetensors() {
        let dir = dir_with(&[("model.safetensors", hex(PYTHON_WRITTEN))]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert_eq!(src.len(), 4);
        let embed = src.get("embed_tokens.weight", &[2, 2]).unwrap();
        assert_eq!(embed.dtype, DType::BF16);
        assert_eq!(embed.name, "model.language_model.embed_tokens.weight");
        assert_eq!(
            embed.to_f32_vec(),
            vec![1.5, -2.0, 0.15625, f32::from_bits(0x3B45_0000)]
        );
        let norm = src.get("norm.weight", &[3]).unwrap();
        assert_eq!(norm.dtype, DType::F16);
        assert_eq!(norm.to_f32_vec(), vec![0.5, -1.25, 65504.0]);
        let head = src.get("lm_head.weight", &[1, 2]).unwrap();
        assert_eq!(head.dtype, DType::F32);
        assert_eq!(head.to_f32_vec(), vec![1e-8, -7.25]);
        // An integer tensor is fine to have, and an error only when requested.
        let err = src.get("visual.pos", &[2]).unwrap_err();
        assert!(
            matches!(&err, LoadError::UnsupportedDtype { tensor, dtype, .. } if tensor == "model.visual.pos" && dtype == "I64"),
            "{err}"
        );
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }

    #[test]
    fn dtypes_and_name_mapping() {
        let file = st_bytes(&[
            (
                "model.language_model.layers.0.mlp.up_proj.weight",
                "BF16",
                &[2, 3],
                bf16_bytes(&[1.0, -0.5, 0.25, 3.0, 1024.0, -0.0078125]),
            ),
            (
                "model.layers.1.linear_attn.A_log",
                "F32",
                &[2],
                f32_bytes(&[0.1, -2.5]),
            ),
            (
                "layers.2.self_attn.q_norm.weight",
                "F16",
                &[4],
                f16_bytes(&[0.5, 2.0, -3.0, 0.0]),
            ),
            ("lm_head.weight", "F32", &[1, 1], f32_bytes(&[9.0])),
            ("mtp.fc.weight", "BF16", &[1, 2], bf16_bytes(&[1.0, 2.0])),
            ("model.mtp.norm.weight", "F32", &[1], f32_bytes(&[4.0])),
            ("empty", "F32", &[0], vec![]),
        ]);
        let dir = dir_with(&[("model.safetensors", file)]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        let t = src.get("layers.0.mlp.up_proj.weight", &[2, 3]).unwrap();
        assert_eq!(
            t.to_f32_vec(),
            vec![1.0, -0.5, 0.25, 3.0, 1024.0, -0.0078125]
        );
        assert_eq!(
            src.get("layers.1.linear_attn.A_log", &[2])
                .unwrap()
                .to_f32_vec(),
            vec![0.1, -2.5]
        );
        assert_eq!(
            src.get("layers.2.self_attn.q_norm.weight", &[4])
                .unwrap()
                .to_f32_vec(),
            vec![0.5, 2.0, -3.0, 0.0]
        );
        assert_eq!(
            src.get("lm_head.weight", &[1, 1]).unwrap().to_f32_vec(),
            vec![9.0]
        );
        assert_eq!(
            src.get("mtp.fc.weight", &[1, 2]).unwrap().to_f32_vec(),
            vec![1.0, 2.0]
        );
        assert_eq!(
            src.get("mtp.norm.weight", &[1]).unwrap().to_f32_vec(),
            vec![4.0]
        );
        assert_eq!(src.get("empty", &[0]).unwrap().numel(), 0);
        assert!(src.contains("layers.1.linear_attn.A_log"));
        assert!(src.contains("mtp.norm.weight"));
        // `lm_head` and `mtp.*` are not looked up under the trunk prefixes and vice versa.
        assert!(!src.contains("fc.weight"));
        assert!(!src.contains("layers.0.mlp.down_proj.weight"));
        assert!(src.describe().contains(&dir.path().display().to_string()));
    }

    #[test]
    fn trunk_prefix_preference() {
        // When both spellings exist, `model.language_model.` wins over `model.`.
        let file = st_bytes(&[
            ("model.norm.weight", "F32", &[1], f32_bytes(&[1.0])),
            (
                "model.language_model.norm.weight",
                "F32",
                &[1],
                f32_bytes(&[2.0]),
            ),
        ]);
        let dir = dir_with(&[("model.safetensors", file)]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert_eq!(
            src.get("norm.weight", &[1]).unwrap().to_f32_vec(),
            vec![2.0]
        );
    }

    fn two_shards() -> Vec<(&'static str, Vec<u8>)> {
        vec![
            (
                "model-00001-of-00002.safetensors",
                st_bytes(&[(
                    "model.embed_tokens.weight",
                    "F32",
                    &[2, 2],
                    f32_bytes(&[1.0, 2.0, 3.0, 4.0]),
                )]),
            ),
            (
                "model-00002-of-00002.safetensors",
                st_bytes(&[
                    ("model.norm.weight", "BF16", &[2], bf16_bytes(&[0.5, 0.25])),
                    ("lm_head.weight", "F16", &[1, 2], f16_bytes(&[-1.0, 8.0])),
                ]),
            ),
        ]
    }

    fn index_json(entries: &[(&str, &str)]) -> Vec<u8> {
        let map: serde_json::Map<String, Value> = entries
            .iter()
            .map(|(t, f)| (t.to_string(), Value::String(f.to_string())))
            .collect();
        serde_json::json!({"metadata": {"total_size": 20}, "weight_map": map})
            .to_string()
            .into_bytes()
    }

    const FP8_CONFIG: &str = r#"{"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}}"#;

    /// A `[rows, cols]` FP8 weight whose code at (r, c) is `(r + 3c) % 126` (never NaN) and
    /// whose tile (i, j) has scale `2^(i - j) * 1.5`.
    fn fp8_weight(rows: usize, cols: usize) -> (Vec<u8>, Vec<f32>) {
        let codes = (0..rows * cols)
            .map(|i| ((i / cols + 3 * (i % cols)) % 126) as u8)
            .collect();
        let [gr, gc] = block_fp8::scale_grid(rows, cols, [128, 128]);
        let scales = (0..gr * gc)
            .map(|t| 1.5 * 2f32.powi((t / gc) as i32 - (t % gc) as i32))
            .collect();
        (codes, scales)
    }

    fn expected_dequantized(codes: &[u8], scales: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let gc = cols.div_ceil(128);
        (0..rows * cols)
            .map(|i| {
                let (r, c) = (i / cols, i % cols);
                deltaserve_tensor::e4m3::e4m3_to_f32(codes[i]) * scales[(r / 128) * gc + c / 128]
            })
            .collect()
    }

    #[test]
    fn block_fp8_weights_are_dequantized_with_scales_in_every_float_dtype() {
        // [300, 200]: a 3 x 2 grid of tiles, partial along both dimensions.
        let (rows, cols) = (300, 200);
        let (codes, scales) = fp8_weight(rows, cols);
        let want = expected_dequantized(&codes, &scales, rows, cols);
        for (dtype, scale_bytes) in [
            ("F32", f32_bytes(&scales)),
            ("BF16", bf16_bytes(&scales)),
            ("F16", f16_bytes(&scales)),
        ] {
            let dir = dir_with(&[
                ("config.json", FP8_CONFIG.as_bytes().to_vec()),
                (
                    "model.safetensors",
                    st_bytes(&[
                        (
                            "model.layers.0.mlp.up_proj.weight",
                            "F8_E4M3",
                            &[rows, cols],
                            codes.clone(),
                        ),
                        (
                            "model.layers.0.mlp.up_proj.weight_scale_inv",
                            dtype,
                            &[3, 2],
                            scale_bytes,
                        ),
                        ("model.norm.weight", "BF16", &[2], bf16_bytes(&[1.0, 2.0])),
                    ]),
                ),
            ]);
            let src = SafetensorsSource::open(dir.path()).unwrap();
            let w = src
                .get("layers.0.mlp.up_proj.weight", &[rows, cols])
                .unwrap();
            assert_eq!(w.dtype, DType::F32, "{dtype}");
            assert_eq!(w.to_f32_vec(), want, "scales in {dtype}");
            // Unquantized tensors of the same checkpoint are read as stored.
            assert_eq!(src.get("norm.weight", &[2]).unwrap().dtype, DType::BF16);
        }
    }

    #[test]
    fn packed_fp8_experts_have_one_scale_grid_per_expert() {
        let (e, rows, cols) = (3, 40, 136);
        let mut codes = Vec::new();
        let mut scales = Vec::new();
        let mut want = Vec::new();
        for i in 0..e {
            let (mut c, s) = fp8_weight(rows, cols);
            c.rotate_left(i * 7);
            let s: Vec<f32> = s.iter().map(|x| x * (i + 1) as f32).collect();
            want.extend(expected_dequantized(&c, &s, rows, cols));
            codes.extend(c);
            scales.extend(s);
        }
        let dir = dir_with(&[
            ("config.json", FP8_CONFIG.as_bytes().to_vec()),
            (
                "model.safetensors",
                st_bytes(&[
                    (
                        "model.layers.0.mlp.experts.down_proj",
                        "F8_E4M3",
                        &[e, rows, cols],
                        codes,
                    ),
                    (
                        "model.layers.0.mlp.experts.down_proj_scale_inv",
                        "F32",
                        &[e, 1, 2],
                        f32_bytes(&scales),
                    ),
                ]),
            ),
        ]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        let w = src
            .get("layers.0.mlp.experts.down_proj", &[e, rows, cols])
            .unwrap();
        assert_eq!(w.to_f32_vec(), want);
    }

    #[test]
    fn block_fp8_errors_name_the_tensor_and_the_file() {
        let (codes, scales) = fp8_weight(160, 64);
        let weight = "model.layers.0.linear_attn.in_proj_qkv.weight";
        let scale = "model.layers.0.linear_attn.in_proj_qkv.weight_scale_inv";
        let checkpoint = |weight_dtype: &str, scale_shape: &[usize], scale_values: &[f32]| {
            st_bytes(&[
                (weight, weight_dtype, &[160, 64], codes.clone()),
                (scale, "F32", scale_shape, f32_bytes(scale_values)),
            ])
        };
        let get_err = |config: &str, file: Vec<u8>| -> String {
            let dir = dir_with(&[
                ("config.json", config.as_bytes().to_vec()),
                ("model.safetensors", file),
            ]);
            let result = SafetensorsSource::open(dir.path())
                .and_then(|src| src.get("layers.0.linear_attn.in_proj_qkv.weight", &[160, 64]));
            match result {
                Ok(_) => panic!("read a bad FP8 tensor"),
                Err(e) => e.to_string(),
            }
        };

        // The scale grid of [160, 64] is [2, 1]; [1, 1] (a 160-row "block") is refused.
        let err = get_err(FP8_CONFIG, checkpoint("F8_E4M3", &[1, 1], &scales[..1]));
        assert!(
            err.contains(scale)
                && err.contains("expected shape [2, 1], found [1, 1]")
                && err.contains("model.safetensors"),
            "{err}"
        );
        // e5m2 codes.
        let err = get_err(FP8_CONFIG, checkpoint("F8_E5M2", &[2, 1], &scales));
        assert!(
            err.contains(weight) && err.contains("F8_E5M2") && err.contains("e5m2"),
            "{err}"
        );
        // Scales without a quantization_config, or without config.json at all.
        let err = get_err("{}", checkpoint("F8_E4M3", &[2, 1], &scales));
        assert!(
            err.contains("config.json")
                && err.contains(scale)
                && err.contains("quantization_config"),
            "{err}"
        );
        let dir = dir_with(&[("model.safetensors", checkpoint("F8_E4M3", &[2, 1], &scales))]);
        let err = SafetensorsSource::open(dir.path())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("config.json"), "{err}");
        // A config that asks for another block size.
        let err = get_err(
            &FP8_CONFIG.replace("[128, 128]", "[64, 64]"),
            checkpoint("F8_E4M3", &[2, 1], &scales),
        );
        assert!(
            err.contains("quantization_config.weight_block_size") && err.contains("[64, 64]"),
            "{err}"
        );
        // FP8 bytes without scales.
        let file = st_bytes(&[(weight, "F8_E4M3", &[160, 64], codes.clone())]);
        let err = get_err(FP8_CONFIG, file);
        assert!(
            err.contains(weight) && err.contains("without block scales"),
            "{err}"
        );
        // A scale next to a bf16 weight.
        let file = st_bytes(&[
            (weight, "BF16", &[160, 64], vec![0; 160 * 64 * 2]),
            (scale, "F32", &[2, 1], f32_bytes(&scales)),
        ]);
        let err = get_err(FP8_CONFIG, file);
        assert!(
            err.contains(weight) && err.contains("stored as BF16"),
            "{err}"
        );
    }

    #[test]
    fn sharded_index() {
        let mut files = two_shards();
        files.push((
            INDEX_FILE,
            index_json(&[
                (
                    "model.embed_tokens.weight",
                    "model-00001-of-00002.safetensors",
                ),
                ("model.norm.weight", "model-00002-of-00002.safetensors"),
                ("lm_head.weight", "model-00002-of-00002.safetensors"),
            ]),
        ));
        let dir = dir_with(&files);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert_eq!(src.len(), 3);
        assert_eq!(
            src.get("embed_tokens.weight", &[2, 2])
                .unwrap()
                .to_f32_vec(),
            vec![1.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(
            src.get("norm.weight", &[2]).unwrap().to_f32_vec(),
            vec![0.5, 0.25]
        );
        assert_eq!(
            src.get("lm_head.weight", &[1, 2]).unwrap().to_f32_vec(),
            vec![-1.0, 8.0]
        );
    }

    #[test]
    fn sharded_index_inconsistencies() {
        // The index puts a tensor into a shard that does not hold it.
        let mut files = two_shards();
        files.push((
            INDEX_FILE,
            index_json(&[("model.norm.weight", "model-00001-of-00002.safetensors")]),
        ));
        let err = open_err(&files).to_string();
        assert!(
            err.contains(INDEX_FILE)
                && err.contains("model.norm.weight")
                && err.contains("no such tensor"),
            "{err}"
        );

        // The index names a shard that does not exist.
        let mut files = two_shards();
        files.push((
            INDEX_FILE,
            index_json(&[("x", "model-00003-of-00003.safetensors")]),
        ));
        let err = open_err(&files);
        assert!(matches!(err, LoadError::Io { .. }), "{err}");
        assert!(
            err.to_string().contains("model-00003-of-00003.safetensors"),
            "{err}"
        );

        // Not an index at all.
        let err = open_err(&[(INDEX_FILE, b"{\"weight_map\": [1]}".to_vec())]).to_string();
        assert!(err.contains("weight_map"), "{err}");
        let err = open_err(&[(INDEX_FILE, b"not json".to_vec())]).to_string();
        assert!(err.contains("not valid JSON"), "{err}");
    }

    #[test]
    fn several_files_without_index() {
        let dir = dir_with(&two_shards());
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert_eq!(src.len(), 3);
        assert_eq!(
            src.get("norm.weight", &[2]).unwrap().to_f32_vec(),
            vec![0.5, 0.25]
        );
        assert!(src.contains("embed_tokens.weight"));

        let mut files = two_shards();
        files.push((
            "extra.safetensors",
            st_bytes(&[("model.norm.weight", "F32", &[1], f32_bytes(&[0.0]))]),
        ));
        let err = open_err(&files).to_string();
        assert!(
            err.contains("model.norm.weight") && err.contains("also in"),
            "{err}"
        );

        let err = open_err(&[("README.md", b"hi".to_vec())]).to_string();
        assert!(err.contains("no model.safetensors.index.json"), "{err}");
    }

    #[test]
    fn missing_tensor_and_wrong_shape() {
        let dir = dir_with(&[(
            "model.safetensors",
            st_bytes(&[("model.norm.weight", "F32", &[2], f32_bytes(&[1.0, 2.0]))]),
        )]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        let err = src
            .get("layers.0.input_layernorm.weight", &[2])
            .unwrap_err();
        match &err {
            LoadError::MissingTensor {
                name,
                tried,
                looked_in,
            } => {
                assert_eq!(name, "layers.0.input_layernorm.weight");
                assert_eq!(tried.len(), 3);
                assert!(looked_in.contains(&dir.path().display().to_string()));
            }
            other => panic!("unexpected {other}"),
        }
        assert!(
            err.to_string()
                .contains("model.language_model.layers.0.input_layernorm.weight"),
            "{err}"
        );

        let err = src.get("norm.weight", &[3]).unwrap_err();
        match &err {
            LoadError::ShapeMismatch {
                tensor,
                file,
                expected,
                found,
            } => {
                assert_eq!(tensor, "model.norm.weight");
                assert!(file.ends_with("model.safetensors"));
                assert_eq!(
                    (expected.as_slice(), found.as_slice()),
                    (&[3usize][..], &[2usize][..])
                );
            }
            other => panic!("unexpected {other}"),
        }
        assert!(
            err.to_string().contains("expected shape [3], found [2]"),
            "{err}"
        );
    }

    #[test]
    fn truncated_file() {
        let mut file = st_bytes(&[
            ("a", "F32", &[2], f32_bytes(&[1.0, 2.0])),
            ("b", "F32", &[2], f32_bytes(&[3.0, 4.0])),
        ]);
        file.truncate(file.len() - 3);
        let err = open_err(&[("model.safetensors", file)]);
        assert!(
            matches!(&err, LoadError::DataOutOfRange { tensor, .. } if tensor == "b"),
            "{err}"
        );
        assert!(err.to_string().contains("truncated"), "{err}");

        let err = open_err(&[("model.safetensors", vec![1, 2, 3])]).to_string();
        assert!(err.contains("too short"), "{err}");
        // The in-memory entry point runs the same checks.
        let path = Path::new("x.safetensors");
        let err = check_file_bytes(&[1, 2, 3], path).unwrap_err().to_string();
        assert!(err.contains("too short"), "{err}");
        let whole = st_bytes(&[("a", "F32", &[2], f32_bytes(&[1.0, 2.0]))]);
        assert_eq!(check_file_bytes(&whole, path).unwrap(), 1);
    }

    #[test]
    fn header_length_beyond_file() {
        let header = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        let file = raw_file_with_len(header.len() as u64 + 100, header.as_bytes(), &[0; 4]);
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(
            err.contains("header length") && err.contains("runs past the end"),
            "{err}"
        );
        // An absurd length is refused before anything is allocated or read.
        let file = raw_file_with_len(u64::MAX, header.as_bytes(), &[0; 4]);
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(err.contains("limit"), "{err}");
    }

    #[test]
    fn offsets_beyond_file() {
        let file = raw_file(
            r#"{"w":{"dtype":"F32","shape":[256],"data_offsets":[0,1024]}}"#,
            &[0; 16],
        );
        let err = open_err(&[("model.safetensors", file)]);
        assert!(
            matches!(&err, LoadError::DataOutOfRange { tensor, .. } if tensor == "w"),
            "{err}"
        );
        let file = raw_file(
            r#"{"w":{"dtype":"F32","shape":[1],"data_offsets":[18446744073709551612,18446744073709551615]}}"#,
            &[0; 16],
        );
        assert!(matches!(
            open_err(&[("model.safetensors", file)]),
            LoadError::DataOutOfRange { .. }
        ));
    }

    #[test]
    fn overlapping_and_reversed_offsets() {
        let file = raw_file(
            r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#,
            &[0; 12],
        );
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(
            err.contains("`a`") && err.contains("`b`") && err.contains("overlap"),
            "{err}"
        );
        let file = raw_file(
            r#"{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}}"#,
            &[0; 12],
        );
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(err.contains("reversed"), "{err}");
    }

    #[test]
    fn shape_and_byte_count_disagree() {
        let file = raw_file(
            r#"{"a":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(
            err.contains("`a`") && err.contains("needs 48 bits") && err.contains("span 8 bytes"),
            "{err}"
        );
        // Element counts that overflow are an error, not a panic or an allocation.
        let file = raw_file(
            r#"{"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}}"#,
            &[0; 8],
        );
        let err = open_err(&[("model.safetensors", file)]).to_string();
        assert!(err.contains("too many elements"), "{err}");
    }

    #[test]
    fn unknown_dtype_is_an_error_when_requested() {
        let file = raw_file(
            r#"{"model.q":{"dtype":"Q7_WEIRD","shape":[4],"data_offsets":[0,3]},"model.ok":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}"#,
            &[0; 8],
        );
        let dir = dir_with(&[("model.safetensors", file)]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert!(src.contains("q"));
        assert_eq!(src.get("ok", &[1]).unwrap().to_f32_vec(), vec![0.0]);
        let err = src.get("q", &[4]).unwrap_err();
        assert!(
            matches!(&err, LoadError::UnsupportedDtype { tensor, dtype, .. } if tensor == "model.q" && dtype == "Q7_WEIRD"),
            "{err}"
        );
        // Config spellings are not header dtypes.
        let file = raw_file(
            r#"{"model.b":{"dtype":"bfloat16","shape":[2],"data_offsets":[0,4]}}"#,
            &[0; 4],
        );
        let dir = dir_with(&[("model.safetensors", file)]);
        let src = SafetensorsSource::open(dir.path()).unwrap();
        assert!(matches!(
            src.get("b", &[2]),
            Err(LoadError::UnsupportedDtype { .. })
        ));
    }

    #[test]
    fn malformed_headers() {
        for (header, needle) in [
            ("not json at all", "not valid JSON"),
            ("[1, 2]", "not a JSON object"),
            (r#"{"a": 5}"#, "not an object"),
            (r#"{"a":{"shape":[1],"data_offsets":[0,4]}}"#, "`dtype`"),
            (
                r#"{"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
                "`shape`",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0]}}"#,
                "`data_offsets`",
            ),
            (
                r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}}"#,
                "`data_offsets`",
            ),
        ] {
            let err = open_err(&[("model.safetensors", raw_file(header, &[0; 4]))]);
            assert!(matches!(err, LoadError::Format { .. }), "{header}: {err}");
            assert!(err.to_string().contains(needle), "{header}: {err}");
        }
        let mut bad_utf8 = raw_file("{\"a\":1}", &[]);
        bad_utf8[9] = 0xFF;
        assert!(open_err(&[("model.safetensors", bad_utf8)])
            .to_string()
            .contains("not valid JSON"));
    }

    #[test]
    fn index_must_stay_inside_the_directory() {
        let outer = tempfile::tempdir().unwrap();
        let ckpt = outer.path().join("ckpt");
        std::fs::create_dir(&ckpt).unwrap();
        let shard = st_bytes(&[("model.norm.weight", "F32", &[1], f32_bytes(&[1.0]))]);
        std::fs::write(outer.path().join("outside.safetensors"), &shard).unwrap();
        std::fs::write(ckpt.join("inside.safetensors"), &shard).unwrap();
        let outside_abs = outer.path().join("outside.safetensors");

        for target in [
            "../outside.safetensors".to_string(),
            outside_abs.display().to_string(),
            "./inside.safetensors".to_string(),
            "sub/../../outside.safetensors".to_string(),
            String::new(),
        ] {
            std::fs::write(
                ckpt.join(INDEX_FILE),
                index_json(&[("model.norm.weight", &target)]),
            )
            .unwrap();
            let err = SafetensorsSource::open(&ckpt)
                .err()
                .unwrap_or_else(|| panic!("{target:?} accepted"));
            assert!(matches!(err, LoadError::Format { .. }), "{target:?}: {err}");
            assert!(
                err.to_string().contains("plain relative path"),
                "{target:?}: {err}"
            );
        }

        // A symlink inside the directory that resolves outside it.
        std::os::unix::fs::symlink(&outside_abs, ckpt.join("link.safetensors")).unwrap();
        std::fs::write(
            ckpt.join(INDEX_FILE),
            index_json(&[("model.norm.weight", "link.safetensors")]),
        )
        .unwrap();
        let err = SafetensorsSource::open(&ckpt)
            .err()
            .expect("symlink outside accepted");
        assert!(
            err.to_string().contains("outside the checkpoint directory"),
            "{err}"
        );

        // The plain, inside name works.
        std::fs::write(
            ckpt.join(INDEX_FILE),
            index_json(&[("model.norm.weight", "inside.safetensors")]),
        )
        .unwrap();
        assert!(SafetensorsSource::open(&ckpt)
            .unwrap()
            .contains("norm.weight"));

        // Without an index, the same rule holds for the files found by listing the directory.
        std::fs::remove_file(ckpt.join(INDEX_FILE)).unwrap();
        let err = SafetensorsSource::open(&ckpt)
            .err()
            .expect("symlink outside accepted");
        assert!(
            err.to_string().contains("outside the checkpoint directory"),
            "{err}"
        );
    }

    #[test]
    fn hugging_face_cache_snapshot_symlinks_are_followed() {
        // <repo>/snapshots/<rev>/model.safetensors -> ../../blobs/<hash>
        let repo = tempfile::tempdir().unwrap();
        let blobs = repo.path().join("blobs");
        let snapshot = repo.path().join("snapshots").join("0123abc");
        std::fs::create_dir_all(&blobs).unwrap();
        std::fs::create_dir_all(&snapshot).unwrap();
        let shard = st_bytes(&[("model.norm.weight", "F32", &[1], f32_bytes(&[6.0]))]);
        std::fs::write(blobs.join("deadbeef"), &shard).unwrap();
        std::os::unix::fs::symlink(
            Path::new("../../blobs/deadbeef"),
            snapshot.join("model.safetensors"),
        )
        .unwrap();
        let src = SafetensorsSource::open(&snapshot).unwrap();
        assert_eq!(
            src.get("norm.weight", &[1]).unwrap().to_f32_vec(),
            vec![6.0]
        );
    }

    #[test]
    fn not_a_directory() {
        let dir = dir_with(&[("model.safetensors", st_bytes(&[]))]);
        let err = SafetensorsSource::open(&dir.path().join("model.safetensors"))
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("expected a checkpoint directory"),
            "{err}"
        );
        let err = SafetensorsSource::open(&dir.path().join("nope"))
            .err()
            .unwrap();
        assert!(matches!(err, LoadError::Io { .. }), "{err}");
    }
}
