//! Reading and writing NumPy `.npy` files of f32 data (fixture logits in tests, `score --logits-out`).
//! Writes v1.0 (v2.0 when the header needs it); reads v1.0/v2.0/v3.0 files holding little-endian
//! C-order `<f4` or `<f8`. It knows nothing about what the arrays mean.

use crate::error::LoadError;
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// numpy pads the header so the data starts at a multiple of 64 bytes.
const ALIGN: usize = 64;

fn npy_error(path: &Path, message: impl Into<String>) -> LoadError {
    LoadError::Npy {
        file: path.to_path_buf(),
        message: message.into(),
    }
}

/// Writes `data` (row-major, `shape.iter().product()` values) as a `<f4` array.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<(), LoadError> {
    let numel = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    if numel != Some(data.len()) {
        return Err(npy_error(
            path,
            format!(
                "shape {shape:?} does not hold the {} values given",
                data.len()
            ),
        ));
    }
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_text = match dims.len() {
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let dict = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_text}, }}");

    // Prefix: magic, 2 version bytes, then a u16 (v1.0) or u32 (v2.0) header length.
    let pad_to = |prefix: usize| {
        let unpadded = prefix + dict.len() + 1; // + '\n'
        unpadded.div_ceil(ALIGN) * ALIGN - prefix
    };
    let (version, header_len) = if pad_to(10) <= u16::MAX as usize {
        (1u8, pad_to(10))
    } else {
        (2u8, pad_to(12))
    };
    let mut header = dict.into_bytes();
    header.resize(header_len - 1, b' ');
    header.push(b'\n');

    let mut out = Vec::with_capacity(12 + header.len() + data.len() * 4);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        // header_len <= u16::MAX was checked above.
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        let len =
            u32::try_from(header.len()).map_err(|_| npy_error(path, "header longer than 4 GiB"))?;
        out.extend_from_slice(&len.to_le_bytes());
    }
    out.extend_from_slice(&header);
    for x in data {
        out.extend_from_slice(&x.to_le_bytes());
    }
    let mut file = std::fs::File::create(path).map_err(|e| LoadError::io(path, e))?;
    file.write_all(&out).map_err(|e| LoadError::io(path, e))?;
    Ok(())
}

/// Reads a `<f4` or `<f8` C-order array (f8 is converted to f32). Returns `(shape, data)`.
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>), LoadError> {
    let bytes = std::fs::read(path).map_err(|e| LoadError::io(path, e))?;
    parse_npy(&bytes, path)
}

fn parse_npy(bytes: &[u8], path: &Path) -> Result<(Vec<usize>, Vec<f32>), LoadError> {
    if bytes.len() < 10 || &bytes[..6] != MAGIC {
        return Err(npy_error(
            path,
            "not an .npy file (missing the \\x93NUMPY magic)",
        ));
    }
    let (header_start, header_len): (usize, usize) = match bytes[6] {
        1 => (10, u16::from_le_bytes([bytes[8], bytes[9]]) as usize),
        2 | 3 if bytes.len() >= 12 => (
            12,
            u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize,
        ),
        v => {
            return Err(npy_error(
                path,
                format!(
                    "unsupported .npy version {v}.{} (expected 1.0, 2.0 or 3.0)",
                    bytes[7]
                ),
            ))
        }
    };
    let data_start = header_start
        .checked_add(header_len)
        .filter(|&end| end <= bytes.len())
        .ok_or_else(|| {
            npy_error(
                path,
                format!("header length {header_len} runs past the end of the file"),
            )
        })?;
    let header = std::str::from_utf8(&bytes[header_start..data_start])
        .map_err(|_| npy_error(path, "header is not text"))?;
    let fields = parse_header_dict(header)
        .map_err(|m| npy_error(path, format!("header {header:?}: {m}")))?;

    let descr = match fields.iter().find(|(k, _)| k == "descr") {
        Some((_, PyValue::Str(d))) => d.as_str(),
        _ => return Err(npy_error(path, "header has no string 'descr'")),
    };
    let elem_size: usize = match descr {
        "<f4" => 4,
        "<f8" => 8,
        other => {
            return Err(npy_error(
                path,
                format!("dtype '{other}' is not supported (expected '<f4' or '<f8')"),
            ))
        }
    };
    match fields.iter().find(|(k, _)| k == "fortran_order") {
        Some((_, PyValue::Bool(false))) => {}
        Some((_, PyValue::Bool(true))) => {
            return Err(npy_error(
                path,
                "Fortran-order arrays are not supported (expected C order)",
            ))
        }
        _ => return Err(npy_error(path, "header has no boolean 'fortran_order'")),
    }
    let shape: Vec<usize> = match fields.iter().find(|(k, _)| k == "shape") {
        Some((_, PyValue::Tuple(items))) => items
            .iter()
            .map(|v| match v {
                PyValue::Int(n) => usize::try_from(*n).ok(),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| {
                npy_error(
                    path,
                    "'shape' holds something other than non-negative integers",
                )
            })?,
        _ => return Err(npy_error(path, "header has no tuple 'shape'")),
    };

    let data = &bytes[data_start..];
    let needed = shape
        .iter()
        .try_fold(elem_size, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| npy_error(path, format!("shape {shape:?} is too large")))?;
    if data.len() != needed {
        return Err(npy_error(
            path,
            format!(
                "shape {shape:?} of {descr} needs {needed} data bytes but the file has {}",
                data.len()
            ),
        ));
    }
    let values = if elem_size == 4 {
        data.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    } else {
        data.chunks_exact(8)
            .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32)
            .collect()
    };
    Ok((shape, values))
}

/// The subset of Python literals an .npy header dict uses.
#[derive(Debug, PartialEq)]
enum PyValue {
    Str(String),
    Bool(bool),
    Int(u64),
    Tuple(Vec<PyValue>),
}

/// Parses `{'key': value, ...}` (trailing commas and surrounding whitespace allowed).
fn parse_header_dict(text: &str) -> Result<Vec<(String, PyValue)>, String> {
    let mut p = LiteralParser {
        s: text.as_bytes(),
        pos: 0,
    };
    p.expect(b'{')?;
    let mut fields = Vec::new();
    loop {
        if p.eat(b'}') {
            break;
        }
        let PyValue::Str(key) = p.value()? else {
            return Err(format!("expected a string key at byte {}", p.pos));
        };
        p.expect(b':')?;
        let value = p.value()?;
        fields.push((key, value));
        if !p.eat(b',') {
            p.expect(b'}')?;
            break;
        }
    }
    p.skip_ws();
    if p.pos != p.s.len() {
        return Err(format!("unexpected text after the dict at byte {}", p.pos));
    }
    Ok(fields)
}

struct LiteralParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl LiteralParser<'_> {
    fn skip_ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }

    /// Consumes `c` (after whitespace) if it is next.
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.pos) == Some(&c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.pos))
        }
    }

    fn value(&mut self) -> Result<PyValue, String> {
        self.skip_ws();
        let start = self.pos;
        match self.s.get(self.pos) {
            Some(&q @ (b'\'' | b'"')) => {
                self.pos += 1;
                let end = self.s[self.pos..]
                    .iter()
                    .position(|&c| c == q)
                    .ok_or_else(|| format!("unterminated string at byte {start}"))?;
                let text = String::from_utf8_lossy(&self.s[self.pos..self.pos + end]).into_owned();
                self.pos += end + 1;
                Ok(PyValue::Str(text))
            }
            Some(b'(') => {
                self.pos += 1;
                let mut items = Vec::new();
                loop {
                    if self.eat(b')') {
                        break;
                    }
                    items.push(self.value()?);
                    if !self.eat(b',') {
                        self.expect(b')')?;
                        break;
                    }
                }
                Ok(PyValue::Tuple(items))
            }
            Some(c) if c.is_ascii_digit() => {
                while self.pos < self.s.len() && self.s[self.pos].is_ascii_digit() {
                    self.pos += 1;
                }
                // Python 2 era numpy wrote longs as `3L`.
                if self.s.get(self.pos) == Some(&b'L') {
                    self.pos += 1;
                }
                let digits = std::str::from_utf8(&self.s[start..self.pos])
                    .unwrap_or_default()
                    .trim_end_matches('L');
                digits
                    .parse()
                    .map(PyValue::Int)
                    .map_err(|_| format!("integer too large at byte {start}"))
            }
            _ if self.s[self.pos..].starts_with(b"True") => {
                self.pos += 4;
                Ok(PyValue::Bool(true))
            }
            _ if self.s[self.pos..].starts_with(b"False") => {
                self.pos += 5;
                Ok(PyValue::Bool(false))
            }
            _ => Err(format!("unexpected value at byte {start}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// `np.save` (numpy 2.4.6) of `np.array([[1.5, -2, 0.25], [3, 1e-3, -7]], dtype='<f4')`.
    const NUMPY_F4_2X3: &str = "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028322c2033292c207d202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a0000c03f000000c00000803e000040406f12833a0000e0c0";
    /// `np.save` of `np.array([0.1, -1e300, 2.5], dtype='<f8')`.
    const NUMPY_F8_3: &str = "934e554d5059010076007b276465736372273a20273c6638272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028332c292c207d2020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a9a9999999999b93f9c7500883ce437fe0000000000000440";
    /// `np.save` of the 0-d array `np.array(4.5, dtype='<f4')`.
    const NUMPY_F4_SCALAR: &str = "934e554d5059010076007b276465736372273a20273c6634272c2027666f727472616e5f6f72646572273a2046616c73652c20277368617065273a2028292c207d20202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020202020200a00009040";

    #[test]
    fn writes_exactly_what_numpy_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.npy");
        write_f32(&path, &[2, 3], &[1.5, -2.0, 0.25, 3.0, 1e-3, -7.0]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), hex(NUMPY_F4_2X3));
        write_f32(&path, &[], &[4.5]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), hex(NUMPY_F4_SCALAR));
    }

    #[test]
    fn reads_numpy_files() {
        let p = Path::new("x.npy");
        let (shape, data) = parse_npy(&hex(NUMPY_F4_2X3), p).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(data, vec![1.5, -2.0, 0.25, 3.0, 1e-3, -7.0]);
        let (shape, data) = parse_npy(&hex(NUMPY_F8_3), p).unwrap();
        assert_eq!(shape, vec![3]);
        assert_eq!(data, vec![0.1f64 as f32, f32::NEG_INFINITY, 2.5]);
        let (shape, data) = parse_npy(&hex(NUMPY_F4_SCALAR), p).unwrap();
        assert_eq!((shape, data), (vec![], vec![4.5]));
    }

    #[test]
    fn round_trip_including_v2_header() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logits.npy");
        let data: Vec<f32> = (0..24).map(|i| i as f32 * 0.37 - 3.0).collect();
        write_f32(&path, &[2, 3, 4], &data).unwrap();
        assert_eq!(read_f32(&path).unwrap(), (vec![2, 3, 4], data));
        assert_eq!(std::fs::read(&path).unwrap().len() % 4, 0);

        // A shape with ~6000 dimensions of size 1 needs a header over 64 KiB: version 2.0.
        let shape = vec![1usize; 22_000];
        write_f32(&path, &shape, &[7.0]).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(bytes[6], 2);
        assert_eq!((bytes.len() - 4) % ALIGN, 0);
        assert_eq!(read_f32(&path).unwrap(), (shape, vec![7.0]));
    }

    #[test]
    fn errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.npy");
        let err = write_f32(&path, &[2, 2], &[1.0]).unwrap_err().to_string();
        assert!(err.contains("bad.npy") && err.contains("[2, 2]"), "{err}");
        let err = read_f32(&dir.path().join("missing.npy")).unwrap_err();
        assert!(matches!(err, LoadError::Io { .. }) && err.to_string().contains("missing.npy"));

        let good = hex(NUMPY_F4_2X3);
        let retype = |from: &str, to: &str| {
            // Same length, so the header length field stays right.
            assert_eq!(from.len(), to.len());
            let text = std::str::from_utf8(&good[10..128])
                .unwrap()
                .replace(from, to);
            let mut bytes = good[..10].to_vec();
            bytes.extend_from_slice(text.as_bytes());
            bytes.extend_from_slice(&good[128..]);
            bytes
        };
        for (bytes, needle) in [
            (retype("<f4", ">f4"), "'>f4' is not supported"),
            (retype("<f4", "<i4"), "'<i4' is not supported"),
            (retype("False", "True "), "Fortran-order"),
            (
                retype("(2, 3)", "(2, 4)"),
                "needs 32 data bytes but the file has 24",
            ),
            (retype("'shape'", "'shapx'"), "no tuple 'shape'"),
            (retype("{'descr'", "['descr'"), "expected '{'"),
            (good[..good.len() - 1].to_vec(), "needs 24 data bytes"),
            (b"PK\x03\x04 not numpy".to_vec(), "magic"),
            (good[..60].to_vec(), "runs past the end"),
        ] {
            std::fs::write(&path, &bytes).unwrap();
            let err = read_f32(&path).unwrap_err();
            assert!(matches!(err, LoadError::Npy { .. }), "{needle}: {err}");
            let text = err.to_string();
            assert!(
                text.contains("bad.npy") && text.contains(needle),
                "{needle}: {text}"
            );
        }
        let mut v9 = good.clone();
        v9[6] = 9;
        std::fs::write(&path, &v9).unwrap();
        assert!(read_f32(&path)
            .unwrap_err()
            .to_string()
            .contains("version 9.0"));
    }
}
