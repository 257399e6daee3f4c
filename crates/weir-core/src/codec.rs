//! The one place weir encodes values to bytes: bincode 2.0.1 over serde.
//!
//! Everything that serializes records or state goes through [`encode`] / [`decode`],
//! so the format can change in one module (see docs/decisions/0002-bincode-codec.md).

use crate::error::{Error, Result};
use serde::Serialize;
use serde::de::DeserializeOwned;

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
}

/// The codec of state keys in a persistent store: the same as the value codec, but with
/// the bytes of multi-byte integers big-endian, so that integers order numerically.
fn ordered_config() -> impl bincode::config::Config {
    bincode::config::standard().with_big_endian()
}

/// Appends the order-preserving encoding of a state key to `buf` (see
/// [`crate::state::KeyEncoding::Ordered`]): as compact as [`encode_into`] (integers are
/// still variable-length), with unsigned integers in numeric byte order, and tuples and
/// structs in the order of their fields.
///
/// ```
/// let (mut a, mut b) = (Vec::new(), Vec::new());
/// weir_core::codec::encode_ordered_into(&(7u32, 300u64), &mut a).unwrap();
/// weir_core::codec::encode_ordered_into(&(7u32, 301u64), &mut b).unwrap();
/// assert!(a < b);
/// assert_eq!(a.len(), weir_core::codec::encode(&(7u32, 300u64)).unwrap().len());
/// ```
pub fn encode_ordered_into<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> Result<()> {
    bincode::serde::encode_into_std_write(value, buf, ordered_config())
        .map(|_| ())
        .map_err(|e| Error::Codec(e.to_string()))
}

/// Encodes a value.
///
/// ```
/// let bytes = weir_core::codec::encode(&(1u32, "a".to_string())).unwrap();
/// let back: (u32, String) = weir_core::codec::decode(&bytes).unwrap();
/// assert_eq!(back, (1, "a".to_string()));
/// ```
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    bincode::serde::encode_to_vec(value, config()).map_err(|e| Error::Codec(e.to_string()))
}

/// Appends the encoding of a value to `buf`, without an intermediate buffer.
///
/// ```
/// let mut buf = vec![7u8];
/// weir_core::codec::encode_into(&(1u32, "a".to_string()), &mut buf).unwrap();
/// assert_eq!(&buf[1..], &weir_core::codec::encode(&(1u32, "a".to_string())).unwrap()[..]);
/// ```
pub fn encode_into<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> Result<()> {
    bincode::serde::encode_into_std_write(value, buf, config())
        .map(|_| ())
        .map_err(|e| Error::Codec(e.to_string()))
}

/// The size of a value's encoding, without encoding it to memory (a walk of the value
/// that adds up lengths).
///
/// ```
/// let v = (7u64, "abc".to_string());
/// assert_eq!(weir_core::codec::encoded_size(&v).unwrap(), weir_core::codec::encode(&v).unwrap().len());
/// ```
pub fn encoded_size<T: Serialize + ?Sized>(value: &T) -> Result<usize> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config())
        .map_err(|e| Error::Codec(e.to_string()))?;
    Ok(size.bytes_written)
}

/// Decodes a value; trailing bytes are an error.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    let (v, used) = bincode::serde::decode_from_slice(bytes, config())
        .map_err(|e| Error::Codec(e.to_string()))?;
    if used != bytes.len() {
        return Err(Error::Codec(format!(
            "{} trailing bytes after value",
            bytes.len() - used
        )));
    }
    Ok(v)
}
