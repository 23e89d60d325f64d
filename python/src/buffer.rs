//! A Python buffer (numpy array, `bytearray`, `memoryview`, `array.array`,
//! anything with the buffer protocol) as the bytes and element type of a
//! call.

use pyo3::buffer::PyUntypedBuffer;
use pyo3::prelude::*;
use ringcc_core::DataType;

use crate::error::bad_buffer;

/// The element types by the names numpy and torch use (and a few
/// aliases), for a caller who names the type (`bfloat16`, which no
/// buffer format spells).
pub const DTYPE_NAMES: [(&str, DataType); 10] = [
    ("int8", DataType::I8),
    ("uint8", DataType::U8),
    ("int32", DataType::I32),
    ("uint32", DataType::U32),
    ("int64", DataType::I64),
    ("uint64", DataType::U64),
    ("float16", DataType::F16),
    ("float32", DataType::F32),
    ("float64", DataType::F64),
    ("bfloat16", DataType::Bf16),
];

/// The element type a caller names.
pub fn dtype_named(py: Python<'_>, name: &str) -> PyResult<DataType> {
    let n = name.trim().trim_start_matches("torch.");
    let n = match n {
        "half" => "float16",
        "float" => "float32",
        "double" => "float64",
        "bf16" => "bfloat16",
        other => other,
    };
    DTYPE_NAMES
        .iter()
        .find(|(k, _)| *k == n)
        .map(|&(_, d)| d)
        .ok_or_else(|| {
            let names: Vec<&str> = DTYPE_NAMES.iter().map(|(k, _)| *k).collect();
            bad_buffer(
                py,
                format!(
                    "ringcc has no element type {name:?} (it has {})",
                    names.join(", ")
                ),
            )
        })
}

/// The element type a buffer's struct-module format describes (native or
/// little-endian byte order), if ringcc has it.
fn dtype_of_format(format: &str, item_size: usize) -> Option<DataType> {
    let f = format.trim_start_matches(['@', '=', '<']);
    if f.len() != 1 {
        return None;
    }
    let d = match (f, item_size) {
        ("b", 1) => DataType::I8,
        ("B", 1) => DataType::U8,
        ("i" | "l" | "q", 4) => DataType::I32,
        ("i" | "l" | "q", 8) => DataType::I64,
        ("I" | "L" | "Q", 4) => DataType::U32,
        ("I" | "L" | "Q", 8) => DataType::U64,
        ("e", 2) => DataType::F16,
        ("f", 4) => DataType::F32,
        ("d", 8) => DataType::F64,
        _ => return None,
    };
    Some(d)
}

/// One buffer of a call: held (the exporter cannot free or resize it
/// while this lives) and checked.
#[derive(Debug)]
pub struct Buf {
    buf: PyUntypedBuffer,
    /// Its element type.
    pub dtype: DataType,
}

impl Buf {
    /// `obj`'s buffer as `which` (`input`, `output`, `in-place`) of a
    /// call: C-contiguous, writable when `write`, of element type `dtype`
    /// when named (the buffer's item size must match; `uint8` buffers
    /// may hold any type), else of the type its format says.
    pub fn get(
        obj: &Bound<'_, PyAny>,
        dtype: Option<DataType>,
        which: &str,
        write: bool,
    ) -> PyResult<Buf> {
        let py = obj.py();
        let buf = PyUntypedBuffer::get(obj).map_err(|e| {
            bad_buffer(
                py,
                format!(
                    "the {which} buffer ({}) has no buffer protocol: {e}",
                    obj.get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string())
                ),
            )
        })?;
        if !buf.is_c_contiguous() {
            return Err(bad_buffer(
                py,
                format!("the {which} buffer is not C-contiguous (copy it, e.g. numpy.ascontiguousarray)"),
            ));
        }
        if write && buf.readonly() {
            return Err(bad_buffer(py, format!("the {which} buffer is read-only")));
        }
        let format = buf.format().to_string_lossy().into_owned();
        let from_format = dtype_of_format(&format, buf.item_size());
        let dtype = match (dtype, from_format) {
            (Some(d), _) if usize::from(d.size()) == buf.item_size() || buf.item_size() == 1 => d,
            (Some(d), _) => {
                return Err(bad_buffer(
                    py,
                    format!(
                        "the {which} buffer's items are {} B ({format:?}), {d:?} elements are {} B",
                        buf.item_size(),
                        d.size()
                    ),
                ))
            }
            (None, Some(d)) => d,
            (None, None) => {
                return Err(bad_buffer(
                    py,
                    format!(
                        "the {which} buffer's format {format:?} ({} B items) is no ringcc element type; name one with dtype=",
                        buf.item_size()
                    ),
                ))
            }
        };
        if buf.len_bytes() % usize::from(dtype.size()) != 0 {
            return Err(bad_buffer(
                py,
                format!(
                    "the {which} buffer has {} B, not a whole number of {dtype:?} elements",
                    buf.len_bytes()
                ),
            ));
        }
        Ok(Buf { buf, dtype })
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len_bytes()
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its element count.
    pub fn elements(&self) -> usize {
        self.len() / usize::from(self.dtype.size())
    }

    /// Its first byte (a dangling, non-null pointer when empty).
    pub fn ptr(&self) -> *mut u8 {
        let p = self.buf.buf_ptr().cast::<u8>();
        if p.is_null() {
            std::ptr::NonNull::dangling().as_ptr()
        } else {
            p
        }
    }

    /// Whether its bytes overlap `other`'s.
    pub fn overlaps(&self, other: &Buf) -> bool {
        let (a, b) = (self.ptr() as usize, other.ptr() as usize);
        !self.is_empty() && !other.is_empty() && a < b + other.len() && b < a + self.len()
    }

    /// Whether it is exactly `other`'s memory.
    pub fn same_as(&self, other: &Buf) -> bool {
        self.ptr() == other.ptr() && self.len() == other.len()
    }
}
