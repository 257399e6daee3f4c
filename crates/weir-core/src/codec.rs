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
    append(value, buf, ordered_config())
}

/// Appends the encoding of `value` under `config` to `buf`: the size first (a walk that
/// adds up lengths), then the encoding into that many bytes. serde hands the bytes of a
/// `Vec<u8>` over one at a time; written into a slice they are a tight loop, while written
/// to a growing `Vec` each one checked the vector's capacity again (a 100-byte vector
/// encoded 7× slower). Small values pay the walk, a nanosecond or two. The bytes are the
/// same either way.
fn append<T: Serialize + ?Sized>(
    value: &T,
    buf: &mut Vec<u8>,
    config: impl bincode::config::Config,
) -> Result<()> {
    let mut size = bincode::enc::write::SizeWriter::default();
    bincode::serde::encode_into_writer(value, &mut size, config)
        .map_err(|e| Error::Codec(e.to_string()))?;
    let start = buf.len();
    buf.resize(start + size.bytes_written, 0);
    match bincode::serde::encode_into_slice(value, &mut buf[start..], config) {
        Ok(n) if n == size.bytes_written => Ok(()),
        // A `Serialize` that writes something else the second time, or fails: encoded
        // again straight into the vector, which grows as it must or reports the error.
        _ => {
            buf.truncate(start);
            bincode::serde::encode_into_std_write(value, buf, config)
                .map(|_| ())
                .map_err(|e| Error::Codec(e.to_string()))
        }
    }
}

/// Encodes a value.
///
/// ```
/// let bytes = weir_core::codec::encode(&(1u32, "a".to_string())).unwrap();
/// let back: (u32, String) = weir_core::codec::decode(&bytes).unwrap();
/// assert_eq!(back, (1, "a".to_string()));
/// ```
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>> {
    let mut buf = Vec::new();
    append(value, &mut buf, config())?;
    Ok(buf)
}

/// Appends the encoding of a value to `buf`, without an intermediate buffer.
///
/// ```
/// let mut buf = vec![7u8];
/// weir_core::codec::encode_into(&(1u32, "a".to_string()), &mut buf).unwrap();
/// assert_eq!(&buf[1..], &weir_core::codec::encode(&(1u32, "a".to_string())).unwrap()[..]);
/// ```
pub fn encode_into<T: Serialize + ?Sized>(value: &T, buf: &mut Vec<u8>) -> Result<()> {
    append(value, buf, config())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// What bincode writes straight into a vector: the format every earlier release
    /// wrote, in checkpoints and on the wire.
    fn direct<T: Serialize + ?Sized>(value: &T, config: impl bincode::config::Config) -> Vec<u8> {
        let mut buf = vec![9u8];
        bincode::serde::encode_into_std_write(value, &mut buf, config).unwrap();
        buf
    }

    #[test]
    fn values_encode_to_the_bytes_they_always_did() {
        let bytes: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let mut buf = vec![9u8];
        encode_into(&bytes, &mut buf).unwrap();
        assert_eq!(buf, direct(&bytes, config()));
        let value = (
            7u64,
            -3i64,
            "naïve".to_string(),
            vec![1u32 << 20, 5],
            Some(0.5f64),
        );
        let mut buf = vec![9u8];
        encode_into(&value, &mut buf).unwrap();
        assert_eq!(buf, direct(&value, config()));
        let mut buf = vec![9u8];
        encode_ordered_into(&(300u64, bytes.clone()), &mut buf).unwrap();
        assert_eq!(buf, direct(&(300u64, bytes.clone()), ordered_config()));
        assert_eq!(encode(&bytes).unwrap()[..], direct(&bytes, config())[1..]);
    }

    /// Writes one more byte every time it is serialized.
    struct Growing(Cell<usize>);

    impl Serialize for Growing {
        fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
            let n = self.0.get();
            self.0.set(n + 1);
            s.collect_seq(std::iter::repeat_n(7u8, n))
        }
    }

    #[test]
    fn a_value_that_serializes_differently_the_second_time_is_still_encoded_whole() {
        let value = Growing(Cell::new(3));
        let mut buf = vec![9u8];
        encode_into(&value, &mut buf).unwrap();
        // Counted at 3 bytes, written as 4 (too long for the room): written again, as 5.
        assert_eq!(buf, [9, 5, 7, 7, 7, 7, 7]);
        let back: Vec<u8> = decode(&buf[1..]).unwrap();
        assert_eq!(back, [7; 5]);
    }

    #[test]
    fn a_value_that_cannot_be_encoded_leaves_the_buffer_as_it_was() {
        struct Failing;
        impl Serialize for Failing {
            fn serialize<S: serde::Serializer>(
                &self,
                _: S,
            ) -> std::result::Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no encoding for this value"))
            }
        }
        let mut buf = vec![9u8];
        let err = encode_into(&Failing, &mut buf).unwrap_err().to_string();
        assert!(err.contains("no encoding for this value"), "{err}");
        assert_eq!(buf, [9]);
    }
}
