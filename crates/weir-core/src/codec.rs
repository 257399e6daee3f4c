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
